"""The run of a threaded config, in the calling thread: set up (fresh, or from the latest
checkpoint when resuming), start the threads, log what the learner hands over, watch for
failures, stuck or dead threads (`liveness`) and Ctrl-C, stop and join every thread, finish the
run directory; and the mode's registration."""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from typing import Callable, Sequence

from ppo_async.config import Config, ConfigError, DistributedFailure
from ppo_async.modes.registry import Mode, register_mode
from ppo_async.modes.threaded.learner import learner_loop
from ppo_async.modes.threaded.liveness import WAIT, StalledThread, WatchClock, find_stall
from ppo_async.modes.threaded.programs import (
    ThreadedSetup,
    make_threaded_setup,
    threaded_checkpoint,
    threaded_checkpoint_like,
)
from ppo_async.modes.threaded.resume import ResumePoint, check_mode_state, mode_state, resume_point
from ppo_async.modes.threaded.sampler import sampler_loop
from ppo_async.modes.threaded.shared import POLL_S, LearnerOutput, RunShared, ThreadFailure
from ppo_async.core import host_rollout
from ppo_async.report.metrics import NonFiniteError
from ppo_async.run.recorder import RunRecorder
from ppo_async.run.result import TrainResult
from ppo_async.runtime import distributed

JOIN_TIMEOUT_S = 10.0
# Learner iterations queued for the logging thread at most. A logger that falls behind makes
# the learner wait (back-pressure: learning slows to the logging rate, samplers then wait for
# buffer space or overwrite, as their full_policy says); nothing is dropped and memory stays
# bounded: a queued iteration holds its row and schedule records, and a train state only
# when a checkpoint or an evaluation is due.
LOG_QUEUE_SIZE = 16
VERSION_SCHEDULE_FILE = "version_schedule.jsonl"


@contextlib.contextmanager
def _ctrl_c_sets(event: threading.Event):
    """While active (main thread only), the first Ctrl-C sets `event` instead of raising
    KeyboardInterrupt at an arbitrary line (which could tear a metrics row); a second one
    raises as usual. Elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum, frame):
        if event.is_set() and callable(previous):
            previous(signum, frame)
        event.set()

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_threads(setup: ThreadedSetup, shared: RunShared, outputs: queue.Queue) -> list[threading.Thread]:
    """Starts every sampler thread and the learner thread (last in the list); resets the run clock."""
    placement = setup.placement
    threads = [
        threading.Thread(
            target=sampler_loop,
            name=f"ppo_async-sampler-{s}",
            args=(shared, s, setup.rollout_fn, setup.env_states[s], setup.sampler_keys[s], placement.sampler_devices[s]),
            daemon=True,
        )
        for s in range(setup.config.effective_num_samplers)
    ]
    threads.append(
        threading.Thread(
            target=learner_loop,
            name="ppo_async-learner",
            args=(shared, setup.update, setup.merge, setup.place_trajectory, setup.train_state, setup.learner_key,
                  setup.hparams, outputs, setup.start),
            daemon=True,
        )
    )
    shared.start = time.perf_counter()
    shared.restart_heartbeats(shared.start)
    for thread in threads:
        thread.start()
    return threads


def stop_threads(shared: RunShared, threads: Sequence[threading.Thread], timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Asks every thread to stop, wakes the blocked ones and joins them all within `timeout_s`."""
    shared.stop.set()
    shared.buffer.close()
    shared.store.close()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(timeout=max(deadline - time.monotonic(), 0.0))


def close_host_envs(setup: ThreadedSetup, threads: Sequence[threading.Thread]) -> None:
    """Closes the samplers' host-side simulators (Gymnasium, EnvPool); a sampler thread still running
    after the join timeout keeps its own, which the process exit closes."""
    for state, thread in zip(setup.env_states, threads):
        if isinstance(state, host_rollout.HOST_ENV_TYPES) and not thread.is_alive():
            state.close()


