"""Where the seconds before a run's first result go (side effects: reads the clock and /proc, and
listens to JAX's monitoring events while a run starts).

    clock = StartupClock()             # at the start of `train()`: starts listening
    ...                                # the mode makes the env, traces, lowers, compiles, runs
    clock.writers_opened(seconds)      # the recorder opened the run's writers
    clock.first_result()               # the first iteration's rows are recorded: stops listening
    clock.breakdown()                  # STARTUP_FIELDS -> seconds (and counts)

JAX reports each trace, lowering and XLA compile (or load from the persistent cache) as a
monitoring event with its duration (`jax.monitoring`); the clock sums them between `train()`
and the first result. The host's own work is split at the end of the last XLA compile: before
it is set-up (env creation, building the programs, running their init), after it the first
iteration. The events are process-wide: another run compiling in the same process at the same
time is counted too, and a threaded run compiles in several threads at once, so its parts may
add up to more than the wall time (`setup_s` is then 0).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from ppo_async.runtime.program_cache import PROGRAM_CACHE_EVENT  # a traced program read from the program cache

STARTUP_FILE = "startup.json"
"""RUN_DIR/startup.json: the breakdown of the run's start (written at its first result)."""

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # an XLA compile or a persistent-cache load
CACHE_LOAD_EVENT = "/jax/compilation_cache/cache_retrieval_time_sec"  # recorded for cache hits only
_PHASE_OF = {TRACE_EVENT: "tracing_s", LOWER_EVENT: "lowering_s", COMPILE_EVENT: "compile_s"}

STARTUP_FIELDS = {
    "before_train_s": "process start to train(): the interpreter, imports and command-line parsing "
                      "(in a notebook, or a later run of one process: since the process started)",
    "setup_s": "host work before the last XLA compile: checks, the run directory, env creation (its "
               "library's import included), the network, building the programs and running their init",
    "tracing_s": "tracing jitted functions to jaxprs (summed over JAX's events)",
    "lowering_s": "lowering jaxprs to MLIR",
    "compile_s": "XLA compiles, or loads from the persistent compilation cache (cache_load_s of it)",
    "cache_load_s": "of compile_s, the loads from the persistent compilation cache",
    "writers_s": "opening the run's writers (run directory, metrics, TensorBoard, W&B)",
    "first_iteration_s": "from the last XLA compile to the first iteration's rows: running it and "
                         "recording them (less opening the writers)",
    "train_to_first_result_s": "train() to the first iteration's rows",
    "first_result_s": "process start to the first iteration's rows (before_train_s + train_to_first_result_s)",
    "traces": "jitted functions traced", "compiles": "XLA programs compiled or loaded",
    "cache_hits": "programs loaded from the persistent compilation cache",
    "program_cache_hits": "traced programs read from ppo_async's program cache (their tracing and lowering skipped)",
}
"""The fields of `StartupClock.breakdown()` (seconds unless a count), in the order printed."""


