"""The tuning recipe (`ppo_async.study.tune`, `python -m ppo_async tune`): its rules on hand-made
measurements, the measurements of a run, and one small end-to-end tune that resumes."""

from __future__ import annotations

import importlib
import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

import ppo_async as pa
from ppo_async.report.analysis import run_measurements
from ppo_async.cli import main, parse_train_args
from ppo_async.config import ConfigError, ThreadedConfig
from ppo_async.study.tune import best_under_target, buffer_lengths, knee_of, markdown_table, start_config


def rows(rates, kls):
    return [{"num_samplers": n, "consumer_steps_per_s": r, "approx_kl_mean": k}
            for n, (r, k) in enumerate(zip(rates, kls), start=1)]


def test_knee_rule_on_hand_made_measurements():
    # linear to 3 samplers (+1000 each), then +300 (< half of 1000): the knee is 3
    knee, passes = knee_of(rows([1000, 2000, 3000, 3300, 3400], [0.01] * 5), 0.02)
    assert (knee, passes) == (3, [True, True, True, False, False])
    # exactly half the linear gain passes; KL at the target fails (it must be under)
    knee, passes = knee_of(rows([1000, 1500, 2000], [0.01, 0.01, 0.02]), 0.02)
    assert (knee, passes) == (2, [True, True, False])
    # the run of passes must be unbroken: a later pass after a failure does not move the knee
    assert knee_of(rows([1000, 1200, 2500], [0.01] * 3), 0.02) == (1, [True, False, True])
    # even one sampler over the target: the knee is 1 (reported, nothing smaller exists)
    assert knee_of(rows([1000, 2000], [0.05, 0.05]), 0.02) == (1, [False, False])


def test_buffer_lengths_and_best_under_target():
    assert buffer_lengths(16) == [16, 8, 4, 2, 1]
    assert buffer_lengths(6) == [6, 3, 1]
    assert buffer_lengths(1) == [1]
    table = [{"approx_kl_mean": 0.03, "score": 9.0}, {"approx_kl_mean": 0.01, "score": 2.0},
             {"approx_kl_mean": 0.015, "score": 5.0}, {"approx_kl_mean": 0.001, "score": 5.0}]
    assert best_under_target(table, 0.02, "score") == (2, True)  # the best under the target; ties: the first
    assert best_under_target(table, 0.005, "score") == (3, True)
    assert best_under_target(table[:1] + [{"approx_kl_mean": math.nan, "score": 1.0}], 0.02, "score") == (0, False)


def test_run_measurements_by_hand():
    df = pd.DataFrame({
        "iteration": [1, 2, 3, 4, 5],
        "env_steps": [100, 200, 300, 400, 500],
        "wall_time": [10.0, 11.0, 12.0, 13.0, 15.0],  # the first row holds the compile
        "approx_kl": [0.5, 0.01, 0.02, 0.03, None],
        "lag_mean": [0.0, 1.0, 2.0, 3.0, 4.0],
        "lag_max": [0, 2, 3, 5, 4],
        "samples_consumed": [100, 200, 300, 400, 500],
        "samples_dropped": [0, 0, 0, 0, 500],
        "episode_return": [None, -5.0, None, -3.0, -1.0],
        "lag_histogram": [[100, 0], [50, 50], [0, 100], [100, 0], [0, 100]],
        "dropped_stale": [0, 0, 0, 0, 100],  # row 5: everything stale, nothing consumed: no KL measured
    })
    m = run_measurements(df, warmup_fraction=0.2, last_fraction=0.4)
    # from the end of row 2 (the warm-up's 20%) to the end of row 5: 300 steps in 4 s
    assert m["consumer_steps_per_s"] == pytest.approx(300 / 4.0)
    assert m["approx_kl_mean"] == pytest.approx(0.02)  # rows 2..4 (row 5 measured nothing)
    df.loc[4, "approx_kl"] = 0.0  # what the update reports for a batch dropped whole
    assert run_measurements(df)["approx_kl_mean"] == pytest.approx(0.02)
    assert np.isnan(pa.analysis.measured_kl(df)[4]) and pa.analysis.measured_kl(df)[1] == 0.01
    assert m["lag_mean"] == pytest.approx(2.5) and m["lag_max"] == 5
    assert m["dropped_fraction"] == pytest.approx(0.5)
    assert m["final_return"] == pytest.approx(-2.0)  # the last 2 rows
    assert m["iterations"] == 5
    with pytest.raises(ValueError, match="warmup_fraction"):
        run_measurements(df, warmup_fraction=1.0)


def test_markdown_table():
    text = markdown_table([{"a": 1, "b": 12345.6}, {"a": "x", "b": 0.012345}], ("a", "b"))
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | 12,346 |", "| x | 0.01235 |"]


