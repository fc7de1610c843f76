"""The pure rules of `tune` (`ppo_async.study.tune`): which settings each step measures, how
it chooses among them, how ties are broken, and the progress line with its ETA.

Ties: several settings can score the same (at a small budget every replayed setting may end
with the same final return, or none finish an episode). A choice among equals then goes to
the cheaper setting, and the step says so: in steps 1-3 fewer samplers, then a shorter buffer,
then a smaller batch per sampler (`threaded_cost`); in step 4 fewer SGD steps per learner
iteration, then the clip nearest the starting one (`replay_cost`). Scores are equal when
`math.isclose` says so; a NaN score (nothing measured) is the lowest and equals another NaN.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

KNEE_GAIN = 0.5
"""Step 2: a sampler count passes when it adds at least this fraction of the first sampler's throughput."""
VERIFY_TRIES = 3
"""Step 4: threaded runs that check the best replayed settings' KL, at most this many."""

THREADED_TIE_RULE = "ties go to the cheaper setting: fewer samplers, then a shorter buffer, then a smaller batch"
REPLAY_TIE_RULE = ("ties go to the cheaper setting: fewer SGD steps per learner iteration (ppo.num_epochs x "
                   "ppo.num_minibatches), then ppo.clip_eps nearest the starting one")

Row = Mapping[str, Any]
Cost = Callable[[Row], tuple]


def buffer_lengths(capacity_chunks: int) -> list[int]:
    """Step 1's buffer lengths in chunks: the start, halved down to one chunk (`[16, 8, 4, 2, 1]`)."""
    out = [capacity_chunks]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


