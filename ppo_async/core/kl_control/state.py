"""The KL controller's state, limits, samples and constants (`ppo_async.core.kl_control`),
their JSON form (a threaded checkpoint's mode_state) and metrics. A leaf module: no JAX."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, NamedTuple, Sequence


KNOB_BAND = 2.0 ** 0.5
"""The lag knobs' hysteresis band around the staleness aim: [aim / KNOB_BAND, aim x KNOB_BAND] (a factor of 2 wide)."""
DECREASE_FACTOR = 0.5
"""Multiplicative decrease of every lag knob."""
LR_FACTOR = 1.5
"""The learning rate's step, down and up (rl_games' AdaptiveScheduler)."""
LR_STEP_MAX = 4.0
"""The largest learning-rate decrease in one decision (`lr_decrease_factor`)."""
LR_MIN, LR_MAX = 1e-6, 1e-2
"""The learning rate's bounds (rl_games'), for ppo.learning_rate x the scale."""
STALENESS_SHARE = 0.5
"""The staleness part's share of the level the two parts hold (the update part gets the rest)."""
MARGIN_MAX = 10.0
"""The largest margin rho: the aims never fall under target / MARGIN_MAX."""
HISTORY_MIN = 32
"""Iterations the margin is measured over: the last max(window, HISTORY_MIN)."""
CAP_TRIAL_MIN = 1.5
"""The smallest factor a max_lag decrease lowers the lag by that is judged (`judge_cap_trial`)."""
WASTE_MAX = 0.1
"""The largest fraction of what the samplers make that a max_lag the controller set may waste
(discarded by forced refreshes or dropped by the learner's stale filter) before it is loosened."""


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
    window: int  # learner iterations of staleness per knob decision
    num_samplers: int
    refresh_lag: int  # configured threaded.refresh_lag
    max_lag: int | None  # configured lag.max_lag
    learning_rate: float = 3e-4  # configured ppo.learning_rate: the lr scale's bounds come from it
    quantile: float = 0.8  # threaded.kl_quantile: the fraction of iterations to hold at or under the target

    def __post_init__(self) -> None:
        for name in ("target", "learning_rate"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} = {value!r} must be a finite number > 0")
        for name in ("window", "num_samplers", "refresh_lag"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)!r} must be >= 1")
        if self.max_lag is not None and self.max_lag < 1:
            raise ValueError(f"max_lag = {self.max_lag!r} must be >= 1 or None")
        if not 0.0 < self.quantile < 1.0:
            raise ValueError(f"quantile = {self.quantile!r} must lie in (0, 1)")

    @property
    def history(self) -> int:
        """Measured iterations the margin is computed over."""
        return max(self.window, HISTORY_MIN)

    @property
    def lr_scale_bounds(self) -> tuple[float, float]:
        """`(low, high)`: learning_rate x scale stays in [LR_MIN, LR_MAX], and 1 is always allowed."""
        return min(1.0, LR_MIN / self.learning_rate), max(1.0, LR_MAX / self.learning_rate)


class KlSample(NamedTuple):
    """One learner iteration's KL to the behaviour policy and its parts (NaN: nothing consumed)."""

    total: float  # approx_kl
    staleness: float  # kl_staleness
    update: float  # kl_update

    @property
    def measured(self) -> bool:
        return all(math.isfinite(x) for x in self)


class Supply(NamedTuple):
    """A run's sample totals so far (`samples_produced`; `dropped_forced_refresh` +
    `dropped_stale_total`): what the samplers made and how much of it a max_lag threw away."""

    produced: int
    wasted: int


class Aims(NamedTuple):
    """What each part aims at, from the margin (module docstring)."""

    margin: float  # rho >= 1
    staleness: float
    update: float


@dataclass(frozen=True)
class ControllerState:
    """The controller between two learner iterations."""

    knobs: LagKnobs
    kls: tuple[float, ...] = ()  # kl_staleness of the iterations since the last knob change (the last `window`)
    lag_max: int = 0  # largest consumed lag since the last knob change
    kl_mean: float | None = None  # the staleness window mean of the last knob decision
    action: int = 0  # the last knob decision: -1, 0, +1
    adjustments: int = 0  # knob changes so far
    lr_scale: float = 1.0  # the learning rate's multiplier
    lr_action: int = 0  # the last learning-rate decision: -1, 0, +1
    lr_adjustments: int = 0  # learning-rate changes so far
    history: tuple[tuple[float, float, float], ...] = ()  # (total, staleness, update) of the last measured iterations
    aims: Aims | None = None  # of the last decision (None in the warm-up)
    reason: str = "warm-up"  # the last decisions in words
    updates: tuple[float, ...] = ()  # kl_update of the iterations since the last learning-rate change (the last `window`)
    supply: Supply | None = None  # the run's totals at the last step (None: not seen yet)
    window_produced: int = 0  # transitions the samplers made since the last knob change
    window_wasted: int = 0  # of which wasted (forced refreshes, stale drops)
    max_lag_floor: int = 1  # the lowest max_lag a decrease may set (raised where a cap wasted)
    lr_trial: tuple[float, float] | None = None  # (staleness window mean, lr scale) before a decrease at the knobs' floor, until judged
    lr_off_staleness: int = 0  # iterations the learning rate still leaves the staleness alone (a decrease at the floor did not lower it)
    update_trial: tuple[float, float] | None = None  # (kl_update window mean, lr scale) before a decrease for the update part, until judged
    lr_off_update: int = 0  # iterations the learning rate still leaves the update part alone (a decrease did not lower it)
    cap_trial: tuple[float, int | None, int, bool] | None = None  # (staleness window mean, max_lag, largest lag) before a max_lag decrease, and whether its flush window has passed; until judged
    trial_floor: int = 1  # the floor a failed max_lag trial set (`judge_cap_trial`), for `trial_floor_left` iterations
    trial_floor_left: int = 0
    lr_anchor: float = 1.0  # the learning-rate scale the last passed trial kept: a failed staleness trial's undo stops at lr_anchor / LR_STEP_MAX


