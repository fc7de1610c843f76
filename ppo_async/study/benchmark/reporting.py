"""The benchmark's report: report.md (final evaluations, barrier vs async, the aggregate across
envs, every checkpoint, the references) and its figures, from OUT/results.csv alone
(`report`). Each table says which method made its intervals (`ppo_async.report.stats`).
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import pandas as pd

from ppo_async.config import ConfigError
from ppo_async.report import stats
from ppo_async.study.benchmark.plots import plot_aggregate, plot_learning_curves, plot_wall_clock
from ppo_async.study.benchmark.scores import (BOOTSTRAP_REPS, CI_SEED, REFERENCES_PATH, aggregate, checkpoint_table,
                                              load_references, normalising_references, reach_ratio,
                                              returns_at_equal_wall)
from ppo_async.study.benchmark.store import RESULTS_FILE, as_number, results_frame
from ppo_async.study.benchmark.suites import (ASYNC_MODES, DEFAULT_ASYNC_MODE, DEFAULT_ASYNC_MODE_WHY, MODE_DEFS,
                                              MODES)
from ppo_async.study.benchmark.timings import TIMINGS_FILE, lag_fractions, read_timings, speedups

REPORT_FILE = "report.md"
NEAR_FRACTION = 0.95  # the barrier-vs-async table's second line: async's wall-clock to this share of barrier's final return
SEED_CI = (f"95% CI: {stats.PERCENTILE_METHOD}, {BOOTSTRAP_REPS} resamples from numpy's default_rng({CI_SEED}) "
           "(`ppo_async.report.stats.bootstrap_mean_ci`)")
"""How the intervals over seeds of the report's tables were made."""


def _fmt(value: Any) -> str:
    """A number for the report: thousands separators above 1000, 3 significant digits below."""
    value = as_number(value)
    if not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _cell(row: Mapping[str, Any]) -> str:
    """"mean [ci_low, ci_high] (worst w)" of a `checkpoint_table` row."""
    return f"{_fmt(row['mean'])} [{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}] (worst {_fmt(row['worst'])})"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def final_section(table: pd.DataFrame, references: Sequence[Mapping[str, Any]]) -> list[str]:
    """report.md: the final evaluation per env x mode, with train return, wall-clock and references."""
    final = table.loc[table.groupby(["env", "mode"])["checkpoint"].idxmax()]
    final = final.assign(order=final["mode"].map(list(MODES).index)).sort_values(["env", "order"])
    rows = []
    for _, row in final.iterrows():
        refs = "; ".join(f"{r['source']}: {_fmt(r['value'])}" + (f" ± {_fmt(r['std'])}" if r.get("std") else "")
                         for r in references if r["env"] == row["env"])
        rows.append([row["env"], row["mode"], row["seeds"], _fmt(row["checkpoint"]), _cell(row), _fmt(row["train_return"]),
                     _fmt(row["wall_s"]), refs or "-"])
    return ["## Final evaluation", "",
            "eval: mean deterministic return over seeds [95% CI] (worst seed); train: mean training-episode "
            "return over the last 10% of iterations (stochastic policy), mean over seeds; wall: mean seconds per run. "
            f"{SEED_CI}.", "",
            *_markdown(["env", "mode", "seeds", "env steps", "eval", "train", "wall s", "references"], rows), ""]


def checkpoints_section(table: pd.DataFrame) -> list[str]:
    """report.md: per env, each checkpoint's mean [95% CI] (worst seed) per mode."""
    lines = ["## Every checkpoint", "", f"Mean deterministic return over seeds [95% CI] (worst seed); {SEED_CI}.", ""]
    for env in sorted(table["env"].unique()):
        part = table[table["env"] == env]
        modes = [m for m in MODES if m in set(part["mode"])]
        rows = []
        for checkpoint in sorted(part["checkpoint"].unique()):
            cells = [part[(part["mode"] == m) & (part["checkpoint"] == checkpoint)] for m in modes]
            rows.append([_fmt(checkpoint)] + [_cell(c.iloc[0]) if len(c) else "-" for c in cells])
        lines += [f"### {env}", "", *_markdown(["env steps", *modes], rows), ""]
    return lines