def check_liveness(shared: RunShared, threads: Sequence[threading.Thread], clock: WatchClock | None = None) -> None:
    """Applies the liveness rule (`liveness.find_stall`) now: a stuck or dead thread, or threads
    all waiting for each other, is recorded as the run's failure (which stops every thread).
    With `clock`, the silence of a span the watch did not see (a suspended process) is forgiven first."""
    if shared.stop.is_set():
        return
    now = time.perf_counter()
    if clock is not None:
        clock.look(shared.heartbeats(), now)
    dead = tuple(t.name.removeprefix("ppo_async-") for t in threads[:-1] if not t.is_alive())  # samplers never end
    stall = find_stall(shared.heartbeats(), now, shared.config.threaded.timeout_s, dead,
                       judged=tuple(name for name in shared.heartbeats() if name != "logger"))
    if stall is not None:
        shared.fail_stalled(*stall)


def watch(shared: RunShared, threads: Sequence[threading.Thread], outputs: queue.Queue, log: Callable) -> bool:
    """Logs learner outputs until the learner (the last thread) is done, a thread fails, stalls
    (checked every POLL_S and after each row) or Ctrl-C; True if interrupted."""
    ctrl_c, learner_thread, heartbeat = threading.Event(), threads[-1], shared.logger_heartbeat
    clock = WatchClock(shared.config.threaded.timeout_s)
    heartbeat.enter("rows", WAIT)  # the watching thread waits for the learner (it is never judged itself)
    try:
        with _ctrl_c_sets(ctrl_c):
            while (learner_thread.is_alive() or not outputs.empty()) and not ctrl_c.is_set():
                try:
                    item = outputs.get(timeout=POLL_S)
                except queue.Empty:
                    item = None
                if item is not None:
                    log(item)
                    heartbeat.beat()
                check_liveness(shared, threads, clock)
                if shared.errors:  # a failed or stuck thread or peer process: the learner may be stuck in
                    break  # a collective with that peer, so do not wait for it to end
        return ctrl_c.is_set()
    except KeyboardInterrupt:  # raised by a callback, or outside the main thread
        return True


def raise_thread_errors(shared: RunShared, threads: Sequence[threading.Thread]) -> None:
    """Re-raises the first thread failure in the caller (with its traceback); or names stuck threads."""
    stuck = describe_stuck(shared, threads)
    if shared.errors:  # the first, unless a peer process failed: that is the cause of the others
        error = next((e for e in shared.errors if isinstance(e.exc, DistributedFailure)), shared.errors[0])
        exc = error.exc
        if isinstance(exc, DistributedFailure):
            raise exc
        if isinstance(exc, StalledThread):  # the watch's verdict: its one line names the thread
            if stuck:
                exc.add_note(stuck)
            raise exc
        if isinstance(exc, (NonFiniteError, ConfigError, TimeoutError)):
            exc.add_note(f"(raised in thread ppo_async-{error.thread})")
            if stuck:
                exc.add_note(stuck)
            raise exc
        raise ThreadFailure(f"thread {error.thread} failed: {exc!r}\n--- traceback of {error.thread} ---\n{error.traceback}") from exc
    if stuck:
        raise TimeoutError(stuck)


def describe_stuck(shared: RunShared, threads: Sequence[threading.Thread]) -> str:
    """"" when every thread stopped; else a message naming each thread still alive and what it
    was doing (a sampler's phase and for how long), e.g. inside an env that never returns."""
    now = time.perf_counter()
    heartbeats = shared.heartbeats()
    parts = []
    for thread in threads:
        if not thread.is_alive():
            continue
        heartbeat = heartbeats.get(thread.name.removeprefix("ppo_async-"))
        if heartbeat is not None:
            phase = heartbeat.current
            parts.append(f"{thread.name} (in {phase.name} for {now - phase.since:.1f}s)")
        else:
            parts.append(thread.name)
    if not parts:
        return ""
    return (f"threads still running {JOIN_TIMEOUT_S:.0f}s after the stop: {', '.join(parts)}. A Python thread stuck "
            "in foreign code (an env step that never returns) cannot be killed: it stays until the process exits; "
            "the run directory was finalised with the rows recorded so far")


