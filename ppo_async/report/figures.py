"""The figure helpers every plot module shares: a Figure on the Agg canvas (`figure`,
`grid_figure`: no pyplot state, so plots work headless, in threads and in notebooks), saving,
the legend outside the axes (`legend_outside`), the KL guides, column checks and per-seed means.
Side effect: `save` writes a PNG file.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report import analysis

KL_WATCH = 0.01  # DESIGN.md: < 0.01 fine, 0.01-0.03 watch, > 0.03 lag is hurting
KL_HURTING = 0.03
X_LABELS = {"env_steps": "env steps (per seed)", "wall_time": "wall time (s)"}  # axis labels of x columns


def figure(nrows: int = 1, ncols: int = 1, figsize: tuple[float, float] = (8.5, 4.5)) -> tuple[Any, Any]:
    """A Figure on an Agg canvas (no global backend switch, no pyplot registry) and its axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols)
    return fig, axes


def save(fig: Any, path: str | os.PathLike | None) -> None:
    """Writes `fig` as a PNG at `path` (its folder created); nothing when `path` is None."""
    if path is None:
        return
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, format="png", dpi=100)


def finish(fig: Any, ax: Any, path: str | os.PathLike | None, grid_axis: str = "both") -> Any:
    """A one-axes figure's last steps: the legend outside the axes, a light grid, saved to
    `path` (None: not saved); returns the figure."""
    legend_outside(fig, ax)
    ax.grid(alpha=0.3, axis=grid_axis)
    save(fig, path)
    return fig


def require(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """TypeError unless `df` is a DataFrame; ValueError naming `what` and the `columns` it lacks."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what} needs a pandas DataFrame of metrics rows, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(
            f"{what} needs the column(s) {missing}, which the metrics do not have "
            f"(columns present: {sorted(map(str, df.columns))})"
        )


def numeric(series: pd.Series) -> np.ndarray:
    """float64 values with None / non-numbers as NaN."""
    return pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64)


def legend_outside(fig: Any, *axes: Any) -> Any:
    """One figure legend of every labelled artist of `axes`, outside them on the right.

    The legend never covers data (an in-axes `loc="best"` can) and never takes width from
    the axes: constrained layout makes room for `loc="outside right upper"` by shrinking the
    axes, so the figure is first widened by exactly the room it will take
    (`outside_legend_width_in`), and the axes keep the width they have without a legend, however
    long its labels. No layout pass is run here (the figure's own, when it is drawn or saved,
    is the only one). Returns the Legend (None if nothing is labelled); it is `fig.legends[0]`.
    """
    handles, labels = [], []
    for ax in axes:
        h, lab = ax.get_legend_handles_labels()
        handles += h
        labels += lab
    if not handles:
        return None
    legend = fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.set_figwidth(fig.get_figwidth() + outside_legend_width_in(fig, legend))
    return legend


def outside_legend_width_in(fig: Any, legend: Any) -> float:
    """The width (inches) constrained layout gives a figure legend placed outside on the right:
    the legend's own width, measured from its text and handles, plus the layout's horizontal pad
    (`w_pad`, inches) on each side of it (matplotlib's `_constrained_layout.make_layout_margins`)."""
    w_pad = float(fig.get_layout_engine().get()["w_pad"])
    return legend.get_window_extent(fig.canvas.get_renderer()).width / fig.dpi + 2.0 * w_pad


def points_note(df: pd.DataFrame) -> str:
    """", N rows per point" for curves binned by `run_frames` (`attrs["rows_per_point"]` > 1), else ""."""
    per = int(df.attrs.get("rows_per_point", 1) or 1)
    return f", {per} rows per point" if per > 1 else ""


def kl_guides(ax: Any) -> None:
    """Guide lines at 0.01 ("watch") and 0.03 ("lag hurting"), both kept inside the y range."""
    ax.axhline(KL_WATCH, color="tab:orange", linestyle=":", linewidth=1.2, label=f"{KL_WATCH:g}: watch")
    ax.axhline(KL_HURTING, color="tab:red", linestyle=":", linewidth=1.2, label=f"{KL_HURTING:g}: lag hurting")
    top = ax.get_ylim()[1]
    ax.set_ylim(0, max(top, KL_HURTING * 1.15))


def seed_groups(df: pd.DataFrame) -> list[pd.DataFrame]:
    """The rows of each seed (sorted by seed); all rows as one seed without a `seed` column."""
    if "seed" in df.columns:
        return [g for _, g in df.groupby("seed", sort=True)]
    return [df]


def mean_over_seeds(df: pd.DataFrame, x: str, columns: Sequence[str]) -> pd.DataFrame:
    """Per distinct x: the NaN-skipping mean over seeds of each column, sorted by x."""
    data = {x: numeric(df[x])}
    for c in columns:
        data[c] = numeric(df[c])
    frame = pd.DataFrame(data).dropna(subset=[x])
    return frame.groupby(x, sort=True).mean().reset_index()


def runs_mapping(runs: Mapping[str, pd.DataFrame] | pd.DataFrame, what: str) -> Mapping[str, pd.DataFrame]:
    """`runs` as {label: metrics rows} (one DataFrame: {"run": it}); ValueError naming `what` when empty."""
    if isinstance(runs, pd.DataFrame):
        runs = {"run": runs}
    if not runs:
        raise ValueError(f"{what} needs at least one run")
    return runs


def has_values(df: pd.DataFrame, column: str, lists: bool = False) -> bool:
    """Whether `column` of `df` holds a finite number (with `lists`: a list holding one)."""
    if column not in df.columns:
        return False
    if lists:
        return any(np.isfinite(r).any() for r in analysis.list_rows(df[column]))
    return bool(np.isfinite(numeric(df[column])).any())


def grid_figure(count: int, width: float = 5.0, height: float = 3.6) -> tuple[Any, list[Any]]:
    """A Figure on an Agg canvas (no pyplot state) with `count` axes in rows of at most 2 (axes
    beyond `count` in the last row hidden), each `width` x `height` inches; returns it and the
    `count`-plus axes as a flat list."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(max(count, 1), 2)
    rows = math.ceil(max(count, 1) / cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols)).reshape(-1)
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, list(axes)
