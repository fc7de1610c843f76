"""Threaded mode: sampler threads -> device ring buffer -> learner; the lag emerges from timing.

Each sampler thread owns a jitted, vmapped rollout (N envs x T steps), its params snapshot
and version, its RNG and env states. It refreshes from the `ParamStore` when at least
`refresh_lag` versions behind (no more often than `min_refresh_interval_s`); when a finished
rollout is more than `lag.max_lag` versions old it is discarded (counted) and the sampler
pulls the latest params (forced refresh). The learner (the calling thread) takes one chunk
per iteration from the `RingBuffer`, runs the pure jitted PPO update (stale samples beyond
`lag.max_lag` are dropped and counted) and publishes the new version.

Single seed, single learner device for now (data-parallel learner: not built yet).
Every thread is named, owned and joined; an exception in any thread stops the run and is
re-raised from `train()` with its traceback; every blocking call has a timeout.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from ppo_async import envs, learner
from ppo_async.buffer import RingBuffer
from ppo_async.config import Config
from ppo_async.lag import must_force_refresh, schedule_record, should_refresh, write_schedule
from ppo_async.learner import hyperparams_from_config
from ppo_async.metrics import JsonlWriter, NonFiniteError, Progress, check_finite, to_python
from ppo_async.modes.sync import make_contexts, rollout_metrics, sampler_env_key
from ppo_async.param_store import ParamStore
from ppo_async.rollout import rollout
from ppo_async.types import snapshot_of


class ThreadFailure(RuntimeError):
    """A sampler thread raised; the message carries the thread's name and traceback."""


@dataclass
class SamplerStats:
    """Per-sampler counters and time split (written by its thread, read under the GIL)."""

    produced: int = 0  # transitions produced (including discarded ones)
    discarded: int = 0  # transitions discarded by forced refresh
    refreshes: int = 0
    forced_refreshes: int = 0
    rollout_s: float = 0.0
    wait_params_s: float = 0.0
    wait_buffer_s: float = 0.0
    latency_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)


def _sampler_loop(
    sampler_id: int,
    config: Config,
    rollout_fn: Callable,
    env_state: Any,
    key: jax.Array,
    store: ParamStore,
    buffer: RingBuffer,
    stop: threading.Event,
    stats: SamplerStats,
    errors: list,
) -> None:
    """Body of one sampler thread (impure shell around the pure rollout)."""
    try:
        tcfg = config.threaded
        latency_ms = tcfg.sampler_step_latency_ms[sampler_id] if tcfg.sampler_step_latency_ms else 0.0
        rng = random.Random(config.seed * 1000 + sampler_id)
        snapshot = store.latest()
        version = int(snapshot.version)
        last_refresh = time.perf_counter()
        while not stop.is_set():
            latest = store.latest_version()
            now = time.perf_counter()
            if should_refresh(version, latest, tcfg.refresh_lag, now - last_refresh, tcfg.min_refresh_interval_s):
                t0 = time.perf_counter()
                snapshot = store.get_if_newer(version) or snapshot
                version, last_refresh = int(snapshot.version), time.perf_counter()
                stats.refreshes += 1
                stats.wait_params_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            key, rollout_key = jax.random.split(key)
            env_state, trajectory = rollout_fn(snapshot, env_state, rollout_key)
            jax.block_until_ready(trajectory.transitions.reward)
            stats.rollout_s += time.perf_counter() - t0
            if latency_ms > 0:
                sleep = latency_ms * config.rollout.num_steps / 1000.0
                sleep *= 1.0 + tcfg.latency_jitter * (2.0 * rng.random() - 1.0)
                t0 = time.perf_counter()
                stop.wait(sleep)  # sleeps outside the GIL; wakes at once on stop
                stats.latency_s += time.perf_counter() - t0
            if must_force_refresh(version, store.latest_version(), config.lag.max_lag):
                # Forced refresh: the rollout just made is too stale; discard it (counted).
                buffer.discard(sampler_id)
                stats.forced_refreshes += 1
                snapshot = store.latest()
                version, last_refresh = int(snapshot.version), time.perf_counter()
                continue
            t0 = time.perf_counter()
            while not stop.is_set():
                if buffer.put((sampler_id, time.perf_counter(), trajectory), timeout=0.1):
                    break
                stop.wait(0.002)  # full buffer (block policy): wait outside the lock
            stats.wait_buffer_s += time.perf_counter() - t0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        errors.append((f"sampler-{sampler_id}", exc, traceback.format_exc()))
        stop.set()


