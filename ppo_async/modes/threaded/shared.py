"""What the threads of one threaded run share: the run's state, each sampler's counters, a
barrier run's lag plan (`LagPlan`), the records that travel between threads (chunk tags, thread
errors, learner outputs)."""

from __future__ import annotations

import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np

from ppo_async.config import Config
from ppo_async.core import kl_control
from ppo_async.core.lag import scheduled_version
from ppo_async.core.types import TrainState
from ppo_async.modes.threaded.liveness import Heartbeat, StalledThread
from ppo_async.runtime.buffer import RingBuffer
from ppo_async.runtime.param_store import ParamStore

POLL_S = 0.1  # slice of every blocking wait, so a stop request is seen within this time


class ThreadFailure(RuntimeError):
    """A sampler or learner thread raised; the message carries the thread's name and traceback."""


class ThreadError(NamedTuple):
    """A failure recorded by a thread (or by the heartbeat of a multi-process run)."""

    thread: str  # "sampler-<i>", "learner" or "peer"
    exc: BaseException
    traceback: str


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
    # its progress and what it does now (params, rollout, latency, put, paused): `liveness`
    heartbeat: Heartbeat = field(default_factory=Heartbeat)

    @property
    def wait_buffer_s(self) -> float:
        """Seconds inside buffer puts: waiting for the lock, for space (block), and writing."""
        return sum(self.put_timings.values())

    def enter(self, phase: str, kind: str) -> None:
        """Marks what the sampler does next, of which `liveness` kind (named if it gets stuck there)."""
        self.heartbeat.enter(phase, kind)

    @property
    def phase(self) -> str:
        """What the sampler is doing now."""
        return self.heartbeat.current.name

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


def initial_knobs(config: Config) -> kl_control.LagKnobs:
    """The lag knobs a threaded run starts with: every sampler running, refresh_lag and max_lag as configured."""
    return kl_control.LagKnobs((True,) * config.effective_num_samplers, config.threaded.refresh_lag, config.lag.max_lag)


class LagPlan:
    """The lag schedule of a threaded barrier run and the order its chunks go into the buffer.

    Learner iteration t (0-based) takes one chunk from each of the S samplers; sampler s makes
    it with version `version_for(t, s)` (`lags[t, s]` versions behind the learner's version at
    consumption, `core.lag.scheduled_version`), and the chunks enter the buffer in the order
    (t, 0), (t, 1), ..., (t + 1, 0), ... (`wait_turn` / `delivered`): a batch holds iteration
    t's chunks in sampler order, whatever the timing (so a run is deterministic in its
    batches, and a sampler working ahead never slips into an earlier batch). A sampler starts
    chunk t once the learner has published `ready_version(t, s)`: its scheduled version, and
    no further ahead than `run_ahead` iterations (the buffer must hold every chunk made ahead).

    Invariant, where the ParamStore's ring is sized: when sampler s takes version
    `version_for(t, s)`, the learner is at most at the version that consumes iteration t (it
    cannot finish iteration t without this chunk), so at most max(lags) versions past it: a
    ring of max(lags) + 1 snapshots holds it.
    """

    def __init__(self, lags: np.ndarray, first_iteration: int = 0, first_version: int = 0, run_ahead: int = 0) -> None:
        self.lags = np.asarray(lags, np.int32)  # [I, S]: lag of sampler s's chunk in learner iteration t
        self.first_iteration, self.first_version = int(first_iteration), int(first_version)
        self.run_ahead = max(int(run_ahead), 0)
        self._turn = threading.Condition(threading.Lock())
        self._next = 0  # chunks delivered since first_iteration: the next one in turn

    @property
    def num_iterations(self) -> int:
        return int(self.lags.shape[0])

    @property
    def num_samplers(self) -> int:
        return int(self.lags.shape[1])

    @property
    def ring_size(self) -> int:
        """Param versions the store must keep: the largest lag still to come, plus one."""
        return int(self.lags[self.first_iteration:].max(initial=0)) + 1

    def consumed_at(self, iteration: int) -> int:
        """The learner's version when it consumes learner iteration `iteration`'s batch."""
        return self.first_version + iteration - self.first_iteration

    def version_for(self, iteration: int, sampler: int) -> int:
        """The version sampler `sampler` acts with for learner iteration `iteration`."""
        return scheduled_version(iteration, int(self.lags[iteration, sampler]), self.first_iteration, self.first_version)

    def ready_version(self, iteration: int, sampler: int) -> int:
        """The learner version after which the sampler may start that chunk."""
        return max(self.version_for(iteration, sampler), self.consumed_at(iteration) - self.run_ahead)

    def _index(self, iteration: int, sampler: int) -> int:
        return (iteration - self.first_iteration) * self.num_samplers + sampler

    def wait_turn(self, iteration: int, sampler: int, timeout: float) -> bool:
        """Blocks until every chunk before (iteration, sampler) is delivered: True then, False on timeout."""
        index, deadline = self._index(iteration, sampler), time.monotonic() + max(float(timeout), 0.0)
        with self._turn:
            while self._next < index:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._turn.wait(remaining)
            return True

    def delivered(self, iteration: int, sampler: int) -> None:
        """The chunk (iteration, sampler) is in the buffer: the next one's turn."""
        with self._turn:
            self._next = self._index(iteration, sampler) + 1
            self._turn.notify_all()


