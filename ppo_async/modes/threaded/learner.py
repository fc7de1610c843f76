"""The learner thread: take a batch of chunks, update, publish the new params, account for every
sample, hand the metrics row to the logging thread; and the online KL controller's step (its
lag knobs go to the samplers, its learning-rate scale into the learner's `Hyperparams`). A
resumed run's learner starts from its checkpoint (`resume.LearnerStart`): its iterations,
version, sample totals and wall time continue from there."""

from __future__ import annotations

import math
import queue
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from ppo_async.config import Config
from ppo_async.core import kl_control
from ppo_async.core.lag import schedule_record
from ppo_async.core.types import TrainState, snapshot_of
from ppo_async.modes.threaded.liveness import DEVICE, WAIT, WORK
from ppo_async.modes.threaded.resume import LearnerStart
from ppo_async.modes.threaded.shared import POLL_S, LearnerOutput, LearnerState, RunShared, SamplerStats
from ppo_async.report.metrics import to_python
from ppo_async.runtime import distributed
from ppo_async.runtime.buffer import ChunkTag


def controller_limits(config: Config) -> kl_control.ControllerLimits | None:
    """The KL controller's target, window, quantile and bounds (`threaded.kl_target`); None when it is off."""
    tcfg = config.threaded
    if tcfg.kl_target is None:
        return None
    return kl_control.ControllerLimits(tcfg.kl_target, tcfg.effective_kl_window, config.effective_num_samplers, tcfg.refresh_lag,
                                       config.lag.max_lag, config.ppo.learning_rate, tcfg.effective_kl_quantile)


def kl_sample(metrics: Mapping[str, Any], consumed: int) -> kl_control.KlSample:
    """The iteration's approx_kl and its parts (`kl_staleness`, `kl_update`) for the controller;
    NaN when every sample was stale (no KL was measured)."""
    if consumed <= 0:
        return kl_control.KlSample(math.nan, math.nan, math.nan)
    return kl_control.KlSample(float(metrics["approx_kl"]), float(metrics["kl_staleness"]), float(metrics["kl_update"]))


def supply_of(accounting: Mapping[str, int]) -> kl_control.Supply:
    """The run's totals the controller weighs a max_lag by: transitions produced, and those a
    max_lag wasted (discarded by forced refreshes, dropped by the learner's stale filter)."""
    return kl_control.Supply(int(accounting["samples_produced"]),
                             int(accounting["dropped_forced_refresh"]) + int(accounting["dropped_stale_total"]))


def control_lag(shared: RunShared, limits: kl_control.ControllerLimits, state: kl_control.ControllerState,
                metrics: Mapping[str, Any], consumed: int, elapsed_s: float,
                accounting: Mapping[str, int]) -> kl_control.ControllerState:
    """One KL-controller step after a learner iteration: feeds it the iteration's KL parts,
    lag_max, each sampler's rate while it ran and the run's sample totals (`threaded_accounting`),
    and puts its lag knobs in force for the samplers (the learning rate is the learner's:
    `controlled_hparams`)."""
    now = shared.start + elapsed_s
    rates = [s.produced / max(elapsed_s - s.paused_seconds(now), 1e-9) for s in shared.stats]
    state = kl_control.step(limits, state, kl_sample(metrics, consumed), int(metrics["lag_max"]), rates,
                            supply_of(accounting))
    shared.knobs = state.knobs
    return state


def with_max_lag(hparams: Any, max_lag: int | None) -> Any:
    """`hparams` with the learner's stale filter at `max_lag` (None: off), placed as before."""
    value = np.float32(np.inf if max_lag is None else max_lag)
    return hparams._replace(max_lag=jax.device_put(value, hparams.max_lag.sharding))


def with_learning_rate(hparams: Any, learning_rate: float) -> Any:
    """`hparams` with the learning rate the schedule starts from (`learning_rate_at` scales it),
    placed as before."""
    return hparams._replace(learning_rate=jax.device_put(np.float32(learning_rate), hparams.learning_rate.sharding))


def controlled_hparams(hparams: Any, config: Config, state: kl_control.ControllerState) -> Any:
    """`hparams` as the KL controller's state wants them: the stale filter at its max_lag and the
    learning rate ppo.learning_rate x its scale (each replaced only where it differs from the
    config's, so a run whose controller has not moved them keeps the config's arrays)."""
    if state.knobs.max_lag != config.lag.max_lag:
        hparams = with_max_lag(hparams, state.knobs.max_lag)
    if state.lr_scale != 1.0:
        hparams = with_learning_rate(hparams, config.ppo.learning_rate * state.lr_scale)
    return hparams


