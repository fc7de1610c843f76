"""ppo_async.report.stats, the one statistics module: hand-computed values, the same numbers as
`scipy.stats` and `rliable.metrics`, a plain-loop reference for each bootstrap, seeded
reproducibility, and NaN for fewer than two values (or runs)."""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest
import scipy.stats
from rliable import metrics

from ppo_async.report import stats

NAN = float("nan")

# Normalised scores [runs, tasks] (tests/test_benchmark.py's hand example): barrier on A 0.5, 1,
# 1.5, 2 and on B 1, 1.5, 0, 0.5; async on A 1, 1, 3, 1.2 and on B as barrier.
BARRIER = np.array([[0.5, 1.0], [1.0, 1.5], [1.5, 0.0], [2.0, 0.5]])
ASYNC = np.array([[1.0, 1.0], [1.0, 1.5], [3.0, 0.0], [1.2, 0.5]])


# ---------------------------------------------------------------------------- Student's t


def test_t_quantile_is_scipys():
    assert stats.t_quantile(0.95, 1) == pytest.approx(12.7062047, abs=1e-6)
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.7764451, abs=1e-6)
    assert stats.t_quantile(0.90, 10) == pytest.approx(scipy.stats.t.ppf(0.95, 10), rel=1e-12)
    assert stats.t_quantile(0.95, 10**6) == pytest.approx(1.959966, abs=1e-5)  # -> the normal quantile


def test_mean_ci95_hand_values():
    # (1, 2, 3, 4, 5): mean 3, s = sqrt(2.5) = 1.5811, t(0.975, 4) = 2.7764 -> 2.7764 * 1.5811 / sqrt(5) = 1.9632
    mean, half = stats.mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    assert mean == 3.0 and half == pytest.approx(1.96324, abs=1e-5)
    mean, half = stats.mean_ci95([10.0, NAN, 20.0])  # NaN left out: n = 2, t = 12.7062, s = 7.0711
    assert mean == 15.0 and half == pytest.approx(12.7062047 * 7.0710678 / np.sqrt(2), rel=1e-6)
    assert stats.mean_ci95([7.0])[0] == 7.0 and np.isnan(stats.mean_ci95([7.0])[1])
    assert all(np.isnan(stats.mean_ci95([])))
    assert all(np.isnan(stats.mean_ci95([NAN, float("inf")])))


@pytest.mark.parametrize("values", [[1.0, 2.0, 3.0, 4.0, 5.0], [10.0, 20.0], [0.3, -1.2, 4.4, 2.0, 2.0, 9.5, 0.0]])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_t_interval_is_scipys(values, confidence):
    x = np.asarray(values)
    low, high = scipy.stats.t.interval(confidence, len(x) - 1, loc=x.mean(), scale=scipy.stats.sem(x))
    mean, half = stats.t_interval(values, confidence)
    assert (mean - half, mean + half) == pytest.approx((low, high), rel=1e-12)


# ---------------------------------------------------------------------------- bootstrap of a mean


def loop_bootstrap_mean_ci(values, reps, seed):
    """The reference: the same draws, then one resample at a time, entry by entry; the 2.5% and
    97.5% percentiles of the means."""
    x = np.asarray(values, np.float64)
    index = np.random.default_rng(seed).integers(0, len(x), size=(reps, len(x)))
    means = [sum(x[i] for i in row) / len(x) for row in index]
    return tuple(np.percentile(means, [2.5, 97.5]))


