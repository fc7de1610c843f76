"""Threaded mode: sampler threads -> device ring buffer -> learner thread; lag emerges from timing.

Each sampler thread owns a jitted, vmapped rollout (N envs x T steps) on its device
(`threaded.sampler_devices`), its params snapshot and version, its RNG and env states. It
refreshes from the `ParamStore` when at least `refresh_lag` versions behind (no more often
than `min_refresh_interval_s`); when a finished rollout is more than `lag.max_lag` versions
old it is discarded (counted) and the sampler pulls the latest params (forced refresh).
Rollouts go into a `RingBuffer` on the first learner device. The learner thread takes
`chunks_per_batch` chunks per iteration, runs the pure PPO update (data-parallel over
`threaded.learner_devices` with shard_map when there are several; stale samples beyond
`lag.max_lag` are dropped and counted) and publishes the new version. With a `lag.max_lag`
and full_policy "block", a sampler starts a rollout only while fewer than
`(max_lag + 1) * chunks_per_batch` chunks are resident (a chunk made behind more would be
stale when consumed): the freshness bound is also the buffer's effective depth.

`threaded.kl_target` turns on the online KL controller (`ppo_async.core.kl_control`): after each
learner iteration it may pause or resume samplers and move `refresh_lag` and `max_lag` (the
samplers read `RunShared.knobs`, the learner's stale filter gets the new max_lag); its
state is in the `controller_*` metrics.

With `threaded.barrier` the same threads run classic synchronous distributed PPO: every
sampler makes exactly one rollout per policy version, always with the latest params, and
each learner batch holds one rollout from every sampler (lag 0, the slowest sampler sets
the pace).

The calling thread only logs (metrics.jsonl, TensorBoard, W&B, progress bar, checkpoints)
and watches: an exception in any thread stops every thread and is re-raised from `train()`;
Ctrl-C stops every thread, writes what was done and re-raises KeyboardInterrupt. Every thread
is named and joined; every blocking call has a timeout.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import queue
import random
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from ppo_async.runtime import distributed
from ppo_async import envs
from ppo_async.core import host_rollout, kl_control, learner
from ppo_async.runtime.buffer import ChunkTag, RingBuffer
from ppo_async.config import Config, ConfigError, DistributedFailure, config_to_dict
from ppo_async.core.lag import must_force_refresh, schedule_record, should_refresh
from ppo_async.core.learner import hyperparams_from_config
from ppo_async.runtime.placement import LEARNER_AXIS, Placement, learner_placement, resolve_placement  # noqa: F401 - re-exported
from ppo_async.report.metrics import NonFiniteError, to_python
from ppo_async.modes.common import clear_jitted_cache, make_contexts, rollout_metrics, sampler_env_key
from ppo_async.runtime.param_store import ParamStore
from ppo_async.run.recorder import RunRecorder
from ppo_async.modes.registry import Mode, register_mode
from ppo_async.run.result import TrainResult
from ppo_async.core.rollout import concat_trajectories, rollout
from ppo_async.core.types import TrainState, snapshot_of

JOIN_TIMEOUT_S = 10.0
POLL_S = 0.1  # slice of every blocking wait, so a stop request is seen within this time
# Learner iterations queued for the logging thread at most. A logger that falls behind makes
# the learner wait (back-pressure: learning slows to the logging rate, samplers then wait for
# buffer space or overwrite, as their full_policy says); nothing is dropped and memory stays
# bounded: a queued iteration holds its row and schedule records, and a train state only
# when a checkpoint or an evaluation is due.
LOG_QUEUE_SIZE = 16
VERSION_SCHEDULE_FILE = "version_schedule.jsonl"


class ThreadFailure(RuntimeError):
    """A sampler or learner thread raised; the message carries the thread's name and traceback."""


class ThreadedCheckpoint(NamedTuple):
    """What a threaded run checkpoints: the learner's state, with a seed axis of 1 (as other modes)."""

    train_state: TrainState  # leaves [1, ...]


@dataclass
class SamplerStats:
    """Per-sampler counters and time split (written by its thread, read under the GIL)."""

    produced: int = 0  # transitions produced (put into the buffer or discarded)
    discarded: int = 0  # transitions discarded by forced refresh
    refreshes: int = 0
    forced_refreshes: int = 0
    rollout_s: float = 0.0
    wait_params_s: float = 0.0
    # RingBuffer.put's lock_s / space_s / write_s, all keys present from the start (the
    # learner thread sums them while this one adds: the dict never changes size)
    put_timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(("lock_s", "space_s", "write_s"), 0.0))
    latency_s: float = 0.0
    paused_s: float = 0.0  # seconds paused by the KL controller, pauses that ended (see paused_seconds)
    paused_since: float | None = None  # perf_counter() when the pause in progress began
    phase: str = "starting"  # what the thread is doing now: params, rollout, latency, put, paused
    phase_since: float = 0.0  # perf_counter() when that began

    @property
    def wait_buffer_s(self) -> float:
        """Seconds inside buffer puts: waiting for the lock, for space (block), and writing."""
        return sum(self.put_timings.values())

    def enter(self, phase: str) -> None:
        """Marks what the sampler does next (named if the thread gets stuck there)."""
        self.phase, self.phase_since = phase, time.perf_counter()

    def pause_began(self, now: float) -> None:
        """The KL controller paused this sampler (no-op while a pause is in progress)."""
        if self.paused_since is None:
            self.paused_since = now

    def pause_ended(self, now: float) -> None:
        """The pause in progress is over: its time joins `paused_s`."""
        since, self.paused_since = self.paused_since, None
        if since is not None:
            self.paused_s += now - since

    def paused_seconds(self, now: float) -> float:
        """Seconds paused by the KL controller up to `now`, the pause in progress included (a
        sampler paused shortly before a row counts from its pause, not from its next poll)."""
        since = self.paused_since
        return self.paused_s + (now - since if since is not None else 0.0)


