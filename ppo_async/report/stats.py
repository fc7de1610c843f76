"""The statistics of the reports, in one place: interval estimates over seeds and, across tasks,
the aggregate metrics of Agarwal et al. 2021 ("Deep Reinforcement Learning at the Edge of the
Statistical Precipice", NeurIPS; the `rliable` library).

- `mean_ci95` / `t_interval`: the mean over seeds and the half-width of its Student-t interval,
  the quantile from `scipy.stats.t`;
- `bootstrap_mean_ci`: the percentile-bootstrap interval of a mean over seeds;
- `iqm`, `probability_of_improvement`: the point estimates, computed by `rliable.metrics`
  (`aggregate_iqm`, `probability_of_improvement`);
- `stratified_bootstrap_ci`: their interval, by rliable's method (the stratified bootstrap:
  runs resampled with replacement within each task, each score matrix on its own, the
  percentile interval), drawn here from a seeded `np.random.default_rng`.

Why not `rliable.library.get_interval_estimates`: its bootstrap draws from numpy's global
random state (`np.random.choice`, whatever `random_state` it is given), so its intervals cannot
be reproduced from a seed; and it cannot be imported beside pandas 3 (rliable 1.2 pins
`arch<8`, whose 7.x releases break on pandas 3, while arch 8 drops the `random_state` rliable
passes). `STRATIFIED_METHOD` and `WHY_NOT_RLIABLE_BOOTSTRAP` say so in the reports.

Every function is pure (the bootstraps take their seed as an argument); fewer than two finite
values (or runs) give NaN intervals. A leaf module: numpy and scipy; `rliable.metrics` (numpy and
scipy only, the `benchmark` extra) is imported where it is used.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

__all__ = [
    "BOOTSTRAP_REPS",
    "CONFIDENCE",
    "STRATIFIED_METHOD",
    "PERCENTILE_METHOD",
    "T_METHOD",
    "WHY_NOT_RLIABLE_BOOTSTRAP",
    "finite",
    "t_quantile",
    "t_interval",
    "mean_ci95",
    "percentile_interval",
    "bootstrap_mean_ci",
    "stratified_resample",
    "stratified_bootstrap_ci",
    "iqm",
    "probability_of_improvement",
]

BOOTSTRAP_REPS = 2000  # resamples per bootstrap interval
CONFIDENCE = 0.95

T_METHOD = "Student-t interval of the mean over seeds (t quantile from scipy.stats.t)"
PERCENTILE_METHOD = "percentile bootstrap of the mean over seeds (seeds resampled with replacement)"
STRATIFIED_METHOD = ("stratified percentile bootstrap (Agarwal et al. 2021, rliable's method: runs resampled "
                     "with replacement within each task, each score matrix on its own)")
WHY_NOT_RLIABLE_BOOTSTRAP = ("not rliable's own `library.get_interval_estimates`, whose bootstrap draws from numpy's "
                             "global random state (not reproducible from a seed) and which does not import beside "
                             "pandas 3 (its `arch` dependency)")
"""One sentence for the reports: why the intervals are not rliable's own bootstrap."""


def finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The finite entries of `values` (any shape, flattened) as a float64 array `[n]`."""
    x = np.asarray(values, np.float64).reshape(-1)
    return x[np.isfinite(x)]


# ---------------------------------------------------------------------------- Student's t


def t_quantile(confidence: float, dof: int) -> float:
    """The two-sided `confidence` quantile of Student's t with `dof` degrees of freedom,
    t_{(1 + confidence) / 2, dof} (`scipy.stats.t.ppf`); e.g. 12.706 for (0.95, 1)."""
    return float(scipy_stats.t.ppf(0.5 + confidence / 2.0, dof))


def t_interval(values: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Mean of the finite `values` (e.g. one per seed) and the half-width of its Student-t
    interval: t_{(1 + confidence) / 2, n - 1} * s / sqrt(n), s the sample std (ddof 1).

    Args:
      values: numbers of any shape `[n]`; NaN / inf are left out.
      confidence: the interval's coverage, in (0, 1).

    Returns:
      `(mean, half_width)`: `(x, nan)` for one finite value, `(nan, nan)` for none.
    """
    x = finite(values)
    if len(x) == 0:
        return math.nan, math.nan
    if len(x) == 1:
        return float(x[0]), math.nan
    return float(x.mean()), float(t_quantile(confidence, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))