def run_threaded(config: Config, recorder: RunRecorder, resume: bool = False) -> TrainResult:
    """Runs the threaded mode (one seed) and returns a `TrainResult`.

    With `resume`, continues the run in `config.run_dir` from its latest checkpoint: the
    learner's whole state is restored (`resume.py`), the samplers start again from its params.

    Raises ConfigError for a bad config (num_seeds != 1, devices, resuming a multi-process
    run), ThreadFailure (or the thread's ConfigError) when a thread fails, `StalledThread` (a
    TimeoutError) when a thread is stuck or dead or the threads wait for each other
    (`liveness`), NonFiniteError when a row holds NaN/inf, and KeyboardInterrupt after a clean
    stop on Ctrl-C (rows, schedule and a final checkpoint kept: the run can be resumed). With
    several processes (`distributed.*`), `distributed.DistributedFailure` when another process
    failed or died (naming it), after this process stopped cleanly.
    """
    if config.num_seeds != 1:
        raise ConfigError(f"num_seeds = {config.num_seeds} is invalid for mode='threaded': must be 1")
    if not distributed.is_multi_process(config):
        return _run_threaded(config, recorder, None, resume)
    if resume:
        raise ConfigError("resume is not supported for a multi-process threaded run (distributed.num_processes > 1): "
                          "only its process 0 has the run directory; start a new run")
    exchange = distributed.Exchange(config)
    try:
        result = _run_threaded(config, recorder, exchange)
        exchange.mark_done()
        return result
    except BaseException as exc:  # noqa: BLE001 - named, then re-raised
        blamed = exchange.blame(exc)
        if blamed is exc:
            raise
        raise blamed from exc
    finally:
        exchange.stop_heartbeat()


def _open_recorder(recorder: RunRecorder, exchange: "distributed.Exchange | None") -> None:
    """Opens the recorder; with several processes, process 0 first (it makes the run
    directory, then tells the others), the others once it has."""
    if exchange is None:
        recorder.open()
        return
    if exchange.process_id != 0:
        exchange.wait_run_dir()
        recorder.open()
        return
    try:
        recorder.open()
    except BaseException as exc:
        exchange.announce_run_dir(f"{type(exc).__name__}: {exc}")
        raise
    exchange.announce_run_dir("ok")


def _logger(config: Config, recorder: RunRecorder, shared: RunShared,
            exchange: "distributed.Exchange | None") -> Callable[[LearnerOutput], None]:
    """What the calling thread does with each learner output: one row (every process's, on
    process 0 of a multi-process run), a checkpoint when due, the version schedule's records."""
    def log(item: LearnerOutput) -> None:
        row = {**recorder.labels[0], **item.row}  # labels (seed; config_id and grid values in a sweep) lead
        records = item.records
        if exchange is not None:  # process 0 records every process's iteration, the others their own
            merged = exchange.iteration_rows(row, records, config, should_stop=lambda: bool(shared.errors))
            if merged is None:
                return
            recorder.log_line(distributed.process_line(item.row))
            row, records = merged
        # the schedule's records first, flushed: a checkpoint of this iteration (saved by `record`)
        # then always has them on disk, so a SIGKILL between the two cannot lose them (the resume
        # cuts the schedule back to the checkpoint and makes the later ones again)
        recorder.append_schedule(VERSION_SCHEDULE_FILE, records)
        recorder.record([row], row["iteration"], state=lambda: threaded_checkpoint(item.state.train_state),
                        mode_state=lambda: mode_state(item.state, item.row))

    return log