def make_learner_update(config: Config, placement: Placement, lag_buckets: int) -> tuple[Callable, Callable, Callable]:
    """`(update, place_state, place_trajectory)` on the learner devices (`placement.learner_placement`:
    one device, several, or every process's). The update's metrics also hold the consumed
    rollout's episode metrics (`rollout_metrics`), so the learner thread fetches everything in one
    transfer and runs no eager device ops."""
    devices = placement.update_devices
    sharded = len(devices) > 1 or bool(placement.mesh_devices)
    _, _, ctx = make_contexts(config, lag_buckets=lag_buckets, axis_name=LEARNER_AXIS if sharded else None)
    base, place_state, place_trajectory = learner_placement(ctx, devices, multi_process=bool(placement.mesh_devices))

    def update(state, trajectory, key, hparams):
        state, metrics = base(state, trajectory, key, hparams)
        return state, {**metrics, **rollout_metrics(trajectory.stats)}

    return jax.jit(update), place_state, place_trajectory


# ----------------------------------------------------------------------------------------
# Thread bodies (impure shells around the pure rollout / update)
# ----------------------------------------------------------------------------------------


@dataclass
class RunShared:
    """What the threads of one run share."""

    config: Config
    store: ParamStore
    buffer: RingBuffer
    stop: threading.Event
    errors: list  # (thread name, exception, formatted traceback)
    stats: list[SamplerStats]
    buffer_device: Any
    start: float = field(default_factory=time.perf_counter)  # reset when the threads start
    keeps_state: Callable[[int], bool] = lambda iteration: False  # iterations whose state the logger needs
    last_put_state: Any = None  # the train state of the last iteration handed to the logger
    max_queue_depth: int = 0  # most iterations ever waiting for the logger
    # The lag knobs in force: the config's, replaced as a whole by the KL controller (readers
    # take one reference per step, so each sees a consistent set)
    knobs: kl_control.LagKnobs = field(init=False)

    def __post_init__(self) -> None:
        self.knobs = initial_knobs(self.config)


def initial_knobs(config: Config) -> kl_control.LagKnobs:
    """The lag knobs a threaded run starts with: every sampler running, refresh_lag and max_lag as configured."""
    return kl_control.LagKnobs((True,) * config.threaded.num_samplers, config.threaded.refresh_lag, config.lag.max_lag)


def controller_limits(config: Config) -> kl_control.ControllerLimits | None:
    """The KL controller's target, window and bounds (`threaded.kl_target`); None when it is off."""
    tcfg = config.threaded
    if tcfg.kl_target is None:
        return None
    return kl_control.ControllerLimits(tcfg.kl_target, tcfg.effective_kl_window, tcfg.num_samplers, tcfg.refresh_lag,
                                       config.lag.max_lag)


def control_lag(shared: "RunShared", limits: kl_control.ControllerLimits, state: kl_control.ControllerState,
                metrics: Mapping[str, Any], consumed: int, elapsed_s: float) -> kl_control.ControllerState:
    """One KL-controller step after a learner iteration: feeds it the iteration's approx_kl
    (none when every sample was stale: no KL was measured) and lag_max and each sampler's rate
    while it ran, and puts its knobs in force for the samplers."""
    now = shared.start + elapsed_s
    rates = [s.produced / max(elapsed_s - s.paused_seconds(now), 1e-9) for s in shared.stats]
    kl = float(metrics["approx_kl"]) if consumed > 0 else math.nan
    state = kl_control.step(limits, state, kl, int(metrics["lag_max"]), rates)
    shared.knobs = state.knobs
    return state


def with_max_lag(hparams: Any, max_lag: int | None) -> Any:
    """`hparams` with the learner's stale filter at `max_lag` (None: off), placed as before."""
    value = np.float32(np.inf if max_lag is None else max_lag)
    return hparams._replace(max_lag=jax.device_put(value, hparams.max_lag.sharding))


def _record_failure(shared: RunShared, name: str, exc: BaseException) -> None:
    shared.errors.append((name, exc, traceback.format_exc()))
    shared.stop.set()


def _still_fresh(store: ParamStore, version: int, max_lag: int | None, chunks_per_batch: int) -> Callable | None:
    """`admit` for the buffer: a chunk made with `version` goes in only if it will still be
    within `max_lag` versions when the learner consumes it; None (admit all) without a filter.

    The learner consumes it from the latest version, plus one if the learner is busy updating
    (no consumer waiting in the buffer), plus one per batch of chunks resident ahead of it.
    """
    if max_lag is None:
        return None

    def admit(resident: int, consumer_waiting: bool) -> bool:
        consumed_at = store.latest_version() + (0 if consumer_waiting else 1) + resident // chunks_per_batch
        return not must_force_refresh(version, consumed_at, max_lag)

    return admit


def _force_refresh(stats: SamplerStats, store: ParamStore, snapshot: Any, version: int, device: Any,
                   chunk_size: int) -> tuple[Any, int, float]:
    """Counts a discarded rollout (a forced refresh) and pulls the latest params:
    `(snapshot, version, refresh time)`."""
    stats.produced += chunk_size
    stats.discarded += chunk_size
    stats.forced_refreshes += 1
    snapshot = store.get_if_newer(version, device) or snapshot
    return snapshot, int(snapshot.version), time.perf_counter()


def _pause_slice(shared: RunShared, stats: SamplerStats) -> None:
    """One POLL_S slice of a sampler paused by the KL controller (its pause timed from the first
    slice: `SamplerStats.paused_seconds`)."""
    stats.pause_began(time.perf_counter())
    stats.enter("paused")
    shared.stop.wait(POLL_S)