def mean_ci95(values: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """`t_interval(values, 0.95)`: the mean over seeds and the half-width of its 95% t interval."""
    return t_interval(values, 0.95)


# ---------------------------------------------------------------------------- bootstrap


def percentile_interval(estimates: Sequence[float] | np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The percentile interval of bootstrap `estimates` `[reps]`: their (1 - confidence) / 2 and
    (1 + confidence) / 2 quantiles (`np.percentile`, linear interpolation)."""
    tail = round(50.0 * (1.0 - confidence), 12)  # 2.5 exactly for 0.95
    low, high = np.percentile(np.asarray(estimates, np.float64), [tail, 100.0 - tail])
    return float(low), float(high)


def bootstrap_mean_ci(values: Sequence[float] | np.ndarray, reps: int = BOOTSTRAP_REPS, seed: int = 0,
                      confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean of the finite `values` (e.g. one per seed):
    `reps` resamples of them with replacement (`np.random.default_rng(seed)`), the interval of
    the resampled means (`percentile_interval`).

    Args:
      values: numbers `[n]`; NaN / inf are left out.
      reps: bootstrap resamples.
      seed: the generator's seed (the same seed gives the same interval).
      confidence: the interval's coverage, in (0, 1).

    Returns:
      `(low, high)`; `(nan, nan)` for fewer than 2 finite values.
    """
    x = finite(values)
    if len(x) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(reps, len(x)))].mean(axis=1)  # [reps]
    return percentile_interval(means, confidence)


def stratified_resample(scores: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One stratified bootstrap resample of `scores` `[runs, tasks]` (Agarwal et al. 2021; rliable's
    `StratifiedBootstrap`): in each task (column) the runs are drawn with replacement, each entry
    independently; the tasks themselves are kept. Returns an array of the same shape."""
    return np.take_along_axis(scores, rng.integers(0, scores.shape[0], size=scores.shape), axis=0)


def stratified_bootstrap_ci(statistic: Callable[..., float], matrices: Sequence[np.ndarray], reps: int = BOOTSTRAP_REPS,
                            seed: int = 0, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Percentile interval of `statistic(*matrices)` by the stratified bootstrap of Agarwal et al.
    2021 (rliable's `get_interval_estimates`, percentile method): each resample draws every
    matrix on its own (`stratified_resample`, as rliable's `StratifiedIndependentBootstrap` does
    for several matrices), from one `np.random.default_rng(seed)`.

    Args:
      statistic: a function of the matrices to a number, e.g. `iqm` or `probability_of_improvement`.
      matrices: score matrices, each `[runs_i, tasks]` (the run counts may differ).
      reps: bootstrap resamples.
      seed: the generator's seed (the same seed gives the same interval).
      confidence: the interval's coverage, in (0, 1).

    Returns:
      `(low, high)`; `(nan, nan)` when a matrix has fewer than 2 runs or no task.
    """
    matrices = [np.asarray(m, np.float64) for m in matrices]
    if not matrices or any(m.ndim != 2 or m.shape[0] < 2 or m.shape[1] < 1 for m in matrices):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    estimates = [statistic(*[stratified_resample(m, rng) for m in matrices]) for _ in range(reps)]
    return percentile_interval(estimates, confidence)


# ---------------------------------------------------------------------------- aggregate metrics


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of `scores` `[runs, tasks]` (Agarwal et al. 2021): the mean of the middle
    50% of all runs x tasks scores pooled (a 25% trimmed mean, `rliable.metrics.aggregate_iqm`);
    NaN for no score."""
    from rliable import metrics

    scores = np.asarray(scores, np.float64)
    return float(metrics.aggregate_iqm(scores)) if scores.size else math.nan


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """P(X > Y) (Agarwal et al. 2021) of scores `[runs_x, tasks]` over `[runs_y, tasks]`: per task
    the probability that a run of X beats a run of Y (Mann-Whitney U / (runs_x * runs_y), ties
    counting 1/2), averaged over tasks (`rliable.metrics.probability_of_improvement`); NaN
    without runs or tasks."""
    from rliable import metrics

    x, y = np.asarray(scores_x, np.float64), np.asarray(scores_y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or not (x.shape[0] and y.shape[0] and x.shape[1]):
        return math.nan
    return float(metrics.probability_of_improvement(x, y))
