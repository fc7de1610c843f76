"""Small pure helpers to analyse run DataFrames (`TrainResult.to_dataframe()`, `pa.sweep`).

Every function takes a tidy DataFrame with one row per (group, learner iteration), where a
group is a run (by default the `seed` column; `("config_id", "seed")` for a sweep), and rows
of a group are in iteration order. Metric values are coerced with
`pd.to_numeric(errors="coerce")`, so None / NaN / non-numeric entries (an iteration in which no
episode finished) never count as reaching a threshold and are ignored by means.

A leaf module: it imports only numpy and pandas, nothing from `ppo_async`.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np
import pandas as pd

__all__ = ["first_reach", "steps_to_threshold", "final_returns"]

By = Union[str, Sequence[str]]


def _check_columns(df: pd.DataFrame, columns: Sequence[str]) -> None:
    """Raises ValueError naming the first column of `columns` missing from `df`."""
    for name in columns:
        if name not in df.columns:
            available = ", ".join(str(c) for c in df.columns) or "(none)"
            raise ValueError(f"column {name!r} is not in the DataFrame; available columns: {available}")


def _by_tuple(by: By) -> tuple[str, ...]:
    keys = (by,) if isinstance(by, str) else tuple(by)
    if not keys:
        raise ValueError("by must name at least one column")
    return keys


def _groups(df: pd.DataFrame, by: tuple[str, ...]):
    """(key tuple, rows) per group, sorted by key; NaN / None keys form their own group."""
    for key, group in df.groupby(list(by), sort=True, dropna=False):
        yield (key if isinstance(key, tuple) else (key,)), group


def _series(keys: list[tuple], values: list[float], by: tuple[str, ...], name: str) -> pd.Series:
    if len(by) == 1:
        index = pd.Index([k[0] for k in keys], name=by[0])
    else:
        index = pd.MultiIndex.from_tuples(keys, names=list(by)) if keys else pd.MultiIndex.from_arrays(
            [[] for _ in by], names=list(by)
        )
    return pd.Series(np.asarray(values, dtype=float), index=index, name=name)


def first_reach(df: pd.DataFrame, threshold: float, column: str = "episode_return") -> tuple[float, float]:
    """When the rows of one run first reach `threshold`.

    Args:
      df: the rows of one run, in iteration order, with `env_steps` and `column` (and
        optionally `wall_time`) columns.
      threshold: the value to reach (`column >= threshold`).
      column: the metric compared with `threshold`.

    Returns:
      `(env_steps, wall_time)` of the first row whose `column` is >= `threshold`, as floats;
      `(inf, inf)` if no row does. `wall_time` is inf when the DataFrame has no `wall_time`
      column or its value in that row is missing.

    Raises:
      ValueError: `env_steps` or `column` is not a column of `df`.
    """
    _check_columns(df, ("env_steps", column))
    hit = np.flatnonzero((pd.to_numeric(df[column], errors="coerce") >= threshold).to_numpy())
    if not len(hit):
        return math.inf, math.inf
    row = df.iloc[int(hit[0])]
    steps = float(row["env_steps"])
    wall = math.nan
    if "wall_time" in df.columns:
        try:
            wall = float(row["wall_time"])
        except (TypeError, ValueError):  # None or a non-numeric entry
            pass
    return steps, (math.inf if math.isnan(wall) else wall)


def steps_to_threshold(
    df: pd.DataFrame, threshold: float, by: By = ("seed",), column: str = "episode_return"
) -> pd.Series:
    """Per group: the env steps of the first row whose `column` reaches `threshold`.

    Args:
      df: rows of one or more runs, each run's rows in iteration order, with `env_steps`,
        `column` and the `by` columns.
      threshold: the value to reach (`column >= threshold`).
      by: the column(s) that identify a run (a single name is accepted too).
      column: the metric compared with `threshold`.

    Returns:
      A float Series named "steps_to_threshold", sorted by group key, indexed by the `by`
      values (a plain Index for one key, a MultiIndex for several); NaN for a group that
      never reaches `threshold`.

    Raises:
      ValueError: a `by` column, `env_steps` or `column` is not a column of `df`.
    """
    keys_by = _by_tuple(by)
    _check_columns(df, (*keys_by, "env_steps", column))
    keys, values = [], []
    for key, group in _groups(df, keys_by):
        steps, _ = first_reach(group, threshold, column)
        keys.append(key)
        values.append(steps if math.isfinite(steps) else math.nan)
    return _series(keys, values, keys_by, "steps_to_threshold")


def final_returns(
    df: pd.DataFrame, last_fraction: float = 0.1, by: By = ("seed",), column: str = "episode_return"
) -> pd.Series:
    """Per group: the mean of `column` over the group's last `last_fraction` of rows.

    The tail of a group of n rows is its last `max(1, int(n * last_fraction))` rows (as
    `TrainResult.final_returns`); NaN / None values in it are ignored by the mean (NaN if all
    of them are missing).

    Args:
      df: rows of one or more runs, each run's rows in iteration order, with `column` and the
        `by` columns.
      last_fraction: the fraction of each group's rows to average, in (0, 1].
      by: the column(s) that identify a run (a single name is accepted too).
      column: the metric to average.

    Returns:
      A float Series named "final_return", sorted by group key, indexed by the `by` values (a
      plain Index for one key, a MultiIndex for several).

    Raises:
      ValueError: `last_fraction` is not in (0, 1], or a `by` column or `column` is not a
        column of `df`.
    """
    try:
        fraction = float(last_fraction)
    except (TypeError, ValueError):
        fraction = math.nan
    if isinstance(last_fraction, (bool, str, bytes)) or not 0 < fraction <= 1:  # NaN fails too
        raise ValueError(f"last_fraction = {last_fraction!r} is invalid: it must be in (0, 1]")
    keys_by = _by_tuple(by)
    _check_columns(df, (*keys_by, column))
    keys, values = [], []
    for key, group in _groups(df, keys_by):
        tail = group.tail(max(1, int(len(group) * fraction)))
        keys.append(key)
        values.append(float(pd.to_numeric(tail[column], errors="coerce").mean()))
    return _series(keys, values, keys_by, "final_return")