def _no_room(shared: RunShared, stats: SamplerStats, knobs: kl_control.LagKnobs) -> bool:
    """With a freshness bound (`max_lag`, full_policy "block"): True after waiting one POLL_S
    slice while `(max_lag + 1) * chunks_per_batch` chunks are resident. A chunk made now goes
    in behind them and would be too stale when consumed: the sampler waits for room instead
    of making it (counted as waiting for space). overwrite_oldest never waits: its new chunks
    replace old ones."""
    tcfg = shared.config.threaded
    if tcfg.barrier or knobs.max_lag is None or tcfg.full_policy != "block":
        return False
    t0 = time.perf_counter()
    stats.enter("put")
    room = shared.buffer.wait_for_room((knobs.max_lag + 1) * tcfg.effective_chunks_per_batch, timeout=POLL_S)
    stats.put_timings["space_s"] += time.perf_counter() - t0
    return not room


def _env_latency(shared: RunShared, stats: SamplerStats, latency_ms: float, rng: random.Random) -> float:
    """Sleeps the simulated env latency of one rollout (outside the GIL; wakes at once on
    stop); returns the instant the chunk is delivered."""
    tcfg = shared.config.threaded
    sleep = latency_ms * shared.config.rollout.num_steps / 1000.0
    sleep *= 1.0 + tcfg.latency_jitter * (2.0 * rng.random() - 1.0)
    t0 = time.perf_counter()
    stats.enter("latency")
    shared.stop.wait(sleep)
    stats.latency_s += time.perf_counter() - t0
    return time.perf_counter()


def sampler_loop(
    shared: RunShared, sampler_id: int, rollout_fn: Callable, env_state: Any, key: jax.Array, device: Any
) -> None:
    """Body of one sampler thread."""
    config, store, buffer, stop = shared.config, shared.store, shared.buffer, shared.stop
    stats = shared.stats[sampler_id]
    tcfg = config.threaded
    chunk_size = config.chunk_size
    try:
        latency_ms = tcfg.sampler_step_latency_ms[sampler_id] if tcfg.sampler_step_latency_ms else 0.0
        same_device = device == shared.buffer_device
        rng = random.Random(config.seed * 1000 + sampler_id)
        snapshot = store.get_if_newer(None, device)
        version = int(snapshot.version)
        last_refresh = time.perf_counter()
        made_with: int | None = None  # version of the last rollout put into the buffer
        paused = False
        while not stop.is_set():
            knobs = shared.knobs
            if not knobs.active[sampler_id]:  # paused by the KL controller
                _pause_slice(shared, stats)
                paused = True
                continue
            stats.pause_ended(time.perf_counter())  # running: a pause in progress (if any) is over
            if _no_room(shared, stats, knobs):
                continue
            t0 = time.perf_counter()
            stats.enter("params")
            if paused:  # resumed: its params are as old as the pause; pull the latest
                snapshot = store.get_if_newer(version, device) or snapshot
                version, last_refresh, paused = int(snapshot.version), time.perf_counter(), False
                stats.refreshes += 1
                stats.wait_params_s += last_refresh - t0
            elif tcfg.barrier:
                if made_with == version:  # one rollout per version: wait for the learner's next one
                    newer = store.wait_for_newer(version, timeout=POLL_S, device=device)
                    stats.wait_params_s += time.perf_counter() - t0
                    if newer is None:
                        continue
                    snapshot, version = newer, int(newer.version)
                    stats.refreshes += 1
            elif should_refresh(
                version, store.latest_version(), knobs.refresh_lag, t0 - last_refresh, tcfg.min_refresh_interval_s
            ):
                snapshot = store.get_if_newer(version, device) or snapshot
                version, last_refresh = int(snapshot.version), time.perf_counter()
                stats.refreshes += 1
                stats.wait_params_s += last_refresh - t0
            t0 = time.perf_counter()
            stats.enter("rollout")
            key, rollout_key = jax.random.split(key)
            env_state, trajectory = rollout_fn(snapshot, env_state, rollout_key)
            jax.block_until_ready(trajectory.transitions.reward)
            made = time.perf_counter()
            stats.rollout_s += made - t0
            if latency_ms > 0:
                made = _env_latency(shared, stats, latency_ms, rng)  # the chunk is delivered after it
            if not tcfg.barrier and must_force_refresh(version, store.latest_version(), shared.knobs.max_lag):
                # Forced refresh: the rollout just made is too stale; discard it (counted).
                snapshot, version, last_refresh = _force_refresh(stats, store, snapshot, version, device, chunk_size)
                continue
            # to the buffer's device (a no-op put costs ~0.15 ms per chunk: skip it on one device)
            chunk = trajectory if same_device else jax.device_put(trajectory, shared.buffer_device)
            stats.enter("put")
            fresh = None if tcfg.barrier else _still_fresh(store, version, shared.knobs.max_lag, tcfg.effective_chunks_per_batch)
            refused = []
            admit = None if fresh is None else (lambda resident, waiting: fresh(resident, waiting) or refused.append(1))
            while not stop.is_set():
                if buffer.put(chunk, timeout=POLL_S, tag=ChunkTag(sampler_id, made - shared.start, version), admit=admit,
                              timings=stats.put_timings):
                    stats.produced += chunk_size
                    made_with = version
                    break
                if refused:
                    # Would be staler than lag.max_lag when consumed: discard it here (a forced
                    # refresh, counted) rather than put it in to be dropped by the learner.
                    snapshot, version, last_refresh = _force_refresh(stats, store, snapshot, version, device, chunk_size)
                    break
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        _record_failure(shared, f"sampler-{sampler_id}", exc)


@dataclass
class LearnerOutput:
    """One learner iteration handed to the logging (calling) thread."""

    row: dict[str, Any]
    records: list[dict[str, Any]]
    train_state: TrainState | None  # only when `RunShared.keeps_state(iteration)` or the last iteration


