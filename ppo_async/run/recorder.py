"""`RunRecorder`: everything a run writes and checks, for every mode (side effects: disk I/O).

Host loops say *when* (a learner iteration's rows are ready, a state can be saved); the
recorder says *what is written*: the run directory (created, reset or refused), config.json,
metrics.jsonl, TensorBoard events, W&B, the progress bar, the non-finite checks, the sample
accounting identity `produced = consumed + dropped + resident`, checkpoint cadence and
metadata, the lag / version schedule, the final plots and the `TrainResult`. No mode opens a
file itself.

    recorder = RunRecorder(config, labels=[{"seed": 0}], progress=True)
    state = recorder.resume_from(state_like)          # only when resuming
    with recorder:                                   # opens the writers
        for iteration in ...:
            recorder.record(rows, iteration, state=lambda: state)
    result = recorder.result(final_state, compile_seconds)
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np

from ppo_async.run import rundir
from ppo_async.report.aggregate import aggregate_rows
from ppo_async.run.checkpoint import Checkpointer
from ppo_async.config import Config, ConfigError, config_to_dict
from ppo_async.report.health import RunHealth, first_warnings
from ppo_async.core.lag import SCHEDULE_COLUMNS, write_schedule
from ppo_async.run.policy import Policy, episodes_program
from ppo_async.report.metrics import (
    JsonlWriter,
    MetricsLog,
    NonFiniteError,
    Progress,
    check_finite,
    scalar_items,
)
from ppo_async.run.result import TrainResult
from ppo_async.run.startup import STARTUP_FILE, StartupClock

EVAL_SEED_OFFSET = 10_000  # evaluation episodes use seed + this (never a training key)
LOSS_FIELDS = ("policy_loss", "value_loss", "entropy", "approx_kl")
ACCOUNTING_FIELDS = ("samples_produced", "samples_consumed", "samples_dropped", "samples_resident")
# Fields that may differ between a run and its resumption (they do not change the maths).
# total_env_steps may grow (an extension; `rundir.check_can_start` refuses shrinking).
RESUME_FREE_FIELDS = ("run_dir", "checkpoint_every_steps", "checkpoint_every", "keep_checkpoints", "wandb_project", "overwrite",
                      "plots", "total_env_steps")


def latest_checkpoint_meta(run_dir: str, keep: int) -> dict[str, Any] | None:
    """The metadata of the latest complete checkpoint of `run_dir` (no array is read), or None
    when it has no checkpoint."""
    ckpt_dir = rundir.checkpoint_dir(run_dir)
    if not os.path.isdir(ckpt_dir):
        return None
    with Checkpointer(ckpt_dir, max_to_keep=keep) as ckpt:
        return None if ckpt.latest_step() is None else ckpt.metadata()


def check_resume_config(config: Config, source: str | None = None) -> None:
    """ConfigError (one line) naming every field where `config` differs from the config the
    latest checkpoint of `config.run_dir` was written with (but `RESUME_FREE_FIELDS`), before
    anything is restored: restoring into another env's state would report the mismatch leaf
    by leaf. `source` (e.g. RUN_DIR/config.json, where `config` was read) starts the message
    and it then says to restore that file. No run directory or no checkpoint: nothing to
    compare (resuming reports that itself)."""
    if config.run_dir is None:
        return
    meta = latest_checkpoint_meta(config.run_dir, config.keep_checkpoints)
    if meta is None:
        return
    try:
        rundir.check_config_matches(config, meta, RESUME_FREE_FIELDS)
    except ConfigError as exc:
        if source is None:
            raise
        raise ConfigError(f"{source}: {exc}; restore it, or train a new run") from None


def describe(label: Mapping[str, Any]) -> str:
    """`{"seed": 1, "config_id": 2}` -> "seed 1, config_id 2"."""
    return ", ".join(f"{k} {v}" for k, v in label.items())


def check_env_values(row: Mapping[str, Any], env: str, iteration: int) -> None:
    """Raises NonFiniteError when the rollout behind a row saw NaN/inf observations or rewards."""
    count = row.get("nonfinite_env_values")
    if count:
        where = describe({k: row[k] for k in ("config_id", "seed", "sampler_id") if k in row})
        raise NonFiniteError(
            f"env {env!r} produced {count} NaN/inf observations or rewards in iteration {iteration} ({where})"
        )


def check_accounting(row: Mapping[str, Any], iteration: int) -> None:
    """Raises AssertionError unless `samples_produced = consumed + dropped + resident` in the row."""
    produced, consumed, dropped, resident = (row[name] for name in ACCOUNTING_FIELDS)
    if produced != consumed + dropped + resident:
        where = describe({k: row[k] for k in ("config_id", "seed") if k in row})
        raise AssertionError(
            f"sample accounting broken at iteration {iteration} ({where}): produced {produced} != consumed "
            f"{consumed} + dropped {dropped} + resident {resident}"
        )


def make_tb_writer(run_dir: str, config: Config, first_iteration: int = 1) -> Any:
    """A tensorboardX SummaryWriter on RUN_DIR/tb (global step = env steps per seed).

    When resuming, events at or after the first recomputed iteration are purged by TensorBoard.
    """
    from tensorboardX import SummaryWriter

    purge = (first_iteration - 1) * config.batch_size + 1 if first_iteration > 1 else None
    return SummaryWriter(logdir=os.path.join(run_dir, "tb"), purge_step=purge, flush_secs=10)


def _row_prefix(row: Mapping[str, Any], label_keys: Iterable[str]) -> str:
    return "_".join(f"{k}_{row[k]}" for k in sorted(label_keys) if k in row)


def write_tb_rows(writer: Any, rows: Sequence[Mapping[str, Any]], label_keys: set[str]) -> None:
    """Every scalar metric of one iteration's rows; tags are `name`, or `seed_S/name` with several rows."""
    many = len(rows) > 1
    for row in rows:
        prefix = _row_prefix(row, label_keys) + "/" if many else ""
        step = int(row["env_steps"])
        for name, value in scalar_items(row).items():
            if name not in label_keys and name not in ("iteration", "env_steps"):
                writer.add_scalar(prefix + name, value, global_step=step)


