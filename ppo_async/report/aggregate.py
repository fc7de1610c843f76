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
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

LAST_FIELDS = (
    "seed", "config_id", "iteration", "learner_version", "env_steps", "sgd_steps", "wall_time", "learning_rate",
    "samples_produced", "samples_consumed", "samples_dropped", "samples_resident", "dropped_forced_refresh",
    "dropped_overwritten", "dropped_stale_total", "behavior_version", "sampler_id", "sampler_steps_per_second",
    "sampler_rollout_s", "sampler_wait_params_s", "sampler_wait_buffer_s", "sampler_wait_space_s", "sampler_write_s",
    "sampler_latency_s", "sampler_forced_refreshes", "sampler_paused_s", "dropped_fraction_window", "kl_high_streak",
    "warning",
    # the KL controller's state after the window's last iteration (`ppo_async.core.kl_control`)
    "controller_kl_mean", "controller_active_samplers", "controller_refresh_lag", "controller_max_lag",
    "controller_action", "controller_adjustments",
    # several processes (`ppo_async.runtime.distributed.global_row`): per-process running totals
    "process_samples_produced", "process_samples_consumed", "process_samples_dropped", "process_samples_resident",
    "process_dropped_forced_refresh", "process_dropped_overwritten", "process_dropped_stale_total",
)
FIELD_RULES: dict[str, str] = {
    **{name: "last" for name in LAST_FIELDS},
    "approx_kl_max": "max", "ratio_max": "max", "lag_max": "max",
    "lag_histogram": "sum", "episodes_finished": "sum", "dropped_stale": "sum", "nonfinite_env_values": "sum",
    "learner_wait_s": "sum",
    "episode_return": "episodes", "episode_length": "episodes",
    "steps_per_second": "harmonic",
    "kl_per_lag": "per_lag", "clip_fraction_per_lag": "per_lag", "ess_fraction_per_lag": "per_lag",
    "eval_return": "last_set",
}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite(values: Sequence[Any]) -> list[float]:
    return [float(v) for v in values if _number(v) and math.isfinite(v)]


def _mean(values: Sequence[Any]) -> float | None:
    kept = _finite(values)
    return sum(kept) / len(kept) if kept else None


def _elementwise(lists: Sequence[Any], combine, weights: Sequence[Any] | None = None) -> list | None:
    """Combine lists position by position (shorter lists and None entries are missing)."""
    lists = [v for v in lists if isinstance(v, list)]
    if not lists:
        return None
    out = []
    for b in range(max(len(v) for v in lists)):
        column = [v[b] if b < len(v) else None for v in lists]
        if weights is None:
            out.append(combine(column))
        else:
            w = [ws[b] if isinstance(ws, list) and b < len(ws) else 0 for ws in weights]
            out.append(combine(column, w))
    return out


def _weighted_mean(values: Sequence[Any], weights: Sequence[Any]) -> float | None:
    pairs = [(float(v), float(w)) for v, w in zip(values, weights) if _number(v) and math.isfinite(v) and _number(w) and w > 0]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total > 0 else None


def _combine(rule: str, values: list[Any], rows: Sequence[Mapping[str, Any]]) -> Any:
    """One field of the window: `values` is the field in each row (None where absent)."""
    if rule == "last":
        return values[-1]
    if rule == "last_set":
        return next((v for v in reversed(values) if v is not None), None)
    if rule == "max":
        kept = _finite(values)
        return max(kept) if kept else None
    if rule == "sum":
        if any(isinstance(v, list) for v in values):
            return _elementwise(values, lambda c: sum(x for x in c if _number(x)))
        kept = [v for v in values if _number(v)]
        return sum(kept) if kept else None
    if rule == "episodes":
        return _weighted_mean(values, [row.get("episodes_finished") for row in rows])
    if rule == "harmonic":
        kept = [v for v in _finite(values) if v > 0]
        return len(kept) / sum(1.0 / v for v in kept) if kept else None
    if rule == "per_lag":
        return _elementwise(values, _weighted_mean, weights=[row.get("lag_histogram") for row in rows])
    raise ValueError(f"unknown aggregation rule {rule!r}")


def aggregate_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One row standing for consecutive `rows` of one seed / config (oldest first); see the
    module docstring for how each field combines. One row is returned as it is (plus
    `logged_iterations = 1`).

    Raises:
      ValueError: no rows.
    """
    if not rows:
        raise ValueError("aggregate_rows needs at least one row")
    names = list(dict.fromkeys(name for row in rows for name in row))
    out: dict[str, Any] = {}
    for name in names:
        values = [row.get(name) for row in rows]
        rule = FIELD_RULES.get(name)
        if rule is None:
            if any(isinstance(v, list) for v in values):
                out[name] = _elementwise(values, _mean)
            elif any(_number(v) for v in values):
                out[name] = _mean(values)
            else:
                out[name] = values[-1]  # strings, booleans, None
        else:
            out[name] = _combine(rule, values, rows)
    out["logged_iterations"] = len(rows)
    return out