def threaded_accounting(
    buffer_counters: Mapping[str, int], chunk_size: int, discarded: int, consumed: int, dropped_stale: int
) -> dict[str, int]:
    """The sample accounting of a threaded run at one instant (pure).

    Args:
      buffer_counters: `RingBuffer.counters()`: chunks `added`, `overwritten`, resident `size`.
      chunk_size: transitions per chunk.
      discarded: transitions discarded by forced refreshes (all samplers).
      consumed: transitions the learner consumed so far.
      dropped_stale: transitions the learner dropped as staler than `lag.max_lag` so far.

    Returns:
      `samples_produced = samples_consumed + samples_dropped + samples_resident` (by
      construction when nothing is lost) and the three kinds of drop.
    """
    overwritten = buffer_counters["overwritten"] * chunk_size
    return {
        "samples_produced": buffer_counters["added"] * chunk_size + discarded,
        "samples_consumed": consumed,
        "samples_dropped": discarded + overwritten + dropped_stale,
        "samples_resident": buffer_counters["size"] * chunk_size,
        "dropped_forced_refresh": discarded,
        "dropped_overwritten": overwritten,
        "dropped_stale_total": dropped_stale,
    }


@dataclass(frozen=True)
class IterationTimes:
    """perf_counter instants of one learner iteration: run start, iteration start, batch taken, update done."""

    start: float
    tick: float
    got: float
    done: float


def learner_row(
    config: Config,
    metrics: Mapping[str, Any],
    *,
    iteration: int,
    tags: Sequence[tuple[int, float, int]],
    learner_version: int,
    sgd_steps: int,
    accounting: Mapping[str, int],
    buffer_fill: float,
    times: IterationTimes,
    sampler_stats: Sequence["SamplerStats"],
) -> dict[str, Any]:
    """One threaded metrics row (pure): the update's metrics plus versions, timing, accounting, samplers.

    `tags` are the consumed chunks' `(sampler_id, made_at, policy_version)`; with one chunk
    `sampler_id` / `behavior_version` are scalars, else lists. `env_steps` counts the
    samples the learner took (consumed + dropped as stale).
    """
    elapsed = times.done - times.start
    iteration_s = max(times.done - times.tick, 1e-9)
    one = len(tags) == 1
    row = {name: to_python(value) for name, value in metrics.items()}
    row.update(
        seed=config.seed,
        iteration=iteration,
        learner_version=learner_version,
        sgd_steps=sgd_steps,
        env_steps=accounting["samples_consumed"] + accounting["dropped_stale_total"],
        wall_time=elapsed,
        steps_per_second=config.batch_size / iteration_s,
        sampler_id=tags[0][0] if one else [t[0] for t in tags],
        behavior_version=int(tags[0][2]) if one else [int(t[2]) for t in tags],
        buffer_fill=buffer_fill,
        learner_busy_fraction=(times.done - times.got) / iteration_s,
        learner_wait_s=times.got - times.tick,
        **accounting,
        sampler_steps_per_second=[s.produced / max(elapsed, 1e-9) for s in sampler_stats],
        sampler_rollout_s=[s.rollout_s for s in sampler_stats],
        sampler_wait_params_s=[s.wait_params_s for s in sampler_stats],
        sampler_wait_buffer_s=[s.wait_buffer_s for s in sampler_stats],  # = lock + space + write
        sampler_wait_space_s=[s.put_timings["space_s"] for s in sampler_stats],
        sampler_write_s=[s.put_timings["write_s"] for s in sampler_stats],
        sampler_latency_s=[s.latency_s for s in sampler_stats],
        sampler_forced_refreshes=[s.forced_refreshes for s in sampler_stats],
        sampler_paused_s=[s.paused_seconds(times.done) for s in sampler_stats],
    )
    return row


def take_batch(shared: RunShared, iteration: int) -> list | None:
    """`chunks_per_batch` tagged chunks from the buffer; None when the run is stopping.

    Raises TimeoutError after `threaded.timeout_s` without data; AssertionError when a
    barrier batch does not hold one rollout of every sampler.
    """
    tcfg = shared.config.threaded
    tick = time.perf_counter()
    items: list = []
    while len(items) < tcfg.effective_chunks_per_batch:
        if shared.stop.is_set():
            return None
        item = shared.buffer.get_tagged(timeout=POLL_S)
        if item is not None:
            items.append(item)
        elif time.perf_counter() - tick > tcfg.timeout_s:
            raise TimeoutError(f"learner waited {tcfg.timeout_s:.0f}s for data (threaded.timeout_s) at iteration {iteration}")
    samplers = sorted(tag[0] for _, tag in items)
    if tcfg.barrier and samplers != list(range(tcfg.num_samplers)):
        raise AssertionError(f"barrier broken at iteration {iteration}: batch from samplers {samplers}")
    return items


