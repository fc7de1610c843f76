"""Online KL-target controller of a threaded run (`threaded.kl_target`): pure control law.

The plant: the running mean of `approx_kl` (KL to the behaviour policy) grows with the policy
lag of the consumed samples, and the lag grows with the samplers in flight, the versions a
sampler may fall behind before it refreshes (`threaded.refresh_lag`) and the versions a sample
may be old when consumed (`lag.max_lag`). The controller moves those three knobs while the run
goes, to hold the mean KL at or under the target while keeping as many samples flowing as the
target allows. It is additive increase / multiplicative decrease (AIMD, as in TCP congestion
control: Chiu & Jain 1989) over a ladder of knobs ordered by what they cost in throughput:

  decrease (window mean KL > target):
    1. both cheap knobs at once, where they can still move:
       refresh_lag  <- max(1, refresh_lag // 2)   samplers refresh more often (costs a params pull)
       max_lag      <- max(1, min(max_lag, lag_max seen) // 2)
                                                  samplers hold back (with full_policy "block")
                                                  or discard what would be staler, the learner
                                                  drops it: it bounds the buffer's effective
                                                  depth, so where the lag is buffer residency
                                                  (samplers out-produce the learner) it costs no
                                                  throughput; elsewhere it costs a straggler's
                                                  too-old rollouts
    2. when neither can: samplers <- max(1, ceil(n / 2)), pausing the slowest active ones (a
       straggler's samples are the stalest); this costs their throughput
  increase (window mean KL < KL_RAISE_BELOW * target), the same ladder walked back up, one
  step at a time: resume the fastest paused sampler, then max_lag + 1 (back to its configured
  value, None = unlimited, as soon as the window's largest lag sits under the cap: a cap that
  binds nothing is lifted), then refresh_lag + 1 (up to its configured value);
  hold otherwise (the band in between), or when the ladder has no rung left in that direction.

Bounds: 1 <= active samplers <= threaded.num_samplers; 1 <= refresh_lag <= the configured
threaded.refresh_lag; 1 <= max_lag <= the configured lag.max_lag (None: unlimited). The
controller starts from the configured values. A decision needs `window` learner iterations of
KL measured since the last change (the samples a change affects take that long to reach the
learner); the first decision comes after `window` iterations (the warm-up).

State (metrics `controller_*`, one per learner iteration): `controller_kl_mean` (the window
mean the last decision used, None until the window first fills), `controller_active_samplers`,
`controller_refresh_lag`, `controller_max_lag` (None = unlimited), `controller_action` (-1
decrease, 0 hold, +1 increase) and `controller_adjustments` (knob changes so far).

A leaf module (no JAX, no threads): `tests/test_kl_control.py` drives it on a synthetic plant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

KL_RAISE_BELOW = 0.5
"""Increase only while the window mean KL is under this fraction of the target (the hysteresis band)."""
DECREASE_FACTOR = 0.5
"""Multiplicative decrease of every knob."""


@dataclass(frozen=True)
class LagKnobs:
    """The lag knobs a threaded run reads while it goes (samplers and learner read them each step)."""

    active: tuple[bool, ...]  # per sampler: runs (True) or is paused
    refresh_lag: int
    max_lag: int | None  # None = no stale filter

    @property
    def num_active(self) -> int:
        return sum(self.active)


@dataclass(frozen=True)
class ControllerLimits:
    """What the controller may do: the configured knobs are its upper bounds."""

    target: float  # threaded.kl_target
    window: int  # learner iterations of KL per decision
    num_samplers: int
    refresh_lag: int  # configured threaded.refresh_lag
    max_lag: int | None  # configured lag.max_lag

    def __post_init__(self) -> None:
        if not (isinstance(self.target, (int, float)) and math.isfinite(self.target) and self.target > 0):
            raise ValueError(f"target = {self.target!r} must be a finite number > 0")
        for name in ("window", "num_samplers", "refresh_lag"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)!r} must be >= 1")
        if self.max_lag is not None and self.max_lag < 1:
            raise ValueError(f"max_lag = {self.max_lag!r} must be >= 1 or None")


@dataclass(frozen=True)
class ControllerState:
    """The controller between two learner iterations."""

    knobs: LagKnobs
    kls: tuple[float, ...] = ()  # approx_kl of the iterations since the last change (the last `window`)
    lag_max: int = 0  # largest consumed lag since the last change
    kl_mean: float | None = None  # the window mean of the last decision
    action: int = 0  # the last decision: -1, 0, +1
    adjustments: int = 0


def initial_state(limits: ControllerLimits) -> ControllerState:
    """Every sampler running, refresh_lag and max_lag as configured."""
    return ControllerState(LagKnobs((True,) * limits.num_samplers, limits.refresh_lag, limits.max_lag))


def _pause_slowest(active: tuple[bool, ...], count: int, rates: Sequence[float]) -> tuple[bool, ...]:
    """`active` with the `count` slowest active samplers paused (ties: the highest id first)."""
    running = sorted((i for i, on in enumerate(active) if on), key=lambda i: (rates[i], -i))
    paused = set(running[:count])
    return tuple(on and i not in paused for i, on in enumerate(active))


def _resume_fastest(active: tuple[bool, ...], rates: Sequence[float]) -> tuple[bool, ...]:
    """`active` with the fastest paused sampler resumed (its rate before it paused; ties: lowest id)."""
    paused = [i for i, on in enumerate(active) if not on]
    best = max(paused, key=lambda i: (rates[i], -i))
    return tuple(on or i == best for i, on in enumerate(active))


def decrease(knobs: LagKnobs, lag_max: int, rates: Sequence[float]) -> LagKnobs:
    """One multiplicative decrease: refresh_lag and max_lag together where they can still move,
    else the samplers (`knobs` itself when every knob is at its floor)."""
    refresh_lag = max(1, int(knobs.refresh_lag * DECREASE_FACTOR))
    current = lag_max if knobs.max_lag is None else min(knobs.max_lag, lag_max)
    max_lag = max(1, int(current * DECREASE_FACTOR))
    if knobs.max_lag is not None and max_lag >= knobs.max_lag:
        max_lag = knobs.max_lag
    if (refresh_lag, max_lag) != (knobs.refresh_lag, knobs.max_lag):
        return replace(knobs, refresh_lag=refresh_lag, max_lag=max_lag)
    if knobs.num_active > 1:
        keep = max(1, math.ceil(knobs.num_active * DECREASE_FACTOR))
        return replace(knobs, active=_pause_slowest(knobs.active, knobs.num_active - keep, rates))
    return knobs


def increase(limits: ControllerLimits, knobs: LagKnobs, lag_max: int, rates: Sequence[float]) -> LagKnobs:
    """One additive increase: the last rung of the ladder that is below its configured value
    (`knobs` itself when every knob is back at its configured value)."""
    if knobs.num_active < limits.num_samplers:
        return replace(knobs, active=_resume_fastest(knobs.active, rates))
    if knobs.max_lag != limits.max_lag:  # tightened by the controller
        if lag_max < knobs.max_lag:  # the cap binds nothing: lift it
            return replace(knobs, max_lag=limits.max_lag)
        loosened = knobs.max_lag + 1
        return replace(knobs, max_lag=loosened if limits.max_lag is None else min(loosened, limits.max_lag))
    if knobs.refresh_lag < limits.refresh_lag:
        return replace(knobs, refresh_lag=knobs.refresh_lag + 1)
    return knobs


def step(
    limits: ControllerLimits, state: ControllerState, kl: float, lag_max: int, sampler_rates: Sequence[float]
) -> ControllerState:
    """The controller after one learner iteration (pure).

    Args:
      limits: target, window and bounds.
      state: the state after the previous iteration.
      kl: this iteration's `approx_kl` (a non-finite value is not counted).
      lag_max: this iteration's largest consumed lag.
      sampler_rates: `[num_samplers]` env steps per second of each sampler while it ran (which
        samplers to pause or resume).

    Returns:
      The new state; `state.knobs` is what the run applies next.
    """
    if len(sampler_rates) != limits.num_samplers:
        raise ValueError(f"sampler_rates has {len(sampler_rates)} entries, expected {limits.num_samplers}")
    kls = state.kls + ((float(kl),) if math.isfinite(kl) else ())
    kls = kls[-limits.window:]
    seen = max(state.lag_max, int(lag_max))
    held = replace(state, kls=kls, lag_max=seen, action=0)
    if len(kls) < limits.window:
        return held
    mean = sum(kls) / len(kls)
    held = replace(held, kl_mean=mean)
    if mean > limits.target:
        knobs, action = decrease(state.knobs, seen, sampler_rates), -1
    elif mean < KL_RAISE_BELOW * limits.target:
        knobs, action = increase(limits, state.knobs, seen, sampler_rates), 1
    else:
        return held
    if knobs == state.knobs:  # no rung left in that direction
        return held
    return ControllerState(knobs, (), 0, mean, action, state.adjustments + 1)


def controller_metrics(state: ControllerState) -> dict[str, float | int | None]:
    """The `controller_*` metrics of a state (see the module docstring)."""
    return {
        "controller_kl_mean": state.kl_mean,
        "controller_active_samplers": state.knobs.num_active,
        "controller_refresh_lag": state.knobs.refresh_lag,
        "controller_max_lag": state.knobs.max_lag,
        "controller_action": state.action,
        "controller_adjustments": state.adjustments,
    }
