"""Tests of ppo_async.study.benchmarking: the helpers of the benchmark scripts in experiments/."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from ppo_async.study import benchmarking
from ppo_async.study.benchmarking import (
    MachineLoad,
    describe_other_cpu,
    fmt_rate,
    interleave,
    other_cpu_seconds,
    verdict,
    write_report,
)

ON_LINUX = os.path.exists("/proc/stat")


# ----------------------------------------------------------------------------------------
# formatting and wording
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, expected",
    [(1234.0, "1.2k"), (61_500.0, "61.5k"), (0.0, "0.0k"), (999.0, "1.0k"), (1_234_567.0, "1234.6k")],
)
def test_fmt_rate_thousands(x, expected):
    assert fmt_rate(x) == expected
    assert fmt_rate(x, "k") == expected


@pytest.mark.parametrize(
    "x, expected",
    [
        (1234.5, "1,234.5"),
        (12.0, "12.0"),
        (99_999.94, "99,999.9"),
        (100_000.0, "0.100M"),
        (123_456.0, "0.123M"),
        (2_500_000.0, "2.500M"),
    ],
)
def test_fmt_rate_auto(x, expected):
    assert fmt_rate(x, "auto") == expected


def test_fmt_rate_rejects_unknown_style():
    with pytest.raises(ValueError, match="unknown style"):
        fmt_rate(1.0, "M")  # type: ignore[arg-type]


def test_verdict_floor():
    assert verdict(0.95, 0.9) == "met"
    assert verdict(0.9, 0.9) == "met"
    assert verdict(0.81, 0.9) == "MISSED by 10.0%"
    assert verdict(1.0, 2.0) == "MISSED by 50.0%"
    assert verdict(0.0, 1.1) == "MISSED by 100.0%"


def test_verdict_ceiling():
    assert verdict(0.2, 1 / 3, at_most=True) == "met"
    assert verdict(1 / 3, 1 / 3, at_most=True) == "met"
    assert verdict(0.5, 0.25, at_most=True) == "MISSED by 100.0%"
    assert verdict(0.4, 1 / 3, at_most=True) == "MISSED by 20.0%"
    # the same value judged against a floor is met
    assert verdict(0.4, 1 / 3) == "met"


def test_describe_other_cpu():
    assert describe_other_cpu(None) == "an unknown share of the CPU"
    assert describe_other_cpu(1.234) == "1.23 cores on average"
    assert describe_other_cpu(0.0) == "0.00 cores on average"


# ----------------------------------------------------------------------------------------
# interleaved repeats, result files
# ----------------------------------------------------------------------------------------


def test_interleave_alternates_order_and_collects_samples():
    calls: list[str] = []
    counter = {"a": 0, "b": 0}

    def side(name):
        def fn():
            calls.append(name)
            counter[name] += 1
            return f"{name}{counter[name]}"

        return fn

    seen: list[tuple[str, str]] = []
    samples = interleave(3, [("a", side("a")), ("b", side("b"))], on_sample=lambda n, s: seen.append((n, s)))
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert samples == {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"]}
    assert list(samples) == ["a", "b"]  # the sides' order, whatever ran first
    assert seen == [("a", "a1"), ("b", "b1"), ("b", "b2"), ("a", "a2"), ("a", "a3"), ("b", "b3")]


def test_interleave_zero_repeats():
    assert interleave(0, [("x", lambda: 1), ("y", lambda: 2)]) == {"x": [], "y": []}


def test_write_report(tmp_path):
    out = tmp_path / "nested" / "out"
    results = {"backend": "cpu", "machine": {"cpu_count": 2}, "rows": [1.5, 2]}
    write_report(str(out), "cpu.json", results, "report.txt", "line 1\nline 2")
    assert json.loads((out / "cpu.json").read_text()) == results
    assert (out / "cpu.json").read_text() == json.dumps(results, indent=2)
    assert (out / "report.txt").read_text() == "line 1\nline 2\n"


# ----------------------------------------------------------------------------------------
# CPU time of other processes, machine load
# ----------------------------------------------------------------------------------------


def busy_child(seconds: float) -> None:
    """Runs a child process that spins until it has used `seconds` of CPU time (however loaded
    the cores are), and waits for it."""
    code = f"import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass\n"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_other_cpu_seconds_value():
    for include_children in (False, True):
        value = other_cpu_seconds(include_children)
        if not ON_LINUX:
            assert value is None
            continue
        assert isinstance(value, float)
        assert value >= 0.0
        assert math.isfinite(value)


@pytest.mark.skipif(not ON_LINUX, reason="needs /proc/stat")
def test_other_cpu_seconds_children():
    busy_child(0.3)
    children = os.times().children_user + os.times().children_system
    assert children > 0.05  # the busy child's CPU time is now in os.times()
    without, with_children = other_cpu_seconds(False), other_cpu_seconds(True)
    # include_children subtracts exactly the waited-for children's time (up to the ticks between the two reads)
    assert without - with_children == pytest.approx(children, abs=0.05)


@pytest.mark.skipif(not ON_LINUX, reason="needs /proc/stat")
def test_other_cpu_seconds_counts_a_child_as_other():
    before = other_cpu_seconds(False)
    busy_child(0.3)
    after = other_cpu_seconds(False)
    # the child spun ~0.3 s of CPU: without include_children it is another process's time
    assert after - before >= 0.15


def test_machine_load_fields_after_sleep():
    load = MachineLoad(include_children=False)
    start = load.start()
    assert set(start) == {"cpu_count", "loadavg_before"}
    assert start["cpu_count"] == os.cpu_count()
    assert len(start["loadavg_before"]) == 3
    assert all(isinstance(x, float) and x >= 0 and round(x, 2) == x for x in start["loadavg_before"])
    time.sleep(0.05)
    stop = load.stop()
    assert list(stop) == ["wall_s", "loadavg_after", "other_cpu_cores"]
    assert 0.05 <= stop["wall_s"] < 30
    assert len(stop["loadavg_after"]) == 3
    assert all(isinstance(x, float) and x >= 0 and round(x, 2) == x for x in stop["loadavg_after"])
    if ON_LINUX:
        cores = stop["other_cpu_cores"]
        assert isinstance(cores, float)
        assert 0.0 <= cores <= 2 * (os.cpu_count() or 1) + 1  # at most every core, with tick slack
    else:
        assert stop["other_cpu_cores"] is None


@pytest.mark.skipif(not ON_LINUX, reason="needs /proc/stat")
def test_machine_load_busy_child_counts_only_without_children():
    without, with_children = MachineLoad(include_children=False), MachineLoad(include_children=True)
    without.start()
    with_children.start()
    busy_child(0.3)
    a, b = without.stop(), with_children.stop()
    # the same interval: the child's ~0.3 s CPU is "other" only for include_children=False
    assert a["other_cpu_cores"] * a["wall_s"] - b["other_cpu_cores"] * b["wall_s"] >= 0.15
    assert a["other_cpu_cores"] * a["wall_s"] >= 0.15


def test_machine_load_arithmetic(monkeypatch):
    readings = iter([100.0, 103.0])  # other processes took 3 CPU seconds between start and stop
    monkeypatch.setattr(benchmarking, "other_cpu_seconds", lambda include_children: next(readings))
    load = MachineLoad(include_children=True)
    load.start()
    time.sleep(0.02)
    stop = load.stop()
    assert stop["wall_s"] >= 0.02
    assert stop["other_cpu_cores"] == pytest.approx(3.0 / stop["wall_s"])


def test_machine_load_negative_difference_clamps_to_zero(monkeypatch):
    readings = iter([100.0, 99.99])  # tick rounding can make the difference slightly negative
    monkeypatch.setattr(benchmarking, "other_cpu_seconds", lambda include_children: next(readings))
    load = MachineLoad(include_children=False)
    load.start()
    assert load.stop()["other_cpu_cores"] == 0.0


def test_machine_load_without_proc_stat(monkeypatch):
    monkeypatch.setattr(benchmarking, "other_cpu_seconds", lambda include_children: None)
    load = MachineLoad(include_children=False)
    load.start()
    stop = load.stop()
    assert stop["other_cpu_cores"] is None
    assert stop["wall_s"] >= 0


def test_machine_load_stop_before_start():
    with pytest.raises(RuntimeError, match="before start"):
        MachineLoad(include_children=False).stop()
