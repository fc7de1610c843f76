"""Benchmark: threaded-mode overheads and the straggler speed-up, each measured against its pure baseline.

    python experiments/bench_threaded.py            # full run, about 3-4 min on a 2-core CPU
    python experiments/bench_threaded.py --quick    # smoke run, tiny budgets (under 1 min, mostly compiles)
    python experiments/bench_threaded.py --repeats 3 --rollouts 16x64

All measured side by side in one run of this script (Pendulum-v1, default PPO settings):
  (a) sampler overhead: one `threaded.sampler_loop` thread (rollout, ring-buffer write under a
      lock, param-store polls; an "overwrite_oldest" buffer so it never blocks; no learner)
      vs the same jitted rollout called in a loop on the main thread (key split and
      `block_until_ready` each call, as the sampler does). Env steps/s; target >= 0.9x.
  (b) learner overhead: `threaded.learner_loop` on its own thread, draining a ring buffer
      pre-filled with exactly the chunks it will consume (outputs drained from a queue on the
      main thread, as `train` does), vs the same jitted update called in a loop on one batch
      with `jax.device_get(metrics)` each iteration. Iterations/s, first iteration excluded
      on both sides. No target; reported for scale.
  (c) straggler: `ppo_async.modes.train` with 4 samplers whose simulated env step takes L, L, L and
      4L ms, async (chunks_per_batch = 4) vs barrier (one rollout from every sampler per
      version, so also 4 chunks per batch: the learner does the same work per env step).
      Consumer-side env steps/s = final env_steps / final wall_time; target >= 2x. Also the
      mean approx_kl and the lag (mean of the per-batch means, max of the maxima) of each.

Expected (c) ratio, from first principles. A chunk of T env steps takes a sampler
t_i = r + L_i * T (r: rollout compute, L_i * T: simulated latency, slept outside the GIL).
Barrier: every version waits for the slowest sampler, then for the update (U), and only then
do the samplers start on the next version, so an iteration takes t_slow + U for 4 chunks:
    barrier chunks/s = 4 / (t_slow + U).
Async: the samplers never wait (the learner keeps up), so the streams add up:
    async chunks/s = min(3 / t_fast + 1 / t_slow, 4 / U).
With L * T >> r, U: async (3 + 1/4) / (L T) vs barrier 4 / (4 L T) chunks/s, a ratio of 3.25.
The script prints the expected ratio from the measured r (row (a), 16x64) and U (row (b),
16x64 x 4 chunks), and the measured one over the whole run (the target) and over its second
half (steady state, past the start-up).

Repeats interleave the two sides (alternating which goes first); the table shows medians,
the ratio of the medians (judged against the targets) and the median of the per-repeat
ratios. Writes OUT/<backend>.json and .txt (header: machine, CPU time taken by other processes
during the run; --quick writes <backend>-quick.*) and OUT/manifest.json. OUT defaults to
runs/experiments/bench_threaded (git-ignored): publish with --out experiments/results/bench_threaded.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)

import dataclasses
import os
import queue
import statistics
import threading
import time
from typing import Any, Callable

import jax
import tyro

import ppo_async as pa
from ppo_async.study.benchmarking import (
    MachineLoad,
    describe_other_cpu,
    fmt_rate,
    interleave,
    verdict,
    write_report,
)
from ppo_async.runtime.buffer import ChunkTag, RingBuffer
from ppo_async.study.manifest import Manifest, default_out
from ppo_async.modes.threaded import (
    POLL_S,
    RunShared,
    SamplerStats,
    ThreadedSetup,
    learner_loop,
    make_threaded_setup,
    sampler_loop,
)
from ppo_async.core.types import snapshot_of

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SAMPLER_TARGET = 0.9
STRAGGLER_TARGET = 2.0


@dataclasses.dataclass
class Args:
    repeats: int = 5
    """Measurements per side; the table reports medians."""
    rollouts: tuple[str, ...] = ("16x64", "64x128")
    """(a): rollout shapes NUM_ENVSxNUM_STEPS; the first (the default Config()) is also (c)'s."""
    sampler_seconds: float = 2.0
    """(a): wall time of one measurement."""
    learner_batches: tuple[str, ...] = ("16x64x1", "16x64x4", "64x128x1")
    """(b): learner batches NUM_ENVSxNUM_STEPSxCHUNKS_PER_BATCH; (c)'s expected ratio uses FIRST_ROLLOUTx4."""
    learner_seconds: float = 1.5
    """(b): approximate wall time of one measurement (sets the number of pre-filled iterations)."""
    step_latency_ms: float = 2.0
    """(c): simulated env-step latency L of the three fast samplers."""
    slow_factor: float = 4.0
    """(c): the fourth sampler's latency is slow_factor * L."""
    straggler_iterations: int = 12
    """(c): learner iterations of each train() run (4 chunks of the first rollout shape each)."""
    quick: bool = False
    """Smoke run: 2 repeats, tiny budgets, one rollout shape, one learner batch (writes <backend>-quick.*)."""
    out: str | None = None
    """Output folder (default runs/experiments/bench_threaded, git-ignored)."""