def threaded_accounting(
    buffer_counters: Mapping[str, int], chunk_size: int, discarded: int, consumed: int, dropped_stale: int,
    start: LearnerStart = LearnerStart(),
) -> dict[str, int]:
    """The sample accounting of a threaded run at one instant (pure).

    Args:
      buffer_counters: `RingBuffer.counters()`: chunks `added`, `overwritten`, resident `size`.
      chunk_size: transitions per chunk.
      discarded: transitions discarded by forced refreshes (all samplers of this process).
      consumed: transitions the learner consumed so far (a resumed run's included).
      dropped_stale: transitions the learner dropped as staler than `lag.max_lag` so far (likewise).
      start: a resumed run's totals at its checkpoint (the buffer's and samplers' counters
        start again from 0); a fresh run's are zeros.

    Returns:
      `samples_produced = samples_consumed + samples_dropped + samples_resident` (by
      construction when nothing is lost) and the kinds of drop; a resumed run's rows add
      `dropped_at_resume`, the samples resident in the buffer when a run stopped.
    """
    overwritten = start.overwritten + buffer_counters["overwritten"] * chunk_size
    forced = start.forced + discarded
    accounting = {
        "samples_produced": start.produced + buffer_counters["added"] * chunk_size + discarded,
        "samples_consumed": consumed,
        "samples_dropped": forced + overwritten + dropped_stale + start.lost,
        "samples_resident": buffer_counters["size"] * chunk_size,
        "dropped_forced_refresh": forced,
        "dropped_overwritten": overwritten,
        "dropped_stale_total": dropped_stale,
    }
    if start.resumed:
        accounting["dropped_at_resume"] = start.lost
    return accounting


LEARNER_PHASES = {
    "learner_handover_s": "the previous iteration's hand-over of its row to the logging thread (waits while the "
                          "logger is behind: back-pressure)",
    "learner_place_s": "merging the batch's chunks and placing them on the learner devices",
    "learner_update_s": "the update program: SGD steps and, with several devices or processes, their collectives",
    "learner_fetch_s": "copying the update's metrics and counters to the host",
    "learner_publish_s": "publishing the new params to the samplers",
}
"""The learner's time per iteration by phase (row fields, seconds); with `learner_wait_s` (waiting
for the batch) they add up to the iteration's time."""


@dataclass(frozen=True)
class IterationTimes:
    """perf_counter instants of one learner iteration: run start, iteration start, batch taken, update done."""

    start: float
    tick: float
    got: float
    done: float


def _sampler_columns(sampler_stats: Sequence[SamplerStats], elapsed: float, now: float) -> dict[str, list]:
    """The per-sampler list columns of a row: rates and where each sampler's time went."""
    return dict(
        sampler_steps_per_second=[s.produced / max(elapsed, 1e-9) for s in sampler_stats],
        sampler_rollout_s=[s.rollout_s for s in sampler_stats],
        sampler_wait_params_s=[s.wait_params_s for s in sampler_stats],
        sampler_wait_buffer_s=[s.wait_buffer_s for s in sampler_stats],  # = lock + space + write
        sampler_wait_space_s=[s.put_timings["space_s"] for s in sampler_stats],
        sampler_write_s=[s.put_timings["write_s"] for s in sampler_stats],
        sampler_latency_s=[s.latency_s for s in sampler_stats],
        sampler_forced_refreshes=[s.forced_refreshes for s in sampler_stats],
        sampler_paused_s=[s.paused_seconds(now) for s in sampler_stats],
    )


def learner_row(
    config: Config,
    metrics: Mapping[str, Any],
    *,
    iteration: int,
    tags: Sequence[ChunkTag],
    learner_version: int,
    sgd_steps: int,
    accounting: Mapping[str, int],
    buffer_fill: float,
    times: IterationTimes,
    sampler_stats: Sequence[SamplerStats],
    phases: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One threaded metrics row (pure): the update's metrics plus versions, timing, accounting, samplers.

    `tags` are the consumed chunks' tags; with one chunk `sampler_id` / `behavior_version` are
    scalars, else lists. `env_steps` counts the samples the learner took (consumed + dropped
    as stale). `phases` (seconds, `LEARNER_PHASES`) says where the learner's iteration went.
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
        sampler_id=tags[0].sampler_id if one else [t.sampler_id for t in tags],
        behavior_version=int(tags[0].policy_version) if one else [int(t.policy_version) for t in tags],
        buffer_fill=buffer_fill,
        learner_busy_fraction=(times.done - times.got) / iteration_s,
        learner_wait_s=times.got - times.tick,
        **accounting,
        **(phases or {}),
        **_sampler_columns(sampler_stats, elapsed, times.done),
    )
    return row


