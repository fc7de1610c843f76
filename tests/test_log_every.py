"""`log_every` (issue: runs of any length): rows aggregate the iterations between them, checked
against `log_every = 1` on the same seed; the aggregation rules by hand."""

from __future__ import annotations


import numpy as np
import pytest

import ppo_async as pa
from ppo_async.report.aggregate import aggregate_rows
from ppo_async.report.metrics import read_jsonl

TINY = dict(env="Pendulum-v1", total_env_steps=64 * 10, rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
            ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2), network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)))


def test_aggregation_rules_by_hand():
    rows = [
        {"seed": 3, "iteration": 1, "env_steps": 64, "approx_kl": 0.01, "approx_kl_max": 0.02, "lag_histogram": [60, 4],
         "kl_per_lag": [0.01, 0.03], "episode_return": -900.0, "episodes_finished": 1.0, "steps_per_second": 100.0,
         "samples_consumed": 64, "eval_return": None, "warning": "", "dropped_stale": 0, "ratio_std": None},
        {"seed": 3, "iteration": 2, "env_steps": 128, "approx_kl": 0.03, "approx_kl_max": 0.05, "lag_histogram": [0, 64],
         "kl_per_lag": [None, 0.06], "episode_return": None, "episodes_finished": 0.0, "steps_per_second": 300.0,
         "samples_consumed": 128, "eval_return": -500.0, "warning": "", "dropped_stale": 4, "ratio_std": 0.5},
        {"seed": 3, "iteration": 3, "env_steps": 192, "approx_kl": 0.05, "approx_kl_max": 0.04, "lag_histogram": [32, 32],
         "kl_per_lag": [0.04, 0.09], "episode_return": -600.0, "episodes_finished": 3.0, "steps_per_second": 300.0,
         "samples_consumed": 192, "eval_return": None, "warning": "dropped", "dropped_stale": 1, "ratio_std": 0.7},
    ]
    out = aggregate_rows(rows)
    assert (out["seed"], out["iteration"], out["env_steps"], out["samples_consumed"]) == (3, 3, 192, 192)  # last
    assert out["approx_kl"] == pytest.approx(0.03) and out["approx_kl_max"] == 0.05  # mean, max
    assert out["ratio_std"] == pytest.approx(0.6)  # None left out of the mean
    assert out["lag_histogram"] == [92, 100] and out["dropped_stale"] == 5  # sums
    # per lag bucket, weighted by its samples: bucket 0 (0.01*60 + 0.04*32) / 92; bucket 1 (0.03*4 + 0.06*64 + 0.09*32) / 100
    assert out["kl_per_lag"] == pytest.approx([(0.6 + 1.28) / 92, (0.12 + 3.84 + 2.88) / 100])
    assert out["episode_return"] == pytest.approx((-900.0 * 1 + -600.0 * 3) / 4) and out["episodes_finished"] == 4.0
    assert out["steps_per_second"] == pytest.approx(3 / (1 / 100 + 1 / 300 + 1 / 300))  # total steps / total time
    assert out["eval_return"] == -500.0 and out["warning"] == "dropped" and out["logged_iterations"] == 3
    assert aggregate_rows(rows[:1])["approx_kl"] == 0.01
    with pytest.raises(ValueError):
        aggregate_rows([])


@pytest.fixture(scope="module")
def every_iteration(tmp_path_factory):
    """A log_every = 1 run with a run directory (its rows come back from metrics.jsonl)."""
    run_dir = tmp_path_factory.mktemp("one") / "r"
    return pa.train(pa.Config(seed=5, run_dir=str(run_dir), **TINY)), run_dir


def test_log_every_rows_aggregate_the_log_every_one_rows(tmp_path, every_iteration):
    every = every_iteration[0].metrics
    config = pa.Config(seed=5, log_every=4, run_dir=str(tmp_path / "four"), **TINY)
    result = pa.train(config)
    rows = result.metrics
    # windows end at iterations 4, 8 and the last (10); the file holds the same rows
    assert [r["iteration"] for r in rows] == [4, 8, 10] and [r["logged_iterations"] for r in rows] == [4, 4, 2]
    assert read_jsonl(tmp_path / "four" / "metrics.jsonl") == rows
    for row, window in zip(rows, (every[0:4], every[4:8], every[8:10])):
        expected = aggregate_rows(window)
        for name in ("env_steps", "samples_consumed", "learner_version", "approx_kl", "approx_kl_max", "policy_loss",
                     "lag_histogram", "episode_return", "kl_per_lag", "entropy", "grad_norm"):
            if isinstance(expected[name], list):
                np.testing.assert_allclose(row[name], expected[name], rtol=1e-6)
            elif expected[name] is None:
                assert row[name] is None
            else:
                assert row[name] == pytest.approx(expected[name], rel=1e-6), name
    assert rows[-1]["samples_produced"] == rows[-1]["samples_consumed"] + rows[-1]["samples_dropped"]
    assert len(result.to_dataframe()) == 3