QUICK = dict(
    repeats=2, rollouts=("16x64",), learner_batches=("16x64x4",), sampler_seconds=0.3, learner_seconds=0.3,
    straggler_iterations=3, step_latency_ms=0.5,
)


# ----------------------------------------------------------------------------------------
# Shared set-up (the library's make_threaded_setup, what train_threaded builds before its threads start)
# ----------------------------------------------------------------------------------------


def parse_shape(shape: str) -> tuple[int, ...]:
    """"16x64" -> (16, 64); "16x64x4" -> (16, 64, 4)."""
    return tuple(int(x) for x in shape.lower().split("x"))


def make_setup(num_envs: int, num_steps: int, chunks_per_batch: int = 1, seed: int = 0) -> ThreadedSetup:
    """One config's compiled pieces and initial state (the library's threaded set-up), shared by (a) and (b)."""
    config = pa.Config(
        mode="threaded",
        seed=seed,
        rollout=pa.RolloutConfig(num_envs=num_envs, num_steps=num_steps),
        num_samplers=1,
        threaded=pa.ThreadedConfig(chunks_per_batch=chunks_per_batch),
    )
    return make_threaded_setup(config)  # compiles the rollout, merge and update


def bench_shared(setup: ThreadedSetup, buffer: RingBuffer, num_samplers: int, total_iterations: int = 1) -> RunShared:
    """`setup.shared(buffer)` with `num_samplers` sampler stats and a run of `total_iterations` learner iterations."""
    config = setup.config.replace(total_env_steps=total_iterations * setup.config.batch_size)
    stats = [SamplerStats() for _ in range(num_samplers)]
    return dataclasses.replace(setup.shared(buffer), config=config, stats=stats)


def run_thread(shared: RunShared, target: Callable, args: tuple, name: str) -> threading.Thread:
    thread = threading.Thread(target=target, args=(shared, *args), name=f"bench-{name}", daemon=True)
    shared.start = time.perf_counter()
    thread.start()
    return thread


def finish(shared: RunShared, thread: threading.Thread) -> None:
    """Stop and join a bench thread; re-raise what it raised."""
    shared.stop.set()
    thread.join(timeout=30.0)
    if shared.errors:
        name, exc, tb = shared.errors[0]  # a ThreadError (thread, exc, traceback)
        raise RuntimeError(f"{name} failed: {exc!r}\n{tb}") from exc
    if thread.is_alive():
        raise RuntimeError(f"{thread.name} did not stop")


# ----------------------------------------------------------------------------------------
# (a) sampler thread vs pure rollout
# ----------------------------------------------------------------------------------------


