"""Run directories: where a run's files live, and the checks on them (side effects: disk I/O).

A run directory holds `config.json` (the resolved config), `metrics.jsonl` (one row per
seed x learner iteration), `checkpoints/` (orbax steps), `tb/` (TensorBoard events), the lag
or version schedule (`lag_schedule.jsonl` / `version_schedule.jsonl`) and the PNG plots.
`RunRecorder` (ppo_async.run.recorder) is the only writer; this module is the leaf it and the
readers (`load`, `resume`, `plot`) share.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any

from ppo_async.run.checkpoint import Checkpointer, CheckpointError
from ppo_async.config import Config, ConfigError, config_from_dict, config_to_dict, convert_deprecated_fields
from ppo_async.report.metrics import read_jsonl

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
# Files and folders a run writes; a fresh run in an existing run directory removes them first.
RUN_OUTPUTS = (METRICS_FILE, "checkpoints", "tb", "logs", "lag_schedule.jsonl", "version_schedule.jsonl")

# Version of what a checkpoint's `state` item holds. 2: the optimiser state is optax's
# inject_hyperparams(chain(clip_by_global_norm, frozen-critic Adam, scale_by_learning_rate)).
# Checkpoints without a `format` in their metadata (format 1) hold a bare Adam state.
CHECKPOINT_FORMAT = 3


def checkpoint_dir(run_dir: str) -> str:
    """RUN_DIR/checkpoints."""
    return os.path.join(run_dir, "checkpoints")


def write_config(run_dir: str, config: Config) -> None:
    """Writes RUN_DIR/config.json (the resolved config)."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, CONFIG_FILE), "w", encoding="utf-8") as f:
        json.dump(config_to_dict(config), f, indent=2)


def read_run_config(run_dir: str) -> Config:
    """The Config of a run directory (RUN_DIR/config.json), with run_dir set to `run_dir`."""
    path = os.path.join(run_dir, CONFIG_FILE)
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


def prepare_fresh(run_dir: str) -> None:
    """Makes `run_dir` ready for a fresh run: create it, reset it, or refuse it.

    A missing or empty directory is created / used; a run directory (one with config.json)
    has its previous outputs (`RUN_OUTPUTS`, the PNG plots) removed, since the new
    metrics.jsonl starts over. A non-empty directory that is not a run directory is refused
    (ConfigError), so a mistyped run_dir never deletes someone's files.
    """
    _check_not_a_file(run_dir)
    if os.path.isdir(run_dir) and os.listdir(run_dir) and not os.path.isfile(os.path.join(run_dir, CONFIG_FILE)):
        raise ConfigError(
            f"run_dir = {run_dir!r} is invalid: the directory is not empty and is not a ppo_async run directory "
            f"(no {CONFIG_FILE}); choose a new or empty directory"
        )
    os.makedirs(run_dir, exist_ok=True)
    for name in os.listdir(run_dir):
        path = os.path.join(run_dir, name)
        if name in RUN_OUTPUTS or name.endswith(".png"):
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)


def _check_not_a_file(run_dir: str) -> None:
    """ConfigError when `run_dir`, or a directory above it, is a file (it could not be created)."""
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise ConfigError(f"run_dir = {run_dir!r} is invalid: it is a file, not a directory")
    parent = os.path.dirname(os.path.abspath(run_dir))
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ConfigError(f"run_dir = {run_dir!r} is invalid: {parent!r} above it is a file, not a directory")


def check_writable(run_dir: str) -> None:
    """ConfigError (one line: `run_dir`, the path and the OS reason) when `run_dir` cannot be
    created or a file cannot be written in it (`/proc/x`, a read-only mount, no permission).
    Creates the directory and writes one probe file, then removes both: a refused run leaves
    nothing behind."""
    created = []  # the directories this check makes, deepest first
    path = os.path.abspath(run_dir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        created.append(path)
        path = os.path.dirname(path)
    try:
        os.makedirs(run_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=run_dir, prefix=".write-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"run_dir = {run_dir!r} is invalid: cannot create or write it ({reason}); "
                          "choose a directory you can write") from None
    finally:
        for directory in created:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def check_can_start(config: Config, resume: bool) -> None:
    """Checks `config.run_dir` before anything is compiled; raises ConfigError when a run cannot
    start there.

    Fresh runs: a file is refused; a non-empty directory that is not a run directory is
    refused; a run directory (config.json) is refused unless `config.overwrite` (then
    `prepare_fresh` resets it when the run opens). Resumed runs: the directory must hold a
    run whose latest checkpoint is not already complete, and `total_env_steps` may grow (an
    extension) but not shrink.
    """
    run_dir = config.run_dir
    if run_dir is None:
        return
    _check_not_a_file(run_dir)
    if not resume or os.path.isdir(run_dir):  # a missing run to resume is _check_resumable's error
        check_writable(run_dir)
    holds_run = os.path.isfile(os.path.join(run_dir, CONFIG_FILE))
    if resume:
        _check_resumable(config)
    elif holds_run and not config.overwrite:
        raise ConfigError(
            f"run_dir = {run_dir!r} already holds a run ({CONFIG_FILE}, {METRICS_FILE}); a new run would overwrite it. "
            "Pass overwrite=True (CLI: --overwrite) to replace it, resume it (resume(run_dir) / train --resume RUN_DIR), "
            "or choose another run_dir"
        )
    elif os.path.isdir(run_dir) and os.listdir(run_dir) and not holds_run:
        raise ConfigError(
            f"run_dir = {run_dir!r} is invalid: the directory is not empty and is not a ppo_async run directory "
            f"(no {CONFIG_FILE}); choose a new or empty directory"
        )


def _check_resumable(config: Config) -> None:
    """The run in `config.run_dir` has a checkpoint short of `config.num_iterations`."""
    ckpt_dir = checkpoint_dir(config.run_dir)
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"no checkpoints in {config.run_dir!r} (no {ckpt_dir})")
    with Checkpointer(ckpt_dir, max_to_keep=config.keep_checkpoints) as ckpt:
        if ckpt.latest_step() is None:
            raise CheckpointError(f"no checkpoints in {ckpt_dir}")
        meta = ckpt.metadata()
    check_format(meta, ckpt_dir)
    iteration = int(meta.get("iteration", 0))
    saved_total = int(meta.get("config", {}).get("total_env_steps", config.total_env_steps))
    if config.total_env_steps < saved_total:
        raise ConfigError(
            f"total_env_steps = {config.total_env_steps} is invalid for resuming {config.run_dir!r}: the run was "
            f"started with {saved_total}; a resumed run can be extended, not shortened"
        )
    if iteration >= config.num_iterations:
        raise ConfigError(
            f"the run in {config.run_dir!r} is complete: {iteration} of {config.num_iterations} learner iterations "
            f"({iteration * config.batch_size} env steps per seed). To extend it, resume with a larger total_env_steps "
            f"(CLI: train --resume {config.run_dir} --total-env-steps N; API: resume(run_dir, total_env_steps=N))"
        )


