"""The lag knobs' ladder (`ppo_async.core.kl_control`): one multiplicative decrease, one
additive increase, and what a max_lag decrease lowers the lag bound by."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ppo_async.core.kl_control.state import DECREASE_FACTOR, ControllerLimits, ControllerState, LagKnobs


def _resume_fastest(active: tuple[bool, ...], rates: Sequence[float]) -> tuple[bool, ...]:
    """`active` with the fastest paused sampler resumed (its rate before it paused; ties: lowest id)."""
    paused = [i for i, on in enumerate(active) if not on]
    best = max(paused, key=lambda i: (rates[i], -i))
    return tuple(on or i == best for i, on in enumerate(active))


def decrease(knobs: LagKnobs, lag_max: int, max_lag_floor: int = 1) -> LagKnobs:
    """One multiplicative decrease: refresh_lag and max_lag together where they can still move
    (max_lag not under `max_lag_floor`, the lowest cap that wasted no more than WASTE_MAX);
    `knobs` itself at their floor, where the learning rate takes the decrease (module
    docstring: pausing samplers lowers no lag there, so they are not a rung)."""
    refresh_lag = max(1, int(knobs.refresh_lag * DECREASE_FACTOR))
    current = lag_max if knobs.max_lag is None else min(knobs.max_lag, lag_max)
    max_lag = max(1, max_lag_floor, int(current * DECREASE_FACTOR))
    if (knobs.max_lag is not None and max_lag >= knobs.max_lag) or (knobs.max_lag is None and max_lag > current):
        max_lag = knobs.max_lag  # at its floor (a cap over every lag seen would bind nothing)
    if (refresh_lag, max_lag) != (knobs.refresh_lag, knobs.max_lag):
        return replace(knobs, refresh_lag=refresh_lag, max_lag=max_lag)
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


def describe_change(old: LagKnobs, new: LagKnobs) -> str:
    """The knobs that moved, in words: 'refresh_lag 4->2, max_lag None->10'."""
    moved = []
    if old.num_active != new.num_active:
        moved.append(f"samplers {old.num_active}->{new.num_active}")
    for name in ("refresh_lag", "max_lag"):
        if getattr(old, name) != getattr(new, name):
            moved.append(f"{name} {getattr(old, name)}->{getattr(new, name)}")
    return ", ".join(moved)


def cap_fall(cap: int | None, lag_max: int, new_cap: int | None) -> float:
    """The factor a max_lag decrease from `cap` (None: unlimited, the window's largest lag
    `lag_max` standing for it) to `new_cap` lowers the lag bound by (1: it did not)."""
    old = lag_max if cap is None else min(cap, max(lag_max, 1))
    return old / new_cap if new_cap is not None and new_cap > 0 else 1.0


def cap_floor(state: ControllerState) -> int:
    """The lowest max_lag a decrease may set now: the waste check's floor, or a failed trial's
    while it lasts."""
    return max(state.max_lag_floor, state.trial_floor if state.trial_floor_left > 0 else 1)