def pure_rollout(setup: ThreadedSetup, seconds: float) -> float:
    """Env steps/s of the jitted rollout in a main-thread loop (split + block each call)."""
    snapshot = jax.device_put(snapshot_of(setup.train_state), setup.placement.sampler_devices[0])
    env_state, key = setup.env_states[0], setup.sampler_keys[0]
    chunks, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        key, rollout_key = jax.random.split(key)
        env_state, trajectory = setup.rollout_fn(snapshot, env_state, rollout_key)
        jax.block_until_ready(trajectory.transitions.reward)
        chunks += 1
    return chunks * setup.config.chunk_size / elapsed


def threaded_sampler(setup: ThreadedSetup, seconds: float, buffer: RingBuffer) -> float:
    """Env steps/s of one `sampler_loop` thread, no learner, over `seconds` of wall time.

    A rollout still in flight when the window closes is not counted (at most one chunk).
    """
    shared = bench_shared(setup, buffer, num_samplers=1)
    args = (0, setup.rollout_fn, setup.env_states[0], setup.sampler_keys[0], setup.placement.sampler_devices[0])
    thread = run_thread(shared, sampler_loop, args, "sampler")
    time.sleep(seconds)
    produced, elapsed = shared.stats[0].produced, time.perf_counter() - shared.start
    finish(shared, thread)
    return produced / elapsed


# ----------------------------------------------------------------------------------------
# (b) learner thread vs pure update
# ----------------------------------------------------------------------------------------


def pure_update(setup: ThreadedSetup, iterations: int) -> float:
    """Iterations/s of the jitted update on one batch, `device_get(metrics)` each call (first excluded)."""
    batch, state, key = setup.batch(), setup.train_state, setup.learner_key
    t0 = 0.0
    for i in range(iterations):
        if i == 1:
            t0 = time.perf_counter()
        key, update_key = jax.random.split(key)
        state, metrics = setup.update(state, batch, update_key, setup.hparams)
        jax.device_get(metrics)
    return (iterations - 1) / (time.perf_counter() - t0)


def threaded_learner(setup: ThreadedSetup, iterations: int) -> float:
    """Iterations/s of one `learner_loop` thread on a pre-filled buffer (first iteration excluded)."""
    num_chunks = iterations * setup.config.effective_chunks_per_batch
    buffer = RingBuffer(setup.example, num_chunks, "block", device=setup.placement.buffer_device)
    buffer.warm_up(setup.example)  # as train_threaded does, before its clock starts
    for _ in range(num_chunks):
        buffer.put(setup.example, timeout=None, tag=ChunkTag(0, 0.0, 0))  # as a sampler tags its chunks
    shared = bench_shared(setup, buffer, num_samplers=0, total_iterations=iterations)
    outputs: queue.Queue = queue.Queue()
    state, key = setup.train_state, setup.learner_key
    args = (setup.update, setup.merge, setup.place_trajectory, state, key, setup.hparams, outputs)
    thread = run_thread(shared, learner_loop, args, "learner")
    rows = []
    while thread.is_alive() or not outputs.empty():  # drain as train_threaded's logging thread does
        try:
            rows.append(outputs.get(timeout=POLL_S).row)
        except queue.Empty:
            continue
    finish(shared, thread)
    if len(rows) != iterations:
        raise RuntimeError(f"learner_loop ran {len(rows)} iterations, expected {iterations}")
    return (iterations - 1) / (rows[-1]["wall_time"] - rows[0]["wall_time"])


# ----------------------------------------------------------------------------------------
# (c) 4 samplers, one slow: async vs barrier
# ----------------------------------------------------------------------------------------


def straggler_config(args: Args, num_envs: int, num_steps: int, barrier: bool) -> pa.Config:
    latency = args.step_latency_ms
    return pa.Config(
        mode="threaded",
        total_env_steps=args.straggler_iterations * 4 * num_envs * num_steps,
        rollout=pa.RolloutConfig(num_envs=num_envs, num_steps=num_steps),
        num_samplers=4,
        threaded=pa.ThreadedConfig(
            sampler_step_latency_ms=(latency, latency, latency, args.slow_factor * latency),
            chunks_per_batch=4,
            barrier=barrier,
        ),
    )


