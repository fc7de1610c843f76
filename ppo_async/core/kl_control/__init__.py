"""Online KL-target controller of a threaded run (`threaded.kl_target`): pure control law.

The plant. `approx_kl`, the KL from the behaviour policy mu to the params of each SGD step,
has two parts (`ppo_async.core.learner.diagnostics.kl_parts`, logged every iteration):
`kl_staleness` = KL(mu -> pi_prox), how far the learner had moved from the policy that made
the samples when the iteration began, and `kl_update` = KL(pi_prox -> pi_theta), how far this
iteration's SGD steps move it (pi_prox: the learner's params at the start of the iteration, or
their EWMA). The lag knobs move the first only: it grows with the samplers in flight, the
versions a sampler may fall behind before it refreshes (`threaded.refresh_lag`) and the
versions a sample may be old when consumed (`lag.max_lag`, which with full_policy "block" is
also the buffer's effective length: (max_lag + 1) x chunks_per_batch resident chunks). The
learning rate moves the second, and through it the first (a sample L versions old is L updates
behind). With every knob at its floor the update part is what is left, and no lag knob can
reach it: hence two actuators.

Aims: hold the iterations, not the mean. The target k* bounds each iteration's approx_kl, a
stated fraction q of them (`threaded.kl_quantile`). Over the last `history` measured
iterations (at least `window`, HISTORY_MIN) the controller measures the margin

    rho = Q_q(approx_kl) / (mean(kl_staleness) + mean(kl_update)),   clamped to [1, MARGIN_MAX],

the factor between the level its two parts hold and the q-quantile of the total that level
gives: it folds in the iterations' spread and the cross term (approx_kl minus the two parts,
positive where updates carry on the drift). A level k* / rho puts the q-quantile at the
target; the staleness part aims at STALENESS_SHARE x k* / rho, the update part at the rest.
(The spread scales with the level, so a ratio measured over several settings of the knobs
still holds when they move.) Where the cross term is negative (the update turning back the drift)
the total's quantile can sit under the parts' mean: the margin stays at its floor 1, the aims
never above the target, and kl_quantile does not bind - the decision's reason says so (`floor_note`).

The staleness actuator: additive increase / multiplicative decrease (AIMD, as in TCP
congestion control: Chiu & Jain 1989) over a ladder of knobs ordered by what they cost in
throughput, on the mean `kl_staleness` of the `window` iterations since its last change:

  first, the waste check: where a max_lag the controller set wasted more than WASTE_MAX of
  what the samplers made in the window (discarded by forced refreshes, dropped by the stale
  filter), max_lag + 1, and that value is the floor of every later decrease (`loosen_wasting_cap`;
  refresh_lag still halves in the same decision where the staleness is over its band). With
  full_policy "block" a sampler starts a rollout only where it will be fresh when consumed
  (`threaded.sampler`), so a cap holds samplers back and wastes little; the check is for what
  still is (full_policy "overwrite_oldest", rollouts begun before a cap). Measured before
  samplers held back (`experiments/kl_controller.py`, Pendulum-v1, 6 samplers, one 4x
  straggler, target 0.008): without the check the ladder ran max_lag down to 1 and discarded
  most rollouts - 17.9k env steps/s against 79k for the same samplers uncontrolled;

  decrease (window mean > staleness aim x KNOB_BAND):
    1. both cheap knobs at once, where they can still move:
       refresh_lag  <- max(1, refresh_lag // 2)   samplers refresh more often (costs a params pull)
       max_lag      <- max(1, floor, min(max_lag, lag_max seen) // 2)
                                                  samplers hold back (full_policy "block"):
                                                  where the lag is buffer residency (samplers
                                                  out-produce the learner) it costs no
                                                  throughput, where it is in flight (rollouts
                                                  span several learner iterations) it costs
                                                  throughput, so each decrease is a trial
                                                  (`judge_cap_trial`): kept where the next
                                                  window's staleness fell with the lag bound,
                                                  else undone for 4 x `history` iterations
    2. when neither can (refresh_lag 1, max_lag at its floor): the learning rate down by the
       root of the staleness' excess over its aim (`lr_decrease_factor`: KL grows as the
       square of the step; between LR_FACTOR and LR_STEP_MAX) - the staleness left is what
       the updates made while the samples were in flight, which only a smaller update lowers
       - and the window starts again. It is a trial (`judge_lr_trial`): where the next
       window's staleness did not fall by more than the root of the decrease's factor - it is
       the normalisation statistics drifting over the lag, or the lag in flight, not the
       updates' drift - the decrease is undone half way (the verdicts of a plant whose gain
       moves are often wrong; never under lr_anchor / LR_STEP_MAX, `undo_lr_decrease`) and
       the learning rate leaves the staleness alone for `history` iterations. Measured before
       samplers held back (same task, target 0.008): about half the trials failed; without
       them the rate went to 0.01-0.04x, the staleness hardly moved and learning stalled
       (final return -306 +- 347 against -203 +- 20 with them).
       A max_lag decrease too small to judge (a lag bound lowered by less than CAP_TRIAL_MIN)
       is no trial and holds nothing.
       Pausing samplers is not a rung: measured (same task), a ladder that paused samplers
       took a run from 6 to 1 with the mean lag at 1.00 all along, and its 300k env steps
       17.7 s against 3.8 s for 6 samplers uncontrolled
  increase (window mean < staleness aim / KNOB_BAND), the same ladder walked back up, one
  step at a time: resume the fastest paused sampler (a state restored from a checkpoint of the
  earlier controller, which paused them), then max_lag + 1 (back to its configured
  value, None = unlimited, as soon as the window's largest lag sits under the cap: a cap that
  binds nothing is lifted), then refresh_lag + 1 (up to its configured value);
  hold otherwise (the band in between), or when the ladder has no rung left in that direction.

The update-size actuator: the adaptive learning rate of rl_games (`AdaptiveScheduler`,
rl_games/common/schedulers.py: lr / 1.5 when the KL is above 2x its threshold, lr x 1.5 below
half, lr clamped to [1e-6, 1e-2]; Schulman et al. 2017's adaptive KL penalty moves its
coefficient by the same kind of rule), around the update aim instead of the target: on the mean
`kl_update` of the `window` iterations since its last change. One iteration's is too noisy to act
on: at a fixed setting of the same task, 64-74% of the iterations' kl_update lie outside x/ 1.5
of their median (a per-iteration rule moved the learning rate on 163 of 290 iterations, a random
walk over 0.04-5x)

  lower    lr scale / sqrt(kl_update / update aim) (`lr_decrease_factor`: at least rl_games'
           LR_FACTOR, at most LR_STEP_MAX) when kl_update > update aim x LR_FACTOR (or at the
           floor, above); a trial (`judge_update_trial`): where the next window's kl_update did
           not fall by more than the decrease's factor, the decrease is undone (all of it) and
           the rate leaves the update part alone for `history` iterations (a part no step size
           makes, e.g. the normalisation statistics moving early in a run);
  raise    lr scale x LR_FACTOR when kl_update < update aim / LR_FACTOR and the staleness
           window is not above its band (a larger step also makes the next samples staler);
           at the knobs' floor, not where the staleness x LR_FACTOR^2 would be above it
           (`raise_gain`: there the staleness is the updates' and grows as the square of the
           step; without this guard a decrease for the staleness and a raise for the update
           part alternated, 23-29 changes in 230 iterations on the plant of issue 42's
           Pendulum setting, 64-75% of its iterations under 1.25x the target; with it, 0-2
           changes and 95-100%; 7-11 and 88-95% since the decreases are sized to the excess);
  hold     otherwise, or at a bound.

The band is [aim / LR_FACTOR, aim x LR_FACTOR] rather than rl_games' [threshold / 2, 2 x
threshold]: the aim is a set point whose level the margin has placed, and a band 4x wide would
let the level wander over a factor of 4; for small steps the KL grows as the square of the step,
so one move (x LR_FACTOR^2 in KL) spans the band, from just outside it to inside. Both bands are
centred on their aims, so the parts' window means hover about them and the total's q-quantile
about the target (on the synthetic plant of `tests/test_kl_control.py`, the issue's case with
q = 0.8: 0.79 of the post-warm-up iterations under the target, 0.86 under 1.25x).

The scale multiplies the whole schedule (`ppo.learning_rate` and its annealing): the threaded
learner sets `Hyperparams.learning_rate` = ppo.learning_rate x scale, a traced value (no
recompile), `learning_rate_at` schedules from it and the update writes the scheduled rate into
the optimiser state every iteration (`with_step_hyperparams`). The scale lives in this state,
which the threaded checkpoint carries; the optimiser state in the checkpoint's arrays holds
the rate the last update used. Its bounds keep ppo.learning_rate x scale in [LR_MIN, LR_MAX]
(widened to hold 1: the configured rate is always allowed).

Bounds: 1 <= active samplers <= num_samplers (the run's, `Config.effective_num_samplers`); 1 <= refresh_lag <= the configured
threaded.refresh_lag; 1 <= max_lag <= the configured lag.max_lag (None: unlimited); the lr scale
as above. The controller starts from the configured values and scale 1. No decision before
`window` iterations have measured a KL (the warm-up); an iteration whose samples were all
stale measures none and is skipped.

State (`ControllerState`, in the threaded checkpoint's mode_state: a resumed run continues it)
and metrics `controller_*`, one per learner iteration: `controller_waste` (the window's wasted
fraction), `controller_max_lag_floor`, `controller_staleness_mean` (the window
mean of the last knob decision), `controller_staleness_aim`, `controller_update_aim`,
`controller_margin` (rho), `controller_active_samplers`, `controller_refresh_lag`,
`controller_max_lag` (None = unlimited), `controller_action` (knobs: -1 decrease, 0 hold, +1
increase), `controller_adjustments` (knob changes so far), `controller_lr_scale`,
`controller_lr_action`, `controller_lr_adjustments` and `controller_reason` (both decisions
in words, with the numbers they compared, after `floor_note` where the margin's floor binds).

A leaf package (no JAX, no threads): `state` (the state, limits, constants, checkpoint form,
metrics), `ladder` (the lag knobs' rungs), `staleness` and `learning_rate` (the two actuators),
and here the margin and the step. `tests/test_kl_control.py` drives it on a synthetic plant.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ppo_async.core.kl_control.ladder import cap_fall, cap_floor, decrease, describe_change, increase
from ppo_async.core.kl_control.learning_rate import (
    judge_lr_trial, judge_update_trial, lr_decrease_factor, raise_gain, trial_fall, undo_lr_decrease, update_step,
)
from ppo_async.core.kl_control.staleness import judge_cap_trial, loosen_wasting_cap, staleness_step
from ppo_async.core.kl_control.state import (
    CAP_TRIAL_MIN, DECREASE_FACTOR, HISTORY_MIN, KNOB_BAND, LR_FACTOR, LR_MAX, LR_MIN, LR_STEP_MAX, MARGIN_MAX, STALENESS_SHARE,
    WASTE_MAX, Aims, ControllerLimits, ControllerState, KlSample, LagKnobs, Supply, controller_metrics, initial_state,
    knobs_moved, quantile, restart_window, state_from_dict, state_to_dict, waste_fraction, with_supply,
)

__all__ = [
    "KNOB_BAND",
    "DECREASE_FACTOR",
    "LR_FACTOR",
    "LR_STEP_MAX",
    "LR_MIN",
    "LR_MAX",
    "STALENESS_SHARE",
    "MARGIN_MAX",
    "HISTORY_MIN",
    "CAP_TRIAL_MIN",
    "WASTE_MAX",
    "LagKnobs",
    "ControllerLimits",
    "KlSample",
    "Supply",
    "Aims",
    "ControllerState",
    "initial_state",
    "quantile",
    "waste_fraction",
    "knobs_moved",
    "restart_window",
    "with_supply",
    "controller_metrics",
    "state_to_dict",
    "state_from_dict",
    "decrease",
    "increase",
    "describe_change",
    "cap_fall",
    "cap_floor",
    "lr_decrease_factor",
    "trial_fall",
    "undo_lr_decrease",
    "judge_lr_trial",
    "judge_update_trial",
    "raise_gain",
    "update_step",
    "loosen_wasting_cap",
    "judge_cap_trial",
    "staleness_step",
    "aims_of",
    "floor_note",
    "margin_terms",
    "step",
]


def margin_terms(limits: ControllerLimits, history: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """(Q_q(total), mean staleness + mean update) over `history` `[n, 3]` of (approx_kl,
    kl_staleness, kl_update): the margin's numerator and denominator, before its clamp."""
    parts = sum(s + u for _, s, u in history) / len(history)
    return quantile([t for t, _, _ in history], limits.quantile), parts


