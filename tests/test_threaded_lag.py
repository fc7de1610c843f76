"""Scheduled lag in threaded barrier runs (issue 41 item 1): the simulated mode's lag schedules
made on real sampler threads, on JAX and host-side envs.

Pure parts first (the schedule table, the replay reader, the ParamStore's ring, the delivery
order), then tiny runs: every chunk's recorded version is the schedule's, K = 0 is barrier's
batches, a recorded schedule replays, the statistics travel with their params, and bad
schedules are one-line ConfigErrors naming the field. Tests assert events, never durations.
"""

from __future__ import annotations

import importlib.util
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.config import ThreadedConfig
from ppo_async.core.lag import (
    barrier_lags,
    make_schedule,
    read_chunk_lags,
    read_schedule,
    schedule_record,
    scheduled_version,
    straggler_lags,
    write_schedule,
)
from ppo_async.core.types import PolicySnapshot, RunningMeanStd
from ppo_async.modes.threaded import sampler as sampler_module
from ppo_async.modes.threaded.shared import LagPlan
from ppo_async.runtime.param_store import ParamStore

SMALL = dict(
    rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)
SAMPLERS = 2
ITERATIONS = 8
BATCH = 4 * 16 * SAMPLERS


def barrier_config(env: str = "gymnasium/Pendulum-v1", lag: pa.LagConfig | None = None, iterations: int = ITERATIONS,
                   **threaded) -> pa.Config:
    """A tiny threaded barrier config of `SAMPLERS` samplers with `lag` (default: the barrier's lag 0)."""
    return pa.Config(env=env, mode="threaded", num_samplers=SAMPLERS, total_env_steps=BATCH * iterations,
                     lag=lag or pa.LagConfig(), threaded=ThreadedConfig(barrier=True, **threaded), **SMALL)


def versions_by_iteration(records: list[dict]) -> dict[int, list[int]]:
    """{learner iteration (1-based): [policy_version of sampler 0, 1, ...]} from version-schedule records."""
    out: dict[int, dict[int, int]] = {}
    for r in records:
        out.setdefault(r["iteration"], {})[r["sampler_id"]] = r["policy_version"]
    return {i: [by_sampler[s] for s in sorted(by_sampler)] for i, by_sampler in out.items()}


def expected_versions(lags: np.ndarray) -> dict[int, list[int]]:
    """The versions a fresh barrier run's samplers must act with: max(t - lags[t, s], 0)."""
    return {t + 1: [scheduled_version(t, int(k)) for k in row] for t, row in enumerate(lags)}


def envpool_has(task: str) -> bool:
    """Whether envpool is installed and the envpool/* family knows `task` (its MuJoCo tasks)."""
    if importlib.util.find_spec("envpool") is None:
        return False
    from ppo_async.envs.registry import known_env_names

    return task in known_env_names("envpool")


def envpool_param(task: str):
    return pytest.param(f"envpool/{task}", marks=pytest.mark.skipif(
        not envpool_has(task), reason=f"envpool is not installed or the envpool/* family has no {task}"))


HOST_ENVS = [
    "Pendulum-v1",  # a JAX env (gymnax): the same threads, a jitted rollout
    "gymnasium/Pendulum-v1",
    envpool_param("Pendulum-v1"),  # (envpool/* holds Gymnasium's MuJoCo tasks only: skipped then)
    envpool_param("InvertedPendulum-v5"),  # so an EnvPool simulator is covered all the same
]


# --------------------------------------------------------------------------------------
# pure: the schedule table, replay, the ring, the plan
# --------------------------------------------------------------------------------------