def initial_state(limits: ControllerLimits) -> ControllerState:
    """Every sampler running, refresh_lag and max_lag as configured, the learning rate as configured."""
    return ControllerState(LagKnobs((True,) * limits.num_samplers, limits.refresh_lag, limits.max_lag))


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of `values` (non-empty), linear between order statistics (numpy's default)."""
    xs = sorted(values)
    position = q * (len(xs) - 1)
    low = int(math.floor(position))
    high = min(low + 1, len(xs) - 1)
    return xs[low] + (position - low) * (xs[high] - xs[low])


def waste_fraction(state: ControllerState) -> float:
    """The fraction of what the samplers made since the last knob change that was wasted (0 when
    nothing was made), at most 1: a drop counted in the window may be of samples made before it
    (a cap just lowered flushes the buffer), which without the bound read as up to 3x what the
    window made (`knobs_over_time.png` of the pendulum task). Every decision compares it with
    WASTE_MAX < 1, so the bound changes none."""
    if state.window_produced <= 0:
        return 0.0
    return min(1.0, state.window_wasted / state.window_produced)


def knobs_moved(state: ControllerState, knobs: LagKnobs, action: int) -> ControllerState:
    """`state` after a knob change: the new knobs, counted, a fresh staleness window, and the
    verdicts on the staleness (a trial, a hold) dropped with the old knobs."""
    return restart_window(replace(state, knobs=knobs, action=action, adjustments=state.adjustments + 1,
                                  lr_off_staleness=0, lr_trial=None, cap_trial=None))


def restart_window(state: ControllerState) -> ControllerState:
    """`state` with its staleness window (KLs, largest lag, samples made and wasted) started again."""
    return replace(state, kls=(), lag_max=0, window_produced=0, window_wasted=0)


def with_supply(state: ControllerState, supply: Supply | None) -> ControllerState:
    """`state` with what the samplers made and wasted since the last step added to its window
    (`supply`: the run's totals now; None: not measured, nothing added)."""
    if supply is None:
        return state
    before = state.supply or Supply(0, 0)
    made, wasted = max(0, supply.produced - before.produced), max(0, supply.wasted - before.wasted)
    return replace(state, supply=Supply(int(supply.produced), int(supply.wasted)),
                   window_produced=state.window_produced + made, window_wasted=state.window_wasted + wasted)


def controller_metrics(state: ControllerState) -> dict[str, Any]:
    """The `controller_*` metrics of a state (see the module docstring)."""
    aims = state.aims
    return {
        "controller_staleness_mean": state.kl_mean,
        "controller_staleness_aim": None if aims is None else aims.staleness,
        "controller_update_aim": None if aims is None else aims.update,
        "controller_margin": None if aims is None else aims.margin,
        "controller_active_samplers": state.knobs.num_active,
        "controller_refresh_lag": state.knobs.refresh_lag,
        "controller_max_lag": state.knobs.max_lag,
        "controller_action": state.action,
        "controller_adjustments": state.adjustments,
        "controller_lr_scale": state.lr_scale,
        "controller_lr_action": state.lr_action,
        "controller_lr_adjustments": state.lr_adjustments,
        "controller_waste": waste_fraction(state),
        "controller_max_lag_floor": state.max_lag_floor,
        "controller_reason": state.reason,
    }


def state_to_dict(state: ControllerState) -> dict[str, Any]:
    """A state as plain JSON types (a checkpoint's mode_state; `state_from_dict` inverts it)."""
    data = asdict(state)
    data["aims"] = None if state.aims is None else list(state.aims)
    data["supply"] = None if state.supply is None else list(state.supply)
    return data


def state_from_dict(data: Mapping[str, Any]) -> ControllerState:
    """Inverse of `state_to_dict`; a field missing (a checkpoint written before it existed)
    takes its default."""
    knobs = data["knobs"]
    values: dict[str, Any] = {
        "knobs": LagKnobs(tuple(bool(a) for a in knobs["active"]), int(knobs["refresh_lag"]),
                          None if knobs["max_lag"] is None else int(knobs["max_lag"])),
        "kls": tuple(float(k) for k in data.get("kls", ())),
        "history": tuple(tuple(float(x) for x in h) for h in data.get("history", ())),
        "aims": None if data.get("aims") is None else Aims(*(float(x) for x in data["aims"])),
        "kl_mean": None if data.get("kl_mean") is None else float(data["kl_mean"]),
        "supply": None if data.get("supply") is None else Supply(*(int(x) for x in data["supply"])),
        "updates": tuple(float(u) for u in data.get("updates", ())),
        "lr_trial": None if data.get("lr_trial") is None else tuple(float(x) for x in data["lr_trial"]),
        "update_trial": None if data.get("update_trial") is None else tuple(float(x) for x in data["update_trial"]),
        "cap_trial": None if data.get("cap_trial") is None else (
            float(data["cap_trial"][0]), None if data["cap_trial"][1] is None else int(data["cap_trial"][1]),
            int(data["cap_trial"][2]), bool(data["cap_trial"][3])),
    }
    for f in fields(ControllerState):
        if f.name not in values and f.name in data:
            values[f.name] = type(f.default)(data[f.name])
    return ControllerState(**values)