def aims_of(limits: ControllerLimits, history: Sequence[tuple[float, float, float]]) -> Aims:
    """The margin rho = Q_q(total) / (mean staleness + mean update) over `history` `[n, 3]`
    (clamped to [1, MARGIN_MAX]) and the two parts' aims, STALENESS_SHARE and the rest of
    target / rho (module docstring)."""
    total_q, parts = margin_terms(limits, history)
    margin = min(max(total_q / parts, 1.0), MARGIN_MAX) if parts > 0 else 1.0
    level = limits.target / margin
    return Aims(margin, STALENESS_SHARE * level, (1.0 - STALENESS_SHARE) * level)


def floor_note(limits: ControllerLimits, history: Sequence[tuple[float, float, float]]) -> str:
    """Where the margin's floor 1 binds (the total's q-quantile under the parts' mean: their cross
    term is negative, the update turning back the drift that made the samples stale), a note
    saying so: there the controller aims the parts at the target itself and `threaded.kl_quantile`
    moves nothing (measured on issue 42's Pendulum-v1 setting at target 0.008: the unclamped
    ratio 0.4-0.8 all run long, and kl_quantile 0.5 and 0.65 held 81% and 79% of the iterations
    within 1.25x the target in 1.59 and 1.60 s to -400, as 0.8 did: 81%, 1.55 s). "" elsewhere."""
    total_q, parts = margin_terms(limits, history)
    if parts <= 0 or total_q >= parts:
        return ""
    return (f"margin at its floor 1 (approx_kl's {limits.quantile:g}-quantile {total_q:.4g} < the parts' mean "
            f"{parts:.4g}: kl_quantile does not bind); ")


