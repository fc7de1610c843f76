"""Helpers shared by the benchmark scripts in experiments/ (bench_sync.py, bench_threaded.py).

A leaf module: standard library only, no JAX. It holds the bookkeeping every benchmark writes
next to its figures (how loaded the machine was while it ran), the pass/miss wording of a
target, the formatting of a rate, interleaved repeats and the writing of the result files.

    load = MachineLoad(include_children=True)
    results = {"machine": load.start(), ...}  # cpu_count, loadavg_before
    samples = interleave(repeats, [("pure", pure), ("threaded", threaded)])
    results["machine"].update(load.stop())  # wall_s, loadavg_after, other_cpu_cores
    print(verdict(ratio, 0.9), fmt_rate(61_500.0))  # "met" / "MISSED by 3.2%", "61.5k"

`MachineLoad` is also the load monitor of `study.manifest`, which records it over a whole script run.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Literal, Sequence

# /proc/stat's first line, after "cpu": user nice system idle iowait irq softirq steal guest
# guest_nice (in clock ticks). Busy: user nice system irq softirq steal (guest time is already
# counted in user).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def other_cpu_seconds(include_children: bool) -> float | None:
    """CPU seconds used so far by everything on the machine except this process (Linux; else None).

    Machine-wide busy time from /proc/stat minus this process's own user + system time
    (`os.times()`). With `include_children`, the time of this process's waited-for children is
    subtracted too, so subprocesses that the benchmark starts itself count as its own, not as
    "other". Differences of two calls give the CPU time other processes took in between; the
    value itself has no meaning. Resolution: one clock tick (usually 10 ms).
    """
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy_ticks = sum(fields[i] for i in _BUSY_FIELDS if i < len(fields))
    own = os.times()
    own_seconds = own.user + own.system
    if include_children:
        own_seconds += own.children_user + own.children_system
    return busy_ticks / os.sysconf("SC_CLK_TCK") - own_seconds


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 2 decimals (as the result files store them)."""
    return [round(x, 2) for x in os.getloadavg()]


class MachineLoad:
    """How loaded the machine was during a benchmark: `start()` before measuring, `stop()` after.

    `start()` returns {"cpu_count", "loadavg_before"}; `stop()` returns {"wall_s",
    "loadavg_after", "other_cpu_cores"}, where other_cpu_cores is the CPU time of all other
    processes between the two calls divided by the wall time (the average number of cores they
    kept busy; None where /proc/stat is unavailable). The scripts store `start()`'s dict as
    results["machine"] and update it with `stop()`'s.
    """

    def __init__(self, include_children: bool) -> None:
        self.include_children = include_children
        self._other_before: float | None = None
        self._t_start: float | None = None

    def start(self) -> dict[str, Any]:
        """Starts the clock and the CPU count of the other processes; returns the fields known now."""
        self._other_before = other_cpu_seconds(self.include_children)
        self._t_start = time.perf_counter()
        return {"cpu_count": os.cpu_count(), "loadavg_before": loadavg()}

    def stop(self) -> dict[str, Any]:
        """The fields known at the end: wall_s, loadavg_after, other_cpu_cores (see the class)."""
        if self._t_start is None:
            raise RuntimeError("MachineLoad.stop() called before start()")
        wall = time.perf_counter() - self._t_start
        other_after = other_cpu_seconds(self.include_children)
        if self._other_before is None or other_after is None or wall <= 0:
            cores = None
        else:
            cores = max(other_after - self._other_before, 0.0) / wall
        return {"wall_s": wall, "loadavg_after": loadavg(), "other_cpu_cores": cores}


def describe_other_cpu(cores: float | None) -> str:
    """Report wording of `other_cpu_cores`: "1.23 cores on average" (None: "an unknown share of the CPU")."""
    return "an unknown share of the CPU" if cores is None else f"{cores:.2f} cores on average"


def verdict(value: float, target: float, at_most: bool = False) -> str:
    """"met", or "MISSED by X.X%" with the relative shortfall from the target.

    By default the target is a floor (met when value >= target; shortfall 1 - value / target);
    with `at_most` it is a ceiling (met when value <= target; excess value / target - 1).
    """
    if at_most:
        ok, how_far = value <= target, value / target - 1
    else:
        ok, how_far = value >= target, 1 - value / target
    return "met" if ok else f"MISSED by {100 * how_far:.1f}%"


def fmt_rate(x: float, style: Literal["k", "auto"] = "k") -> str:
    """A rate for a table cell.

    "k": thousands with one decimal (1234 -> "1.2k"); "auto": millions with three decimals from
    1e5 up (123456 -> "0.123M"), below that the number with thousands separators and one
    decimal (1234.5 -> "1,234.5").
    """
    if style == "k":
        return f"{x / 1e3:.1f}k"
    if style == "auto":
        return f"{x / 1e6:.3f}M" if x >= 1e5 else f"{x:,.1f}"
    raise ValueError(f"unknown style {style!r}: expected 'k' or 'auto'")


def interleave(
    repeats: int,
    sides: Sequence[tuple[str, Callable[[], Any]]],
    on_sample: Callable[[str, Any], None] | None = None,
) -> dict[str, list[Any]]:
    """Calls each side `repeats` times, alternating which goes first; returns the samples per side.

    Repeat 0 runs the sides in the given order, repeat 1 in reverse, and so on, so a drift in
    background load does not favour one side. `on_sample(name, sample)` (e.g. a progress line)
    is called after each call. The dict has the sides' names in the given order.
    """
    samples: dict[str, list[Any]] = {name: [] for name, _ in sides}
    for rep in range(repeats):
        for name, fn in sides if rep % 2 == 0 else sides[::-1]:
            samples[name].append(fn())
            if on_sample is not None:
                on_sample(name, samples[name][-1])
    return samples


def write_report(out: str, json_name: str, results: dict, text_name: str, text: str) -> None:
    """Writes `results` to OUT/JSON_NAME (indented JSON) and `text` plus a newline to OUT/TEXT_NAME."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, json_name), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(out, text_name), "w") as f:
        f.write(text + "\n")
