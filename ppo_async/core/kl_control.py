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
still holds when they move.)

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
    2. when neither can (refresh_lag 1, max_lag at its floor): the learning rate / LR_FACTOR
       (the staleness left is what the updates made while the samples were in flight, which
       only a smaller update lowers), and the window starts again. It is a trial
       (`judge_lr_trial`): where the next window's staleness did not fall by more than
       sqrt(LR_FACTOR) - it is the normalisation statistics drifting over the lag, or the lag
       in flight, not the updates' drift - the decrease is undone and the learning rate leaves
       the staleness alone for `history` iterations. Measured (same task, target 0.008): about
       half the trials failed; without them the rate went to 0.01-0.04x, the staleness hardly
       moved and learning stalled (final return -306 +- 347 against -203 +- 20 with them).
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

  lower    lr scale / LR_FACTOR when kl_update > update aim x LR_FACTOR (or at the floor, above);
           a trial (`judge_update_trial`): where the next window's kl_update did not fall by more
           than LR_FACTOR, the decrease is undone and the rate leaves the update part alone for
           `history` iterations (a part no step size makes, e.g. the normalisation statistics
           moving early in a run);
  raise    lr scale x LR_FACTOR when kl_update < update aim / LR_FACTOR and the staleness
           window is not above its band (a larger step also makes the next samples staler);
           at the knobs' floor, not where the staleness x LR_FACTOR^2 would be above it
           (`raise_gain`: there the staleness is the updates' and grows as the square of the
           step; without this guard a decrease for the staleness and a raise for the update
           part alternated, 23-29 changes in 230 iterations on the plant of issue 42's
           Pendulum setting, 64-75% of its iterations under 1.25x the target; with it, 0-2
           changes and 95-100%);
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
in words, with the numbers they compared).

A leaf module (no JAX, no threads): `tests/test_kl_control.py` drives it on a synthetic plant.
"""

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


def aims_of(limits: ControllerLimits, history: Sequence[tuple[float, float, float]]) -> Aims:
    """The margin rho = Q_q(total) / (mean staleness + mean update) over `history` `[n, 3]`
    (clamped to [1, MARGIN_MAX]) and the two parts' aims, STALENESS_SHARE and the rest of
    target / rho (module docstring)."""
    n = len(history)
    parts = sum(s + u for _, s, u in history) / n
    total_q = quantile([t for t, _, _ in history], limits.quantile)
    margin = min(max(total_q / parts, 1.0), MARGIN_MAX) if parts > 0 else 1.0
    level = limits.target / margin
    return Aims(margin, STALENESS_SHARE * level, (1.0 - STALENESS_SHARE) * level)


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


def waste_fraction(state: ControllerState) -> float:
    """The fraction of what the samplers made since the last knob change that was wasted (0 when
    nothing was made), at most 1: a drop counted in the window may be of samples made before it
    (a cap just lowered flushes the buffer), which without the bound read as up to 3x what the
    window made (`knobs_over_time.png` of the pendulum task). Every decision compares it with
    WASTE_MAX < 1, so the bound changes none."""
    if state.window_produced <= 0:
        return 0.0
    return min(1.0, state.window_wasted / state.window_produced)


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


def cap_fall(cap: int | None, lag_max: int, new_cap: int | None) -> float:
    """The factor a max_lag decrease from `cap` (None: unlimited, the window's largest lag
    `lag_max` standing for it) to `new_cap` lowers the lag bound by (1: it did not)."""
    old = lag_max if cap is None else min(cap, max(lag_max, 1))
    return old / new_cap if new_cap is not None and new_cap > 0 else 1.0


def cap_floor(state: ControllerState) -> int:
    """The lowest max_lag a decrease may set now: the waste check's floor, or a failed trial's
    while it lasts."""
    return max(state.max_lag_floor, state.trial_floor if state.trial_floor_left > 0 else 1)


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


def knobs_moved(state: ControllerState, knobs: LagKnobs, action: int) -> ControllerState:
    """`state` after a knob change: the new knobs, counted, a fresh staleness window, and the
    verdicts on the staleness (a trial, a hold) dropped with the old knobs."""
    return restart_window(replace(state, knobs=knobs, action=action, adjustments=state.adjustments + 1,
                                  lr_off_staleness=0, lr_trial=None, cap_trial=None))


def restart_window(state: ControllerState) -> ControllerState:
    """`state` with its staleness window (KLs, largest lag, samples made and wasted) started again."""
    return replace(state, kls=(), lag_max=0, window_produced=0, window_wasted=0)


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
    if action < 0 and knobs.max_lag != state.knobs.max_lag:  # a trial: the next window judges it (`judge_cap_trial`)
        moved = replace(moved, cap_trial=(mean, state.knobs.max_lag, state.lag_max, False))
    return moved, why, False


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


def with_supply(state: ControllerState, supply: Supply | None) -> ControllerState:
    """`state` with what the samplers made and wasted since the last step added to its window
    (`supply`: the run's totals now; None: not measured, nothing added)."""
    if supply is None:
        return state
    before = state.supply or Supply(0, 0)
    made, wasted = max(0, supply.produced - before.produced), max(0, supply.wasted - before.wasted)
    return replace(state, supply=Supply(int(supply.produced), int(supply.wasted)),
                   window_produced=state.window_produced + made, window_wasted=state.window_wasted + wasted)


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
    return replace(state, aims=aims, reason=f"{knob_reason}; {lr_reason}")


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
