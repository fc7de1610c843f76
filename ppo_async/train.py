"""`train(config)`: the entry point of every mode, and `TrainResult`.

Thin impure shell: builds the mode's pure program, times it, checks for non-finite values,
streams per-iteration rows to the run directory and the progress bar.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from ppo_async.config import Config, ConfigError, config_from_dict, config_to_dict
from ppo_async.learner import hyperparams_from_config
from ppo_async.metrics import (
    JsonlWriter,
    NonFiniteError,
    Progress,
    check_finite,
    open_wandb,
    read_jsonl,
    scalar_items,
    split_seeds,
)

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

    def policy(self, seed_index: int = 0) -> Any:
        """The final `Policy` of seed `seed_index` (for `ppo_async.evaluate`), no checkpoint needed."""
        from ppo_async.envs import make_env
        from ppo_async.networks import make_actor_critic
        from ppo_async.policy import Policy

        if not isinstance(seed_index, int) or not 0 <= seed_index < self.config.num_seeds:
            raise ConfigError(f"seed_index = {seed_index!r} is invalid: the run has {self.config.num_seeds} seed(s)")
        state = jax.tree.map(lambda x: x[seed_index], self.train_state)
        env = make_env(self.config.env)
        return Policy(
            config=self.config,
            env=env,
            network=make_actor_critic(env, self.config.network),
            params=state.params,
            obs_stats=state.obs_stats,
            iteration=int(state.version),
            seed_index=seed_index,
        )

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


def make_program(config: Config) -> tuple[Callable, Callable, tuple, Any]:
    """The mode's pure program, vmapped over seeds: `(init, step, args, schedule)`.

    `init(keys) -> states` and `step(states, *args) -> (states, metrics)` are vmapped (not yet
    jitted); `schedule` is the simulated mode's `LagSchedule` (None in sync mode).
    """
    hparams = hyperparams_from_config(config)
    if config.mode == "sync":
        from ppo_async.modes.sync import make_sync_program

        program = make_sync_program(config)
        return jax.vmap(program.init), jax.vmap(program.iteration, in_axes=(0, None)), (hparams,), None
    if config.mode == "simulated":
        from ppo_async.modes.simulated import schedule_arrays, simulated_setup

        program, schedule = simulated_setup(config)
        step = jax.vmap(program.iteration, in_axes=(0, None, None))
        return jax.vmap(program.init), step, (hparams, schedule_arrays(schedule)), schedule
    raise ValueError(f"mode {config.mode!r} is not available")  # Config validates the mode


# Fields that may differ between a run and its resumption (they do not change the maths).
_RESUME_FREE_FIELDS = ("run_dir", "checkpoint_every", "keep_checkpoints", "wandb_project")


def checkpoint_dir(run_dir: str) -> str:
    """RUN_DIR/checkpoints."""
    return os.path.join(run_dir, "checkpoints")


def train(
    config: Config,
    *,
    progress: bool = False,
    on_iteration: Callable[[list[dict[str, Any]]], None] | None = None,
    resume: bool = False,
) -> TrainResult:
    """Trains `config.num_seeds` seeds of PPO in `config.mode` and returns a `TrainResult`.

    With `config.run_dir` set it writes RUN_DIR/config.json, metrics.jsonl, checkpoints/
    (every `config.checkpoint_every` iterations and at the end), TensorBoard events in tb/ and,
    once the run is done, the PNG plots of `plots.plot_run`.

    Args:
      config: a validated `Config`.
      progress: show a console progress bar.
      on_iteration: called with the rows of every learner iteration (one per seed).
      resume: continue the run in `config.run_dir` from its latest complete checkpoint
        (the config must match the checkpoint's, up to run_dir / checkpoint_every /
        keep_checkpoints). metrics.jsonl is cut back to the checkpoint's iteration and the
        continued run computes bit for bit what the uninterrupted run would have.
        `TrainResult.metrics` then holds the earlier rows too.
    """
    from ppo_async.checkpoint import Checkpointer, CheckpointError

    if config.mode == "threaded":
        from ppo_async.modes.threaded import train_threaded

        if resume:
            raise ConfigError("resume is not supported for mode='threaded' (its lag depends on timing)")
        return train_threaded(config, progress=progress, on_iteration=on_iteration)
    t0 = time.perf_counter()
    keys = seed_keys(config)
    init, step_fn, args, schedule = make_program(config)
    states = jax.jit(init)(keys)
    labels = [{"seed": config.seed + i} for i in range(config.num_seeds)]
    run_dir = config.run_dir
    first_iteration = 1
    prior_rows: list[dict[str, Any]] = []
    counters = None
    wall_offset = 0.0
    if resume:
        if not run_dir:
            raise ConfigError("resume=True needs config.run_dir (the run to continue)")
        ckpt_dir = checkpoint_dir(run_dir)
        if not os.path.isdir(ckpt_dir):
            raise CheckpointError(f"no checkpoints in {run_dir!r} (no {ckpt_dir})")
        with Checkpointer(ckpt_dir, max_to_keep=config.keep_checkpoints) as ckpt:
            states, meta = ckpt.restore(states)
        _check_resume_config(config, meta)
        iteration = int(meta["iteration"])
        first_iteration = iteration + 1
        counters = (np.asarray(meta["samples_consumed"], np.int64), np.asarray(meta["samples_dropped"], np.int64))
        wall_offset = float(meta["wall_time"])
        prior_rows = truncate_metrics(run_dir, iteration, len(labels))
    elif run_dir:
        # A fresh run starts over: metrics.jsonl is rewritten, so old checkpoints/events go too.
        for sub in (checkpoint_dir(run_dir), os.path.join(run_dir, "tb")):
            if os.path.isdir(sub):
                shutil.rmtree(sub)
    if schedule is not None and run_dir:
        from ppo_async.lag import write_schedule

        write_schedule(
            os.path.join(run_dir, "lag_schedule.jsonl"),
            (
                {"iteration": i + 1, "sampler_id": int(s), "lag": int(k)}
                for i, (s, k) in enumerate(zip(schedule.sampler_id, schedule.lag))
            ),
        )
    step = jax.jit(step_fn, donate_argnums=(0,))
    compiled = step.lower(states, *args).compile()
    compile_seconds = time.perf_counter() - t0

    checkpointer = None
    tb_writer = None
    wandb_run = open_wandb(config)
    try:
        if run_dir:
            checkpointer = Checkpointer(checkpoint_dir(run_dir), max_to_keep=config.keep_checkpoints)
            tb_writer = make_tb_writer(run_dir, config, first_iteration)
        states, rows = run_iterations(
            config,
            compiled,
            states,
            args,
            labels,
            progress=progress,
            on_iteration=on_iteration,
            first_iteration=first_iteration,
            checkpointer=checkpointer,
            tb_writer=tb_writer,
            wandb_run=wandb_run,
            counters=counters,
            wall_offset=wall_offset,
        )
    finally:
        if wandb_run is not None:
            wandb_run.finish()
        if tb_writer is not None:
            tb_writer.close()
        if checkpointer is not None:
            checkpointer.close()
    if run_dir:
        from ppo_async.plots import plot_run

        plot_run(run_dir)
    rows = prior_rows + rows
    return TrainResult(
        config=config,
        train_state=states.train_state,
        metrics=rows,
        compile_seconds=compile_seconds,
        run_seconds=rows[-1]["wall_time"] if rows else 0.0,
        extras={"first_iteration": first_iteration} if resume else {},
    )


def resume(run_dir: str, *, progress: bool = False, on_iteration: Callable[[list[dict[str, Any]]], None] | None = None) -> TrainResult:
    """Continues the run in `run_dir` (its config.json) from its latest complete checkpoint."""
    config = read_run_config(run_dir)
    return train(config, progress=progress, on_iteration=on_iteration, resume=True)


def read_run_config(run_dir: str) -> Config:
    """The Config of a run directory (RUN_DIR/config.json), with run_dir set to `run_dir`."""
    path = os.path.join(run_dir, "config.json")
    if not os.path.isdir(run_dir):
        raise ConfigError(f"run directory {run_dir!r} does not exist")
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir!r} is not a run directory: no config.json in it")
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: cannot parse: {exc}") from None
    return config_from_dict(data).replace(run_dir=os.fspath(run_dir))


def _check_resume_config(config: Config, meta: dict[str, Any]) -> None:
    saved = dict(meta.get("config", {}))
    now = config_to_dict(config)
    for name in _RESUME_FREE_FIELDS:
        saved.pop(name, None)
        now.pop(name, None)
    if saved != now:
        diffs = _dict_diff(saved, now)
        raise ConfigError(
            "cannot resume: the config differs from the checkpoint's in " + ", ".join(diffs[:8])
            + (" ..." if len(diffs) > 8 else "")
            + " (a resumed run must have the same config to continue it exactly)"
        )


def _dict_diff(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out.extend(_dict_diff(x, y, prefix + key + "."))
        elif x != y:
            out.append(f"{prefix}{key} ({x!r} in the checkpoint, {y!r} now)")
    return out


def truncate_metrics(run_dir: str, iteration: int, num_rows: int) -> list[dict[str, Any]]:
    """Cuts RUN_DIR/metrics.jsonl back to the rows of iterations <= `iteration` (atomically).

    Rows after a checkpoint are recomputed by the resumed run, so they are dropped here (a torn
    last line of a killed run goes too). Returns the rows kept.
    """
    from ppo_async.checkpoint import CheckpointError

    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise CheckpointError(f"cannot resume {run_dir!r}: no metrics.jsonl")
    kept = [row for row in read_jsonl(path) if row.get("iteration", 0) <= iteration]
    if len(kept) != iteration * num_rows:
        raise CheckpointError(
            f"cannot resume {run_dir!r}: metrics.jsonl has {len(kept)} rows up to iteration {iteration}, "
            f"expected {iteration * num_rows} ({num_rows} per iteration)"
        )
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in kept:
            f.write(json.dumps(row, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return kept


def make_tb_writer(run_dir: str, config: Config, first_iteration: int = 1) -> Any:
    """A tensorboardX SummaryWriter on RUN_DIR/tb (global step = env steps per seed).

    When resuming, events at or after the first recomputed iteration are purged by TensorBoard.
    """
    from tensorboardX import SummaryWriter

    purge = (first_iteration - 1) * config.batch_size + 1 if first_iteration > 1 else None
    return SummaryWriter(logdir=os.path.join(run_dir, "tb"), purge_step=purge, flush_secs=10)


def write_tb_rows(writer: Any, rows: list[dict[str, Any]], label_keys: set[str]) -> None:
    """Every scalar metric of one iteration's rows; tags are `name`, or `seed_S/name` with several rows."""
    many = len(rows) > 1
    for row in rows:
        prefix = ""
        if many:
            prefix = "_".join(f"{k}_{row[k]}" if k != "seed" else f"seed_{row[k]}" for k in sorted(label_keys) if k in row) + "/"
        step = int(row["env_steps"])
        for name, value in row.items():
            if name in label_keys or name in ("iteration", "env_steps"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # None (NaN), lists (histograms)
            writer.add_scalar(prefix + name, value, global_step=step)


def wandb_row(rows: list[dict[str, Any]], label_keys: set[str]) -> dict[str, float]:
    """One W&B log entry for an iteration: each row's scalars, prefixed by its labels when several."""
    if len(rows) == 1:
        return scalar_items(rows[0])
    out = {}
    for row in rows:
        prefix = "_".join(f"{k}_{row[k]}" for k in sorted(label_keys) if k in row)
        out.update({f"{prefix}/{k}": v for k, v in scalar_items(row).items() if k not in label_keys})
    return out


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
    checkpointer: Any = None,
    tb_writer: Any = None,
    wandb_run: Any = None,
    counters: tuple[np.ndarray, np.ndarray] | None = None,
    wall_offset: float = 0.0,
) -> tuple[Any, list[dict[str, Any]]]:
    """The host loop shared by the jitted modes: step, time, check, account, log.

    `compiled_step(states, *args) -> (states, metrics)` with metric leaves `[L, ...]` (or
    `[C, S, ...]` with `leading_axes=2`, flattened to L = C * S); `labels[l]` (e.g. seed, config id) is added to row l.
    Per row it keeps the sample accounting `produced = consumed + dropped + resident`
    (resident is 0 here: a jitted mode consumes every batch it produces in the same step) and
    raises if it ever fails.

    With a `checkpointer` (`ppo_async.checkpoint.Checkpointer`) the whole state pytree is saved
    every `config.checkpoint_every` iterations and after the last one, after that iteration's
    rows are written, with metadata (config, iteration, the accounting counters per row, wall
    time). A resumed loop passes `first_iteration`, `counters` (consumed, dropped per row) and
    `wall_offset` from that metadata. `tb_writer` (tensorboardX) and `wandb_run` get every
    scalar per row.
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
    if counters is not None:
        consumed[:] = counters[0]
        dropped[:] = counters[1]
    label_keys = {k for label in labels for k in label}
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
                    wall_time=now - start + wall_offset,
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
            if tb_writer is not None:
                write_tb_rows(tb_writer, rows, label_keys)
            if wandb_run is not None:
                wandb_run.log(wandb_row(rows, label_keys), step=int(rows[0]["env_steps"]))
            if checkpointer is not None and (
                iteration == config.num_iterations
                or (config.checkpoint_every > 0 and iteration % config.checkpoint_every == 0)
            ):
                checkpointer.save(
                    iteration,
                    states,
                    {
                        "config": config_to_dict(config),
                        "iteration": iteration,
                        "env_steps": iteration * config.batch_size,
                        "labels": labels,
                        "samples_consumed": consumed.tolist(),
                        "samples_dropped": dropped.tolist(),
                        "wall_time": now - start + wall_offset,
                    },
                )
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
