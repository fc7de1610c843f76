"""The benchmark's mode labels of 2026-12-05 (`async` = PPO's clip at lag, `async-decoupled`):
a benchmark recorded under the old ones (`async-ppo`, `async` = decoupled) is refused with the
command that relabels it, and `--relabel-modes` rewrites every place a label lives - once, even
when cut short and run again (`ppo_async.study.benchmark.relabel`)."""

from __future__ import annotations

import csv
import json
import os

import pytest

from ppo_async.config import ConfigError
from ppo_async.study import benchmark as bm
from ppo_async.study.benchmark import relabel
from ppo_async.study.benchmark.timings import write_timing

ENV = "gymnasium/Hopper-v5"
OLD_MODES = ["barrier", "async-ppo", "async"]


def old_benchmark(out, runs=None) -> str:
    """A benchmark OUT as recorded before 2026-12-05: 3 modes x 2 seeds, a final row each, a
    timings row each, run directories with done markers (RUNS: `runs` or OUT/runs)."""
    os.makedirs(out)
    plan = bm.resolve_plan("mujoco", envs=[ENV], modes=["barrier", "async", "async-decoupled"], seeds=2)
    spec = bm.plan_spec(plan)
    spec.pop("mode_labels")
    spec["modes"] = OLD_MODES  # the same configs, under the labels they had
    spec["configs"] = {f"{ENV} {old}": spec["configs"][f"{ENV} {new}"]
                       for old, new in zip(OLD_MODES, ["barrier", "async", "async-decoupled"])}
    with open(os.path.join(out, "benchmark.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f)
    rows = [{"env": ENV, "mode": m, "seed": s, "checkpoint": 1_000_000, "iteration": 488, "env_steps": 999_424,
             "eval_return": 1000.0 * (1 + i) + s, "train_return": 900.0, "episodes": 10, "wall_s": 100.0 + 10 * i,
             "train_wall_s": 90.0, "approx_kl": 0.01, "lag_mean": float(i > 0), "final": 1}
            for i, m in enumerate(OLD_MODES) for s in (0, 1)]
    bm.write_results(out, rows)
    for i, mode in enumerate(OLD_MODES):
        for seed in (0, 1):
            write_timing(out, {"env": ENV, "mode": mode, "seed": seed, "iterations": 488, "sample_s": 0.3,
                               "learn_s": 0.05, "wait_s": 0.3 if i == 0 else 0.01, "wall_s": 180.0 - 20 * i,
                               "approx_kl": 0.01, "lag_mean": float(i > 0), "lag_histogram": "[0, 2048]"})
    for mode in OLD_MODES:
        for seed in (0, 1):
            run_dir = bm.run_dir_of(out, ENV, mode, seed, runs)
            os.makedirs(run_dir)
            with open(os.path.join(run_dir, bm.DONE_FILE), "w", encoding="utf-8") as f:
                json.dump({"env": ENV, "mode": mode, "seed": seed}, f)
            with open(os.path.join(run_dir, "which.txt"), "w", encoding="utf-8") as f:
                f.write(mode)  # which run this was, to follow it through the renames
    return out


def modes_of(path: str) -> list[str]:
    with open(path, newline="", encoding="utf-8") as f:
        return [row["mode"] for row in csv.DictReader(f)]


def assert_relabelled(out: str, runs: str) -> None:
    with open(os.path.join(out, "benchmark.json"), encoding="utf-8") as f:
        spec = json.load(f)
    assert spec["modes"] == ["barrier", "async", "async-decoupled"] and spec["mode_labels"] == 2
    assert spec["configs"][f"{ENV} async"]["ppo"]["objective"] == "ppo"
    assert spec["configs"][f"{ENV} async-decoupled"]["ppo"]["objective"] == "decoupled"
    new = ["barrier", "barrier", "async", "async", "async-decoupled", "async-decoupled"]
    assert modes_of(os.path.join(out, "results.csv")) == new and modes_of(os.path.join(out, "timings.csv")) == new
    env_dir = os.path.join(runs, ENV.replace("/", "_"))
    assert sorted(os.listdir(env_dir)) == ["async", "async-decoupled", "barrier"]
    for new_label, old_label in (("async", "async-ppo"), ("async-decoupled", "async"), ("barrier", "barrier")):
        for seed in (0, 1):
            run_dir = os.path.join(env_dir, new_label, f"seed{seed}")
            with open(os.path.join(run_dir, "which.txt"), encoding="utf-8") as f:
                assert f.read() == old_label
            with open(os.path.join(run_dir, bm.DONE_FILE), encoding="utf-8") as f:
                assert json.load(f)["mode"] == new_label
    assert not os.path.exists(os.path.join(out, relabel.JOURNAL))


def test_an_old_benchmark_is_refused_with_the_command_that_relabels_it(tmp_path):
    out = old_benchmark(str(tmp_path / "old"))
    plan = bm.resolve_plan("mujoco", envs=[ENV], modes=["barrier", "async", "async-decoupled"], seeds=2)
    with pytest.raises(ConfigError, match="--relabel-modes"):
        bm.check_spec(out, bm.plan_spec(plan))
    relabel.relabel_modes(out)
    bm.check_spec(out, bm.plan_spec(plan))  # now the same benchmark: accepted
    assert bm.finished_keys(out) == {(ENV, m, s) for m in ("barrier", "async", "async-decoupled") for s in (0, 1)}


def test_relabel_rewrites_every_place_once(tmp_path):
    out, runs = str(tmp_path / "old"), str(tmp_path / "elsewhere")
    old_benchmark(out, runs)
    changed = relabel.relabel_modes(out, runs)
    assert changed == {"spec": 1, "results.csv": 4, "timings.csv": 4, "run_dirs": 2}
    assert_relabelled(out, runs)
    assert relabel.relabel_modes(out, runs) == {"spec": 0, "results.csv": 0, "timings.csv": 0, "run_dirs": 0}
    assert_relabelled(out, runs)  # a second call changes nothing (async is not turned into async-decoupled)


@pytest.mark.parametrize("cut_after", ["results.csv", "timings.csv", "hide", "one reveal"])
def test_a_relabel_cut_short_finishes_without_applying_a_label_twice(tmp_path, cut_after):
    out = old_benchmark(str(tmp_path / "old"))
    runs = os.path.join(out, "runs")
    done = ["results.csv"] if cut_after == "results.csv" else ["results.csv", "timings.csv"]
    for table in done:
        relabel._relabel_table(os.path.join(out, table), relabel.OLD_MODE_LABELS)
    if cut_after in ("hide", "one reveal"):
        relabel._hide_run_dirs(runs, relabel.OLD_MODE_LABELS)
        done.append("hide")
    if cut_after == "one reveal":  # async-ppo's directory already renamed to async, the other still hidden
        env_dir = os.path.join(runs, ENV.replace("/", "_"))
        os.rename(os.path.join(env_dir, ".relabel-async-ppo"), os.path.join(env_dir, "async"))
    with open(os.path.join(out, relabel.JOURNAL), "w", encoding="utf-8") as f:
        json.dump({"done": done}, f)
    relabel.relabel_modes(out)
    assert_relabelled(out, runs)


def test_the_cli_relabels_and_writes_the_report(tmp_path, cli_main):
    out, runs = str(tmp_path / "old"), str(tmp_path / "runs")
    old_benchmark(out, runs)
    proc = cli_main(["benchmark", "--out", out, "--runs-dir", runs, "--relabel-modes"])
    assert proc.returncode == 0, proc.stderr
    assert "relabelled 4 results rows, 4 timings rows, 2 run directories" in proc.stdout
    assert_relabelled(out, runs)
    with open(os.path.join(out, "report.md"), encoding="utf-8") as f:
        text = f.read()
    assert "| gymnasium/Hopper-v5 | async-decoupled | 2 |" in text and "async-ppo" not in text
    assert "P(async-decoupled > async) = " in text and "The default async mode is `async`" in text
    again = cli_main(["benchmark", "--out", out, "--relabel-modes"])
    assert again.returncode == 0 and "already in today's mode labels" in again.stdout
    missing = cli_main(["benchmark", "--out", str(tmp_path / "none"), "--relabel-modes"])
    assert missing.returncode == 2 and "holds no benchmark to relabel" in missing.stderr
