"""`python -m ppo_async launch --num-processes N -- train ...`: N local processes of one run.

Starts N `python -m ppo_async train` processes on this machine with the `distributed.*` flags
filled in (coordinator on 127.0.0.1 at a free port, the same run directory for all), streams
their output line by line with a `[i]` prefix, and returns the first non-zero exit status
(0 when all succeed). Process 0 speaks for the run (its start line, progress, run directory);
the processes' Gloo connection lines fold into one `launch: N processes connected` line and
the other processes' end lines (`peer_done_line`) into one summary when all are done
(`OutputFolder`). When one process fails, the others get `heartbeat + 10 s` to stop on
their own (they name the failed process) and are then killed, so nothing hangs. On several
hosts the same `train` command runs on each with the `--distributed.*` flags (docs/how-to/distributed.md#on-several-hosts-slurm).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Sequence

from ppo_async.config import ConfigError, DistributedFailure

GRACE_S = 10.0  # after a failure: the others' heartbeat timeout plus this, then they are killed


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_args(train_args: Sequence[str], num_processes: int, process_id: int, address: str) -> list[str]:
    """The `train` command line of process `process_id` (pure)."""
    return ["train", *train_args, "--distributed.num-processes", str(num_processes),
            "--distributed.process-id", str(process_id), "--distributed.coordinator-address", address]


def exit_status(code: int) -> int:
    """A child's return code as a shell exit status (killed by signal S -> 128 + S)."""
    return 128 - code if code < 0 else code


def first_failure(finished: Sequence[tuple[float, int, int]]) -> tuple[int, int] | None:
    """`(process, return code)` of the earliest non-zero exit among `(time, process, code)`,
    leaving out the processes that stopped because another failed (`DistributedFailure`'s
    status 4) unless all did: process 0 outlives the others on purpose after a failure
    (`distributed.leave_after_failure`), so the first to exit is often not the cause."""
    failed = sorted((t, p, c) for t, p, c in finished if c != 0)
    own = [f for f in failed if f[2] != DistributedFailure.exit_status] or failed
    return (own[0][1], own[0][2]) if own else None


GLOO_CONNECTED = re.compile(r"\[Gloo\] Rank (\d+) is connected to (\d+) peer ranks")
"""The line each process's Gloo backend prints once it has joined its peers."""
PEER_DONE = re.compile(r"^process (\d+) done: (.*)$")
"""The end line of a process other than 0 (`peer_done_line`)."""


def peer_done_line(process: int, summary: str) -> str:
    """The end line of process `process` (not 0) of a run: `process 1 done: <summary>` (pure)."""
    return f"process {process} done: {summary}"


def gloo_rank(line: str) -> int | None:
    """The rank a Gloo 'is connected' line is about (None for any other line) (pure)."""
    match = GLOO_CONNECTED.search(line)
    return int(match.group(1)) if match else None


def peer_done(line: str) -> tuple[int, str] | None:
    """`(process, summary)` of a `peer_done_line` (None for any other line) (pure)."""
    match = PEER_DONE.match(line.rstrip("\n"))
    return (int(match.group(1)), match.group(2)) if match else None


def done_summary(num_processes: int, peers: dict[int, str], statuses: Sequence[int]) -> str:
    """The one line for the end of a successful run: every process's exit status and the other
    processes' own end lines (pure)."""
    line = f"launch: {num_processes} processes done (exit status {', '.join(map(str, statuses))})"
    return line + "".join(f"; process {p}: {peers[p]}" for p in sorted(peers))


