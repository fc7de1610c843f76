"""Aggregating consecutive metrics rows into one (`Config.log_every`): pure functions.

A long run logs every k-th learner iteration: each written row stands for the k iterations
since the previous one (of one seed / config). How each field combines is fixed per field
(`FIELD_RULES`), so a row logged every 10 iterations says the same as the 10 rows it replaces:

  last       counters and running totals, identities, the clock: the window's last value
             (iteration, env_steps, samples_*, wall_time, learner_version, the per-sampler
             cumulative seconds, the health fields, ...);
  max        maxima (approx_kl_max, ratio_max, lag_max);
  sum        per-iteration counts (lag_histogram element-wise, episodes_finished, dropped_stale);
  episodes   per-episode means weighted by the episodes each iteration finished
             (episode_return, episode_length);
  harmonic   rates of equal-size batches: total steps / total time (steps_per_second);
  per_lag    per-lag-bucket means weighted by each iteration's samples in the bucket
             (`lag_histogram`): kl_per_lag, clip_fraction_per_lag, ess_fraction_per_lag;
  last_set   the last value that is not None (eval_return: evaluated on some iterations);
  mean       every other number: the mean over the window's iterations (None left out).
Any other list is averaged element-wise (None left out); strings and booleans take the last
value. The row gains `logged_iterations`: how many iterations it stands for.

This table is the only place that says how a field folds over rows: `RowFold` applies it one
row at a time (holding no row but the last), `aggregate_rows` is a `RowFold` over a window,
and the plots' curve binning (`ppo_async.report.plots.run_frames`) folds each bin with it too.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

LAST_FIELDS = (
    "seed", "config_id", "iteration", "learner_version", "env_steps", "sgd_steps", "wall_time", "learning_rate",
    "samples_produced", "samples_consumed", "samples_dropped", "samples_resident", "dropped_forced_refresh",
    "dropped_overwritten", "dropped_stale_total", "behavior_version", "sampler_id", "sampler_steps_per_second",
    "sampler_rollout_s", "sampler_wait_params_s", "sampler_wait_buffer_s", "sampler_wait_space_s", "sampler_write_s",
    "sampler_latency_s", "sampler_forced_refreshes", "sampler_paused_s", "dropped_fraction_window", "kl_high_streak",
    "warning", "resumed_at_iteration", "dropped_at_resume",
    # the KL controller's state after the window's last iteration (`ppo_async.core.kl_control`)
    "controller_staleness_mean", "controller_staleness_aim", "controller_update_aim", "controller_margin",
    "controller_active_samplers", "controller_refresh_lag", "controller_max_lag", "controller_action",
    "controller_adjustments", "controller_lr_scale", "controller_lr_action", "controller_lr_adjustments",
    "controller_waste", "controller_max_lag_floor", "controller_reason",
    # several processes (`ppo_async.runtime.distributed.global_row`): per-process running totals
    "process_samples_produced", "process_samples_consumed", "process_samples_dropped", "process_samples_resident",
    "process_dropped_forced_refresh", "process_dropped_overwritten", "process_dropped_stale_total",
)
FIELD_RULES: dict[str, str] = {
    **{name: "last" for name in LAST_FIELDS},
    "approx_kl_max": "max", "ratio_max": "max", "lag_max": "max",
    "lag_histogram": "sum", "episodes_finished": "sum", "dropped_stale": "sum", "nonfinite_env_values": "sum",
    "learner_wait_s": "sum", "learner_handover_s": "sum", "learner_place_s": "sum", "learner_update_s": "sum",
    "learner_fetch_s": "sum", "learner_publish_s": "sum", "exchange_wait_s": "sum",
    "episode_return": "episodes", "episode_length": "episodes",
    "steps_per_second": "harmonic",
    "kl_per_lag": "per_lag", "clip_fraction_per_lag": "per_lag", "ess_fraction_per_lag": "per_lag",
    "eval_return": "last_set",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_number(value: Any) -> bool:
    return _number(value) and math.isfinite(value)


def _weight(weights: Any, position: int | None = None) -> float:
    """A row's weight (`episodes_finished`, or position `position` of `lag_histogram`); 0 when
    it is missing, not a number or not positive."""
    if position is not None:
        weights = weights[position] if isinstance(weights, list) and position < len(weights) else None
    return float(weights) if _number(weights) and weights > 0 else 0.0


class _Positions:
    """Lists folded position by position (a shorter list or a None entry is missing there).

    kind "mean": the mean of the finite entries (None where there is none); "sum": the sum of
    the numbers (0 where there is none); "weighted": the mean of the finite entries weighted by
    the same position of each row's `lag_histogram` (None where the weights sum to 0)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.totals: list[Any] = []  # per position: sum (mean, sum) or sum of value x weight
        self.counts: list[Any] = []  # per position: finite entries (mean) or summed weight

    def add(self, values: list[Any], row: Mapping[str, Any]) -> None:
        while len(self.totals) < len(values):
            self.totals.append(0)
            self.counts.append(0)
        for b, v in enumerate(values):
            if self.kind == "sum":
                if _number(v):
                    self.totals[b] += v
            elif _finite_number(v):
                w = 1 if self.kind == "mean" else _weight(row.get("lag_histogram"), b)
                if w > 0:
                    self.totals[b] += float(v) * w if self.kind == "weighted" else float(v)
                    self.counts[b] += w

    def value(self) -> list[Any]:
        if self.kind == "sum":
            return list(self.totals)
        return [t / c if c > 0 else None for t, c in zip(self.totals, self.counts)]


