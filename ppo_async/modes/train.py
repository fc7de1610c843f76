"""`train(config)`, `resume(run_dir)` and `load(run_dir)`: the entry points of every mode.

A thin dispatcher: the mode comes from the registry (`ppo_async.modes.registry`; importing
`ppo_async.modes` registers them), the `RunRecorder` owns everything the run writes, and the
mode's host loop says when. Nothing here knows how a mode works.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any, Callable

from ppo_async.config import Config, ConfigError, check_config_type
from ppo_async.config.resources import check_fits_machine
from ppo_async.runtime.distributed import initialize, is_multi_process, process_log_path
from ppo_async.run.policy import Policy, check_seed_index
from ppo_async.run.recorder import RunRecorder, check_resume_config, import_wandb
from ppo_async.modes.common import seed_labels
from ppo_async.modes.registry import Mode, get_mode
from ppo_async.run.checkpoint import Checkpointer
from ppo_async.run.result import TrainResult
from ppo_async.run.startup import StartupClock
from ppo_async.run.rundir import CONFIG_FILE, check_can_start, checkpoint_dir, read_run_config, restore_checkpoint


def train(
    config: Config,
    *,
    progress: bool = False,
    on_iteration: Callable[[list[dict[str, Any]]], None] | None = None,
    resume: bool = False,
) -> TrainResult:
    """Trains `config.num_seeds` seeds of PPO in `config.mode` and returns a `TrainResult`.

    With `config.run_dir` set it writes RUN_DIR/config.json, metrics.jsonl, checkpoints/
    (every `config.checkpoint_every_steps` env steps, in whole iterations, and at the end), TensorBoard events in tb/,
    at the first result startup.json (where the seconds before it went: imports, env, tracing,
    XLA compile, the first iteration; `ppo_async.run.startup`, also in
    `TrainResult.extras["startup"]`) and, once the run is done and with `config.plots`, the PNG plots of
    `plots.plot_run` (else `python -m ppo_async plot RUN_DIR` draws them). A run directory that already
    holds a run is refused unless `config.overwrite` (then it is reset); a non-empty directory
    that is not a run directory is always refused. Both are checked before compiling.

    Args:
      config: a validated `Config`.
      progress: show a console progress bar.
      on_iteration: called with the rows of every learner iteration (one per seed).
      resume: continue the run in `config.run_dir` from its latest complete checkpoint
        (the config must match the checkpoint's, up to run_dir / checkpoint_every_steps /
        keep_checkpoints / wandb_project). metrics.jsonl is cut back to the checkpoint's
        iteration and the continued run computes bit for bit what the uninterrupted run
        would have (`Mode.resumable`: sync, simulated; a threaded run restores its learner
        exactly and makes its lag anew, `Mode.resumes_learner`). `TrainResult.metrics` then
        holds the earlier rows too. On Ctrl-C a line on stderr says how to resume the run.
    """
    clock = StartupClock()  # where the seconds to the first result go (RUN_DIR/startup.json)
    try:
        return _train(config, clock, progress, on_iteration, resume)
    finally:
        clock.stop()


def _train(config: Config, clock: StartupClock, progress: bool,
           on_iteration: Callable[[list[dict[str, Any]]], None] | None, resume: bool) -> TrainResult:
    """`train`, its start timed by `clock`."""
    check_config_type(config)
    check_fits_machine(config)  # before anything is allocated or compiled
    mode = get_mode(config.mode)
    if resume and not mode.can_resume:
        raise ConfigError(f"resume is not supported for mode={config.mode!r} ({mode.why_not_resumable})")
    if resume and config.run_dir is None:
        raise ConfigError("resume=True needs config.run_dir (the run to continue)")
    # several processes: join them first (before JAX computes anything here); process 0 alone
    # writes the run directory, every process its own log file in it
    initialize(config.distributed)
    process = config.distributed.process_id or 0
    if process == 0:
        check_can_start(config, resume)  # before anything is compiled
        if resume:
            check_resume_config(config)  # every differing field by name, before a restore
        import_wandb(config)  # likewise: a missing optional package is reported at once
    labels = seed_labels(config)
    log = process_log_path(config.run_dir, process) if is_multi_process(config) and config.run_dir else None
    recorder = RunRecorder(config, labels, progress=progress and process == 0, on_iteration=on_iteration,
                           writes_files=process == 0, process_log=log, startup=clock)
    try:
        return mode.run(config, recorder, resume)
    except KeyboardInterrupt:  # Ctrl-C: say how to continue (the mode kept what was done)
        hint = resume_hint(config, mode) if process == 0 else None
        if hint:
            print(hint, file=sys.stderr, flush=True)
        raise
    finally:
        recorder.close()


def resume_hint(config: Config, mode: Mode) -> str | None:
    """The line that tells an interrupted run how to continue: the exact command (and the
    Python call) when its mode resumes and its run directory holds a complete checkpoint;
    None otherwise (reading the checkpoints must not hide the interruption)."""
    if config.run_dir is None or not mode.can_resume or not os.path.isdir(checkpoint_dir(config.run_dir)):
        return None
    try:
        with Checkpointer(checkpoint_dir(config.run_dir), max_to_keep=config.keep_checkpoints) as ckpt:
            step = ckpt.latest_step()
    except Exception:  # noqa: BLE001 - no hint rather than a second error
        return None
    if step is None:
        return None
    return (f"interrupted; the checkpoint of iteration {step} is kept. Resume with: python -m ppo_async train "
            f"--resume {shlex.quote(config.run_dir)}   (Python: pa.resume({config.run_dir!r}))")


def resume(
    run_dir: str,
    *,
    total_env_steps: int | None = None,
    progress: bool = False,
    on_iteration: Callable[[list[dict[str, Any]]], None] | None = None,
) -> TrainResult:
    """Continues the run in `run_dir` (its config.json) from its latest complete checkpoint.

    A complete run raises ConfigError saying so; so does a config.json that no longer matches
    the checkpoint's config (one line naming each field that differs; nothing is restored).
    `total_env_steps` larger than the run's extends it: the new total is written to
    config.json and the run continues from its last checkpoint to the new end. Extensions are deterministic in sync / simulated mode (the same
    extension twice gives the same rows). With `ppo.anneal_lr` the learning rate is annealed
    to 0 over the *new* total, so from the resumed iteration on it follows
    `lr * (1 - iteration / new_num_iterations)`: it steps back up from where the original
    schedule had brought it (near 0 at the end of a finished run).
    """
    config = read_run_config(run_dir)
    check_resume_config(config, source=os.path.join(run_dir, CONFIG_FILE))  # one line naming the fields
    if total_env_steps is not None:
        config = config.replace(total_env_steps=total_env_steps)
    return train(config, progress=progress, on_iteration=on_iteration, resume=True)


def load(run_dir: str | os.PathLike, seed_index: int = 0, step: int | None = None) -> Policy:
    """The policy of seed `seed_index` in the latest (or `step`) checkpoint of `run_dir`.

    The checkpoint is restored into the abstract structure of a fresh run of its mode
    (nothing is trained or compiled). Raises ConfigError when `run_dir` is not a run
    directory or `seed_index` is out of range, `checkpoint.CheckpointError` when there is no
    (such) checkpoint or it is in an older format.
    """
    run_dir = os.fspath(run_dir)
    config = read_run_config(run_dir)
    check_seed_index(config, seed_index)
    state_like = get_mode(config.mode).checkpoint_like(config)
    state, meta = restore_checkpoint(run_dir, state_like, config.keep_checkpoints, step=step)
    return Policy.of_seed(config, state.train_state, seed_index, iteration=meta["iteration"])