def take_batch(shared: RunShared, iteration: int) -> list | None:
    """`chunks_per_batch` `(chunk, ChunkTag)` items from the buffer; None when the run is stopping.

    Waits as long as the samplers take (in POLL_S slices, seeing a stop at once): a slow
    sampler is not a failure; a stuck or dead one is, by the watch (`liveness`). Raises
    AssertionError when a barrier batch does not hold one rollout of every sampler.
    """
    tcfg = shared.config.threaded
    shared.learner_heartbeat.enter("data", WAIT)
    items: list = []
    while len(items) < shared.config.effective_chunks_per_batch:
        if shared.stop.is_set():
            return None
        item = shared.buffer.get_tagged(timeout=POLL_S)
        if item is not None:
            items.append(item)
    samplers = sorted(tag.sampler_id for _, tag in items)
    if tcfg.barrier and samplers != list(range(shared.config.effective_num_samplers)):
        raise AssertionError(f"barrier broken at iteration {iteration}: batch from samplers {samplers}")
    return items


class Learner:
    """The learner thread's state across iterations: train state, key, traced hyperparameters,
    running totals and the KL controller's state; all of it restored in a resumed run (`start`)."""

    def __init__(self, shared: RunShared, update: Callable, merge: Callable, place_trajectory: Callable,
                 train_state: TrainState, key: jax.Array, hparams: Any, out: "queue.Queue[LearnerOutput]",
                 start: LearnerStart = LearnerStart()) -> None:
        self.shared, self.update, self.merge, self.place_trajectory, self.out = shared, update, merge, place_trajectory, out
        self.train_state, self.key, self.hparams, self.start = train_state, key, hparams, start
        self.consumed_total, self.dropped_stale_total = start.consumed, start.stale
        self.version = int(jax.device_get(distributed.local_value(train_state.version)))
        self.phases: dict[str, float] = dict.fromkeys(LEARNER_PHASES, 0.0)
        self.limits = controller_limits(shared.config)
        self.control = None if self.limits is None else (start.control or kl_control.initial_state(self.limits))
        if self.control is not None:  # the stale filter and learning rate as the controller left them
            self.hparams = controlled_hparams(hparams, shared.config, self.control)

    def run(self) -> None:
        """The thread's body: every iteration after the start's, until done or stopped; a failure
        is recorded in `shared` (which stops every thread)."""
        try:
            for iteration in range(self.start.iteration + 1, self.shared.config.num_iterations + 1):
                if not self.iteration(iteration):
                    return
        except BaseException as exc:  # noqa: BLE001
            self.shared.fail("learner", exc)

    def iteration(self, iteration: int) -> bool:
        """Take, update, publish, account, hand over; False when the run is stopping."""
        shared, heartbeat, offset = self.shared, self.shared.learner_heartbeat, self.start.wall_time
        tick = time.perf_counter()
        items = take_batch(shared, iteration)
        if items is None:
            return False
        got = time.perf_counter()
        shared.learner_updating.set()  # until the new version is published (the samplers' freshness gate)
        tags = [tag for _, tag in items]
        version_before = self.version
        heartbeat.enter("update", DEVICE)  # one compiled program (collectives included): not judged
        metrics, sgd_steps = self._update([chunk for chunk, _ in items])
        heartbeat.beat()
        heartbeat.enter("account", WORK)
        times = IterationTimes(shared.start, tick, got, time.perf_counter())
        row = self._row(metrics, iteration, tags, version_before, sgd_steps, times)
        records = [schedule_record(iteration, t.sampler_id, int(t.policy_version), version_before, t.made_at + offset,
                                   got - shared.start + offset) for t in tags]
        return self._hand_over(iteration, row, records)

    def _row(self, metrics: dict[str, Any], iteration: int, tags: list[ChunkTag], version_before: int,
             sgd_steps: int, times: IterationTimes) -> dict[str, Any]:
        """The iteration's row: the update's metrics, this process's sample accounting, the KL
        controller's step; a resumed run's wall time continues from its checkpoint's."""
        shared, config = self.shared, self.shared.config
        consumed, stale = int(metrics.pop("consumed")), int(metrics["dropped_stale"])
        if distributed.is_multi_process(config):  # the update counted every process's samples: account for this process's
            max_lag = config.lag.max_lag if self.control is None else self.control.knobs.max_lag  # the update's filter
            consumed, stale, metrics["lag_mean_local"] = distributed.local_take(tags, version_before, max_lag,
                                                                                config.chunk_size)
        self.consumed_total += consumed
        self.dropped_stale_total += stale
        counters = shared.buffer.counters()
        accounting = threaded_accounting(counters, config.chunk_size, sum(s.discarded for s in shared.stats),
                                         self.consumed_total, self.dropped_stale_total, self.start)
        row = learner_row(config, metrics, iteration=iteration, tags=tags, learner_version=self.version,
                          sgd_steps=sgd_steps, accounting=accounting, buffer_fill=counters["size"] / shared.buffer.capacity,
                          times=times, sampler_stats=shared.stats, phases=self.phases)
        if self.control is not None:  # the KL controller moves the lag knobs for what comes next
            row.update(self._control(metrics, consumed, times.done - shared.start, accounting))
        if self.start.resumed:  # the lag history before it is not replayed: the rows say where it restarted
            row["wall_time"] += self.start.wall_time
            row["resumed_at_iteration"] = self.start.iteration
        return row

    def _hand_over(self, iteration: int, row: dict[str, Any], records: list[dict[str, Any]]) -> bool:
        """Queues the row and records (and the learner's state when the logger needs it) for the
        logging thread; False when the run is stopping."""
        shared, heartbeat = self.shared, self.shared.learner_heartbeat
        state = LearnerState(self.train_state, self.key, self.control)
        keep = shared.keeps_state(iteration) or iteration == shared.config.num_iterations
        heartbeat.enter("handover", WAIT)
        handover = time.perf_counter()
        if not put_for_logger(shared, self.out, LearnerOutput(row, records, state if keep else None)):
            return False
        self.phases["learner_handover_s"] = time.perf_counter() - handover  # (in the next row)
        shared.last_put = LearnerOutput(row, [], state)
        heartbeat.beat()
        return True

    def _update(self, chunks: list) -> tuple[dict[str, Any], int]:
        """One update on the merged chunks; publishes the new params when the version moved.
        Returns `(metrics, sgd_steps)` on the host."""
        start = time.perf_counter()
        trajectory = self.place_trajectory(self.merge(chunks) if len(chunks) > 1 else chunks[0])
        self.key, update_key = jax.random.split(self.key)
        version_before = self.version
        placed = time.perf_counter()
        self.train_state, metrics = self.update(self.train_state, trajectory, update_key, self.hparams)
        jax.block_until_ready(metrics)
        updated = time.perf_counter()
        metrics, version, sgd_steps = jax.device_get((metrics, self.train_state.version, self.train_state.sgd_steps))
        fetched = time.perf_counter()
        self.version = int(version)
        if self.version > version_before:
            self.shared.store.publish(distributed.local_value(snapshot_of(self.train_state)))
        self.shared.learner_updating.clear()
        self.phases.update(learner_place_s=placed - start, learner_update_s=updated - placed,
                           learner_fetch_s=fetched - updated, learner_publish_s=time.perf_counter() - fetched)
        return dict(metrics), int(sgd_steps)

    def _control(self, metrics: Mapping[str, Any], consumed: int, elapsed_s: float,
                 accounting: Mapping[str, int]) -> dict[str, Any]:
        """The KL controller's step; the learner's stale filter follows its max_lag and its
        learning rate its scale from the next iteration on. Returns its metrics."""
        before = self.control
        self.control = control_lag(self.shared, self.limits, self.control, metrics, consumed, elapsed_s, accounting)
        if self.control.knobs.max_lag != before.knobs.max_lag:
            self.hparams = with_max_lag(self.hparams, self.control.knobs.max_lag)
        if self.control.lr_scale != before.lr_scale:
            self.hparams = with_learning_rate(self.hparams, self.shared.config.ppo.learning_rate * self.control.lr_scale)
        return kl_control.controller_metrics(self.control)


def learner_loop(shared: RunShared, update: Callable, merge: Callable, place_trajectory: Callable,
                 train_state: TrainState, key: jax.Array, hparams: Any, out: "queue.Queue[LearnerOutput]",
                 start: LearnerStart = LearnerStart()) -> None:
    """Body of the learner thread (`Learner(...).run()`)."""
    Learner(shared, update, merge, place_trajectory, train_state, key, hparams, out, start).run()


def put_for_logger(shared: RunShared, out: queue.Queue, item: LearnerOutput) -> bool:
    """Queue `item` for the logging thread, waiting while the bounded queue is full; False on stop."""
    while not shared.stop.is_set():
        try:
            out.put(item, timeout=POLL_S)
        except queue.Full:
            continue
        shared.max_queue_depth = max(shared.max_queue_depth, out.qsize())
        return True
    return False
