"""Resident memory of long runs: flat in run length? (issue: runs of any length)

    python experiments/bench_memory.py                  # sync and threaded, log_every 1 (10k iterations) and 10 (30k)
    python experiments/bench_memory.py --iterations 2000 --long-iterations 2000 --out /tmp/bench_memory
    python experiments/bench_memory.py --cache user     # the user's compilation cache (figures then depend on what ran before)
    python experiments/bench_memory.py --issue-run --modes --out runs/experiments/bench_memory   # only the issue's long run

Each run is its own process (a fresh interpreter, so runs do not share allocations): tiny
batches (Pendulum-v1, 4 envs x 8 steps, one SGD step per iteration, 16-unit networks) so that
10,000 learner iterations take about a minute, with a run directory (metrics.jsonl,
TensorBoard, a final checkpoint and plots, the version schedule). A sampling thread reads the
process's resident set size (/proc/self/statm) every 0.1 s together with the learner iteration
reached. Reported per run: the slope of RSS over learner iterations (a least-squares line
fitted after the first 20% of iterations: KB per 1,000 iterations), the running level (median
RSS over the last 10% of the iterations), the end peak over that level (the samples from the
last iteration on: its final checkpoint, then the plots and the result; `len(result.metrics)`
counts the file's rows without loading them; the JSON rows also split it at `train()`'s
return) and, for information only, the startup peak over that level (the samples before the
first iteration: XLA compiling the programs).

The end peak is taken over the end only. It used to be the maximum of the whole trajectory,
which is the startup peak whenever a program is compiled rather than read from JAX's persistent
compilation cache: then 140-280 MB over the level, the "end peak" misses of the earlier
figures (measured: the same runs with a warm cache peak at startup 20-40 MB over the level).
`num_iterations` is baked into the programs (learning-rate annealing), so each iteration count
compiles once per machine and a run's figures depended on what had run before. By default
(`--cache fresh`) every child therefore gets its own empty compilation cache: every run
compiles, as a first run does (the running level is then 25-55 MB higher than with a warm
cache: the compiler's freed memory stays with the allocator). Targets: slope < 50 KB per
1,000 iterations and end peak within 50 MB of the running level, in both modes.

`--issue-run` adds the run of issue 25 (item 4): threaded, the default batch (16 envs x 64
steps = 1,024 env steps per iteration, 5 epochs x 16 minibatches, 2x64 networks), 4 samplers,
`--issue-env-steps` 30,000,000 env steps = 29,296 iterations, log_every 1, ending as
`python -m ppo_async train` does: `result.final_returns()` reads the rows back. (`--modes`
with no value then runs it alone.)
Writes OUT/bench_memory.json and OUT/manifest.json and prints the table quoted in README. OUT defaults to
runs/experiments/bench_memory (git-ignored): publish with --out experiments/results/bench_memory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import tyro

from ppo_async.study.manifest import Manifest, default_out

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)

CHILD = r"""
import json, os, sys, threading, time
from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache
apply_cpu_workarounds(); enable_compilation_cache()
import ppo_async as pa

mode, iterations, log_every, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
shape = sys.argv[5] if len(sys.argv) > 5 else "tiny"  # "issue": the default batch, 4 samplers, final_returns at the end
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
reached, samples, done = [0], [], threading.Event()
def sample():
    while not done.is_set():
        samples.append((time.perf_counter(), reached[0], rss()))
        time.sleep(0.1)
if shape == "issue":
    config = pa.Config(env="Pendulum-v1", mode=mode, total_env_steps=iterations * 1024, log_every=log_every, run_dir=run_dir,
                       num_samplers=4)
else:
    config = pa.Config(env="Pendulum-v1", mode=mode, total_env_steps=iterations * 32, log_every=log_every, run_dir=run_dir,
                       rollout=pa.RolloutConfig(num_envs=4, num_steps=8), ppo=pa.PPOConfig(num_epochs=1, num_minibatches=1),
                       network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
                       **({"num_samplers": 2} if mode == "threaded" else {}))
assert config.num_iterations == iterations, (config.num_iterations, iterations)
def on_iteration(rows):
    reached[0] = rows[0]["iteration"]
sampler = threading.Thread(target=sample, daemon=True); sampler.start()
t0 = time.perf_counter()
result = pa.train(config, on_iteration=on_iteration)
run_end = time.perf_counter()
rows = len(result.metrics)
if shape == "issue":
    result.final_returns()  # what `python -m ppo_async train` prints at the end
time.sleep(0.3)
done.set(); sampler.join()
print("RESULT " + json.dumps({"samples": samples, "run_end": run_end, "seconds": run_end - t0, "rows": rows,
                              "metrics_bytes": os.path.getsize(os.path.join(run_dir, "metrics.jsonl"))}))
