"""The lag figures: the lag histogram of a run's consumed samples (summed over rows), several
runs' histograms overlaid as fractions, and the mean KL per lag bucket.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

import numpy as np
import pandas as pd

from ppo_async.report import analysis
from ppo_async.report.figures import figure, finish, has_values, kl_guides, legend_outside, require, runs_mapping, save


def summed_lag_histogram(df: pd.DataFrame) -> np.ndarray:
    """Element-wise sum of the `lag_histogram` lists over all rows (None -> 0): `analysis.lag_histogram_of`."""
    require(df, ["lag_histogram"], "lag_histogram")
    return analysis.lag_histogram_of(df)


def lag_histogram(df: pd.DataFrame, path: str | os.PathLike | None = None, open_ended: bool = True) -> Any:
    """Bar chart of the samples of consumed batches per lag (including those the stale filter
    dropped), summed over all rows (iterations, seeds).

    Bar i of `fig.axes[0].patches` has the height of the summed count for lag i; with
    `open_ended` (threaded runs) the last bucket holds every lag >= its index (its tick reads
    "\u2265H-1"), else (simulated / sync: the histogram spans every possible lag) it is exact.
    """
    counts = summed_lag_histogram(df)
    lags = np.arange(len(counts))
    total = counts.sum()
    fig, ax = figure()
    ax.bar(lags, counts, color="C2", width=0.8)
    ax.set_xlabel("lag (learner version at consumption - policy version)")
    ax.set_ylabel("samples in consumed batches")
    mean = float((lags * counts).sum() / total) if total > 0 else math.nan
    ax.set_title(f"Lag histogram ({int(total):,} samples, mean lag {mean:.2f})")
    _lag_ticks(ax, len(lags), open_ended)
    ax.grid(alpha=0.3, axis="y")
    save(fig, path)
    return fig


def lag_histograms(runs: Mapping[str, pd.DataFrame] | pd.DataFrame, path: str | os.PathLike | None = None) -> Any:
    """Several runs' lag histograms overlaid: per run, the fraction of its consumed samples at
    each lag (`analysis.lag_histogram_of` / its total, so runs of different lengths compare),
    a line with markers. Runs without `lag_histogram` lists are left out.

    `fig.axes[0].lines[i]` is the i-th run that has a histogram; its y data are the fractions.
    """
    runs = runs_mapping(runs, "lag_histograms")
    fig, ax = figure()
    width = 0
    for i, (name, df) in enumerate(runs.items()):
        if not has_values(df, "lag_histogram", lists=True):
            continue
        counts = analysis.lag_histogram_of(df)
        total = counts.sum()
        if total <= 0:
            continue
        lags = np.arange(len(counts))
        mean = float((lags * counts).sum() / total)
        ax.plot(lags, counts / total, color=f"C{i % 10}", marker="o", linewidth=1.4, label=f"{name} (mean lag {mean:.2f})")
        width = max(width, len(counts))
    if width == 0:
        ax.text(0.5, 0.5, "no lag histogram in these runs", transform=ax.transAxes, ha="center", va="center")
    else:
        _lag_ticks(ax, width)
        legend_outside(fig, ax)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("lag (learner version at consumption - policy version)")
    ax.set_ylabel("fraction of consumed samples")
    ax.set_title("Lag histograms")
    ax.grid(alpha=0.3)
    save(fig, path)
    return fig


def _lag_ticks(ax: Any, num_buckets: int, open_ended: bool = True) -> None:
    """Lag ticks; with `open_ended` the last bucket also holds every larger lag, so it reads ">=H-1"."""
    if num_buckets == 0:
        return
    lags = np.arange(num_buckets)
    ticks = lags if num_buckets <= 32 else np.unique(np.append(lags[:: max(1, num_buckets // 16)], lags[-1]))
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) if t < num_buckets - 1 or not open_ended else f"\u2265{t}" for t in ticks])


def mean_kl_per_lag(df: pd.DataFrame) -> np.ndarray:
    """Per lag bucket, the mean over rows of `kl_per_lag`, ignoring None/NaN (NaN if no row
    had a sample with that lag)."""
    require(df, ["kl_per_lag"], "kl_per_lag")
    rows = analysis.list_rows(df["kl_per_lag"])
    if not rows:
        raise ValueError("kl_per_lag: the 'kl_per_lag' column has no list-valued rows")
    stacked = analysis.stack_padded(rows)
    counts = np.isfinite(stacked).sum(axis=0)
    sums = np.where(np.isfinite(stacked), stacked, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def kl_per_lag(df: pd.DataFrame, path: str | os.PathLike | None = None, open_ended: bool = True) -> Any:
    """Bars of the mean `approx_kl` per lag bucket (unweighted mean over the rows that had
    samples of that lag); buckets without any sample get no bar. Guides at 0.01 / 0.03; the
    last bucket's tick as in `lag_histogram`."""
    means = mean_kl_per_lag(df)
    lags = np.arange(len(means))
    ok = np.isfinite(means)
    fig, ax = figure()
    ax.bar(lags[ok], means[ok], color="C4", width=0.8, label="mean approx_kl")
    kl_guides(ax)
    ax.set_xlabel("lag")
    ax.set_ylabel("KL to behaviour policy")
    ax.set_title("KL per lag" + (f" (no samples at lag {', '.join(map(str, lags[~ok]))})" if (~ok).any() and (~ok).sum() <= 8 else ""))
    if len(lags):
        ax.set_xlim(-0.6, len(lags) - 0.4)
        _lag_ticks(ax, len(lags), open_ended)
    return finish(fig, ax, path, grid_axis="y")
