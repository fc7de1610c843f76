"""Threaded mode: a real run with heterogeneous samplers, accounting, schedule replay, faults."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import ppo_async as pa
from ppo_async.config import ThreadedConfig
from ppo_async.modes import threaded as threaded_module

SMALL = dict(
    rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)


def small(**kw) -> pa.Config:
    threaded = kw.pop("threaded", ThreadedConfig(num_samplers=4, sampler_step_latency_ms=(0.2, 0.2, 0.2, 1.0)))
    kw.setdefault("total_env_steps", 128 * 30)
    return pa.Config(mode="threaded", threaded=threaded, **SMALL, **kw)


def sampler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ppo_async-sampler")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("threaded")
    config = small(run_dir=str(run_dir))
    return config, pa.train(config), run_dir


def test_run_completes_with_lag_metrics_and_accounting(run):
    config, result, _ = run
    rows = result.metrics
    assert [r["iteration"] for r in rows] == list(range(1, 31))
    for r in rows:
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
        assert sum(r["lag_histogram"]) == config.batch_size
        assert r["approx_kl"] is not None and r["approx_kl"] >= 0
        assert 0 <= r["sampler_id"] < 4 and len(r["sampler_steps_per_second"]) == 4
        assert r["lag_mean"] == r["learner_version"] - 1 - r["behavior_version"]
    assert rows[-1]["learner_version"] == 30
    # lag emerges from timing: with 4 samplers and a 1-chunk-per-iteration learner, some batches are stale
    assert max(r["lag_max"] for r in rows) >= 1
    assert sampler_threads() == []


def test_version_schedule_is_written_and_replays_in_simulated_mode(run):
    config, result, run_dir = run
    schedule = pa.read_schedule(run_dir / "version_schedule.jsonl")
    assert len(schedule.lag) == 30
    np.testing.assert_array_equal(schedule.lag, [r["lag_mean"] for r in result.metrics])
    np.testing.assert_array_equal(schedule.sampler_id, [r["sampler_id"] for r in result.metrics])
    replay = pa.Config(
        mode="simulated", total_env_steps=128 * 30, **SMALL,
        lag=pa.LagConfig(schedule="replay", replay_path=str(run_dir / "version_schedule.jsonl"), num_samplers=4),
    )
    sim = pa.train(replay).to_dataframe()
    np.testing.assert_array_equal(sim.sampler_id, schedule.sampler_id)
    # the replayed lag is floored at the current version during warm-up, exactly as recorded
    np.testing.assert_array_equal(sim.lag_mean.to_numpy(), schedule.lag)


def test_a_sampler_that_raises_stops_the_run_with_its_traceback(monkeypatch):
    calls = {"n": 0}

    def exploding(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 5:
            raise RuntimeError("boom in sampler")
        return False

    monkeypatch.setattr(threaded_module, "must_force_refresh", exploding)
    start = time.perf_counter()
    with pytest.raises(threaded_module.ThreadFailure, match=r"(?s)sampler-\d.*boom in sampler.*Traceback"):
        pa.train(small(total_env_steps=128 * 10_000))
    assert time.perf_counter() - start < 60  # includes compile; the stop itself takes well under 5 s
    assert sampler_threads() == []


def test_nan_from_the_env_raises_in_the_learner_and_stops_the_samplers(nan_rewards):
    with pytest.raises(pa.NonFiniteError, match="NaN"):
        pa.train(small())
    assert sampler_threads() == []


def test_threaded_config_errors_name_the_field():
    with pytest.raises(pa.ConfigError, match="threaded.sampler_step_latency_ms"):
        ThreadedConfig(num_samplers=2, sampler_step_latency_ms=(1.0,))
    with pytest.raises(pa.ConfigError, match="num_seeds"):
        pa.train(small(num_seeds=2))