def barrier_async_section(table: pd.DataFrame) -> list[str]:
    """report.md: per env and async mode, its final return against barrier's 95% CI (the same
    env steps), and the wall-clock ratio of reaching barrier's final return (`reach_ratio`);
    then what each async mode changes over its parent (`MODE_DEFS`)."""
    rows = []
    for env in sorted(table["env"].unique()):
        part = table[table["env"] == env].sort_values("checkpoint")
        barrier = part[part["mode"] == "barrier"]
        for mode in ASYNC_MODES:
            asynchronous = part[part["mode"] == mode]
            if barrier.empty or asynchronous.empty:
                continue
            b, a = barrier.iloc[-1], asynchronous.iloc[-1]
            inside = "-" if not math.isfinite(b["ci_low"]) else ("yes" if b["ci_low"] <= a["mean"] <= b["ci_high"] else
                                                                  ("above" if a["mean"] > b["ci_high"] else "below"))
            ratios = [reach_ratio(barrier, asynchronous, fraction) for fraction in (1.0, NEAR_FRACTION)]
            wall, barrier_then, async_then = returns_at_equal_wall(barrier, asynchronous)
            rows.append([env, mode, _cell(b), _cell(a), inside,
                         *(_fmt(r) if math.isfinite(r) else "not reached" for r in ratios),
                         f"{_fmt(barrier_then)} / {_fmt(async_then)} at {_fmt(wall)} s"])
    if not rows:
        return []
    ran = [m for m in ASYNC_MODES if m in set(table["mode"])]  # (a suite may set more fields per mode: benchmark.json)
    defined = [f"`{m}` = `{MODE_DEFS[m].parent}` + {', '.join(f'{k} = {v}' for k, v in MODE_DEFS[m].changes.items())}: "
               f"{MODE_DEFS[m].why}" for m in ran]
    return ["## Barrier vs async", "",
            "Final evaluations; 'in barrier's CI': the async mode's mean against barrier's 95% CI at the same env "
            "steps (the percentile bootstrap of the final evaluation above); 'wall to barrier's final': its mean "
            "wall-clock to its first checkpoint at or above barrier's final mean return, over barrier's mean "
            f"wall-clock (return_vs_wall_clock.png); 'to {NEAR_FRACTION:.0%} of it': the same to {NEAR_FRACTION:.0%} of "
            "barrier's final mean (a miss of the full line by less than the seeds' spread shows here); "
            "'at equal wall-clock': barrier's / the async mode's mean return "
            "at the earlier of their two final mean wall-clocks (each the last checkpoint reached by then).", "",
            *_markdown(["env", "async mode", "barrier", "async", "async in barrier's CI", "wall to barrier's final",
                        f"to {NEAR_FRACTION:.0%} of it", "barrier / async at equal wall-clock"], rows),
            "", *[f"- {line}" for line in defined], ""]


