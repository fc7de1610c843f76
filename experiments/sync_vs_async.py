"""Synchronous (barrier) vs asynchronous (threaded) PPO, and the same lags replayed without timing.

    python experiments/sync_vs_async.py            # Pendulum-v1, 5 seeds x 300k env steps, ~4-5 min on 2 cores
    python experiments/sync_vs_async.py --quick    # smoke run: 2 seeds x 3 learner iterations, into runs/experiments/sync_vs_async/quick
    python experiments/sync_vs_async.py --num-seeds 3 --variants barrier async simulated
    python experiments/sync_vs_async.py --latency-ms 1 1 1 8 --out /tmp/sva_8x

Every variant has 4 samplers of 16 Pendulum envs each; sampler s waits `latency_ms[s]` ms per
env step (default (1, 1, 1, 4): one sampler 4x slower, slept outside the GIL after each
rollout), and every learner update sees the same 4096 transitions (4 x 16 x 64), so minibatch
size (256), SGD steps per update (5 epochs x 16), updates per env step and the annealed
learning-rate schedule are identical. Variants:

  barrier         ThreadedConfig(barrier=True): classic synchronous distributed PPO. Each
                  update takes one 16 env x 64 step rollout from every sampler, all made with
                  the latest params (lag 0). The slow sampler sets the pace.
  async           threaded, no barrier, chunks_per_batch=1 with 16 env x 256 step rollouts:
                  one whole batch per chunk, so its version schedule can be replayed (a
                  schedule recorded with chunks_per_batch > 1 cannot: `read_schedule` raises).
                  Same samplers, same per-env-step latency, same transitions per update as
                  the barrier; lag emerges from timing (fast samplers refresh every rollout).
  simulated       simulated mode replaying async seed k's version schedule (sampler id and lag
                  of every consumed batch) with the same 4 x 16 x 256 shapes: the same lags
                  with no timing noise. It isolates the effect of lag on learning; its
                  wall-clock is compute only (no env latency) and not comparable.
  async_cpb4      threaded, no barrier, chunks_per_batch=4 of 16 x 64 rollouts: the very same
                  chunks as the barrier, only the synchronisation differs (not replayable).
  simulated_lag0  simulated, lag 0 with the 4 x 16 x 256 shapes (samplers consumed round-robin,
                  like a lag-free async): the no-lag control for `simulated`.
  async_decoupled `async` with decoupled PPO (`ppo.objective="decoupled"`, Hilton et al. 2021):
                  the clip is to the learner at the start of each update, the behaviour
                  policy only weights the samples (truncated at is_clip = 2).

Which comparison is fair. With chunks_per_batch = 1 an equal batch needs chunks 4x longer
(16 x 256) than the barrier's (16 x 64); we keep 16 envs per sampler rather than 64 x 64
because the latency is per (vectorised) env step, so 64 envs per sampler would give the async
samplers 4x the env throughput of the barrier's. The price: a 16 x 256 chunk takes 4x longer to
make, so `async` carries ~4x the lag (in versions) of `async_cpb4`, and each batch comes from
16 envs instead of 64. Hence both async variants: `barrier` vs `async_cpb4` is the
like-for-like threaded comparison; `async` vs `simulated` asks whether the real run learns as
its lags alone predict; `simulated` vs `simulated_lag0` is the cost of those lags at equal
shapes. The threaded ring buffer holds `buffer_batches` learner batches for every threaded
variant (the same number of transitions). Seeds are interleaved (seed 0 of every variant, then
seed 1, ...) so CPU contention from other processes spreads over all variants.

"Env steps" are the transitions consumed by the learner (per seed). The curves' return is the
mean return of the episodes that finished in the consumed batch, i.e. of the *behaviour* policy,
which in the async variants is `lag` versions older than the learner's (its curve is shifted
right by about lag x 4096 env steps); "eval return" in the table is the learner's final params,
evaluated deterministically on fresh episodes (`pa.evaluate`). "Steps to R" is the env-step
count (and wall-clock since the threads started, compile excluded) of the first iteration whose
mean finished-episode return reaches R; the table reports the median over seeds with an
unreached seed counted as never (so "-" when half the seeds or more never get there).

Writes OUT (default runs/experiments/sync_vs_async, git-ignored; publish with --out
experiments/results/sync_vs_async/...): manifest.json, summary.txt (table, with the load
average), summary.json (per variant and per seed, configs), summary.csv, curves.csv (every
iteration, scalar columns), schedules/async_seed<k>.jsonl (the replayed version schedules), and
PNGs: return_vs_env_steps, return_vs_wall_clock, kl_over_time, lag_histogram_async[_cpb4],
kl_per_lag_async, kl_per_lag_simulated.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)

import dataclasses
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.report import analysis, plots
from ppo_async.study.manifest import Manifest, default_out, write_summary

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VARIANTS = ("barrier", "async", "simulated", "async_cpb4", "simulated_lag0", "async_decoupled")
THREADED = ("barrier", "async", "async_cpb4", "async_decoupled")
ONE_CHUNK = ("async", "async_decoupled")  # one whole learner batch per chunk
CURVE_COLUMNS = (
    "variant", "seed", "iteration", "env_steps", "wall_time", "episode_return", "approx_kl", "approx_kl_max",
    "clip_fraction", "lag_mean", "lag_max", "learner_version", "steps_per_second", "learner_busy_fraction",
    "samples_produced",
)


@dataclasses.dataclass
class Args:
    env: str = "Pendulum-v1"
    """Environment (gymnax, brax/*, playground/*, or gymnasium/* for the threaded variants only); its preset fills the PPO fields."""
    num_seeds: int = 5
    """Seeds per variant (threaded runs are one seed per run; simulated replays loop too)."""
    seed: int = 0
    """First seed."""
    total_env_steps: int = 300_000
    """Env steps per seed (rounded down to whole learner batches)."""
    num_samplers: int = 4
    """Sampler threads (emulated samplers in simulated mode)."""
    num_envs: int = 16
    """Envs per sampler."""
    num_steps: int = 64
    """Steps of one barrier / async_cpb4 rollout; async and simulated rollouts are num_samplers times longer."""
    latency_ms: tuple[float, ...] = (1.0, 1.0, 1.0, 4.0)
    """Per-sampler env-step latency (ms); one entry per sampler."""
    latency_jitter: float = 0.0
    """Relative jitter of the latency."""
    buffer_batches: int = 1
    """Threaded ring-buffer capacity in learner batches (chunks = buffer_batches * chunks per batch)."""
    variants: tuple[str, ...] = VARIANTS
    """Subset of barrier, async, simulated, async_cpb4, simulated_lag0, async_decoupled (simulated needs async)."""
    eval_episodes: int = 32
    """Episodes of the deterministic evaluation of each run's final learner params."""
    thresholds: tuple[float, ...] = (-400.0, -200.0)
    """Returns for 'env steps / wall-clock to reach'."""
    quick: bool = False
    """Smoke run: 2 seeds x 3 learner iterations, written to runs/experiments/sync_vs_async/quick unless --out."""
    out: str | None = None
    """Output folder; default runs/experiments/sync_vs_async (quick: runs/experiments/sync_vs_async/quick), git-ignored."""
    compile_cache: str | None = os.path.join(tempfile.gettempdir(), "ppo_async_jax_cache")
    """JAX persistent compilation cache (compile time is outside every wall-clock figure; this
    only shortens the script). None: the entry-point default (`enable_compilation_cache()`,
    `$PPO_ASYNC_COMPILATION_CACHE`)."""


# ---------------------------------------------------------------------------- configs


def batch_size(args: Args) -> int:
    return args.num_samplers * args.num_envs * args.num_steps


def threaded_config(args: Args, variant: str, seed: int) -> pa.Config:
    barrier = variant == "barrier"
    cpb = 1 if variant in ONE_CHUNK else args.num_samplers
    steps = args.num_steps * args.num_samplers if variant in ONE_CHUNK else args.num_steps
    return pa.config_for_env(args.env, {  # the env's preset (README) fills the fields not set here
        "mode": "threaded",
        "seed": seed,
        "total_env_steps": args.total_env_steps,
        "rollout.num_envs": args.num_envs,
        "rollout.num_steps": steps,
        "ppo.objective": "decoupled" if variant == "async_decoupled" else "ppo",
        "num_samplers": args.num_samplers,
        "threaded.barrier": barrier,
        "threaded.chunks_per_batch": cpb,
        "threaded.buffer_capacity": args.buffer_batches * cpb * args.num_envs * steps,  # transitions
        "threaded.sampler_step_latency_ms": args.latency_ms,
        "threaded.latency_jitter": args.latency_jitter,
    })


def simulated_config(args: Args, seed: int, replay_path: str | None, num_seeds: int = 1) -> pa.Config:
    lag = pa.LagConfig(schedule="replay", replay_path=replay_path) if replay_path else pa.LagConfig(schedule="fixed", K=0)
    return pa.config_for_env(args.env, {
        "mode": "simulated",
        "num_samplers": args.num_samplers,
        "seed": seed,
        "num_seeds": num_seeds,
        "total_env_steps": args.total_env_steps,
        "rollout.num_envs": args.num_envs,
        "rollout.num_steps": args.num_steps * args.num_samplers,
    }).replace(lag=lag)


def labels(args: Args) -> dict[str, str]:
    s, n, t = args.num_samplers, args.num_envs, args.num_steps
    return {
        "barrier": f"barrier {s}x({n}x{t})",
        "async": f"async 1x({n}x{s * t})",
        "async_decoupled": f"async 1x({n}x{s * t}), decoupled PPO",
        "simulated": "simulated replay of async",
        "async_cpb4": f"async {s}x({n}x{t})",
        "simulated_lag0": f"simulated lag 0, 1x({n}x{s * t})",
    }


# ---------------------------------------------------------------------------- evaluation


def evaluate_final(result: pa.TrainResult, num_episodes: int, seed: int) -> list[float]:
    """Per seed of `result`: mean deterministic return of the learner's final params over
    `num_episodes` fresh episodes (`pa.evaluate`). Unlike the `episode_return` of the rows (the
    behaviour policy of the consumed batch, up to `lag` versions old) this is the learner's policy."""
    return [
        float(pa.evaluate(result.policy(i), num_episodes, seed=seed + 10_000).get("returns").mean())
        for i in range(result.config.num_seeds)
    ]


# ---------------------------------------------------------------------------- summary


def median_or_none(values: list[float]) -> float | None:
    """Median with inf = never; None when the median itself is never."""
    if not values:
        return None
    m = float(np.median(values))
    return None if not math.isfinite(m) else m


def summarise(df: pd.DataFrame, args: Args, run_info: dict) -> list[dict]:
    out = []
    for variant in [v for v in VARIANTS if v in set(df.variant)]:
        rows = df[df.variant == variant]
        per_seed = []
        for seed, g in rows.groupby("seed", sort=True):
            g = g.sort_values("iteration")
            last = g.iloc[-1]
            entry = {
                "seed": int(seed),
                "final_return": float(analysis.final_returns(g, 0.1).iloc[0]),
                "eval_return": run_info.get((variant, int(seed)), {}).get("eval_return", math.nan),
                "env_steps": int(last.env_steps),
                "wall_time": float(last.wall_time),
                "consumer_env_steps_per_s": float(last.env_steps) / max(float(last.wall_time), 1e-9),
                "approx_kl_mean": float(pd.to_numeric(g.approx_kl).mean()),
                "lag_mean": float(pd.to_numeric(g.lag_mean).mean()),
                "lag_max": int(pd.to_numeric(g.lag_max).max()),
            }
            if variant in THREADED:
                entry["producer_env_steps_per_s"] = float(last.samples_produced) / max(float(last.wall_time), 1e-9)
            for thr in args.thresholds:
                steps, wall = analysis.first_reach(g, thr)
                entry[f"steps_to_{thr:g}"] = steps if math.isfinite(steps) else None
                entry[f"wall_to_{thr:g}"] = wall if math.isfinite(wall) else None
            entry.update({k: v for k, v in run_info.get((variant, int(seed)), {}).items() if k != "eval_return"})
            per_seed.append(entry)
        summary = {
            "variant": variant,
            "label": labels(args)[variant],
            "seeds": len(per_seed),
            "final_return_median": float(np.median([e["final_return"] for e in per_seed])),
            "final_return_min": float(np.min([e["final_return"] for e in per_seed])),
            "final_return_max": float(np.max([e["final_return"] for e in per_seed])),
            "eval_return_median": float(np.median([e["eval_return"] for e in per_seed])),
            "eval_return_min": float(np.min([e["eval_return"] for e in per_seed])),
            "eval_return_max": float(np.max([e["eval_return"] for e in per_seed])),
        }
        for thr in args.thresholds:
            steps = [e[f"steps_to_{thr:g}"] if e[f"steps_to_{thr:g}"] is not None else math.inf for e in per_seed]
            walls = [e[f"wall_to_{thr:g}"] if e[f"wall_to_{thr:g}"] is not None else math.inf for e in per_seed]
            summary[f"reached_{thr:g}"] = sum(math.isfinite(s) for s in steps)
            summary[f"steps_to_{thr:g}_median"] = median_or_none(steps)
            summary[f"wall_to_{thr:g}_median"] = median_or_none(walls)
        summary["consumer_env_steps_per_s_median"] = float(np.median([e["consumer_env_steps_per_s"] for e in per_seed]))
        producer = [e["producer_env_steps_per_s"] for e in per_seed if "producer_env_steps_per_s" in e]
        summary["producer_env_steps_per_s_median"] = float(np.median(producer)) if producer else None
        summary["approx_kl_mean"] = float(pd.to_numeric(rows.approx_kl).mean())
        summary["lag_mean"] = float(pd.to_numeric(rows.lag_mean).mean())
        summary["lag_max"] = int(pd.to_numeric(rows.lag_max).max())
        summary["run_seconds_median"] = float(np.median([e["wall_time"] for e in per_seed]))
        summary["wall_clock_comparable"] = variant in THREADED
        summary["per_seed"] = per_seed
        out.append(summary)
    return out


def _fmt_steps(x: float | None) -> str:
    return "-" if x is None else f"{x / 1000:.0f}k"


def _fmt_s(x: float | None, comparable: bool = True) -> str:
    if x is None:
        return "-"
    return f"{x:.1f}" if comparable else f"({x:.1f})"


def format_table(summary: list[dict], args: Args) -> str:
    thr = args.thresholds
    head = (
        ["variant", "seeds", "final return (min..max)", "eval return (min..max)"]
        + [f"steps to {t:g} (n)" for t in thr]
        + [f"wall s to {t:g}" for t in thr]
        + ["consumer steps/s", "approx_kl", "lag mean / max"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        ok = s["wall_clock_comparable"]
        cells = [
            s["label"],
            str(s["seeds"]),
            f"{s['final_return_median']:.0f} ({s['final_return_min']:.0f}..{s['final_return_max']:.0f})",
            f"{s['eval_return_median']:.0f} ({s['eval_return_min']:.0f}..{s['eval_return_max']:.0f})",
        ]
        cells += [f"{_fmt_steps(s[f'steps_to_{t:g}_median'])} ({s[f'reached_{t:g}']}/{s['seeds']})" for t in thr]
        cells += [_fmt_s(s[f"wall_to_{t:g}_median"], ok) for t in thr]
        sps = s["consumer_env_steps_per_s_median"]
        cells += [f"{sps:,.0f}" if ok else f"({sps:,.0f})", f"{s['approx_kl_mean']:.4f}", f"{s['lag_mean']:.2f} / {s['lag_max']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- plots


def plot_all(df: pd.DataFrame, schedules: dict[str, list[dict]], args: Args, out: str) -> list[str]:
    lab = labels(args)
    present = [v for v in VARIANTS if v in set(df.variant)]
    runs = {lab[v]: df[df.variant == v] for v in present}
    written = []

    def save(fig, name: str) -> None:
        path = os.path.join(out, name)
        fig.savefig(path, format="png", dpi=100)
        written.append(path)

    fig = plots.learning_curve(runs, x="env_steps")
    ax = fig.axes[0]
    for t in args.thresholds:
        ax.axhline(t, color="grey", linestyle="--", linewidth=0.8)
    ax.set_title(f"{args.env}: return vs env steps (median over seeds, 25-75% band)")
    save(fig, "return_vs_env_steps.png")

    wall_runs = {(k if v in THREADED else f"{k} [compute only]"): df[df.variant == v] for v, k in ((v, lab[v]) for v in present)}
    fig = plots.learning_curve(wall_runs, x="wall_time")
    ax = fig.axes[0]
    for t in args.thresholds:
        ax.axhline(t, color="grey", linestyle="--", linewidth=0.8)
    lat = ", ".join(f"{x:g}" for x in args.latency_ms)
    ax.set_title(f"{args.env}: return vs wall-clock (env latency {lat} ms/step; simulated has none)", fontsize=9)
    save(fig, "return_vs_wall_clock.png")

    kl_variants = [v for v in present if v != "simulated_lag0"]  # same order (and colours) as the return plots
    if kl_variants:
        fig = plots.learning_curve({lab[v]: df[df.variant == v] for v in kl_variants}, x="env_steps", y="approx_kl")
        ax = fig.axes[0]
        ax.axhline(plots.KL_WATCH, color="tab:orange", linestyle=":", linewidth=1.2)
        ax.axhline(plots.KL_HURTING, color="tab:red", linestyle=":", linewidth=1.2)
        ax.set_ylim(0, max(ax.get_ylim()[1], plots.KL_HURTING * 1.15))
        ax.set_ylabel("approx KL to behaviour policy")
        ax.set_title("KL to the behaviour policy: barrier vs async (guides 0.01 watch, 0.03 lag hurting)", fontsize=9)
        save(fig, "kl_over_time.png")

    for variant in ("async", "async_cpb4"):
        records = schedules.get(variant)
        if not records:
            continue
        # Exact lags of every consumed chunk (the learner's own histogram lumps lags >= 15).
        lags = np.asarray([r["lag"] for r in records], int)
        weights = np.asarray([r["transitions"] for r in records], float)
        seeds = np.asarray([r["seed"] for r in records])
        hist_rows = []
        for seed in sorted(set(seeds.tolist())):
            mine = seeds == seed
            counts = np.bincount(lags[mine], weights=weights[mine], minlength=lags.max() + 1)
            hist_rows.append({"seed": seed, "lag_histogram": counts.astype(int).tolist()})
        fig = plots.lag_histogram(pd.DataFrame(hist_rows))
        fig.axes[0].set_title(f"{lab[variant]}: {fig.axes[0].get_title()}, all seeds", fontsize=9)
        save(fig, f"lag_histogram_{variant}.png")

    for variant in ("async", "simulated"):
        if variant not in present:
            continue
        rows = df[df.variant == variant]
        fig = plots.kl_per_lag(rows)
        ax = fig.axes[0]
        note = ""
        if variant == "async" and int(pd.to_numeric(rows.lag_max).max()) >= len(plots.mean_kl_per_lag(rows)):
            note = f" (last bar: lag >= {len(plots.mean_kl_per_lag(rows)) - 1})"
        ax.set_title(f"{lab[variant]}: mean approx KL per lag bucket{note}", fontsize=9)
        save(fig, f"kl_per_lag_{variant}.png")
    return written


# ---------------------------------------------------------------------------- main


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main(args: Args) -> list[dict]:
    t_script = time.perf_counter()
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if "simulated" in args.variants and "async" not in args.variants:
        raise SystemExit("variant 'simulated' replays the 'async' runs: add 'async' to --variants")
    if len(args.latency_ms) != args.num_samplers:
        raise SystemExit(f"--latency-ms needs {args.num_samplers} values (one per sampler), got {args.latency_ms}")
    if args.quick:
        args = dataclasses.replace(args, num_seeds=min(args.num_seeds, 2), total_env_steps=3 * batch_size(args))
    out = args.out or default_out(os.path.join("sync_vs_async", "quick") if args.quick else "sync_vs_async", REPO)
    with Manifest(out):
        return run(args, out, t_script)


def run(args: Args, out: str, t_script: float) -> list[dict]:
    """Every variant and seed; writes the summaries, curves, schedules and PNGs into `out`."""
    os.makedirs(os.path.join(out, "schedules"), exist_ok=True)
    if args.compile_cache:
        enable_compilation_cache(args.compile_cache)
    load_start = uptime()
    print(f"start: {load_start}", flush=True)

    seeds = list(range(args.seed, args.seed + args.num_seeds))
    frames: list[pd.DataFrame] = []
    schedules: dict[str, list[dict]] = {}
    run_info: dict = {}
    configs: dict[str, dict] = {}

    def record(variant: str, seed: int, result: pa.TrainResult) -> None:
        t0 = time.perf_counter()
        eval_return = evaluate_final(result, args.eval_episodes, seed)[0]
        eval_seconds = time.perf_counter() - t0
        df = result.to_dataframe()
        df["variant"] = variant
        frames.append(df)
        run_info[(variant, seed)] = {
            "compile_seconds": round(result.compile_seconds, 2),
            "run_seconds": round(result.run_seconds, 2),
            "load_1min_after": round(os.getloadavg()[0], 2),
            "eval_return": eval_return,
            "eval_seconds": round(eval_seconds, 2),
        }
        configs.setdefault(variant, pa.config_to_dict(result.config))
        last = df.iloc[-1]
        print(
            f"  {variant:<15} seed {seed}: final return {analysis.final_returns(df, 0.1).iloc[0]:7.1f}, eval {eval_return:7.1f} | {int(last.env_steps):,} steps in "
            f"{result.run_seconds:5.1f}s (+{result.compile_seconds:.1f}s compile) | lag mean {pd.to_numeric(df.lag_mean).mean():.2f}"
            f" max {int(pd.to_numeric(df.lag_max).max())} | kl {pd.to_numeric(df.approx_kl).mean():.4f} | load {os.getloadavg()[0]:.2f}",
            flush=True,
        )

    for seed in seeds:
        for variant in ("barrier", "async", "simulated", "async_cpb4", "simulated_lag0", "async_decoupled"):
            if variant not in args.variants:
                continue
            if variant in THREADED:
                result = pa.train(threaded_config(args, variant, seed))
                chunk = result.config.chunk_size  # transitions per record (one chunk)
                records = [dict(r, seed=seed, transitions=chunk) for r in result.extras["version_schedule"]]
                schedules.setdefault(variant, []).extend(records)
                if variant == "async":
                    pa.write_schedule(os.path.join(out, "schedules", f"async_seed{seed}.jsonl"), result.extras["version_schedule"])
            elif variant == "simulated":
                replay = os.path.join(out, "schedules", f"async_seed{seed}.jsonl")
                result = pa.train(simulated_config(args, seed, replay))
            else:  # one seed per run like the others (vmapped seeds would share one wall-clock)
                result = pa.train(simulated_config(args, seed, None))
            record(variant, seed, result)
    df = pd.concat(frames, ignore_index=True)
    summary = summarise(df, args, run_info)
    pngs = plot_all(df, schedules, args, out)
    df[[c for c in CURVE_COLUMNS if c in df.columns]].to_csv(os.path.join(out, "curves.csv"), index=False)
    flat = [{k: v for k, v in s.items() if k != "per_seed"} for s in summary]
    pd.DataFrame(flat).to_csv(os.path.join(out, "summary.csv"), index=False)
    load_end = uptime()
    script_seconds = time.perf_counter() - t_script
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0], os.path.dirname(HERE))] + sys.argv[1:])
    meta = {
        "command": command,
        "args": dataclasses.asdict(args),
        "batch_transitions": batch_size(args),
        "env_steps_per_seed": (args.total_env_steps // batch_size(args)) * batch_size(args),
        "uptime_start": load_start,
        "uptime_end": load_end,
        "script_seconds": round(script_seconds, 1),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "jax": jax.__version__,
        "jax_devices": [str(d) for d in jax.devices()],
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump({"meta": meta, "variants": summary, "configs": configs}, f, indent=2, default=str)

    table = format_table(summary, args)
    header = [
        f"# sync vs async PPO on {args.env}: {args.num_seeds} seeds x {meta['env_steps_per_seed']:,} env steps",
        f"# command: {command}",
        f"# load at start: {load_start}",
        f"# load at end:   {load_end}",
        f"# {os.cpu_count()} CPUs, jax {jax.__version__}, script wall time {script_seconds:.0f}s",
        f"# {args.num_samplers} samplers x {args.num_envs} envs, env-step latency {tuple(args.latency_ms)} ms, "
        f"{batch_size(args)} transitions per update for every variant",
        "# median over seeds; final return = mean episode return over the last 10% of iterations (episodes of the",
        "#   consumed batches: the behaviour policy, up to lag versions old); eval return = the final learner params,",
        f"#   deterministic, {args.eval_episodes} fresh episodes; steps/wall to R: first iteration",
        "#   reaching R, (n) = seeds that reached it, '-' = median seed never did; wall-clock excludes compile;",
        "#   (parenthesised) wall-clock figures are simulated runs: compute only, no env latency, not comparable.",
        "",
    ]
    print()
    write_summary(out, ["\n".join(header) + table])
    print(f"wrote {out} ({len(pngs)} PNGs) in {script_seconds:.0f}s")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
    sys.exit(0)