def _finish(recorder: RunRecorder, shared: RunShared, exchange: "distributed.Exchange | None") -> None:
    """The final checkpoint, of the last logged iteration (none when the learner had handed
    over more than was logged: a failure stopped the logging); with several processes, each
    logs its params' digest (the replicas must agree)."""
    last = shared.last_put
    if last is None or last.row["iteration"] != recorder.last_iteration:
        return
    recorder.final_checkpoint(lambda: threaded_checkpoint(last.state.train_state),
                              mode_state=lambda: mode_state(last.state, last.row))
    if exchange is not None:
        recorder.log_line(f"final params sha256 {distributed.params_digest(last.state.train_state.params)} "
                          f"at iteration {recorder.last_iteration}")


def _resume_point(config: Config, recorder: RunRecorder) -> ResumePoint:
    """The latest checkpoint of `config.run_dir`, restored (metrics.jsonl and the version
    schedule cut back to its iteration: the rows after it are made again)."""
    checkpoint = recorder.resume_from(threaded_checkpoint_like(config), check=check_mode_state)
    recorder.cut_schedule(VERSION_SCHEDULE_FILE)
    return resume_point(checkpoint.train_state, recorder.resumed_meta)


def _run_threaded(config: Config, recorder: RunRecorder, exchange: "distributed.Exchange | None",
                  resume: bool = False) -> TrainResult:
    setup = make_threaded_setup(config, _resume_point(config, recorder) if resume else None)
    shared = setup.shared()
    if setup.start.control is not None:  # the KL controller's knobs, as the resumed run left them
        shared.knobs = setup.start.control.knobs
    if exchange is not None:  # a peer that dies stops this run like a failing thread (before JAX aborts it)
        exchange.start_heartbeat(lambda message: shared.fail("peer", DistributedFailure(message)))
    outputs: queue.Queue = queue.Queue(maxsize=LOG_QUEUE_SIZE)
    shared.keeps_state = recorder.wants_state
    log = _logger(config, recorder, shared, exchange)
    _open_recorder(recorder, exchange)
    with recorder:
        m = setup.memory
        recorder.announce(f"ring buffer {m['buffer_bytes'] / 2**20:.1f} MB on {m['buffer_device']}, parameter snapshot "
                          f"{m['snapshot_bytes_per_sampler'] / 2**10:.1f} KB per sampler")
        if exchange is not None:  # the run's clock starts when every process is ready
            exchange.start_together(should_stop=lambda: bool(shared.errors))
        threads = start_threads(setup, shared, outputs)
        try:
            interrupted = watch(shared, threads, outputs, log)
        finally:  # (several processes: a learner stuck in a collective with a dead peer is not waited for)
            stop_threads(shared, threads, JOIN_TIMEOUT_S if exchange is None else 1.0)
            close_host_envs(setup, threads)
        if not shared.errors:
            while not outputs.empty():  # rows finished before the stop still count
                log(outputs.get_nowait())
        _finish(recorder, shared, exchange)
    raise_thread_errors(shared, threads)
    if interrupted:
        raise KeyboardInterrupt(f"threaded run stopped cleanly after {recorder.last_iteration} learner iterations")
    final_state = shared.last_put.state.train_state if shared.last_put is not None else setup.train_state
    return recorder.result(
        threaded_checkpoint(final_state).train_state,
        setup.compile_seconds,
        extras={"version_schedule": recorder.schedule_records(VERSION_SCHEDULE_FILE), "sampler_stats": shared.stats,
                "placement": setup.placement, "log_queue_max": shared.max_queue_depth, "device_memory": setup.memory},
    )


MODE = register_mode(
    Mode(
        name="threaded",
        run=run_threaded,
        checkpoint_like=threaded_checkpoint_like,
        resumable=False,
        why_not_resumable="its lag depends on timing: a resumed run restores the learner exactly and makes the lag anew",
        resumes_learner=True,  # the learner exactly; the lag history is not replayed (`resume.py`)
    )
)