def step(
    limits: ControllerLimits, state: ControllerState, kl: KlSample, lag_max: int, sampler_rates: Sequence[float],
    supply: Supply | None = None,
) -> ControllerState:
    """The controller after one learner iteration (pure).

    Args:
      limits: target, window, quantile and bounds.
      state: the state after the previous iteration.
      kl: this iteration's approx_kl and its parts (not counted unless all are finite).
      lag_max: this iteration's largest consumed lag.
      sampler_rates: `[num_samplers]` env steps per second of each sampler while it ran (which
        paused sampler to resume first).
      supply: the run's sample totals now (what a max_lag wastes: `loosen_wasting_cap`);
        None: not measured.

    Returns:
      The new state; `state.knobs` and `state.lr_scale` are what the run applies next.
    """
    if len(sampler_rates) != limits.num_samplers:
        raise ValueError(f"sampler_rates has {len(sampler_rates)} entries, expected {limits.num_samplers}")
    state = replace(with_supply(state, supply), lag_max=max(state.lag_max, int(lag_max)), action=0, lr_action=0)
    if not kl.measured:
        return replace(state, reason="no KL measured (nothing consumed): hold")
    history = (state.history + (tuple(float(x) for x in kl),))[-limits.history:]
    state = replace(state, history=history, lr_off_staleness=max(0, state.lr_off_staleness - 1),
                    lr_off_update=max(0, state.lr_off_update - 1), trial_floor_left=max(0, state.trial_floor_left - 1), kls=(state.kls + (float(kl.staleness),))[-limits.window:],
                    updates=(state.updates + (float(kl.update),))[-limits.window:])
    if len(history) < limits.window:
        return replace(state, reason=f"warm-up: {len(history)}/{limits.window} iterations")
    aims = aims_of(limits, history)
    state, knob_reason, floor = staleness_step(limits, state, aims.staleness, sampler_rates)
    state, lr_reason = update_step(limits, state, aims, floor)
    return replace(state, aims=aims, reason=f"{floor_note(limits, history)}{knob_reason}; {lr_reason}")