def test_start_config_and_bad_inputs():
    config, filled = start_config({"rollout": {"num_envs": 8}})
    assert config.mode == "threaded" and config.num_samplers == 4
    assert config.threaded.buffer_capacity == 16 * 8 * 64
    assert filled == {"num_samplers": 4, "threaded.buffer_capacity": 16 * 8 * 64}
    config, filled = start_config({"num_samplers": 2}, env="CartPole-v1")
    assert (config.env, config.num_samplers) == ("CartPole-v1", 2) and "num_samplers" not in filled
    with pytest.warns(FutureWarning, match=r"threaded.num_samplers = 3 is deprecated"):  # a file in the old spelling
        config, filled = start_config({"threaded": {"num_samplers": 3}})
    assert config.num_samplers == 3 and "num_samplers" not in filled
    with pytest.raises(ConfigError, match="mode = 'sync' is invalid for tune"):
        start_config({"mode": "sync"})
    threaded = pa.Config(mode="threaded")
    with pytest.raises(ConfigError, match="mode = 'sync' is invalid for tune"):
        pa.tune(pa.Config(), progress=False)
    with pytest.raises(ConfigError, match="threaded.barrier = True is invalid for tune"):
        pa.tune(threaded.replace(threaded=ThreadedConfig(barrier=True)), progress=False)
    with pytest.raises(ConfigError, match="kl_target = -1 is invalid"):
        pa.tune(threaded, kl_target=-1, progress=False)
    with pytest.raises(ConfigError, match="budget_per_run = 100 is invalid"):
        pa.tune(threaded, budget_per_run=100, progress=False)
    assert main(["tune", "--kl-target", "abc"]) == 2


def small_config():
    return pa.Config(
        mode="threaded", total_env_steps=128 * 10, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
        ppo=pa.PPOConfig(num_epochs=2, num_minibatches=2),
        num_samplers=2, threaded=ThreadedConfig(buffer_capacity=4 * 128),
    )


def test_tune_end_to_end_writes_everything_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "tune"
    options = dict(kl_target=1.0, out=out, max_samplers=2, batch_factors=(("rollout.num_envs", 2),),
                   replay_grid={"ppo.clip_eps": [0.1, 0.3]}, replay_seeds=1, progress=False)
    result = pa.tune(small_config(), **options)
    first, second, third, fourth = result.steps
    # step 1: KL under a target of 1.0 at once: the starting setting is kept
    assert [r["buffer_chunks"] for r in first.rows] == [4]
    assert first.choice == {"num_samplers": 2, "threaded.buffer_capacity": 512}
    # step 2: 1..max_samplers measured, the knee follows the rule
    assert [r["num_samplers"] for r in second.rows] == [1, 2]
    assert result.knee == knee_of(second.rows, 1.0)[0]
    assert second.choice["num_samplers"] == result.knee
    # step 3: the knee and one bigger batch; step 4: the two replayed clip values
    assert len(third.rows) == 2 and third.rows[1]["rollout.num_envs"] == 16
    assert [r["ppo.clip_eps"] for r in fourth.rows] == [0.1, 0.3] and set(fourth.choice) == {"ppo.clip_eps"}
    assert result.config.num_samplers == result.knee and result.config.run_dir is None
    for name in ("report.md", "knee.png", "kl_vs_buffer.png", "chosen_config.json", "measurements.jsonl", "tune.json"):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert all(f"## Step {k}" in report for k in (1, 2, 3, 4)) and "Choice:" in report
    lines = [json.loads(line) for line in (out / "measurements.jsonl").read_text().splitlines()]
    # (2, 4 chunks) once though steps 1 and 2 both use it; step 4: 2 replayed + 1 threaded check
    assert len(lines) == 1 + 1 + 1 + 2 + 1
    checked = [r for r in fourth.rows if "threaded_kl" in r]
    assert len(checked) == 1 and checked[0]["ppo.clip_eps"] == fourth.choice["ppo.clip_eps"]
    # the chosen config is a file `train --config` accepts, as it is
    parsed = parse_train_args(["--config", str(out / "chosen_config.json"), "--run-dir", str(tmp_path / "run")])
    assert parsed.cfg.replace(run_dir=None) == result.config
    # resumed on the same directory: nothing runs again, the same choice comes out
    tune_module = importlib.import_module("ppo_async.study.tune")  # (ppo_async.study.tune is the function)
    monkeypatch.setattr(tune_module, "train", lambda *a, **k: pytest.fail("a finished run ran again"))
    monkeypatch.setattr(tune_module, "sweep", lambda *a, **k: pytest.fail("the finished replay ran again"))
    again = pa.tune(small_config(), **options)
    assert again.config == result.config and again.knee == result.knee
    with pytest.raises(ConfigError, match="holds a tune of another config"):
        pa.tune(small_config().replace(seed=1), **options)


