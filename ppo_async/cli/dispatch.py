"""Command line: `python -m ppo_async COMMAND [OPTIONS]`, one tyro subcommand per command.

Each command is a frozen dataclass of its options (`COMMANDS`; a docstring per field is its
help) with a `run() -> int`. tyro parses the whole command line into one of them and
generates every help text (`python -m ppo_async --help`, `python -m ppo_async COMMAND
--help`). Two commands prepare their command line first: `train` builds the default its flags
override (`--config FILE`, the env preset, `--resume RUN_DIR`: `cli.train.prepare`), and
`launch` splits off the train options after `--`.

User errors (bad values, unknown options or env names, unreadable files) print one line,
`error: ...`, and exit with status 2, without a traceback (`cli.parsing`). Environment
variables for XLA are set here, at the entry point, never at library import.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import os
import sys
import threading
import traceback
from typing import Annotated, Any, NoReturn, Sequence, Union

import tyro

from ppo_async.cli.benchmark import BenchmarkCommand
from ppo_async.cli.launch import LaunchCommand, split_launch
from ppo_async.cli.parsing import PROG, in_their_words, parse
from ppo_async.config import Config, env_check_deferred
from ppo_async.config.checks import every_failure, field_paths
from ppo_async.cli.noise import quiet_library_noise
from ppo_async.cli.tools import CompareCommand, EvalCommand, PlotCommand
from ppo_async.cli.train import TrainCommand, prepare, train_error
from ppo_async.cli.tune import TuneCommand
from ppo_async.errors import ConfigError, DistributedFailure

COMMANDS: dict[str, type] = {
    "train": TrainCommand,
    "eval": EvalCommand,
    "plot": PlotCommand,
    "compare": CompareCommand,
    "tune": TuneCommand,
    "benchmark": BenchmarkCommand,
    "launch": LaunchCommand,
}
"""The commands, in the order the help lists them."""

DESCRIPTION = (
    "Asynchronous PPO in JAX. `python -m ppo_async COMMAND --help` describes each command's options. Exit "
    "status: 0 done; 2 a user error (one line on stderr); 3 NaN/inf in training; 4 another process of a "
    "multi-process run failed or died; 5 a thread of a threaded run stalled (stuck, dead, or all waiting on each "
    "other: threaded.timeout_s); 130 interrupted."
)


def parse_command(argv: Sequence[str], join: bool = False) -> Any:
    """The command of `argv` (`COMMAND [OPTIONS]`), parsed: an instance of a `COMMANDS` class.
    ConfigError (one line) for a rejected command line; `--help` prints the help and raises
    SystemExit(0). With `join`, `train` joins the processes of a multi-process run first."""
    args = list(argv)
    name = args[0] if args and not args[0].startswith("-") else ""
    options = [a for a in args if a.startswith("-") and a not in ("-h", "--help")]
    if not name and options:
        raise ConfigError(f"a command comes first, before {options[0]}: one of {', '.join(COMMANDS)} "
                          f"(see {PROG} --help)")
    if name and name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"unknown command {name!r}: the commands are {', '.join(COMMANDS)}{hint} "
                          f"(see {PROG} --help)")
    defaults: dict[str, Any] = {}
    train_args: list[str] = []
    try:
        # the env name is checked when the command runs: --help and other errors need no JAX;
        # every failed field of a config is reported at once (`every_failure`)
        with env_check_deferred(), every_failure():
            if name == "train":
                rest, defaults["train"] = prepare(args[1:], join=join)
                args = [name, *rest]
            elif name == "launch":
                own, train_args = split_launch(args[1:])
                args = [name, *own]
            choices = tuple(
                Annotated[cls, tyro.conf.subcommand(command, default=defaults.get(command, tyro.MISSING_NONPROP))]
                for command, cls in COMMANDS.items()
            )
            command = parse(Union[choices], args, command=name, description=DESCRIPTION,  # type: ignore[valid-type]
                            own=COMMANDS.get(name, Union[tuple(COMMANDS.values())]))
    except ConfigError as exc:
        if name == "train":  # each field named where the user set it (flag or --config FILE), the env first
            raise train_error(exc, argv[1:]) from None
        raise
    if isinstance(command, LaunchCommand):
        command = dataclasses.replace(command, train_args=tuple(train_args))
    return command


def cli_fields() -> list[str]:
    """The names an error may start with that the command line spells as flags: every dotted
    Config field and every command's own options."""
    own = [f.name for cls in COMMANDS.values() for f in dataclasses.fields(cls)]
    return [*field_paths(Config), *own]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m ppo_async`; returns the exit status (2: user error, one line
    on stderr; 3: NaN/inf in training; 4: another process of a multi-process run failed or
    died; 5: a thread of a threaded run stalled, one line; 130: interrupted). `--help` returns 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_library_noise()
    try:
        return _finish_processes(_parse_and_run(argv))
    except DistributedFailure as exc:  # another process failed first: its failure, not this one's
        print(f"error: {exc}", file=sys.stderr)
        return _finish_processes(DistributedFailure.exit_status, str(exc), report=False)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return _finish_processes(130, "interrupted")
    except BaseException as exc:
        status = _status_of(exc)
        if status is not None:  # a user error (2), NaN/inf (3) or a stalled thread (5): one line
            message = in_their_words(exc, cli_fields()) if status == 2 else str(exc)
            print(f"error: {message}", file=sys.stderr)
            return _finish_processes(status, str(exc))
        if _joined_processes():  # the traceback, then out (see _finish_processes)
            traceback.print_exc()
            _finish_processes(1, f"{type(exc).__name__}: {exc}")
        raise


STALLED_STATUS = 5
"""The exit status of a threaded run stopped by `StalledThread` (a thread stuck, dead, or all
of them waiting on each other for `threaded.timeout_s`)."""


def _status_of(exc: BaseException) -> int | None:
    """The exit status of an error that ends a command with one line (2: a `ConfigError` or a
    `CheckpointError`; 3: a `NonFiniteError`; 5: a `StalledThread`), None for any other. The
    modules defining the last three are looked up where already imported: until they are,
    they cannot have raised."""
    if isinstance(exc, ConfigError):
        return 2
    checkpoint = sys.modules.get("ppo_async.run.checkpoint")
    if checkpoint is not None and isinstance(exc, checkpoint.CheckpointError):
        return 2
    metrics = sys.modules.get("ppo_async.report.metrics")
    if metrics is not None and isinstance(exc, metrics.NonFiniteError):
        return 3
    liveness = sys.modules.get("ppo_async.modes.threaded.liveness")
    if liveness is not None and isinstance(exc, liveness.StalledThread):
        return STALLED_STATUS
    return None


def _parse_and_run(argv: list[str]) -> int:
    try:
        command = parse_command(argv, join=True)
    except SystemExit as exc:  # --help: tyro printed it
        return exc.code if isinstance(exc.code, int) else 0
    from ppo_async.runtime.xla_flags import enable_compilation_cache  # imports JAX: only for a command that runs

    enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)
    return command.run()


def _joined_processes() -> bool:
    """Whether this process joined a multi-process run (jax.distributed) - without importing JAX."""
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


def _finish_processes(code: int, failure: str = "", report: bool = True) -> int:
    """The exit status of a command; in a multi-process run, leaves jax.distributed as well:
    after success with its shutdown barrier (every process has finished); after a failure
    with `os._exit` (a barrier with a failed peer would wait for it until aborted), once the
    others can know why (`distributed.leave_after_failure`: process 0 waits for them)."""
    if not _joined_processes():
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        sys.modules["jax"].distributed.shutdown()
        return code
    from ppo_async.runtime import distributed

    distributed.leave_after_failure(failure or f"exit status {code}", report=report)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_process(code: int) -> NoReturn:
    """Ends the `python -m ppo_async` process with status `code`, without the interpreter's
    teardown once nothing is left to do.

    After a run, the interpreter's finalisation (freeing every module, JAX's compiled programs
    and its CPU client) took 0.2-0.5 s on 2 cores, up to 13% of a warm 8,192-step CartPole run
    (`experiments/bench_startup.py`). Here stdout and stderr are flushed and every `atexit`
    handler runs (TensorBoard, W&B, logging, jax.distributed's shutdown, ...), as at a normal
    exit, then `os._exit` skips the finalisation; every file of the run is closed by then. Where
    a non-daemon thread still runs (the interpreter would wait for it), the exit is the usual
    `sys.exit`. Only the entry point calls it: `main()` itself returns."""
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    _flush_stdio()
    atexit._run_exitfuncs()
    _flush_stdio()
    os._exit(code)


def entry_point() -> NoReturn:
    """The `ppo-async` console script and `python -m ppo_async`: `exit_process(main())`. A
    reader that closes the pipe early (`... --help | head`) ends the output quietly, status 1
    and no traceback (the recipe of Python's `signal` documentation)."""
    try:
        code = main()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the rest of the output goes nowhere
        code = 1
    exit_process(code)


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said there
            pass


if __name__ == "__main__":
    entry_point()
