"""Plots of metrics DataFrames (rows as in README "Metrics"; side effect: optional PNG files).

Every function takes a pandas DataFrame of metrics rows (one row per seed x learner
iteration, as `TrainResult.metrics` / `metrics.jsonl`), returns the matplotlib `Figure` and,
when `path` is given, also writes it as a PNG. Figures are built on the Agg canvas inside each
function (`matplotlib.figure.Figure` + `FigureCanvasAgg`): nothing is selected or registered
globally (no pyplot state), so this works headless, in threads and in notebooks alike.

`None` / NaN values (e.g. `episode_return` of an iteration where no episode finished, or a
`kl_per_lag` bucket with no sample) are skipped, never plotted as zero. Legends sit outside
the axes, to the right (`fig.legends[0]`), so they never cover data, and the figure grows by
their width instead of the axes shrinking (`_legend_outside`). `compare_runs` writes the
overlaid figures of several runs (`python -m ppo_async compare`).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report import analysis
from ppo_async.report.aggregate import RowFold

__all__ = [
    "learning_curve",
    "lag_histogram",
    "kl_over_time",
    "kl_per_lag",
    "throughput",
    "rolling_mean",
    "THROUGHPUT_WINDOW",
    "kl_over_time_runs",
    "lag_histograms",
    "compare_runs",
    "sweep_throughput_kl",
    "tune_knee",
    "kl_vs_buffer",
    "sampler_time_split",
    "plot_run",
    "run_frames",
    "read_run_metrics",
    "COMPARE_FILES",
    "seed_quantiles",
    "summed_lag_histogram",
    "mean_kl_per_lag",
    "KL_WATCH",
    "KL_HURTING",
]

KL_WATCH = 0.01  # DESIGN.md: < 0.01 fine, 0.01-0.03 watch, > 0.03 lag is hurting
KL_HURTING = 0.03
THROUGHPUT_WINDOW = 10  # iterations in the rolling mean of `throughput` (1 = raw rates)
_MAX_GRID = 500
_X_LABELS = {"env_steps": "env steps (per seed)", "wall_time": "wall time (s)"}


# ---------------------------------------------------------------------------- helpers


def _figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (8.5, 4.5)) -> tuple[Any, Any]:
    """A Figure on an Agg canvas (no global backend switch, no pyplot registry) and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols)
    return fig, axes


def _save(fig: Any, path: str | os.PathLike | None) -> None:
    if path is None:
        return
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=100)


def _finish(fig: Any, ax: Any, path: str | os.PathLike | None, grid_axis: str = "both") -> Any:
    """A one-axes figure's last steps: the legend outside the axes, a light grid, saved to
    `path` (None: not saved); returns the figure."""
    _legend_outside(fig, ax)
    ax.grid(alpha=0.3, axis=grid_axis)
    _save(fig, path)
    return fig


def _require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what} needs a pandas DataFrame of metrics rows, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what} needs the column(s) {missing}, which the metrics do not have "
            f"(columns present: {sorted(map(str, df.columns))})"
        )


def _numeric(series: pd.Series) -> np.ndarray:
    """float64 values with None / non-numbers as NaN."""
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)


_list_rows = analysis.list_rows  # list-valued column -> float arrays (None -> NaN)
_stack_padded = analysis.stack_padded  # [R, max_len], NaN padding


def _legend_outside(fig: Any, *axes: Any) -> Any:
    """One figure legend of every labelled artist of `axes`, outside them on the right.

    The legend never covers data (an in-axes `loc="best"` can) and never takes width from
    the axes: constrained layout makes room for `loc="outside right upper"` by shrinking the
    axes, so the figure is widened by what they lost (`_keep_axes_width`) and the axes keep the
    width they have without a legend, however long its labels. Returns the Legend (None if
    nothing is labelled); it is `fig.legends[0]`.
    """
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if not handles:
        return None
    width = _axes_width_in(fig, axes[0])
    legend = fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    _keep_axes_width(fig, axes[0], width)
    return legend


def _axes_width_in(fig: Any, ax: Any) -> float:
    """The width of `ax` in inches once the figure's (constrained) layout has run."""
    fig.get_layout_engine().execute(fig)
    return ax.get_position().width * fig.get_figwidth()