def wandb_row(rows: Sequence[Mapping[str, Any]], label_keys: set[str]) -> dict[str, float]:
    """One W&B log entry for an iteration: each row's scalars, prefixed by its labels when several."""
    if len(rows) == 1:
        return scalar_items(rows[0])
    out = {}
    for row in rows:
        prefix = _row_prefix(row, label_keys)
        out.update({f"{prefix}/{k}": v for k, v in scalar_items(row).items() if k not in label_keys})
    return out


def import_wandb(config: Config) -> Any:
    """The wandb module when `config.wandb_project` is set, else None; ConfigError (naming the
    field) when it is set and the package is not installed. Cheap: `train()` calls it before
    compiling, so a missing package is reported at once."""
    if config.wandb_project is None:
        return None
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            f"wandb_project = {config.wandb_project!r} needs the wandb package: pip install wandb "
            "(or leave wandb_project unset)"
        ) from None
    return wandb


def open_wandb(config: Config) -> Any:
    """A Weights & Biases run when `config.wandb_project` is set, else None.

    W&B is optional: when asked for without the package installed this raises ConfigError
    (naming the field) rather than running without the logging the user asked for. The run
    is named after the run directory and carries the whole config.
    """
    wandb = import_wandb(config)
    if wandb is None:
        return None
    name = os.path.basename(os.path.normpath(config.run_dir)) if config.run_dir else None
    return wandb.init(project=config.wandb_project, name=name, config=config_to_dict(config), dir=config.run_dir)


