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
    t0 = time.perf_counter()
    keys = seed_keys(config)
    hparams = hyperparams_from_config(config)
    if config.mode == "sync":
        from ppo_async.modes.sync import make_sync_program

        program = make_sync_program(config)
        states = jax.jit(jax.vmap(program.init))(keys)
        step = jax.jit(jax.vmap(program.iteration, in_axes=(0, None)), donate_argnums=(0,))
        args: tuple = (hparams,)
    elif config.mode == "simulated":
        from ppo_async.lag import schedule_record, write_schedule
        from ppo_async.modes.simulated import schedule_arrays, simulated_setup

        program, schedule = simulated_setup(config)
        states = jax.jit(jax.vmap(program.init))(keys)
        step = jax.jit(jax.vmap(program.iteration, in_axes=(0, None, None)), donate_argnums=(0,))
        args = (hparams, schedule_arrays(schedule))
        if config.run_dir:
            write_schedule(
                os.path.join(config.run_dir, "lag_schedule.jsonl"),
                (
                    {"iteration": i + 1, "sampler_id": int(s), "lag": int(k)}
                    for i, (s, k) in enumerate(zip(schedule.sampler_id, schedule.lag))
                ),
            )
    else:  # Config validates the mode
        raise ValueError(f"mode {config.mode!r} is not available")
    compiled = step.lower(states, *args).compile()
    compile_seconds = time.perf_counter() - t0
    labels = [{"seed": config.seed + i} for i in range(config.num_seeds)]
    states, rows = run_iterations(config, compiled, states, args, labels, progress=progress, on_iteration=on_iteration)
    return TrainResult(
        config=config,
        train_state=states.train_state,
        metrics=rows,
        compile_seconds=compile_seconds,
        run_seconds=rows[-1]["wall_time"] if rows else 0.0,
    )


def seed_keys(config: Config) -> jax.Array:
    """`[num_seeds]` keys; seed i uses PRNGKey(config.seed + i), so seed s alone reproduces it."""
    return jax.numpy.stack([jax.random.PRNGKey(config.seed + i) for i in range(config.num_seeds)])


def run_iterations(
    config: Config,
    compiled_step: Callable,
    states: Any,
    args: tuple,
    labels: list[dict[str, Any]],
    *,
    progress: bool,
    on_iteration: Callable[[list[dict[str, Any]]], None] | None,
    first_iteration: int = 1,
    write: bool = True,
    leading_axes: int = 1,
) -> tuple[Any, list[dict[str, Any]]]:
    """The host loop shared by the jitted modes: step, time, check, account, log.

    `compiled_step(states, *args) -> (states, metrics)` with metric leaves `[L, ...]` (or
    `[C, S, ...]` with `leading_axes=2`, flattened to L = C * S); `labels[l]` (e.g. seed, config id) is added to row l.
    Per row it keeps the sample accounting `produced = consumed + dropped + resident`
    (resident is 0 here: a jitted mode consumes every batch it produces in the same step) and
    raises if it ever fails.
    """
    num_rows = len(labels)
    writer = None
    if config.run_dir and write:
        write_config(config.run_dir, config)
        writer = JsonlWriter(os.path.join(config.run_dir, "metrics.jsonl"), append=first_iteration > 1)
    bar = Progress(config.num_iterations * config.batch_size, enabled=progress, desc=f"{config.env} {config.mode}")
    rows_all: list[dict[str, Any]] = []
    consumed = np.zeros(num_rows, np.int64)
    dropped = np.zeros(num_rows, np.int64)
    start = time.perf_counter()
    try:
        for iteration in range(first_iteration, config.num_iterations + 1):
            tick = time.perf_counter()
            states, metrics = compiled_step(states, *args)
            metrics = jax.device_get(metrics)
            now = time.perf_counter()
            metrics = {k: np.reshape(v, (num_rows,) + np.shape(v)[leading_axes:]) for k, v in metrics.items()}
            rows = split_seeds(metrics, num_rows)
            for i, row in enumerate(rows):
                row.update(labels[i])
                if row.get("nonfinite_env_values"):
                    raise NonFiniteError(
                        f"env {config.env!r} produced {row['nonfinite_env_values']} NaN/inf observations or "
                        f"rewards in iteration {iteration} ({_describe(labels[i])})"
                    )
                consumed[i] += row.pop("consumed")
                dropped[i] += row["dropped_stale"]
                produced = iteration * config.batch_size
                if produced != consumed[i] + dropped[i]:
                    raise AssertionError(
                        f"sample accounting broken at iteration {iteration}, {_describe(labels[i])}: "
                        f"produced {produced} != consumed {consumed[i]} + dropped {dropped[i]} + resident 0"
                    )
                row.update(
                    iteration=iteration,
                    env_steps=produced,
                    wall_time=now - start,
                    steps_per_second=config.batch_size * num_rows / (now - tick),
                    samples_produced=produced,
                    samples_consumed=int(consumed[i]),
                    samples_dropped=int(dropped[i]),
                    samples_resident=0,
                )
            check_finite(rows, LOSS_FIELDS, iteration)
            if writer is not None:
                for row in rows:
                    writer.write(row)
            rows_all.extend(rows)
            bar.update(iteration * config.batch_size, rows[0])
            if on_iteration is not None:
                on_iteration(rows)
    finally:
        bar.close()
        if writer is not None:
            writer.close()
    return states, rows_all


def _describe(label: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in label.items())