def aggregate_section(agg: Mapping[str, Any], references: Mapping[str, float]) -> list[str]:
    """report.md: IQM per mode and P(mode > barrier) for each async mode, with how they were computed."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("rliable")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - rliable is a dependency
        version = "?"
    lines = ["## Aggregate across envs (Agarwal et al. 2021)", "",
             f"Scores normalised per env by its reference (references.json, `normalise`): 1 + (score - ref) / |ref| "
             f"(1 = the reference). Final evaluations of {len(agg['tasks'])} envs ({', '.join(agg['tasks']) or 'none'}) "
             f"x {agg['runs']} seeds; envs without a reference are left out "
             f"(references: {', '.join(f'{e} {_fmt(v)}' for e, v in sorted(references.items()) if e in agg['tasks'])}). "
             f"Point estimates: rliable {version} `metrics.aggregate_iqm`, `metrics.probability_of_improvement`. "
             f"95% CIs: {agg['ci_method'] or '-'}, {BOOTSTRAP_REPS} resamples from numpy's default_rng({CI_SEED}) "
             f"(`ppo_async.report.stats.stratified_bootstrap_ci`); {stats.WHY_NOT_RLIABLE_BOOTSTRAP}.", ""]
    rows = [[m, _fmt(v[0]), f"[{_fmt(v[1])}, {_fmt(v[2])}]"] for m, v in agg["iqm"].items()]
    lines += _markdown(["mode", "IQM", "95% CI"], rows) + [""]
    for mode, (p, low, high) in agg.get("improvements", {}).items():
        lines += [f"P({mode} > barrier) = {p:.3f} [{low:.3f}, {high:.3f}]", ""]
    for mode, (parent, (p, low, high)) in agg.get("corrections", {}).items():
        lines += [f"P({mode} > {parent}) = {p:.3f} [{low:.3f}, {high:.3f}] (what `{mode}`'s change over `{parent}` "
                  "buys)", ""]
    if DEFAULT_ASYNC_MODE in agg["iqm"]:
        lines += [f"The default async mode is `{DEFAULT_ASYNC_MODE}`: {DEFAULT_ASYNC_MODE_WHY}.", ""]
    return lines


def timing_section(timings: pd.DataFrame) -> list[str]:
    """report.md: where barrier's time goes per iteration, the overlap roofline it allows and
    each async mode's measured wall-clock speedup against it (`timings.speedups`); then per env
    and threaded mode the mean KL to the behaviour policy and the lag histogram."""
    if timings.empty:
        return []
    lines = ["## Where the time goes", "",
             f"Per learner iteration, medians over seeds ({TIMINGS_FILE}): barrier's busiest sampler's time to make "
             "its chunk (T_sample: rollout plus any simulated latency) and the learner's own work (T_learn); the "
             "overlap roofline (T_sample + T_learn) / max(T_sample, T_learn) is the best wall-clock speedup an async "
             "run of the same samplers and learner can reach when sampling and learning overlap on cores they do not "
             "share. It counts overlap only: with heterogeneous samplers (a straggler, the mujoco-slow "
             "suite) async also stops waiting for the slowest sampler, so its speedup can exceed it. Speedup: barrier's "
             "median wall-clock over the async mode's (the iteration loop, same env steps). "
             "Wall-clock figures are timings only where the manifest says the runs were timed alone.", ""]
    rows = [[r["env"], r["mode"], _fmt(r["sample_s"]), _fmt(r["learn_s"]), _fmt(r["wait_s"]), _fmt(r["roofline"]),
             _fmt(r["speedup"]), _fmt(r["share"])]
            for r in speedups(timings, [m for m in ASYNC_MODES if m in set(timings["mode"])])]  # (the modes it ran)
    if rows:
        lines += _markdown(["env", "async mode", "barrier T_sample (s)", "barrier T_learn (s)", "barrier wait (s)",
                            "roofline", "speedup", "speedup / roofline"], rows) + [""]
    lag_rows = []
    for (env, mode), part in timings.groupby(["env", "mode"], sort=True):
        shares = lag_fractions(list(part["lag_histogram"]))
        kls = [_fmt(float(part[k].mean())) for k in ("approx_kl", "kl_staleness", "kl_update", "entropy_end")]
        lag_rows.append([env, mode, *kls, _fmt(float(part["lag_mean"].mean())), *(f"{100 * x:.1f}%" for x in shares)]
                        if shares else [env, mode, *kls, "-", "-", "-", "-", "-"])
    lines += ["KL to the behaviour policy mu (means over iterations and seeds; the article's thresholds: 0.01 "
              "acceptable, 0.03 hurts convergence) and the share of consumed samples at each lag. approx KL: "
              "KL(mu || the policy of each SGD step); its parts (`kl_parts`): staleness, KL(mu || the learner's "
              "policy when the iteration began), what the lag alone costs; update, KL(that policy || the policy of "
              "each SGD step), the step's size. With PPO's clip around mu, an update that starts far from mu "
              "(staleness) is pulled back into mu's trust region, so approx KL can sit far below staleness. Entropy: "
              "the policy's mean entropy over the last 10% of iterations (how far its exploration noise has "
              "collapsed):", "",
              *_markdown(["env", "mode", "approx KL", "KL staleness", "KL update", "entropy", "mean lag", "lag 0", "lag 1",
                          "lag 2", "lag >= 3"], lag_rows), ""]
    return lines


def report(out: str | os.PathLike, references_path: str = REFERENCES_PATH) -> str:
    """Writes OUT/report.md, learning_curves.png, return_vs_wall_clock.png and aggregate.png from
    OUT/results.csv alone (and the reference figures); returns report.md's path."""
    out = os.fspath(out)
    df = results_frame(out)
    if df.empty:
        raise ConfigError(f"{out!r} has no results ({RESULTS_FILE} is missing or empty): nothing to report")
    refs = load_references(references_path)
    table = checkpoint_table(df)
    norm = normalising_references(refs)
    agg = aggregate(df[df["final"] == 1], norm)
    plots = [plot_learning_curves(table, refs, os.path.join(out, "learning_curves.png")),
             plot_wall_clock(table, os.path.join(out, "return_vs_wall_clock.png")),
             plot_aggregate(agg, os.path.join(out, "aggregate.png"))]
    envs, modes = sorted(df["env"].unique()), [m for m in MODES if m in set(df["mode"])]
    lines = ["# Benchmark report", "",
             f"{len(envs)} envs ({', '.join(envs)}) x modes {', '.join(modes)} x {df['seed'].nunique()} seeds; "
             f"{len(df)} evaluations of the deterministic policy in {RESULTS_FILE} (`ppo_async.study.benchmark`).", "",
             *final_section(table, refs), *barrier_async_section(table), *aggregate_section(agg, norm),
             *timing_section(read_timings(out)), *checkpoints_section(table),
             "## Plots", "", *[f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots if p], "",
             "## References", "", *[f"- {r['env']}: {_fmt(r['value'])} ({r['source']}, {r['implementation']}, "
                                    f"{r['version']}, {r['env_id']}, {_fmt(r['env_steps'])} steps, {r['seeds']} seed(s), "
                                    f"± over {r['std_of']}) {r['url']}"
                                    + (f" (as for {r['same_task_as']}: the same task)" if r.get("same_task_as") else "")
                                    for r in refs if r["env"] in envs], ""]
    path = os.path.join(out, REPORT_FILE)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path
