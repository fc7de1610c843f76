"""The learning-rate actuator of the KL controller (`ppo_async.core.kl_control`): rl_games'
adaptive rule around the update part's aim, the decrease at the lag knobs' floor, and the
trials that undo a decrease which did not lower what it was for."""

from __future__ import annotations

from dataclasses import replace

from ppo_async.core.kl_control.ladder import cap_floor, decrease
from ppo_async.core.kl_control.state import (
    KNOB_BAND, LR_FACTOR, Aims, ControllerLimits, ControllerState, restart_window,
)


def undo_lr_decrease(limits: ControllerLimits, state: ControllerState, scale: float) -> tuple[ControllerState, float]:
    """`state` with the learning-rate scale back at `scale` (within its bounds), counted as a
    change, and the update window started again (a trial that failed); and that scale."""
    low, high = limits.lr_scale_bounds
    restored = min(max(scale, low), high)
    return replace(state, lr_scale=restored, updates=(), lr_action=1 if restored > state.lr_scale else state.lr_action,
                   lr_adjustments=state.lr_adjustments + (restored != state.lr_scale)), restored


def judge_lr_trial(limits: ControllerLimits, state: ControllerState, mean: float) -> tuple[ControllerState, str]:
    """After a learning-rate decrease at the knobs' floor (`lr_trial`), the next full staleness
    window says whether it lowered the staleness: a part made by the updates falls as the
    square of the step, LR_FACTOR^2 for one decrease; one that fell by less than
    sqrt(LR_FACTOR) (a quarter of that in log terms, room for the windows' noise) is not the
    updates' doing (e.g. the normalisation statistics drifting over the lag) and a smaller step
    only slows learning, so the decrease is undone and the learning rate leaves the staleness
    alone for the next `limits.history` iterations (or until the knobs move), then tries again.
    Returns the state and the verdict in words ('' when there was no trial)."""
    if state.lr_trial is None:
        return state, ""
    before, scale = state.lr_trial
    state = replace(state, lr_trial=None)
    if mean <= before / LR_FACTOR ** 0.5:
        return state, f"staleness fell with the learning rate ({before:.4g} -> {mean:.4g}); "
    state, restored = undo_lr_decrease(limits, replace(state, lr_off_staleness=limits.history), scale)
    return state, (f"staleness did not fall with the learning rate ({before:.4g} -> {mean:.4g}, not under / "
                   f"{LR_FACTOR ** 0.5:.3g}): lr scale back to {restored:.3g}, and it leaves the staleness alone for "
                   f"{limits.history} iterations; ")


def judge_update_trial(limits: ControllerLimits, state: ControllerState, update_kl: float) -> tuple[ControllerState, str]:
    """After a learning-rate decrease for the update part (`update_trial`), the next full
    update window says whether it lowered `kl_update`: a part the step makes falls as its
    square (LR_FACTOR^2 for one decrease); one that fell by less than LR_FACTOR (half of that in
    log terms: a window mean of 8 iterations varies by ~10%, so a threshold nearer 1 passes
    noise, and accepted decreases ratchet the rate down on the synthetic plant of
    `tests/test_kl_control.py`) is not the step's - e.g. the observation normalisation's statistics
    moving between the proximal policy and the updated one early in a run - so the decrease is
    undone and the learning rate leaves the update part over its aim alone for `limits.history`
    iterations. Measured: without this, Hopper-v5's first 60 iterations (kl_update 0.006-0.017
    whatever the rate) took the learning rate from 1 to 0.06x (`experiments/kl_controller.py`,
    the hopper task, target 0.008). Returns the state and the verdict in words ('' when there
    was no trial)."""
    if state.update_trial is None:
        return state, ""
    before, scale = state.update_trial
    state = replace(state, update_trial=None)
    if update_kl <= before / LR_FACTOR:
        return state, f"update fell with the learning rate ({before:.4g} -> {update_kl:.4g}); "
    state, restored = undo_lr_decrease(limits, replace(state, lr_off_update=limits.history), scale)
    return state, (f"update did not fall with the learning rate ({before:.4g} -> {update_kl:.4g}, not under / "
                   f"{LR_FACTOR:g}): lr scale back to {restored:.3g}, and it leaves the update part alone for "
                   f"{limits.history} iterations")


