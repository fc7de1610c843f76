"""Several processes on JAX's multi-controller runtime (`jax.distributed`), for threaded mode.

The design of Podracer's Sebulba and Cleanba: every process runs the same program - its own
sampler threads on its local devices, its own ring buffer, and its share of one data-parallel
learner update over the learner devices of *all* processes (gradients all-reduced once per SGD
step by the update `placement.learner_placement` builds, so params stay identical everywhere and each process's
samplers read the latest params locally). No home-made RPC: the per-iteration bookkeeping that
process 0 writes (every process's counters, sampler columns and version records) travels
through the coordination service's key-value store, which `jax.distributed` already runs.

Pieces (pure where they can be):
- `initialize(config.distributed)`: joins the processes (once, before any JAX computation);
  with `distributed.cluster` the layout comes from the cluster (`resolve_cluster`).
- `global_learner_devices`: the learner mesh, the same local positions on every process.
- `local_value`: this process's copy of a replicated global value.
- `Exchange`: per-iteration summaries to process 0, the run-directory handshake, failures.
- `global_row`: process 0's metrics row from every process's summary (pure).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from ppo_async.config import Config, ConfigError, DistributedConfig, DistributedFailure
from ppo_async.core.lag import is_stale
from ppo_async.runtime.buffer import ChunkTag

KEY_PREFIX = "ppo_async/"
POLL_S = 0.05


def is_multi_process(config: Config) -> bool:
    return config.distributed.num_processes > 1


def resolve_cluster(d: DistributedConfig) -> DistributedConfig:
    """`d` with num_processes, process_id and coordinator_address from the cluster `d.cluster`
    names (side effect: reads the environment), as `jax.distributed.initialize()` without
    arguments detects them (`jax._src.clusters`); `d` itself with cluster 'none'.

    The process's local devices stay all of this host's (one process per host), not JAX's own
    SLURM default of one device per task. A section already resolved (the three set, e.g. the
    CLI's full parse) must agree with the cluster. ConfigError naming `distributed.cluster` when
    its environment is missing, gives one process, or disagrees.
    """
    if d.cluster == "none":
        return d
    from jax._src import clusters  # JAX's cluster detection (what initialize() without arguments uses)

    env = next((c for c in clusters.ClusterEnv._cluster_types if c.name == d.cluster), None)
    if env is None or not env.is_env_present():
        raise ConfigError(f"distributed.cluster = {d.cluster!r} is invalid here: JAX's {d.cluster} detection finds no "
                          f"{d.cluster} task environment (for slurm: SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, "
                          "SLURM_PROCID, SLURM_LOCALID; run inside srun)")
    port = os.environ.get("JAX_COORDINATOR_PORT")
    layout = (env.get_process_count(), env.get_process_id(),
              env.get_coordinator_address(timeout_secs=d.initialization_timeout_s, override_coordinator_port=port))
    if layout[0] < 2:
        raise ConfigError(f"distributed.cluster = {d.cluster!r} is invalid: the {d.cluster} job has {layout[0]} task; "
                          "leave distributed.cluster unset for one process")
    given = (d.num_processes, d.process_id, d.coordinator_address)
    if d.process_id is not None and given != layout:
        raise ConfigError(f"distributed.cluster = {d.cluster!r} gives (num_processes, process_id, coordinator_address) "
                          f"= {layout} but the section sets {given}; leave those three unset")
    return dataclasses.replace(d, num_processes=layout[0], process_id=layout[1], coordinator_address=layout[2])


def cluster_flags(d: DistributedConfig) -> list[str]:
    """The `train` options of a resolved section's layout (pure): what the CLI's full parse
    adds after joining with `distributed.cluster`."""
    return ["--distributed.num-processes", str(d.num_processes), "--distributed.process-id", str(d.process_id),
            "--distributed.coordinator-address", str(d.coordinator_address)]


def initialize(d: DistributedConfig) -> DistributedConfig:
    """Joins this process to the run's processes (`jax.distributed.initialize`; loopback or the
    given coordinator) unless already joined; nothing for one process. Returns the section as
    joined: with `distributed.cluster`, the layout the cluster gave (`resolve_cluster`).

    Must run before JAX computes anything in the process - gymnax's import already does
    (`python -m ppo_async train` joins before parsing the env name). Raises ConfigError when
    JAX already runs here with another process layout, or when joining fails. When the other
    processes do not join within `initialization_timeout_s`, the process ends (exit
    `JOIN_TIMEOUT_EXIT`) with one line saying so (`join_watchdog`): JAX would abort it.
    """
    global _JOINED
    d = resolve_cluster(d)
    if d.num_processes == 1:
        return d
    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (d.num_processes, d.process_id):
            raise ConfigError(
                f"distributed.num_processes = {d.num_processes}, process_id = {d.process_id} do not match this "
                f"process's jax.distributed ({jax.process_count()} processes, this one {jax.process_index()})"
            )
        return d
    watchdog = join_watchdog(d)
    watchdog.start()
    try:
        jax.distributed.initialize(  # JAX's own limit later than the watchdog's: it aborts (SIGABRT) at its limit
            coordinator_address=d.coordinator_address, num_processes=d.num_processes, process_id=d.process_id,
            initialization_timeout=d.initialization_timeout_s + JOIN_GRACE_S,
            heartbeat_timeout_seconds=d.heartbeat_timeout_s + HEARTBEAT_GRACE_S,
        )
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"distributed.coordinator_address = {d.coordinator_address!r}: joining {d.num_processes} processes as "
            f"process {d.process_id} failed: {exc} (from Python, call ppo_async.runtime.distributed.initialize(config.distributed) "
            "before anything imports gymnax or runs JAX)"
        ) from exc
    finally:
        watchdog.cancel()
    if jax.process_count() != d.num_processes:
        raise ConfigError(f"distributed.num_processes = {d.num_processes} but JAX sees {jax.process_count()} processes")
    _JOINED = d
    return d


JOIN_GRACE_S = 10  # JAX's join limit is this much past `initialization_timeout_s`: the watchdog speaks first
# JAX's heartbeat limit is this much past `heartbeat_timeout_s`: our watch names a dead peer (at half
# of it) and the survivors leave cleanly before JAX's service would abort them with its own fatal
# message (it may declare a peer dead sooner than its limit after the kill: the limit counts from
# the peer's last heartbeat, sent up to a heartbeat period earlier)
HEARTBEAT_GRACE_S = 10
HEARTBEAT_JOIN_S = 5.0  # stop_heartbeat waits this long at most for the thread's last beat (a client call) to return
JOIN_TIMEOUT_EXIT = 2  # the exit status of a process whose peers did not join in time (a configuration error)


def join_message(d: DistributedConfig) -> str:
    """What a process says when the others did not join within `initialization_timeout_s` (pure)."""
    waiting_for = ("the other processes" if d.process_id == 0
                   else f"process 0's coordinator at distributed.coordinator_address = {d.coordinator_address!r}")
    return (f"error: distributed.initialization_timeout_s = {d.initialization_timeout_s}: process {d.process_id} of "
            f"{d.num_processes} waited that long for {waiting_for} to join (is every process started, with the same "
            "distributed.num_processes and coordinator address, and a distinct process_id?)")


def join_watchdog(d: DistributedConfig) -> threading.Timer:
    """A timer (not started) that, `initialization_timeout_s` after it starts, writes
    `join_message(d)` to stderr and ends the process with `JOIN_TIMEOUT_EXIT`.

    `jax.distributed.initialize` does not raise when its peers never come: at its limit JAX
    aborts the process (SIGABRT and a C++ stack dump, coordinator and peers alike; measured,
    jax 0.10.2). It releases the GIL while it waits, so this timer runs and ends the process
    first with one clear line; cancel it once joined.
    """

    def give_up() -> None:
        sys.stderr.write(join_message(d) + "\n")
        sys.stderr.flush()
        os._exit(JOIN_TIMEOUT_EXIT)  # the joining thread is inside JAX's C++ and cannot be interrupted

    timer = threading.Timer(d.initialization_timeout_s, give_up)
    timer.name, timer.daemon = "ppo_async-join-watchdog", True
    return timer


class SilenceWatch:
    """Which heartbeat counters stood still for longer than `silence_s` (pure bookkeeping:
    `update` is given the counters read from the coordination service and the time)."""

    def __init__(self, silence_s: float) -> None:
        self.silence_s = silence_s
        self._seen: dict[int, tuple[str, float]] = {}  # peer -> (last counter value, when it changed)

    def update(self, beats: Mapping[int, str], now: float) -> set[int]:
        for peer, value in beats.items():
            if self._seen.get(peer, (None,))[0] != value:
                self._seen[peer] = (value, now)
        return {p for p, (_, since) in self._seen.items() if now - since > self.silence_s}


_JOINED: DistributedConfig | None = None  # the layout `initialize` joined (what `leave_after_failure` waits by)
LEAVE_GRACE_S = 0.5  # after the others have ended: time for them to exit before the coordination service goes


def leave_after_failure(message: str, report: bool = True, client: Any = None, joined: DistributedConfig | None = None) -> None:
    """Before a process of a multi-process run exits on a failure (`python -m ppo_async`'s exit).

    Every process marks itself ended and, with `report`, records `message` as its failure
    unless it reported one already (an error it only inherited from a peer is not reported).
    Process 0 then waits: it hosts JAX's coordination service, and the others learn of the
    failure through it (a peer still compiling reads it when it next waits for process 0). If
    it left at once, JAX would abort them with its own fatal message and no word of the cause.
    It waits until every other process has ended, finished or fallen silent (declared dead by
    a heartbeat watchdog, `Exchange.start_heartbeat`, or its counter still for half of
    `heartbeat_timeout_s` here), at most `initialization_timeout_s`, then `LEAVE_GRACE_S` for
    them to exit. Best effort: a service already gone ends the wait.
    """
    d = joined or _JOINED
    if d is None or d.num_processes == 1:
        return
    try:
        client = _client() if client is None else client
        prefix = KEY_PREFIX + "run/"
        reported = {int(k.rpartition("/")[2]) for k, _ in client.key_value_dir_get(prefix + "failed/")}
        if report and d.process_id not in reported:
            client.key_value_set(f"{prefix}failed/{d.process_id}", message[:2000])
        client.key_value_set(f"{prefix}ended/{d.process_id}", "1")
        if d.process_id != 0:
            return
        deadline = time.monotonic() + d.initialization_timeout_s
        watch = SilenceWatch(d.heartbeat_timeout_s / 2)
        while time.monotonic() < deadline:
            gone = {int(k.rpartition("/")[2]) for sub in ("ended/", "done/", "dead/") for k, _ in client.key_value_dir_get(prefix + sub)}
            beats = {int(k.rpartition("/")[2]): v for k, v in client.key_value_dir_get(prefix + "alive/")}
            silent = watch.update(beats, time.monotonic())
            if all(p in gone or p in silent for p in range(1, d.num_processes)):
                if any(p in gone for p in range(1, d.num_processes)):
                    time.sleep(LEAVE_GRACE_S)  # time to exit for those that ended (the silent are gone)
                return
            time.sleep(POLL_S)
    except Exception:  # noqa: BLE001 - the service is gone: nobody left to tell
        return


def global_learner_devices(local_learner: Sequence[Any], all_devices: Sequence[Any] | None = None) -> tuple[Any, ...]:
    """The learner devices of every process, process by process (pure given `all_devices`).

    Every process runs the same config, so its learner uses the same positions among its own
    devices (sorted by id) as `local_learner` does here. Process p's share of a global batch is
    then the p-th block of the mesh's data axis.
    """
    devices = list(jax.devices() if all_devices is None else all_devices)
    processes = sorted({d.process_index for d in devices})
    mine = sorted((d for d in devices if d.process_index == local_learner[0].process_index), key=lambda d: d.id)
    positions = [mine.index(d) for d in local_learner]
    out = []
    for p in processes:
        theirs = sorted((d for d in devices if d.process_index == p), key=lambda d: d.id)
        out.extend(theirs[i] for i in positions)
    return tuple(out)


def local_value(tree: Any) -> Any:
    """This process's copy of a replicated global pytree (one local device's shard per leaf):
    what its samplers read and its checkpoints hold."""
    return jax.tree.map(lambda x: x.addressable_data(0) if isinstance(x, jax.Array) and not x.is_fully_addressable else x, tree)


def local_take(tags: Sequence[ChunkTag], learner_version: int, max_lag: int | None,
               chunk_size: int) -> tuple[int, int, float]:
    """`(consumed, dropped_stale, mean lag)` of the chunks this process gave one update (pure):
    the update's own counts are global, each process accounts for its own samples. A chunk's
    samples share its `policy_version`, so a chunk is dropped whole when it is stale
    (`lag.is_stale`, as the learner's `stale_weight`)."""
    lags = [learner_version - int(tag.policy_version) for tag in tags]
    stale = sum(chunk_size for lag in lags if is_stale(lag, max_lag))
    return len(tags) * chunk_size - stale, stale, float(np.mean(lags))


# ----------------------------------------------------------------------------------------
# The coordination service's key-value store: summaries, the run-directory handshake, failures
# ----------------------------------------------------------------------------------------


def _client() -> Any:
    from jax._src import distributed as jax_distributed  # the client jax.distributed.initialize made

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized in this process")
    return client


class Exchange:
    """What the processes of one run tell each other through the coordination service.

    Keys live under `ppo_async/run/`; every wait is a blocking get in `POLL_S` slices (it
    returns as soon as the key is written) so that a stop (`should_stop()`) or a peer's failure
    ends it at once, and a dead peer is named. Summaries go through a background sender
    (`send_summary`), so the store's latency is on no process's iteration path.
    """

    def __init__(self, config: Config, client: Any = None) -> None:
        self.config = config
        self.num_processes = config.distributed.num_processes
        self.process_id = config.distributed.process_id
        self.client = _client() if client is None else client
        self.prefix = KEY_PREFIX + "run/"
        self._stopped = threading.Event()
        self._dead: list[int] = []  # peers whose heartbeat stopped (the heartbeat thread's view)
        self._outbox: list[tuple[int, dict[str, Any]]] = []  # summaries the sender has not written yet
        self._outbox_lock, self._outbox_ready = threading.Lock(), threading.Event()
        self._sender: threading.Thread | None = None
        self._heartbeat: threading.Thread | None = None
        self._closing, self._send_error = False, None
        self._inbox: dict[int, dict[int, dict[str, Any]]] = {}  # process 0: peer -> iteration -> summary read ahead

    # -- failures
    def report_failure(self, message: str) -> None:
        """Tells the other processes this one failed (best effort: the service may be gone)."""
        try:
            self.client.key_value_set(f"{self.prefix}failed/{self.process_id}", message[:2000])
        except Exception:  # noqa: BLE001
            pass

    def failures(self) -> dict[int, str]:
        """Process id -> message of every process that reported a failure."""
        try:
            entries = self.client.key_value_dir_get(f"{self.prefix}failed/")
        except Exception:  # noqa: BLE001
            return {}
        return {int(key.rpartition("/")[2]): value for key, value in entries}

    def start_heartbeat(self, on_peer_failure: Callable[[str], None] | None = None, every_s: float = 0.25) -> None:
        """A daemon thread that bumps this process's counter `alive/<id>` every `every_s` and
        watches the others': a peer whose counter stands still for half the heartbeat timeout
        (and that is not done), or that reported a failure, is passed to `on_peer_failure` once
        - well before JAX's coordination service aborts this process for it (one heartbeat
        timeout), so the run stops cleanly. (The service's own liveness query waits for every
        process, so it cannot name the dead.)"""
        watch = SilenceWatch(self.config.distributed.heartbeat_timeout_s / 2)
        # the first beat before returning: a process killed before its thread's first beat (an
        # iteration can take less than `every_s`) would otherwise have no counter to stand still,
        # and its peers would wait for JAX's abort instead of naming it
        alive_key = f"{self.prefix}alive/{self.process_id}"
        self.client.key_value_increment(alive_key, 1)

        def beat() -> None:
            told = False
            while not self._stopped.wait(every_s):
                try:
                    self.client.key_value_increment(alive_key, 1)
                    beats, done, now = self._beats(), self._done(), time.monotonic()
                except Exception:  # noqa: BLE001 - the service is gone: nothing left to tell
                    return
                failed = [p for p in self.failures() if p != self.process_id]
                dead = sorted(p for p in watch.update(beats, now) if p != self.process_id and p not in done)
                for peer in set(dead) - set(self._dead):  # for `leave_after_failure`: do not wait for it
                    try:
                        self.client.key_value_set(f"{self.prefix}dead/{peer}", "1")
                    except Exception:  # noqa: BLE001 - best effort: naming the dead peer below matters more
                        pass
                self._dead = dead
                if on_peer_failure is not None and not told and (self._dead or failed):
                    told = True
                    on_peer_failure(self.stopped_with(self.describe_failure(wait_s=0.0) or "a peer failed"))

        self._heartbeat = threading.Thread(target=beat, name="ppo_async-heartbeat", daemon=True)
        self._heartbeat.start()

    def stop_heartbeat(self, timeout_s: float = HEARTBEAT_JOIN_S) -> None:
        """Stops the heartbeat thread and waits (at most `timeout_s`) for it to end: a daemon
        thread still inside the coordination client's C++ when the interpreter finalises aborts
        the process ("terminate called ... FATAL: exception not rethrown", exit status 134 after
        a finished run, seen once on CI)."""
        self._stopped.set()
        thread, self._heartbeat = self._heartbeat, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def _beats(self) -> dict[int, str]:
        return {int(k.rpartition("/")[2]): v for k, v in self.client.key_value_dir_get(f"{self.prefix}alive/")}

    def _done(self) -> set[int]:
        return {int(k.rpartition("/")[2]) for k, _ in self.client.key_value_dir_get(f"{self.prefix}done/")}

    def mark_done(self) -> None:
        """This process finished its run (a stopped heartbeat then means done, not dead); its
        queued summaries are written first (process 0 waits for them)."""
        self.flush(self.config.threaded.timeout_s)
        try:
            self.client.key_value_set(f"{self.prefix}done/{self.process_id}", "1")
        except Exception:  # noqa: BLE001
            pass

    def describe_failure(self, wait_s: float = 2.0) -> str | None:
        """Names the other processes that failed (their message) or died (silent heartbeat),
        waiting up to `wait_s` for either; None when there is none."""
        deadline = time.monotonic() + wait_s
        while True:
            failed = {p: m for p, m in self.failures().items() if p != self.process_id}
            dead = [p for p in self._dead if p not in failed]
            if failed or dead or time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
        parts = [f"process {p} failed: {m}" for p, m in sorted(failed.items())]
        parts += [f"process {p} died (no heartbeat for {self.config.distributed.heartbeat_timeout_s / 2:.1f}s: "
                  "killed, or its machine went away)" for p in dead]
        return "; ".join(parts) or None

    def stopped_with(self, peers: str) -> str:
        """The line this process ends with when it stops because of its peers (`describe_failure`),
        whichever path found them first (the heartbeat thread, a wait on the store, a collective
        that failed: `blame` adds the error it saw)."""
        return f"{peers}; process {self.process_id} stopped with it"

    # -- the run directory
    def announce_run_dir(self, outcome: str) -> None:
        """Process 0: the run directory is ready ("ok") or could not be made (the error)."""
        self.client.key_value_set(f"{self.prefix}run_dir", outcome)

    def wait_run_dir(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Processes > 0: waits for process 0's run directory; ConfigError with its error."""
        outcome = self._get(f"{self.prefix}run_dir", self.config.distributed.initialization_timeout_s, should_stop)
        if outcome is not None and outcome != "ok":
            raise DistributedFailure(f"process 0 could not prepare the run directory: {outcome}")

    # -- the start
    def start_together(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Returns once every process is ready to start its threads (a barrier through the store:
        a process that sets up faster does not count the others' set-up as run time, and the
        first collective does not wait for it); raises naming a peer that failed or died."""
        self.client.key_value_set(f"{self.prefix}ready/{self.process_id}", "1")
        for p in range(self.num_processes):
            if p != self.process_id:
                self._get(f"{self.prefix}ready/{p}", self.config.distributed.initialization_timeout_s, should_stop)

    # -- per-iteration summaries: off every process's critical path
    # Processes > 0 hand a summary to a background sender (`send_summary` returns at once); it
    # writes every summary waiting at that moment as one key, `summary/<process>/<first
    # iteration>`, so a slow store costs one call per batch of iterations, not one each.
    # Process 0 reads a peer's batch with one blocking get (no sleep-polling: it returns when
    # the key is written) and keeps the iterations it holds for the rows to come.
    def send_summary(self, iteration: int, summary: Mapping[str, Any]) -> None:
        """Queues this process's summary of `iteration` for process 0 (never waits on the store);
        raises the sender's error if an earlier send failed."""
        if self._send_error is not None:
            raise DistributedFailure(f"sending iteration summaries to process 0 failed: {self._send_error}")
        with self._outbox_lock:
            self._outbox.append((int(iteration), dict(summary)))
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_loop, name="ppo_async-summary-sender", daemon=True)
                self._sender.start()
        self._outbox_ready.set()

    def _send_loop(self) -> None:
        while True:
            self._outbox_ready.wait()
            with self._outbox_lock:
                batch, self._outbox = self._outbox, []
                self._outbox_ready.clear()
            if batch:
                try:
                    self.client.key_value_set(f"{self.prefix}summary/{self.process_id}/{batch[0][0]:010d}", json.dumps(batch))
                except Exception as exc:  # noqa: BLE001 - raised by the next send_summary / flush
                    self._send_error = exc
                    return
            with self._outbox_lock:
                if self._closing and not self._outbox:
                    return

    def flush(self, timeout_s: float) -> None:
        """Waits (at most `timeout_s`) until every queued summary is written; ends the sender."""
        with self._outbox_lock:
            sender, self._closing = self._sender, True
        self._outbox_ready.set()
        if sender is not None:
            sender.join(timeout_s)

    def gather_summaries(self, iteration: int, own: Mapping[str, Any], timeout_s: float,
                         should_stop: Callable[[], bool]) -> list[dict[str, Any]] | None:
        """Process 0: every process's summary of `iteration`, in process order (its own first);
        None when `should_stop()` turned true while waiting."""
        out = [dict(own)]
        for p in range(1, self.num_processes):
            held = self._inbox.setdefault(p, {})
            while iteration not in held:  # the next batch of p starts at the first iteration not yet read
                key = f"{self.prefix}summary/{p}/{iteration:010d}"
                value = self._get(key, timeout_s, should_stop)
                if value is None:
                    return None
                held.update((int(i), summary) for i, summary in json.loads(value))
                self.client.key_value_delete(key)
            out.append(held.pop(iteration))
        return out

    def iteration_rows(self, row: Mapping[str, Any], records: Sequence[Mapping[str, Any]], config: Config,
                       should_stop: Callable[[], bool]) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """This process's row and version records of one iteration -> what its recorder records:
        on process 0 the global row and every process's records (`global_row`; `exchange_wait_s`:
        how long it waited for the others' summaries), elsewhere its own (queued for process 0).
        None when `should_stop()` turned true while waiting."""
        iteration = int(row["iteration"])
        summary = process_summary(row, records)
        if self.process_id != 0:
            self.send_summary(iteration, summary)
            return dict(row), [dict(r) for r in records]
        start = time.perf_counter()
        summaries = self.gather_summaries(iteration, summary, config.threaded.timeout_s, should_stop)
        if summaries is None:
            return None
        merged, all_records = global_row(row, summaries, config.effective_num_samplers, config.batch_size)
        merged["exchange_wait_s"] = time.perf_counter() - start
        return merged, all_records

    def blame(self, exc: BaseException) -> BaseException:
        """The error this process ends with: a `DistributedFailure` naming the processes that
        failed or died first when there are any (this one's error followed from theirs), else
        `exc` itself, after telling the others this process failed."""
        if isinstance(exc, DistributedFailure):  # the heartbeat thread's finding, already named
            return exc
        # a collective that failed (a peer died mid all-reduce): wait until its heartbeat is
        # known to have stopped; any other error: a moment for a peer's earlier report
        collective = any(word in str(exc) for word in ("Gloo", "Connection", "UNAVAILABLE", "collective"))
        peers = self.describe_failure(wait_s=self.config.distributed.heartbeat_timeout_s / 2 + 1.0 if collective else 0.2)
        if peers:
            first_line = (str(exc).splitlines() or [""])[0][:300]
            return DistributedFailure(f"{self.stopped_with(peers)} ({type(exc).__name__}: {first_line})")
        self.report_failure(f"{type(exc).__name__}: {exc}")
        return exc

    def _get(self, key: str, timeout_s: float, should_stop: Callable[[], bool]) -> str | None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.client.blocking_key_value_get(key, int(POLL_S * 1000))
            except Exception as exc:  # noqa: BLE001 - DEADLINE_EXCEEDED: not there yet
                if "DEADLINE" not in str(exc).upper() and "NOT_FOUND" not in str(exc).upper():
                    raise DistributedFailure(f"the coordination service failed while waiting for {key}: {exc}") from exc
            if should_stop():
                return None
            failure = self.describe_failure(wait_s=0.0)
            if failure:
                raise DistributedFailure(self.stopped_with(failure))
            if time.monotonic() >= deadline:
                raise TimeoutError(f"process {self.process_id} waited {timeout_s:.0f}s for {key} from the other processes")


# ----------------------------------------------------------------------------------------
# Process 0's metrics row from every process's summary (pure)
# ----------------------------------------------------------------------------------------

SAMPLER_COLUMNS = ("sampler_steps_per_second", "sampler_rollout_s", "sampler_wait_params_s", "sampler_wait_buffer_s",
                   "sampler_wait_space_s", "sampler_write_s", "sampler_latency_s", "sampler_forced_refreshes")
PROCESS_ACCOUNTING = ("samples_produced", "samples_dropped", "samples_resident", "dropped_forced_refresh", "dropped_overwritten")


def process_summary(row: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What one process sends process 0 for an iteration: its local accounting and sampler
    columns, the chunks it consumed (sampler, behaviour version) and its version records."""
    keep = set(PROCESS_ACCOUNTING) | set(SAMPLER_COLUMNS) | {"samples_consumed", "dropped_stale_total", "sampler_id",
                                                               "behavior_version", "buffer_fill", "lag_mean_local"}
    return {"row": {k: v for k, v in row.items() if k in keep}, "records": [dict(r) for r in records]}


def global_row(own_row: Mapping[str, Any], summaries: Sequence[Mapping[str, Any]], num_samplers: int,
               batch_size: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Process 0's row of one iteration and every process's version records (pure).

    The update's metrics (losses, KL, the lag histogram) are already global; the accounting is
    the sum over processes (`produced = consumed + dropped + resident` holds globally as it
    holds per process); sampler columns list every process's samplers (global sampler id
    `p * num_samplers + s`); `process_*` columns list one value per process.
    """
    rows = [s["row"] for s in summaries]
    row = dict(own_row)
    for name in PROCESS_ACCOUNTING + ("samples_consumed", "dropped_stale_total"):
        row[name] = int(sum(r[name] for r in rows))
        row[f"process_{name}"] = [int(r[name]) for r in rows]
    row["env_steps"] = row["samples_consumed"] + row["dropped_stale_total"]
    for name in SAMPLER_COLUMNS:
        row[name] = [v for r in rows for v in r[name]]
    as_list = lambda v: v if isinstance(v, list) else [v]  # noqa: E731
    row["sampler_id"] = [p * num_samplers + s for p, r in enumerate(rows) for s in as_list(r["sampler_id"])]
    row["behavior_version"] = [v for r in rows for v in as_list(r["behavior_version"])]
    row["process_buffer_fill"] = [r["buffer_fill"] for r in rows]
    row["process_lag_mean"] = [r["lag_mean_local"] for r in rows]
    assert sum(row["lag_histogram"]) == batch_size, (sum(row["lag_histogram"]), batch_size)
    records = [dict(rec, process_id=p, sampler_id=p * num_samplers + rec["sampler_id"])
               for p, s in enumerate(summaries) for rec in s["records"]]
    return row, records


def process_log_path(run_dir: str, process_id: int) -> str:
    return os.path.join(run_dir, "logs", f"process_{process_id}.log")


def process_line(row: Mapping[str, Any]) -> str:
    """One line of a process's log file for an iteration (its own samplers and buffer)."""
    rates = row.get("sampler_steps_per_second") or []
    return (f"iteration {row['iteration']}: produced {row['samples_produced']}, consumed {row['samples_consumed']}, "
            f"dropped {row['samples_dropped']}, resident {row['samples_resident']}, lag_mean_local "
            f"{row.get('lag_mean_local', float('nan')):.2f}, sampler env steps/s {[round(r) for r in rates]}")


def params_digest(params: Any) -> str:
    """SHA-256 of a params pytree's bytes (leaves in tree order): equal on every process of a
    multi-process run, whose replicas must stay identical (logged at the end of each)."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(jax.device_get(local_value(params))):
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()
