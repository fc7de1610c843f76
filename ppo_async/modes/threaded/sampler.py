"""The sampler thread: refresh its params snapshot, make a rollout, deliver it to the buffer.

A `Sampler` holds one thread's state (its snapshot and version, env states, RNG, the learner
iteration its next chunk is for in a barrier run) and does one of three things per step, each a
method: `refresh` (pull newer params when the rules say so: `lag.should_refresh`, the latest
after a KL-controller pause), `make` (a rollout plus the simulated env latency) and `deliver`
(into the ring buffer, unless the chunk would be stale when consumed: then it is discarded as a
forced refresh, counted).

In a barrier run (`threaded.barrier`) a sampler follows the run's `LagPlan` instead
(`scheduled_step`): one chunk per learner iteration, made with the exact version the lag
schedule gives (the latest with the default schedule, lag 0), delivered in sampler order.
"""

from __future__ import annotations

import random
import time
from typing import Any, Callable

import jax

from ppo_async.core import kl_control
from ppo_async.core.host_rollout import HOST_ENV_TYPES
from ppo_async.core.lag import is_stale, must_force_refresh, should_refresh
from ppo_async.modes.threaded.liveness import DEVICE, WAIT, WORK, BeatingEnv
from ppo_async.modes.threaded.shared import POLL_S, LagPlan, RunShared
from ppo_async.runtime.buffer import ChunkTag
from ppo_async.runtime.param_store import ParamStore


class FreshnessGate:
    """`admit(resident, consumer_waiting)` for `RingBuffer.put`: a chunk made with `version` goes
    in only if it will still be within `max_lag` versions when the learner consumes it, which
    is at the latest version, plus one while the learner is updating (`updating()`: it took a
    batch and has not published yet) and no consumer waits, plus one per batch of chunks
    resident ahead of it. `refused` says whether it said no. (Counting the learner's
    bookkeeping between a publish and its next take as updating refused 7-14% of the rollouts
    of a run at max_lag 1 on a loaded machine.)"""

    def __init__(self, store: ParamStore, version: int, max_lag: int, chunks_per_batch: int,
                 updating: Callable[[], bool]) -> None:
        self.store, self.version, self.max_lag, self.chunks_per_batch = store, version, max_lag, chunks_per_batch
        self.updating = updating
        self.refused = False

    def __call__(self, resident: int, consumer_waiting: bool) -> bool:
        busy = not consumer_waiting and self.updating()
        consumed_at = self.store.latest_version() + int(busy) + resident // self.chunks_per_batch
        admitted = not is_stale(consumed_at - self.version, self.max_lag)
        self.refused = self.refused or not admitted
        return admitted


