"""`TrainResult`: what `train()` returns in every mode (a leaf: it knows no mode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ppo_async.report.metrics import MetricsLog, check_fraction, tail_mean
from ppo_async.config import Config
from ppo_async.run.policy import Policy


@dataclass
class TrainResult:
    """What a run returns.

    Attributes:
      config: the resolved config.
      train_state: final `TrainState`, leaves stacked over seeds `[num_seeds, ...]`.
      metrics: one dict per (seed, logged learner iteration); see `metrics.CORE_FIELDS`. A
        `metrics.MetricsLog` (a sequence of dicts held compactly, or read back from
        RUN_DIR/metrics.jsonl when the run has a run directory) or any sequence of dicts.
      compile_seconds: time to compile the program(s) before the first iteration.
      run_seconds: wall time of the iterations (excluding compile).
      extras: mode-specific results (threaded: version_schedule, sampler_stats, placement;
        resumed runs: first_iteration).
    """

    config: Config
    train_state: Any
    metrics: Sequence[dict[str, Any]]
    compile_seconds: float
    run_seconds: float
    extras: dict[str, Any] = field(default_factory=dict)

    def to_dataframe(self, columns: Sequence[str] | None = None) -> "Any":
        """The metrics as a tidy pandas DataFrame (one row per seed x iteration). The rows are
        read one at a time (`MetricsLog.rows`: from metrics.jsonl when the run had a run
        directory) and none is kept once the frame is built. With `columns`, only those (of the
        ones the rows have; a row without one holds None there), built column by column, so
        the frame is all that is held however long the run."""
        import pandas as pd

        if columns is None:
            return pd.DataFrame(list(self.metrics.rows() if isinstance(self.metrics, MetricsLog) else self.metrics))
        rows = self.metrics.rows(columns) if isinstance(self.metrics, MetricsLog) else iter(self.metrics)
        return pd.DataFrame(_columns_of(rows, columns))

    @property
    def params(self) -> Any:
        """Final network params, stacked over seeds."""
        return self.train_state.params

    def policy(self, seed_index: int = 0) -> Policy:
        """The final `Policy` of seed `seed_index` (for `ppo_async.evaluate`), no checkpoint needed."""
        return Policy.of_seed(self.config, self.train_state, seed_index)

    def final_returns(self, last_fraction: float = 0.1) -> np.ndarray:
        """Per seed (in seed order): mean episode return over the last `last_fraction` of iterations.

        Reads only the `seed` and `episode_return` columns, so that the end of a long run (the
        `train` command prints these) does not hold every row."""
        check_fraction(last_fraction)
        rows = self.metrics.rows(("seed", "episode_return")) if isinstance(self.metrics, MetricsLog) else self.metrics
        by_seed: dict[Any, list[Any]] = {}
        for row in rows:
            by_seed.setdefault(row.get("seed"), []).append(row.get("episode_return"))
        return np.array([tail_mean(by_seed[seed], last_fraction) for seed in sorted(by_seed, key=_seed_order)], dtype=float)


def _seed_order(seed: Any) -> tuple[int, Any]:
    """Sorts seed labels as `analysis.final_returns` groups them: numbers in order, None last."""
    return (1, 0) if seed is None else (0, seed)


def _columns_of(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> dict[str, list[Any]]:
    """`{name: values}` of the `columns` any of `rows` has (None where a row lacks one), in
    the order of `columns`; one row at a time, nothing else kept."""
    out: dict[str, list[Any]] = {}
    count = 0
    for row in rows:
        for name in columns:
            if name in row:
                if name not in out:
                    out[name] = [None] * count
                out[name].append(row[name])
            elif name in out:
                out[name].append(None)
        count += 1
    return {name: out[name] for name in columns if name in out}
