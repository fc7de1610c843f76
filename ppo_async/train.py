"""`train(config)`: the entry point of every mode, and `TrainResult`.

Thin impure shell: builds the mode's pure program, times it, checks for non-finite values,
streams per-iteration rows to the run directory and the progress bar.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from ppo_async.config import Config, config_to_dict
from ppo_async.learner import hyperparams_from_config
from ppo_async.metrics import JsonlWriter, NonFiniteError, Progress, check_finite, split_seeds

LOSS_FIELDS = ("policy_loss", "value_loss", "entropy", "approx_kl")


@dataclass
class TrainResult:
    """What a run returns.

    Attributes:
      config: the resolved config.
      train_state: final `TrainState`, leaves stacked over seeds `[num_seeds, ...]`.
      metrics: one dict per (seed, learner iteration); see `metrics.CORE_FIELDS`.
      compile_seconds: time to compile the program(s) before the first iteration.
      run_seconds: wall time of the iterations (excluding compile).
    """

    config: Config
    train_state: Any
    metrics: list[dict[str, Any]]
    compile_seconds: float
    run_seconds: float
    extras: dict[str, Any] = field(default_factory=dict)

    def to_dataframe(self) -> "Any":
        """The metrics as a tidy pandas DataFrame (one row per seed x iteration)."""
        import pandas as pd

        return pd.DataFrame(self.metrics)

    @property
    def params(self) -> Any:
        """Final network params, stacked over seeds."""
        return self.train_state.params

    def final_returns(self, last_fraction: float = 0.1) -> np.ndarray:
        """Per seed: mean episode return over the last `last_fraction` of iterations."""
        df = self.to_dataframe()
        out = []
        for _, group in df.groupby("seed", sort=True):
            tail = group.tail(max(1, int(len(group) * last_fraction)))
            out.append(float(tail["episode_return"].astype(float).mean()))
        return np.asarray(out)


def write_config(run_dir: str, config: Config) -> None:
    """Writes DIR/config.json (the resolved config)."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config_to_dict(config), f, indent=2)


def train(
    config: Config,
    *,
    progress: bool = False,
    on_iteration: Callable[[list[dict[str, Any]]], None] | None = None,
) -> TrainResult:
    """Trains `config.num_seeds` seeds of PPO in `config.mode` and returns a `TrainResult`.

    Args:
      config: a validated `Config`.
      progress: show a console progress bar.
      on_iteration: called with the rows of every learner iteration (one per seed).
    """
    if config.mode == "sync":
        return _train_sync(config, progress=progress, on_iteration=on_iteration)
    raise ValueError(f"mode {config.mode!r} is not available")  # Config already validates


def _train_sync(config: Config, *, progress: bool, on_iteration) -> TrainResult:
    from ppo_async.modes.sync import compiled_sync_step

    t0 = time.perf_counter()
    _, states, step = compiled_sync_step(config)
    hparams = hyperparams_from_config(config)
    compiled = step.lower(states, hparams).compile()
    compile_seconds = time.perf_counter() - t0

    writer = None
    if config.run_dir:
        write_config(config.run_dir, config)
        writer = JsonlWriter(os.path.join(config.run_dir, "metrics.jsonl"))
    bar = Progress(config.num_iterations * config.batch_size, enabled=progress, desc=f"{config.env} sync")
    rows_all: list[dict[str, Any]] = []
    start = time.perf_counter()
    try:
        for iteration in range(1, config.num_iterations + 1):
            tick = time.perf_counter()
            states, metrics = compiled(states, hparams)
            metrics = jax.device_get(metrics)
            now = time.perf_counter()
            rows = split_seeds(metrics, config.num_seeds)
            for i, row in enumerate(rows):
                if row.get("nonfinite_env_values"):
                    raise NonFiniteError(
                        f"env {config.env!r} produced {row['nonfinite_env_values']} NaN/inf observations or "
                        f"rewards in iteration {iteration} (seed {config.seed + i})"
                    )
                row.update(
                    seed=config.seed + i,
                    iteration=iteration,
                    wall_time=now - start,
                    steps_per_second=config.batch_size * config.num_seeds / (now - tick),
                )
            check_finite(rows, LOSS_FIELDS, iteration)
            for row in rows:
                if writer is not None:
                    writer.write(row)
            rows_all.extend(rows)
            bar.update(iteration * config.batch_size, rows[0])
            if on_iteration is not None:
                on_iteration(rows)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return TrainResult(
        config=config,
        train_state=states.train_state,
        metrics=rows_all,
        compile_seconds=compile_seconds,
        run_seconds=time.perf_counter() - start,
    )