def learner_loop(
    shared: RunShared,
    update: Callable,
    merge: Callable,
    place_trajectory: Callable,
    train_state: TrainState,
    key: jax.Array,
    hparams: Any,
    out: "queue.Queue[LearnerOutput]",
) -> None:
    """Body of the learner thread: take chunks, update, publish, account, hand the row over."""
    config, store = shared.config, shared.store
    multi = distributed.is_multi_process(config)
    consumed_total = dropped_stale_total = last_version = 0
    limits = controller_limits(config)
    control = None if limits is None else kl_control.initial_state(limits)
    try:
        for iteration in range(1, config.num_iterations + 1):
            tick = time.perf_counter()
            items = take_batch(shared, iteration)
            if items is None:
                return
            got = time.perf_counter()
            chunks, tags = [chunk for chunk, _ in items], [tag for _, tag in items]
            trajectory = place_trajectory(merge(chunks) if len(chunks) > 1 else chunks[0])
            key, update_key = jax.random.split(key)
            version_before = last_version
            train_state, metrics = update(train_state, trajectory, update_key, hparams)
            metrics, version, sgd_steps = jax.device_get((metrics, train_state.version, train_state.sgd_steps))
            last_version = int(version)
            if last_version > version_before:
                store.publish(distributed.local_value(snapshot_of(train_state)))
            done = time.perf_counter()
            metrics = dict(metrics)
            consumed, stale = int(metrics.pop("consumed")), int(metrics["dropped_stale"])
            if multi:  # the update counted every process's samples: account for this process's
                consumed, stale, metrics["lag_mean_local"] = distributed.local_take(
                    tags, version_before, config.lag.max_lag, config.chunk_size)
            consumed_total += consumed
            dropped_stale_total += stale
            counters = shared.buffer.counters()
            accounting = threaded_accounting(
                counters, config.chunk_size, sum(s.discarded for s in shared.stats), consumed_total, dropped_stale_total
            )
            row = learner_row(
                config, metrics, iteration=iteration, tags=tags, learner_version=last_version, sgd_steps=int(sgd_steps),
                accounting=accounting, buffer_fill=counters["size"] / shared.buffer.capacity,
                times=IterationTimes(shared.start, tick, got, done), sampler_stats=shared.stats,
            )
            if control is not None:  # the KL controller moves the lag knobs for what comes next
                max_lag_before = control.knobs.max_lag
                control = control_lag(shared, limits, control, metrics, consumed, done - shared.start)
                row.update(kl_control.controller_metrics(control))
                if control.knobs.max_lag != max_lag_before:
                    hparams = with_max_lag(hparams, control.knobs.max_lag)
            records = [
                schedule_record(iteration, sid, int(v), version_before, made_at, got - shared.start) for sid, made_at, v in tags
            ]
            keep = shared.keeps_state(iteration) or iteration == config.num_iterations
            if not _put_for_logger(shared, out, LearnerOutput(row, records, train_state if keep else None)):
                return
            shared.last_put_state = train_state
    except BaseException as exc:  # noqa: BLE001
        _record_failure(shared, "learner", exc)


def _put_for_logger(shared: RunShared, out: queue.Queue, item: LearnerOutput) -> bool:
    """Queue `item` for the logging thread, waiting while the bounded queue is full; False on stop."""
    while not shared.stop.is_set():
        try:
            out.put(item, timeout=POLL_S)
        except queue.Full:
            continue
        shared.max_queue_depth = max(shared.max_queue_depth, out.qsize())
        return True
    return False


# ----------------------------------------------------------------------------------------
# The run (calling thread: set-up, logging, watching, shutdown)
# ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _ctrl_c_sets(event: threading.Event):
    """While active (main thread only), the first Ctrl-C sets `event` instead of raising
    KeyboardInterrupt at an arbitrary line (which could tear a metrics row); a second one
    raises as usual. Elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if event.is_set() and callable(previous):
            previous(signum, frame)
        event.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def threaded_checkpoint_like(config: Config) -> ThreadedCheckpoint:
    """Abstract (shape/dtype) `ThreadedCheckpoint` of a config, for restoring (nothing is computed)."""
    _, rollout_ctx, learner_ctx = make_contexts(config)
    state = jax.eval_shape(
        lambda k: learner.init_train_state(learner_ctx, k, rollout_ctx.env.obs_shape), jax.random.PRNGKey(0)
    )
    return ThreadedCheckpoint(jax.tree.map(lambda x: jax.ShapeDtypeStruct((1,) + x.shape, x.dtype), state))


def threaded_checkpoint(train_state: TrainState) -> ThreadedCheckpoint:
    """The learner's state on the host with a seed axis of 1, as other modes checkpoint theirs."""
    return ThreadedCheckpoint(jax.tree.map(lambda x: np.asarray(x)[None], jax.device_get(distributed.local_value(train_state))))


@dataclass
class ThreadedSetup:
    """Everything a threaded run builds (and compiles) before its clock starts.

    The rollout is compiled once per sampler device, the merge and the update once; the
    buffer's donated write is warmed up. `bench_threaded.py` times the thread bodies on it.
    """

    config: Config
    placement: Placement
    rollout_fn: Callable  # jit((snapshot, env_state, key) -> (env_state, Trajectory))
    update: Callable  # jit((train_state, trajectory, key, hparams) -> (train_state, metrics)) on the learner devices
    place_trajectory: Callable
    merge: Callable  # jit(list of chunks -> one trajectory)
    train_state: TrainState  # on the learner devices
    learner_key: jax.Array
    hparams: Any
    env_states: list  # one per sampler: on its device, or a host_rollout.HostVectorEnv (Gymnasium)
    sampler_keys: list
    example: Any  # one rollout chunk on the buffer device
    compile_seconds: float
    memory: dict[str, Any] = field(default_factory=dict)  # device_memory_report: buffer / snapshot bytes

    def batch(self) -> Any:
        """`chunks_per_batch` copies of the example chunk, merged and placed as the learner takes them."""
        chunks = [self.example] * self.config.threaded.effective_chunks_per_batch
        return self.place_trajectory(self.merge(chunks) if len(chunks) > 1 else chunks[0])

    def shared(self, buffer: RingBuffer | None = None) -> RunShared:
        """A fresh `RunShared` (new param store at the initial state; a new buffer unless given)."""
        config = self.config
        if buffer is None:
            buffer = RingBuffer(self.example, config.buffer_capacity_chunks, config.threaded.full_policy,
                                device=self.placement.buffer_device)
            buffer.warm_up(self.example)
        stats = [SamplerStats() for _ in range(config.threaded.num_samplers)]
        store = ParamStore(distributed.local_value(snapshot_of(self.train_state)))
        return RunShared(config, store, buffer, threading.Event(), [], stats, self.placement.buffer_device)


def lag_buckets_of(config: Config) -> int:
    """Length of the lag histogram: max_lag + 2 (the last counts the dropped), else 16 (the last a catch-all)."""
    return (config.lag.max_lag + 2) if config.lag.max_lag is not None else 16


# Fields of a threaded config that shape no compiled program: runs that differ only in them
# (a sweep over samplers, buffer length, refresh lag, latency, seeds, traced hyperparameters)
# reuse one set of compiled functions.
_PROGRAM_FREE_THREADED = ("num_samplers", "refresh_lag", "min_refresh_interval_s", "buffer_capacity", "full_policy",
                          "sampler_step_latency_ms", "latency_jitter", "timeout_s", "kl_target", "kl_window")