def sampler_counts(samplers: int) -> list[int]:
    """Step 1's sampler counts: the start, halved down to one (`[4, 2, 1]`)."""
    out = [samplers]
    while out[-1] > 1:
        out.append(max(1, out[-1] // 2))
    return out


def most_runs(step: int, samplers: int, chunks: int, max_samplers: int, batch_factors: int, seeds: int) -> int:
    """The most threaded runs steps `step`..4 can still take (pure): step 1 every buffer length at
    every sampler count, step 2 every count up to `max_samplers`, step 3 every batch factor,
    step 4 its `VERIFY_TRIES` checks; each setting `seeds` runs. An upper bound: the steps stop
    early, and a setting measured before is read back."""
    settings = {1: len(buffer_lengths(chunks)) * len(sampler_counts(samplers)), 2: max_samplers,
                3: batch_factors, 4: VERIFY_TRIES}
    return seeds * sum(n for k, n in settings.items() if k >= step)


def progress_line(step: int, runs: int, most: int, elapsed_s: float, run_s: float, measured: int,
                  slowest_s: float = 0.0, sweep_settings: int = 0) -> str:
    """`tune: step 2/4, run 5 of at most 17, 80s elapsed, ETA at most 150s` (pure): the
    threaded runs so far (read back ones included) and the most there can be.

    The ETA is measured, never assumed: the runs that may remain times the slowest run
    measured here (`slowest_s`; a run that compiles a new program, as steps 3 and 4 do, takes
    about as long as the first) or, without it, their mean (`run_s / measured`); none measured:
    no ETA. Step 4's replay sweep (`sweep_settings` simulated runs, not yet started) is named
    beside it, since no threaded run times it: it prints its own ETA when it runs."""
    if not measured:
        eta = "ETA after the first run"
    else:
        per_run = max(slowest_s, run_s / measured)
        eta = f"ETA at most {per_run * max(most - runs, 0):.0f}s"
        if sweep_settings:
            eta += f" + step 4's replay sweep ({sweep_settings} settings, timed as it runs)"
    return f"tune: step {step}/4, run {runs} of at most {most}, {elapsed_s:.0f}s elapsed, {eta}"


def knee_of(rows: Sequence[Row], kl_target: float) -> tuple[int, list[bool]]:
    """Step 2's knee (pure): `rows` hold `num_samplers` 1, 2, ... in order with
    `consumer_steps_per_s` and `approx_kl_mean`. Returns (knee, passes): n passes when its
    KL is under the target and (n > 1) T(n) - T(n-1) >= KNEE_GAIN * T(1); the knee is the last
    n of the unbroken run of passes from n = 1 (1 when even n = 1 fails)."""
    passes = []
    for i, row in enumerate(rows):
        ok = row["approx_kl_mean"] < kl_target
        if i > 0:
            gain = row["consumer_steps_per_s"] - rows[i - 1]["consumer_steps_per_s"]
            ok = ok and gain >= KNEE_GAIN * rows[0]["consumer_steps_per_s"]
        passes.append(bool(ok))
    knee = 1
    for i, ok in enumerate(passes):
        if not ok:
            break
        knee = rows[i]["num_samplers"]
    return knee, passes


def _higher_first(value: float) -> float:
    """A score as a sort key, best (highest) first; NaN last."""
    return -value if math.isfinite(value) else math.inf


def _lower_first(value: float) -> float:
    """A KL as a sort key, lowest first; NaN last."""
    return value if math.isfinite(value) else math.inf


def same_score(a: float, b: float) -> bool:
    """Whether two scores tie: equal within float noise, or both NaN (nothing measured)."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def best_first(rows: Sequence[Row], indices: Sequence[int], score: str, cost: Cost | None = None,
               lowest: bool = False) -> list[int]:
    """`indices` best first: the highest `score` (the lowest with `lowest`; NaN last), a tie
    (`same_score`) broken by the lower `cost(row)`, then by the order given."""
    key = _lower_first if lowest else _higher_first
    ordered = sorted(indices, key=lambda i: key(rows[i][score]))
    groups: list[list[int]] = []
    for i in ordered:
        if groups and same_score(rows[groups[-1][0]][score], rows[i][score]):
            groups[-1].append(i)
        else:
            groups.append([i])
    rank = {i: n for n, i in enumerate(indices)}
    return [i for group in groups for i in sorted(group, key=lambda i: ((cost(rows[i]) if cost else ()), rank[i]))]


def tied_with(rows: Sequence[Row], order: Sequence[int], score: str) -> list[int]:
    """The indices of `order` (best first) whose score ties with the first's."""
    return [i for i in order if same_score(rows[i][score], rows[order[0]][score])] if order else []


def best_under_target(rows: Sequence[Row], kl_target: float, score: str, cost: Cost | None = None) -> tuple[int, bool]:
    """Index of the row with the highest `score` among those with `approx_kl_mean` under the
    target, and True; else of the lowest KL, and False. Ties go to the lower `cost(row)` (the
    first in order without a cost)."""
    under = [i for i, r in enumerate(rows) if r["approx_kl_mean"] < kl_target and math.isfinite(r[score])]
    if under:
        return best_first(rows, under, score, cost)[0], True
    return best_first(rows, range(len(rows)), "approx_kl_mean", cost, lowest=True)[0], False


def tie_note(count: int, what: str, value: float, rule: str) -> str:
    """`"; 3 settings tied at final return -120.5 (ties go to ...)"`, or `""` for no tie."""
    if count < 2:
        return ""
    shown = "none measured" if math.isnan(value) else f"{value:,.4g}"
    return f"; {count} settings tied at {what} {shown} ({rule})"


def threaded_cost(base_samplers: int, base_capacity: int, base_envs: int, base_steps: int) -> Cost:
    """The cost of a threaded setting (a measured row with its dotted changes): its samplers,
    its buffer capacity, then its rollout chunk (num_envs x num_steps); the base config's
    value for a field the row does not set."""
    def cost(row: Row) -> tuple:
        chunk = row.get("rollout.num_envs", base_envs) * row.get("rollout.num_steps", base_steps)
        return (row.get("num_samplers", base_samplers), row.get("threaded.buffer_capacity", base_capacity), chunk)
    return cost


def replay_cost(base_clip: float, base_epochs: int, base_minibatches: int) -> Cost:
    """The cost of a step-4 setting: its SGD steps per learner iteration (epochs x
    minibatches), then the distance of its clip from the starting one."""
    def cost(row: Row) -> tuple:
        epochs = row.get("ppo.num_epochs", base_epochs)
        minibatches = row.get("ppo.num_minibatches", base_minibatches)
        return (epochs * minibatches, abs(row.get("ppo.clip_eps", base_clip) - base_clip))
    return cost
