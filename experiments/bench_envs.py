"""Env families side by side with their bare simulators, in one run.

    python experiments/bench_envs.py            # ~6 min on 2 cores
    python experiments/bench_envs.py --repeats 1 --quick
    python experiments/bench_envs.py --parts b --quick   # the host-side part alone

(a) JAX physics (playground/CartpoleBalance, brax/inverted_pendulum): env steps/s of the sync
    mode as a user runs it (its preset shape, learner included) vs the bare vmapped env: a
    jitted `lax.scan` of the simulator's own `step` with uniform random actions at the same
    number of envs and steps, no policy, no learner, no auto-reset. The ratio is what a user
    gets of the simulator's speed.
(b) Host-side MuJoCo (HalfCheetah-v5, 16 envs per sampler): one sampler's host rollout
    (`host_rollout.HostRollout`: the jitted policy per step, then the assembly) vs the bare
    `SyncVectorEnv` stepping random actions (target >= 0.6), and the aggregate env steps/s of
    1, 2 and 4 sampler threads each running its own host rollouts at once (no learner), on
    Gymnasium's `SyncVectorEnv` (gymnasium/*: stepped in Python, under the GIL) and on EnvPool
    (envpool/*: C++ threads, no GIL; each pool with the threads a training run gives it, the
    cores shared among the samplers, `envpool.pool_threads`). Beside them one sampler whose
    pool has a single thread: a core's worth of EnvPool, the baseline of the scaling target
    (2 and 4 samplers >= 1.7x it on 2 cores; SyncVectorEnv's own samplers are one core's worth each).

Medians of interleaved repeats. Writes OUT/results.json, OUT/report.txt (--quick: results-quick.json,
report-quick.txt) and OUT/manifest.json; OUT defaults to runs/experiments/bench_envs (git-ignored):
publish with --out experiments/results/bench_envs.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()

import dataclasses
import functools
import os
import threading
import time
from typing import Any, Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np
import tyro

import ppo_async as pa
from ppo_async import envs
from ppo_async.core import host_rollout, learner
from ppo_async.study.benchmarking import MachineLoad, fmt_rate, interleave, verdict, write_report
from ppo_async.study.manifest import Manifest, default_out
from ppo_async.modes.common import make_contexts
from ppo_async.core.types import snapshot_of
from ppo_async.envs.envpool import pool_threads

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
JAX_ENVS = ("playground/CartpoleBalance", "brax/inverted_pendulum")
HOST_ENV = "gymnasium/HalfCheetah-v5"
HOST_TARGET = 0.6
# (b)'s sampler-thread series: label -> env (the same task on each host-side family)
HOST_SERIES = {"SyncVectorEnv": HOST_ENV, "EnvPool": "envpool/HalfCheetah-v5"}
SAMPLER_COUNTS = (1, 2, 4)
HOST_ENVS_PER_SAMPLER = 16
SCALING_TARGET = 1.7  # EnvPool: 2 and 4 samplers vs one sampler with a one-thread pool (issue 26 item 4)


@dataclasses.dataclass
class Args:
    repeats: int = 3
    """Interleaved repeats per side (medians reported)."""
    sync_env_steps: int = 400_000
    """Env steps of each sync-mode run (a)."""
    host_rollouts: int = 12
    """Rollouts (of the preset's num_steps) per host measurement (b), shared among the sampler threads."""
    parts: tuple[Literal["a", "b"], ...] = ("a", "b")
    """Which parts to run: a (JAX physics), b (host-side MuJoCo)."""
    quick: bool = False
    """Smaller budgets (a smoke run; figures are noisier)."""
    out: str | None = None
    """Output folder (default runs/experiments/bench_envs, git-ignored)."""


def sync_rate(config: pa.Config) -> float:
    """Env steps/s of `pa.train(config)` (its run time, compile excluded)."""
    result = pa.train(config)
    return config.num_iterations * config.batch_size / result.run_seconds


def bare_scan(env: envs.Env, num_envs: int, num_steps: int) -> tuple[Any, Any]:
    """(jitted scan of `num_steps` bare simulator steps of `num_envs` envs with random actions,
    its initial carry)."""
    sim = env.env.sim
    low, high = jnp.asarray(env.action_low), jnp.asarray(env.action_high)

    def run(carry: Any) -> Any:
        def body(c: Any, _: Any) -> tuple[Any, jax.Array]:
            state, key = c
            key, act_key = jax.random.split(key)
            action = jax.random.uniform(act_key, (num_envs, *env.action_shape), minval=low, maxval=high)
            state = jax.vmap(sim.step)(state, action)
            return (state, key), state.reward

        return jax.lax.scan(body, carry, None, length=num_steps)

    init = jax.jit(jax.vmap(sim.reset))(jax.random.split(jax.random.PRNGKey(0), num_envs))
    init = jax.jit(jax.vmap(sim.step))(init, jnp.zeros((num_envs, *env.action_shape)))  # step-state types
    return jax.jit(run), (init, jax.random.PRNGKey(1))


def bare_rate(program: Any, carry: Any, steps_per_call: int, calls: int) -> float:
    carry, _ = program(carry)  # compiled (and warm) before the clock
    jax.block_until_ready(carry)
    t0 = time.perf_counter()
    for _ in range(calls):
        carry, rewards = program(carry)
    jax.block_until_ready(rewards)
    return steps_per_call * calls / (time.perf_counter() - t0)


def measure_jax_env(name: str, args: Args) -> dict[str, Any]:
    config = pa.config_for_env(name, {"total_env_steps": args.sync_env_steps})
    rc = config.rollout
    env = envs.make_env(name, config.env_options)
    program, carry = bare_scan(env, rc.num_envs, rc.num_steps)
    calls = max(1, args.sync_env_steps // (rc.num_envs * rc.num_steps))
    sync_rate(config)  # compile (and the persistent cache) outside the repeats
    samples = interleave(args.repeats, [("sync", lambda: sync_rate(config)),
                                        ("bare", lambda: bare_rate(program, carry, rc.num_envs * rc.num_steps, calls))])
    sync, bare = float(np.median(samples["sync"])), float(np.median(samples["bare"]))
    print(f"{name}: sync {fmt_rate(sync)} vs bare {fmt_rate(bare)} env steps/s -> {sync / bare:.3f}", flush=True)
    return {"env": name, "num_envs": rc.num_envs, "num_steps": rc.num_steps, "backend": env.params.backend,
            "sync_env_steps_per_s": samples["sync"], "bare_env_steps_per_s": samples["bare"],
            "sync_median": sync, "bare_median": bare, "ratio": sync / bare}


def host_setup(num_envs: int, name: str = HOST_ENV) -> tuple[host_rollout.HostRollout, Any, pa.Config]:
    """A warm `HostRollout` of host env `name` (its preset's shape at `num_envs`), a snapshot, the config."""
    config = pa.config_for_env(name, {"mode": "threaded", "rollout.num_envs": num_envs})
    _, rollout_ctx, learner_ctx = make_contexts(config)
    state = learner.init_train_state(learner_ctx, jax.random.PRNGKey(0), rollout_ctx.env.obs_shape)
    roll = host_rollout.HostRollout(rollout_ctx)
    roll.warm_up(snapshot_of(state))
    return roll, snapshot_of(state), config


def host_rollout_rate(roll: host_rollout.HostRollout, snapshot: Any, env: host_rollout.HostEnv, rollouts: int) -> float:
    key = jax.random.PRNGKey(2)
    t0 = time.perf_counter()
    for _ in range(rollouts):
        key, sub = jax.random.split(key)
        _, traj = roll(snapshot, env, sub)
        jax.block_until_ready(traj)
    return rollouts * env.num_envs * roll.ctx.config.num_steps / (time.perf_counter() - t0)


def bare_vector_rate(env: host_rollout.HostVectorEnv, steps: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    space = env.vec.action_space
    actions = rng.uniform(space.low, space.high, size=(steps, *space.shape)).astype(np.float32)
    t0 = time.perf_counter()
    for action in actions:
        env.vec.step(action)
    return steps * env.num_envs / (time.perf_counter() - t0)


def threads_rate(roll: host_rollout.HostRollout, snapshot: Any, make_env: Callable[[int], host_rollout.HostEnv],
                 num_threads: int, rollouts: int) -> float:
    """Aggregate env steps/s of `num_threads` threads, each with its own vector env (`make_env(i)`),
    running `rollouts` host rollouts at once (the samplers of a threaded run without the learner)."""
    vec_envs = [make_env(i) for i in range(num_threads)]
    start = threading.Barrier(num_threads + 1)

    def body(env: host_rollout.HostEnv) -> None:
        start.wait()
        host_rollout_rate(roll, snapshot, env, rollouts)

    threads = [threading.Thread(target=body, args=(e,)) for e in vec_envs]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    for e in vec_envs:
        e.close()
    return num_threads * rollouts * vec_envs[0].num_envs * roll.ctx.config.num_steps / seconds


def sampler_sides(args: Args) -> list[tuple[str, Callable[[], float]]]:
    """(b)'s aggregate measurements as `interleave` sides: "<series> x<n>" for every series and
    sampler count (each sampler's env as a threaded run makes it, `HostRollout.make_env`), and
    "EnvPool x1, 1-thread pool"."""
    sides = []
    setups = {label: host_setup(HOST_ENVS_PER_SAMPLER, name)[:2] for label, name in HOST_SERIES.items()}
    for label, (roll, snapshot) in setups.items():
        for n in SAMPLER_COUNTS:
            make = functools.partial(sampler_env, roll, num_samplers=n)
            sides.append((f"{label} x{n}", functools.partial(threads_rate, roll, snapshot, make, n, max(2, args.host_rollouts // n))))
    roll, snapshot = setups["EnvPool"]
    make = functools.partial(sampler_env, roll, num_samplers=1, num_threads=1)
    sides.append(("EnvPool x1, 1-thread pool", functools.partial(threads_rate, roll, snapshot, make, 1, args.host_rollouts)))
    return sides


def sampler_env(roll: host_rollout.HostRollout, i: int, num_samplers: int, num_threads: int | None = None) -> host_rollout.HostEnv:
    """Sampler i's vector env (seed 100 + i) as a threaded run of `num_samplers` makes it, or an
    EnvPool with `num_threads` threads."""
    if num_threads is None:
        return roll.make_env(100 + i, num_samplers)
    return host_rollout.EnvPoolVectorEnv(roll.ctx.env.env, roll.ctx.config.num_envs, 100 + i, num_threads)


def measure_sampler_threads(args: Args) -> dict[str, Any]:
    """Aggregate env steps/s of 1, 2, 4 sampler threads per series, interleaved, and the
    one-thread-pool baseline: {"series": {label: {n: {"samples", "median"}}}, "one_thread_pool":
    {"samples", "median"}, "envpool_pool_threads": {n: threads per pool}}."""
    samples = interleave(args.repeats, sampler_sides(args),
                         on_sample=lambda name, rate: print(f"  {name}: {fmt_rate(rate)} env steps/s in all", flush=True))
    summary = lambda xs: {"samples": xs, "median": float(np.median(xs))}  # noqa: E731
    return {"series": {label: {n: summary(samples[f"{label} x{n}"]) for n in SAMPLER_COUNTS} for label in HOST_SERIES},
            "one_thread_pool": summary(samples["EnvPool x1, 1-thread pool"]),
            "envpool_pool_threads": {n: pool_threads(HOST_ENVS_PER_SAMPLER, n) for n in SAMPLER_COUNTS}}


def measure_host_env(args: Args) -> dict[str, Any]:
    roll, snapshot, config = host_setup(16)
    env = host_rollout.HostVectorEnv(envs.make_env(HOST_ENV).env, 16, 0)
    steps = args.host_rollouts * config.rollout.num_steps
    try:
        samples = interleave(args.repeats, [("rollout", lambda: host_rollout_rate(roll, snapshot, env, args.host_rollouts)),
                                            ("bare", lambda: bare_vector_rate(env, steps))])
    finally:
        env.close()
    rollout, bare = float(np.median(samples["rollout"])), float(np.median(samples["bare"]))
    print(f"{HOST_ENV} x16: host rollout {fmt_rate(rollout)} vs bare vector env {fmt_rate(bare)} -> {rollout / bare:.3f}", flush=True)
    samplers = measure_sampler_threads(args)
    return {"env": HOST_ENV, "num_envs": 16, "num_steps": config.rollout.num_steps,
            "rollout_env_steps_per_s": samples["rollout"], "bare_env_steps_per_s": samples["bare"],
            "rollout_median": rollout, "bare_median": bare, "ratio": rollout / bare,
            "threads": samplers["series"]["SyncVectorEnv"], "envpool_threads": samplers["series"]["EnvPool"],
            "envpool_one_thread_pool": samplers["one_thread_pool"],
            "envpool_pool_threads": samplers["envpool_pool_threads"]}


def report(results: dict) -> str:
    lines = ["bench_envs: env steps/s, medians of interleaved repeats", ""]
    if "jax_envs" in results:
        lines.append("(a) JAX physics: sync mode (preset shape, learner included) vs the bare vmapped simulator scan")
        lines.append(f"{'env':30s} {'backend':12s} {'N x T':9s} {'sync':>9s} {'bare':>9s} {'ratio':>7s}")
        for r in results["jax_envs"]:
            lines.append(f"{r['env']:30s} {r['backend']:12s} {str(r['num_envs']) + 'x' + str(r['num_steps']):9s} "
                         f"{fmt_rate(r['sync_median']):>9s} {fmt_rate(r['bare_median']):>9s} {r['ratio']:7.3f}")
        lines.append("")
    if "host_env" in results:
        lines += host_report(results["host_env"])
    m = results["machine"]
    lines += ["", f"machine: {m.get('cpu_count')} cores, load {m.get('loadavg_before')} -> {m.get('loadavg_after')}, "
              f"other processes {m.get('other_cpu_cores')} cores busy"]
    return "\n".join(lines)


def by_count(series: dict) -> dict[int, float]:
    """{sampler count: median} of a series (JSON round trips turn the counts into strings)."""
    return {int(n): t["median"] for n, t in series.items()}


def host_report(h: dict) -> list[str]:
    """(b)'s report lines: one sampler's rollout vs the bare vector env, then the aggregate of
    1, 2 and 4 sampler threads per series with their ratios and the EnvPool scaling target."""
    lines = [f"(b) {h['env']}, {h['num_envs']} envs: one sampler's host rollout vs the bare vector env",
             f"host rollout {fmt_rate(h['rollout_median'])}, bare {fmt_rate(h['bare_median'])}: "
             f"ratio {h['ratio']:.3f} (target >= {HOST_TARGET}: {verdict(h['ratio'], HOST_TARGET)})", "",
             f"HalfCheetah-v5, {h['num_envs']} envs per sampler: aggregate env steps/s of N sampler threads (x: over N = 1)"]
    sync_vec = by_count(h["threads"])
    lines.append(f"{'':28s}" + "".join(f"{f'N = {n}':>16s}" for n in sync_vec))
    series = {"SyncVectorEnv": sync_vec}
    if "envpool_threads" in h:
        series["EnvPool"] = by_count(h["envpool_threads"])
    for label, rates in series.items():
        one = rates[1]
        lines.append(f"{label:28s}" + "".join(f"{fmt_rate(r):>9s} ({r / one:.2f}x)" for r in rates.values()))
    if "envpool_threads" not in h:
        return lines
    pool, base = series["EnvPool"], h["envpool_one_thread_pool"]["median"]
    threads = {int(n): t for n, t in h["envpool_pool_threads"].items()}
    lines.append(f"  EnvPool threads per pool: {', '.join(f'{t} at N = {n}' for n, t in threads.items())} (the cores shared among the samplers)")
    lines.append(f"  EnvPool, one sampler with a 1-thread pool (a core's worth): {fmt_rate(base)}")
    for n in (2, 4):
        ratio = pool[n] / base
        lines.append(f"  EnvPool N = {n} over it: {ratio:.2f}x (target >= {SCALING_TARGET}: {verdict(ratio, SCALING_TARGET)})")
    lines.append("  EnvPool over SyncVectorEnv at the same N: " + ", ".join(f"{pool[n] / sync_vec[n]:.2f}x at N = {n}" for n in pool))
    return lines


def main(args: Args) -> dict:
    if args.quick:
        args = dataclasses.replace(args, sync_env_steps=100_000, host_rollouts=4)
    out = args.out or default_out("bench_envs", REPO)
    with Manifest(out):
        results = measure(args)
        text = report(results)
        print(text)
        suffix = "-quick" if args.quick else ""
        write_report(out, f"results{suffix}.json", results, f"report{suffix}.txt", text)
    return results


def measure(args: Args) -> dict:
    """(a) and (b) with the machine's load around them: the results dict."""
    load = MachineLoad(include_children=True)
    results: dict[str, Any] = {"machine": load.start(), "args": dataclasses.asdict(args)}
    if "a" in args.parts:
        results["jax_envs"] = [measure_jax_env(name, args) for name in JAX_ENVS]
    if "b" in args.parts:
        results["host_env"] = measure_host_env(args)
    results["machine"].update(load.stop())
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
