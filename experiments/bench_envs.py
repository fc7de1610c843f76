"""Env families side by side with their bare simulators, in one run.

    python experiments/bench_envs.py            # ~6 min on 2 cores
    python experiments/bench_envs.py --repeats 1 --quick

(a) JAX physics (playground/CartpoleBalance, brax/inverted_pendulum): env steps/s of the sync
    mode as a user runs it (its preset shape, learner included) vs the bare vmapped env: a
    jitted `lax.scan` of the simulator's own `step` with uniform random actions at the same
    number of envs and steps, no policy, no learner, no auto-reset. The ratio is what a user
    gets of the simulator's speed.
(b) Host-side Gymnasium (HalfCheetah-v5, 16 envs): one sampler's host rollout
    (`host_rollout.HostRollout`: the jitted policy per step, then the assembly) vs the bare
    `SyncVectorEnv` stepping random actions (target >= 0.6), and the aggregate env steps/s of
    1, 2 and 4 sampler threads each running its own host rollouts at once (no learner).

Medians of interleaved repeats. Writes OUT/results.json, OUT/report.txt (--quick: results-quick.json,
report-quick.txt) and OUT/manifest.json; OUT defaults to runs/experiments/bench_envs (git-ignored):
publish with --out experiments/results/bench_envs.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()

import dataclasses
import os
import threading
import time
from typing import Any

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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
JAX_ENVS = ("playground/CartpoleBalance", "brax/inverted_pendulum")
HOST_ENV = "gymnasium/HalfCheetah-v5"
HOST_TARGET = 0.6


@dataclasses.dataclass
class Args:
    repeats: int = 3
    """Interleaved repeats per side (medians reported)."""
    sync_env_steps: int = 400_000
    """Env steps of each sync-mode run (a)."""
    host_rollouts: int = 12
    """Rollouts of 64 steps per host measurement (b)."""
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


def host_setup(num_envs: int) -> tuple[host_rollout.HostRollout, Any, pa.Config]:
    config = pa.config_for_env(HOST_ENV, {"mode": "threaded", "rollout.num_envs": num_envs})
    _, rollout_ctx, learner_ctx = make_contexts(config)
    state = learner.init_train_state(learner_ctx, jax.random.PRNGKey(0), rollout_ctx.env.obs_shape)
    roll = host_rollout.HostRollout(rollout_ctx)
    roll.warm_up(snapshot_of(state))
    return roll, snapshot_of(state), config


def host_rollout_rate(roll: host_rollout.HostRollout, snapshot: Any, env: host_rollout.HostVectorEnv, rollouts: int) -> float:
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


def threads_rate(roll: host_rollout.HostRollout, snapshot: Any, config: pa.Config, num_threads: int, rollouts: int) -> float:
    """Aggregate env steps/s of `num_threads` threads, each with its own vector env, running
    `rollouts` host rollouts at once (the samplers of a threaded run without the learner)."""
    spec = envs.make_env(HOST_ENV).env
    vec_envs = [host_rollout.HostVectorEnv(spec, config.rollout.num_envs, 100 + i) for i in range(num_threads)]
    start = threading.Barrier(num_threads + 1)

    def body(env: host_rollout.HostVectorEnv) -> None:
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
    return num_threads * rollouts * config.rollout.num_envs * config.rollout.num_steps / seconds


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
    aggregate = {}
    for n in (1, 2, 4):
        rates = [threads_rate(roll, snapshot, config, n, max(2, args.host_rollouts // n)) for _ in range(args.repeats)]
        aggregate[n] = {"samples": rates, "median": float(np.median(rates))}
        print(f"  {n} sampler thread(s): {fmt_rate(aggregate[n]['median'])} env steps/s in all", flush=True)
    return {"env": HOST_ENV, "num_envs": 16, "num_steps": config.rollout.num_steps,
            "rollout_env_steps_per_s": samples["rollout"], "bare_env_steps_per_s": samples["bare"],
            "rollout_median": rollout, "bare_median": bare, "ratio": rollout / bare, "threads": aggregate}


def report(results: dict) -> str:
    lines = ["bench_envs: env steps/s, medians of interleaved repeats", ""]
    lines.append("(a) JAX physics: sync mode (preset shape, learner included) vs the bare vmapped simulator scan")
    lines.append(f"{'env':30s} {'backend':12s} {'N x T':9s} {'sync':>9s} {'bare':>9s} {'ratio':>7s}")
    for r in results["jax_envs"]:
        lines.append(f"{r['env']:30s} {r['backend']:12s} {str(r['num_envs']) + 'x' + str(r['num_steps']):9s} "
                     f"{fmt_rate(r['sync_median']):>9s} {fmt_rate(r['bare_median']):>9s} {r['ratio']:7.3f}")
    h = results["host_env"]
    lines += ["", f"(b) {h['env']}, {h['num_envs']} envs: one sampler's host rollout vs the bare vector env",
              f"host rollout {fmt_rate(h['rollout_median'])}, bare {fmt_rate(h['bare_median'])}: "
              f"ratio {h['ratio']:.3f} (target >= {HOST_TARGET}: {verdict(h['ratio'], HOST_TARGET)})"]
    one = h["threads"]["1"]["median"] if "1" in h["threads"] else h["threads"][1]["median"]
    for n, t in h["threads"].items():
        lines.append(f"  {n} sampler thread(s): {fmt_rate(t['median'])} env steps/s in all ({t['median'] / one:.2f}x one thread)")
    m = results["machine"]
    lines += ["", f"machine: {m.get('cpu_count')} cores, load {m.get('loadavg_before')} -> {m.get('loadavg_after')}, "
              f"other processes {m.get('other_cpu_cores')} cores busy"]
    return "\n".join(lines)


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
    results["jax_envs"] = [measure_jax_env(name, args) for name in JAX_ENVS]
    results["host_env"] = measure_host_env(args)
    results["machine"].update(load.stop())
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