class OutputFolder:
    """The processes' output as one run's: lines pass with a `[i] ` prefix, except Gloo's
    connection lines (one `launch: N processes connected (Gloo)` once every rank has) and the
    end lines of processes other than 0 (held for `summary`). Thread-safe (one lock)."""

    def __init__(self, num_processes: int, out: IO[str]) -> None:
        self.num_processes, self.out = num_processes, out
        self.lock = threading.Lock()
        self.connected: set[int] = set()
        self.peers: dict[int, str] = {}

    def write(self, text: str) -> None:
        with self.lock:
            self.out.write(text)
            self.out.flush()

    def line(self, process: int, line: str) -> None:
        """One line of process `process`'s output."""
        rank = gloo_rank(line)
        if rank is not None:
            with self.lock:
                self.connected.add(rank)
                if len(self.connected) != self.num_processes:
                    return
            self.write(f"launch: {self.num_processes} processes connected (Gloo)\n")
            return
        done = peer_done(line) if process != 0 else None
        if done is not None:
            with self.lock:
                self.peers[done[0]] = done[1]
            return
        self.write(f"[{process}] {line}" if line.endswith("\n") else f"[{process}] {line}\n")

    def summary(self, statuses: Sequence[int]) -> None:
        """The end: on success one summary line; otherwise the held end lines as they came."""
        if all(code == 0 for code in statuses):
            self.write(done_summary(self.num_processes, self.peers, statuses) + "\n")
            return
        for process in sorted(self.peers):
            self.write(f"[{process}] {peer_done_line(process, self.peers[process])}\n")


def _stream(process: int, pipe: IO[str], folder: OutputFolder) -> None:
    for line in pipe:
        folder.line(process, line)


def launch(train_args: Sequence[str], num_processes: int, port: int | None = None, heartbeat_s: float = 10.0,
           out: IO[str] | None = None) -> int:
    """Runs `train TRAIN_ARGS` as `num_processes` local processes; returns the exit status."""
    out = sys.stdout if out is None else out
    address = f"127.0.0.1:{port or free_port()}"
    folder = OutputFolder(num_processes, out)
    procs, streams = [], []
    for i in range(num_processes):
        proc = subprocess.Popen([sys.executable, "-m", "ppo_async", *process_args(train_args, num_processes, i, address)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        procs.append(proc)
        streams.append(threading.Thread(target=_stream, args=(i, proc.stdout, folder), daemon=True))
        streams[-1].start()
    finished: list[tuple[float, int, int]] = []
    deadline = None
    try:
        while len(finished) < num_processes:
            for i, proc in enumerate(procs):
                if proc.poll() is not None and i not in {p for _, p, _ in finished}:
                    finished.append((time.monotonic(), i, proc.returncode))
                    if proc.returncode != 0 and deadline is None:
                        deadline = time.monotonic() + heartbeat_s + GRACE_S
            if deadline is not None and time.monotonic() > deadline:
                for i, proc in enumerate(procs):
                    if proc.poll() is None:
                        folder.write(f"launch: process {i} still running {heartbeat_s + GRACE_S:.0f}s after a failure: killed\n")
                        proc.kill()
                deadline = float("inf")
            time.sleep(0.05)
    except KeyboardInterrupt:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in procs:
            try:
                proc.wait(timeout=heartbeat_s + GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
        return 130
    for thread in streams:
        thread.join(timeout=5)
    statuses = [exit_status(c) for _, _, c in sorted(finished, key=lambda f: f[1])]
    folder.summary(statuses)
    failure = first_failure(finished)
    if failure is None:
        return 0
    process, code = failure
    folder.write(f"launch: process {process} failed first (exit status {exit_status(code)}); exit statuses {statuses}\n")
    return exit_status(code)


def split_launch_args(argv: Sequence[str]) -> tuple[list[str], list[str]] | None:
    """`(launch options, train options)` of `launch ... -- train ...`; None for --help.
    Raises ConfigError without `-- train`, or with an option launch sets among the train options."""
    args = list(argv)
    if "--" not in args:
        if any(a in ("-h", "--help") for a in args):
            return None
        raise ConfigError("launch needs `-- train [TRAIN OPTIONS]` after its own options")
    split = args.index("--")
    own, rest = args[:split], args[split + 1:]
    if any(a in ("-h", "--help") for a in own):
        return None
    if not rest or rest[0] != "train":
        raise ConfigError(f"launch runs `train`: expected `-- train ...`, got {' '.join(rest) or 'nothing'} after --")
    own_flags = [f"--distributed.{name}" for name in ("num-processes", "process-id", "coordinator-address")]
    taken = [a for a in rest[1:] if a.split("=")[0] in own_flags + ["--distributed.cluster"]]
    if taken:
        raise ConfigError(f"launch sets {', '.join(own_flags)} of each process itself; leave out {taken[0]}")
    return own, rest[1:]


