"""The staleness actuator of the KL controller (`ppo_async.core.kl_control`): AIMD over the lag
knobs on the staleness window, the waste check and the max_lag trials."""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ppo_async.core.kl_control.ladder import cap_fall, cap_floor, decrease, describe_change, increase
from ppo_async.core.kl_control.learning_rate import judge_lr_trial
from ppo_async.core.kl_control.state import (
    CAP_TRIAL_MIN, DECREASE_FACTOR, KNOB_BAND, WASTE_MAX, ControllerLimits, ControllerState, knobs_moved,
    restart_window, waste_fraction,
)


def loosen_wasting_cap(limits: ControllerLimits, state: ControllerState) -> tuple[ControllerState, str] | None:
    """Where a max_lag the controller set wasted more than WASTE_MAX of the window's samples
    (its lag is in flight - rollouts span that many versions - not in the buffer, so the cap
    throws rollouts away instead of holding samplers back): max_lag + 1, and that value becomes
    the floor of later decreases. None where the cap is the configured one or wasted less. Not
    asked in the window right after a decrease (`staleness_step`): what the samplers had
    committed before it is flushed there - 47% of the first window after max_lag None -> 3 on
    the hopper task, which made 4 the floor of the run while its steady waste was ~5%."""
    cap = state.knobs.max_lag
    waste = waste_fraction(state)
    if cap is None or cap == limits.max_lag or waste <= WASTE_MAX:
        return None
    loosened = cap + 1 if limits.max_lag is None else min(cap + 1, limits.max_lag)
    knobs = replace(state.knobs, max_lag=loosened)
    why = (f"max_lag {cap} wasted {waste:.0%} of the samples (> {WASTE_MAX:.0%}: rollouts span more versions): "
           f"max_lag {cap}->{loosened}, the floor of later decreases")
    return knobs_moved(replace(state, max_lag_floor=max(state.max_lag_floor, loosened)), knobs, 1), why


def judge_cap_trial(limits: ControllerLimits, state: ControllerState, mean: float) -> tuple[ControllerState, str] | None:
    """After a max_lag decrease (`cap_trial`), the second full staleness window after it says
    whether it lowered the staleness (the first holds samples made before it: judged on it, a
    decrease 3 -> 1 on the hopper task read 0.024 against the 0.006-0.010 its cap held later).
    A cap holds samplers back (`threaded.sampler`), so it costs throughput, and it is kept only
    where it buys what it is for: a staleness the lag makes falls with it (halving the lag
    lowered Hopper-v5's 4-5x; Pendulum-v1's did not fall from 6 samplers to 2, the task grids of
    `experiments/kl_controller.py`). Where the lag bound fell by f >= CAP_TRIAL_MIN (from the
    cap, or the largest lag seen where it was unlimited), a staleness that fell by less than
    sqrt(f) (half of it in log terms: room for the windows' noise) is not the lag's: max_lag
    goes back, and that cap (one over the largest lag seen, for unlimited) is the floor of
    decreases for 4 x `limits.history` iterations (not for good: the windows' noise fails a
    trial now and then on the synthetic plant of `tests/test_kl_control.py`). The learning rate
    holds while a trial runs (`update_step`): one factor at a time. (Kept unjudged where the
    rate moved in their windows, trials held max_lag at 1 for 150 iterations on the pendulum
    task at 0.008, 17k env steps/s against 74k; judged with the staleness before scaled by the
    rate's factor squared, a decrease None -> 3 on the hopper task read 0.34 -> 0.08 as "not
    lowered", since there the rate did not move the staleness as its square.) Returns None
    where the decrease is kept or there was no trial, else the state and the verdict in words."""
    if state.cap_trial is None:
        return None
    before, cap, lag_max, _ = state.cap_trial
    state = replace(state, cap_trial=None)
    fall = cap_fall(cap, lag_max, state.knobs.max_lag)
    if fall < CAP_TRIAL_MIN or mean <= before / fall ** 0.5:
        return None
    floor = lag_max + 1 if cap is None else cap
    why = (f"max_lag {state.knobs.max_lag} did not lower the staleness ({before:.4g} -> {mean:.4g}, not under / "
           f"{fall ** 0.5:.3g}): max_lag back to {cap}, {floor} the floor of decreases for {4 * limits.history} iterations")
    knobs = replace(state.knobs, max_lag=cap)
    return knobs_moved(replace(state, trial_floor=floor, trial_floor_left=4 * limits.history), knobs, 1), why