"""


@dataclasses.dataclass
class Args:
    iterations: int = 10_000
    """Learner iterations of the log_every = 1 runs (>= 10,000 for the issue's figures)."""
    long_iterations: int = 30_000
    """Learner iterations of the log_every > 1 runs: they grow by a fraction of a MB in 10,000
    iterations, so a fit over 10,000 is ruled by single allocator steps (measured: sync 50.5 KB
    per 1,000 at 10,000 iterations, 7.5 at 30,000)."""
    cache: str = "fresh"
    """"fresh": each child compiles into its own empty JAX compilation cache (reproducible: every
    run compiles); "user": the default cache (`ppo_async.runtime.xla_flags.compilation_cache_dir`)."""
    modes: tuple[str, ...] = ("sync", "threaded")
    log_every: tuple[int, ...] = (1, 10)
    out: str | None = None
    """Output folder (default runs/experiments/bench_memory, git-ignored)."""
    issue_run: bool = False
    """Also run issue 25's long threaded run (see the module docstring): the default batch,
    4 samplers, `issue_env_steps` env steps, log_every 1, `final_returns()` at the end."""
    issue_env_steps: int = 30_000_000
    """Env steps of the issue run (1,024 per iteration: 30M = 29,296 iterations)."""


def analyse(raw: dict, iterations: int) -> dict:
    """Slope (KB / 1000 iterations) after warm-up, running level, end peak and startup peak (MB).

    Samples are split by the learner iteration reached when taken: startup (none yet: the
    compilation), running (up to the one before the last) and end (the last iteration's record
    with its final checkpoint, then the result and the plots). Both peaks are over the running
    level (the median of the last 10% of the running samples)."""
    t, it, rss = (np.asarray(v, dtype=np.float64) for v in zip(*raw["samples"]))
    startup, end = it < 1, it >= iterations - 1
    running = ~startup & ~end
    fit = running & (it >= 0.2 * iterations)
    slope = np.polyfit(it[fit], rss[fit], 1)[0] * 1000 / 1024 if fit.sum() >= 3 else float("nan")
    tail = running & (it >= 0.9 * iterations)
    level = float(np.median(rss[tail])) if tail.any() else float(rss[running][-1])

    def over(mask: np.ndarray) -> float | None:
        return round((float(rss[mask].max()) - level) / 2**20, 1) if mask.any() else None

    return {
        "slope_kb_per_1000_iterations": round(float(slope), 1),
        "running_level_mb": round(level / 2**20, 1),
        "end_peak_over_level_mb": over(end),
        # the end split at `train()`'s return: the final checkpoint and the plots, then reading the rows back
        "end_peak_in_train_mb": over(end & (t <= raw["run_end"])),
        "end_peak_after_train_mb": over(end & (t > raw["run_end"])),
        "startup_peak_over_level_mb": over(startup),
        "start_mb": round(float(rss[fit][0]) / 2**20, 1) if fit.any() else None,
        "seconds": round(raw["seconds"], 1),
        "rows": raw["rows"],
        "metrics_jsonl_mb": round(raw["metrics_bytes"] / 2**20, 2),
    }


def child_env(cache: str, tmp: str) -> dict[str, str]:
    """The child's environment: with `cache` "fresh" its own empty compilation cache under `tmp`."""
    env = dict(os.environ)
    if cache == "fresh":
        env["PPO_ASYNC_COMPILATION_CACHE"] = os.path.join(tmp, "jax_cache")
    elif cache != "user":
        raise SystemExit(f"--cache {cache!r}: expected 'fresh' or 'user'")
    return env


def run_child(mode: str, iterations: int, log_every: int, cache: str, shape: str = "tiny") -> dict:
    """One run in its own process (`CHILD`, a temporary run directory): its `analyse` row.
    `shape` "tiny" is the batch of the module docstring, "issue" the issue run's."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(iterations), str(log_every), os.path.join(tmp, "run"), shape],
                              cwd=REPO_ROOT, capture_output=True, text=True, env=child_env(cache, tmp))
    if proc.returncode != 0:
        raise SystemExit(f"{mode} log_every={log_every} ({shape}) failed:\n{proc.stderr[-3000:]}")
    raw = json.loads([line for line in proc.stdout.splitlines() if line.startswith("RESULT ")][-1][7:])
    return {"mode": mode, "log_every": log_every, "iterations": iterations, "cache": cache, **analyse(raw, iterations)}


def runs_to_do(args: Args) -> list[tuple[str, int, int, str]]:
    """(mode, iterations, log_every, shape) of every run asked for, in order."""
    todo = [(mode, args.iterations if log_every == 1 else args.long_iterations, log_every, "tiny")
            for mode in args.modes for log_every in args.log_every]
    if args.issue_run:
        todo.append(("threaded", args.issue_env_steps // 1024, 1, "issue"))
    return todo


def main(args: Args) -> list[dict]:
    out = args.out or default_out("bench_memory", REPO_ROOT)
    os.makedirs(out, exist_ok=True)
    manifest = Manifest(out)
    manifest.start()
    results = []
    for mode, iterations, log_every, shape in runs_to_do(args):
        row = run_child(mode, iterations, log_every, args.cache, shape)
        if shape != "tiny":
            row["shape"] = shape
        results.append(row)
        print(json.dumps(row), flush=True)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "bench_memory.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(f"\n| mode | log_every | iterations | slope (KB / 1000 it.) | running level (MB) | end peak over level (MB) | "
          f"startup peak over level (MB) | metrics.jsonl (MB) | run s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['mode']}{' (' + r['shape'] + ')' if 'shape' in r else ''} | {r['log_every']} | {r['iterations']:,} | {r['slope_kb_per_1000_iterations']} | "
              f"{r['running_level_mb']} | {r['end_peak_over_level_mb']} | {r['startup_peak_over_level_mb']} | "
              f"{r['metrics_jsonl_mb']} | {r['seconds']} |")
    met = all(r["slope_kb_per_1000_iterations"] < 50 and r["end_peak_over_level_mb"] <= 50 for r in results)
    print(f"\ntargets (slope < 50 KB per 1000 iterations, end peak within 50 MB): {'met' if met else 'MISSED'}")
    manifest.finish()
    print(f"wrote {out}")
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