# ------------------------------------------------------------------ ties and the ETA (issue 40 item 9)

def _replayed(returns):
    """Step-4 rows over clip x epochs x minibatches (the sweep's order), all under the KL target."""
    grid = {"ppo.clip_eps": [0.1, 0.2, 0.3], "ppo.num_epochs": [2, 5, 10], "ppo.num_minibatches": [8, 16]}
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    return grid, [{**p, "final_return_mean": r, "approx_kl_mean": 0.01} for p, r in zip(points, returns)]


class _FakeTuner:
    """What step 4's choice reads of a tuner; its threaded checks all pass the KL target."""

    def __init__(self):
        self.base, self.kl_target, self.checked = pa.Config(), 0.02, []

    def measure(self, step, changes):
        self.checked.append(dict(changes))
        return {"approx_kl_mean": 0.01, "final_return": -1.0}


def test_tied_replayed_settings_go_to_the_cheaper_one_and_say_so():
    tune_module = importlib.import_module("ppo_async.study.tune")  # (ppo_async.study.tune is the function)
    grid, rows = _replayed([-500.0] * 18)  # a small budget: every setting scores the same
    tuner = _FakeTuner()
    choice, why = tune_module._verified_choice(tuner, {}, rows, grid)
    # the fewest SGD steps per iteration (2 epochs x 8 minibatches), then the clip nearest the start (0.2)
    assert choice == {"ppo.clip_eps": 0.2, "ppo.num_epochs": 2, "ppo.num_minibatches": 8}
    assert "18 settings tied at replayed final return -500" in why and "fewer SGD steps" in why
    # no episode ended anywhere (NaN returns): still a tie, broken the same way
    grid, rows = _replayed([math.nan] * 18)
    choice, why = tune_module._verified_choice(_FakeTuner(), {}, rows, grid)
    assert choice["ppo.num_epochs"] == 2 and "18 settings tied at replayed final return none measured" in why
    # a clear best is kept, with no word about ties
    grid, rows = _replayed([-500.0] * 17 + [-100.0])
    choice, why = tune_module._verified_choice(_FakeTuner(), {}, rows, grid)
    assert choice == {"ppo.clip_eps": 0.3, "ppo.num_epochs": 10, "ppo.num_minibatches": 16} and "tied" not in why


def test_threaded_ties_go_to_fewer_samplers_then_a_shorter_buffer():
    from ppo_async.study.tune_rules import THREADED_TIE_RULE, best_under_target, threaded_cost

    cost = threaded_cost(4, 16 * 1024, 16, 64)
    table = [{"num_samplers": 4, "threaded.buffer_capacity": 8192, "approx_kl_mean": 0.01, "rate": 900.0},
             {"num_samplers": 2, "threaded.buffer_capacity": 8192, "approx_kl_mean": 0.01, "rate": 900.0},
             {"num_samplers": 2, "threaded.buffer_capacity": 2048, "approx_kl_mean": 0.01, "rate": 900.0},
             {"num_samplers": 1, "threaded.buffer_capacity": 1024, "approx_kl_mean": 0.05, "rate": 950.0}]
    assert best_under_target(table, 0.02, "rate", cost) == (2, True)
    assert best_under_target(table, 0.001, "rate", cost) == (2, False)  # none under: the lowest KL, then the cheaper
    assert "fewer samplers" in THREADED_TIE_RULE


def test_the_eta_is_measured_and_names_the_replay_sweep():
    from ppo_async.study.tune_rules import progress_line

    # 5 runs measured, 50 s in all, the slowest 20 s; 12 may remain: at most 240 s, and the sweep still to run
    line = progress_line(2, 5, 17, 80.4, 50.0, 5, slowest_s=20.0, sweep_settings=36)
    assert line == ("tune: step 2/4, run 5 of at most 17, 80s elapsed, ETA at most 240s + step 4's replay sweep "
                    "(36 settings, timed as it runs)")
    assert progress_line(4, 16, 17, 300.0, 150.0, 15, slowest_s=20.0).endswith("ETA at most 20s")


def test_tuner_progress_names_the_sweep_until_it_ran(monkeypatch):
    tune_module = importlib.import_module("ppo_async.study.tune")
    tuner = tune_module._Tuner(small_config(), 0.02, 128 * 10, seeds=1, out=None, progress=False)
    tuner.plan(max_samplers=2, batch_factors=1, sweep_settings=12)
    tuner.measured, tuner.run_seconds, tuner.slowest, tuner.runs = 2, 10.0, 7.0, 2
    assert "ETA at most" in tuner.progress_line() and "replay sweep (12 settings" in tuner.progress_line()
    tuner.sweep_settings = 0
    assert "replay sweep" not in tuner.progress_line()
