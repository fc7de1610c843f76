"""Does the online KL controller (`threaded.kl_target`) rescue a bad asynchronous setting?

    python experiments/kl_controller.py              # Pendulum-v1, 5 seeds, ~15 min on 2 cores
    python experiments/kl_controller.py --quick      # smoke run: 2 seeds, tiny budgets, into runs/experiments/kl_controller/quick
    python experiments/kl_controller.py --env brax/inverted_pendulum --total-env-steps 1000000
    python experiments/kl_controller.py --env brax/inverted_pendulum --threshold 900 \
        --out experiments/results/kl_controller/brax/inverted_pendulum --summarise-only   # summary.txt again, no training

Three settings, each `num_seeds` threaded runs of `total_env_steps`, in a slow-simulator regime
(sampler i waits `pattern[i mod 4]` ms per env step, (1, 1, 1, 4): every fourth sampler is a
4x straggler):
  bad         deliberately bad: `bad_samplers` samplers (6: more than the learner can take),
              a `bad_buffer_chunks`-chunk ring buffer (64) and refresh_lag `bad_refresh_lag` (4)
  controlled  the bad setting with the KL controller on, `threaded.kl_target = kl_target`
  best_fixed  the setting `ppo_async.study.tune` chooses on the same regime (run first, from the bad
              setting, its output in OUT/tune; a finished tune there is reused)
Reported per setting (mean ± 95% CI over seeds): the fraction of post-warm-up iterations (after
the first 20%) whose approx_kl is at or below 1.25 x the target (the target: >= 80% for
`controlled`); final return (last 25% of iterations); mean return over the run (return per env
step); median env steps and wall-clock seconds to `threshold`; consumer env steps/s; and, for
`controlled`, where the controller settled (active samplers, refresh_lag, max_lag at the end).

Writes OUT/runs.csv (one row per run), OUT/curves.csv.gz (per iteration), OUT/summary.txt,
return_vs_env_steps.png, return_vs_wall_clock.png, kl_over_time.png and manifest.json. OUT defaults
to runs/experiments/kl_controller/ENV (git-ignored): publish with
--out experiments/results/kl_controller/ENV. `--summarise-only` writes summary.txt again from
OUT/runs.csv and OUT/tune/chosen_config.json (the same arguments as the run, no training); its
manifest keeps the manifest of the run that made the data as `derived_from`.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()

import dataclasses
import json
import os
import shlex
import sys
import time

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.report import analysis, plots, stats
from ppo_async.config import replace_paths
from ppo_async.study.manifest import Manifest, default_out, read_manifest, write_summary
from ppo_async.study.tune import with_latency

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SETTINGS = ("bad", "controlled", "best_fixed")


@dataclasses.dataclass(frozen=True)
class Args:
    env: str = "Pendulum-v1"
    num_seeds: int = 5
    total_env_steps: int = 300_000
    pattern: tuple[float, ...] = (1.0, 1.0, 1.0, 4.0)
    bad_samplers: int = 6
    bad_buffer_chunks: int = 64
    bad_refresh_lag: int = 4
    kl_target: float = 0.02
    threshold: float = -400.0
    """Return for the steps / wall-clock to threshold (Pendulum-v1: -400 is a policy that swings up)."""
    out: str | None = None
    """Output folder (default runs/experiments/kl_controller/ENV with / as _, git-ignored)."""
    quick: bool = False
    """2 seeds and a tiny budget, written to runs/experiments/kl_controller/quick unless --out (a smoke run)."""
    summarise_only: bool = False
    """Write OUT/summary.txt again from OUT/runs.csv and OUT/tune/chosen_config.json: no training."""


def bad_config(args: Args) -> pa.Config:
    base = pa.config_for_env(args.env, {"mode": "threaded", "total_env_steps": args.total_env_steps})
    start = replace_paths(base, {"threaded.num_samplers": len(args.pattern),
                                 "threaded.sampler_step_latency_ms": tuple(args.pattern)})
    changes = {"threaded.num_samplers": args.bad_samplers, "threaded.refresh_lag": args.bad_refresh_lag,
               "threaded.buffer_capacity": args.bad_buffer_chunks * base.chunk_size}
    return replace_paths(start, with_latency(start, changes))


def settings(args: Args, out: str) -> dict[str, pa.Config]:
    bad = bad_config(args)
    tuned = pa.tune(bad, kl_target=args.kl_target, out=os.path.join(out, "tune"), progress=True)
    return {"bad": bad, "controlled": replace_paths(bad, {"threaded.kl_target": args.kl_target}),
            "best_fixed": tuned.config}


def within_target(df: pd.DataFrame, target: float, warmup_fraction: float = 0.2) -> float:
    """Fraction of the post-warm-up iterations whose approx_kl is at most 1.25 x target (of those
    that measured a KL: an iteration whose samples were all dropped as stale does not count)."""
    kl = analysis.measured_kl(df)[int(len(df) * warmup_fraction):]
    kl = kl[np.isfinite(kl)]
    return float(np.mean(kl <= 1.25 * target)) if len(kl) else np.nan


def run_one(name: str, config: pa.Config, seed: int, args: Args) -> tuple[dict, pd.DataFrame]:
    df = pa.train(config.replace(seed=seed)).to_dataframe()
    m = analysis.run_measurements(df)
    steps, seconds = analysis.first_reach(df, args.threshold)
    returns = pd.to_numeric(df.episode_return, errors="coerce")
    row = {"setting": name, "seed": seed, **m, "within_target": within_target(df, args.kl_target),
           "mean_return": float(returns.mean()), "steps_to_threshold": steps, "seconds_to_threshold": seconds}
    if "controller_active_samplers" in df.columns:
        last = df.iloc[-1]
        max_lag = last.controller_max_lag
        row.update(final_active_samplers=int(last.controller_active_samplers), final_refresh_lag=int(last.controller_refresh_lag),
                   final_max_lag="none" if pd.isna(max_lag) else int(max_lag), adjustments=int(last.controller_adjustments))
    print(f"  {name} seed {seed}: KL within target {row['within_target']:.0%}, mean KL {m['approx_kl_mean']:.4f}, "
          f"return {m['final_return']:.1f}, {m['consumer_steps_per_s']:,.0f} env steps/s", flush=True)
    curve = df[["iteration", "env_steps", "wall_time", "episode_return", "approx_kl"]].assign(setting=name, seed=seed)
    return row, curve


def summary_text(runs: pd.DataFrame, args: Args, configs: dict[str, pa.Config]) -> list[str]:
    def pm(values, fmt: str) -> str:
        mean, half = stats.mean_ci95(values)
        return f"{mean:{fmt}} ± {half:{fmt}}" if np.isfinite(half) else f"{mean:{fmt}}"

    lines = [f"KL controller: {args.env}, {args.num_seeds} seeds x {args.total_env_steps:,} env steps, latency pattern "
             f"{args.pattern} ms per step (cyclic), KL target {args.kl_target}", ""]
    for name, config in configs.items():
        t = config.threaded
        lines.append(f"{name}: {t.num_samplers} samplers, buffer {config.buffer_capacity_chunks} chunks, refresh_lag "
                     f"{t.refresh_lag}, max_lag {config.lag.max_lag}, kl_target {t.kl_target}, envs x steps "
                     f"{config.rollout.num_envs} x {config.rollout.num_steps}, clip {config.ppo.clip_eps}, epochs "
                     f"{config.ppo.num_epochs}, minibatches {config.ppo.num_minibatches}")
    lines += ["", f"| setting | KL <= 1.25 x target | mean KL | final return | mean return | steps to {args.threshold:g} "
              f"| seconds to {args.threshold:g} | env steps/s |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in runs.groupby("setting", sort=False):
        reached = rows.steps_to_threshold.notna() & np.isfinite(rows.steps_to_threshold)
        steps = f"{rows.steps_to_threshold[reached].median() / 1000:.0f}k ({reached.sum()}/{len(rows)})" if reached.any() else f"- (0/{len(rows)})"
        secs = f"{rows.seconds_to_threshold[reached].median():.1f}" if reached.any() else "-"
        lines.append(f"| {name} | {pm(rows.within_target * 100, '.0f')}% | {pm(rows.approx_kl_mean, '.4f')} | "
                     f"{pm(rows.final_return, '.0f')} | {pm(rows.mean_return, '.0f')} | {steps} | {secs} | "
                     f"{pm(rows.consumer_steps_per_s, ',.0f')} |")
    controlled = runs[runs.setting == "controlled"]
    if "final_active_samplers" in controlled.columns and len(controlled):
        lines.append("\ncontrolled, at the end (per seed): " + "; ".join(
            f"{int(r.final_active_samplers)} samplers, refresh_lag {int(r.final_refresh_lag)}, max_lag {r.final_max_lag}, "
            f"{int(r.adjustments)} adjustments" for r in controlled.itertuples()))
    return lines


def plot(curves: pd.DataFrame, args: Args, out: str) -> None:
    runs = {name: group.drop(columns="setting") for name, group in curves.groupby("setting", sort=False)}
    plots.compare_runs(runs, out)


def command() -> str:
    """This script's command line as the summary's last line quotes it."""
    return f"python experiments/kl_controller.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}".rstrip()


def summarise_only(args: Args, out: str) -> None:
    """summary.txt from OUT/runs.csv and the configs of a finished run (`bad_config` of the same
    arguments and OUT/tune/chosen_config.json): `summary_text` as the run writes it."""
    runs = pd.read_csv(os.path.join(out, "runs.csv"))
    with open(os.path.join(out, "tune", "chosen_config.json"), encoding="utf-8") as f:
        tuned = pa.config_from_dict(json.load(f))
    bad = bad_config(args)
    configs = {"bad": bad, "controlled": replace_paths(bad, {"threaded.kl_target": args.kl_target}), "best_fixed": tuned}
    text = summary_text(runs, args, configs) + [f"\n(summarised from runs.csv and tune/chosen_config.json, no training; {command()})"]
    write_summary(out, text)
    print(f"wrote {out}/summary.txt")


def main(args: Args) -> None:
    if args.quick:
        args = dataclasses.replace(args, num_seeds=2, total_env_steps=20_000, bad_buffer_chunks=8,
                                   out=args.out or default_out(os.path.join("kl_controller", "quick"), REPO))
    out = args.out or default_out(os.path.join("kl_controller", args.env.replace("/", "_")), REPO)
    if args.summarise_only:
        with Manifest(out, extra={"derived_from": read_manifest(out)}):
            summarise_only(args, out)
        return
    with Manifest(out):
        run(args, out)


def run(args: Args, out: str) -> None:
    """The tune, then every setting and seed; writes the CSVs, summary.txt and the plots into `out`."""
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    configs = settings(args, out)
    rows, curves = [], []
    for seed in range(args.num_seeds):  # seeds outermost: machine-load drift spreads over the settings
        for name in SETTINGS:
            row, curve = run_one(name, configs[name], seed, args)
            rows.append(row)
            curves.append(curve)
    runs, curves = pd.DataFrame(rows), pd.concat(curves, ignore_index=True)
    runs.to_csv(os.path.join(out, "runs.csv"), index=False)
    curves.to_csv(os.path.join(out, "curves.csv.gz"), index=False)
    plot(curves, args, out)
    text = summary_text(runs, args, configs) + [f"\n({time.perf_counter() - t0:.0f} s; {command()})"]
    write_summary(out, text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
