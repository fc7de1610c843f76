"""The envpool/* family: EnvPool's C++ builds of Gymnasium's MuJoCo tasks stepped by each
sampler thread (`ppo_async.envs.envpool`): the same `Trajectory` as the Gymnasium host env,
same-step auto-reset (truncation at the time limit, termination, the next obs a reset one),
episode accumulators, a threaded run, names and presets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("envpool", reason="envpool is not installed: pip install -e \".[envpool]\" (in \".[dev]\")")

import ppo_async as pa  # noqa: E402
from ppo_async import envs  # noqa: E402
from ppo_async.config import ConfigError, ThreadedConfig, presets  # noqa: E402
from ppo_async.core import host_rollout, learner  # noqa: E402
from ppo_async.core.networks import make_actor_critic  # noqa: E402
from ppo_async.core.rollout import RolloutContext  # noqa: E402
from ppo_async.core.types import snapshot_of  # noqa: E402
from ppo_async.envs.envpool import EnvPoolSpec, EnvPoolVectorEnv, pool_threads  # noqa: E402
from ppo_async.modes.common import make_contexts  # noqa: E402
from ppo_async.study.benchmark import modes_for_env  # noqa: E402

pytestmark = pytest.mark.xdist_group("envpool")  # one worker pays the imports and compiles


def host_rollout_of(name: str, num_steps: int, num_envs: int = 3) -> tuple[host_rollout.HostRollout, pa.TrainState]:
    """A `HostRollout` of `num_envs` x `num_steps` on host env `name` and a fresh train state."""
    config = pa.Config(env=name, mode="threaded", rollout=pa.RolloutConfig(num_envs=num_envs, num_steps=num_steps),
                       ppo=pa.PPOConfig(num_minibatches=1), total_env_steps=num_envs * num_steps)
    env = envs.make_env(name)
    ctx = RolloutContext(env, make_actor_critic(env, config.network), config.rollout, gamma=config.ppo.gamma)
    _, _, learner_ctx = make_contexts(config)
    return host_rollout.HostRollout(ctx), learner.init_train_state(learner_ctx, jax.random.PRNGKey(0), env.obs_shape)


def leaf_specs(tree) -> list[tuple[tuple[int, ...], jnp.dtype]]:
    return [(tuple(x.shape), x.dtype) for x in jax.tree.leaves(tree)]


def test_envpool_and_gymnasium_trajectories_have_the_same_fields_dtypes_and_shapes():
    trajectories = {}
    for name in ("gymnasium/HalfCheetah-v5", "envpool/HalfCheetah-v5"):
        roll, state = host_rollout_of(name, num_steps=6)
        env = roll.make_env(seed=3)
        try:
            _, trajectories[name] = roll(snapshot_of(state), env, jax.random.PRNGKey(1))
        finally:
            env.close()
        assert leaf_specs(roll.trajectory_like(snapshot_of(state))) == leaf_specs(trajectories[name])
    gym, pool = trajectories.values()
    assert type(pool.transitions).__name__ == "Transition"
    assert jax.tree.structure(gym) == jax.tree.structure(pool)
    assert leaf_specs(gym) == leaf_specs(pool)
    assert pool.transitions.obs.shape == (6, 3, 17) and pool.transitions.action.shape == (6, 3, 6)


def test_the_family_maps_to_its_class_and_seeds_env_i_with_seed_plus_i():
    env = envs.make_env("envpool/HalfCheetah-v5")
    assert env.host_side and env.env == EnvPoolSpec("HalfCheetah-v5", 1000) and env.obs_shape == (17,)
    a, b = host_rollout.make_host_env(env, 3, 1), host_rollout.make_host_env(env, 3, 2)
    one = EnvPoolVectorEnv(env.env, 1, 2)  # env 1 of seed 1 is env 0 of seed 2
    try:
        assert isinstance(a, EnvPoolVectorEnv) and isinstance(a, host_rollout.HOST_ENV_TYPES)
        assert a.obs.dtype == np.float32 and a.obs.shape == (3, 17)
        assert not np.allclose(a.obs, b.obs) and np.allclose(a.obs[1], one.obs[0]) and np.allclose(a.obs[1], b.obs[0])
    finally:
        for e in (a, b, one):
            e.close()
    gym = host_rollout.make_host_env(envs.make_env("gymnasium/Pendulum-v1"), 2, 0)
    gym.close()
    assert isinstance(gym, host_rollout.HostVectorEnv)


def test_pool_threads_share_the_cores_among_samplers():
    roll, _ = host_rollout_of("envpool/HalfCheetah-v5", num_steps=2, num_envs=4)
    env = roll.make_env(seed=0, num_samplers=2)  # as a threaded run makes its samplers' envs
    try:
        assert env.pool.config["num_threads"] == pool_threads(4, num_samplers=2)
    finally:
        env.close()
    assert pool_threads(16, num_samplers=1, cores=2) == 2
    assert pool_threads(16, num_samplers=2, cores=2) == 1
    assert pool_threads(16, num_samplers=4, cores=2) == 1  # never 0
    assert pool_threads(16, num_samplers=2, cores=16) == 8
    assert pool_threads(2, num_samplers=1, cores=16) == 2  # never more threads than envs


def reference_obs(task: str, seed: int, num_envs: int, actions: np.ndarray) -> np.ndarray:
    """`[T, N, O]` observations reached by an EnvPool of `num_envs` envs (env i seeded seed + i,
    no time limit in reach) under `actions` `[T, N, A]`, straight from `envpool`."""
    import envpool

    pool = envpool.make_gymnasium(task, num_envs=num_envs, seed=[seed + i for i in range(num_envs)], num_threads=1)
    pool.reset()
    try:
        return np.stack([np.asarray(pool.step(a)[0], np.float32) for a in actions])
    finally:
        pool.close()


def second_reset_obs(task: str, seed: int, num_envs: int) -> np.ndarray:
    """`[N, O]` each env's second reset observation (HalfCheetah's steps draw no random numbers,
    so it is the reset that follows any first episode)."""
    import envpool

    pool = envpool.make_gymnasium(task, num_envs=num_envs, seed=[seed + i for i in range(num_envs)], num_threads=1)
    pool.reset()
    try:
        return np.asarray(pool.reset(np.arange(num_envs, dtype=np.int32))[0], np.float32)
    finally:
        pool.close()


def test_time_limit_truncates_with_the_reached_obs_and_the_next_obs_a_reset_one():
    limit, num_envs = 20, 3
    env = EnvPoolVectorEnv(EnvPoolSpec("HalfCheetah-v5", limit), num_envs, seed=5)
    actions = np.random.default_rng(0).uniform(-1, 1, (2 * limit, num_envs, 6)).astype(np.float32)
    try:
        steps = []
        for action in actions:
            acted_on = env.obs.copy()
            steps.append((acted_on, *env.step(action), env.obs.copy()))
    finally:
        env.close()
    acted_on, reward, terminated, truncated, final_obs, fin_ret, fin_len, next_obs = map(np.stack, zip(*steps))
    # the limit is a truncation (not a termination) every `limit` steps, in every env
    assert [np.flatnonzero(truncated[:, i]).tolist() for i in range(num_envs)] == [[limit - 1, 2 * limit - 1]] * num_envs
    assert not terminated.any() and (fin_len[truncated] == limit).all()
    # final_obs at the limit is the observation reached (as an EnvPool without the limit reaches it) ...
    np.testing.assert_allclose(final_obs[:limit], reference_obs("HalfCheetah-v5", 5, num_envs, actions[:limit]), rtol=1e-5, atol=1e-6)
    # ... the next obs acted on is the env's next reset, and its first step applied the action
    np.testing.assert_allclose(acted_on[limit], second_reset_obs("HalfCheetah-v5", 5, num_envs), rtol=1e-6)
    assert not np.allclose(final_obs[limit - 1], acted_on[limit])
    np.testing.assert_array_equal(final_obs[limit:2 * limit - 1], acted_on[limit + 1:])
    assert (reward[limit] != 0).all()  # EnvPool's own deferred reset would return reward 0 here


HOPPER_INIT_OBS = np.array([1.25] + [0.0] * 10, np.float32)  # Hopper-v5: qpos[1:] (height 1.25), qvel; noise 5e-3


def test_terminations_reset_only_the_finished_envs_and_returns_match_a_hand_sum():
    num_envs, num_steps = 4, 120
    env = EnvPoolVectorEnv(EnvPoolSpec("Hopper-v5", 1000), num_envs, seed=11)
    actions = np.random.default_rng(1).uniform(-1, 1, (num_steps, num_envs, 3)).astype(np.float32)
    try:
        steps = [(env.obs.copy(), *env.step(action)) for action in actions]
        running_return, running_length = env.episode_return.copy(), env.episode_length.copy()
    finally:
        env.close()
    acted_on, reward, terminated, truncated, final_obs, fin_ret, fin_len = map(np.stack, zip(*steps))
    assert terminated.any(axis=0).sum() >= 2 and not truncated.any()
    assert len({tuple(np.flatnonzero(terminated[:, i])) for i in range(num_envs)}) > 1  # envs finish apart
    for i in range(num_envs):
        start = 0
        for t in np.flatnonzero(terminated[:, i]):
            np.testing.assert_allclose(fin_ret[t, i], reward[start:t + 1, i].sum(dtype=np.float64), rtol=1e-5)
            assert fin_len[t, i] == t + 1 - start
            if t + 1 < num_steps:  # the next obs is a reset one: Hopper's initial pose within its reset noise
                assert np.abs(acted_on[t + 1, i] - HOPPER_INIT_OBS).max() <= 0.0051 < np.abs(final_obs[t, i] - HOPPER_INIT_OBS).max()
            start = t + 1
        np.testing.assert_allclose(running_return[i], reward[start:, i].sum(dtype=np.float64), rtol=1e-5)
        assert running_length[i] == num_steps - start
    not_done = ~(terminated | truncated)[:-1]
    np.testing.assert_array_equal(final_obs[:-1][not_done], acted_on[1:][not_done])  # others continue untouched
    assert (fin_ret[~terminated] == 0).all() and (fin_len[~terminated] == 0).all()


def test_a_short_threaded_run_on_envpool_halfcheetah_writes_finite_metrics(tmp_path):
    config = pa.Config(env="envpool/HalfCheetah-v5", mode="threaded", total_env_steps=2048,
                       rollout=pa.RolloutConfig(num_envs=8, num_steps=32),
                       ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
                       network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
                       num_samplers=2, run_dir=str(tmp_path / "run"), eval_every_steps=8 * 256, eval_episodes=2)
    result = pa.train(config)
    rows = result.metrics
    assert [r["iteration"] for r in rows] == list(range(1, config.num_iterations + 1)) and config.num_iterations == 8
    assert sorted({r["sampler_id"] for r in rows}) == [0, 1]
    for r in rows:
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
        assert all(np.isfinite(v) for v in r.values() if isinstance(v, float))
    assert (tmp_path / "run" / "metrics.jsonl").exists() and np.isfinite(rows[-1]["eval_return"])


def test_unknown_envpool_name_is_a_one_line_error_listing_the_known_ones():
    with pytest.raises(ConfigError) as err:
        pa.Config(env="envpool/HalfCheetah-v9", mode="threaded")
    message = str(err.value)
    assert "\n" not in message and message.startswith("env = 'envpool/HalfCheetah-v9' is not a known envpool environment")
    for known in ("envpool/HalfCheetah-v5", "envpool/Hopper-v5", "envpool/Walker2d-v5", "envpool/Ant-v5", "envpool/Humanoid-v5"):
        assert known in message
    assert "envpool/Pong-v5" not in message  # EnvPool's Atari and others are not this family's


def test_envpool_is_threaded_only_with_the_gymnasium_preset():
    with pytest.raises(ConfigError, match="mode = 'sync' is invalid: must be 'threaded' for the host-side env"):
        pa.Config(env="envpool/HalfCheetah-v5", mode="sync")
    assert pa.Config(env="envpool/HalfCheetah-v5").mode == "threaded"  # its one mode when none is given
    assert modes_for_env("envpool/Hopper-v5") == modes_for_env("gymnasium/Hopper-v5")
    assert presets.preset_for("envpool/Hopper-v5") == presets.preset_for("gymnasium/Hopper-v5") != {}
