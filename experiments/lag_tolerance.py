"""How much policy lag does each off-policy correction tolerate on MuJoCo? (issue 41 item 2)

    python experiments/lag_tolerance.py                                   # Hopper, Walker2d, HalfCheetah; 3 seeds, 1M, K in 1 2 4 8
    python experiments/lag_tolerance.py --envs gymnasium/Hopper-v5        # one env (it resumes, skipping finished runs)
    python experiments/lag_tolerance.py --summarise-only --out DIR        # the tables and figures again from DIR
    python experiments/lag_tolerance.py --out experiments/results/lag_tolerance   # publish
    python experiments/lag_tolerance.py --suite classic --envs Pendulum-v1 --total-env-steps 4096 --seeds 1 \\
        --ks 1 2 --corrections ppo decoupled --eval-every-steps 2048 --eval-episodes 2 --k0-from None \\
        --emergent-from None --top-up-seeds 0 --out /tmp/lt   # a smoke test

Every cell is the benchmark's barrier mode (one sampler, `threaded.barrier`) run with a fixed lag
schedule, `lag.K` = K: each learner batch is made by the policy (params and normalisation
statistics) exactly K versions old, on the host-side simulator, and corrected by one of
`CORRECTIONS`:

  ppo        PPO, clip_eps 0.2 around the behaviour policy (the preset's objective)
  dual-clip  dual-clip PPO, c = 3 (Ye et al. 2020)
  vtrace     advantages with truncated importance weights (V-trace, rho_bar = c_bar = 1; Espeholt et al. 2018)
  decoupled  decoupled PPO (Hilton et al. 2021): clip to a proximal policy, an EWMA of the learner's
             params with decay 1 - 2 / (SGD steps per iteration) per step (its centre of mass is the
             mean age of PPO's pi_old, their matching rule: 0.99375 for the MuJoCo preset's 320 steps)

K = 0 is the benchmark's barrier runs themselves (no correction: at lag 0 there is nothing to
correct), one set shared by every correction's line; `--k0-from DIR` reads them from an existing
benchmark output instead of running them, when its barrier config of the env is this one's.

Each cell is one `pa.benchmark` call (suite `--suite`, mode barrier, `changes` = the correction's
fields and `lag.K`) into OUT/<env>/<cell>/: results.csv, report.md, manifest.json and the run
directories, so a killed grid resumes where it stopped (finished runs are skipped). The report
(OUT/table.csv, OUT/summary.txt; OUT/manifest.json for the whole call) gives per env, correction
and K over seeds: the final deterministic evaluation normalised by the env's reference
(`benchmark.normalise`: 1 + (score - ref) / |ref|) with its 95% bootstrap CI and worst seed; the
env steps to `--fraction` of K = 0's mean final return (first evaluation at or above it; mean over
the seeds that reach it, and how many do); and the mean over iterations and seeds of the KL to
the behaviour policy (`approx_kl`), the clip fraction and the ESS fraction. One figure per env,
OUT/lag_tolerance_<env>.png: normalised return vs K, one line per correction, beside mean KL vs K
with the article's thresholds (0.01 watch, 0.03 lag is hurting). `--emergent-from DIR` (a mujoco
benchmark output) adds the default async mode's runs, whose lag emerges from timing, at their mean
lag: a star on each figure, a table row with their lag shares, and a line per env saying whether
their return lies inside the 95% CI of the fixed ppo cell of that lag (issue 41 item 3).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.config import config_to_dict
from ppo_async.config.presets import config_for_env
from ppo_async.report import figures, stats
from ppo_async.report.metrics import read_jsonl
from ppo_async.study import benchmark as bm
from ppo_async.study import store
from ppo_async.study.benchmark.store import NOT_IN_RESULTS
from ppo_async.study.benchmark.timings import lag_fractions, read_timings
from ppo_async.study.manifest import Manifest, default_out, write_summary

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MODE = "barrier"  # the benchmark mode every cell runs (one sampler, scheduled lag)
BENCHMARK = os.path.join("experiments", "results", "benchmark")  # the committed mujoco benchmark (K = 0, emergent lag)
K0 = "barrier-K0"  # the K = 0 cell: the benchmark's barrier runs, unchanged
EMERGENT = "emergent"  # the table's row of the default async mode's runs (--emergent-from)
METRICS = ("approx_kl", "kl_staleness", "clip_fraction", "ess_fraction", "entropy_end")
"""Per run: means over its iterations; entropy_end over the last 10% of them (`timings.timing_row`'s)."""
FROM_TIMINGS = ("approx_kl", "kl_staleness", "entropy_end")  # those a benchmark's timings.csv also holds
TOLERANCE = 0.1  # a K is tolerated when its mean final eval return is within 10% of K = 0's (issue 41)

CORRECTIONS: dict[str, dict[str, Any]] = {
    "ppo": {"ppo.clip_eps": 0.2},
    "dual-clip": {"ppo.clip_eps": 0.2, "ppo.dual_clip": 3.0},
    "vtrace": {"ppo.clip_eps": 0.2, "ppo.advantage_estimator": "vtrace"},
    "decoupled": {"ppo.clip_eps": 0.2, "ppo.objective": "decoupled", "ppo.is_clip": 2.0},  # + its EWMA (`ewma_decay`)
}
"""Correction name -> dotted config fields over the env's preset and the barrier mode."""


@dataclasses.dataclass
class Args:
    envs: tuple[str, ...] = ("gymnasium/Hopper-v5", "gymnasium/Walker2d-v5", "gymnasium/HalfCheetah-v5")
    """Envs of the suite."""
    ks: tuple[int, ...] = (1, 2, 4, 8)
    """Fixed lags K > 0 (K = 0 is the barrier runs)."""
    corrections: tuple[str, ...] = tuple(CORRECTIONS)
    """Corrections to run (names of CORRECTIONS)."""
    seeds: int = 3
    """Seeds per cell."""
    top_up_seeds: int = 5
    """Seeds for the cells a finding hangs on (`hanging_ks`: a cell up to a correction's first K outside the 10%
    line whose 95% CI holds that line), and for K = 0 run here; 0: none."""
    total_env_steps: int = 1_000_000
    """Env steps per run."""
    suite: str = "mujoco"
    """The benchmark suite the envs belong to (its evaluation cadence; "classic" for a smoke test on Pendulum-v1)."""
    eval_every_steps: int | None = None
    """Env steps between evaluations (default: the suite's, 100k for mujoco)."""
    eval_episodes: int = 10
    """Episodes per evaluation (deterministic policy)."""
    fraction: float = 0.8
    """'Env steps to this fraction of K = 0's mean final return' (envs with a positive return)."""
    k0_from: str | None = BENCHMARK
    """A benchmark output whose barrier runs are K = 0 (read only; its barrier config must be this one's; a relative
    path not found from here is read from the repository); None: run K = 0 here, into OUT/<env>/barrier-K0."""
    emergent_from: str | None = BENCHMARK
    """A benchmark output (None: none; a relative path as for --k0-from) holding the default async mode's runs (lag from timing, not a schedule): placed on the table and figures at their mean lag, beside the fixed-K cell of that lag (read only; issue 41 item 3)."""
    out: str | None = None
    """Output folder (default runs/experiments/lag_tolerance; publish with --out experiments/results/lag_tolerance)."""
    summarise_only: bool = False
    """Only write table.csv, summary.txt and the figures again from OUT."""
    progress: bool = True
    """A line per run and each run's progress bar."""
    jobs: int = 1
    """A cell's runs trained at once, each in its own process (`pa.benchmark`'s jobs): the table reads returns
    per env step, which do not depend on the load, so 2 on 2 cores halve a top-up's time."""


# ---------------------------------------------------------------------------- cells


def ewma_decay(sgd_steps_per_iteration: int) -> float:
    """The EWMA decay of decoupled PPO's proximal policy per SGD step: 1 - 2 / steps, whose centre
    of mass (1 / (1 - d) steps back) is the mean age of PPO's pi_old over an iteration's steps
    (Hilton et al. 2021's matching rule; 80 steps: 0.975, as experiments/lag_sweep.py uses)."""
    return 1.0 - 2.0 / max(int(sgd_steps_per_iteration), 3)


def cell_name(correction: str, k: int) -> str:
    """`ppo-K4`; the K = 0 cell is `barrier-K0` (one for every correction)."""
    return K0 if k == 0 else f"{correction}-K{k}"


def cell_changes(env: str, correction: str, k: int) -> dict[str, Any]:
    """The dotted fields a cell sets over the env's preset and the barrier mode: none at K = 0
    (the benchmark's barrier runs), else the correction's and `lag.K` (decoupled: its EWMA decay
    from the env's preset SGD steps)."""
    if k == 0:
        return {}
    changes = {**CORRECTIONS[correction], "lag.K": int(k)}
    if changes.get("ppo.objective") == "decoupled":
        changes["ppo.prox_ewma"] = ewma_decay(config_for_env(env).sgd_steps_per_iteration)
    return changes


def env_dir(out: str, env: str) -> str:
    return os.path.join(out, env.replace("/", "_"))


def cell_dir(out: str, env: str, correction: str, k: int) -> str:
    return os.path.join(env_dir(out, env), cell_name(correction, k))


def cells(args: Args) -> list[tuple[str, str, int]]:
    """(env, correction, K) of every cell to run, K = 0 first (once per env, correction "-")."""
    out = []
    for env in args.envs:
        if args.k0_from is None:
            out.append((env, "-", 0))
        out += [(env, correction, int(k)) for k in args.ks for correction in args.corrections]
    return out


def seed_cap(args: Args) -> int:
    """The most seeds any cell runs (K = 0 run here runs this many): seeds 0 .. cap - 1 are read."""
    return max(args.seeds, args.top_up_seeds)


def recorded_seeds(cell: str) -> int:
    """The seeds a cell's benchmark.json records (0 for a cell not run yet)."""
    spec = store.read_spec(os.path.join(cell, bm.SPEC_FILE))
    return 0 if spec is None else int(spec.get("seeds", 0))


def run_cell(args: Args, out: str, env: str, correction: str, k: int, seeds: int | None = None) -> None:
    """One cell: `pa.benchmark` of the barrier mode with the cell's changes into its folder, with
    `seeds` (default `--seeds`; K = 0 `seed_cap`), or the seeds it was run with before where more
    (a topped-up cell); resumable, and a cell run before with fewer seeds is extended (its
    finished runs kept)."""
    seeds = max(seeds if seeds is not None else seed_cap(args) if k == 0 else args.seeds,
                recorded_seeds(cell_dir(out, env, correction, k)))
    print(f"== lag_tolerance {env} {cell_name(correction, k)} x {seeds} seeds: {cell_changes(env, correction, k)}",
          flush=True)
    pa.benchmark(args.suite, seeds=seeds, out=cell_dir(out, env, correction, k), envs=[env],
                 total_env_steps=args.total_env_steps, modes=[MODE], eval_every_steps=args.eval_every_steps,
                 eval_episodes=args.eval_episodes, progress=args.progress, changes=cell_changes(env, correction, k),
                 jobs=args.jobs)


# ---------------------------------------------------------------------------- K = 0 from a benchmark


def k0_config(args: Args, env: str) -> dict[str, Any]:
    """The config (as a dict) of this call's K = 0 runs of `env` (seed 0, no run directory)."""
    plan = bm.resolve_plan(args.suite, [env], [MODE], args.seeds, args.total_env_steps, args.eval_every_steps,
                           args.eval_episodes)
    return config_to_dict(bm.run_config(plan, env, MODE, 0, None))


def differing(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths where nested dicts `a` and `b` differ (pure)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for key in sorted(set(a) | set(b)) for p in differing(a.get(key), b.get(key), f"{prefix}{key}.")]
    return [] if a == b else [prefix.rstrip(".")]


def check_k0_source(args: Args, env: str) -> None:
    """SystemExit unless `--k0-from`'s benchmark ran `env` in barrier mode with this call's config."""
    spec_path = os.path.join(args.k0_from, bm.SPEC_FILE)
    if not os.path.isfile(spec_path):
        raise SystemExit(f"error: --k0-from {args.k0_from!r}: no {bm.SPEC_FILE} (not a benchmark output)")
    with open(spec_path, encoding="utf-8") as f:
        recorded = json.load(f).get("configs", {}).get(f"{env} {MODE}")
    if recorded is None:
        raise SystemExit(f"error: --k0-from {args.k0_from!r} has no {MODE} runs of {env}")
    # both in today's spelling (`store.as_today`: e.g. threaded.num_samplers recorded before it became
    # num_samplers); fields no result depends on (how often a run checkpoints) left out, as the benchmark does
    diff = [path for path in differing(store.as_today(recorded), store.as_today(k0_config(args, env)))
            if path.rpartition(".")[2] not in NOT_IN_RESULTS]
    if diff:
        raise SystemExit(f"error: --k0-from {args.k0_from!r}: its {MODE} runs of {env} differ from this call's K = 0 "
                         f"in {', '.join(diff[:8])}; run K = 0 here (leave --k0-from out)")


def k0_source(args: Args, out: str, env: str) -> str:
    """The benchmark output holding `env`'s K = 0 runs: `--k0-from`, or OUT/<env>/barrier-K0."""
    return args.k0_from if args.k0_from is not None else cell_dir(out, env, "-", 0)


# ---------------------------------------------------------------------------- the report (pure but for reads)


def final_runs(source: str, env: str, seeds: int, mode: str = MODE) -> pd.DataFrame:  # seeds: `seed_cap`
    """Every evaluation row (results.csv) of the runs of `env` in `mode` in a benchmark output
    whose final row is there (finished), seeds below `seeds`; empty when there are none."""
    df = bm.results_frame(source)
    if df.empty:
        return df
    df = df[(df["env"] == env) & (df["mode"] == mode) & (df["seed"] < seeds)]
    finished = set(df.loc[df["final"] == 1, "seed"])
    return df[df["seed"].isin(finished)]


def run_means(source: str, env: str, seed: int, mode: str = MODE) -> dict[str, float]:
    """The mean over iterations of each of `METRICS` in one run's metrics.jsonl, entropy_end the
    mean policy entropy over its last 10% (NaN when the run directory or the metric is missing)."""
    path = os.path.join(bm.run_dir_of(source, env, mode, seed), "metrics.jsonl")
    rows = read_jsonl(path, columns=(*METRICS, "entropy")) if os.path.isfile(path) else []
    means = {name: stats_mean([r.get(name) for r in rows]) for name in METRICS}
    means["entropy_end"] = stats_mean([r.get("entropy") for r in rows[len(rows) - max(1, len(rows) // 10):]])
    return means


def seed_means(source: str, env: str, mode: str, seeds: Sequence[int]) -> list[dict[str, float]]:
    """`run_means` of each seed's run; a run whose directory is elsewhere (a benchmark run with
    --runs-dir, or a fresh checkout: run directories are not committed) takes its approx_kl and
    kl_staleness from the benchmark's timings.csv (the same means over iterations), the rest NaN."""
    means = [run_means(source, env, seed, mode) for seed in seeds]
    if all(math.isfinite(m[name]) for m in means for name in FROM_TIMINGS):
        return means
    timing = read_timings(source)
    timing = timing[(timing["env"] == env) & (timing["mode"] == mode)]
    for m, seed in zip(means, seeds):
        for name in FROM_TIMINGS:
            if not math.isfinite(m[name]):
                m[name] = stats_mean(timing.loc[timing["seed"] == seed, name])
    return means


RUN_MEANS_FILE = "run_means.csv"  # a cell's per-seed `run_means`, committed (its run directories are not)


def kept_means(cell: str, env: str, seeds: Sequence[int]) -> list[dict[str, float]]:
    """`run_means` of each seed of a cell, kept in CELL/run_means.csv: a seed whose run directory
    is here is read from it (and the file updated), one whose directory is not (a fresh checkout:
    run directories are not committed) from the file - so the published table's clip and ESS
    columns come back from the committed results alone."""
    path = os.path.join(cell, RUN_MEANS_FILE)
    kept = pd.read_csv(path).set_index("seed") if os.path.isfile(path) else pd.DataFrame()
    rows = {int(seed): {name: float(kept.loc[seed, name]) for name in METRICS} for seed in kept.index}
    means = []
    for seed in seeds:
        m = run_means(cell, env, seed)
        if any(math.isfinite(v) for v in m.values()):
            rows[int(seed)] = m
        else:
            m = rows.get(int(seed), m)
        means.append(m)
    if rows:
        pd.DataFrame([{"seed": seed, **rows[seed]} for seed in sorted(rows)]).to_csv(path, index=False)
    return means


def stats_mean(values: Sequence[Any]) -> float:
    """The mean of the finite numbers among `values`; NaN when there are none (pure)."""
    x = stats.finite(pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").to_numpy(np.float64))
    return float(x.mean()) if len(x) else math.nan


def steps_to(rows: pd.DataFrame, target: float) -> float:
    """The env steps of one run's first evaluation at or above `target` (rows: its results.csv
    rows); NaN when none reaches it or the target is not a number (pure)."""
    if not math.isfinite(target):
        return math.nan
    reached = rows.sort_values("env_steps")
    reached = reached[reached["eval_return"] >= target]
    return float(reached.iloc[0]["env_steps"]) if len(reached) else math.nan


def fraction_target(k0_final_mean: float, fraction: float) -> float:
    """`fraction` of K = 0's mean final return, defined for a positive return only (NaN else):
    a fraction of a negative return would be a higher bar than the return itself (pure)."""
    return fraction * k0_final_mean if k0_final_mean > 0 else math.nan


def cell_row(runs: pd.DataFrame, reference: float, target: float, means: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """One cell's numbers over its seeds (pure).

    Args:
      runs: the cell's results.csv rows (finished runs only).
      reference: the env's normalising reference (NaN: none).
      target: the return whose first reach is timed (`fraction_target`).
      means: `run_means` of each of its runs.
    """
    finals = runs[runs["final"] == 1].sort_values("seed")
    returns = finals["eval_return"].to_numpy(np.float64)
    scores = bm.normalise(returns, reference) if math.isfinite(reference) else np.full(len(finals), math.nan)
    low, high = stats.bootstrap_mean_ci(scores)
    eval_low, eval_high = stats.bootstrap_mean_ci(returns)
    steps = np.array([steps_to(group, target) for _, group in runs.groupby("seed")], np.float64)
    return {
        "seeds": len(finals), "eval_mean": stats_mean(returns), "eval_ci_low": eval_low, "eval_ci_high": eval_high,
        "norm_mean": stats_mean(scores),
        "norm_ci_low": low, "norm_ci_high": high, "norm_worst": float(np.min(scores)) if len(scores) else math.nan,
        "steps_to_target": stats_mean(steps), "reached": int(np.isfinite(steps).sum()),
        **{name: stats_mean([m[name] for m in means]) for name in METRICS},
    }


def env_rows(args: Args, out: str, env: str, reference: float) -> list[dict[str, Any]]:
    """The table rows of one env: its K = 0 row, then one per correction and K with finished runs."""
    k0_dir = k0_source(args, out, env)
    k0 = final_runs(k0_dir, env, seed_cap(args))
    k0_mean = stats_mean(k0.loc[k0["final"] == 1, "eval_return"]) if len(k0) else math.nan
    target = fraction_target(k0_mean, args.fraction)
    rows = []
    for correction, k, source in [("-", 0, k0_dir)] + [(c, int(k), cell_dir(out, env, c, k))
                                                        for c in args.corrections for k in args.ks]:
        runs = k0 if k == 0 else final_runs(source, env, seed_cap(args))
        if runs.empty:
            continue
        seeds = sorted(int(s) for s in set(runs["seed"]))
        means = seed_means(source, env, MODE, seeds) if k == 0 else kept_means(source, env, seeds)
        rows.append({"env": env, "correction": correction, "K": k, "target": target,
                     **cell_row(runs, reference, target, means)})
    return rows


def emergent_row(source: str, env: str, seeds: int, reference: float, target: float) -> dict[str, Any] | None:
    """The default async mode's runs of `env` in benchmark output `source` as a table row (None
    without finished ones): `cell_row`'s numbers, K = their mean lag (timings.csv, mean over
    runs), `lag_shares` = the share of consumed samples at lag 0, 1, 2 and >= 3 (the summed
    histograms), approx_kl from timings.csv where the run directories are elsewhere."""
    mode = bm.DEFAULT_ASYNC_MODE
    runs = final_runs(source, env, seeds, mode)
    if runs.empty:
        return None
    seeds_run = sorted(int(s) for s in set(runs["seed"]))
    timing = read_timings(source)
    timing = timing[(timing["env"] == env) & (timing["mode"] == mode) & timing["seed"].isin(seeds_run)]
    means = seed_means(source, env, mode, seeds_run)
    return {"env": env, "correction": EMERGENT, "K": stats_mean(timing["lag_mean"]), "target": target,
            **cell_row(runs, reference, target, means), "lag_shares": json.dumps(lag_fractions(list(timing["lag_histogram"])))}


def emergent_match(table: pd.DataFrame, env: str) -> str | None:
    """One line: does the emergent-lag row's return match the fixed-K cell of its mean lag (PPO's
    clip, the default async mode's objective; K = the mean lag rounded, >= 1)? Inside that cell's
    95% CI or not, with the lag shares that differ from a fixed K (pure)."""
    part = table[table["env"] == env]
    emergent = part[part["correction"] == EMERGENT]
    if emergent.empty or not math.isfinite(emergent.iloc[0]["K"]):
        return None
    e = emergent.iloc[0]
    k = max(1, int(round(float(e["K"]))))
    fixed = part[(part["correction"] == "ppo") & (part["K"] == k)]
    shares = ", ".join(f"{label} {100 * x:.1f}%" for label, x in zip(("lag 0", "1", "2", ">= 3"), json.loads(e["lag_shares"])))
    said = (f"{env}: {bm.DEFAULT_ASYNC_MODE} (emergent lag, mean {e['K']:.2f}; {shares}) norm {e['norm_mean']:.2f} "
            f"[{e['norm_ci_low']:.2f}, {e['norm_ci_high']:.2f}], KL {e['approx_kl']:.4f}")
    if fixed.empty:
        return f"{said}; no fixed ppo-K{k} cell to compare with yet"
    f = fixed.iloc[0]
    inside = f["norm_ci_low"] <= e["norm_mean"] <= f["norm_ci_high"]
    return (f"{said} against fixed ppo-K{k}: norm {f['norm_mean']:.2f} [{f['norm_ci_low']:.2f}, {f['norm_ci_high']:.2f}], "
            f"KL {f['approx_kl']:.4f}: {'inside' if inside else 'outside'} its 95% CI")


def tolerance_line(table: pd.DataFrame, env: str, correction: str, within: float = TOLERANCE) -> str | None:
    """One line: the largest K that `correction` tolerates on `env`, i.e. whose mean final eval
    return, and that of every smaller K run, is within `within` of K = 0's (at least K0 - within x
    |K0|), with each cell's ratio to K = 0 (issue 41's finding per correction; pure). None without
    a K = 0 row or a cell of that correction."""
    part = table[table["env"] == env]
    zero = part[part["K"] == 0]
    cells = part[part["correction"] == correction].sort_values("K")
    if zero.empty or cells.empty or not math.isfinite(float(zero.iloc[0]["eval_mean"])):
        return None
    k0 = float(zero.iloc[0]["eval_mean"])
    floor = tolerance_floor(k0, within)
    largest, broken, said = 0, False, []
    ran = set(cells["K"])
    for k in sorted(set(part.loc[part["K"] > 0, "K"]) - ran - {k for k, c in zip(part["K"], part["correction"]) if c == EMERGENT}):
        if k < max(ran):  # a smaller K this correction has not run: nothing past it can be claimed
            cells = pd.concat([cells, pd.DataFrame([{"K": k, "eval_mean": math.nan, "seeds": 0}])]).sort_values("K")
    for k, value, seeds in zip(cells["K"], cells["eval_mean"], cells["seeds"]):
        if not seeds:
            said.append(f"K = {int(k)} not run")
            broken = True
            continue
        ok = math.isfinite(value) and value >= floor
        if ok and not broken:
            largest = int(k)
        broken = broken or not ok
        said.append(f"K = {int(k)} {value:,.0f} ({value / k0:.2f}x, {int(seeds)} seeds)" if math.isfinite(value)
                    else f"K = {int(k)} -")
    verdict = f"up to K = {largest}" if largest else "no K tested"
    return (f"{correction} on {env}: tolerates {verdict} within {100 * within:g}% of K = 0's {k0:,.0f} "
            f"({'; '.join(said)})")


def tolerance_floor(k0: float, within: float = TOLERANCE) -> float:
    """The lowest mean final eval return within `within` of K = 0's mean `k0` (pure)."""
    return k0 - within * abs(k0)


def hanging_ks(table: pd.DataFrame, env: str, correction: str, seeds: int, within: float = TOLERANCE) -> list[int]:
    """The K of `correction`'s cells on `env` that its finding hangs on and that hold fewer than
    `seeds` seeds (pure): walking K up, each cell up to and including the first whose mean final
    eval falls below the tolerance line (`tolerance_floor` of K = 0's mean), whose 95% bootstrap
    CI of the mean eval return holds that line - more seeds there can move the largest tolerated K
    (issue 41: "5 seeds where two cells' CIs overlap and the conclusion hangs on it")."""
    part = table[table["env"] == env]
    zero = part[part["K"] == 0]
    if zero.empty or not math.isfinite(float(zero.iloc[0]["eval_mean"])):
        return []
    floor = tolerance_floor(float(zero.iloc[0]["eval_mean"]), within)
    hanging = []
    for row in part[part["correction"] == correction].sort_values("K").itertuples():
        if row.eval_ci_low <= floor <= row.eval_ci_high and row.seeds < seeds:
            hanging.append(int(row.K))
        if not row.eval_mean >= floor:
            break
    return hanging


def top_up(args: Args, out: str) -> None:
    """Runs the cells the findings hang on (`hanging_ks`) to `--top-up-seeds` seeds, round after
    round: a cell's new seeds can move a correction's first K outside the line up to the next one."""
    for _ in range(len(args.ks) + 1):
        table = summarise(args, out)
        todo = [(env, correction, k) for env in args.envs for correction in args.corrections
                for k in (hanging_ks(table, env, correction, args.top_up_seeds) if len(table) else ())]
        if not todo:
            return
        for env, correction, k in todo:
            run_cell(args, out, env, correction, k, seeds=args.top_up_seeds)


def lag_table(args: Args, out: str) -> pd.DataFrame:
    """Every env's rows (`env_rows`), references from the benchmark's references.json."""
    references = bm.normalising_references(bm.load_references())
    rows = []
    for env in args.envs:
        part = env_rows(args, out, env, references.get(env, math.nan))
        if args.emergent_from is not None and part:
            reference, target = references.get(env, math.nan), part[0]["target"]
            row = emergent_row(args.emergent_from, env, seed_cap(args), reference, target)
            fixed = [r for r in part if row is not None and r["correction"] == "ppo" and r["K"] == max(1, round(row["K"]))]
            if fixed and fixed[0]["seeds"] < row["seeds"]:  # compared on the seeds the fixed cell has
                row = emergent_row(args.emergent_from, env, fixed[0]["seeds"], reference, target)
            part += [row] if row is not None else []
        rows += part
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- figures and summary


def plot_env(table: pd.DataFrame, env: str, path: str) -> None:
    """OUT/lag_tolerance_<env>.png: normalised final evaluation vs K (95% CI bars), one line per
    correction through the shared K = 0 point; beside it mean KL to the behaviour policy vs K
    (approx_kl solid, its staleness part dashed) with the 0.01 / 0.03 guides."""
    part = table[table["env"] == env]
    zero = part[part["K"] == 0]
    fig, (ret_ax, kl_ax) = figures.figure(1, 2, figsize=(11.0, 4.2))
    for i, correction in enumerate(c for c in dict.fromkeys(part["correction"]) if c not in ("-", EMERGENT)):
        line = pd.concat([zero, part[part["correction"] == correction]]).sort_values("K")
        x, y = line["K"].to_numpy(float), line["norm_mean"].to_numpy(float)
        err = np.abs(np.vstack([y - line["norm_ci_low"].to_numpy(float), line["norm_ci_high"].to_numpy(float) - y]))
        color = f"C{i}"  # one colour per correction in both panels
        ret_ax.errorbar(x, y, yerr=np.nan_to_num(err), marker="o", capsize=3, color=color, label=correction)
        kl_ax.plot(x, line["approx_kl"].to_numpy(float), marker="o", color=color)
        kl_ax.plot(x, line["kl_staleness"].to_numpy(float), marker="x", linestyle="--", color=color)
    emergent = part[part["correction"] == EMERGENT]
    if len(emergent):
        e = emergent.iloc[0]
        err = np.abs([[e["norm_mean"] - e["norm_ci_low"]], [e["norm_ci_high"] - e["norm_mean"]]])
        ret_ax.errorbar([e["K"]], [e["norm_mean"]], yerr=np.nan_to_num(err), marker="*", markersize=12, capsize=3,
                        color="black", linestyle="none", label=f"{bm.DEFAULT_ASYNC_MODE}: emergent lag (mean {e['K']:.2f})")
        kl_ax.plot([e["K"]], [e["approx_kl"]], marker="*", markersize=12, color="black", linestyle="none")
    ret_ax.set(xlabel="lag K (versions)", ylabel="final eval, normalised (1 = reference; 95% CI)", title=env)
    kl_ax.set(xlabel="lag K (versions)", ylabel="mean KL to the behaviour policy",
              title=f"{env}: KL vs K\n(solid: approx_kl, dashed: staleness)")
    figures.kl_guides(kl_ax)
    kls = part[["approx_kl", "kl_staleness"]].to_numpy(float).ravel()
    kls = kls[np.isfinite(kls) & (kls > 0)]
    if len(kls):  # on a log scale: decoupled PPO's KL reaches ~1-4 at K = 8, the guides sit at 0.01 and 0.03
        kl_ax.set_yscale("log")
        kl_ax.set_ylim(min(kls.min(), figures.KL_WATCH) / 2, max(kls.max(), figures.KL_HURTING) * 2)
    ks = sorted(int(k) for k in part.loc[part["correction"] != EMERGENT, "K"].unique())
    for ax in (ret_ax, kl_ax):
        ax.set_xscale("symlog", linthresh=1)  # K = 0, 1, 2, 4, 8 evenly spaced from 1 on
        ax.set_xticks(ks, labels=[str(k) for k in ks])
        ax.grid(alpha=0.3)
    figures.legend_outside(fig, ret_ax, kl_ax)
    figures.save(fig, path)


def figure_path(out: str, env: str) -> str:
    return os.path.join(out, f"lag_tolerance_{env.replace('/', '_')}.png")


def formatted(table: pd.DataFrame) -> pd.DataFrame:
    """The table with numbers as the summary prints them (pure)."""
    fmt = lambda v, spec: "-" if not isinstance(v, (int, float)) or not math.isfinite(v) else format(v, spec)  # noqa: E731
    out = table[["env", "correction", "K", "seeds"]].copy()
    out["K"] = [f"{k:.2f} (mean)" if c == EMERGENT else f"{int(k)}" for c, k in zip(table["correction"], table["K"])]
    out["norm (95% CI)"] = [f"{fmt(m, '.2f')} ({fmt(lo, '.2f')}, {fmt(hi, '.2f')})"
                            for m, lo, hi in zip(table["norm_mean"], table["norm_ci_low"], table["norm_ci_high"])]
    out["worst"] = table["norm_worst"].map(lambda v: fmt(v, ".2f"))
    out["eval"] = table["eval_mean"].map(lambda v: fmt(v, ",.0f"))
    out["steps to target"] = [f"{fmt(s, ',.0f')} ({r}/{n})" for s, r, n in zip(table["steps_to_target"],
                                                                            table["reached"], table["seeds"])]
    for name in METRICS:
        out[name] = table[name].map(lambda v: fmt(v, ".4f"))
    return out


def summary_lines(table: pd.DataFrame, args: Args) -> list[str]:
    """summary.txt: what the columns mean, the table, how it was made."""
    lines = [
        "lag tolerance (issue 41 item 2): barrier runs with a fixed lag K (lag.K: every batch made by the policy K "
        "versions old), one line per correction; K = 0 = the benchmark's barrier runs",
        "norm = final deterministic evaluation normalised by the env's reference (1 + (score - ref) / |ref|), mean over "
        "seeds (95% bootstrap CI), worst = the lowest seed;",
        f"seeds = {args.seeds} per cell" + (f", {seed_cap(args)} for K = 0 and for the cells a finding below hangs on "
                                            f"(walking K up to a correction's first K under the {100 * TOLERANCE:g}% "
                                            "line, those whose 95% CI of the mean eval holds the line);"
                                            if args.top_up_seeds else ";"),
        f"steps to target = mean env steps to the first evaluation >= {args.fraction:g} x K = 0's mean final return "
        "(seeds reaching it / seeds; '-' for a non-positive return);",
        "approx_kl (KL to the behaviour policy; 0.01 watch, 0.03 lag is hurting), kl_staleness (its part from the lag "
        "alone: KL(behaviour || the learner's policy when the iteration began); under PPO's clip the update is pulled "
        "back towards the behaviour policy, so approx_kl can sit far below it), clip_fraction, ess_fraction = means "
        "over each run's iterations and the seeds; entropy_end = the policy's entropy over the last 10% of "
        "iterations (how far its exploration noise collapsed), mean over seeds", ""]
    if table.empty:
        return lines + ["(no finished runs yet)"]
    lines.append(formatted(table).to_string(index=False))
    tolerated = [line for correction in CORRECTIONS for env in dict.fromkeys(table["env"])
                 if (line := tolerance_line(table, env, correction))]
    if tolerated:
        lines += ["", f"the largest K each correction tolerates, correction by correction: its mean final eval, and "
                      f"that of every smaller K, within {100 * TOLERANCE:g}% of K = 0's:", *tolerated]
    lines += ["", f"corrections: {', '.join(f'{k} = {v}' for k, v in CORRECTIONS.items() if k in set(table['correction']))}"
              "; decoupled adds ppo.prox_ewma = 1 - 2 / (SGD steps per iteration)",
              f"K = 0 from: {args.k0_from or 'OUT/<env>/' + K0}",
              *([f"{EMERGENT}: the default async mode's runs ({bm.DEFAULT_ASYNC_MODE}: lag from timing) from "
                 f"{args.emergent_from}, K = their mean lag; against the fixed-K cell of that lag:"]
                + [line for env in dict.fromkeys(table["env"]) if (line := emergent_match(table, env))]
                if args.emergent_from is not None else []),
              "command: python experiments/lag_tolerance.py --out experiments/results/lag_tolerance (the whole grid, K = 0 "
              f"and the emergent lag from {BENCHMARK}; it resumes, skipping finished runs)",
              f"(this summary written by: python experiments/lag_tolerance.py {' '.join(sys.argv[1:])})"]
    return lines


def summarise(args: Args, out: str) -> pd.DataFrame:
    """OUT/table.csv, OUT/summary.txt and one figure per env, from the cells' results."""
    table = lag_table(args, out)
    table.to_csv(os.path.join(out, "table.csv"), index=False)
    write_summary(out, summary_lines(table, args))
    for env in (table["env"].unique() if len(table) else ()):
        plot_env(table, env, figure_path(out, env))
    return table


def check_args(args: Args) -> None:
    """SystemExit naming the option for an unknown correction, a lag that is not > 0, a bad
    fraction or an --emergent-from that holds no benchmark."""
    unknown = [c for c in args.corrections if c not in CORRECTIONS]
    if unknown:
        raise SystemExit(f"error: --corrections: {unknown[0]!r} is not a correction ({', '.join(CORRECTIONS)})")
    if not args.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in args.ks):
        raise SystemExit(f"error: --ks {list(args.ks)}: lags must be integers >= 1 (K = 0 is the barrier runs)")
    if isinstance(args.top_up_seeds, bool) or not isinstance(args.top_up_seeds, int) or args.top_up_seeds < 0 \
            or 0 < args.top_up_seeds <= args.seeds:
        raise SystemExit(f"error: --top-up-seeds {args.top_up_seeds!r}: must exceed --seeds {args.seeds} (the seeds of "
                         "the cells a finding hangs on), or 0 for none")
    if isinstance(args.jobs, bool) or not isinstance(args.jobs, int) or args.jobs < 1:
        raise SystemExit(f"error: --jobs {args.jobs!r}: must be an integer >= 1 (a cell's runs trained at once)")
    if not 0.0 < args.fraction <= 1.0:
        raise SystemExit(f"error: --fraction {args.fraction}: must lie in (0, 1]")
    if args.emergent_from is not None and not os.path.isfile(os.path.join(in_repo(args.emergent_from), bm.RESULTS_FILE)):
        raise SystemExit(f"error: --emergent-from {args.emergent_from!r}: no {bm.RESULTS_FILE} (not a benchmark output)")


def in_repo(path: str | None) -> str | None:
    """`path` as given where it exists from here (or is absolute, or None), else under the repository."""
    return path if path is None or os.path.isabs(path) or os.path.exists(path) else os.path.join(REPO, path)


def main(args: Args) -> pd.DataFrame:
    args = dataclasses.replace(args, k0_from=in_repo(args.k0_from), emergent_from=in_repo(args.emergent_from))
    check_args(args)
    out = args.out or default_out("lag_tolerance", REPO)
    if args.k0_from is not None:
        for env in args.envs:
            check_k0_source(args, env)
    with Manifest(out, extra={"lag_tolerance": dataclasses.asdict(args)}):
        table = None
        for env, correction, k in ([] if args.summarise_only else cells(args)):
            run_cell(args, out, env, correction, k)
            table = summarise(args, out)  # the table so far: a long grid shows what it has
        if not args.summarise_only and args.top_up_seeds:
            top_up(args, out)
            table = None
        return summarise(args, out) if table is None else table


if __name__ == "__main__":
    main(tyro.cli(Args))