class LearnerState(NamedTuple):
    """The learner's state after an iteration: everything a resumed run restores."""

    train_state: TrainState  # params, optimiser, normalisation statistics, version and step counters
    key: Any  # the learner's RNG key for its next iteration
    control: kl_control.ControllerState | None  # the KL controller's state (None when it is off)


@dataclass
class RunShared:
    """What the threads of one run share."""

    config: Config
    store: ParamStore
    buffer: RingBuffer
    stop: threading.Event
    errors: list[ThreadError]
    stats: list[SamplerStats]
    buffer_device: Any
    start: float = field(default_factory=time.perf_counter)  # reset when the threads start
    keeps_state: Callable[[int], bool] = lambda iteration: False  # iterations whose state the logger needs
    last_put: "LearnerOutput | None" = None  # the last iteration handed to the logger, with its state
    learner_heartbeat: Heartbeat = field(default_factory=Heartbeat)
    logger_heartbeat: Heartbeat = field(default_factory=Heartbeat)  # the calling thread's
    max_queue_depth: int = 0  # most iterations ever waiting for the logger
    plan: LagPlan | None = None  # a barrier run's lag schedule and delivery order (None: lag from timing)
    learner_updating: threading.Event = field(default_factory=threading.Event)  # set from a batch's take to its publish
    # The lag knobs in force: the config's, replaced as a whole by the KL controller (readers
    # take one reference per step, so each sees a consistent set)
    knobs: kl_control.LagKnobs = field(init=False)

    def __post_init__(self) -> None:
        self.knobs = initial_knobs(self.config)

    def heartbeats(self) -> dict[str, Heartbeat]:
        """Every thread's heartbeat by name: "sampler-<i>", "learner", "logger"."""
        named = {f"sampler-{i}": s.heartbeat for i, s in enumerate(self.stats)}
        return {**named, "learner": self.learner_heartbeat, "logger": self.logger_heartbeat}

    def restart_heartbeats(self, now: float) -> None:
        """The run's clock starts (`start_threads`): every thread's silence is counted from `now`."""
        for heartbeat in self.heartbeats().values():
            heartbeat.restart(now)

    def fail(self, thread: str, exc: BaseException) -> None:
        """Records a thread's failure (with the traceback being handled) and stops every thread."""
        self.errors.append(ThreadError(thread, exc, traceback.format_exc()))
        self.stop.set()

    def fail_stalled(self, thread: str, message: str) -> None:
        """Records the watch's verdict that `thread` is stuck or dead (`liveness.find_stall`) and
        stops every thread; the error is a `StalledThread` with that one-line message."""
        self.errors.append(ThreadError(thread, StalledThread(message), ""))
        self.stop.set()


@dataclass
class LearnerOutput:
    """One learner iteration handed to the logging (calling) thread."""

    row: dict[str, Any]
    records: list[dict[str, Any]]
    state: LearnerState | None  # only when `RunShared.keeps_state(iteration)` or the last iteration