def raise_gain(limits: ControllerLimits, state: ControllerState) -> float:
    """The factor one learning-rate raise is expected to put on the staleness: LR_FACTOR^2 with
    every lag knob at its floor (the staleness left there is what the updates made while the
    samples were in flight, and KL grows as the square of the step), 1 elsewhere (the knobs
    take what it adds). A raise that would push the staleness over its band is not made: at the
    floor the next window's staleness would take it back, a limit cycle of the two decisions
    (measured on the synthetic plant of `tests/test_kl_control.py`)."""
    at_floor = decrease(state.knobs, state.lag_max, cap_floor(state)) == state.knobs
    return LR_FACTOR ** 2 if at_floor else 1.0


def update_step(
    limits: ControllerLimits, state: ControllerState, aims: Aims, floor: bool
) -> tuple[ControllerState, str]:
    """The learning rate's decision on the mean `kl_update` of the `window` iterations since
    its last change (rl_games' rule placed under the aim, module docstring); `floor`: the
    staleness is over its aim with every lag knob at its floor, so the learning rate also takes
    that decrease (and the staleness window starts again, as after a knob change). Returns the
    state and the decision in words."""
    if state.cap_trial is not None:
        return state, "lr hold: a max_lag trial is judging the staleness (one factor at a time)"
    staleness = sum(state.kls) / len(state.kls) if state.kls else state.kl_mean
    floor = floor and state.lr_off_staleness == 0
    if len(state.updates) < limits.window and not floor:
        return state, f"update: {len(state.updates)}/{limits.window} iterations since the last lr change"
    update_kl = sum(state.updates) / len(state.updates)
    if len(state.updates) >= limits.window and state.update_trial is not None:
        state, judged = judge_update_trial(limits, state, update_kl)
        if state.lr_off_update:  # undone: this window's verdict is the decision
            return state, judged
    else:
        judged = ""
    over = update_kl > aims.update * LR_FACTOR
    if over and state.lr_off_update == 0:
        factor, why = 1.0 / LR_FACTOR, f"{judged}update {update_kl:.4g} > aim {aims.update:.4g} x {LR_FACTOR:g}"
    elif floor:
        factor, why = 1.0 / LR_FACTOR, f"{judged}staleness over its aim at the knobs' floor"
    elif update_kl < aims.update / LR_FACTOR and (staleness is None or state.lr_off_staleness > 0
                                                  or staleness * raise_gain(limits, state) <= aims.staleness * KNOB_BAND):
        factor, why = LR_FACTOR, f"{judged}update {update_kl:.4g} < aim {aims.update:.4g} / {LR_FACTOR:g}"
    elif over:
        return state, (f"{judged}update {update_kl:.4g} > aim {aims.update:.4g} x {LR_FACTOR:g}, not the learning "
                       f"rate's ({state.lr_off_update} iterations left): lr hold")
    else:
        return state, f"{judged}update {update_kl:.4g} within aim {aims.update:.4g} x/ {LR_FACTOR:g}: lr hold"
    low, high = limits.lr_scale_bounds
    scale = min(max(state.lr_scale * factor, low), high)
    if scale == state.lr_scale:
        return state, f"{why}, lr scale at its bound {scale:.3g}: hold"
    if floor and factor < 1:  # a trial: the next staleness window says whether it worked (`judge_lr_trial`)
        trial = (state.kl_mean if state.kl_mean is not None else staleness, state.lr_scale)
        state = restart_window(replace(state, lr_trial=state.lr_trial or trial))
    elif over and factor < 1:  # a trial: the next update window says whether it worked (`judge_update_trial`)
        state = replace(state, update_trial=(update_kl, state.lr_scale))
    state = replace(state, lr_scale=scale, lr_action=1 if factor > 1 else -1, lr_adjustments=state.lr_adjustments + 1,
                    updates=())
    return state, f"{why}: lr scale {scale:.3g}"
