"""Threaded mode: a real run with heterogeneous samplers, accounting, schedule replay, faults."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.config import ThreadedConfig
from ppo_async.modes import threaded as threaded_module

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SMALL = dict(
    rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)


def small(**kw) -> pa.Config:
    if "threaded" not in kw:
        kw.update(num_samplers=4, threaded=ThreadedConfig(sampler_step_latency_ms=(0.2, 0.2, 0.2, 1.0)))
    kw.setdefault("total_env_steps", 128 * 30)
    return pa.Config(mode="threaded", **SMALL, **kw)


def sampler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ppo_async-sampler")]


def learner_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ppo_async-learner")]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("threaded")
    config = small(run_dir=str(run_dir), plots=True)
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
    # block: a put's time splits into waiting for space, for the lock, and the own write
    last = rows[-1]
    for total, space, write in zip(last["sampler_wait_buffer_s"], last["sampler_wait_space_s"], last["sampler_write_s"]):
        assert 0.0 < write and space + write <= total + 1e-9
    assert max(last["sampler_wait_space_s"]) > 0.0  # four samplers outpace a one-chunk learner
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
        num_samplers=4, lag=pa.LagConfig(schedule="replay", replay_path=str(run_dir / "version_schedule.jsonl")),
    )
    sim = pa.train(replay).to_dataframe()
    np.testing.assert_array_equal(sim.sampler_id, schedule.sampler_id)
    # the replayed lag is floored at the current version during warm-up, exactly as recorded
    np.testing.assert_array_equal(sim.lag_mean.to_numpy(), schedule.lag)


def test_run_dir_has_tensorboard_plots_and_a_loadable_checkpoint(run):
    config, result, run_dir = run
    assert any(p.name.startswith("events.out.tfevents") for p in (run_dir / "tb").iterdir())
    # (no Pendulum episode ends within this short run, so there is no learning curve)
    for png in ("kl_over_time", "lag_histogram", "kl_per_lag", "throughput", "sampler_time"):
        assert (run_dir / f"{png}.png").stat().st_size > 0, png
    policy = pa.load(run_dir)
    assert policy.iteration == 30
    final = result.train_state
    np.testing.assert_array_equal(
        np.asarray(policy.obs_stats.mean), np.asarray(final.obs_stats.mean)[0]
    )
    for a, b in zip(jax.tree.leaves(policy.params), jax.tree.leaves(final.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[0])
    returns = pa.evaluate(policy, num_episodes=2)["returns"]
    assert returns.shape == (2,) and np.isfinite(returns).all()


def _exploding_after(n: int, message: str, raised_at: list, real=None):
    """Calls `real` (or returns False) n times, then raises."""
    calls = {"n": 0}

    def exploding(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > n:
            raised_at.append(time.perf_counter())
            raise RuntimeError(message)
        return False if real is None else real(*args, **kwargs)

    return exploding


def test_a_sampler_that_raises_stops_the_run_with_its_traceback_within_5s(monkeypatch, time_bound):
    """An error in a sampler thread reaches the caller within seconds (5 s on idle cores)."""
    raised_at: list = []
    monkeypatch.setattr(threaded_module.sampler, "must_force_refresh", _exploding_after(5, "boom in sampler", raised_at))
    with pytest.raises(threaded_module.ThreadFailure, match=r"(?s)sampler-\d.*boom in sampler.*Traceback"):
        pa.train(small(total_env_steps=128 * 10_000))
    assert time.perf_counter() - raised_at[0] < time_bound(5.0)
    assert sampler_threads() == [] and learner_threads() == []


def test_a_learner_that_raises_stops_the_run_with_its_traceback_within_5s(monkeypatch, time_bound):
    """An error in the learner thread reaches the caller within seconds (5 s on idle cores)."""
    raised_at: list = []
    monkeypatch.setattr(threaded_module.learner, "schedule_record",
                        _exploding_after(3, "boom in learner", raised_at, real=threaded_module.learner.schedule_record))
    with pytest.raises(threaded_module.ThreadFailure, match=r"(?s)thread learner.*boom in learner.*Traceback.*in iteration"):
        pa.train(small(total_env_steps=128 * 10_000))
    assert time.perf_counter() - raised_at[0] < time_bound(5.0)
    assert sampler_threads() == [] and learner_threads() == []


def test_barrier_batches_hold_one_fresh_rollout_from_every_sampler():
    config = small(
        total_env_steps=3 * 128 * 6,
        num_samplers=3, threaded=ThreadedConfig(barrier=True, sampler_step_latency_ms=(0.2, 0.2, 1.0)),
    )
    rows = pa.train(config).metrics
    assert len(rows) == 6
    for r in rows:
        assert sorted(r["sampler_id"]) == [0, 1, 2]
        assert r["lag_max"] == 0 and r["behavior_version"] == [r["learner_version"] - 1] * 3
        assert sum(r["lag_histogram"]) == 3 * 128 == config.batch_size
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
    # the fast samplers wait for params each version while the straggler sleeps
    last = rows[-1]
    assert min(last["sampler_wait_params_s"][:2]) > last["sampler_wait_params_s"][2]


def test_max_lag_forces_refreshes_and_filters_stale_samples():
    config = small(
        total_env_steps=128 * 20,
        lag=pa.LagConfig(max_lag=0),
        num_samplers=4, threaded=ThreadedConfig(buffer_capacity=8 * 128, full_policy="overwrite_oldest"),
    )
    rows = pa.train(config).metrics
    last = rows[-1]
    assert last["dropped_forced_refresh"] > 0  # four samplers, one learner: most rollouts are stale
    for r in rows:
        # lag histogram buckets: [lag 0, lag 1, >= 2]; everything above max_lag = 0 was dropped
        assert r["dropped_stale"] == sum(r["lag_histogram"][1:])
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
    assert last["samples_dropped"] == (
        last["dropped_forced_refresh"] + last["dropped_overwritten"] + last["dropped_stale_total"]
    )
    # overwrite_oldest never waits for space; a put's time is the lock queue plus the own write
    assert last["sampler_wait_space_s"] == [0.0] * 4
    for total, write in zip(last["sampler_wait_buffer_s"], last["sampler_write_s"]):
        assert 0.0 < write <= total


def test_ctrl_c_stops_every_thread_and_keeps_what_was_done(tmp_path, time_bound):
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppo_async", "train", "--mode", "threaded", "--quiet", "--run-dir", str(run_dir),
         "--total-env-steps", "10000000", "--num-samplers", "3",
         "--threaded.sampler-step-latency-ms", "0.5", "0.5", "2"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=time_bound(30))  # a hang guard
    assert time.monotonic() - sent < time_bound(10)  # Ctrl-C stops the run promptly, not after a timeout
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    rows = pa.read_jsonl(metrics)
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) >= 3
    schedule = (run_dir / "version_schedule.jsonl").read_text().splitlines()
    assert len(schedule) == len(rows)
    assert pa.load(run_dir).iteration == len(rows)  # a final checkpoint of the last iteration


def test_nan_from_the_env_raises_in_the_learner_and_stops_the_samplers(nan_rewards):
    with pytest.raises(pa.NonFiniteError, match="NaN"):
        pa.train(small())
    assert sampler_threads() == []


def test_threaded_config_errors_name_the_field():
    with pytest.raises(pa.ConfigError, match=r"threaded.sampler_step_latency_ms = \(1.0,\) .*num_samplers = 2"):
        small(num_samplers=2, threaded=ThreadedConfig(sampler_step_latency_ms=(1.0,)))
    with pytest.raises(pa.ConfigError, match="num_seeds"):
        pa.train(small(num_seeds=2))
