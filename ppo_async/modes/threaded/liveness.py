"""Liveness of a threaded run: one heartbeat per thread, and the rule that tells a stuck thread
from a slow one (reads the clock; no thread of its own: the calling thread applies the rule
while it waits for the learner's rows).

Each thread owns a `Heartbeat`. It calls `beat()` after every unit of work it finishes (a host
simulator's step, a slice of simulated env latency, a rollout, a delivered chunk, a learner
update, a logged row) and `enter(phase, kind)` when it starts something else. The kind says
what silence means in that phase:

  work    the thread itself must move (Python code, a host simulator's step, a simulated env's
          latency): no beat for `threaded.timeout_s` since its last beat or since the phase
          began -> the thread is stuck;
  wait    it waits for another thread (data, params, buffer room, the logger, a KL-controller
          pause): its silence is the other's. When every thread waits and none has beaten for
          `timeout_s`, the threads wait for each other: the run is deadlocked;
  device  inside one compiled program (a JAX env's rollout, the learner's update and its
          collectives): no beat can come until it returns, and a long program is slow, not
          stuck. It is not judged (an XLA program that never returns cannot be told from a
          slow one, nor interrupted).

A thread that ended while the run goes on (it can only be a bug: every thread body records its
failure) is dead. So a sampler that is alive and stepping, however slowly, never fails the run;
a thread that stops moving does, with one line naming it, within `timeout_s` plus one watch slice.

Silence counts only while someone watched it (`WatchClock`): when the watch itself did not look
for more than half the timeout - the process was suspended (Ctrl-Z, SIGSTOP, a laptop asleep) or
starved of CPU - nobody can tell what the threads did meanwhile, so every thread's silence is
counted again from that moment. A run paused and continued goes on; a thread that is really
stuck is still named, `timeout_s` after the watch resumed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

WORK, WAIT, DEVICE = "work", "wait", "device"
KINDS = (WORK, WAIT, DEVICE)


class StalledThread(TimeoutError):
    """A thread of a threaded run is stuck or dead, or every thread waits for another: the
    message (one line) names the thread(s) and what each was doing."""


class Phase(NamedTuple):
    """What a thread is doing now: a name (rollout, put, data, ...), its kind (`KINDS`) and
    the perf_counter() instant it began. Replaced as a whole, so a reader sees one consistent phase."""

    name: str
    kind: str
    since: float


@dataclass
class Heartbeat:
    """One thread's progress: written by that thread only, read by the watch (under the GIL)."""

    current: Phase = field(default_factory=lambda: Phase("starting", WORK, time.perf_counter()))
    last_beat: float = field(default_factory=time.perf_counter)  # perf_counter() of the last beat
    beats: int = 0  # units of work finished

    def beat(self) -> None:
        """One unit of work finished: the thread is alive and moving."""
        self.beats += 1
        self.last_beat = time.perf_counter()

    def enter(self, phase: str, kind: str = WORK) -> None:
        """The thread starts `phase` (of `kind`); its silence is counted from now."""
        if kind not in KINDS:
            raise ValueError(f"kind = {kind!r} must be one of {KINDS}")
        self.current = Phase(phase, kind, time.perf_counter())

    def restart(self, now: float) -> None:
        """The run's clock starts: silence is counted from `now`, the phase kept."""
        self.current = self.current._replace(since=now)
        self.last_beat = now

    def silent_for(self, now: float) -> float:
        """Seconds since the last beat or the start of the current phase, whichever is later."""
        return now - max(self.last_beat, self.current.since)


class BeatingEnv:
    """A sampler's host-side vector env (Gymnasium, EnvPool) whose every `step` beats the
    sampler's heartbeat: a slow simulator that steps is alive. Everything else is the env's."""

    def __init__(self, env: Any, heartbeat: Heartbeat) -> None:
        object.__setattr__(self, "_env", env)
        object.__setattr__(self, "_heartbeat", heartbeat)

    def step(self, action: Any) -> Any:
        """The env's step, then a beat."""
        out = self._env.step(action)
        self._heartbeat.beat()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._env, name, value)


@dataclass
class WatchClock:
    """When the watch last looked at the heartbeats, and the rule that forgives the silence of a
    span nobody watched (module docstring): a look more than `timeout_s / 2` after the previous
    one restarts every heartbeat's silence at `now`."""

    timeout_s: float
    last_look: float | None = None
    unwatched_s: float = 0.0  # total seconds of spans forgiven so far (the run's suspensions)

    def look(self, heartbeats: Mapping[str, Heartbeat], now: float) -> bool:
        """Records a look at instant `now` (perf_counter); True when the span since the previous
        look went unwatched and every heartbeat's silence was restarted."""
        gap = None if self.last_look is None else now - self.last_look
        self.last_look = now
        if gap is None or gap <= self.timeout_s / 2:
            return False
        self.unwatched_s += gap
        for heartbeat in heartbeats.values():
            heartbeat.restart(now)
        return True


def _doing(name: str, phase: Phase, now: float) -> str:
    """`sampler-0 waiting in put for 3.1s`, `learner in update for 0.2s`."""
    verb = {WAIT: "waiting in", WORK: "in", DEVICE: "computing in"}[phase.kind]
    return f"{name} {verb} {phase.name} for {now - phase.since:.1f}s"


def find_stall(heartbeats: Mapping[str, Heartbeat], now: float, timeout_s: float,
               dead: tuple[str, ...] = (), judged: tuple[str, ...] | None = None) -> tuple[str, str] | None:
    """The liveness rule (module docstring) at instant `now`: `(thread, one-line message)` of
    the first failure, or None while the run is live.

    Args:
      heartbeats: every thread's heartbeat by name ("sampler-0", "learner", "logger").
      now: a perf_counter() instant.
      timeout_s: `threaded.timeout_s`.
      dead: names of threads that ended while the run goes on.
      judged: the names a work phase may fail (None: all); the others (the watching thread
        itself) only count for the run's progress.
    """
    limit = f"threaded.timeout_s = {timeout_s:g}"
    if dead:
        return dead[0], f"thread {dead[0]} ended while the run was going on (without an error): the run cannot continue"
    for name, heartbeat in heartbeats.items():
        silent, phase = heartbeat.silent_for(now), heartbeat.current
        if phase.kind == WORK and silent > timeout_s and (judged is None or name in judged):
            return name, (f"thread {name} is stuck: no progress for {silent:.1f}s in {phase.name} ({limit}); a live "
                          "thread beats at every env step, so this one is hung, not slow")
    if heartbeats and all(h.current.kind == WAIT for h in heartbeats.values()):
        quiet = now - max(h.last_beat for h in heartbeats.values())
        if quiet > timeout_s:
            doing = ", ".join(_doing(name, h.current, now) for name, h in heartbeats.items())
            return "run", (f"the threads wait for each other: no thread made progress for {quiet:.1f}s ({limit}): "
                           f"{doing}")
    return None
