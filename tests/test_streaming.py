"""Threaded runs keep nothing only in memory (issue: runs of any length): the version schedule
is appended as batches are consumed (a SIGKILL keeps its prefix, which replays), and the
logging queue is bounded when the logger is slow."""

from __future__ import annotations

import time

import pytest

import ppo_async as pa
from ppo_async.core.lag import read_schedule
from ppo_async.report.metrics import read_jsonl
from ppo_async.modes import threaded as threaded_module

from conftest import sigkill_train_when

SMALL = dict(env="Pendulum-v1", rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
             ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2), network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)))


def test_sigkilled_threaded_run_keeps_its_schedule_and_the_prefix_replays(tmp_path):
    iterations = 400
    run_dir = tmp_path / "killed"
    args = ["train", "--mode", "threaded", "--env", "Pendulum-v1",
            "--rollout.num-envs", "4", "--rollout.num-steps", "16", "--ppo.num-minibatches", "2", "--ppo.num-epochs", "1",
            "--network.actor-hidden", "16", "--network.critic-hidden", "16", "--num-samplers", "2",
            "--total-env-steps", str(iterations * 64), "--run-dir", str(run_dir), "--quiet"]
    schedule = run_dir / "version_schedule.jsonl"
    sigkill_train_when(args, lambda: schedule.is_file() and len(schedule.read_text().splitlines()) >= 10)
    records = read_jsonl(schedule)  # a torn last line is ignored
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert 10 <= len(records) < iterations
    assert [r["iteration"] for r in records] == list(range(1, len(records) + 1))
    # every logged row has its schedule record (the record is written right after its row)
    assert len(rows) - 1 <= len(records) and [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    for row, record in zip(rows, records):
        assert (row["sampler_id"], row["behavior_version"], row["learner_version"] - 1) == (
            record["sampler_id"], record["policy_version"], record["learner_version"])
    prefix = read_schedule(schedule)
    replay = pa.train(pa.Config(mode="simulated", total_env_steps=len(records) * 64,
                                lag=pa.LagConfig(schedule="replay", replay_path=str(schedule)), **SMALL))
    assert [r["sampler_id"] for r in replay.metrics] == prefix.sampler_id.tolist()
    assert [r["lag_max"] for r in replay.metrics] == prefix.lag.tolist()


def test_a_slow_logger_holds_the_queue_at_its_bound_and_loses_nothing(tmp_path):
    iterations = 40
    config = pa.Config(mode="threaded", total_env_steps=iterations * 64, run_dir=str(tmp_path / "slow"),
                       num_samplers=2, **SMALL)
    result = pa.train(config, on_iteration=lambda rows: time.sleep(0.05))  # ~10x slower than the learner
    assert result.extras["log_queue_max"] == threaded_module.LOG_QUEUE_SIZE  # it filled up, and no further
    assert [r["iteration"] for r in result.metrics] == list(range(1, iterations + 1))
    assert [r["iteration"] for r in result.extras["version_schedule"]] == list(range(1, iterations + 1))
    assert read_jsonl(tmp_path / "slow" / "version_schedule.jsonl") == result.extras["version_schedule"]
    for r in result.metrics:
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
    # the run reports its device memory: the default buffer of 4 chunks of 4 envs x 16 steps
    memory = result.extras["device_memory"]
    assert memory["buffer_bytes"] == 4 * memory["chunk_bytes"] and memory["chunk_bytes"] > 64 * 3 * 4  # obs alone
    assert memory["snapshot_bytes_per_sampler"] > 4 * (3 * 16 + 16 * 1)  # at least the actor's first layer
    assert memory["device_bytes_limit"] is None or memory["device_bytes_limit"] > 0  # None on CPU


def test_queued_iterations_carry_a_train_state_only_when_the_logger_needs_it(monkeypatch):
    held = []
    real = threaded_module.learner.put_for_logger

    def spy(shared, out, item):
        held.append((item.row["iteration"], item.state is not None))
        return real(shared, out, item)

    monkeypatch.setattr(threaded_module.learner, "put_for_logger", spy)
    config = pa.Config(mode="threaded", total_env_steps=12 * 64, eval_every_steps=5 * 64, eval_episodes=1,
                       num_samplers=2, **SMALL)
    pa.train(config)
    assert [i for i, with_state in held if with_state] == [5, 10, 12]  # evaluations and the last iteration


def test_a_buffer_too_big_for_the_device_is_a_config_error():
    import jax
    import jax.numpy as jnp

    config = pa.Config(mode="threaded", total_env_steps=4 * 64, num_samplers=2, **SMALL)

    class SmallDevice:
        def memory_stats(self):
            return {"bytes_limit": 10_000, "bytes_in_use": 4_000}

        def __str__(self):
            return "gpu:0"

    chunk = {"obs": jax.ShapeDtypeStruct((16, 4, 3), jnp.float32)}  # 768 bytes
    report = threaded_module.device_memory_report(chunk, {"w": jnp.zeros((10,))}, 16, SmallDevice())
    assert (report["buffer_bytes"], report["snapshot_bytes_per_sampler"], report["device_bytes_free"]) == (12_288, 40, 6_000)
    with pytest.raises(pa.ConfigError, match=r"threaded.buffer_capacity = .*needs 12,288 bytes .*gpu:0.*6,000 bytes free"):
        threaded_module.check_buffer_fits(config, report)
    threaded_module.check_buffer_fits(config, threaded_module.device_memory_report(chunk, {}, 4, SmallDevice()))  # 3,072 fits