def test_barrier_lags_draw_as_the_simulated_mode_draws():
    # fixed: K everywhere
    np.testing.assert_array_equal(barrier_lags(pa.LagConfig(K=3), 5, 2), np.full((5, 2), 3))
    # per_sampler: sampler s is per_sampler[s] old
    np.testing.assert_array_equal(barrier_lags(pa.LagConfig(schedule="per_sampler", per_sampler=(0, 4)), 3, 2),
                                  [[0, 4]] * 3)
    # uniform / geometric with one sampler: the simulated schedule's very draws
    for lag in (pa.LagConfig(schedule="uniform", low=1, high=5, seed=3), pa.LagConfig(schedule="geometric", p=0.3, seed=4)):
        np.testing.assert_array_equal(barrier_lags(lag, 50, 1)[:, 0], make_schedule(lag, 50).lag)
        table = barrier_lags(lag, 50, 3)  # several samplers: I * S draws of the same law, row-major
        assert table.shape == (50, 3) and table.dtype == np.int32 and table.min() >= 0 and table.max() <= lag.high
    # straggler: one version between a barrier sampler's rollouts (the simulated mode has S)
    table = barrier_lags(pa.LagConfig(schedule="straggler", fraction=0.5, slowdown=3), 6, 2)
    np.testing.assert_array_equal(table, [[0, 0], [1, 0], [2, 0], [0, 0], [1, 0], [2, 0]])
    np.testing.assert_array_equal(straggler_lags(6, 2, 0.5, 3), [0, 0, 2, 0, 4, 0])  # the simulated mode's, unchanged


