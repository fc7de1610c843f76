"""The seed's claims at our scale: KL and return vs ring-buffer length, and the throughput knee
vs the number of samplers (with a straggler), on threaded runs.

    python experiments/buffer_and_samplers.py            # Pendulum-v1, 5 seeds, ~10 min on 2 cores
    python experiments/buffer_and_samplers.py --quick    # smoke run: 2 seeds, tiny budgets, into runs/experiments/buffer_and_samplers/quick
    python experiments/buffer_and_samplers.py --parts buffer --num-seeds 3

Part "buffer": `buffer_samplers` samplers, ring buffer of 64, 16, 4 and 1 chunk(s) (one chunk
= 16 envs x 64 steps = 1024 transitions; 64 -> 16 chunks is the 4x cut of the report's
65536 -> 16384 transitions), `buffer_env_steps` per run. Does a 4x shorter buffer lower the
mean KL to the behaviour policy, by how much, and what does it do to the return?

Part "samplers": 1..`max_samplers` samplers at a 4-chunk buffer, `sampler_env_steps` per run,
in two regimes, each with one straggler in four samplers (sampler i waits
`pattern[i mod 4]` ms per env step after its rollout, slept outside the GIL):
  compute   `compute_pattern` (0, 0, 0, 0.2): the samplers' own compute is the cost and the
            two cores are shared by every sampler and the learner; the straggler's extra
            0.2 ms per step makes its rollouts ~4x as long as the others' (the measured ratio
            is printed).
  latency   `latency_pattern` (1, 1, 1, 4): a slow simulator, 1 ms per env step (4 ms for the
            straggler): the samplers wait rather than compute, so more of them help until the
            learner is the bottleneck.
Per count: consumer env steps/s (the learner's intake after a 20% warm-up), mean KL, mean lag,
and the knee by `tune`'s rule (`ppo_async.study.tune.knee_of`, KL target `kl_target`).

Every run is measured with `analysis.run_measurements`; the tables give mean ± 95% CI over
seeds. Writes OUT/buffer.csv, OUT/samplers.csv (one row per run), OUT/summary.txt (the README
tables), kl_vs_buffer.png, return_vs_buffer.png, knee_<regime>.png and manifest.json. OUT defaults to
runs/experiments/buffer_and_samplers/ENV (git-ignored): publish with
--out experiments/results/buffer_and_samplers/ENV.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()

import dataclasses
import os
import time

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.report import analysis, stats
from ppo_async.study import tune_plots
from ppo_async.study.manifest import Manifest, default_out, write_summary
from ppo_async.study.tune import knee_of, with_latency

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@dataclasses.dataclass(frozen=True)
class Args:
    env: str = "Pendulum-v1"
    num_seeds: int = 5
    parts: tuple[str, ...] = ("buffer", "samplers")
    buffer_samplers: int = 4
    buffer_chunks: tuple[int, ...] = (64, 16, 4, 1)
    buffer_env_steps: int = 300_000
    max_samplers: int = 6
    sampler_env_steps: int = 100_000
    compute_pattern: tuple[float, ...] = (0.0, 0.0, 0.0, 0.2)
    latency_pattern: tuple[float, ...] = (1.0, 1.0, 1.0, 4.0)
    kl_target: float = 0.02
    out: str | None = None
    """Output folder (default runs/experiments/buffer_and_samplers/ENV, git-ignored)."""
    quick: bool = False
    """2 seeds, 1-3 samplers, two buffers and tiny budgets, written to runs/experiments/buffer_and_samplers/quick
    unless --out (a smoke run)."""


def base_config(args: Args, env_steps: int) -> pa.Config:
    return pa.Config(env=args.env, mode="threaded", total_env_steps=env_steps)


def measure(config: pa.Config, seed: int, **labels) -> dict:
    result = pa.train(config.replace(seed=seed))
    df = result.to_dataframe()
    row = {**labels, "seed": seed, **analysis.run_measurements(df)}
    rates = df.iloc[-1]["sampler_steps_per_second"]
    row["sampler_rates"] = [float(r) for r in rates]
    print(f"  {labels} seed {seed}: {row['consumer_steps_per_s']:,.0f} env steps/s, KL {row['approx_kl_mean']:.4f}, "
          f"lag {row['lag_mean']:.1f}, return {row['final_return']:.1f}", flush=True)
    return row


def run_buffer(args: Args) -> pd.DataFrame:
    base = base_config(args, args.buffer_env_steps)
    rows = []
    for seed in range(args.num_seeds):  # seeds outermost: drift in machine load spreads over every length
        for chunks in args.buffer_chunks:
            config = pa.config.replace_paths(base, {"num_samplers": args.buffer_samplers,
                                                    "threaded.buffer_capacity": chunks * base.chunk_size})
            rows.append(measure(config, seed, buffer_chunks=chunks, num_samplers=args.buffer_samplers))
    return pd.DataFrame(rows)


def run_samplers(args: Args) -> pd.DataFrame:
    base = base_config(args, args.sampler_env_steps)
    rows = []
    for regime, pattern in (("compute", args.compute_pattern), ("latency", args.latency_pattern)):
        start = pa.config.replace_paths(base, {"num_samplers": len(pattern),
                                               "threaded.sampler_step_latency_ms": tuple(pattern)})
        for seed in range(args.num_seeds):
            for n in range(1, args.max_samplers + 1):
                changes = with_latency(start, {"num_samplers": n})
                rows.append(measure(pa.config.replace_paths(start, changes), seed, regime=regime, num_samplers=n))
    return pd.DataFrame(rows)


def ci_table(df: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    """Mean and 95% CI over seeds of `columns` per `keys`."""
    out = []
    for key, group in df.groupby(keys, sort=False):
        row = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        for column in columns:
            row[column], row[f"{column}_ci95"] = stats.mean_ci95(group[column])
        out.append(row)
    return pd.DataFrame(out)


def pm(mean: float, half: float, fmt: str) -> str:
    return f"{mean:{fmt}} ± {half:{fmt}}" if np.isfinite(half) else f"{mean:{fmt}}"


def buffer_text(table: pd.DataFrame, args: Args) -> list[str]:
    lines = [f"KL and return vs buffer length: {args.env}, {args.buffer_samplers} samplers, "
             f"{args.buffer_env_steps:,} env steps, {args.num_seeds} seeds (mean ± 95% CI)", "",
             "| buffer (chunks / transitions) | mean KL | mean lag | final return | env steps/s |", "|---|---|---|---|---|"]
    for r in table.itertuples():
        lines.append(f"| {r.buffer_chunks} / {r.buffer_chunks * 1024:,} | {pm(r.approx_kl_mean, r.approx_kl_mean_ci95, '.4f')} | "
                     f"{pm(r.lag_mean, r.lag_mean_ci95, '.1f')} | {pm(r.final_return, r.final_return_ci95, '.0f')} | "
                     f"{pm(r.consumer_steps_per_s, r.consumer_steps_per_s_ci95, ',.0f')} |")
    by = {r.buffer_chunks: r for r in table.itertuples()}
    for long, short in zip(args.buffer_chunks, args.buffer_chunks[1:]):
        if long == 4 * short:
            lines.append(f"\n{long} -> {short} chunks (4x shorter): mean KL x{by[short].approx_kl_mean / by[long].approx_kl_mean:.2f}, "
                         f"mean lag x{by[short].lag_mean / by[long].lag_mean:.2f}")
    return lines


def samplers_text(df: pd.DataFrame, table: pd.DataFrame, args: Args) -> list[str]:
    lines = []
    for regime, rows in table.groupby("regime", sort=False):
        pattern = args.compute_pattern if regime == "compute" else args.latency_pattern
        knee, passes = knee_of(rows.to_dict("records"), args.kl_target)
        runs = df[(df.regime == regime) & (df.num_samplers == len(pattern))]
        rates = np.asarray(runs.sampler_rates.tolist())
        slow = np.median(np.delete(rates, -1, axis=1)) / np.median(rates[:, -1]) if rates.size else np.nan
        lines += ["", f"Samplers, {regime} regime (per-step latency pattern {pattern} ms, cyclic; at {len(pattern)} samplers "
                  f"the straggler makes {slow:.1f}x fewer env steps/s than the median other sampler): {args.env}, "
                  f"{args.sampler_env_steps:,} env steps, {args.num_seeds} seeds", "",
                  "| samplers | consumer env steps/s | gain vs linear | mean KL | mean lag | passes |", "|---|---|---|---|---|---|"]
        first = rows.consumer_steps_per_s.iloc[0]
        previous = None
        for r, ok in zip(rows.itertuples(), passes):
            gain = "-" if previous is None else f"{(r.consumer_steps_per_s - previous) / first:.2f}"
            lines.append(f"| {r.num_samplers} | {pm(r.consumer_steps_per_s, r.consumer_steps_per_s_ci95, ',.0f')} | {gain} | "
                         f"{pm(r.approx_kl_mean, r.approx_kl_mean_ci95, '.4f')} | {pm(r.lag_mean, r.lag_mean_ci95, '.1f')} | "
                         f"{'yes' if ok else 'no'} |")
            previous = r.consumer_steps_per_s
        lines.append(f"\nknee ({regime}): {knee} sampler(s) (tune's rule: gain >= 0.5 x linear and KL < {args.kl_target})")
    return lines


def plot(buffer_table: pd.DataFrame | None, sampler_table: pd.DataFrame | None, args: Args, out: str) -> None:
    if buffer_table is not None:
        tune_plots.kl_vs_buffer(buffer_table.to_dict("records"), args.kl_target, os.path.join(out, "kl_vs_buffer.png"))
        from matplotlib.figure import Figure

        fig = Figure(figsize=(7.5, 4), layout="constrained")
        ax = fig.subplots()
        x = buffer_table.buffer_chunks.to_numpy()
        ax.errorbar(x, buffer_table.final_return, yerr=buffer_table.final_return_ci95.fillna(0), marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(x)
        ax.set_xticklabels([str(c) for c in x])
        ax.set_xlabel("ring-buffer length (rollout chunks)")
        ax.set_ylabel("final return (mean ± 95% CI)")
        ax.set_title(f"Return vs buffer length ({args.buffer_samplers} samplers)")
        ax.grid(alpha=0.3)
        fig.savefig(os.path.join(out, "return_vs_buffer.png"), dpi=100)
    if sampler_table is not None:
        for regime, rows in sampler_table.groupby("regime", sort=False):
            records = rows.to_dict("records")
            tune_plots.tune_knee(records, knee_of(records, args.kl_target)[0], args.kl_target,
                            os.path.join(out, f"knee_{regime}.png"))


def main(args: Args) -> None:
    if args.quick:
        args = dataclasses.replace(args, num_seeds=2, buffer_chunks=(16, 4), buffer_env_steps=20_000, max_samplers=3,
                                   sampler_env_steps=10_000, out=args.out or default_out(os.path.join("buffer_and_samplers", "quick"), REPO))
    out = args.out or default_out(os.path.join("buffer_and_samplers", args.env), REPO)
    with Manifest(out):
        run(args, out)


def run(args: Args, out: str) -> None:
    """The parts asked for; writes the CSVs, summary.txt and the plots into `out`."""
    os.makedirs(out, exist_ok=True)
    t0 = time.perf_counter()
    text, buffer_table, sampler_table = [], None, None
    metrics = ["consumer_steps_per_s", "approx_kl_mean", "lag_mean", "final_return"]
    if "buffer" in args.parts:
        df = run_buffer(args)
        df.to_csv(os.path.join(out, "buffer.csv"), index=False)
        buffer_table = ci_table(df, ["buffer_chunks", "num_samplers"], metrics)
        text += buffer_text(buffer_table, args)
    if "samplers" in args.parts:
        df = run_samplers(args)
        df.to_csv(os.path.join(out, "samplers.csv"), index=False)
        sampler_table = ci_table(df, ["regime", "num_samplers"], metrics)
        text += samplers_text(df, sampler_table, args)
    plot(buffer_table, sampler_table, args, out)
    text.append(f"\n({time.perf_counter() - t0:.0f} s; python experiments/buffer_and_samplers.py)")
    write_summary(out, text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(tyro.cli(Args))