def train_threaded(config: Config, *, progress: bool = False, on_iteration=None):
    """Runs the threaded mode (one seed) and returns a `TrainResult`."""
    from ppo_async.train import TrainResult, write_config

    if config.num_seeds != 1:
        from ppo_async.config import ConfigError

        raise ConfigError(f"num_seeds = {config.num_seeds} is invalid for mode='threaded': must be 1")
    t_start = time.perf_counter()
    tcfg = config.threaded
    num_samplers = tcfg.num_samplers
    lag_buckets = (config.lag.max_lag + 2) if config.lag.max_lag is not None else 16
    _, rollout_ctx, learner_ctx = make_contexts(config, lag_buckets=lag_buckets)
    hparams = hyperparams_from_config(config)
    key = jax.random.PRNGKey(config.seed)
    param_key, env_key, run_key = jax.random.split(key, 3)
    train_state = jax.jit(lambda k: learner.init_train_state(learner_ctx, k, rollout_ctx.env.obs_shape))(param_key)
    rollout_fn = jax.jit(lambda snap, es, k: rollout(rollout_ctx, snap, es, k))
    update_fn = jax.jit(lambda st, tr, k, hp: learner.ppo_update(learner_ctx, st, tr, k, hp))
    reset = jax.jit(lambda k: envs.reset_envs(rollout_ctx.env, k, config.rollout.num_envs))
    env_states = [reset(sampler_env_key(env_key, s)) for s in range(num_samplers)]
    sampler_keys = jax.random.split(jax.random.fold_in(run_key, 1), num_samplers)
    store = ParamStore(snapshot_of(train_state))
    # Compile before the clock starts (one trace each; every sampler shares the compiled rollout).
    _, example = rollout_fn(store.latest(), env_states[0], sampler_keys[0])
    update_fn.lower(train_state, example, run_key, hparams).compile()
    buffer = RingBuffer(example, tcfg.buffer_capacity, tcfg.full_policy)
    compile_seconds = time.perf_counter() - t_start

    stop = threading.Event()
    errors: list = []
    stats = [SamplerStats() for _ in range(num_samplers)]
    # The buffer stores trajectories only; sampler ids and times travel through a side queue.
    side: dict[int, list] = {}
    side_lock = threading.Lock()

    class _TaggedBuffer:
        """Adapter: keeps (sampler_id, produced_time) in FIFO order beside the device buffer."""

        def discard(self, sampler_id):
            with side_lock:
                stats[sampler_id].produced += config.batch_size
                stats[sampler_id].discarded += config.batch_size

        def put(self, item, timeout):
            sampler_id, produced_time, trajectory = item
            with side_lock:
                ok = buffer.put(trajectory, timeout=0.0 if tcfg.full_policy == "block" else timeout)
                if ok:
                    stats[sampler_id].produced += config.batch_size
                    side.setdefault(0, []).append((sampler_id, produced_time))
                    overflow = len(side[0]) - buffer.size
                    if overflow > 0:  # overwrite_oldest dropped the oldest chunk(s)
                        del side[0][:overflow]
                return ok

    tagged = _TaggedBuffer()
    threads = [
        threading.Thread(
            target=_sampler_loop,
            name=f"ppo_async-sampler-{s}",
            args=(s, config, rollout_fn, env_states[s], sampler_keys[s], store, tagged, stop, stats[s], errors),
            daemon=True,
        )
        for s in range(num_samplers)
    ]
    writer = None
    if config.run_dir:
        write_config(config.run_dir, config)
        writer = JsonlWriter(f"{config.run_dir}/metrics.jsonl")
    schedule_records = []
    rows: list[dict[str, Any]] = []
    bar = Progress(config.num_iterations * config.batch_size, enabled=progress, desc=f"{config.env} threaded")
    consumed_total = dropped_stale_total = 0
    start = time.perf_counter()
    for t in threads:
        t.start()
    update_key = run_key
    try:
        for iteration in range(1, config.num_iterations + 1):
            tick = time.perf_counter()
            trajectory = None
            while trajectory is None:
                if errors:
                    break
                if time.perf_counter() - tick > tcfg.timeout_s:
                    raise TimeoutError(
                        f"learner waited {tcfg.timeout_s:.0f}s for data (threaded.timeout_s); samplers alive: "
                        f"{[t.name for t in threads if t.is_alive()]}"
                    )
                with side_lock:
                    trajectory = buffer.get(timeout=0.0) if buffer.size else None
                    tag = side[0].pop(0) if trajectory is not None else None
                    if trajectory is not None:  # accounting snapshot, consistent with the puts
                        produced = sum(s.produced for s in stats)
                        discarded = sum(s.discarded for s in stats)
                        overwritten = buffer.counters()["overwritten"] * config.batch_size
                        resident = buffer.size * config.batch_size
                if trajectory is None:
                    time.sleep(0.001)
            if errors:
                break
            waited = time.perf_counter() - tick
            update_key, k = jax.random.split(update_key)
            version_before = int(train_state.version)
            t0 = time.perf_counter()
            train_state, metrics = update_fn(train_state, trajectory, k, hparams)
            metrics = jax.device_get(metrics)
            busy = time.perf_counter() - t0
            store.publish(snapshot_of(train_state))
            now = time.perf_counter()
            row = {name: to_python(v) for name, v in metrics.items()}
            row.update(to_python_dict(rollout_metrics(jax.device_get(trajectory.stats))))
            if row.get("nonfinite_env_values"):
                raise NonFiniteError(
                    f"env {config.env!r} produced {row['nonfinite_env_values']} NaN/inf observations or rewards "
                    f"(sampler {tag[0]}, iteration {iteration})"
                )
            consumed_total += row.pop("consumed")
            dropped_stale_total += row["dropped_stale"]
            policy_version = int(np.asarray(trajectory.transitions.policy_version).reshape(-1)[0])
            schedule_records.append(
                schedule_record(iteration, tag[0], policy_version, version_before, tag[1] - start, tick - start)
            )
            dropped = discarded + overwritten + dropped_stale_total
            if produced != consumed_total + dropped + resident:
                raise AssertionError(
                    f"sample accounting broken at iteration {iteration}: produced {produced} != consumed "
                    f"{consumed_total} + dropped {dropped} + resident {resident}"
                )
            elapsed = now - start
            row.update(
                seed=config.seed,
                iteration=iteration,
                learner_version=int(train_state.version),
                sgd_steps=int(train_state.sgd_steps),
                env_steps=consumed_total + dropped_stale_total,
                wall_time=elapsed,
                steps_per_second=config.batch_size / (now - tick),
                sampler_id=tag[0],
                behavior_version=policy_version,
                buffer_fill=buffer.fill,
                learner_busy_fraction=busy / max(now - tick, 1e-9),
                learner_wait_s=waited,
                samples_produced=produced,
                samples_consumed=consumed_total,
                samples_dropped=dropped,
                samples_resident=resident,
                dropped_forced_refresh=discarded,
                dropped_overwritten=overwritten,
                dropped_stale_total=dropped_stale_total,
                sampler_steps_per_second=[s.produced / max(time.perf_counter() - start, 1e-9) for s in stats],
                sampler_rollout_s=[s.rollout_s for s in stats],
                sampler_wait_params_s=[s.wait_params_s for s in stats],
                sampler_wait_buffer_s=[s.wait_buffer_s for s in stats],
                sampler_latency_s=[s.latency_s for s in stats],
                sampler_forced_refreshes=[s.forced_refreshes for s in stats],
            )
            check_finite([row], ("policy_loss", "value_loss", "entropy", "approx_kl"), iteration)
            if writer is not None:
                writer.write(row)
            rows.append(row)
            bar.update(iteration * config.batch_size, row)
            if on_iteration is not None:
                on_iteration([row])
    finally:
        stop.set()
        buffer.close()
        store.close()
        for t in threads:
            t.join(timeout=10.0)
        bar.close()
        if writer is not None:
            writer.close()
        if config.run_dir:
            write_schedule(f"{config.run_dir}/version_schedule.jsonl", schedule_records)
    if errors:
        name, exc, tb = errors[0]
        raise ThreadFailure(f"thread {name} failed: {exc!r}\n--- traceback of {name} ---\n{tb}") from exc
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        raise RuntimeError(f"threads did not stop within 10s: {stuck}")
    return TrainResult(
        config=config,
        train_state=jax.tree.map(lambda x: x[None], train_state),
        metrics=rows,
        compile_seconds=compile_seconds,
        run_seconds=rows[-1]["wall_time"] if rows else 0.0,
        extras={"version_schedule": schedule_records, "sampler_stats": stats},
    )


def to_python_dict(metrics: dict) -> dict:
    return {k: to_python(v) for k, v in metrics.items()}
