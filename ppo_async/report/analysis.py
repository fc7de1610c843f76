"""Small pure helpers to analyse run DataFrames (`TrainResult.to_dataframe()`, `pa.sweep`).

Every function takes a tidy DataFrame with one row per (group, learner iteration), where a
group is a run (by default the `seed` column; `("config_id", "seed")` for a sweep), and rows
of a group are in iteration order. `summarize` turns a run, a `TrainResult` or a whole sweep
into one table row per config (or per config and seed); `lag_histogram_of` and `per_sampler`
look at the lag of one run. Metric values are coerced with
`pd.to_numeric(errors="coerce")`, so None / NaN / non-numeric entries (an iteration in which no
episode finished) never count as reaching a threshold and are ignored by means.

A leaf module: it imports only numpy and pandas, nothing from `ppo_async`. Intervals over seeds
(t intervals, bootstraps) are in `ppo_async.report.stats`.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np
import pandas as pd

from ppo_async.report.metrics import check_fraction, tail_mean

__all__ = [
    "first_reach",
    "steps_to_threshold",
    "final_returns",
    "summarize",
    "SUMMARY_COLUMNS",
    "lag_histogram_of",
    "per_sampler",
    "run_measurements",
    "measured_kl",
]

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


_check_fraction = check_fraction  # (0, 1] or ValueError; one rule with `TrainResult.final_returns`


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
    fraction = _check_fraction(last_fraction)
    keys_by = _by_tuple(by)
    _check_columns(df, (*keys_by, column))
    keys, values = [], []
    for key, group in _groups(df, keys_by):
        keys.append(key)
        values.append(tail_mean(list(group[column]), fraction))
    return _series(keys, values, keys_by, "final_return")


# ---------------------------------------------------------------------------- list-valued columns


def list_rows(series: pd.Series) -> list[np.ndarray]:
    """The rows of a list-valued column (e.g. `lag_histogram`) as float arrays, None entries
    -> NaN; rows that hold no list (the column is missing in that row) are skipped."""
    out = []
    for value in series:
        if isinstance(value, (list, tuple, np.ndarray)):
            out.append(np.array([np.nan if v is None else v for v in value], dtype=np.float64))
    return out


def stack_padded(rows: list[np.ndarray]) -> np.ndarray:
    """`[len(rows), longest row]` float array, shorter rows padded with NaN."""
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def lag_histogram_of(df: pd.DataFrame) -> np.ndarray:
    """The whole lag histogram of the rows: the `lag_histogram` lists summed element-wise.

    Args:
      df: metrics rows (any number of iterations, seeds or configs) with a list-valued
        `lag_histogram` column (samples per lag 0..H-1 of the batch the learner took; the
        last bucket holds every larger lag). None entries count 0; shorter lists are padded.

    Returns:
      A float array `[H]`: bucket i is the number of samples with lag i (the last: >= H-1).

    Raises:
      ValueError: there is no `lag_histogram` column, or none of its rows is a list.
    """
    _check_columns(df, ("lag_histogram",))
    rows = list_rows(df["lag_histogram"])
    if not rows:
        raise ValueError("lag_histogram_of: the 'lag_histogram' column has no list-valued rows")
    return np.nansum(stack_padded(rows), axis=0)


# ---------------------------------------------------------------------------- per sampler


def _is_list(value) -> bool:
    return isinstance(value, (list, tuple, np.ndarray))


def _chunk_records(df: pd.DataFrame) -> pd.DataFrame:
    """One record per consumed chunk: `row` (position in df), `sampler_id`, `lag`, `approx_kl`.

    A chunk is made by one params snapshot, so all its samples share one lag. A row with one
    chunk (scalar `sampler_id`) has lag `lag_max` (= `lag_mean`; `lag_mean` when `lag_max` is
    missing). A row with several chunks (list `sampler_id`, e.g. threaded `chunks_per_batch` >
    1 or barrier) gives chunk i the lag `lag_max - (behavior_version[i] - min(behavior_version))`
    (the oldest chunk has the row's largest lag); without `behavior_version` every chunk gets
    the row's `lag_mean`. `approx_kl` is the row's (batch) value for each of its chunks.
    """
    n = len(df)
    lag_max = _numeric_or_nan(df, "lag_max")
    lag_mean = _numeric_or_nan(df, "lag_mean")
    row_lag = np.where(np.isfinite(lag_max), lag_max, lag_mean)
    kl = _numeric_or_nan(df, "approx_kl")
    versions = df["behavior_version"].tolist() if "behavior_version" in df.columns else [None] * n
    records = {"row": [], "sampler_id": [], "lag": [], "approx_kl": []}
    for i, (sid, version) in enumerate(zip(df["sampler_id"].tolist(), versions)):
        if _is_list(sid):
            ids = list(sid)
            if _is_list(version) and len(version) == len(ids) and all(v is not None for v in version) and np.isfinite(lag_max[i]):
                lags = [lag_max[i] - (float(v) - min(float(u) for u in version)) for v in version]
            else:
                lags = [lag_mean[i]] * len(ids)
        elif sid is None or (isinstance(sid, float) and math.isnan(sid)):
            continue
        else:
            ids, lags = [sid], [row_lag[i]]
        for s, lag in zip(ids, lags):
            records["row"].append(i)
            records["sampler_id"].append(s)
            records["lag"].append(lag)
            records["approx_kl"].append(kl[i])
    return pd.DataFrame(records)


def _numeric_or_nan(df: pd.DataFrame, column: str) -> np.ndarray:
    """`column` as float64 (non-numbers -> NaN); all NaN when the column is missing."""
    if column not in df.columns:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64)


def per_sampler(df: pd.DataFrame) -> pd.DataFrame:
    """Per sampler (simulated / threaded runs): how stale its data was and what it cost.

    Args:
      df: metrics rows with a `sampler_id` column (scalar per row, or a list when a batch
        holds several chunks) and `lag_max` / `lag_mean`, `behavior_version`, `approx_kl`
        where present (rows of several seeds are pooled).

    Returns:
      A DataFrame indexed by `sampler_id` (sorted) with columns `lag_mean` (mean lag of the
      sampler's consumed chunks; all chunks of a run have the same size, so this is also the
      per-sample mean), `lag_max`, `approx_kl_mean` (mean KL of the batches that held its
      chunks), `rows` (metrics rows with at least one of its chunks) and `chunks` (its chunks
      consumed). See `_chunk_records` for how a multi-chunk row's lag is split per chunk.
      Missing `lag_*` / `approx_kl` columns give NaN.

    Raises:
      ValueError: no `sampler_id` column (sync runs have none), or no row names a sampler.
    """
    if "sampler_id" not in df.columns:
        raise ValueError(
            "per_sampler needs a 'sampler_id' column (simulated and threaded runs have one; sync runs do not)"
        )
    chunks = _chunk_records(df)
    if chunks.empty:
        raise ValueError("per_sampler: no row of the 'sampler_id' column names a sampler")
    grouped = chunks.groupby("sampler_id", sort=True)
    out = pd.DataFrame(
        {
            "lag_mean": grouped["lag"].mean(),
            "lag_max": grouped["lag"].max(),
            "approx_kl_mean": grouped["approx_kl"].mean(),
            "rows": grouped["row"].nunique(),
            "chunks": grouped["row"].size(),
        }
    )
    out.index.name = "sampler_id"
    return out


# ---------------------------------------------------------------------------- summarize

SUMMARY_COLUMNS = (
    "num_seeds",
    "final_return_mean",
    "final_return_std",
    "steps_to_threshold_median",
    "reached",
    "approx_kl_mean",
    "ess_fraction_mean",
    "lag_mean_mean",
    "lag_max",
    "env_steps_per_s",
    "dropped_fraction",
)
"""The metric columns of `summarize` (in order); the threshold ones only with a threshold."""


def _as_frame(data) -> pd.DataFrame:
    """A DataFrame from a TrainResult (anything with `.to_dataframe()`) or a DataFrame."""
    if isinstance(data, pd.DataFrame):
        df = data
    elif callable(getattr(data, "to_dataframe", None)):
        df = data.to_dataframe()
    else:
        raise ValueError(
            f"summarize needs a TrainResult or a pandas DataFrame of metrics rows, got {type(data).__name__}"
        )
    if df.empty:
        raise ValueError("summarize: the DataFrame has no rows")
    return df


def _check_threshold(threshold) -> float | None:
    if threshold is None:
        return None
    if isinstance(threshold, (bool, str, bytes)):
        raise ValueError(f"threshold = {threshold!r} is invalid: it must be a finite number or None")
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"threshold = {threshold!r} is invalid: it must be a finite number or None")
    return value


def _finite_mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan


def _column_stat(group: pd.DataFrame, column: str, how: str) -> float:
    """NaN-skipping mean / max of a numeric column; NaN when absent or without a number."""
    values = _numeric_or_nan(group, column)
    finite = values[np.isfinite(values)]
    if not len(finite):
        return math.nan
    return float(finite.max() if how == "max" else finite.mean())


def _dropped_fraction(group: pd.DataFrame) -> float:
    """`samples_dropped / (samples_consumed + samples_dropped)` over the group's seeds.

    Both columns are running totals, so each seed contributes its last (largest) value.
    """
    if "samples_dropped" not in group.columns or "samples_consumed" not in group.columns:
        return math.nan
    frame = pd.DataFrame(
        {
            "seed": group["seed"].to_numpy(),
            "dropped": _numeric_or_nan(group, "samples_dropped"),
            "consumed": _numeric_or_nan(group, "samples_consumed"),
        }
    )
    last = frame.groupby("seed", dropna=False).max()
    dropped, consumed = float(last["dropped"].sum()), float(last["consumed"].sum())
    total = dropped + consumed
    return dropped / total if total > 0 else math.nan


def _summary_row(group: pd.DataFrame, threshold: float | None, last_fraction: float) -> dict:
    """The SUMMARY_COLUMNS of one group (one config, or one config and seed)."""
    if "episode_return" in group.columns:
        finals = final_returns(group, last_fraction, by="seed").to_numpy()
    else:
        finals = np.full(group["seed"].nunique(dropna=False), np.nan)
    finite = finals[np.isfinite(finals)]
    row = {
        "num_seeds": int(group["seed"].nunique(dropna=False)),
        "final_return_mean": _finite_mean(finals),
        "final_return_std": float(finite.std()) if len(finite) else math.nan,
    }
    if threshold is not None:
        if "episode_return" in group.columns and "env_steps" in group.columns:
            steps = steps_to_threshold(group, threshold, by="seed").to_numpy()
        else:
            steps = np.full(row["num_seeds"], np.nan)
        hit = steps[np.isfinite(steps)]
        row["steps_to_threshold_median"] = float(np.median(hit)) if len(hit) else math.nan
        row["reached"] = f"{len(hit)}/{len(steps)}"
    row.update(
        approx_kl_mean=_column_stat(group, "approx_kl", "mean"),
        ess_fraction_mean=_column_stat(group, "ess_fraction", "mean"),
        lag_mean_mean=_column_stat(group, "lag_mean", "mean"),
        lag_max=_column_stat(group, "lag_max", "max"),
        env_steps_per_s=_column_stat(group, "steps_per_second", "mean"),
        dropped_fraction=_dropped_fraction(group),
    )
    return row


def _grid_keys(df: pd.DataFrame) -> list[str]:
    """The sweep's grid columns: `df.attrs["grid"]` keys that are columns (none without attrs)."""
    grid = df.attrs.get("grid") if isinstance(df.attrs, dict) else None
    if not isinstance(grid, dict):
        return []
    return [str(k) for k in grid if k in df.columns]


class Summary(pd.DataFrame):
    """The DataFrame `summarize` returns: printed whole (`print(pa.summarize(...))` shows every
    column, not pandas' `...` for a wide table); everything else is a DataFrame's."""

    @property
    def _constructor(self) -> type:
        return Summary

    def __repr__(self) -> str:
        return self.to_string()

    def __str__(self) -> str:
        return self.to_string()


def summarize(result_or_dataframe, threshold: float | None = None, by_seed: bool = False, last_fraction: float = 0.1) -> pd.DataFrame:
    """One table row per config (or per config and seed) of a run or a sweep.

    Args:
      result_or_dataframe: a `TrainResult` (its `.to_dataframe()` is used), the metrics rows
        of one run (`metrics.jsonl` / `TrainResult.to_dataframe()`, one row per seed x
        iteration), or a sweep DataFrame (`ppo_async.study.sweep` / `load_sweep`: `config_id`, one
        column per grid key (named by `df.attrs["grid"]`), `seed`, metrics). Rows without a
        `seed` column are one seed.
      threshold: a return to reach; adds `steps_to_threshold_median` and `reached`.
      by_seed: one row per (config, seed) instead of per config.
      last_fraction: the tail of each seed's iterations averaged for the final return.

    Returns:
      A DataFrame (a `Summary`: printed with every column) with a RangeIndex and the columns `config_id` and the grid keys (sweeps
      only), `seed` (by_seed only), then SUMMARY_COLUMNS:
        num_seeds: seeds in the row;
        final_return_mean / final_return_std: mean / population std (ddof 0) over seeds of
          each seed's mean `episode_return` over its last `last_fraction` of iterations
          (`final_returns`; a seed without a finished episode in its tail is left out);
        steps_to_threshold_median: median over the seeds that reach `threshold` of their
          first env steps there (`steps_to_threshold`; NaN if none does);
        reached: "k/n", k of the row's n seeds reach `threshold`;
        approx_kl_mean, ess_fraction_mean, lag_mean_mean, env_steps_per_s: means over all
          rows of `approx_kl`, `ess_fraction`, `lag_mean`, `steps_per_second`; lag_max: max
          of `lag_max`;
        dropped_fraction: `samples_dropped / (samples_consumed + samples_dropped)`, both
          running totals taken at each seed's last row and summed over seeds.
      A metric whose column is not in the input is NaN.

    Raises:
      ValueError: not a TrainResult / DataFrame, no rows, a threshold that is not a finite
        number, by_seed without a `seed` column, or a bad `last_fraction`.
    """
    df = _as_frame(result_or_dataframe)
    threshold = _check_threshold(threshold)
    _check_fraction(last_fraction)
    if "seed" not in df.columns:
        if by_seed:
            raise ValueError("summarize(by_seed=True) needs a 'seed' column; the rows have none")
        df = df.assign(seed=0)
    config_keys = ("config_id",) if "config_id" in df.columns else ()
    labels = _grid_keys(df) if config_keys else []
    keys = config_keys + (("seed",) if by_seed else ())
    groups = list(_groups(df, keys)) if keys else [((), df)]
    rows = []
    for key, group in groups:
        row = dict(zip(keys, key))
        row.update({name: group[name].iloc[0] for name in labels})
        row.update(_summary_row(group, threshold, last_fraction))
        rows.append(row)
    metrics = [c for c in SUMMARY_COLUMNS if threshold is not None or c not in ("steps_to_threshold_median", "reached")]
    columns = [*config_keys, *labels, *(["seed"] if by_seed else []), *metrics]
    return Summary(rows, columns=columns)


def measured_kl(df: pd.DataFrame) -> np.ndarray:
    """`approx_kl` per row as float64, NaN where no KL was measured: a missing value, or an
    iteration in which the learner consumed nothing (every sample of its batch was dropped as
    staler than `lag.max_lag`: `dropped_stale` equals the samples in `lag_histogram`; the
    update then reports 0)."""
    kl = _numeric_or_nan(df, "approx_kl")
    if "dropped_stale" in df.columns and "lag_histogram" in df.columns:
        taken = np.asarray([np.nansum(np.asarray(h, np.float64)) if _is_list(h) else np.nan for h in df["lag_histogram"]])
        nothing = (taken > 0) & (_numeric_or_nan(df, "dropped_stale") >= taken)
        kl = np.where(nothing, np.nan, kl)
    return kl


def run_measurements(df: pd.DataFrame, warmup_fraction: float = 0.2, last_fraction: float = 0.25) -> dict[str, float]:
    """What the tuning recipe reads off one run's metrics rows (one seed, iteration order).

    Returns:
      consumer_steps_per_s: env steps the learner took per second of wall time after the
        warm-up (`env_steps` and `wall_time` from the first row at or past `warmup_fraction` of
        the iterations to the last): the run's throughput, compile and start-up excluded;
      approx_kl_mean: mean `approx_kl` (KL to the behaviour policy) after the warm-up, over
        the iterations that consumed samples (`measured_kl`);
      lag_mean: mean `lag_mean` after the warm-up; lag_max: the largest `lag_max`;
      dropped_fraction: `samples_dropped / (samples_consumed + samples_dropped)` at the end;
      final_return: mean `episode_return` over the last `last_fraction` of the iterations;
      iterations: rows.
      A metric whose column is absent (or holds no number) is NaN.

    Raises:
      ValueError: no rows, or a fraction outside (0, 1) / [0, 1).
    """
    if df.empty:
        raise ValueError("run_measurements: the DataFrame has no rows")
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(f"warmup_fraction = {warmup_fraction!r} is invalid: must lie in [0, 1)")
    _check_fraction(last_fraction)
    start = min(int(len(df) * warmup_fraction), len(df) - 1)
    tail = df.iloc[start:]
    steps, wall = _numeric_or_nan(df, "env_steps"), _numeric_or_nan(df, "wall_time")
    seconds = wall[-1] - wall[start]
    rate = (steps[-1] - steps[start]) / seconds if len(df) > 1 and seconds > 0 else math.nan
    returns = _numeric_or_nan(df, "episode_return")[-max(1, int(math.ceil(len(df) * last_fraction))):]
    return {
        "consumer_steps_per_s": float(rate),
        "approx_kl_mean": _finite_mean(measured_kl(df)[start:]),
        "lag_mean": _column_stat(tail, "lag_mean", "mean"),
        "lag_max": _column_stat(df, "lag_max", "max"),
        "dropped_fraction": _dropped_fraction(df.assign(seed=0) if "seed" not in df.columns else df),
        "final_return": _finite_mean(returns),
        "iterations": int(len(df)),
    }