_PROGRAM_TOP = ("env", "env_options", "mode", "num_seeds", "total_env_steps", "rollout", "ppo", "network", "threaded")
_PROGRAMS_KEPT = 8


def program_key(config: Config, sampler_devices: tuple, learner_devices: tuple, lag_buckets: int) -> str:
    """A string equal for two threaded configs exactly when their compiled programs are the same:
    env, rollout shape, network, static PPO fields, batch chunks, devices and lag buckets
    (traced hyperparameters, seeds and the sampler / buffer knobs are left out)."""
    data = {name: value for name, value in config_to_dict(config).items() if name in _PROGRAM_TOP}
    for name in _PROGRAM_FREE_THREADED:
        data["threaded"].pop(name)
    data = learner.without_traced_fields(data)
    data["devices"] = [sorted({d.id for d in sampler_devices}), [d.id for d in learner_devices], lag_buckets]
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class ThreadedPrograms:
    """The jitted functions of a threaded run (compiled on first call, kept across runs)."""

    init: Callable  # jit(key -> TrainState)
    rollout_fn: Callable
    reset: Callable
    update: Callable
    place_state: Callable
    place_trajectory: Callable
    merge: Callable


_PROGRAMS: "collections.OrderedDict[str, ThreadedPrograms]" = collections.OrderedDict()


def clear_program_cache() -> None:
    """Forgets every kept compiled program, of threaded and of jitted modes (e.g. after
    patching a function they traced)."""
    _PROGRAMS.clear()
    clear_jitted_cache()


def threaded_programs(config: Config, placement: Placement, lag_buckets: int) -> ThreadedPrograms:
    """The jitted functions of `config`, shared by every run with the same `program_key`
    (the last `_PROGRAMS_KEPT` keys are kept), so a sweep of threaded runs compiles once per shape."""
    key = program_key(config, placement.sampler_devices, placement.update_devices, lag_buckets)
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    _, rollout_ctx, learner_ctx = make_contexts(config, lag_buckets=lag_buckets)
    update, place_state, place_trajectory = make_learner_update(config, placement, lag_buckets)
    num_envs, env = config.rollout.num_envs, rollout_ctx.env
    if env.host_side:  # Gymnasium: each sampler steps its own vector env on the host
        rollout_fn: Callable = host_rollout.HostRollout(rollout_ctx)
        reset: Callable = lambda k: host_rollout.HostVectorEnv(env.env, num_envs, host_rollout.seed_of(k))  # noqa: E731
    else:
        rollout_fn = jax.jit(lambda snap, es, k: rollout(rollout_ctx, snap, es, k))
        reset = jax.jit(lambda k: envs.reset_envs(env, k, num_envs))
    programs = ThreadedPrograms(
        init=jax.jit(lambda k: learner.init_train_state(learner_ctx, k, env.obs_shape)),
        rollout_fn=rollout_fn,
        reset=reset,
        update=update, place_state=place_state, place_trajectory=place_trajectory,
        merge=jax.jit(concat_trajectories),
    )
    _PROGRAMS[key] = programs
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
        _PROGRAMS.popitem(last=False)
    return programs


def tree_bytes(tree: Any) -> int:
    """Bytes of a pytree of arrays (or of `jax.ShapeDtypeStruct`s)."""
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def device_memory_report(chunk_like: Any, snapshot_like: Any, capacity_chunks: int, device: Any) -> dict[str, Any]:
    """Sizes a threaded run puts on its devices: the ring buffer (`capacity_chunks` chunks shaped
    like `chunk_like`), one parameter snapshot per sampler, and the buffer device's memory
    where JAX reports it (`device.memory_stats()`: accelerators; None on CPU)."""
    chunk_bytes = tree_bytes(chunk_like)
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory statistics
        stats = {}
    limit = stats.get("bytes_limit")
    return {
        "chunk_bytes": chunk_bytes,
        "buffer_bytes": chunk_bytes * int(capacity_chunks),
        "snapshot_bytes_per_sampler": tree_bytes(snapshot_like),
        "buffer_device": str(device),
        "device_bytes_limit": limit,
        "device_bytes_free": None if limit is None else int(limit) - int(stats.get("bytes_in_use", 0)),
    }


def check_buffer_fits(config: Config, report: Mapping[str, Any]) -> None:
    """ConfigError naming `threaded.buffer_capacity` when the ring buffer cannot fit in the free
    memory of its device (checked only where JAX reports the device's memory)."""
    free = report["device_bytes_free"]
    if free is not None and report["buffer_bytes"] > free:
        _buffer_too_big(config, report)


def _buffer_too_big(config: Config, report: Mapping[str, Any]) -> None:
    raise ConfigError(
        f"threaded.buffer_capacity = {config.threaded.buffer_capacity or config.buffer_capacity_chunks * config.chunk_size} "
        f"transitions is invalid: the ring buffer needs {report['buffer_bytes']:,} bytes "
        f"({config.buffer_capacity_chunks} chunks of {report['chunk_bytes']:,} bytes) on {report['buffer_device']}, "
        f"which has {report['device_bytes_free']:,} bytes free of {report['device_bytes_limit']:,}; lower it"
    )


