"""experiments/kl_controller.py: its settings (the bad start with the controller, the fixed 3 x 3
grid, one straggler at every sampler count), its KL fractions by hand, and its tiny version end
to end: every run, the tables, the figures and the manifest; finished runs skipped on a second
invocation; the summary again without training."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import ppo_async as pa
from ppo_async.study.manifest import read_manifest

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("kl_controller", os.path.join(HERE, "..", "experiments", "kl_controller.py"))
script = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = script  # dataclasses look the module up while the script's Args is built
SPEC.loader.exec_module(script)


def test_settings_are_the_bad_start_and_the_grid():
    for name, task in script.TASKS.items():
        configs = script.settings(task, 0.008)
        assert len(task.grid_samplers) >= 3 and len(task.grid_buffer_chunks) >= 3, name
        assert len(configs) == 1 + len(task.grid_samplers) * len(task.grid_buffer_chunks) + len(task.held)
        preset = script.setting_config(task, 2, 4, 1, None).ppo.learning_rate
        for samplers, max_lag, lr_scale in task.held:  # the KL held by hand, no controller
            held = configs[script.held_name(samplers, max_lag, lr_scale)]
            assert script.is_held(script.held_name(samplers, max_lag, lr_scale))
            assert (held.num_samplers, held.lag.max_lag, held.threaded.refresh_lag, held.threaded.kl_target,
                    held.threaded.full_policy) == (samplers, max_lag, 1, None, "block")
            assert held.ppo.learning_rate == pytest.approx(preset * lr_scale)
        controlled = configs["controlled"]
        assert (controlled.num_samplers, controlled.buffer_capacity_chunks, controlled.threaded.refresh_lag,
                controlled.threaded.kl_target) == (task.bad_samplers, task.bad_buffer_chunks, task.bad_refresh_lag, 0.008)
        fixed = configs[f"fixed-s{task.grid_samplers[0]}-b{task.grid_buffer_chunks[-1]}"]
        assert fixed.threaded.kl_target is None and fixed.threaded.refresh_lag == 1
        for config in configs.values():
            latency = config.threaded.sampler_step_latency_ms
            assert latency == (task.latency_ms,) * (len(latency) - 1) + (task.latency_ms * task.slow_factor,)  # one straggler
    assert [script.TASKS[name].slow_factor for name in ("pendulum", "pendulum_s8", "hopper")] == [4.0, 2.0, 4.0]
    assert [script.held_name(*h) for h in ((4, 1, 1.0), (2, None, 0.5), (6, 1, 0.5))] == [
        "fixed-s4-lag1", "fixed-s2-lr0.5", "fixed-s6-lag1-lr0.5"]
    assert not script.is_held("fixed-s2-b4") and not script.is_held("controlled")
    hopper = script.settings(script.TASKS["hopper"], 0.008)["controlled"]
    assert (hopper.env, hopper.num_samplers, hopper.threaded.sampler_step_latency_ms[0]) == ("gymnasium/Hopper-v5", 8, 5.0)
    pendulum = script.settings(script.TASKS["pendulum"], 0.008)["fixed-s6-b16"]
    assert pendulum.threaded.buffer_capacity == 16_384  # issue 42's setting
    # a task's fields reach every setting, the grid's too: the hopper task runs the decoupled objective
    assert {c.ppo.objective for c in script.settings(script.TASKS["hopper"], 0.02).values()} == {"decoupled"}
    assert {c.ppo.objective for c in script.settings(script.TASKS["pendulum"], 0.02).values()} == {"ppo"}
    assert script.task_heading("hopper", script.TASKS["hopper"], 0.02).endswith(
        "KL target 0.02, return threshold 1000, ppo.objective = decoupled")


def test_against_the_grid_hand_values():
    """Medians over seeds (a seed that never reached the return counts as infinite); a
    controlled median that never reached it is said in words, not as an infinite ratio."""
    task = script.TASKS["hopper"]
    rows = lambda controlled: pd.DataFrame({  # noqa: E731
        "setting": ["controlled"] * 3 + ["fixed-a"] * 3 + ["fixed-b"] * 3,
        "seconds_to_return": controlled + [40.0, 50.0, 60.0] + [80.0, float("inf"), 100.0]})
    assert script.against_the_grid(rows([55.0, 60.0, float("inf")]), task)[1] == (
        "controlled: 60.00 s to 1000 (median over seeds) = 1.20x the best fixed setting's (fixed-a, 50.00 s) and "
        "0.80x the median fixed setting's (75.00 s)")
    assert script.against_the_grid(rows([55.0, float("inf"), float("inf")]), task)[1] == (
        "controlled: its median seed did not reach 1000 (1 of 3 seeds did); the best fixed setting (fixed-a) took "
        "50.00 s and the median fixed setting 75.00 s (medians over seeds)")


def test_against_the_holders_hand_values():
    """The fixed settings whose seeds hold >= 80% of iterations within 1.25x (mean over seeds),
    the fastest of them against the controlled median; where none does, the closest."""
    task = script.TASKS["hopper"]
    rows = lambda within_b: pd.DataFrame({  # noqa: E731
        "setting": ["controlled"] * 2 + ["fixed-s2-b4"] * 2 + ["fixed-s4-lag1"] * 2,
        "seconds_to_return": [120.0, 140.0, 40.0, 46.0, 100.0, 118.0],
        "within_1_25_target": [0.9, 0.8, 0.5, 0.44, within_b, 0.9]})
    lines = script.against_the_grid(rows(0.7), task)
    assert lines[1].startswith("controlled: 130.00 s to 1000 (median over seeds) = 3.02x the best fixed setting's "
                               "(fixed-s2-b4, 43.00 s)")  # the grid alone: the held setting is not in it
    assert lines[2] == ("fixed settings that hold the KL (80% of iterations within 1.25x the target): fixed-s4-lag1 "
                        "(80%, 109.00 s); controlled (85%) = 1.19x the fastest of them")
    assert script.against_the_grid(rows(0.5), task)[2] == (
        "no fixed setting holds the KL (80% of iterations within 1.25x the target): the closest, fixed-s4-lag1, holds 70%")


def test_kl_fractions_hand_values():
    """10 rows: the first 2 are the warm-up; of the other 8 one measured no KL (every sample
    stale), 5 of the remaining 7 are <= 1.25 x 0.01 and 2 are <= 0.01."""
    kl = [1.0, 1.0, 0.005, 0.009, 0.0101, 0.012, 0.0124, 0.02, 0.03, 0.0]
    df = pd.DataFrame({"approx_kl": kl, "dropped_stale": [0] * 9 + [4], "lag_histogram": [[4]] * 10})
    within, under = script.kl_fractions(df, 0.01)
    assert (within, under) == pytest.approx((5 / 7, 2 / 7))


def test_the_tiny_version_end_to_end(tmp_path, monkeypatch):
    """Run as a user runs it, two runs at a time (`--jobs 2`: worker processes), then skipped
    in this process (`--jobs 1`), then summarised again."""
    out = str(tmp_path / "klc")
    done = subprocess.run([sys.executable, os.path.join(HERE, "..", "experiments", "kl_controller.py"), "--tasks", "pendulum",
                           "--quick", "--jobs", "2", "--out", out], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    args = script.Args(tasks=("pendulum",), quick=True, out=out)
    runs = pd.read_csv(os.path.join(out, "runs_pendulum.csv"))
    assert len(runs) == 6 and set(runs.seed) == {0}  # controlled, the grid's four corners, the first held setting
    assert "fixed-s2-lr0.5" in set(runs.setting)
    assert runs.within_1_25_target.between(0, 1).all() and (runs.under_target <= runs.within_1_25_target).all()
    controlled = runs[runs.setting == "controlled"].iloc[0]
    assert controlled.samplers == 6 and controlled.buffer_chunks == 64 and controlled.final_lr_scale > 0
    assert runs.wasted_fraction.between(0, 1).all()
    assert (runs[runs.setting != "controlled"].wasted_fraction == 0).all()  # no max_lag: nothing thrown away
    with open(os.path.join(out, "pendulum", "runs", "controlled", "seed0", "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    assert spec["kl_target"] == 0.008 and spec["config"]["threaded"]["kl_target"] == 0.008 and spec["config"]["seed"] == 0
    curve = pd.read_csv(os.path.join(out, "pendulum", "runs", "controlled", "seed0", "curve.csv.gz"))
    assert {"kl_staleness", "kl_update", "controller_lr_scale", "controller_reason", "kl_measured"} <= set(curve.columns)
    for name in ("summary.txt", "kl_per_iteration.png", "knobs_over_time.png", "wall_clock_grid.png"):
        assert os.path.isfile(os.path.join(out, name)), name
    text = open(os.path.join(out, "summary.txt"), encoding="utf-8").read()
    assert "| controlled |" in text and "| fixed-s6-b64 |" in text
    manifest = read_manifest(out)
    assert manifest["completed"] is True and "runs_pendulum.csv" in manifest["files_written"]

    def no_training(*_args, **_kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(pa, "train", no_training)
    script.main(args)  # every run finished: skipped
    assert read_manifest(out)["earlier"]["command"] == manifest["command"]  # the first invocation's provenance kept
    with open(os.path.join(out, "pendulum", "runs", "controlled", "seed0", "row.json"), encoding="utf-8") as f:
        assert json.load(f)["setting"] == "controlled"
    os.remove(os.path.join(out, "summary.txt"))
    script.main(script.Args(tasks=("pendulum",), quick=True, out=out, summarise_only=True))
    assert os.path.isfile(os.path.join(out, "summary.txt")) and read_manifest(out)["derived_from"]["completed"] is True
    assert np.isfinite(pd.read_csv(os.path.join(out, "runs_pendulum.csv")).consumer_steps_per_s).all()


def test_jobs_below_one_is_refused_before_any_run(tmp_path):
    with pytest.raises(SystemExit, match=r"--jobs 0: must be >= 1"):
        script.run(script.Args(tasks=("pendulum",), quick=True, jobs=0), str(tmp_path), script.tasks_of(script.Args(quick=True)))
    assert os.listdir(tmp_path) == []


def test_controlled_only_trains_no_fixed_setting(tmp_path, monkeypatch):
    trained = []
    monkeypatch.setattr(script, "run_one", lambda out, task_name, task, name, *rest: trained.append((task_name, name)))
    monkeypatch.setattr(script, "summarise", lambda *a, **k: None)
    args = script.Args(tasks=("pendulum",), quick=True, num_seeds=2, controlled_only=True, kl_target=0.02)
    script.run(args, str(tmp_path), script.tasks_of(args))
    assert trained == [("pendulum", "controlled")] * 2


def test_controlled_settings_at_other_quantiles():
    """`--kl-quantiles`: the bad start with the controller at each quantile, beside `controlled`
    (the default 0.8); the default or a repeated value is refused, naming the flag."""
    task = script.TASKS["pendulum"]
    configs = script.settings(task, 0.008, (0.5, 0.65))
    assert [n for n in configs if script.is_controlled(n)] == ["controlled", "controlled-q0.5", "controlled-q0.65"]
    assert configs["controlled"].threaded.kl_quantile is None
    for name, q in (("controlled-q0.5", 0.5), ("controlled-q0.65", 0.65)):
        c = configs[name]
        assert (c.threaded.kl_quantile, c.threaded.kl_target, c.num_samplers, c.threaded.refresh_lag) == (
            q, 0.008, task.bad_samplers, task.bad_refresh_lag)
    assert not script.is_controlled("fixed-s2-b4") and not script.is_held("controlled-q0.5")
    for bad in ((0.8,), (0.5, 0.5)):
        with pytest.raises(SystemExit, match=r"--kl-quantiles .*not 0.8"):
            script.settings(task, 0.008, bad)


def _rows(points: dict[str, tuple[list[float], list[float]]]) -> pd.DataFrame:
    """Run rows from {setting: (seconds to the return per seed, fraction within per seed)}."""
    return pd.DataFrame([{"setting": name, "seed": i, "seconds_to_return": s, "within_1_25_target": w}
                         for name, (seconds, within) in points.items() for i, (s, w) in enumerate(zip(seconds, within))])


def test_pareto_front_hand_values():
    """Medians of seconds, means of fractions: fast (1.0 s, 50%), controlled (1.5 s, 80%),
    controlled-q0.5 (1.2 s, 65%), slow-holder (4 s, 80%: as much held as controlled, slower:
    off), worse (2 s, 40%: beaten by both controlled settings), never (median seed not reached,
    90%: holds the most, so on the front)."""
    runs = _rows({"fixed-s6-b16": ([1.0, 0.9, 1.2], [0.5, 0.5, 0.5]), "controlled": ([1.4, 1.5, 1.6], [0.8, 0.8, 0.8]),
                  "controlled-q0.5": ([1.2, 1.2, 1.1], [0.6, 0.7, 0.65]), "fixed-s2-lr0.5": ([4.0, 4.0, 4.0], [0.8, 0.8, 0.8]),
                  "fixed-s4-b4": ([2.0, 2.0, 2.0], [0.4, 0.4, 0.4]), "fixed-s6-lag1": ([None, None, 3.0], [0.9, 0.9, 0.9])})
    points = script.setting_points(runs)
    assert points.seconds["controlled"] == 1.5 and points.within["controlled-q0.5"] == pytest.approx(0.65)
    assert points.seconds["fixed-s6-lag1"] == np.inf
    assert script.pareto_front(points) == ["fixed-s6-b16", "controlled-q0.5", "controlled", "fixed-s6-lag1"]
    lines = script.front_lines(runs)
    assert lines[0].endswith("fixed-s6-b16 (1.00 s, 50%), controlled-q0.5 (1.20 s, 65%), controlled (1.50 s, 80%), "
                             "fixed-s6-lag1 (median seed not reached, 90%)")
    assert lines[1] == "controlled (1.50 s, 80%) is both faster and holds more than 2 of 4 fixed settings"  # s4-b4, s2-lr0.5
    assert lines[2] == "controlled-q0.5 (1.20 s, 65%) is both faster and holds more than 1 of 4 fixed settings"
    assert script.front_lines(runs[~runs.setting.map(script.is_controlled)]) == []


def test_finished_runs_of_another_target_or_setting_are_refused_not_mixed(tmp_path, monkeypatch):
    """A finished run whose spec.json records another target (or config) refuses the invocation
    before anything trains, naming the fields; the same spec is skipped as finished; rows of
    another target refuse a summary."""
    args = script.Args(tasks=("pendulum",), quick=True, num_seeds=1, controlled_only=True, kl_target=0.008)
    tasks = script.tasks_of(args)
    config = script.settings(tasks["pendulum"], 0.008)["controlled"]
    where = script.run_dir_of(str(tmp_path), "pendulum", "controlled", 0)
    os.makedirs(where)
    with open(os.path.join(where, "spec.json"), "w", encoding="utf-8") as f:
        json.dump(script.run_spec(config, 0, 0.008), f)
    with open(os.path.join(where, "row.json"), "w", encoding="utf-8") as f:
        json.dump({"setting": "controlled", "seed": 0, "kl_target": 0.008, "seconds_to_return": 1.0,
                   "within_1_25_target": 0.8}, f)
    trained = []
    monkeypatch.setattr(pa, "train", lambda *a, **k: trained.append(a))
    monkeypatch.setattr(script, "summarise", lambda *a, **k: None)
    with pytest.raises(SystemExit, match=r"holds a finished run of another setting or target \(spec.json: "
                                         r"config.threaded.kl_target, kl_target\)"):
        script.run(dataclasses.replace(args, kl_target=0.02), str(tmp_path), tasks)
    other = dataclasses.replace(tasks["pendulum"], latency_ms=0.5)  # another task definition: its latencies differ
    with pytest.raises(SystemExit, match=r"config.threaded.sampler_step_latency_ms"):
        script.run(args, str(tmp_path), {"pendulum": other})
    script.run(args, str(tmp_path), tasks)  # the same run: skipped, nothing trained
    assert trained == []
    monkeypatch.undo()
    with pytest.raises(SystemExit, match=r"runs of pendulum measured against kl_target 0.008, not 0.02"):
        script.summarise(str(tmp_path), tasks, 0.02, "")
