"""Tests for `ppo_async.core.lag`: lag schedules (hand-computed and statistical), the
version-schedule file format (JSONL and CSV), replay in the simulated mode and its errors,
and the refresh rules.

Everything but `test_replayed_schedule_is_consumed_exactly` is pure numpy (no compile).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import ppo_async as pa
from ppo_async.core import lag as lag_module
from ppo_async.core.lag import (
    LagSchedule,
    make_schedule,
    must_force_refresh,
    read_schedule,
    schedule_record,
    should_refresh,
    straggler_lags,
    write_schedule,
)


# --------------------------------------------------------------------------------------
# schedules
# --------------------------------------------------------------------------------------


def test_fixed_schedule():
    sched = make_schedule(pa.LagConfig(K=3), 10)
    assert sched.lag.dtype == np.int32 and sched.sampler_id.dtype == np.int32
    np.testing.assert_array_equal(sched.lag, np.full(10, 3))
    np.testing.assert_array_equal(sched.sampler_id, np.zeros(10))
    assert sched.ring_size == 4
    assert make_schedule(pa.LagConfig(), 5).ring_size == 1  # lag 0: only the current version


def test_fixed_schedule_with_several_samplers_is_round_robin():
    sched = make_schedule(pa.LagConfig(K=2), 7, num_samplers=3)
    np.testing.assert_array_equal(sched.sampler_id, [0, 1, 2, 0, 1, 2, 0])
    np.testing.assert_array_equal(sched.lag, [2] * 7)
    # a LagConfig of its own holding the deprecated lag.num_samplers: honoured, with a FutureWarning
    with pytest.warns(FutureWarning, match=r"lag.num_samplers = 3 is deprecated .*pass num_samplers=3 to make_schedule"):
        again = make_schedule(pa.LagConfig(K=2, num_samplers=3), 7)
    np.testing.assert_array_equal(again.sampler_id, sched.sampler_id)


def test_per_sampler_schedule_round_robin():
    config = pa.LagConfig(schedule="per_sampler", per_sampler=(0, 2, 5))
    simulated = pa.Config(mode="simulated", lag=config)
    assert (simulated.num_samplers, simulated.effective_num_samplers) == (None, 3)  # the list's length
    sched = make_schedule(config, 9)  # (num_samplers None: the list's length too)
    np.testing.assert_array_equal(sched.sampler_id, [0, 1, 2, 0, 1, 2, 0, 1, 2])
    np.testing.assert_array_equal(sched.lag, [0, 2, 5, 0, 2, 5, 0, 2, 5])
    assert sched.ring_size == 6
    # num_samplers must agree with the list (or be left unset)
    assert pa.Config(mode="simulated", lag=config, num_samplers=3).effective_num_samplers == 3
    with pytest.raises(pa.ConfigError, match=r"lag.per_sampler = \(0, 2, 5\) is invalid: must list one lag per sampler "
                                             r"\(num_samplers = 2\)"):
        pa.Config(mode="simulated", lag=config, num_samplers=2)
    with pytest.raises(pa.ConfigError, match="lag.per_sampler"):
        pa.LagConfig(schedule="per_sampler")


def test_uniform_schedule_range_coverage_and_seeding():
    config = pa.LagConfig(schedule="uniform", low=1, high=4, seed=11)
    sched = make_schedule(config, 2000)
    assert sched.lag.min() >= 1 and sched.lag.max() <= 4
    assert set(np.unique(sched.lag).tolist()) == {1, 2, 3, 4}
    # roughly uniform: each value ~ 500 of 2000 (sd ~ 19)
    counts = np.bincount(sched.lag, minlength=5)[1:]
    assert np.all(np.abs(counts - 500) < 100), counts
    assert sched.ring_size == 5
    again = make_schedule(config, 2000)
    np.testing.assert_array_equal(sched.lag, again.lag)
    other = make_schedule(pa.LagConfig(schedule="uniform", low=1, high=4, seed=12), 2000)
    assert not np.array_equal(sched.lag, other.lag)
    # a prefix of a longer schedule is the shorter schedule (same draws, in order)
    np.testing.assert_array_equal(make_schedule(config, 50).lag, sched.lag[:50])
    # low == high is a fixed schedule
    np.testing.assert_array_equal(make_schedule(pa.LagConfig(schedule="uniform", low=2, high=2), 20).lag, [2] * 20)


def test_geometric_schedule_is_truncated_and_has_the_right_law():
    p, high, n = 0.3, 5, 20_000
    sched = make_schedule(pa.LagConfig(schedule="geometric", p=p, high=high, seed=3), n)
    assert sched.lag.min() == 0 and sched.lag.max() == high
    freq = np.bincount(sched.lag, minlength=high + 1) / n
    # P(lag = k) = p (1 - p)^k for k < high; the tail mass (1 - p)^high sits at `high`
    expected = [p * (1 - p) ** k for k in range(high)] + [(1 - p) ** high]
    sd = np.sqrt(np.asarray(expected) * (1 - np.asarray(expected)) / n)
    np.testing.assert_array_less(np.abs(freq - expected), 4 * sd + 1e-12)
    assert abs(freq[0] - p) < 0.015
    assert sched.ring_size == high + 1
    # p = 1 is always lag 0
    np.testing.assert_array_equal(make_schedule(pa.LagConfig(schedule="geometric", p=1.0), 100).lag, np.zeros(100))


def test_straggler_schedule_hand_computed():
    config = pa.LagConfig(schedule="straggler", fraction=0.5, slowdown=3)
    sched = make_schedule(config, 24, num_samplers=4)
    np.testing.assert_array_equal(sched.sampler_id, np.tile([0, 1, 2, 3], 6))
    # samplers 0 and 1 are slow: they refresh at their rollouts 0, 3, 6, ... so by rollout
    # index r their params are (r % 3) * 4 learner versions old; samplers 2, 3 are always fresh
    expected = [
        0, 0, 0, 0,  # rollout 0
        4, 4, 0, 0,  # rollout 1
        8, 8, 0, 0,  # rollout 2
        0, 0, 0, 0,  # rollout 3: refresh
        4, 4, 0, 0,
        8, 8, 0, 0,
    ]
    np.testing.assert_array_equal(sched.lag, expected)
    assert sched.ring_size == 9
    # ceil(fraction * S) samplers are slow: 0.25 * 4 -> 1, 0.3 * 4 -> 2
    one_slow = straggler_lags(8, 4, 0.25, 2)
    np.testing.assert_array_equal(one_slow, [0, 0, 0, 0, 4, 0, 0, 0])
    two_slow = straggler_lags(8, 4, 0.3, 2)
    np.testing.assert_array_equal(two_slow, [0, 0, 0, 0, 4, 4, 0, 0])
    # slowdown 1 is a fast sampler
    np.testing.assert_array_equal(straggler_lags(12, 3, 1.0, 1), np.zeros(12))


def test_ring_size_is_max_lag_plus_one():
    assert LagSchedule(np.zeros(3, np.int32), np.array([0, 7, 2], np.int32)).ring_size == 8
    assert LagSchedule(np.zeros(0, np.int32), np.zeros(0, np.int32)).ring_size == 1


# --------------------------------------------------------------------------------------
# version-schedule files
# --------------------------------------------------------------------------------------

# A hand-written consumption record of 8 batches from 3 samplers (not round-robin). Every
# lag is <= its 0-based iteration index, so replay needs no warm-up flooring.
REPLAY_SAMPLERS = [2, 0, 0, 1, 2, 1, 0, 2]
REPLAY_LAGS = [0, 1, 2, 0, 3, 1, 4, 2]


def replay_records() -> list[dict]:
    return [
        schedule_record(
            iteration=i + 1,
            sampler_id=s,
            policy_version=i - k,
            learner_version=i,
            produced_time=0.5 * i if i % 2 else None,
            consumed_time=0.5 * i + 0.25,
        )
        for i, (s, k) in enumerate(zip(REPLAY_SAMPLERS, REPLAY_LAGS))
    ]


def test_schedule_record_derives_lag():
    record = schedule_record(iteration=5, sampler_id=1, policy_version=3, learner_version=7, consumed_time=1.5)
    assert record == {
        "iteration": 5,
        "sampler_id": 1,
        "policy_version": 3,
        "learner_version": 7,
        "lag": 4,
        "produced_time": None,
        "consumed_time": 1.5,
    }
    assert tuple(record) == lag_module.SCHEDULE_COLUMNS


def test_jsonl_round_trip_in_iteration_order(tmp_path):
    path = tmp_path / "sched" / "schedule.jsonl"  # the directory is created
    records = replay_records()
    shuffled = [records[i] for i in (5, 0, 7, 2, 1, 6, 3, 4)]
    write_schedule(path, shuffled)
    lines = path.read_text().splitlines()
    assert len(lines) == 8
    assert json.loads(lines[0]) == records[5]
    sched = read_schedule(path)
    np.testing.assert_array_equal(sched.sampler_id, REPLAY_SAMPLERS)
    np.testing.assert_array_equal(sched.lag, REPLAY_LAGS)
    assert sched.sampler_id.dtype == np.int32 and sched.lag.dtype == np.int32
    assert sched.ring_size == 5


def test_csv_written_by_hand_and_by_write_schedule(tmp_path):
    path = tmp_path / "hand.csv"
    path.write_text(
        "iteration,sampler_id,policy_version,learner_version,lag,produced_time,consumed_time\n"
        "3,1,0,3,3,,0.9\n"
        "1,0,0,0,0,0.1,0.2\n"
        "2,1,,,1,,\n"  # versions unknown: the lag column is used as is
    )
    sched = read_schedule(str(path))
    np.testing.assert_array_equal(sched.sampler_id, [0, 1, 1])
    np.testing.assert_array_equal(sched.lag, [0, 1, 3])
    # write_schedule's CSV reads back to the same schedule as its JSONL
    csv_path = tmp_path / "written.csv"
    write_schedule(csv_path, replay_records())
    assert csv_path.read_text().splitlines()[0] == ",".join(lag_module.SCHEDULE_COLUMNS)
    sched = read_schedule(csv_path)
    np.testing.assert_array_equal(sched.sampler_id, REPLAY_SAMPLERS)
    np.testing.assert_array_equal(sched.lag, REPLAY_LAGS)


def test_read_schedule_errors(tmp_path):
    with pytest.raises(pa.ConfigError, match="no such file"):
        read_schedule(tmp_path / "missing.jsonl")
    with pytest.raises(pa.ConfigError, match="no such file"):
        read_schedule(None)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(pa.ConfigError, match="empty"):
        read_schedule(empty)
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text('{"sampler_id": 0, "lag": 0}\n{not json\n')
    with pytest.raises(pa.ConfigError, match="cannot parse"):
        read_schedule(garbled)
    no_lag = tmp_path / "no_lag.jsonl"
    no_lag.write_text('{"iteration": 1, "sampler_id": 0}\n')
    with pytest.raises(pa.ConfigError, match="record 1 lacks \\['lag'\\]"):
        read_schedule(no_lag)
    inconsistent = tmp_path / "inconsistent.jsonl"
    records = replay_records()
    records[3] = dict(records[3], lag=2)  # learner_version - policy_version = 0
    write_schedule(inconsistent, records)
    with pytest.raises(pa.ConfigError, match="record 4 has lag 2 but learner_version - policy_version = 0"):
        read_schedule(inconsistent)
    negative = tmp_path / "negative.jsonl"
    write_schedule(negative, [{"iteration": 1, "sampler_id": 0, "lag": -1}])
    with pytest.raises(pa.ConfigError, match=">= 0"):
        read_schedule(negative)


def test_make_schedule_replay_errors(tmp_path):
    path = tmp_path / "schedule.jsonl"
    write_schedule(path, replay_records())
    config = pa.LagConfig(schedule="replay", replay_path=str(path))
    sched = make_schedule(config, 6, num_samplers=3)  # a longer file is truncated to the run
    np.testing.assert_array_equal(sched.sampler_id, REPLAY_SAMPLERS[:6])
    np.testing.assert_array_equal(sched.lag, REPLAY_LAGS[:6])
    with pytest.raises(pa.ConfigError) as info:
        make_schedule(config, 20, num_samplers=3)
    assert "holds 8 consumed batches" in str(info.value) and "needs 20 learner iterations" in str(info.value)
    with pytest.raises(pa.ConfigError, match=r"num_samplers = 2 is invalid: the replayed schedule .* names sampler 2"):
        make_schedule(config, 8, num_samplers=2)
    missing = pa.LagConfig(schedule="replay", replay_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(pa.ConfigError, match="no such file"):
        make_schedule(missing, 8)
    with pytest.raises(pa.ConfigError, match="lag.replay_path = .*no such file"):
        pa.Config(mode="simulated", lag=missing).effective_num_samplers  # read when asked (the config itself builds)
    # num_samplers left unset: the file's samplers (largest sampler_id + 1), re-read when the file changes
    unset = pa.Config(mode="simulated", lag=config)
    assert unset.num_samplers is None and unset.effective_num_samplers == 3 == max(REPLAY_SAMPLERS) + 1
    np.testing.assert_array_equal(make_schedule(config, 8).sampler_id, REPLAY_SAMPLERS)
    write_schedule(path, [dict(r, sampler_id=5) if i == 0 else r for i, r in enumerate(replay_records())] + [
        {"iteration": 9, "sampler_id": 0, "lag": 0}])
    assert unset.effective_num_samplers == 6
    assert unset.replace(num_samplers=7).effective_num_samplers == 7
    assert pa.Config(mode="simulated", num_samplers=4).effective_num_samplers == 4
    assert pa.Config(mode="simulated").effective_num_samplers == 1
    with pytest.raises(pa.ConfigError, match="lag.replay_path"):
        pa.LagConfig(schedule="replay")


def multi_process_records() -> list[dict]:
    """What a 2-process asynchronous threaded run (2 samplers each, one chunk per process and
    iteration) writes: per iteration one record from each process, with global sampler ids
    `process_id * 2 + s` (`distributed.global_row`)."""
    records = []
    for iteration, (lag0, lag1) in enumerate([(0, 1), (1, 0), (0, 2), (2, 1)], start=1):
        version = iteration - 1  # learner version before the update that consumed them
        for process_id, lag in ((0, lag0), (1, lag1)):
            record = schedule_record(iteration, process_id * 2 + iteration % 2, version - lag, version, 0.1, 0.2)
            records.append(dict(record, process_id=process_id))
    return records


def test_replay_of_a_multi_process_schedule_names_the_processes_and_what_to_do(tmp_path):
    path = tmp_path / "version_schedule.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in multi_process_records()))  # as the recorder writes it
    for read in (lambda: read_schedule(path), lambda: make_schedule(pa.LagConfig(schedule="replay", replay_path=str(path)), 4)):
        with pytest.raises(pa.ConfigError) as info:
            read()
        message = str(info.value)
        assert "2 records share a learner iteration" in message and "recorded by 2 processes (process_id [0, 1])" in message
        assert "chunks_per_batch > 1" not in message  # not the cause here
        assert "keep the records of one process_id" in message and "one-process threaded run" in message
    # what the message says works: one process's records are one per iteration
    one = tmp_path / "process_1.jsonl"
    one.write_text("".join(json.dumps(r) + "\n" for r in multi_process_records() if r["process_id"] == 1))
    sched = read_schedule(one)
    assert sched.sampler_id.tolist() == [3, 2, 3, 2] and sched.lag.tolist() == [1, 0, 2, 1]
    # one process with several chunks per iteration: the chunks are the cause
    chunks = tmp_path / "chunks.jsonl"
    write_schedule(chunks, [schedule_record(1, 0, 0, 0), schedule_record(1, 1, 0, 0), schedule_record(2, 0, 1, 1)])
    with pytest.raises(pa.ConfigError, match=r"2 records share a learner iteration \(recorded with threaded.chunks_per_batch > 1"):
        read_schedule(chunks)


TINY = dict(
    env="Pendulum-v1",
    total_env_steps=64 * 8,  # 8 learner iterations
    rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)


def test_replayed_schedule_is_consumed_exactly(tmp_path):
    path = tmp_path / "schedule.jsonl"
    write_schedule(path, replay_records())
    run_dir = tmp_path / "run"
    config = pa.Config(
        mode="simulated",
        seed=2,
        run_dir=str(run_dir),
        lag=pa.LagConfig(schedule="replay", replay_path=str(path)),  # 3 samplers, read from the file
        **TINY,
    )
    rows = pa.train(config).metrics
    assert [r["iteration"] for r in rows] == list(range(1, 9))
    assert [r["sampler_id"] for r in rows] == REPLAY_SAMPLERS
    assert [r["lag_mean"] for r in rows] == [float(k) for k in REPLAY_LAGS]
    assert [r["lag_max"] for r in rows] == REPLAY_LAGS
    assert [r["behavior_version"] for r in rows] == [i - k for i, k in enumerate(REPLAY_LAGS)]
    assert [r["learner_version"] for r in rows] == list(range(1, 9))
    for r, k in zip(rows, REPLAY_LAGS):  # ring of 5: every sample in bucket k
        assert r["lag_histogram"] == [64 if b == k else 0 for b in range(5)]
    # the run records the schedule it consumed; replaying that record gives the same schedule
    recorded = read_schedule(run_dir / "lag_schedule.jsonl")
    np.testing.assert_array_equal(recorded.sampler_id, REPLAY_SAMPLERS)
    np.testing.assert_array_equal(recorded.lag, REPLAY_LAGS)


def test_train_rejects_a_replay_file_shorter_than_the_run(tmp_path):
    path = tmp_path / "short.jsonl"
    write_schedule(path, replay_records()[:5])
    config = pa.Config(
        mode="simulated", num_samplers=3, lag=pa.LagConfig(schedule="replay", replay_path=str(path)), **TINY
    )
    with pytest.raises(pa.ConfigError, match="holds 5 consumed batches .* needs 8 learner iterations"):
        pa.train(config)


# --------------------------------------------------------------------------------------
# refresh rules
# --------------------------------------------------------------------------------------


def test_refresh_rules():
    # at least refresh_lag versions behind, and not refreshed within min_refresh_interval
    assert should_refresh(3, 5, refresh_lag=2, since_refresh_s=1.0, min_refresh_interval_s=0.5)
    assert not should_refresh(4, 5, refresh_lag=2, since_refresh_s=1.0, min_refresh_interval_s=0.5)
    assert not should_refresh(3, 5, refresh_lag=2, since_refresh_s=0.1, min_refresh_interval_s=0.5)
    assert should_refresh(5, 5, refresh_lag=0, since_refresh_s=0.0, min_refresh_interval_s=0.0)
    # forced: strictly more than max_lag behind; never with max_lag None
    assert must_force_refresh(2, 5, max_lag=2)
    assert not must_force_refresh(3, 5, max_lag=2)
    assert not must_force_refresh(0, 10**6, max_lag=None)


def test_is_stale_is_lag_above_max_lag_for_ints_and_arrays():
    import jax.numpy as jnp

    assert lag_module.is_stale(2, 2) is False and lag_module.is_stale(3, 2) is True
    assert lag_module.is_stale(0, 0) is False and lag_module.is_stale(1, 0) is True
    assert lag_module.is_stale(10**6, None) is False  # no bound
    lags = jnp.array([0, 2, 3, 7])
    np.testing.assert_array_equal(np.asarray(lag_module.is_stale(lags, 2.0)), [False, False, True, True])
    np.testing.assert_array_equal(np.asarray(lag_module.is_stale(lags, jnp.inf)), [False] * 4)
    # the rule's users agree with it
    assert lag_module.must_force_refresh(sampler_version=4, latest_version=7, max_lag=2) is True
    assert lag_module.must_force_refresh(sampler_version=5, latest_version=7, max_lag=2) is False
    from ppo_async.core.learner import stale_weight

    np.testing.assert_array_equal(np.asarray(stale_weight(lags, jnp.float32(2.0))), [1.0, 1.0, 0.0, 0.0])