def _keep_axes_width(fig: Any, ax: Any, width_in: float, tolerance_in: float = 0.01) -> None:
    """Widens `fig` until `ax` is `width_in` inches wide again. Constrained layout's margins
    are in inches, so one correction is all but exact, unless the squeezed axes had made their
    own margins differ (a title wider than them): then one or two more (at most four in all)."""
    for _ in range(4):
        lost = width_in - _axes_width_in(fig, ax)
        if abs(lost) <= tolerance_in:
            return
        fig.set_figwidth(fig.get_figwidth() + lost)


def _points_note(df: pd.DataFrame) -> str:
    """", N rows per point" for curves binned by `run_frames` (`attrs["rows_per_point"]` > 1), else ""."""
    per = int(df.attrs.get("rows_per_point", 1) or 1)
    return f", {per} rows per point" if per > 1 else ""


def _kl_guides(ax: Any) -> None:
    """Guide lines at 0.01 ("watch") and 0.03 ("lag hurting"), both kept inside the y range."""
    ax.axhline(KL_WATCH, color="tab:orange", linestyle=":", linewidth=1.2, label=f"{KL_WATCH:g}: watch")
    ax.axhline(KL_HURTING, color="tab:red", linestyle=":", linewidth=1.2, label=f"{KL_HURTING:g}: lag hurting")
    top = ax.get_ylim()[1]
    ax.set_ylim(0, max(top, KL_HURTING * 1.15))


def _seed_groups(df: pd.DataFrame) -> list[pd.DataFrame]:
    if "seed" in df.columns:
        return [g for _, g in df.groupby("seed", sort=True)]
    return [df]


def _mean_over_seeds(df: pd.DataFrame, x: str, columns: Sequence[str]) -> pd.DataFrame:
    """Per distinct x: the NaN-skipping mean over seeds of each column, sorted by x."""
    data = {x: _numeric(df[x])}
    for c in columns:
        data[c] = _numeric(df[c])
    frame = pd.DataFrame(data).dropna(subset=[x])
    return frame.groupby(x, sort=True).mean().reset_index()


# ---------------------------------------------------------------------------- curves


def seed_quantiles(df: pd.DataFrame, x: str = "env_steps", y: str = "episode_return") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """(grid, median, q25, q75, num_seeds) of `y` over seeds on a common x grid.

    Each seed's finite (x, y) points are linearly interpolated onto the grid: the distinct x
    values of all seeds (or 500 evenly spaced points if there are more) restricted to the range
    every seed covers, so every grid point's statistics are over all seeds. Seeds with no
    finite y are left out.
    """
    curves = []
    for g in _seed_groups(df):
        xs, ys = _numeric(g[x]), _numeric(g[y])
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
    fig, ax = _figure()
    plotted, most_seeds = 0, 0
    for i, (name, df) in enumerate(runs.items()):
        _require(df, [x, y], f"learning_curve (run {name!r})")
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
        _legend_outside(fig, ax)
    ax.set_xlabel(_X_LABELS.get(x, x))
    ax.set_ylabel(y.replace("_", " "))
    ax.set_title("Learning curve (median over seeds, 25-75% band)" if most_seeds > 1 else "Learning curve (1 seed)")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return fig


def kl_over_time(df: pd.DataFrame, path: str | os.PathLike | None = None, x: str = "env_steps",
                 lagged: bool = True) -> Any:
    """`approx_kl` (solid) and `approx_kl_max` (dashed, if present) against env steps, mean over
    seeds, with guide lines at 0.01 ("watch") and 0.03 ("lag hurting") when `lagged` (a run
    without lag, e.g. sync mode, gets no lag guides: nothing of its KL comes from lag).

    `fig.axes[0].lines`: [approx_kl, approx_kl_max (if present), 0.01 guide, 0.03 guide (lagged only)].
    """
    _require(df, [x, "approx_kl"], "kl_over_time")
    cols = ["approx_kl"] + (["approx_kl_max"] if "approx_kl_max" in df.columns else [])
    agg = _mean_over_seeds(df, x, cols)
    fig, ax = _figure()
    ax.plot(agg[x], agg["approx_kl"], color="C0", linewidth=1.6, label="approx_kl (mean over minibatches)")
    if "approx_kl_max" in cols:
        ax.plot(agg[x], agg["approx_kl_max"], color="C0", linestyle="--", linewidth=1.0, label="approx_kl_max")
    if lagged:
        _kl_guides(ax)
    ax.set_xlabel(_X_LABELS.get(x, x))
    ax.set_ylabel("KL to behaviour policy")
    notes = ("mean over seeds" if df.get("seed") is not None and df["seed"].nunique() > 1 else "") + _points_note(df)
    ax.set_title("KL to the behaviour policy" + (f" ({notes.lstrip(', ')})" if notes else ""))
    return _finish(fig, ax, path)


