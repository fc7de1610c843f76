"""`python -m ppo_async launch --num-processes N [--port PORT] -- train [TRAIN OPTIONS]`: one
threaded run as N local processes (`ppo_async.runtime.launch`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Sequence

import tyro

from ppo_async.cli.train import parse_train_args
from ppo_async.errors import ConfigError
from ppo_async.runtime import launch


def split_launch(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(launch's own options, the train options after `-- train`); `["--help"]` as the own
    options when help is asked for. ConfigError without `-- train`, or with an option launch
    sets among the train options."""
    parts = launch.split_launch_args(args)
    return (["--help"], []) if parts is None else parts


@dataclasses.dataclass(frozen=True)
class LaunchCommand:
    """One threaded training run as N processes on this machine (jax.distributed over loopback):
    launch --num-processes N [--port PORT] -- train [TRAIN OPTIONS], with the options of train
    but the distributed layout (set here). Process 0 writes the run directory, every process
    RUN_DIR/logs/process_<i>.log; output lines are prefixed with [i], process 0 speaks for the run,
    and the processes' connection and end lines fold into one line each. The exit status is the
    first non-zero one of any process (0 when every process succeeds)."""

    num_processes: Annotated[int, tyro.conf.arg(metavar="N")]
    """Processes to start (>= 2)."""
    port: Annotated[int | None, tyro.conf.arg(metavar="PORT", help_behavior_hint="(default: a free one)")] = None
    """Coordinator port on 127.0.0.1."""
    train_args: tyro.conf.Suppress[tuple[str, ...]] = ()
    """The train options (after `-- train`)."""

    def __post_init__(self) -> None:
        if self.num_processes < 2:
            raise ConfigError(f"--num-processes = {self.num_processes} is invalid: must be an integer >= 2")
        if self.port is not None and self.port < 1:
            raise ConfigError(f"--port = {self.port} is invalid: must be an integer >= 1")

    def run(self) -> int:
        """Checks the train options as process 0 would parse them (a bad value stops here,
        before any process starts), then runs the processes."""
        train_args = list(self.train_args)
        address = f"127.0.0.1:{self.port or 1}"
        parsed = parse_train_args(launch.process_args(train_args, self.num_processes, 0, address)[1:])
        if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in train_args):
            train_args += ["--run-dir", parsed.cfg.run_dir]  # one directory for every process
        return launch.launch(train_args, self.num_processes, self.port,
                             heartbeat_s=parsed.cfg.distributed.heartbeat_timeout_s)
