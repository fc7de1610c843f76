"""Warnings a run raises about itself while it runs: samples wasted as stale, and KL that says
the lag (or, without lag, the update) is hurting (pure; the recorder calls it once per row).

Two conditions, each checked on every metrics row of one run (one label):

- **dropped**: more than `DROP_WARN_FRACTION` of the samples that reached the learner (or
  were discarded on the way) in the last `WINDOW` iterations were dropped, i.e.
  `d(samples_dropped) / d(samples_consumed + samples_dropped) > 0.5` over the window;
- **kl**: `approx_kl` (to the behaviour policy) has stayed above `KL_WARN` = 0.03 for
  `KL_WARN_ITERATIONS` iterations in a row. 0.02-0.03 is the field's usual "KL under
  control" line for PPO with lagged samples (e.g. the tuning recipe: tune samplers and
  buffer length until KL < 0.02; Cleanba / IMPALA-style PPO reports it the same way).

Each row gains `dropped_fraction_window` (float), `kl_high_streak` (int) and `warning` (a
string, "" when all is well); `warnings_of(rows)` lists each kind of warning once, with the iteration
it first appeared.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Mapping

WINDOW = 10
DROP_WARN_FRACTION = 0.5
KL_WARN = 0.03
KL_WARN_ITERATIONS = 5


@dataclass
class RunHealth:
    """The running state of one run's warnings (feed it that run's rows in order)."""

    window: int = WINDOW
    history: collections.deque = field(default_factory=collections.deque)  # (consumed + dropped, dropped)
    kl_streak: int = 0

    def update(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The health fields of `row` (see module doc), given every earlier row of its run."""
        seen = int(row.get("samples_consumed", 0)) + int(row.get("samples_dropped", 0))
        self.history.append((seen, int(row.get("samples_dropped", 0))))
        if len(self.history) > self.window + 1:
            self.history.popleft()
        (seen0, dropped0), (seen1, dropped1) = self.history[0], self.history[-1]
        if len(self.history) == 1:
            seen0 = dropped0 = 0  # the first row's counts are everything since the start
        delta = seen1 - seen0
        fraction = (dropped1 - dropped0) / delta if delta > 0 else 0.0
        kl = row.get("approx_kl")
        self.kl_streak = self.kl_streak + 1 if isinstance(kl, (int, float)) and kl > KL_WARN else 0
        warnings = []
        if fraction > DROP_WARN_FRACTION:
            warnings.append(
                f"{fraction:.0%} of the samples of the last {len(self.history) - 1 or 1} iterations were dropped as "
                "stale (lag.max_lag): fewer samplers, a shorter buffer or a larger lag.max_lag waste less"
            )
        if self.kl_streak >= KL_WARN_ITERATIONS:
            warnings.append(kl_warning(self.kl_streak, kl, row.get("lag_mean")))
        return {"dropped_fraction_window": float(fraction), "kl_high_streak": self.kl_streak,
                "warning": "; ".join(warnings)}


def kl_warning(streak: int, kl: float, lag_mean: Any) -> str:
    """The "kl" warning: KL above `KL_WARN` for `streak` iterations. With lagged samples it is the
    lag that hurts; where the row's `lag_mean` is 0 (sync, barrier, K = 0) there is no lag to
    blame and the update itself moves the policy too far, so the advice differs."""
    head = f"approx_kl above {KL_WARN} for {streak} iterations (now {kl:.3f})"
    if isinstance(lag_mean, (int, float)) and lag_mean == 0:
        return (f"{head} with no lag: each update moves the policy too far; a smaller ppo.learning_rate or "
                "fewer ppo.num_epochs bring it down")
    return (f"{head}: the lag is hurting; fewer samplers, a shorter buffer, a smaller learning rate or "
            "lag.max_lag bring it down")


def short_warning(row: Mapping[str, Any]) -> str | None:
    """A few characters for a progress bar: "62% dropped", "kl>0.03 x7", both, or None."""
    parts = []
    if row.get("dropped_fraction_window", 0.0) > DROP_WARN_FRACTION:
        parts.append(f"{row['dropped_fraction_window']:.0%} dropped")
    if row.get("kl_high_streak", 0) >= KL_WARN_ITERATIONS:
        parts.append(f"kl>{KL_WARN} x{row['kl_high_streak']}")
    return ", ".join(parts) or None


def first_warnings(rows: list[Mapping[str, Any]], known: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each kind of warning ("dropped", "kl") once: `known` plus the kinds first seen in `rows`,
    as "iteration N (labels): message" of their first appearance, in order."""
    first = dict(known or {})
    for row in rows:
        for message in filter(None, str(row.get("warning", "")).split("; ")):
            kind = "kl" if message.startswith("approx_kl") else "dropped"
            if kind not in first:
                where = ", ".join(f"{k} {row[k]}" for k in ("config_id", "seed") if k in row)
                first[kind] = f"iteration {row.get('iteration')} ({where}): {message}"
    return first


def warnings_of(rows: list[Mapping[str, Any]]) -> list[str]:
    """The messages of `first_warnings(rows)`."""
    return list(first_warnings(rows).values())