def straggler_run(config: pa.Config) -> dict[str, float]:
    """One train() run: consumer-side env steps/s (whole run; second half: past the start-up backlog), KL, lag."""
    rows = pa.train(config).metrics
    first, mid, last = rows[0], rows[len(rows) // 2 - 1], rows[-1]
    return {
        "env_steps_per_s": last["env_steps"] / last["wall_time"],
        "steady_env_steps_per_s": (last["env_steps"] - mid["env_steps"]) / (last["wall_time"] - mid["wall_time"]),
        "first_batch_s": first["wall_time"],
        "approx_kl": statistics.fmean(r["approx_kl"] for r in rows),
        "lag_mean": statistics.fmean(r["lag_mean"] for r in rows),
        "lag_max": max(r["lag_max"] for r in rows),
        "learner_busy": statistics.fmean(r["learner_busy_fraction"] for r in rows),
    }


def summarise_runs(runs: list[dict[str, float]]) -> dict[str, float]:
    """Median of each measured quantity over the repeats (lag_max: the max)."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "lag_max"}
    out["lag_max"] = max(r["lag_max"] for r in runs)
    return out | {"runs": runs}


def expected_straggler_ratio(args: Args, num_steps: int, rollout_s: float, update_s: float) -> float:
    """async / barrier chunks per second from the model in the module docstring."""
    fast = rollout_s + args.step_latency_ms * num_steps / 1000.0
    slow = rollout_s + args.slow_factor * args.step_latency_ms * num_steps / 1000.0
    async_rate = min(3.0 / fast + 1.0 / slow, 4.0 / update_s)
    barrier_rate = 4.0 / (slow + update_s)
    return async_rate / barrier_rate


# ----------------------------------------------------------------------------------------
# Repeats, table, files
# ----------------------------------------------------------------------------------------


def compare(repeats: int, pure: Callable[[], float], threaded: Callable[[], float]) -> dict[str, Any]:
    """Interleaved repeats (alternating which side goes first); medians, their ratio, the median paired ratio."""
    samples: dict[str, list[float]] = interleave(repeats, [("pure", pure), ("threaded", threaded)])
    med = {name: statistics.median(values) for name, values in samples.items()}
    paired = statistics.median(t / p for t, p in zip(samples["threaded"], samples["pure"]))
    return {"samples": samples, **med, "ratio": med["threaded"] / med["pure"], "paired_ratio": paired}


def report(results: dict) -> str:
    m = results["machine"]
    lines = [
        f"bench_threaded: {results['env']}, backend={results['backend']} ({results['device']}, "
        f"{results['device_count']} device(s)), "
        f"{m['cpu_count']} CPU cores, medians of {results['args']['repeats']}",
        f"measured on this {m['cpu_count']}-core machine; load average before the run {m['loadavg_before']}; "
        f"other processes used {describe_other_cpu(m['other_cpu_cores'])} during the run",
        "",
        "(a) env steps/s: one sampler_loop thread vs the pure jitted rollout loop",
        f"{'rollout':<10}{'pure':>12}{'threaded':>12}{'ratio':>9}{'paired':>9}   target >= {SAMPLER_TARGET}",
    ]
    for row in results["sampler"]:
        lines.append(
            f"{row['rollout']:<10}{fmt_rate(row['pure'], 'auto'):>12}{fmt_rate(row['threaded'], 'auto'):>12}{row['ratio']:>8.3f}x"
            f"{row['paired_ratio']:>8.3f}x   "
            f"{verdict(row['ratio'], SAMPLER_TARGET)}"
        )
    lines += [
        "",
        "(b) learner iterations/s: learner_loop thread on a pre-filled buffer vs the pure jitted update",
        f"{'rollout':<10}{'chunks':>7}{'batch':>7}{'iters':>7}{'pure':>10}{'threaded':>10}{'ratio':>9}{'paired':>9}"
        f"{'ms/it pure':>12}{'+ms/it':>8}",
    ]
    for row in results["learner"]:
        extra_ms = 1e3 / row["threaded"] - 1e3 / row["pure"]
        lines.append(
            f"{row['rollout']:<10}{row['chunks_per_batch']:>7}{row['batch_size']:>7}{row['iterations']:>7}"
            f"{row['pure']:>10.1f}{row['threaded']:>10.1f}{row['ratio']:>8.3f}x{row['paired_ratio']:>8.3f}x"
            f"{1e3 / row['pure']:>12.2f}{extra_ms:>8.2f}"
        )
    lines.append(
        "ratio: median threaded / median pure (the targets apply to it); paired: median of the per-repeat "
        "ratios (robust to drifting background load)"
    )
    c = results["straggler"]
    lines += [
        "",
        f"(c) 4 samplers at {c['latency_ms']} ms per env step, {c['rollout']} chunks, 4 chunks per batch, "
        f"{c['iterations']} learner iterations per run",
        f"{'mode':<9}{'env steps/s':>13}{'steady':>9}{'1st batch s':>13}{'approx_kl':>11}{'lag mean':>10}{'lag max':>9}"
        f"{'learner busy':>14}",
    ]
    for mode in ("async", "barrier"):
        r = c[mode]
        lines.append(
            f"{mode:<9}{r['env_steps_per_s']:>13,.0f}{r['steady_env_steps_per_s']:>9,.0f}{r['first_batch_s']:>13.2f}"
            f"{r['approx_kl']:>11.5f}{r['lag_mean']:>10.2f}{r['lag_max']:>9d}{r['learner_busy']:>14.2f}"
        )
    lines += [
        f"async / barrier: {c['ratio']:.2f}x measured (final env_steps / final wall_time), "
        f"{c['steady_ratio']:.2f}x over the second half; {c['expected_ratio']:.2f}x expected in steady state",
        f"  (model of the docstring with r = {1e3 * c['rollout_s']:.2f} ms/chunk from (a), "
        f"U = {1e3 * c['update_s']:.2f} ms/update from (b)); target >= {STRAGGLER_TARGET}x: "
        f"{verdict(c['ratio'], STRAGGLER_TARGET)}",
        "  steady: env steps/s over the second half of the rows (past the start-up backlog); 1st batch s: wall_time",
        "  of the first row (start-up: pipeline fill plus what compiles after the clock starts).",
        "  approx_kl, lag mean, learner busy: mean over rows, median over runs; lag max: max over all runs.",
    ]
    return "\n".join(lines)


def measure_sampler(args: Args, setup: ThreadedSetup) -> dict[str, Any]:
    """(a) for one rollout shape."""
    buffer = RingBuffer(setup.example, 4, "overwrite_oldest", device=setup.placement.buffer_device)  # never blocks
    buffer.warm_up(setup.example)
    pure_rollout(setup, 0.2)  # warm-up: compiles the key split
    return compare(
        args.repeats,
        lambda: pure_rollout(setup, args.sampler_seconds),
        lambda: threaded_sampler(setup, args.sampler_seconds, buffer),
    )


def measure_learner(args: Args, setup: ThreadedSetup) -> dict[str, Any]:
    """(b) for one learner batch; the iteration count is sized from a short pure run."""
    t0 = time.perf_counter()
    pure_update(setup, 6)
    iterations = max(10, int(args.learner_seconds * 5 / (time.perf_counter() - t0)))
    threaded_learner(setup, 3)  # warm-up: the loop's eager host-side ops
    row = compare(args.repeats, lambda: pure_update(setup, iterations), lambda: threaded_learner(setup, iterations))
    return {"batch_size": setup.config.batch_size, "iterations": iterations, **row}


def measure_straggler(args: Args, num_envs: int, num_steps: int, rollout_s: float, update_s: float) -> dict[str, Any]:
    """(c): interleaved train() runs, async and barrier."""
    runs: dict[str, list] = interleave(
        args.repeats,
        [
            ("async", lambda: straggler_run(straggler_config(args, num_envs, num_steps, barrier=False))),
            ("barrier", lambda: straggler_run(straggler_config(args, num_envs, num_steps, barrier=True))),
        ],
        on_sample=lambda mode, run: print(f"(c) {mode}: {run['env_steps_per_s']:,.0f} env steps/s", flush=True),
    )
    result = {mode: summarise_runs(r) for mode, r in runs.items()}
    ratio = lambda key: result["async"][key] / result["barrier"][key]  # noqa: E731
    return {
        "rollout": f"{num_envs}x{num_steps}",
        "latency_ms": [args.step_latency_ms] * 3 + [args.slow_factor * args.step_latency_ms],
        "iterations": args.straggler_iterations,
        **result,
        "ratio": ratio("env_steps_per_s"),
        "steady_ratio": ratio("steady_env_steps_per_s"),
        "expected_ratio": expected_straggler_ratio(args, num_steps, rollout_s, update_s),
        "rollout_s": rollout_s,
        "update_s": update_s,
    }


def write_results(args: Args, out: str, results: dict, text: str) -> None:
    name = results["backend"] + ("-quick" if args.quick else "")
    write_report(out, f"{name}.json", results, f"{name}.txt", text)


def main(args: Args) -> dict:
    if args.quick:
        args = dataclasses.replace(args, **QUICK)
    if args.straggler_iterations < 2:
        raise ValueError(f"straggler_iterations = {args.straggler_iterations} is invalid: must be >= 2")
    out = args.out or default_out("bench_threaded", REPO)
    with Manifest(out):
        return measure(args, out)


def measure(args: Args, out: str) -> dict:
    """(a), (b) and (c); writes the report files into `out` and returns the results."""
    load = MachineLoad(include_children=False)  # threads only: only this process's own CPU time is excluded
    machine = load.start()
    results: dict[str, Any] = {
        "env": "Pendulum-v1",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "device_count": jax.device_count(),
        "args": dataclasses.asdict(args),
        "machine": machine,
    }
    setups: dict[tuple[int, int, int], ThreadedSetup] = {}

    def setup_for(num_envs: int, num_steps: int, chunks_per_batch: int = 1) -> ThreadedSetup:
        if (num_envs, num_steps, chunks_per_batch) not in setups:
            setups[num_envs, num_steps, chunks_per_batch] = make_setup(num_envs, num_steps, chunks_per_batch)
        return setups[num_envs, num_steps, chunks_per_batch]

    results["sampler"] = []
    for shape in args.rollouts:
        row = measure_sampler(args, setup_for(*parse_shape(shape)))
        results["sampler"].append({"rollout": shape, **row})
        print(f"(a) {shape}: {row['ratio']:.3f}x", flush=True)
    results["learner"] = []
    for spec in args.learner_batches:
        num_envs, num_steps, chunks_per_batch = parse_shape(spec)
        row = measure_learner(args, setup_for(num_envs, num_steps, chunks_per_batch))
        results["learner"].append({"rollout": f"{num_envs}x{num_steps}", "chunks_per_batch": chunks_per_batch, **row})
        print(f"(b) {spec}: {row['ratio']:.3f}x", flush=True)
    setups.clear()

    num_envs, num_steps = parse_shape(args.rollouts[0])
    rollout_s = num_envs * num_steps / results["sampler"][0]["pure"]
    update = [r["pure"] for r in results["learner"] if r["rollout"] == args.rollouts[0] and r["chunks_per_batch"] == 4]
    update_s = 1.0 / update[0] if update else float("nan")
    results["straggler"] = measure_straggler(args, num_envs, num_steps, rollout_s, update_s)

    results["machine"].update(load.stop())
    text = report(results)
    print(text)
    write_results(args, out, results, text)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
