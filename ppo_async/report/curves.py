"""Curves over a run: the learning curve (median over seeds, 25-75% band), the KL to the
behaviour policy over time (one run or several overlaid) and the throughput (rolling mean per
iteration, one line per sampler). Each returns the Figure and writes a PNG when given `path`.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report.figures import (X_LABELS, figure, finish, kl_guides, legend_outside, mean_over_seeds, numeric,
                                      points_note, require, runs_mapping, save, seed_groups)

THROUGHPUT_WINDOW = 10  # iterations in the rolling mean of `throughput` (1 = raw rates)
_MAX_GRID = 500


def seed_quantiles(df: pd.DataFrame, x: str = "env_steps", y: str = "episode_return") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(grid, median, q25, q75, num_seeds) of `y` over seeds on a common x grid.

    Each seed's finite (x, y) points are linearly interpolated onto the grid: the distinct x
    values of all seeds (or 500 evenly spaced points if there are more) restricted to the range
    every seed covers, so every grid point's statistics are over all seeds. Seeds with no
    finite y are left out.
    """
    curves = []
    for g in seed_groups(df):
        xs, ys = numeric(g[x]), numeric(g[y])
        ok = np.isfinite(xs) & np.isfinite(ys)
        if not ok.any():
            continue
        order = np.argsort(xs[ok], kind="stable")
        curves.append((xs[ok][order], ys[ok][order]))
    if not curves:
        empty = np.zeros(0)
        return empty, empty, empty, empty, 0
    lo = max(c[0][0] for c in curves)
    hi = min(c[0][-1] for c in curves)
    if lo > hi:  # the seeds share no x range: use everything, stats over the seeds present
        lo, hi = min(c[0][0] for c in curves), max(c[0][-1] for c in curves)
    grid = np.unique(np.concatenate([c[0] for c in curves]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    if len(grid) > _MAX_GRID:
        grid = np.linspace(lo, hi, _MAX_GRID)
    values = np.stack([np.interp(grid, cx, cy, left=np.nan, right=np.nan) for cx, cy in curves])
    present = np.isfinite(values).any(axis=0)
    grid, values = grid[present], values[:, present]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns cannot remain, but be safe
        median = np.nanmedian(values, axis=0)
        q25, q75 = np.nanpercentile(values, [25, 75], axis=0)
    return grid, median, q25, q75, len(curves)


def learning_curve(
    runs: Mapping[str, pd.DataFrame] | pd.DataFrame,
    x: str = "env_steps",
    path: str | os.PathLike | None = None,
    y: str = "episode_return",
) -> Any:
    """Several runs overlaid: per run the median of `y` over seeds and a 25-75% band.

    `runs` maps a label to that run's metrics DataFrame (a single DataFrame is one run).
    `x` is "env_steps" (per seed) or "wall_time". Iterations where no episode finished
    (`episode_return` None/NaN) are skipped and each seed is interpolated across them.
    `fig.axes[0].lines[i]` is the median line of the i-th run that has data.
    """
    if isinstance(runs, pd.DataFrame):
        runs = {"run": runs}
    if not runs:
        raise ValueError("learning_curve needs at least one run")
    fig, ax = figure()
    plotted, most_seeds = 0, 0
    for i, (name, df) in enumerate(runs.items()):
        require(df, [x, y], f"learning_curve (run {name!r})")
        grid, median, q25, q75, n = seed_quantiles(df, x, y)
        if n == 0:
            continue
        most_seeds = max(most_seeds, n)
        color = f"C{i % 10}"
        ax.plot(grid, median, color=color, linewidth=1.8, label=f"{name} (median of {n} seeds)" if n > 1 else f"{name} (1 seed)")
        if n > 1:
            ax.fill_between(grid, q25, q75, color=color, alpha=0.2, linewidth=0)
        plotted += 1
    if plotted == 0:
        ax.text(0.5, 0.5, f"no finite {y} yet", transform=ax.transAxes, ha="center", va="center")
    else:
        legend_outside(fig, ax)
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title("Learning curve (median over seeds, 25-75% band)" if most_seeds > 1 else "Learning curve (1 seed)")
    ax.grid(alpha=0.3)
    save(fig, path)
    return fig


def kl_over_time(df: pd.DataFrame, path: str | os.PathLike | None = None, x: str = "env_steps",
                 lagged: bool = True) -> Any:
    """`approx_kl` (solid) and `approx_kl_max` (dashed, if present) against env steps, mean over
    seeds, with guide lines at 0.01 ("watch") and 0.03 ("lag hurting") when `lagged` (a run
    without lag, e.g. sync mode, gets no lag guides: nothing of its KL comes from lag).

    `fig.axes[0].lines`: [approx_kl, approx_kl_max (if present), 0.01 guide, 0.03 guide (lagged only)].
    """
    require(df, [x, "approx_kl"], "kl_over_time")
    cols = ["approx_kl"] + (["approx_kl_max"] if "approx_kl_max" in df.columns else [])
    agg = mean_over_seeds(df, x, cols)
    fig, ax = figure()
    ax.plot(agg[x], agg["approx_kl"], color="C0", linewidth=1.6, label="approx_kl (mean over minibatches)")
    if "approx_kl_max" in cols:
        ax.plot(agg[x], agg["approx_kl_max"], color="C0", linestyle="--", linewidth=1.0, label="approx_kl_max")
    if lagged:
        kl_guides(ax)
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel("KL to behaviour policy")
    notes = ("mean over seeds" if df.get("seed") is not None and df["seed"].nunique() > 1 else "") + points_note(df)
    ax.set_title("KL to the behaviour policy" + (f" ({notes.lstrip(', ')})" if notes else ""))
    return finish(fig, ax, path)


def kl_over_time_runs(
    runs: Mapping[str, pd.DataFrame] | pd.DataFrame, path: str | os.PathLike | None = None, x: str = "env_steps"
) -> Any:
    """Several runs overlaid: per run `approx_kl` (mean over seeds) against `x`, with the 0.01
    ("watch") and 0.03 ("lag hurting") guides.

    `runs` maps a label to that run's metrics DataFrame. `fig.axes[0].lines[i]` is the i-th
    run with a finite `approx_kl`; the last two lines are the guides.
    """
    runs = runs_mapping(runs, "kl_over_time_runs")
    fig, ax = figure()
    for i, (name, df) in enumerate(runs.items()):
        require(df, [x, "approx_kl"], f"kl_over_time_runs (run {name!r})")
        agg = mean_over_seeds(df, x, ["approx_kl"]).dropna(subset=["approx_kl"])
        if len(agg):
            ax.plot(agg[x], agg["approx_kl"], color=f"C{i % 10}", linewidth=1.6, label=str(name))
    kl_guides(ax)
    ax.set_xlabel(X_LABELS.get(x, x))
    ax.set_ylabel("KL to behaviour policy (approx_kl)")
    ax.set_title("KL to the behaviour policy (mean over seeds)")
    return finish(fig, ax, path)


def rolling_mean(values: Sequence[float] | np.ndarray, window: int) -> np.ndarray:
    """Trailing rolling mean: out[i] = mean of the finite values among values[i-window+1 .. i].

    Pure (what `throughput` smooths with). The first points average the fewer values there
    are (`min_periods=1`); NaN values are skipped, and a window with no finite value is NaN.
    `window=1` returns the values unchanged. E.g. `rolling_mean([1, 2, 3, 4, 5], 3)` ->
    `[1, 1.5, 2, 3, 4]`. Raises ValueError unless `window` is an integer >= 1.
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window = {window!r} is invalid: it must be an integer >= 1 (iterations)")
    series = pd.Series(np.asarray(values, dtype=np.float64))
    return series.rolling(int(window), min_periods=1).mean().to_numpy()


def _per_iteration(df: pd.DataFrame, key: str, columns: dict[str, np.ndarray]) -> pd.DataFrame:
    """Rows of the same iteration (one per seed) averaged to one, sorted by wall time."""
    frame = pd.DataFrame({"key": numeric(df[key]), "wall_time": numeric(df["wall_time"]), **columns})
    return frame.groupby("key", sort=True).mean().sort_values("wall_time")


def _sampler_rates(df: pd.DataFrame) -> dict[str, np.ndarray]:
    """`sampler_steps_per_second` lists as columns s0, s1, ... (NaN where a row has none)."""
    rows = [np.array([np.nan if v is None else v for v in value], dtype=np.float64)
            if isinstance(value, (list, tuple, np.ndarray)) else None for value in df["sampler_steps_per_second"]]
    width = max((len(r) for r in rows if r is not None), default=0)
    return {f"s{j}": np.array([r[j] if r is not None and j < len(r) else np.nan for r in rows]) for j in range(width)}


def throughput(df: pd.DataFrame, path: str | os.PathLike | None = None, window: int = THROUGHPUT_WINDOW) -> Any:
    """`steps_per_second` (all seeds together) against wall time; one dashed line per sampler
    if the `sampler_steps_per_second` column exists (threaded runs).

    Rows of the same iteration (one per seed) carry the same figures and are averaged to one
    point per iteration; every line is then smoothed with `rolling_mean` over the last
    `window` iterations (default THROUGHPUT_WINDOW = 10; `window=1`: the raw per-iteration
    rates, a sawtooth in threaded runs, where each iteration's rate depends on when chunks
    happened to arrive). `fig.axes[0].lines[0]` is the total; lines[1:] are samplers 0, 1, ...
    """
    require(df, ["wall_time", "steps_per_second"], "throughput")
    rolling_mean([], window)  # validates window before anything is drawn
    key = "iteration" if "iteration" in df.columns else "wall_time"
    columns = {"sps": numeric(df["steps_per_second"])}
    if "sampler_steps_per_second" in df.columns:
        columns.update(_sampler_rates(df))
    agg = _per_iteration(df, key, columns)
    fig, ax = figure()
    ax.plot(agg["wall_time"], rolling_mean(agg["sps"], window), color="C0", linewidth=1.8, label="total (all seeds)")
    samplers = [c for c in agg.columns if c.startswith("s") and c[1:].isdigit()]
    for j, name in enumerate(samplers):
        ax.plot(agg["wall_time"], rolling_mean(agg[name], window), linestyle="--", linewidth=1.0,
                color=f"C{(j + 1) % 10}", label=f"sampler {j}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("env steps / s")
    unit = "points" if points_note(df) else "iterations"
    ax.set_title("Throughput" + (f" (rolling mean over {window} {unit}" if window > 1 else f" (per {unit[:-1]}") + points_note(df) + ")")
    return finish(fig, ax, path)