def _runs_mapping(runs: Mapping[str, pd.DataFrame] | pd.DataFrame, what: str) -> Mapping[str, pd.DataFrame]:
    if isinstance(runs, pd.DataFrame):
        runs = {"run": runs}
    if not runs:
        raise ValueError(f"{what} needs at least one run")
    return runs


def kl_over_time_runs(
    runs: Mapping[str, pd.DataFrame] | pd.DataFrame, path: str | os.PathLike | None = None, x: str = "env_steps"
) -> Any:
    """Several runs overlaid: per run `approx_kl` (mean over seeds) against `x`, with the 0.01
    ("watch") and 0.03 ("lag hurting") guides.

    `runs` maps a label to that run's metrics DataFrame. `fig.axes[0].lines[i]` is the i-th
    run with a finite `approx_kl`; the last two lines are the guides.
    """
    runs = _runs_mapping(runs, "kl_over_time_runs")
    fig, ax = _figure()
    for i, (name, df) in enumerate(runs.items()):
        _require(df, [x, "approx_kl"], f"kl_over_time_runs (run {name!r})")
        agg = _mean_over_seeds(df, x, ["approx_kl"]).dropna(subset=["approx_kl"])
        if len(agg):
            ax.plot(agg[x], agg["approx_kl"], color=f"C{i % 10}", linewidth=1.6, label=str(name))
    _kl_guides(ax)
    ax.set_xlabel(_X_LABELS.get(x, x))
    ax.set_ylabel("KL to behaviour policy (approx_kl)")
    ax.set_title("KL to the behaviour policy (mean over seeds)")
    return _finish(fig, ax, path)


# ---------------------------------------------------------------------------- lag


def summed_lag_histogram(df: pd.DataFrame) -> np.ndarray:
    """Element-wise sum of the `lag_histogram` lists over all rows (None -> 0): `analysis.lag_histogram_of`."""
    _require(df, ["lag_histogram"], "lag_histogram")
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
    fig, ax = _figure()
    ax.bar(lags, counts, color="C2", width=0.8)
    ax.set_xlabel("lag (learner version at consumption - policy version)")
    ax.set_ylabel("samples in consumed batches")
    mean = float((lags * counts).sum() / total) if total > 0 else math.nan
    ax.set_title(f"Lag histogram ({int(total):,} samples, mean lag {mean:.2f})")
    _lag_ticks(ax, len(lags), open_ended)
    ax.grid(alpha=0.3, axis="y")
    _save(fig, path)
    return fig


def lag_histograms(runs: Mapping[str, pd.DataFrame] | pd.DataFrame, path: str | os.PathLike | None = None) -> Any:
    """Several runs' lag histograms overlaid: per run, the fraction of its consumed samples at
    each lag (`analysis.lag_histogram_of` / its total, so runs of different lengths compare),
    a line with markers. Runs without `lag_histogram` lists are left out.

    `fig.axes[0].lines[i]` is the i-th run that has a histogram; its y data are the fractions.
    """
    runs = _runs_mapping(runs, "lag_histograms")
    fig, ax = _figure()
    width = 0
    for i, (name, df) in enumerate(runs.items()):
        if not _has_values(df, "lag_histogram", lists=True):
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
        _legend_outside(fig, ax)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("lag (learner version at consumption - policy version)")
    ax.set_ylabel("fraction of consumed samples")
    ax.set_title("Lag histograms")
    ax.grid(alpha=0.3)
    _save(fig, path)
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
    _require(df, ["kl_per_lag"], "kl_per_lag")
    rows = _list_rows(df["kl_per_lag"])
    if not rows:
        raise ValueError("kl_per_lag: the 'kl_per_lag' column has no list-valued rows")
    stacked = _stack_padded(rows)
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
    fig, ax = _figure()
    ax.bar(lags[ok], means[ok], color="C4", width=0.8, label="mean approx_kl")
    _kl_guides(ax)
    ax.set_xlabel("lag")
    ax.set_ylabel("KL to behaviour policy")
    ax.set_title("KL per lag" + (f" (no samples at lag {', '.join(map(str, lags[~ok]))})" if (~ok).any() and (~ok).sum() <= 8 else ""))
    if len(lags):
        ax.set_xlim(-0.6, len(lags) - 0.4)
        _lag_ticks(ax, len(lags), open_ended)
    return _finish(fig, ax, path, grid_axis="y")