def test_bootstrap_mean_ci_hand_values():
    # two values 0 and 1: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% percentiles of many resamples are 0 and 1
    assert stats.bootstrap_mean_ci([0.0, 1.0], reps=4000) == (0.0, 1.0)
    assert stats.bootstrap_mean_ci([5.0, 5.0, 5.0]) == (5.0, 5.0)  # no spread, no interval
    low, high = stats.bootstrap_mean_ci([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= low < 2.5 < high <= 4.0


def test_bootstrap_mean_ci_against_a_plain_loop():
    values = [3.0, -1.0, 4.0, 1.5, 9.0]
    assert stats.bootstrap_mean_ci(values, reps=500, seed=7) == pytest.approx(loop_bootstrap_mean_ci(values, 500, 7))


def test_bootstrap_mean_ci_is_seeded():
    values = [3.0, -1.0, 4.0, 1.5, 9.0, 2.5]
    assert stats.bootstrap_mean_ci(values, seed=3) == stats.bootstrap_mean_ci(values, seed=3)
    assert stats.bootstrap_mean_ci(values, seed=3) != stats.bootstrap_mean_ci(values, seed=4)
    np.random.seed(0)  # numpy's global state plays no part
    first = stats.bootstrap_mean_ci(values)
    np.random.seed(1)
    assert stats.bootstrap_mean_ci(values) == first


def test_bootstrap_mean_ci_needs_two_values():
    for values in ([], [3.0], [3.0, NAN], [NAN, NAN]):
        assert all(np.isnan(stats.bootstrap_mean_ci(values))), values
    assert np.isfinite(stats.bootstrap_mean_ci([3.0, NAN, 4.0])).all()  # NaN left out, two values remain


def test_percentile_interval():
    assert stats.percentile_interval(np.arange(101.0)) == pytest.approx((2.5, 97.5))
    assert stats.percentile_interval(np.arange(101.0), 0.5) == pytest.approx((25.0, 75.0))


# ---------------------------------------------------------------------------- aggregate metrics


def test_iqm_hand_value_and_rliable():
    # pooled barrier scores sorted: 0 .5 .5 1 1 1.5 1.5 2; the middle four (.5 1 1 1.5) -> 1.0
    assert stats.iqm(BARRIER) == pytest.approx(1.0)
    # async: 0 .5 1 1 1 1.2 1.5 3 -> middle 1 1 1 1.2 -> 1.05
    assert stats.iqm(ASYNC) == pytest.approx(1.05)
    for scores in (BARRIER, ASYNC, np.arange(12.0).reshape(3, 4)):
        assert stats.iqm(scores) == metrics.aggregate_iqm(scores)
        assert stats.iqm(scores) == pytest.approx(scipy.stats.trim_mean(scores, 0.25, axis=None))
    assert np.isnan(stats.iqm(np.zeros((0, 2))))


def test_probability_of_improvement_hand_value_and_rliable():
    # task A: async's 1 beats 0.5 and ties 1 (1.5, twice), 3 beats all four, 1.2 beats 0.5 and 1 (2):
    # 9/16; task B: equal scores -> 1/2
    assert stats.probability_of_improvement(ASYNC, BARRIER) == pytest.approx((9 / 16 + 0.5) / 2)
    assert stats.probability_of_improvement(ASYNC, BARRIER) == metrics.probability_of_improvement(ASYNC, BARRIER)
    u = scipy.stats.mannwhitneyu(ASYNC[:, 0], BARRIER[:, 0], alternative="greater").statistic
    assert u / 16 == pytest.approx(9 / 16)
    assert stats.probability_of_improvement(BARRIER, BARRIER) == 0.5
    assert np.isnan(stats.probability_of_improvement(np.zeros((0, 2)), BARRIER))


# ---------------------------------------------------------------------------- stratified bootstrap


def test_stratified_resample_draws_runs_within_each_task():
    scores = np.array([[0.0, 10.0, 20.0], [1.0, 11.0, 21.0], [2.0, 12.0, 22.0]])
    resampled = stats.stratified_resample(scores, np.random.default_rng(0))
    assert resampled.shape == scores.shape
    for task in range(3):  # every entry of a task's column is one of that task's runs
        assert set(resampled[:, task]) <= set(scores[:, task])


def loop_stratified_ci(statistic, matrices, reps, seed):
    """The reference: entry by entry, each matrix on its own, one generator for all."""
    rng = np.random.default_rng(seed)
    estimates = []
    for _ in range(reps):
        resampled = []
        for m in matrices:
            index = rng.integers(0, m.shape[0], size=m.shape)
            resampled.append(np.array([[m[index[i, j], j] for j in range(m.shape[1])] for i in range(m.shape[0])]))
        estimates.append(statistic(*resampled))
    return tuple(np.percentile(estimates, [2.5, 97.5]))


def test_stratified_bootstrap_ci_against_a_plain_loop():
    expected = loop_stratified_ci(stats.iqm, [BARRIER], 200, 5)
    assert stats.stratified_bootstrap_ci(stats.iqm, [BARRIER], reps=200, seed=5) == pytest.approx(expected)
    pair = [ASYNC, BARRIER[:3]]  # the run counts may differ
    expected = loop_stratified_ci(stats.probability_of_improvement, pair, 200, 5)
    got = stats.stratified_bootstrap_ci(stats.probability_of_improvement, pair, reps=200, seed=5)
    assert got == pytest.approx(expected)


def test_stratified_bootstrap_ci_is_seeded_and_holds_the_estimate():
    same = [stats.stratified_bootstrap_ci(stats.iqm, [ASYNC], reps=300, seed=1) for _ in range(2)]
    assert same[0] == same[1]
    assert stats.stratified_bootstrap_ci(stats.iqm, [ASYNC], reps=300, seed=2) != same[0]
    low, high = same[0]
    assert low <= stats.iqm(ASYNC) <= high
    low, high = stats.stratified_bootstrap_ci(stats.probability_of_improvement, [ASYNC, BARRIER], reps=300)
    assert 0.0 <= low <= stats.probability_of_improvement(ASYNC, BARRIER) <= high <= 1.0
    assert stats.stratified_bootstrap_ci(stats.iqm, [np.full((4, 2), 3.0)]) == (3.0, 3.0)


def test_stratified_bootstrap_ci_needs_two_runs():
    for matrices in ([BARRIER[:1]], [ASYNC, BARRIER[:1]], [np.zeros((0, 2))], [np.zeros((3, 0))], []):
        assert all(math.isnan(v) for v in stats.stratified_bootstrap_ci(stats.iqm, matrices)), matrices


# ---------------------------------------------------------------------------- the module


def test_a_leaf_module():
    """numpy, scipy and (where used) rliable.metrics: nothing from ppo_async, never rliable.library."""
    tree = ast.parse(open(stats.__file__, encoding="utf-8").read())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.update(f"{node.module}.{a.name}" for a in node.names)
    assert {name.split(".")[0] for name in imported} <= {"__future__", "math", "typing", "numpy", "scipy", "rliable"}
    assert not [name for name in imported if name.startswith("rliable") and name != "rliable.metrics"]
    assert "TypeError" not in stats.WHY_NOT_RLIABLE_BOOTSTRAP