def check_config_matches(config: Config, meta: dict[str, Any], free_fields: tuple[str, ...]) -> None:
    """Raises ConfigError naming every field (but `free_fields`) where `config` differs from a
    checkpoint's (one written with deprecated fields, before the cadences counted env steps or
    before the one num_samplers, read as today's: `convert_deprecated_fields`)."""
    saved = dict(meta.get("config", {}))
    try:
        saved = convert_deprecated_fields(saved)
    except ConfigError:
        pass  # a config today's code refuses: compared as written, the fields that differ named below
    now = config_to_dict(config)
    for name in free_fields:
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


def restore_checkpoint(run_dir: str, state_like: Any, keep: int, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """`(state, metadata)` of the latest (or `step`) checkpoint of a run directory.

    Raises CheckpointError when there is no checkpoint, or when it was written in an older
    format (before the optax optimiser chain) with a message saying so, before any array is read.
    """
    ckpt_dir = checkpoint_dir(run_dir)
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"no checkpoints in {run_dir!r} (no {ckpt_dir})")
    with Checkpointer(ckpt_dir, max_to_keep=keep) as ckpt:
        check_format(ckpt.metadata(step), ckpt_dir)
        return ckpt.restore(state_like, step=step)


def check_format(meta: dict[str, Any], ckpt_dir: str) -> None:
    """Raises CheckpointError when checkpoint metadata is not of `CHECKPOINT_FORMAT`."""
    found = meta.get("format", 1)
    if found != CHECKPOINT_FORMAT:
        raise CheckpointError(
            f"the checkpoint in {ckpt_dir} has format {found}, written by "
            f"{'an older' if found < CHECKPOINT_FORMAT else 'a newer'} version of ppo_async; this version reads "
            f"format {CHECKPOINT_FORMAT} (format 3 adds the reward-normalisation statistics, format 2 keeps the optax "
            "optimiser chain state, format 1 a bare Adam state). Retrain, or load it with the ppo_async version that wrote it."
        )


def truncate_metrics(run_dir: str, iteration: int, num_rows: int, log_every: int = 1) -> list[dict[str, Any]]:
    """Cuts RUN_DIR/metrics.jsonl back to the rows of iterations <= `iteration` (atomically).

    Rows after a checkpoint are recomputed by the resumed run, so they are dropped here (a torn
    last line of a killed run goes too). With `log_every` > 1 a row stands for up to
    `log_every` iterations, so ceil(iteration / log_every) rows per label are expected.
    Returns the rows kept.
    """
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"cannot resume {run_dir!r}: no metrics.jsonl")
    kept = [row for row in read_jsonl(path) if row.get("iteration", 0) <= iteration]
    expected = -(-iteration // log_every) * num_rows
    if len(kept) != expected:
        raise CheckpointError(
            f"cannot resume {run_dir!r}: metrics.jsonl has {len(kept)} rows up to iteration {iteration}, "
            f"expected {expected} ({num_rows} per logged iteration, log_every = {log_every})"
        )
    _rewrite_jsonl(path, kept)
    return kept


def truncate_schedule(path: str, iteration: int) -> None:
    """Cuts a version schedule (JSON lines, one record per consumed chunk, appended as the run
    goes) back to the records of iterations <= `iteration`, atomically; a torn last line of a
    killed run goes too. A missing file is left missing."""
    if not os.path.isfile(path):
        return
    _rewrite_jsonl(path, [record for record in read_jsonl(path) if record.get("iteration", 0) <= iteration])


def _rewrite_jsonl(path: str, records: list[dict[str, Any]]) -> None:
    """Replaces `path` by `records` as JSON lines, atomically (a crash leaves the old file or the new)."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