def test_the_checkpoint_cadence_must_be_a_multiple_of_log_every():
    """In whole learner iterations of the default batch of 1,024: 6,144 steps are 6 (refused
    with log_every = 4), 8,192 are 8 and 7,900 round to 8."""
    with pytest.raises(pa.ConfigError, match=r"checkpoint_every_steps = 6144 .*every 6 learner iterations .*multiple of log_every = 4"):
        pa.Config(log_every=4, checkpoint_every_steps=6144, run_dir="r")
    with pytest.raises(pa.ConfigError, match=r"log_every = 0"):
        pa.Config(log_every=0)
    assert pa.Config(log_every=4, checkpoint_every_steps=8192, run_dir="r").checkpoint_every_iterations == 8
    assert pa.Config(log_every=4, checkpoint_every_steps=7900, run_dir="r").checkpoint_every_iterations == 8


def test_metrics_log_round_trips_rows_compactly():
    from ppo_async.report.metrics import MetricsLog

    rows = [{"iteration": 1, "approx_kl": 0.5, "lag_histogram": [1, 2], "warning": "", "episode_return": None},
            {"iteration": 2, "approx_kl": None, "lag_histogram": [3], "warning": "[not a list]", "eval_return": -7.0},
            {"iteration": 3, "approx_kl": 1.5, "lag_histogram": [4, 5], "episode_return": "odd"}]
    log = MetricsLog(rows)
    assert log == rows and list(log) == rows and len(log) == 3 and log[-1] == rows[-1] and log[:2] == rows[:2]
    assert isinstance(log[0]["iteration"], int) and log[1]["warning"] == "[not a list]" and "eval_return" not in log[0]
    with pytest.raises(IndexError):
        log[3]


def test_a_run_with_a_run_dir_holds_no_rows_and_reads_them_back(every_iteration):
    from ppo_async.report.metrics import MetricsLog

    result, run_dir = every_iteration
    assert isinstance(result.metrics, MetricsLog) and "metrics.jsonl" in repr(result.metrics)
    assert len(result.metrics) == 10 and result.metrics == read_jsonl(run_dir / "metrics.jsonl")
    in_memory = pa.train(pa.Config(seed=5, **TINY)).metrics
    assert [r["iteration"] for r in in_memory] == list(range(1, 11))
    for a, b in zip(in_memory, result.metrics):  # the same rows but the clock
        assert {k: v for k, v in a.items() if k not in ("wall_time", "steps_per_second")} == \
               {k: v for k, v in b.items() if k not in ("wall_time", "steps_per_second")}


def test_a_fold_row_by_row_is_aggregate_rows():
    """`RowFold` (what the plots bin with) folds one row at a time to `aggregate_rows`'s row;
    a per-lag field missing from a row takes that row's weights out, not another row's."""
    from ppo_async.report.aggregate import RowFold

    rows = [{"iteration": 1, "approx_kl": 0.01, "kl_per_lag": [0.1, 0.2], "lag_histogram": [1, 3], "x": "a"},
            {"iteration": 2, "approx_kl": None, "lag_histogram": [5, 5], "x": True},
            {"iteration": 3, "approx_kl": 0.03, "kl_per_lag": [0.3, None], "lag_histogram": [3, 0], "y": [1, None]}]
    fold = RowFold()
    for row in rows:
        fold.add(row)
    assert fold.row() == aggregate_rows(rows) == aggregate_rows(iter(rows))
    out = fold.row()
    assert out["kl_per_lag"] == pytest.approx([(0.1 * 1 + 0.3 * 3) / 4, 0.2]) and out["lag_histogram"] == [9, 8]
    assert out["approx_kl"] == pytest.approx(0.02) and out["x"] is None and out["y"] == [1.0, None]
    with pytest.raises(ValueError, match="at least one row"):
        RowFold().row()


def test_a_run_dirs_metrics_are_streamed_not_kept(tmp_path):
    """`TrainResult.metrics` of a run with a run directory keeps no row: iterating parses the
    file each time, indexing loads it into compact columns (integers stay integers), and
    `final_returns` (what the `train` command prints at the end) reads two columns only."""
    from ppo_async.report.metrics import JsonlWriter, MetricsLog
    from ppo_async.run.result import TrainResult

    rows = [{"seed": s, "iteration": i, "episode_return": None if i == 2 else -float(10 * i + s), "n": i if i < 3 else 2.5,
             "lag_histogram": [i, 0]} for i in range(1, 5) for s in (0, 1)]
    with JsonlWriter(tmp_path / "metrics.jsonl") as w:
        for row in rows:
            w.write(row)
    log = MetricsLog.from_file(tmp_path / "metrics.jsonl")
    assert list(log) == rows and list(log) == rows and len(log) == 8
    assert list(log.rows(["seed", "n"])) == [{"seed": r["seed"], "n": r["n"]} for r in rows]
    assert not log._columns  # iterating held nothing
    assert log[-1] == rows[-1] and log[2:4] == rows[2:4] and isinstance(log[0]["n"], int) and log[7]["n"] == 2.5
    result = TrainResult(config=None, train_state=None, metrics=MetricsLog.from_file(tmp_path / "metrics.jsonl"),
                         compile_seconds=0.0, run_seconds=0.0)
    assert list(result.to_dataframe(columns=("seed", "episode_return")).columns) == ["seed", "episode_return"]
    np.testing.assert_allclose(result.final_returns(0.5), [-35.0, -36.0])  # iterations 3-4 per seed
    assert not result.metrics._columns
    in_memory = TrainResult(config=None, train_state=None, metrics=MetricsLog(rows), compile_seconds=0.0, run_seconds=0.0)
    np.testing.assert_allclose(in_memory.final_returns(0.5), [-35.0, -36.0])
    assert in_memory.to_dataframe().equals(result.to_dataframe())