class RunRecorder:
    """Owns every output of one run (or of one sweep group, with no run directory).

    Args:
      config: the run's config; `config.run_dir = None` writes no file.
      labels: one dict per row of an iteration (e.g. `{"seed": 3}`, or config_id + seed in a
        sweep), added to that row.
      progress: show a console progress bar.
      on_iteration: called with each iteration's rows after they are recorded, before its progress line.
      keep_rows: keep every row in memory for the `TrainResult`.
      writes_files: False for the processes > 0 of a multi-process run: they write no run
        directory, W&B or evaluation (process 0 does) - only `process_log`.
      process_log: a file this process's log lines go to (`log_line`), in a multi-process run.
      startup: the clock of the run's start (`train()` makes one): told when the writers are
        open and when the first iteration is recorded; its breakdown goes to
        RUN_DIR/startup.json at the first result and to `TrainResult.extras["startup"]`.
    """

    def __init__(
        self,
        config: Config,
        labels: Sequence[Mapping[str, Any]],
        *,
        progress: bool = False,
        on_iteration: Callable[[list[dict[str, Any]]], None] | None = None,
        keep_rows: bool = True,
        writes_files: bool = True,
        process_log: str | None = None,
        startup: StartupClock | None = None,
    ) -> None:
        self.config = config
        self.labels = [dict(label) for label in labels]
        self.writes_files = writes_files
        self.run_dir = config.run_dir if writes_files else None
        self.process_log = process_log
        self.startup = startup
        self._process_log: Any = None
        self.progress = progress
        self.on_iteration = on_iteration
        self.keep_rows = keep_rows
        self.first_iteration = 1
        self.resumed_meta: dict[str, Any] | None = None
        # The rows written (aggregated over log_every iterations), kept compactly in memory only
        # without a run directory: with one, `result()` reads them back from metrics.jsonl.
        self.rows = MetricsLog()
        self._last_wall_time = 0.0
        self.last_saved_iteration = 0
        self.last_iteration = 0
        self._window: list[list[dict[str, Any]]] = []  # iterations since the last written row
        self._last_rows: list[dict[str, Any]] = []  # the last iteration's rows (counters for a checkpoint)
        self._label_keys = {k for label in self.labels for k in label}
        self._health = [RunHealth() for _ in self.labels]
        self._eval_play: Any = None  # the compiled evaluation episodes, built at the first evaluation
        self._first_warnings: dict[str, str] = {}  # kind -> message of its first appearance
        self._writer = self._tb = self._wandb = self._checkpointer = self._bar = None
        self._checkpoint_dir: str | None = None  # set when open; the Checkpointer is made at the first save
        self._schedule_files: dict[str, Any] = {}  # filename -> open append handle (run_dir)
        self._schedules: dict[str, list[dict[str, Any]]] = {}  # filename -> records (no run_dir)
        self._open = False

    # ------------------------------------------------------------------ set-up

    def resume_from(self, state_like: Any, check: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """Restores the latest checkpoint of `config.run_dir` into `state_like`'s structure.

        Checks that the config matches the checkpoint's (up to `RESUME_FREE_FIELDS`; before
        restoring, `check_resume_config`) and, with
        `check`, the mode's own test of the metadata (it raises to refuse); then cuts
        metrics.jsonl back to the checkpoint's iteration and remembers its counters; returns
        the restored state. Call before opening the recorder.
        """
        if not self.run_dir:
            raise ConfigError("resume=True needs config.run_dir (the run to continue)")
        check_resume_config(self.config)  # the fields by name, before a restore reports leaves
        state, meta = rundir.restore_checkpoint(self.run_dir, state_like, self.config.keep_checkpoints)
        rundir.check_config_matches(self.config, meta, RESUME_FREE_FIELDS)
        if check is not None:
            check(meta)
        iteration = int(meta["iteration"])
        earlier = rundir.truncate_metrics(self.run_dir, iteration, len(self.labels), self.config.log_every)
        for index, row in enumerate(earlier):  # the warnings' running state, as the run left it
            self._health[index % len(self.labels)].update(row)
        self._first_warnings = first_warnings(earlier)
        self._last_wall_time = float(earlier[-1]["wall_time"]) if earlier else 0.0
        self.first_iteration = iteration + 1
        self.last_saved_iteration = self.last_iteration = iteration
        self.resumed_meta = meta
        return state

    def cut_schedule(self, filename: str) -> None:
        """Cuts RUN_DIR/filename (a version schedule appended per iteration) back to the records
        of the resumed checkpoint's iterations (a torn last line of a killed run goes too). Call
        after `resume_from`; a missing file is left missing."""
        if self.run_dir and self.resumed_meta is not None:
            rundir.truncate_schedule(os.path.join(self.run_dir, filename), self.first_iteration - 1)

    def resumed_counter(self, name: str) -> np.ndarray:
        """Per row, a counter (e.g. `samples_consumed`) at the resumed checkpoint; zeros when fresh."""
        if self.resumed_meta is None:
            return np.zeros(len(self.labels), np.int64)
        return np.asarray(self.resumed_meta[name], np.int64)

    @property
    def wall_offset(self) -> float:
        """Wall time already spent before a resumed checkpoint (0 when fresh)."""
        return float(self.resumed_meta["wall_time"]) if self.resumed_meta is not None else 0.0

    def open(self) -> "RunRecorder":
        """Prepares the run directory (fresh: create or reset; resumed: keep) and opens the writers."""
        config, run_dir = self.config, self.run_dir
        resuming = self.resumed_meta is not None
        t0 = time.perf_counter()
        try:
            if run_dir:
                if not resuming:
                    rundir.prepare_fresh(run_dir)
                rundir.write_config(run_dir, config)
                if os.path.isfile(os.path.join(run_dir, STARTUP_FILE)):  # an earlier process's start
                    os.remove(os.path.join(run_dir, STARTUP_FILE))
                self._writer = JsonlWriter(os.path.join(run_dir, rundir.METRICS_FILE), append=resuming)
                self._tb = make_tb_writer(run_dir, config, self.first_iteration)
                # the Checkpointer (orbax) is made at the first save: not before the first result
                self._checkpoint_dir = rundir.checkpoint_dir(run_dir)
            if self.writes_files:
                self._wandb = open_wandb(config)
            if self.process_log:
                os.makedirs(os.path.dirname(self.process_log), exist_ok=True)
                self._process_log = open(self.process_log, "a", buffering=1)
        except BaseException:
            self.close()
            raise
        self._bar = Progress(config.num_iterations * config.batch_size, enabled=self.progress, desc=f"{config.env} {config.mode}")
        self._open = True
        if self.startup is not None:
            self.startup.writers_opened(time.perf_counter() - t0)
        return self

    def __enter__(self) -> "RunRecorder":
        return self if self._open else self.open()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self.close()
        except Exception as close_error:
            if exc is None:
                raise
            # the run's own error stays the one raised (a writer that cannot close after it, e.g.
            # on the same full disk, would hide it); the close failure is noted on it
            exc.add_note(f"(closing the run's writers failed too: {type(close_error).__name__}: {close_error})")

    def close(self) -> None:
        """Writes the rows of a window cut short (a run stopped early), then closes every writer
        (idempotent). Every writer is closed even when one fails; the first failure is re-raised."""
        errors: list[Exception] = []

        def attempt(action: Callable[[], Any]) -> None:
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - re-raised below, after the other writers are closed
                errors.append(exc)

        if self._window:
            attempt(lambda: self._write_rows(self._window))
        for closeable in (self._bar, self._writer, self._tb, self._checkpointer, self._process_log, *self._schedule_files.values()):
            if closeable is not None:
                attempt(closeable.close)
        if self._wandb is not None:
            attempt(self._wandb.finish)
        self._writer = self._tb = self._wandb = self._checkpointer = self._bar = self._process_log = None
        self._checkpoint_dir = None
        self._schedule_files = {}
        self._window = []
        self._open = False
        if errors:
            raise errors[0]

    # ------------------------------------------------------------------ per iteration

    def checkpoint_due(self, iteration: int) -> bool:
        """Whether a checkpoint is written after `iteration`: every `checkpoint_every_iterations` and after the last."""
        if not self.run_dir:
            return False
        every = self.config.checkpoint_every_iterations
        return iteration == self.config.num_iterations or (every > 0 and iteration % every == 0)

    def eval_due(self, iteration: int) -> bool:
        """Whether the learner's params are evaluated after `iteration`: every `eval_every_iterations` and after the last."""
        every = self.config.eval_every_iterations
        return self.writes_files and every > 0 and (iteration % every == 0 or iteration == self.config.num_iterations)

    def wants_state(self, iteration: int) -> bool:
        """Whether `record` needs the state after `iteration` (a checkpoint or an evaluation is due)."""
        return self.checkpoint_due(iteration) or self.eval_due(iteration)

    def _evaluate(self, train_state: Any, rows: Sequence[Mapping[str, Any]]) -> list[float]:
        """Mean deterministic return of `eval_episodes` episodes per row, with that row's params.

        `train_state` leaves carry the rows' leading axes (`[S]`, or `[C, S]` in a vmapped
        sweep); one compiled episode program (`policy.episodes_program`) serves every call.
        Episode starts depend on the row's seed only, so every evaluation of a run plays the
        same starts.
        """
        lead = np.ndim(train_state.version)
        flat = jax.tree.map(lambda x: np.reshape(np.asarray(x), (len(rows),) + np.shape(x)[lead:]), train_state)
        out = []
        for i, row in enumerate(rows):
            policy = Policy.of_seed(self.config.replace(num_seeds=len(rows)), flat, i)
            if self._eval_play is None:
                self._eval_play = episodes_program(policy, self.config.eval_episodes)
            seed = EVAL_SEED_OFFSET + int(row.get("seed", self.config.seed))
            returns, _ = self._eval_play(policy.params, policy.obs_stats, seed)
            out.append(float(np.mean(np.asarray(returns))))
        return out

    def record(self, rows: list[dict[str, Any]], iteration: int, state: Callable[[], Any] | None = None,
               mode_state: Callable[[], dict[str, Any]] | None = None) -> None:
        """Checks and writes one learner iteration's rows (one per label), then checkpoints if due.

        Every row must carry the `ACCOUNTING_FIELDS` and `env_steps`. Raises NonFiniteError
        for NaN/inf env values or losses, AssertionError when the accounting identity fails.
        `state()` returns the pytree to checkpoint (called only when one is due);
        `mode_state()` the mode's own JSON metadata for it (`save_checkpoint`).
        """
        for row in rows:
            check_env_values(row, self.config.env, iteration)
            check_accounting(row, iteration)
        check_finite(rows, LOSS_FIELDS, iteration)
        self._check_health(rows)
        snapshot = state() if state is not None and self.wants_state(iteration) else None
        if snapshot is not None and self.eval_due(iteration):
            for row, eval_return in zip(rows, self._evaluate(snapshot.train_state, rows)):
                row["eval_return"] = eval_return
        self.last_iteration = iteration
        self._last_rows = rows
        self._window.append(rows)
        if iteration % self.config.log_every == 0 or iteration == self.config.num_iterations:
            self._write_rows(self._window)
        if snapshot is not None and self.checkpoint_due(iteration):
            self.save_checkpoint(iteration, snapshot, rows, None if mode_state is None else mode_state())
        if self.startup is not None and self.startup.first_result_at is None:
            self._first_result()
        if self.on_iteration is not None:  # before the progress line: a caller's wait (`compiling...`) ends first
            self.on_iteration(rows)
        if self._bar is not None:
            self._bar.update(int(rows[0]["env_steps"]), rows[0])

    def _first_result(self) -> None:
        """The first iteration is recorded: the start is over; its breakdown goes to
        RUN_DIR/startup.json (`ppo_async.run.startup`)."""
        self.startup.first_result()
        if self.run_dir:
            with open(os.path.join(self.run_dir, STARTUP_FILE), "w", encoding="utf-8") as f:
                json.dump(self.startup.breakdown(), f, indent=2)

    def _write_rows(self, window: list[list[dict[str, Any]]]) -> None:
        """Writes one row per label for the iterations of `window` (`aggregate_rows` when
        `log_every` > 1) to metrics.jsonl, TensorBoard, W&B and the kept rows; empties it."""
        if len(window) == 1 and self.config.log_every == 1:
            rows = window[0]
        else:
            rows = [aggregate_rows([iteration_rows[i] for iteration_rows in window]) for i in range(len(window[0]))]
        self._window = []
        if self._writer is not None:
            for row in rows:
                self._writer.write(row)
        if self._tb is not None:
            write_tb_rows(self._tb, rows, self._label_keys)
        if self._wandb is not None:
            self._wandb.log(wandb_row(rows, self._label_keys), step=int(rows[0]["env_steps"]))
        if self.keep_rows and not self.run_dir:
            self.rows.extend(rows)
        self._last_wall_time = float(rows[0]["wall_time"])

    def _check_health(self, rows: list[dict[str, Any]]) -> None:
        """Adds the `health` fields to each row; a warning of a new kind goes to the console
        (above the progress bar) and to `self.warnings`."""
        for health, row in zip(self._health, rows):
            row.update(health.update(row))
        first = first_warnings(rows, self._first_warnings)
        for kind in first.keys() - self._first_warnings.keys():
            if self._bar is not None:
                self._bar.write(f"warning: {first[kind]}")
        self._first_warnings = first

    def announce(self, message: str) -> None:
        """A line on the console above the progress bar (nothing when the bar is off) and in the process log."""
        if self._bar is not None:
            self._bar.write(message)
        self.log_line(message)

    def log_line(self, message: str) -> None:
        """A timestamped line in this process's log file (multi-process runs; else nothing)."""
        if self._process_log is not None:
            self._process_log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")

    @property
    def warnings(self) -> list[str]:
        """Each kind of warning once, as it first appeared (see `ppo_async.report.health`)."""
        return list(self._first_warnings.values())

    def save_checkpoint(self, iteration: int, state: Any, rows: Sequence[Mapping[str, Any]],
                        mode_state: dict[str, Any] | None = None) -> None:
        """Writes checkpoint `iteration` with the metadata a resume needs (counters per row; a
        mode's own JSON state, e.g. a threaded learner's RNG key, under `mode_state`)."""
        if self._checkpoint_dir is None:
            return
        if self._checkpointer is None:
            self._checkpointer = Checkpointer(self._checkpoint_dir, max_to_keep=self.config.keep_checkpoints)
        meta = {
            "format": rundir.CHECKPOINT_FORMAT,
            "mode": self.config.mode,
            "config": config_to_dict(self.config),
            "iteration": iteration,
            "env_steps": int(rows[0]["env_steps"]),
            "labels": self.labels,
            "samples_consumed": [int(row["samples_consumed"]) for row in rows],
            "samples_dropped": [int(row["samples_dropped"]) for row in rows],
            "wall_time": float(rows[0]["wall_time"]),
        }
        if mode_state is not None:
            meta["mode_state"] = mode_state
        self._checkpointer.save(iteration, state, meta)
        self.last_saved_iteration = iteration

    def final_checkpoint(self, state: Callable[[], Any], mode_state: Callable[[], dict[str, Any]] | None = None) -> None:
        """Checkpoints the last recorded iteration unless it was just saved (runs stopped early)."""
        if self._checkpoint_dir is not None and self.last_iteration > self.last_saved_iteration and self._last_rows:
            if self._window:
                self._write_rows(self._window)  # the checkpoint's rows are on disk before it
            self.save_checkpoint(self.last_iteration, state(), self._last_rows, None if mode_state is None else mode_state())

    def append_schedule(self, filename: str, records: Iterable[Mapping[str, Any]]) -> None:
        """Appends version-schedule records (`ppo_async.core.lag` format) to RUN_DIR/filename and
        flushes, as batches are consumed: a killed run keeps its schedule up to the last
        consumed batch. Without a run directory the records are kept in memory."""
        if not self.run_dir:
            self._schedules.setdefault(filename, []).extend(dict(r) for r in records)
            return
        handle = self._schedule_files.get(filename)
        if handle is None:
            handle = self._schedule_files[filename] = open(os.path.join(self.run_dir, filename), "a", encoding="utf-8")
        for record in records:  # (+ process_id in a multi-process run: `distributed.global_row`)
            extra = {"process_id": record["process_id"]} if "process_id" in record else {}
            handle.write(json.dumps({**{k: record.get(k) for k in SCHEDULE_COLUMNS}, **extra}) + "\n")
        handle.flush()

    def schedule_records(self, filename: str) -> Sequence[dict[str, Any]]:
        """Every record appended to `filename`: with a run directory a `MetricsLog` that reads
        the file when first used (nothing held before), else the records kept in memory."""
        if not self.run_dir:
            return list(self._schedules.get(filename, []))
        handle = self._schedule_files.get(filename)
        if handle is not None:
            handle.flush()
        return MetricsLog.from_file(os.path.join(self.run_dir, filename))

    def write_schedule(self, filename: str, records: Iterable[Mapping[str, Any]]) -> None:
        """Writes RUN_DIR/filename (the lag or version schedule, `ppo_async.core.lag` format)."""
        if self.run_dir:
            write_schedule(os.path.join(self.run_dir, filename), records)

    # ------------------------------------------------------------------ the end

    def result(self, train_state: Any, compile_seconds: float, extras: dict[str, Any] | None = None) -> TrainResult:
        """Writes the PNG plots (with a run directory and `config.plots`) and returns the run's `TrainResult`."""
        if self.run_dir and self.config.plots:
            from ppo_async.report.plots import plot_run  # matplotlib is slow to import

            plot_run(self.run_dir)
        extras = dict(extras or {})
        extras["warnings"] = list(self.warnings)
        if self.startup is not None:
            extras["startup"] = self.startup.breakdown()
        if self.resumed_meta is not None:
            extras["first_iteration"] = self.first_iteration
        metrics = MetricsLog.from_file(os.path.join(self.run_dir, rundir.METRICS_FILE)) if self.run_dir else self.rows
        return TrainResult(
            config=self.config,
            train_state=train_state,
            metrics=metrics,
            compile_seconds=compile_seconds,
            run_seconds=self._last_wall_time,
            extras=extras,
        )