class Sampler:
    """One sampler thread: `run()` loops refresh / make / deliver until the run stops."""

    def __init__(self, shared: RunShared, sampler_id: int, rollout_fn: Callable, env_state: Any, key: jax.Array,
                 device: Any) -> None:
        self.shared, self.sampler_id, self.rollout_fn, self.env_state, self.key, self.device = (
            shared, sampler_id, rollout_fn, env_state, key, device)
        self.stats = shared.stats[sampler_id]
        # liveness: a host simulator beats at every step (a slow one is alive); a JAX env's
        # rollout is one compiled program, which beats when it returns
        self.rollout_kind = WORK if isinstance(env_state, HOST_ENV_TYPES) else DEVICE
        if self.rollout_kind == WORK:
            self.env_state = BeatingEnv(env_state, self.stats.heartbeat)
        tcfg = shared.config.threaded
        self.latency_ms = tcfg.sampler_step_latency_ms[sampler_id] if tcfg.sampler_step_latency_ms else 0.0
        self.rng = random.Random(shared.config.seed * 1000 + sampler_id)
        self.snapshot = shared.store.get_if_newer(None, device)
        self.version = int(self.snapshot.version)
        self.last_refresh = time.perf_counter()
        self.paused = False
        self.reserved = False  # holds a place in the buffer for the rollout it is making (`_no_room`)
        self.rollout_s = 0.0  # seconds a rollout of this sampler takes (EWMA, simulated latency included)
        # barrier: the learner iteration (0-based) this sampler's next chunk is for
        self.next_iteration = shared.plan.first_iteration if shared.plan is not None else 0

    def run(self) -> None:
        """The thread's body; a failure is recorded in `shared` (which stops every thread)."""
        try:
            while not self.shared.stop.is_set():
                self.step()
        except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
            self.shared.fail(f"sampler-{self.sampler_id}", exc)

    def step(self) -> None:
        """One pass: wait while paused or without room, else refresh, make and deliver a rollout
        (a barrier run: the next chunk of its plan)."""
        if self.shared.plan is not None:
            self.scheduled_step(self.shared.plan)
            return
        knobs = self.shared.knobs
        if not knobs.active[self.sampler_id]:  # paused by the KL controller
            self._pause_slice()
            return
        self.stats.pause_ended(time.perf_counter())  # running: a pause in progress (if any) is over
        if self._no_room(knobs):
            return
        self.refresh(knobs)
        trajectory, made_at = self.make()
        if must_force_refresh(self.version, self.shared.store.latest_version(), self.shared.knobs.max_lag):
            self.force_refresh()  # the rollout just made is too stale: discarded (counted)
            return
        self.deliver(trajectory, made_at)
        self._release()  # not put (the run stopped first): its place goes back

    def scheduled_step(self, plan: LagPlan) -> None:
        """One chunk of a barrier run: for the next learner iteration t, wait until the plan lets
        this sampler start, act with the snapshot of exactly `plan.version_for(t, s)` (params
        and normalisation statistics of one version), make the rollout, deliver it in its turn.
        Returns after one POLL_S slice of waiting, so a stop is seen."""
        t = self.next_iteration
        if t >= plan.num_iterations:  # every chunk of the run delivered: nothing left to make
            self.stats.enter("done", WAIT)
            self.shared.stop.wait(POLL_S)
            return
        if not self._take_scheduled(plan, t):
            return
        trajectory, made_at = self.make()
        if self._wait_turn(plan, t) and self.deliver(trajectory, made_at):
            plan.delivered(t, self.sampler_id)
            self.next_iteration = t + 1

    def _take_scheduled(self, plan: LagPlan, t: int) -> bool:
        """Waits (one POLL_S slice) for the learner to publish `plan.ready_version(t, s)`; then
        holds the snapshot of chunk t's scheduled version. False while still waiting."""
        stats, store = self.stats, self.shared.store
        t0 = time.perf_counter()
        stats.enter("params", WAIT)  # waiting for the learner: not stuck (`liveness`)
        ready = store.wait_for_version(plan.ready_version(t, self.sampler_id), timeout=POLL_S)
        stats.wait_params_s += time.perf_counter() - t0
        if not ready:
            return False
        version = plan.version_for(t, self.sampler_id)
        if version != self.version:
            # held by the store's ring: the learner is at most lags[t, s] versions past it (LagPlan)
            self.snapshot, self.version = store.get_version(version, self.device), version
            self.last_refresh = time.perf_counter()
            stats.refreshes += 1
        return True

    def _wait_turn(self, plan: LagPlan, t: int) -> bool:
        """Waits until the chunks before this one are delivered (the batch's sampler order);
        counted as waiting for params (the barrier's cost). False when the run stops first."""
        t0 = time.perf_counter()
        self.stats.enter("turn", WAIT)
        try:
            while not self.shared.stop.is_set():
                if plan.wait_turn(t, self.sampler_id, timeout=POLL_S):
                    return True
            return False
        finally:
            self.stats.wait_params_s += time.perf_counter() - t0

    def refresh(self, knobs: kl_control.LagKnobs) -> None:
        """Pulls the latest params when due (`lag.should_refresh`, or after a pause)."""
        stats, tcfg = self.stats, self.shared.config.threaded
        t0 = time.perf_counter()
        stats.enter("params", WAIT)
        if self.paused:  # resumed: its params are as old as the pause; pull the latest
            self._pull(t0)
            self.paused = False
        elif should_refresh(self.version, self.shared.store.latest_version(), knobs.refresh_lag,
                            t0 - self.last_refresh, tcfg.min_refresh_interval_s):
            self._pull(t0)

    def make(self) -> tuple[Any, float]:
        """One rollout with the current snapshot: `(trajectory, delivery instant)` (after the
        simulated env latency, if any)."""
        stats = self.stats
        t0 = time.perf_counter()
        stats.enter("rollout", self.rollout_kind)
        self.key, rollout_key = jax.random.split(self.key)
        self.env_state, trajectory = self.rollout_fn(self.snapshot, self.env_state, rollout_key)
        jax.block_until_ready(trajectory.transitions.reward)
        stats.heartbeat.beat()
        made_at = time.perf_counter()
        stats.rollout_s += made_at - t0
        if self.latency_ms > 0:
            made_at = self._env_latency()
        seconds = made_at - t0
        self.rollout_s = seconds if self.rollout_s == 0.0 else 0.5 * (self.rollout_s + seconds)
        return trajectory, made_at

    def deliver(self, trajectory: Any, made_at: float) -> bool:
        """Puts the chunk into the buffer (on the buffer's device); a chunk the freshness gate
        refuses (it would be staler than lag.max_lag when consumed) is discarded here as a
        forced refresh rather than put in to be dropped by the learner. True when it went in."""
        shared, stats, tcfg = self.shared, self.stats, self.shared.config.threaded
        # to the buffer's device (a no-op put costs ~0.15 ms per chunk: skip it on one device)
        chunk = trajectory if self.device == shared.buffer_device else jax.device_put(trajectory, shared.buffer_device)
        stats.enter("put", WAIT)
        max_lag = shared.knobs.max_lag
        gate = None if tcfg.barrier or max_lag is None else FreshnessGate(
            shared.store, self.version, max_lag, shared.config.effective_chunks_per_batch, shared.learner_updating.is_set)
        tag = ChunkTag(self.sampler_id, made_at - shared.start, self.version)
        while not shared.stop.is_set():
            if shared.buffer.put(chunk, timeout=POLL_S, tag=tag, admit=gate, timings=stats.put_timings,
                                 reserved=self.reserved):
                self.reserved = False  # the put ended the reservation
                stats.produced += shared.config.chunk_size
                stats.heartbeat.beat()
                return True
            if gate is not None and gate.refused:
                self.force_refresh()
                return False
        return False

    def force_refresh(self) -> None:
        """Counts the rollout just made as discarded and pulls the latest params."""
        stats, chunk_size = self.stats, self.shared.config.chunk_size
        stats.produced += chunk_size
        stats.discarded += chunk_size
        stats.forced_refreshes += 1
        self._release()
        self._take_latest()

    def _release(self) -> None:
        """Gives back the buffer place reserved for the rollout (if any) that will not be put."""
        if self.reserved:
            self.shared.buffer.release()
            self.reserved = False

    def _take_latest(self) -> None:
        """The store's latest params if newer than the sampler's; the refresh clock restarts."""
        self.snapshot = self.shared.store.get_if_newer(self.version, self.device) or self.snapshot
        self.version, self.last_refresh = int(self.snapshot.version), time.perf_counter()

    def _pull(self, t0: float) -> None:
        """Takes the latest params (if newer) as a refresh begun at `t0`."""
        self._take_latest()
        self.stats.refreshes += 1
        self.stats.wait_params_s += self.last_refresh - t0

    def _pause_slice(self) -> None:
        """One POLL_S slice of a sampler paused by the KL controller (its pause timed from the
        first slice: `SamplerStats.paused_seconds`)."""
        self.stats.pause_began(time.perf_counter())
        self.stats.enter("paused", WAIT)
        self.paused = True
        self.shared.stop.wait(POLL_S)

    def _no_room(self, knobs: kl_control.LagKnobs) -> bool:
        """With a freshness bound (`max_lag`, full_policy "block"): True after waiting one POLL_S
        slice while a rollout started now would be staler than max_lag when consumed, else
        reserves a place in the buffer for it. A chunk's lag is the learner's updates between
        the snapshot that made it and its consumption, which come from two places:

        - the chunks committed ahead of it, each 1 / chunks_per_batch of an update: at most
          max(1, max_lag) x chunks_per_batch may be committed - resident, or in the making by
          samplers that reserved a place (`RingBuffer.reserve`) - which bounds the lag where the
          samplers out-produce the learner;
        - the updates made while it is being made: this sampler's rollout seconds x the
          learner's versions per second (`ParamStore.version_rate`) must not pass max_lag, which
          bounds the lag where rollouts span several learner iterations and holds back a
          straggler whose rollouts would all be stale (the learner slows as samplers hold back,
          so a sampler waits only while the others keep it busy).

        So the sampler waits (counted as waiting for space) instead of making a rollout the
        freshness gate would discard. Before it did, 8 samplers on Hopper-v5 with 5 ms per env
        step had a mean lag of ~8 whatever the buffer and a max_lag could only discard
        (`experiments/kl_controller.py`, the hopper task). overwrite_oldest never waits: its new
        chunks replace old ones."""
        tcfg = self.shared.config.threaded
        if tcfg.barrier or knobs.max_lag is None or tcfg.full_policy != "block":
            return False
        t0 = time.perf_counter()
        self.stats.enter("put", WAIT)
        if self.rollout_s * self.shared.store.version_rate() > knobs.max_lag:
            self.shared.stop.wait(min(POLL_S, self.rollout_s / 8))  # the rate is measured again soon
        else:
            depth = max(1, knobs.max_lag) * self.shared.config.effective_chunks_per_batch
            self.reserved = self.shared.buffer.reserve(depth, timeout=POLL_S)
        self.stats.put_timings["space_s"] += time.perf_counter() - t0
        return not self.reserved

    def _env_latency(self) -> float:
        """Sleeps the simulated env latency of one rollout (outside the GIL; wakes at once on
        stop), one beat per POLL_S slice as a slow simulator's steps would; returns the instant
        the chunk is delivered."""
        config, stats = self.shared.config, self.stats
        sleep = self.latency_ms * config.rollout.num_steps / 1000.0
        sleep *= 1.0 + config.threaded.latency_jitter * (2.0 * self.rng.random() - 1.0)
        t0 = time.perf_counter()
        stats.enter("latency", WORK)
        end = t0 + sleep
        while (left := end - time.perf_counter()) > 0 and not self.shared.stop.wait(min(left, POLL_S)):
            stats.heartbeat.beat()
        stats.latency_s += time.perf_counter() - t0
        return time.perf_counter()


def sampler_loop(shared: RunShared, sampler_id: int, rollout_fn: Callable, env_state: Any, key: jax.Array,
                 device: Any) -> None:
    """Body of one sampler thread (`Sampler(...).run()`)."""
    Sampler(shared, sampler_id, rollout_fn, env_state, key, device).run()
