"""`TrainResult`: what `train()` returns in every mode (a leaf: it knows no mode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ppo_async.report import analysis
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

    def to_dataframe(self) -> "Any":
        """The metrics as a tidy pandas DataFrame (one row per seed x iteration)."""
        import pandas as pd

        return pd.DataFrame(list(self.metrics))

    @property
    def params(self) -> Any:
        """Final network params, stacked over seeds."""
        return self.train_state.params

    def policy(self, seed_index: int = 0) -> Policy:
        """The final `Policy` of seed `seed_index` (for `ppo_async.evaluate`), no checkpoint needed."""
        return Policy.of_seed(self.config, self.train_state, seed_index)

    def final_returns(self, last_fraction: float = 0.1) -> np.ndarray:
        """Per seed (in seed order): mean episode return over the last `last_fraction` of iterations."""
        return np.asarray(analysis.final_returns(self.to_dataframe(), last_fraction), dtype=float)