# ---------------------------------------------------------------------------- throughput


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
    frame = pd.DataFrame({"key": _numeric(df[key]), "wall_time": _numeric(df["wall_time"]), **columns})
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
    _require(df, ["wall_time", "steps_per_second"], "throughput")
    rolling_mean([], window)  # validates window before anything is drawn
    key = "iteration" if "iteration" in df.columns else "wall_time"
    columns = {"sps": _numeric(df["steps_per_second"])}
    if "sampler_steps_per_second" in df.columns:
        columns.update(_sampler_rates(df))
    agg = _per_iteration(df, key, columns)
    fig, ax = _figure()
    ax.plot(agg["wall_time"], rolling_mean(agg["sps"], window), color="C0", linewidth=1.8, label="total (all seeds)")
    samplers = [c for c in agg.columns if c.startswith("s") and c[1:].isdigit()]
    for j, name in enumerate(samplers):
        ax.plot(agg["wall_time"], rolling_mean(agg[name], window), linestyle="--", linewidth=1.0,
                color=f"C{(j + 1) % 10}", label=f"sampler {j}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("env steps / s")
    unit = "points" if _points_note(df) else "iterations"
    ax.set_title("Throughput" + (f" (rolling mean over {window} {unit}" if window > 1 else f" (per {unit[:-1]}") + _points_note(df) + ")")
    return _finish(fig, ax, path)


SAMPLER_TIME_COLUMNS = (
    ("sampler_rollout_s", "rollout"),
    ("sampler_wait_params_s", "waiting for params"),
    ("sampler_wait_buffer_s", "buffer put (space, lock, write)"),
    ("sampler_latency_s", "simulated env latency"),
)


def sampler_time_split(df: pd.DataFrame, path: str | os.PathLike | None = None) -> Any:
    """Per sampler, where its time went (threaded runs): stacked horizontal bars of the
    cumulative seconds in the last row's `sampler_rollout_s`, `sampler_wait_params_s`,
    `sampler_wait_buffer_s` and `sampler_latency_s` (one bar per sampler, in that order
    of segments: `fig.axes[0].containers[k]` is segment k)."""
    columns = [c for c, _ in SAMPLER_TIME_COLUMNS]
    _require(df, columns, "sampler_time_split")
    last = df.iloc[-1]
    seconds = np.array([[np.nan if v is None else v for v in last[c]] for c in columns], dtype=np.float64)
    fig, ax = _figure(figsize=(8.5, 0.6 * seconds.shape[1] + 1.8))
    samplers = np.arange(seconds.shape[1])
    left = np.zeros(seconds.shape[1])
    for k, (_, label) in enumerate(SAMPLER_TIME_COLUMNS):
        ax.barh(samplers, seconds[k], left=left, color=f"C{k}", label=label)
        left = left + np.nan_to_num(seconds[k])
    ax.set_yticks(samplers)
    ax.set_yticklabels([f"sampler {j}" for j in samplers])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (cumulative)")
    ax.set_title("Sampler time split")
    return _finish(fig, ax, path, grid_axis="x")


def sweep_throughput_kl(df: pd.DataFrame, x: str, path: str | os.PathLike | None = None) -> Any:
    """For a sweep DataFrame with a column `x` (e.g. "num_samplers"): mean `steps_per_second`
    (left axis, `fig.axes[0].lines[0]`) and mean `approx_kl` (right axis,
    `fig.axes[1].lines[0]`, with the 0.01 / 0.03 guides) per value of `x`.

    Numeric `x` is plotted in order (log2 axis when it spans a factor of 8 or more);
    other values are categories in order of first appearance.
    """
    _require(df, [x, "steps_per_second", "approx_kl"], "sweep_throughput_kl")
    frame = pd.DataFrame({"x": df[x].to_numpy(), "sps": _numeric(df["steps_per_second"]), "kl": _numeric(df["approx_kl"])})
    numeric = pd.api.types.is_numeric_dtype(frame["x"]) and not pd.api.types.is_bool_dtype(frame["x"])
    agg = frame.groupby("x", sort=numeric).mean()
    if numeric:
        xs = agg.index.to_numpy(dtype=np.float64)
        ticks, ticklabels = xs, [f"{v:g}" for v in xs]
    else:
        xs = np.arange(len(agg), dtype=np.float64)
        ticks, ticklabels = xs, [str(v) for v in agg.index]
    fig, ax = _figure()
    ax.plot(xs, agg["sps"].to_numpy(), color="C0", marker="o", linewidth=1.8, label="env steps / s")
    ax.set_ylabel("env steps / s (mean)", color="C0")
    ax.tick_params(axis="y", colors="C0")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(xs, agg["kl"].to_numpy(), color="C3", marker="s", linewidth=1.8, label="approx_kl")
    _kl_guides(ax2)
    ax2.set_ylabel("approx_kl (mean)", color="C3")
    ax2.tick_params(axis="y", colors="C3")
    if numeric and len(xs) and xs.min() > 0 and xs.max() / xs.min() >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels(ticklabels)
    ax.set_xlabel(x)
    ax.set_title(f"Throughput and KL vs {x}")
    _legend_outside(fig, ax, ax2)
    ax.grid(alpha=0.3)
    _save(fig, path)
    return fig


def tune_knee(rows: Sequence[Mapping[str, Any]], knee: int, kl_target: float, path: str | os.PathLike | None = None) -> Any:
    """`tune` step 2: consumer env steps/s (left axis, `fig.axes[0].lines[0]`) and mean KL
    (right axis, `fig.axes[1].lines[0]`) vs the number of samplers, with the linear
    extrapolation of one sampler (dotted), the knee (vertical line) and the KL target
    (horizontal line on the KL axis). `rows` hold `num_samplers`, `consumer_steps_per_s` and
    `approx_kl_mean`."""
    if not rows:
        raise ValueError("tune_knee needs at least one measured sampler count")
    xs = np.asarray([r["num_samplers"] for r in rows], np.float64)
    rate = np.asarray([r["consumer_steps_per_s"] for r in rows], np.float64)
    kl = np.asarray([r["approx_kl_mean"] for r in rows], np.float64)
    fig, ax = _figure()
    ax.plot(xs, rate, color="C0", marker="o", linewidth=1.8, label="consumer env steps / s")
    ax.plot(xs, rate[0] * xs, color="C0", linestyle=":", linewidth=1.0, label="linear (n x one sampler)")
    ax.axvline(knee, color="k", linestyle="--", linewidth=1.0, label=f"knee: {knee} sampler(s)")
    ax.set_ylim(0, max(float(np.nanmax(rate)) * 1.3, 1.0))
    ax.set_ylabel("consumer env steps / s", color="C0")
    ax.set_xlabel("samplers")
    ax.set_xticks(xs)
    ax2 = ax.twinx()
    ax2.plot(xs, kl, color="C3", marker="s", linewidth=1.8, label="mean approx_kl")
    ax2.axhline(kl_target, color="C3", linestyle="--", linewidth=1.0, label=f"KL target {kl_target:g}")
    ax2.set_ylim(0, max(float(np.nanmax(kl)), kl_target) * 1.3)
    ax2.set_ylabel("mean approx_kl", color="C3")
    ax.set_title("Throughput and KL vs samplers (tune step 2)")
    _legend_outside(fig, ax, ax2)
    ax.grid(alpha=0.3)
    _save(fig, path)
    return fig


def kl_vs_buffer(rows: Sequence[Mapping[str, Any]], kl_target: float, path: str | os.PathLike | None = None) -> Any:
    """`tune` step 1: mean KL vs ring-buffer length (chunks, log2 axis), one line per sampler
    count (`fig.axes[0].lines[i]`, in order of the counts), with the KL target. `rows` hold
    `num_samplers`, `buffer_chunks` and `approx_kl_mean` (repeated settings are averaged)."""
    if not rows:
        raise ValueError("kl_vs_buffer needs at least one measured buffer length")
    frame = pd.DataFrame({"n": [r["num_samplers"] for r in rows], "chunks": [r["buffer_chunks"] for r in rows],
                          "kl": [r["approx_kl_mean"] for r in rows]}).groupby(["n", "chunks"], as_index=False).mean()
    fig, ax = _figure()
    for i, (n, group) in enumerate(frame.groupby("n")):
        group = group.sort_values("chunks")
        ax.plot(group["chunks"], group["kl"], marker="o", color=f"C{i}", linewidth=1.8, label=f"{n} sampler(s)")
    ax.axhline(kl_target, color="k", linestyle="--", linewidth=1.0, label=f"KL target {kl_target:g}")
    chunks = sorted(frame["chunks"].unique())
    if chunks[-1] / chunks[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(chunks)
    ax.set_xticklabels([str(c) for c in chunks])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ring-buffer length (rollout chunks)")
    ax.set_ylabel("mean approx_kl")
    ax.set_title("KL to the behaviour policy vs buffer length")
    return _finish(fig, ax, path)


# ---------------------------------------------------------------------------- a run directory


def _has_values(df: pd.DataFrame, column: str, lists: bool = False) -> bool:
    if column not in df.columns:
        return False
    if lists:
        return any(np.isfinite(r).any() for r in _list_rows(df[column]))
    return bool(np.isfinite(_numeric(df[column])).any())


def _has_lag(lists: pd.DataFrame) -> bool:
    """Whether a run's summed lag histogram has any sample at lag >= 1."""
    if not _has_values(lists, "lag_histogram", lists=True):
        return False
    counts = analysis.lag_histogram_of(lists)
    return bool(counts[1:].sum() > 0)


def _run_mode(run_dir: str) -> str | None:
    """The mode in `run_dir/config.json`, None when it cannot be read."""
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            return json.load(f).get("mode")
    except (OSError, ValueError, AttributeError):
        return None


def plot_run(run_dir: str | os.PathLike, label: str | None = None, out_dir: str | os.PathLike | None = None) -> list[str]:
    """Reads `run_dir/metrics.jsonl` and writes every applicable PNG into `out_dir` (default `run_dir`):
    learning_curve.png, kl_over_time.png, throughput.png, and lag_histogram.png /
    kl_per_lag.png / sampler_time.png (threaded) when those columns exist. A plot whose columns have no finite value yet
    (e.g. no episode finished) is skipped. `label` names the run in the learning curve's
    legend (default: the directory's name). Returns the paths written.

    The file is read once, line by line (`run_frames`): the list-valued columns are reduced as
    they are read, and beyond `MAX_CURVE_POINTS` rows the curves are binned (each point the
    consecutive rows of a seed folded by the metric rules, `aggregate.RowFold`, as a
    `log_every` row; the figures' titles then say how many), so the memory
    the plots at the end of a run need does not grow with its length."""
    run_dir = os.fspath(run_dir)
    curves, lists = run_frames(run_dir, "plot_run")
    name = label or os.path.basename(os.path.normpath(os.path.abspath(run_dir))) or "run"
    written: list[str] = []

    target = run_dir if out_dir is None else os.fspath(out_dir)
    os.makedirs(target, exist_ok=True)

    def out(stem: str) -> str:
        p = os.path.join(target, f"{stem}.png")
        written.append(p)
        return p

    # Each figure is cleared once written: its artists are freed at once (the figure itself sits
    # in a reference cycle until a garbage collection), so the next figure reuses their memory.
    if _has_values(curves, "episode_return") and "env_steps" in curves.columns:
        learning_curve({name: curves}, x="env_steps", path=out("learning_curve")).clear()
    lagged = _has_lag(lists)
    open_ended = _run_mode(run_dir) in ("threaded", None)  # a threaded histogram's last bucket is a catch-all
    if _has_values(curves, "approx_kl") and "env_steps" in curves.columns:
        kl_over_time(curves, path=out("kl_over_time"), lagged=lagged).clear()
    if _has_values(curves, "steps_per_second") and "wall_time" in curves.columns:
        throughput(curves, path=out("throughput")).clear()
    if lagged:  # a run at lag 0 throughout (sync) gets no lag figures: they would show one bar at 0
        lag_histogram(lists, path=out("lag_histogram"), open_ended=open_ended).clear()
        if _has_values(lists, "kl_per_lag", lists=True):
            kl_per_lag(lists, path=out("kl_per_lag"), open_ended=open_ended).clear()
    if all(c in lists.columns for c, _ in SAMPLER_TIME_COLUMNS):
        sampler_time_split(lists, path=out("sampler_time")).clear()
    return written


# The columns `plot_run` reads (of the rows that have them): scalars drawn per row (and
# `episodes_finished`, the weight of `episode_return` when rows are binned) ...
PLOT_RUN_CURVE_COLUMNS = (
    "seed", "config_id", "iteration", "env_steps", "wall_time", "episode_return", "episodes_finished", "approx_kl",
    "approx_kl_max", "steps_per_second", "sampler_steps_per_second",
)
# ... and lists, reduced over the rows as they are read.
PLOT_RUN_LIST_COLUMNS = ("lag_histogram", "kl_per_lag", *(c for c, _ in SAMPLER_TIME_COLUMNS))
PLOT_RUN_COLUMNS = PLOT_RUN_CURVE_COLUMNS + PLOT_RUN_LIST_COLUMNS


class _PaddedSum:
    """Element-wise sum and count of the finite entries of lists of varying length."""

    def __init__(self) -> None:
        self.sums = np.zeros(0)
        self.counts = np.zeros(0)

    def add(self, values: Sequence[Any]) -> None:
        row = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        if len(row) > len(self.sums):
            self.sums = np.pad(self.sums, (0, len(row) - len(self.sums)))
            self.counts = np.pad(self.counts, (0, len(row) - len(self.counts)))
        finite = np.isfinite(row)
        self.sums[: len(row)] += np.where(finite, row, 0.0)
        self.counts[: len(row)] += finite

    def mean(self) -> np.ndarray:
        """Per position, the mean of the finite entries added (NaN where there was none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / np.maximum(self.counts, 1), np.nan)


# Beyond this many metrics rows, `run_frames` bins the curves (so what the end of a run's plots
# hold does not grow with its length): each curve point then stands for `rows_per_point`
# consecutive rows of one seed, folded by the metric rules (`aggregate.RowFold`, as a
# `log_every` row is). 4,000 points are several per pixel of a figure.
MAX_CURVE_POINTS = 4000


class _Curves:
    """The curve columns of `run_frames`, built row by row: every row when `rows_per_point` is
    1, else one point per `rows_per_point` consecutive rows of each (config_id, seed), folded
    as `aggregate.aggregate_rows` folds a `log_every` window (`aggregate.RowFold`, which holds
    no row but the last; a seed's last bin may hold fewer rows)."""

    def __init__(self, rows_per_point: int) -> None:
        self.rows_per_point = rows_per_point
        self.columns: dict[str, list[Any]] = {}
        self.points = 0
        self._bins: dict[tuple[Any, Any], RowFold] = {}

    def add(self, row: Mapping[str, Any]) -> None:
        if self.rows_per_point == 1:
            self._append(row)
            return
        key = (row.get("config_id"), row.get("seed"))
        current = self._bins.get(key)
        if current is None:
            current = self._bins[key] = RowFold()
        current.add({name: row[name] for name in PLOT_RUN_CURVE_COLUMNS if name in row})
        if current.rows == self.rows_per_point:
            self._append(current.row())
            del self._bins[key]

    def frame(self) -> pd.DataFrame:
        """The curves (the seeds' unfinished bins last), `attrs["rows_per_point"]` set."""
        for current in self._bins.values():
            self._append(current.row())
        self._bins = {}
        frame = pd.DataFrame(self.columns)
        frame.attrs["rows_per_point"] = self.rows_per_point
        return frame

    def _append(self, row: Mapping[str, Any]) -> None:
        for name in PLOT_RUN_CURVE_COLUMNS:
            if name in row:
                if name not in self.columns:  # (not setdefault: its default list would be built every row)
                    self.columns[name] = [None] * self.points
                self.columns[name].append(row[name])
            elif name in self.columns:
                self.columns[name].append(None)
        self.points += 1


def _count_rows(path: str) -> int:
    """The non-blank lines of a file (a metrics.jsonl's rows, a torn last line included)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def _metrics_path(run_dir: str | os.PathLike, what: str) -> str:
    """run_dir/metrics.jsonl; FileNotFoundError (naming `what`) when it is not there."""
    path = os.path.join(os.fspath(run_dir), "metrics.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what}: no metrics.jsonl in {os.fspath(run_dir)!r}")
    return path


def run_frames(run_dir: str | os.PathLike, what: str = "run_frames") -> tuple[pd.DataFrame, pd.DataFrame]:
    """What `plot_run` draws from `run_dir/metrics.jsonl`, read in one pass:

    - `curves`: the `PLOT_RUN_CURVE_COLUMNS` each row has (None where a row lacks one), one
      row per metrics row - or, when the file has more than `MAX_CURVE_POINTS` rows, one per
      `rows_per_point` = ceil(rows / MAX_CURVE_POINTS) consecutive rows of a seed, folded by
      the metric rules as a `log_every` row is (`aggregate.RowFold`: iteration, env steps and
      wall time of the bin's last row, `episode_return` weighted by the episodes each row
      finished, `steps_per_second` the harmonic mean, `approx_kl_max` the maximum, `approx_kl`
      the mean, ...), so at most MAX_CURVE_POINTS + one per seed points however long the run;
      `curves.attrs["rows_per_point"]` says which;
    - `lists`: one row that stands for all of them for the list-valued plots: `lag_histogram`
      summed over the rows (`analysis.lag_histogram_of`), `kl_per_lag` averaged per bucket over
      the rows that have a finite value there (`mean_kl_per_lag`; NaN where none has), and the
      sampler time columns of the last row (what `sampler_time_split` reads). A column no row
      holds a list in is absent.

    So `lag_histogram(lists)`, `kl_per_lag(lists)` and `sampler_time_split(lists)` draw what
    they would draw from every row, and neither frame grows with the run beyond
    MAX_CURVE_POINTS rows (the file is counted, then parsed line by line).

    Raises FileNotFoundError when there is no metrics.jsonl, ValueError when it has no rows.
    """
    from ppo_async.report.metrics import iter_jsonl

    metrics_path = _metrics_path(run_dir, what)
    curves = _Curves(max(1, math.ceil(_count_rows(metrics_path) / MAX_CURVE_POINTS)))
    histogram, kl = _PaddedSum(), _PaddedSum()
    last: dict[str, Any] = {}
    n = 0
    for row in iter_jsonl(metrics_path, PLOT_RUN_COLUMNS):
        curves.add(row)
        if isinstance(row.get("lag_histogram"), list):
            histogram.add(row["lag_histogram"])
        if isinstance(row.get("kl_per_lag"), list):
            kl.add(row["kl_per_lag"])
        last = row
        n += 1
    if n == 0:
        raise ValueError(f"{what}: {metrics_path} has no rows")
    lists: dict[str, list[Any]] = {}
    if histogram.counts.sum() > 0:
        lists["lag_histogram"] = [histogram.sums.tolist()]
    if kl.counts.sum() > 0:
        lists["kl_per_lag"] = [kl.mean().tolist()]
    for name, _ in SAMPLER_TIME_COLUMNS:
        if name in last:
            lists[name] = [last[name]]
    return curves.frame(), pd.DataFrame(lists, index=[0]) if lists else pd.DataFrame(index=[0])


def read_run_metrics(run_dir: str | os.PathLike, what: str = "read_run_metrics", columns: Sequence[str] | None = None) -> pd.DataFrame:
    """`run_dir/metrics.jsonl` as a DataFrame (one row per seed x iteration; `metrics.read_jsonl`),
    with only `columns` when given (read line by line, the rest is never held).

    Raises FileNotFoundError when there is no metrics.jsonl, ValueError when it has no rows.
    """
    from ppo_async.report.metrics import read_jsonl

    metrics_path = _metrics_path(run_dir, what)
    df = pd.DataFrame(read_jsonl(metrics_path, columns))
    if df.empty:
        raise ValueError(f"{what}: {metrics_path} has no rows")
    return df


COMPARE_FILES = ("return_vs_env_steps.png", "return_vs_wall_time.png", "kl_over_time.png", "lag_histogram.png")


def compare_runs(runs: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike) -> list[str]:
    """Overlaid figures of several labelled runs, written into `out_dir` (created):
    return_vs_env_steps.png and return_vs_wall_time.png (`learning_curve`: per run the median
    over seeds and a 25-75% band), kl_over_time.png (`kl_over_time_runs`) and
    lag_histogram.png (`lag_histograms`). A figure for which no run has a finite value is
    skipped. Returns the paths written, in that order."""
    runs = _runs_mapping(runs, "compare_runs")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []

    def out(index: int) -> str:
        written.append(os.path.join(out_dir, COMPARE_FILES[index]))
        return written[-1]

    def having(*columns: str) -> dict[str, pd.DataFrame]:
        return {k: d for k, d in runs.items() if all(c in d.columns for c in columns[1:]) and _has_values(d, columns[0])}

    for index, x in ((0, "env_steps"), (1, "wall_time")):
        with_returns = having("episode_return", x)
        if with_returns:
            learning_curve(with_returns, x=x, path=out(index))
    with_kl = having("approx_kl", "env_steps")
    if with_kl:
        kl_over_time_runs(with_kl, path=out(2))
    if any(_has_values(d, "lag_histogram", lists=True) for d in runs.values()):
        lag_histograms(runs, path=out(3))
    return written