def process_age() -> float | None:
    """Seconds since this process started: /proc/uptime minus the start time in /proc/self/stat
    (Linux; to the kernel's clock tick, 10 ms), None where they cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        start_ticks = int(stat.rpartition(")")[2].split()[19])  # field 22; the split starts at field 3
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupClock:
    """The start of one run, from `train()` to its first result (module docstring). Listens to
    JAX's monitoring events from construction until `first_result()` or `stop()`."""

    def __init__(self) -> None:
        self.started = time.time()  # wall clock, as JAX's event time spans
        self.before_train = process_age()
        self._lock = threading.Lock()
        self._sums = {"tracing_s": 0.0, "lowering_s": 0.0, "compile_s": 0.0, "cache_load_s": 0.0}
        self._counts = {"traces": 0, "compiles": 0, "cache_hits": 0, "program_cache_hits": 0}
        self._last_compile_end: float | None = None  # wall time the last XLA compile (or cache load) ended
        self.writers_s = 0.0
        self._writers_at: float | None = None  # wall time the writers were opened
        self.first_result_at: float | None = None
        self._listening = False
        self._listen()

    # ------------------------------------------------------------------ JAX's events

    def _listen(self) -> None:
        import jax.monitoring as monitoring

        monitoring.register_event_time_span_listener(self._on_span)
        monitoring.register_event_duration_secs_listener(self._on_duration)
        self._listening = True

    def stop(self) -> None:
        """Stops listening (idempotent); the breakdown keeps what was counted."""
        if not self._listening:
            return
        import jax.monitoring as monitoring

        self._listening = False
        for unregister, callback in ((monitoring.unregister_event_time_span_listener, self._on_span),
                                     (monitoring.unregister_event_duration_listener, self._on_duration)):
            try:
                unregister(callback)
            except (AssertionError, ValueError):  # already gone (a listener list cleared by someone else)
                pass

    def _on_span(self, event: str, start: float, end: float, **kwargs: Any) -> None:
        phase = _PHASE_OF.get(event)
        if phase is None or not self._listening:
            return
        with self._lock:
            self._sums[phase] += end - start
            if event == TRACE_EVENT:
                self._counts["traces"] += 1
            elif event == COMPILE_EVENT:
                self._counts["compiles"] += 1
                self._last_compile_end = max(end, self._last_compile_end or end)

    def _on_duration(self, event: str, duration: float, **kwargs: Any) -> None:
        if event == CACHE_LOAD_EVENT and self._listening:
            with self._lock:
                self._sums["cache_load_s"] += duration
                self._counts["cache_hits"] += 1
        elif event == PROGRAM_CACHE_EVENT and self._listening:
            with self._lock:
                self._counts["program_cache_hits"] += 1

    # ------------------------------------------------------------------ the run's side

    def writers_opened(self, seconds: float) -> None:
        """The recorder took `seconds`, until now, to open the run's writers."""
        self.writers_s += seconds
        self._writers_at = time.time()

    def first_result(self) -> None:
        """The first iteration's rows are recorded: the end of the start (later calls do nothing)."""
        if self.first_result_at is None:
            self.first_result_at = time.time()
            self.stop()

    def breakdown(self) -> dict[str, float | int | None]:
        """`STARTUP_FIELDS` -> value, so far (up to now when there is no first result yet);
        `before_train_s` and `first_result_s` are None where the process's age is unknown."""
        end = self.first_result_at if self.first_result_at is not None else time.time()
        with self._lock:
            sums, counts, compiled = dict(self._sums), dict(self._counts), self._last_compile_end
        total = end - self.started
        compiled = self.started if compiled is None else min(compiled, end)
        writers_after = self.writers_s if self._writers_at is not None and self._writers_at >= compiled else 0.0
        first_iteration = max(0.0, end - compiled - writers_after)
        jax_s = sums["tracing_s"] + sums["lowering_s"] + sums["compile_s"]
        out: dict[str, float | int | None] = {
            "before_train_s": self.before_train,
            "setup_s": max(0.0, total - jax_s - self.writers_s - first_iteration), **sums,
            "writers_s": self.writers_s, "first_iteration_s": first_iteration, "train_to_first_result_s": total,
            "first_result_s": None if self.before_train is None else self.before_train + total, **counts,
        }
        return {name: out[name] for name in STARTUP_FIELDS}


def describe(breakdown: dict[str, Any]) -> str:
    """One line: `first result after 9.1s: before train() 2.3s, setup 0.8s, tracing 1.2s, ...`."""
    def seconds(name: str) -> str:
        value = breakdown.get(name)
        return "?" if value is None else f"{value:.1f}s"

    parts = [f"before train() {seconds('before_train_s')}", f"set-up (env, programs) {seconds('setup_s')}",
             f"tracing {seconds('tracing_s')}", f"lowering {seconds('lowering_s')}",
             f"XLA compile {seconds('compile_s')} ({breakdown.get('compiles', 0)} programs, "
             f"{breakdown.get('cache_hits', 0)} from the cache; "
             f"{breakdown.get('program_cache_hits', 0)} traced programs from the program cache)",
             f"writers {seconds('writers_s')}", f"first iteration {seconds('first_iteration_s')}"]
    return f"first result after {seconds('first_result_s')}: " + ", ".join(parts)