def staleness_step(
    limits: ControllerLimits, state: ControllerState, aim: float, sampler_rates: Sequence[float]
) -> tuple[ControllerState, str, bool]:
    """The lag knobs' decision on the staleness window (AIMD, module docstring), after the
    waste check (`loosen_wasting_cap`).

    Returns the state, the decision in words and whether the staleness is over its aim with
    every knob at its floor (then the learning rate takes the decrease: `update_step`)."""
    if len(state.kls) < limits.window:
        return state, f"staleness: {len(state.kls)}/{limits.window} iterations since the last change", False
    mean = sum(state.kls) / len(state.kls)
    state = replace(state, kl_mean=mean)
    state, judged = judge_lr_trial(limits, state, mean)
    trial = state.cap_trial
    if trial is not None and not trial[3]:  # the window after the decrease: a flush, not the cap's
        state = restart_window(replace(state, cap_trial=trial[:3] + (True,)))
        return state, (f"{judged}staleness {mean:.4g} in the window after a max_lag decrease (what was made before "
                       f"it, flushed): the next window judges the cap"), False
    undone = judge_cap_trial(limits, state, mean)
    if undone is not None:
        state, why = undone
        return state, judged + why, False
    if trial is not None:  # kept: its window's waste was the flush of what was made before it
        state = replace(state, cap_trial=None, window_produced=0, window_wasted=0)
        judged += f"max_lag {state.knobs.max_lag} kept (staleness {trial[0]:.4g} -> {mean:.4g}); "
    loosened = None if trial is not None else loosen_wasting_cap(limits, state)
    if loosened is not None:
        state, why = loosened
        if mean > aim * KNOB_BAND and state.knobs.refresh_lag > 1:  # the cap's loosening leaves refresh_lag free to fall
            refresh_lag = max(1, int(state.knobs.refresh_lag * DECREASE_FACTOR))
            why += (f"; staleness {mean:.4g} > aim {aim:.4g} x {KNOB_BAND:.3g}: "
                    f"refresh_lag {state.knobs.refresh_lag}->{refresh_lag}")
            state = replace(state, knobs=replace(state.knobs, refresh_lag=refresh_lag))
        return state, judged + why, False
    if mean > aim * KNOB_BAND:
        knobs, action = decrease(state.knobs, state.lag_max, cap_floor(state)), -1
        compared = f"{mean:.4g} > aim {aim:.4g} x {KNOB_BAND:.3g}"
    elif mean < aim / KNOB_BAND:
        knobs, action = increase(limits, state.knobs, state.lag_max, sampler_rates), 1
        compared = f"{mean:.4g} < aim {aim:.4g} / {KNOB_BAND:.3g}"
    else:
        return state, f"{judged}staleness {mean:.4g} within aim {aim:.4g} x/ {KNOB_BAND:.3g}: hold", False
    if knobs == state.knobs:  # no rung left in that direction
        edge = "at their floor" if action < 0 else "at their configured values"
        return state, f"{judged}staleness {compared}, knobs {edge}", action < 0
    why = f"{judged}staleness {compared}: {describe_change(state.knobs, knobs)}"
    moved = knobs_moved(state, knobs, action)
    if action < 0 and cap_fall(state.knobs.max_lag, state.lag_max, knobs.max_lag) >= CAP_TRIAL_MIN:
        # a trial: the second window judges it (`judge_cap_trial`), the learning rate held meanwhile; a
        # smaller decrease (9 -> 8 above a trial's floor) is never judged, so it holds nothing (on issue
        # 42's Pendulum-v1 setting such steps held the learning rate for 32 of a run's first 100 iterations;
        # the fraction within 1.25x the target moved within noise: 78/69% at 0.008/0.005 against 79/66%)
        moved = replace(moved, cap_trial=(mean, state.knobs.max_lag, state.lag_max, False))
    return moved, why, False