def test_scheduled_version_is_floored_at_the_first_version():
    assert [scheduled_version(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]
    # a run resumed at iteration 10 (version 10) has no history before it
    assert [scheduled_version(t, 3, first_iteration=10, first_version=10) for t in range(10, 15)] == [10, 10, 10, 10, 11]


def test_replay_tables_broadcast_one_record_or_give_one_per_sampler(tmp_path):
    one = tmp_path / "one.jsonl"
    write_schedule(one, [schedule_record(i + 1, i % 3, max(i - k, 0), i) for i, k in enumerate([0, 1, 2, 1])])
    np.testing.assert_array_equal(read_chunk_lags(one, 2), [[0, 0], [1, 1], [2, 2], [1, 1]])
    two = tmp_path / "two.jsonl"
    write_schedule(two, [schedule_record(i // 2 + 1, i % 2, 0, k) for i, k in enumerate([0, 0, 1, 0, 2, 1])])
    np.testing.assert_array_equal(read_chunk_lags(two, 2), [[0, 0], [1, 0], [2, 1]])
    with pytest.raises(pa.ConfigError, match=r"lag.replay_path = .*hold 2 records each.*num_samplers = 3"):
        read_chunk_lags(two, 3)
    # the simulated mode refuses the two-per-iteration file and says what replays it
    with pytest.raises(pa.ConfigError, match=r"threaded barrier run with num_samplers = 2"):
        read_schedule(two)


def snapshot(version: int) -> PolicySnapshot:
    stats = RunningMeanStd(jnp.zeros(2), jnp.ones(2), jnp.asarray(float(version)))
    return PolicySnapshot({"w": jnp.full((2,), float(version))}, stats, jnp.asarray(version, jnp.int32), stats)


def test_param_store_keeps_a_ring_of_the_last_versions():
    store = ParamStore(snapshot(0), history=3)
    for v in range(1, 6):
        store.publish(snapshot(v))
    assert store.held_versions() == (3, 4, 5)
    got = store.get_version(3)
    assert int(got.version) == 3 and float(got.obs_stats.count) == 3.0  # params and statistics of one version
    placed = store.get_version(4, device=jax.devices()[0])
    assert int(placed.version) == 4 and store.get_version(4, device=jax.devices()[0]) is placed  # one copy
    with pytest.raises(LookupError, match=r"version 2 is not held.*\[3, 4, 5\]"):
        store.get_version(2)
    with pytest.raises(LookupError, match="version 6 is not held"):
        store.get_version(6)
    assert store.wait_for_version(5, timeout=0.0) and not store.wait_for_version(6, timeout=0.01)
    # a waiter wakes when the version is published
    woke: list = []
    waiter = threading.Thread(target=lambda: woke.append(store.wait_for_version(6, timeout=60.0)), name="test-waiter")
    waiter.start()
    store.publish(snapshot(6))
    waiter.join(timeout=60.0)
    assert woke == [True] and store.held_versions() == (4, 5, 6)
    store.close()
    assert not store.wait_for_version(7, timeout=60.0)  # a closed store answers at once
    with pytest.raises(ValueError, match="history"):
        ParamStore(history=0)


def test_lag_plan_versions_ring_and_delivery_order():
    plan = LagPlan(np.asarray([[0, 2], [1, 0], [3, 3], [0, 0]]), run_ahead=1)
    assert (plan.num_iterations, plan.num_samplers, plan.ring_size) == (4, 2, 4)
    assert [plan.version_for(t, 1) for t in range(4)] == [0, 1, 0, 3]
    assert [plan.ready_version(t, 1) for t in range(4)] == [0, 1, 1, 3]  # no more than one iteration ahead
    assert plan.wait_turn(0, 0, timeout=0.0) and not plan.wait_turn(0, 1, timeout=0.0)
    plan.delivered(0, 0)
    assert plan.wait_turn(0, 1, timeout=0.0) and not plan.wait_turn(1, 0, timeout=0.0)
    plan.delivered(0, 1)
    assert plan.wait_turn(1, 0, timeout=0.0)
    resumed = LagPlan(np.full((6, 2), 2), first_iteration=4, first_version=4)
    assert resumed.ring_size == 3 and resumed.version_for(4, 0) == 4 and resumed.version_for(5, 1) == 4
    assert resumed.wait_turn(4, 0, timeout=0.0)  # the turns count from the resumed iteration


# --------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixed_k(tmp_path_factory):
    """A barrier run with lag.K = 2 on gymnasium/Pendulum-v1, with its run directory."""
    run_dir = tmp_path_factory.mktemp("fixed_k")
    config = barrier_config(lag=pa.LagConfig(K=2)).replace(run_dir=str(run_dir))
    return config, pa.train(config), run_dir


@pytest.mark.parametrize("env", HOST_ENVS)
def test_fixed_lag_records_versions_v_minus_k(env):
    k = 3
    config = barrier_config(env, pa.LagConfig(K=k))
    result = pa.train(config)
    expected = expected_versions(np.full((ITERATIONS, SAMPLERS), k))
    assert versions_by_iteration(result.extras["version_schedule"]) == expected
    for t, row in enumerate(result.metrics):  # the batches' own per-sample versions say the same
        assert row["sampler_id"] == list(range(SAMPLERS))
        assert row["behavior_version"] == expected[t + 1]
        lag = min(t, k)  # warm-up: versions never below 0
        assert row["lag_max"] == lag and row["lag_mean"] == lag
        assert row["lag_histogram"][lag] == BATCH == sum(row["lag_histogram"])
        assert row["samples_produced"] == row["samples_consumed"] + row["samples_dropped"] + row["samples_resident"]
    assert result.metrics[-1]["samples_dropped"] == 0


def test_the_recorded_schedule_file_equals_the_schedule(fixed_k):
    config, result, run_dir = fixed_k
    records = pa.read_jsonl(run_dir / "version_schedule.jsonl")
    assert versions_by_iteration(records) == expected_versions(np.full((ITERATIONS, SAMPLERS), 2))
    assert [r["lag"] for r in records] == [min(t, 2) for t in range(ITERATIONS) for _ in range(SAMPLERS)]


@pytest.mark.parametrize("lag", [
    pa.LagConfig(schedule="per_sampler", per_sampler=(0, 3)),
    pa.LagConfig(schedule="uniform", low=0, high=3, seed=5),
    pa.LagConfig(schedule="geometric", p=0.4, high=4, seed=6),
    pa.LagConfig(schedule="straggler", fraction=0.5, slowdown=3),
], ids=lambda lag: lag.schedule)
def test_every_schedule_is_made_exactly(lag):
    config = barrier_config("Pendulum-v1", lag)
    result = pa.train(config)
    lags = barrier_lags(config.lag, ITERATIONS, SAMPLERS)
    assert versions_by_iteration(result.extras["version_schedule"]) == expected_versions(lags)
    assert [r["lag_max"] for r in result.metrics] == [
        max(t - scheduled_version(t, int(k)) for k in row) for t, row in enumerate(lags)]


def test_lag_zero_is_the_barriers_batches():
    barrier = pa.train(barrier_config())
    zeros = pa.train(barrier_config(lag=pa.LagConfig(schedule="per_sampler", per_sampler=(0, 0))))
    for a, b in zip(barrier.metrics, zeros.metrics, strict=True):
        for name in ("sampler_id", "behavior_version", "lag_histogram", "policy_loss", "value_loss", "approx_kl",
                     "entropy", "samples_consumed"):
            assert a[name] == b[name], name
    for x, y in zip(jax.tree.leaves(barrier.train_state), jax.tree.leaves(zeros.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_recorded_threaded_schedule_replays_its_versions(fixed_k, tmp_path):
    # (a) a barrier run's file (one record per sampler and iteration) replayed sampler by sampler
    _, recorded, run_dir = fixed_k
    replay = pa.train(barrier_config(lag=pa.LagConfig(schedule="replay", replay_path=str(run_dir / "version_schedule.jsonl"))))
    assert versions_by_iteration(replay.extras["version_schedule"]) == versions_by_iteration(recorded.extras["version_schedule"])
    # (b) an asynchronous run's file (one chunk per iteration, lags from timing): each
    # iteration's recorded version for every sampler of the barrier run
    async_dir = tmp_path / "async"
    pa.train(pa.Config(env="gymnasium/Pendulum-v1", mode="threaded", total_env_steps=64 * ITERATIONS, run_dir=str(async_dir),
                       num_samplers=3, **SMALL))
    records = pa.read_jsonl(async_dir / "version_schedule.jsonl")
    replay = pa.train(barrier_config(lag=pa.LagConfig(schedule="replay", replay_path=str(async_dir / "version_schedule.jsonl"))))
    assert versions_by_iteration(replay.extras["version_schedule"]) == {
        r["iteration"]: [r["policy_version"]] * SAMPLERS for r in records}


def test_the_statistics_travel_with_the_params_of_their_version(monkeypatch):
    made: list[tuple[int, int, float]] = []
    real_make = sampler_module.Sampler.make

    def recording_make(self):
        made.append((self.version, int(self.snapshot.version), float(self.snapshot.obs_stats.count)))
        return real_make(self)

    monkeypatch.setattr(sampler_module.Sampler, "make", recording_make)
    config = barrier_config("Pendulum-v1", pa.LagConfig(schedule="per_sampler", per_sampler=(1, 3)))
    result = pa.train(config)
    assert result.metrics[-1]["samples_dropped"] == 0  # nothing dropped: every batch joined the statistics
    assert len(made) == ITERATIONS * SAMPLERS
    assert sorted({v for v, _, _ in made}) == sorted({v for vs in expected_versions(
        barrier_lags(config.lag, ITERATIONS, SAMPLERS)).values() for v in vs})
    for version, snapshot_version, count in made:
        assert snapshot_version == version and count == version * BATCH


class Stop(Exception):
    pass


def test_a_resumed_run_continues_the_schedule_from_its_checkpoint(tmp_path):
    def stop_at_5(rows):
        if rows[0]["iteration"] == 5:
            raise Stop

    config = barrier_config("Pendulum-v1", pa.LagConfig(K=2)).replace(run_dir=str(tmp_path / "r"), checkpoint_every_steps=2 * BATCH)
    with pytest.raises(Stop):
        pa.train(config, on_iteration=stop_at_5)
    records = pa.resume(str(tmp_path / "r")).extras["version_schedule"]
    versions = versions_by_iteration(records)
    assert sorted(versions) == list(range(1, ITERATIONS + 1))
    assert {i: versions[i] for i in range(1, 5)} == {i: v for i, v in expected_versions(np.full((4, SAMPLERS), 2)).items()}
    # resumed at iteration 4 (version 4): no version before it is kept, so the warm-up floors at 4
    assert {i: versions[i] for i in range(5, ITERATIONS + 1)} == {
        t + 1: [scheduled_version(t, 2, first_iteration=4, first_version=4)] * SAMPLERS for t in range(4, ITERATIONS)}
    assert versions[ITERATIONS] == [ITERATIONS - 1 - 2] * SAMPLERS  # past the warm-up: v - K again


# --------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------


def one_line_error(build, field: str) -> str:
    with pytest.raises(pa.ConfigError) as info:
        build()
    message = str(info.value)
    assert field in message and "\n" not in message.strip(), message
    return message


def test_where_lag_fields_act_and_where_they_are_errors():
    # accepted where they act: simulated, and a threaded barrier run on any env
    assert pa.Config(env="Pendulum-v1", mode="simulated", lag=pa.LagConfig(K=2)).lag.K == 2
    for env in ("Pendulum-v1", "gymnasium/Pendulum-v1"):
        for lag in (pa.LagConfig(K=2), pa.LagConfig(schedule="uniform", low=1, high=3, seed=2),
                    pa.LagConfig(schedule="geometric", p=0.5, high=3), pa.LagConfig(schedule="straggler", fraction=0.5),
                    pa.LagConfig(schedule="per_sampler", per_sampler=(0, 2)),
                    pa.LagConfig(schedule="replay", replay_path="anything.jsonl")):
            assert barrier_config(env, lag).lag == lag
    # an error where they would do nothing
    message = one_line_error(lambda: pa.Config(env="gymnasium/Pendulum-v1", lag=pa.LagConfig(K=2)), "lag.K = 2")
    assert "threaded.barrier = True" in message  # what would make it act
    one_line_error(lambda: pa.Config(env="Pendulum-v1", mode="sync", lag=pa.LagConfig(K=2)), "lag.K = 2")
    one_line_error(lambda: pa.Config(env="gymnasium/Pendulum-v1", lag=pa.LagConfig(schedule="uniform")), "lag.schedule")
    one_line_error(lambda: barrier_config(lag=pa.LagConfig(schedule="uniform", K=2)), "lag.K = 2")
    # (lag.num_samplers, a deprecated spelling of num_samplers: two spellings, two values)
    one_line_error(lambda: barrier_config(lag=pa.LagConfig(num_samplers=3)), "lag.num_samplers = 3 is invalid: "
                   "num_samplers = 2 is set too")
    one_line_error(lambda: barrier_config(lag=pa.LagConfig(schedule="per_sampler", per_sampler=(1, 2, 3))),
                   "lag.per_sampler")
    # the stale filter still acts everywhere
    assert pa.Config(env="gymnasium/Pendulum-v1", lag=pa.LagConfig(max_lag=2)).lag.max_lag == 2


def test_bad_schedules_on_a_host_env_fail_before_the_run_naming_the_field(tmp_path):
    train = lambda lag: lambda: pa.train(barrier_config(lag=lag))  # noqa: E731
    one_line_error(train(pa.LagConfig(schedule="replay", replay_path=str(tmp_path / "missing.jsonl"))), "lag.replay_path")
    short = tmp_path / "short.jsonl"
    write_schedule(short, [schedule_record(i + 1, 0, 0, i) for i in range(3)])
    message = one_line_error(train(pa.LagConfig(schedule="replay", replay_path=str(short))), "lag.replay_path")
    assert f"needs {ITERATIONS} learner iterations" in message
    three = tmp_path / "three.jsonl"
    write_schedule(three, [schedule_record(i // 3 + 1, i % 3, 0, 0) for i in range(3 * ITERATIONS)])
    one_line_error(train(pa.LagConfig(schedule="replay", replay_path=str(three))), "lag.replay_path")
    message = one_line_error(train(pa.LagConfig(K=3, max_lag=1)), "lag.max_lag = 1")
    assert "lag 3" in message