def make_threaded_setup(config: Config) -> ThreadedSetup:
    """Placement, compiled rollout / merge / update, train state, envs and keys of a threaded config."""
    t_start = time.perf_counter()
    tcfg = config.threaded
    placement = resolve_placement(config)
    programs = threaded_programs(config, placement, lag_buckets_of(config))
    param_key, env_key, run_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
    sampler_key = jax.random.fold_in(run_key, 1)
    if distributed.is_multi_process(config):  # params and learner key shared; samplers and envs per process
        process = 1 + config.distributed.process_id
        sampler_key, env_key = jax.random.fold_in(sampler_key, process), jax.random.fold_in(env_key, process)
    place_state = programs.place_state
    train_state = place_state(programs.init(param_key))
    hparams, run_key = place_state(hyperparams_from_config(config)), place_state(run_key)
    devices = placement.sampler_devices
    host_side = isinstance(programs.rollout_fn, host_rollout.HostRollout)
    keys = jax.random.split(sampler_key, tcfg.num_samplers)
    sampler_keys = [jax.device_put(k, devices[s]) for s, k in enumerate(keys)]
    if host_side:
        chunk_like = programs.rollout_fn.trajectory_like(distributed.local_value(snapshot_of(train_state)))
    else:
        env_states = [jax.device_put(programs.reset(sampler_env_key(env_key, s)), devices[s]) for s in range(tcfg.num_samplers)]
        chunk_like = jax.eval_shape(programs.rollout_fn, distributed.local_value(snapshot_of(train_state)), env_states[0],
                                    sampler_keys[0])[1]
    memory = device_memory_report(chunk_like, snapshot_of(train_state)[:2], config.buffer_capacity_chunks, placement.buffer_device)
    check_buffer_fits(config, memory)  # before compiling the rollout and the update
    example = None
    for device in dict.fromkeys(devices):  # compile the rollout once per sampler device
        s = devices.index(device)
        snapshot = jax.device_put(distributed.local_value(snapshot_of(train_state)), device)
        if host_side:  # compiles the policy step and the assembly; steps no env
            example = programs.rollout_fn.warm_up(snapshot)
        else:
            _, example = programs.rollout_fn(snapshot, env_states[s], sampler_keys[s])
    if host_side:  # the simulators, last: nothing above can leave them open on an error
        env_states = [programs.reset(sampler_env_key(env_key, s)) for s in range(tcfg.num_samplers)]
    setup = ThreadedSetup(
        config=config, placement=placement, rollout_fn=programs.rollout_fn, update=programs.update,
        place_trajectory=programs.place_trajectory, merge=programs.merge, train_state=train_state,
        learner_key=run_key, hparams=hparams, env_states=env_states, sampler_keys=sampler_keys,
        example=jax.device_put(example, placement.buffer_device), compile_seconds=0.0, memory=memory,
    )
    setup.update.lower(train_state, setup.batch(), run_key, hparams).compile()
    setup.compile_seconds = time.perf_counter() - t_start
    return setup


def start_threads(setup: ThreadedSetup, shared: RunShared, outputs: queue.Queue) -> list[threading.Thread]:
    """Starts every sampler thread and the learner thread (last in the list); resets the run clock."""
    placement = setup.placement
    threads = [
        threading.Thread(
            target=sampler_loop,
            name=f"ppo_async-sampler-{s}",
            args=(shared, s, setup.rollout_fn, setup.env_states[s], setup.sampler_keys[s], placement.sampler_devices[s]),
            daemon=True,
        )
        for s in range(setup.config.threaded.num_samplers)
    ]
    threads.append(
        threading.Thread(
            target=learner_loop,
            name="ppo_async-learner",
            args=(shared, setup.update, setup.merge, setup.place_trajectory, setup.train_state, setup.learner_key,
                  setup.hparams, outputs),
            daemon=True,
        )
    )
    shared.start = time.perf_counter()
    for thread in threads:
        thread.start()
    return threads


