"""Benchmark: a grid of configs x seeds run as separate processes vs `sweep(loop)` vs `sweep(vmap)`.

    python experiments/bench_sweep.py                 # 8 configs x 4 seeds x 100k steps, Pendulum-v1
    python experiments/bench_sweep.py --skip-processes   # only (b), (c) and the single run

All measured side by side in one run of this script:
  (a) one `python -m ppo_async train` process per config and seed, as a shell loop or a
      Hydra multirun would do it: each pays interpreter start-up, imports and compile;
  (b) `ppo_async.study.sweep(strategy="loop")`: one compile, one seed-vmapped call per config;
  (c) `ppo_async.study.sweep(strategy="vmap")`: one compile, all configs x seeds in one program;
  (s) one config, one seed, in-process (for "vmap costs at most k x a single run").
Writes OUT/<backend>.json, OUT/<backend>.txt and OUT/manifest.json; OUT defaults to
runs/experiments/bench_sweep (git-ignored): publish with --out experiments/results/bench_sweep.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import tyro

import ppo_async as pa
from ppo_async.study.manifest import Manifest, default_out

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@dataclasses.dataclass
class Args:
    env: str = "Pendulum-v1"
    total_env_steps: int = 100_000
    """Env steps per config and seed."""
    lags: tuple[int, ...] = (0, 2, 4, 8)
    dual_clips: tuple[float, ...] = (0.0, 3.0)
    """0 means None (plain PPO)."""
    num_seeds: int = 4
    skip_processes: bool = False
    """Skip (a), the slow baseline."""
    out: str | None = None
    """Output folder (default runs/experiments/bench_sweep, git-ignored)."""


def cli_args(env: str, steps: int, lag: int, dual_clip: float | None, seed: int, run_dir: str) -> list[str]:
    args = ["-m", "ppo_async", "train", "--env", env, "--mode", "simulated", "--lag.K", str(lag),
            "--seed", str(seed), "--total-env-steps", str(steps), "--run-dir", run_dir, "--quiet"]
    args += ["--ppo.dual-clip", "None" if dual_clip is None else str(dual_clip)]
    return args


def main(args: Args) -> dict:
    out = args.out or default_out("bench_sweep", REPO)
    with Manifest(out):
        return measure(args, out)


def measure(args: Args, out: str) -> dict:
    """(s), (b), (c) and (a); writes the report files into `out` and returns the results."""
    grid = {"lag.K": list(args.lags), "ppo.dual_clip": [None if c == 0 else c for c in args.dual_clips]}
    num_configs = len(args.lags) * len(args.dual_clips)
    base = pa.Config(env=args.env, mode="simulated", total_env_steps=args.total_env_steps)
    results: dict = {
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "env": args.env,
        "configs": num_configs,
        "seeds": args.num_seeds,
        "env_steps_per_run": base.num_iterations * base.batch_size,
    }

    # (s) a single run, in-process (compile + run)
    t0 = time.perf_counter()
    single = pa.train(base)
    results["single"] = {
        "wall": time.perf_counter() - t0,
        "compile": single.compile_seconds,
        "run": single.run_seconds,
    }

    # (b) sweep(loop) and (c) sweep(vmap)
    for strategy in ("loop", "vmap"):
        t0 = time.perf_counter()
        df = pa.sweep(base, grid, seeds=args.num_seeds, strategy=strategy)
        results[strategy] = {
            "wall": time.perf_counter() - t0,
            "compile": df.attrs["compile_seconds"],
            "run": df.attrs["run_seconds"],
            "compiles": df.attrs["compiles"],
        }

    # (a) one process per config and seed
    if not args.skip_processes:
        t0 = time.perf_counter()
        compile_total = run_total = 0.0
        with tempfile.TemporaryDirectory() as tmp:
            for lag in grid["lag.K"]:
                for dual_clip in grid["ppo.dual_clip"]:
                    for seed in range(args.num_seeds):
                        run_dir = os.path.join(tmp, f"k{lag}-c{dual_clip}-s{seed}")
                        proc = subprocess.run(
                            [sys.executable, *cli_args(args.env, args.total_env_steps, lag, dual_clip, seed, run_dir)],
                            cwd=REPO, capture_output=True, text=True,
                        )
                        if proc.returncode != 0:
                            raise RuntimeError(f"process baseline failed: {proc.stderr[-2000:]}")
                        rows = pa.read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
                        run_total += rows[-1]["wall_time"]
        wall = time.perf_counter() - t0
        results["processes"] = {"wall": wall, "run": run_total, "startup_and_compile": wall - run_total, "compiles": num_configs * args.num_seeds}

    lines = [
        f"bench_sweep: {args.env}, {num_configs} configs x {args.num_seeds} seeds x {results['env_steps_per_run']:,} env steps, "
        f"backend={results['backend']} ({results['device']})",
        f"{'strategy':<34}{'wall s':>9}{'compile s':>11}{'run s':>9}{'compiles':>10}{'vs (a)':>9}",
    ]
    ref = results.get("processes", {}).get("wall")

    def line(name: str, r: dict, compiles: int | str) -> str:
        ratio = f"{r['wall'] / ref:.3f}x" if ref else "-"
        comp = r.get("compile", r.get("startup_and_compile", 0.0))
        return f"{name:<34}{r['wall']:>9.1f}{comp:>11.1f}{r['run']:>9.1f}{compiles!s:>10}{ratio:>9}"

    if "processes" in results:
        lines.append(line("(a) one process per config x seed", results["processes"], results["processes"]["compiles"]))
    lines.append(line("(b) sweep(strategy='loop')", results["loop"], results["loop"]["compiles"]))
    lines.append(line("(c) sweep(strategy='vmap')", results["vmap"], results["vmap"]["compiles"]))
    lines.append(line("(s) single config, single seed", results["single"], 1))
    best = min(results["loop"]["wall"], results["vmap"]["wall"])
    if ref:
        lines.append(f"best of (b), (c) vs (a): {best / ref:.3f}x (target <= 0.5x)")
    lines.append(
        f"(c) vs (s) wall: {results['vmap']['wall'] / results['single']['wall']:.2f}x; run only: "
        f"{results['vmap']['run'] / results['single']['run']:.2f}x for {num_configs * args.num_seeds} runs "
        "(accelerator target <= 4x)"
    )
    text = "\n".join(lines)
    print(text)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{results['backend']}.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(out, f"{results['backend']}.txt"), "w") as f:
        f.write(text + "\n")
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