class _Field:
    """The running fold of one field under its rule (`FIELD_RULES`; None: the default, a mean)."""

    def __init__(self, rule: str | None) -> None:
        if rule not in (None, "last", "last_set", "max", "sum", "episodes", "harmonic", "per_lag"):
            raise ValueError(f"unknown aggregation rule {rule!r}")
        self.rule = rule
        self.total: Any = 0  # sum of the numbers (sum), of the finite ones (mean), of v x w (episodes), of 1/v (harmonic)
        self.count: Any = 0  # numbers kept (mean, harmonic) or summed weight (episodes)
        self.numbers = False  # whether any value was a number (sum, mean)
        self.kept: Any = None  # the maximum (max) or the last value set (last_set)
        self.lists: _Positions | None = None  # element-wise fold, once a list was seen (sum, per_lag, mean)

    def add(self, value: Any, row: Mapping[str, Any]) -> None:
        rule = self.rule
        if isinstance(value, list) and rule in (None, "sum", "per_lag"):
            if self.lists is None:
                self.lists = _Positions({None: "mean", "sum": "sum", "per_lag": "weighted"}[rule])
            self.lists.add(value, row)
        elif rule == "last_set":
            self.kept = value if value is not None else self.kept
        elif rule == "max" and _finite_number(value):
            self.kept = float(value) if self.kept is None else max(self.kept, float(value))
        elif rule == "sum" and _number(value):
            self.total, self.numbers = self.total + value, True
        elif rule == "episodes" and _finite_number(value) and _weight(row.get("episodes_finished")) > 0:
            w = _weight(row.get("episodes_finished"))
            self.total, self.count = self.total + float(value) * w, self.count + w
        elif rule == "harmonic" and _finite_number(value) and value > 0:
            self.total, self.count = self.total + 1.0 / float(value), self.count + 1
        elif rule is None and _number(value):
            self.numbers = True
            if math.isfinite(value):
                self.total, self.count = self.total + float(value), self.count + 1

    def value(self, last: Any) -> Any:
        """The folded value; `last` is the field in the window's last row (None if absent)."""
        rule = self.rule
        if rule in ("sum", "per_lag", None) and self.lists is not None:
            return self.lists.value()
        if rule == "last" or (rule is None and not self.numbers):
            return last  # counters, identities; strings, booleans, None
        if rule in ("last_set", "max"):
            return self.kept
        if rule == "sum":
            return self.total if self.numbers else None
        if rule == "episodes":
            return self.total / self.count if self.count > 0 else None
        if rule == "harmonic":
            return self.count / self.total if self.count else None
        return self.total / self.count if self.count else None  # the default: a mean


class RowFold:
    """`aggregate_rows` one row at a time: `add` consecutive rows of one seed / config (oldest
    first), `row()` the row standing for them. Holds one running fold per field (`FIELD_RULES`)
    and the last row, never the rows, so a window of any length costs the same memory."""

    def __init__(self) -> None:
        self.rows = 0
        self._fields: dict[str, _Field] = {}
        self._last: Mapping[str, Any] = {}

    def add(self, row: Mapping[str, Any]) -> None:
        for name, value in row.items():
            folded = self._fields.get(name)
            if folded is None:
                folded = self._fields[name] = _Field(FIELD_RULES.get(name))
            folded.add(value, row)
        self._last = row
        self.rows += 1

    def row(self) -> dict[str, Any]:
        """The folded row, fields in order of first appearance, plus `logged_iterations`.

        Raises:
          ValueError: no row was added.
        """
        if not self.rows:
            raise ValueError("aggregate_rows needs at least one row")
        out = {name: folded.value(self._last.get(name)) for name, folded in self._fields.items()}
        out["logged_iterations"] = self.rows
        return out


def aggregate_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One row standing for consecutive `rows` of one seed / config (oldest first); see the
    module docstring for how each field combines (`RowFold`). One row is returned as it is
    (plus `logged_iterations = 1`).

    Raises:
      ValueError: no rows.
    """
    fold = RowFold()
    for row in rows:
        fold.add(row)
    return fold.row()