def stop_threads(shared: RunShared, threads: Sequence[threading.Thread], timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Asks every thread to stop, wakes the blocked ones and joins them all within `timeout_s`."""
    shared.stop.set()
    shared.buffer.close()
    shared.store.close()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0.0))


def close_host_envs(setup: ThreadedSetup, threads: Sequence[threading.Thread]) -> None:
    """Closes the samplers' host-side simulators (Gymnasium); a sampler thread still running
    after the join timeout keeps its own, which the process exit closes."""
    for state, thread in zip(setup.env_states, threads):
        if isinstance(state, host_rollout.HostVectorEnv) and not thread.is_alive():
            state.close()


def watch(shared: RunShared, learner_thread: threading.Thread, outputs: queue.Queue, log: Callable) -> bool:
    """Logs learner outputs until the learner is done, a thread fails or Ctrl-C; True if interrupted."""
    ctrl_c = threading.Event()
    try:
        with _ctrl_c_sets(ctrl_c):
            while (learner_thread.is_alive() or not outputs.empty()) and not ctrl_c.is_set():
                try:
                    item = outputs.get(timeout=POLL_S)
                except queue.Empty:
                    if shared.errors:  # a failed thread or peer process: the learner may be stuck in a
                        break  # collective with that peer, so do not wait for it to end
                    continue
                log(item)
                if shared.errors:
                    break
        return ctrl_c.is_set()
    except KeyboardInterrupt:  # raised by a callback, or outside the main thread
        return True


def raise_thread_errors(shared: RunShared, threads: Sequence[threading.Thread]) -> None:
    """Re-raises the first thread failure in the caller (with its traceback); or names stuck threads."""
    stuck = describe_stuck(shared, threads)
    if shared.errors:  # the first, unless a peer process failed: that is the cause of the others
        name, exc, tb = next((e for e in shared.errors if isinstance(e[1], DistributedFailure)), shared.errors[0])
        if isinstance(exc, DistributedFailure):
            raise exc
        if isinstance(exc, (NonFiniteError, ConfigError, TimeoutError)):
            exc.add_note(f"(raised in thread ppo_async-{name})")
            if stuck:
                exc.add_note(stuck)
            raise exc
        raise ThreadFailure(f"thread {name} failed: {exc!r}\n--- traceback of {name} ---\n{tb}") from exc
    if stuck:
        raise TimeoutError(stuck)


def describe_stuck(shared: RunShared, threads: Sequence[threading.Thread]) -> str:
    """"" when every thread stopped; else a message naming each thread still alive and what it
    was doing (a sampler's phase and for how long), e.g. inside an env that never returns."""
    now = time.perf_counter()
    parts = []
    for thread in threads:
        if not thread.is_alive():
            continue
        sampler = thread.name.rpartition("-")[2]
        if thread.name.startswith("ppo_async-sampler-") and sampler.isdigit():
            stats = shared.stats[int(sampler)]
            parts.append(f"{thread.name} (in {stats.phase} for {now - stats.phase_since:.1f}s)")
        else:
            parts.append(thread.name)
    if not parts:
        return ""
    return (f"threads still running {JOIN_TIMEOUT_S:.0f}s after the stop: {', '.join(parts)}. A Python thread stuck "
            "in foreign code (an env step that never returns) cannot be killed: it stays until the process exits; "
            "the run directory was finalised with the rows recorded so far")


def run_threaded(config: Config, recorder: RunRecorder, resume: bool = False) -> TrainResult:
    """Runs the threaded mode (one seed) and returns a `TrainResult`.

    Raises ConfigError for a bad config (num_seeds != 1, devices), ThreadFailure (or the
    thread's ConfigError / TimeoutError) when a thread fails, NonFiniteError when a row holds
    NaN/inf, TimeoutError when the learner starves for `threaded.timeout_s`, and
    KeyboardInterrupt after a clean stop on Ctrl-C (rows, schedule and a final checkpoint kept).
    With several processes (`distributed.*`), `distributed.DistributedFailure` when another
    process failed or died (naming it), after this process stopped cleanly.
    """
    if resume:
        raise ConfigError("resume is not supported for mode='threaded' (its lag depends on timing)")
    if config.num_seeds != 1:
        raise ConfigError(f"num_seeds = {config.num_seeds} is invalid for mode='threaded': must be 1")
    if not distributed.is_multi_process(config):
        return _run_threaded(config, recorder, None)
    exchange = distributed.Exchange(config)
    try:
        result = _run_threaded(config, recorder, exchange)
        exchange.mark_done()
        return result
    except BaseException as exc:  # noqa: BLE001 - named, then re-raised
        blamed = exchange.blame(exc)
        if blamed is exc:
            raise
        raise blamed from exc
    finally:
        exchange.stop_heartbeat()


def _open_recorder(recorder: RunRecorder, exchange: "distributed.Exchange | None") -> None:
    """Opens the recorder; with several processes, process 0 first (it makes the run
    directory, then tells the others), the others once it has."""
    if exchange is None:
        recorder.open()
        return
    if exchange.process_id != 0:
        exchange.wait_run_dir()
        recorder.open()
        return
    try:
        recorder.open()
    except BaseException as exc:
        exchange.announce_run_dir(f"{type(exc).__name__}: {exc}")
        raise
    exchange.announce_run_dir("ok")


def _run_threaded(config: Config, recorder: RunRecorder, exchange: "distributed.Exchange | None") -> TrainResult:
    setup = make_threaded_setup(config)
    shared = setup.shared()
    if exchange is not None:  # a peer that dies stops this run like a failing thread (before JAX aborts it)
        exchange.start_heartbeat(lambda message: _record_failure(shared, "peer", DistributedFailure(message)))
    outputs: queue.Queue = queue.Queue(maxsize=LOG_QUEUE_SIZE)
    shared.keeps_state = recorder.wants_state

    def log(item: LearnerOutput) -> None:
        row = {**recorder.labels[0], **item.row}  # labels (seed; config_id and grid values in a sweep) lead
        records = item.records
        if exchange is not None:  # process 0 records every process's iteration, the others their own
            merged = exchange.iteration_rows(row, records, config, should_stop=lambda: bool(shared.errors))
            if merged is None:
                return
            recorder.log_line(distributed.process_line(item.row))
            row, records = merged
        recorder.record([row], row["iteration"], state=lambda: threaded_checkpoint(item.train_state))
        recorder.append_schedule(VERSION_SCHEDULE_FILE, records)  # flushed per iteration: a SIGKILL keeps it

    _open_recorder(recorder, exchange)
    with recorder:
        m = setup.memory
        recorder.announce(f"ring buffer {m['buffer_bytes'] / 2**20:.1f} MB on {m['buffer_device']}, parameter snapshot "
                          f"{m['snapshot_bytes_per_sampler'] / 2**10:.1f} KB per sampler")
        threads = start_threads(setup, shared, outputs)
        try:
            interrupted = watch(shared, threads[-1], outputs, log)
        finally:  # (several processes: a learner stuck in a collective with a dead peer is not waited for)
            stop_threads(shared, threads, JOIN_TIMEOUT_S if exchange is None else 1.0)
            close_host_envs(setup, threads)
        if not shared.errors:
            while not outputs.empty():  # rows finished before the stop still count
                log(outputs.get_nowait())
        if shared.last_put_state is not None:  # the state of the last logged iteration
            recorder.final_checkpoint(lambda: threaded_checkpoint(shared.last_put_state))
            if exchange is not None:  # replicas must agree: each process logs its params' digest
                recorder.log_line(f"final params sha256 {distributed.params_digest(shared.last_put_state.params)} "
                                  f"at iteration {recorder.last_iteration}")
    raise_thread_errors(shared, threads)
    if interrupted:
        raise KeyboardInterrupt(f"threaded run stopped cleanly after {recorder.last_iteration} learner iterations")
    final_state = shared.last_put_state if shared.last_put_state is not None else setup.train_state
    return recorder.result(
        threaded_checkpoint(final_state).train_state,
        setup.compile_seconds,
        extras={"version_schedule": recorder.schedule_records(VERSION_SCHEDULE_FILE), "sampler_stats": shared.stats,
                "placement": setup.placement, "log_queue_max": shared.max_queue_depth, "device_memory": setup.memory},
    )


MODE = register_mode(
    Mode(
        name="threaded",
        run=run_threaded,
        checkpoint_like=threaded_checkpoint_like,
        resumable=False,
        why_not_resumable="its lag depends on timing",
    )
)
