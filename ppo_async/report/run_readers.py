"""Reading a run directory for its figures: `run_frames` (metrics.jsonl in one pass, the curves
binned beyond `MAX_CURVE_POINTS` rows by the metric rules, the list-valued columns reduced as
they are read), `read_run_metrics` (the rows as a DataFrame) and `run_mode` (config.json).
Side effect: file reads only.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report.aggregate import RowFold
from ppo_async.report.sampler_plots import SAMPLER_TIME_COLUMNS


def run_mode(run_dir: str) -> str | None:
    """The mode in `run_dir/config.json`, None when it cannot be read."""
    try:
        with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
            return json.load(f).get("mode")
    except (OSError, ValueError, AttributeError):
        return None


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
