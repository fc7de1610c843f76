"""Reward normalisation by the running std of the discounted return (rollout.normalize_reward):
the maths by hand, the rollout applying its snapshot's statistics, the learner merging the
moments of what it consumed, checkpoints keeping them, and lagged modes end to end."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async import envs
from ppo_async.config import ConfigError
from ppo_async.core import learner, normalization
from ppo_async.core.networks import make_actor_critic
from ppo_async.core.rollout import RolloutContext, rollout
from ppo_async.core.types import RunningMeanStd, snapshot_of
from ppo_async.modes.registry import get_mode
from ppo_async.run.rundir import restore_checkpoint

GAMMA = 0.9


def test_discounted_return_hand_values():
    reward = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    done = jnp.array([[False, True], [False, False], [True, False]])
    # G_t = 0.5 G_{t-1} + r_t, restarting after a done: env 0: 1, 3.5, 6.75; env 1: 0.5*10+2 = 7 | 4, 8
    discounted, carry = normalization.discounted_returns(jnp.array([0.0, 10.0]), reward, done, 0.5)
    np.testing.assert_allclose(np.asarray(discounted), [[1.0, 7.0], [3.5, 4.0], [6.75, 8.0]])
    np.testing.assert_allclose(np.asarray(carry), [0.0, 8.0])
    g0, c0 = normalization.discounted_return_step(jnp.array([0.0, 10.0]), reward[0], done[0], 0.5)
    np.testing.assert_allclose(np.asarray(g0), [1.0, 7.0])
    np.testing.assert_allclose(np.asarray(c0), [1.0, 0.0])


def test_normalize_reward_divides_by_the_return_std_and_clips():
    stats = RunningMeanStd(mean=jnp.asarray(5.0), var=jnp.asarray(4.0), count=jnp.asarray(10.0))
    out = normalization.normalize_reward(stats, jnp.array([1.0, -3.0, 100.0, -100.0]), clip=10.0)
    np.testing.assert_allclose(np.asarray(out), [0.5, -1.5, 10.0, -10.0], rtol=1e-6)  # not centred: the mean is unused
    np.testing.assert_array_equal(np.asarray(normalization.normalize_reward(stats, jnp.array([3.0]), 10.0, enabled=False)), [3.0])
    fresh = normalization.init_reward_stats()  # var 1: the identity up to 1e-8
    np.testing.assert_allclose(np.asarray(normalization.normalize_reward(fresh, jnp.array([2.0]), 10.0)), [2.0], rtol=1e-6)


def _context(**rollout):
    config = pa.Config(env="Pendulum-v1", rollout=pa.RolloutConfig(num_envs=2, num_steps=205, **rollout),
                       ppo=pa.PPOConfig(gamma=GAMMA, num_minibatches=2), network=pa.NetworkConfig(actor_hidden=(8,), critic_hidden=(8,)))
    env = envs.make_env(config.env)
    network = make_actor_critic(env, config.network)
    ctx = RolloutContext(env, network, config.rollout, gamma=GAMMA)
    state = learner.init_train_state(learner.make_learner_context(config, network), jax.random.PRNGKey(0), env.obs_shape)
    return config, env, network, ctx, state


def _hand_discounted(raw: np.ndarray, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out, running = np.zeros_like(raw), np.zeros(raw.shape[1])
    for t in range(raw.shape[0]):
        out[t] = GAMMA * running + raw[t]
        running = np.where(done[t], 0.0, out[t])
    return out, running


def test_rollout_stores_raw_rewards_whatever_its_snapshot_and_records_return_moments():
    """T = 205 crosses Pendulum's 200-step limit, so the return restarts inside the rollout.
    Rewards are the learner's to scale: two snapshots with other return statistics store the
    same (raw) rewards."""
    _, env, _, ctx, state = _context(normalize_reward=True)
    env_state = envs.reset_envs(env, jax.random.PRNGKey(1), 2)
    run = jax.jit(lambda snap, e, k: rollout(ctx, snap, e, k))
    stats_of = lambda var: RunningMeanStd(jnp.asarray(0.0), jnp.asarray(var), jnp.asarray(50.0))  # noqa: E731
    after, traj = run(snapshot_of(state)._replace(reward_stats=stats_of(4.0)), env_state, jax.random.PRNGKey(2))
    _, traj16 = run(snapshot_of(state)._replace(reward_stats=stats_of(16.0)), env_state, jax.random.PRNGKey(2))
    tr = jax.device_get(traj.transitions)
    raw = tr.reward.astype(np.float64)
    np.testing.assert_array_equal(np.asarray(traj16.transitions.reward), tr.reward)
    assert raw.min() < -1.0  # Pendulum's own scale
    # episode returns are the env's own rewards
    np.testing.assert_allclose(float(traj.stats.episode_return_sum), raw[:200].sum(), rtol=1e-4)
    discounted, carry = _hand_discounted(raw, tr.terminated | tr.truncated)
    moments = traj.stats.return_moments
    assert float(moments.count) == 205 * 2
    np.testing.assert_allclose(float(moments.mean), discounted.mean(), rtol=1e-4)
    np.testing.assert_allclose(float(moments.var), discounted.var(), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(after.discounted_return), carry, rtol=1e-4)


def test_without_normalisation_rewards_are_the_envs():
    _, env, _, ctx, state = _context()
    env_state = envs.reset_envs(env, jax.random.PRNGKey(1), 2)
    weird = snapshot_of(state)._replace(reward_stats=RunningMeanStd(jnp.asarray(0.0), jnp.asarray(100.0), jnp.asarray(9.0)))
    _, traj = rollout(ctx, weird, env_state, jax.random.PRNGKey(2))
    assert float(jnp.min(traj.transitions.reward)) < -1.0  # Pendulum's raw scale, not divided by 10
    np.testing.assert_allclose(float(traj.stats.episode_return_sum), float(jnp.sum(traj.transitions.reward[:200])), rtol=1e-5)


@pytest.mark.parametrize("normalize", [True, False])
def test_learner_merges_the_return_moments_it_consumes(normalize):
    config, env, network, ctx, state = _context(normalize_reward=normalize)
    config = config.replace(total_env_steps=205 * 2 * 4)
    lctx = learner.make_learner_context(config, network)
    _, traj = rollout(ctx, snapshot_of(state), envs.reset_envs(env, jax.random.PRNGKey(1), 2), jax.random.PRNGKey(2))
    new, _ = learner.ppo_update(lctx, state, traj, jax.random.PRNGKey(3), learner.hyperparams_from_config(config))
    want = normalization.merge_moments(state.reward_stats, traj.stats.return_moments) if normalize else state.reward_stats
    for got, expected in zip(new.reward_stats, want):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6)
    assert float(new.reward_stats.count) == (410.0 if normalize else 0.0)


def test_reward_clip_without_normalisation_is_an_error_and_gamma_becomes_static():
    with pytest.raises(ConfigError, match=r"rollout.reward_clip = 5.0 has no effect: rewards are not normalised"):
        pa.RolloutConfig(reward_clip=5.0)
    with pytest.raises(ConfigError, match="rollout.reward_clip"):
        pa.RolloutConfig(normalize_reward=True, reward_clip=0.0)
    plain = pa.config_to_dict(pa.Config())
    normalised = pa.config_to_dict(pa.Config(rollout=pa.RolloutConfig(normalize_reward=True)))
    assert "gamma" not in learner.without_traced_fields(plain)["ppo"]  # traced: one program for every gamma
    assert learner.without_traced_fields(normalised)["ppo"]["gamma"] == 0.95  # the rollout discounts with it


LAGGED = {
    "simulated": dict(env="Pendulum-v1", mode="simulated", lag=pa.LagConfig(K=2)),
    "threaded": dict(env="Pendulum-v1", mode="threaded", num_samplers=2),
    "threaded-host": dict(env="gymnasium/Pendulum-v1", mode="threaded", num_samplers=2),
}


@pytest.mark.parametrize("case", sorted(LAGGED))
def test_lagged_runs_keep_the_moments_of_every_consumed_sample_in_their_checkpoint(case, tmp_path):
    """The learner merges the return moments of each batch it consumes, so the statistics count
    exactly the env steps it consumed; the checkpoint holds them; the samplers (behind the
    learner by up to K versions; jitted or host-side envs) act and scale with their own snapshots."""
    mode = LAGGED[case]["mode"]
    config = pa.Config(total_env_steps=8 * 16 * 6, num_seeds=1, run_dir=str(tmp_path / case),
                       rollout=pa.RolloutConfig(num_envs=8, num_steps=16, normalize_reward=True, reward_scale=1.0),
                       ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
                       network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)), **LAGGED[case])
    result = pa.train(config)
    assert result.metrics[-1]["lag_mean"] > 0  # the samples were lagged
    state, _ = restore_checkpoint(config.run_dir, get_mode(mode).checkpoint_like(config), config.keep_checkpoints)
    train_state = state.train_state
    stats = jax.tree.map(lambda x: np.asarray(x).reshape(-1)[0] if np.ndim(x) else float(x), train_state.reward_stats)
    env_steps = int(np.asarray(train_state.env_steps).reshape(-1)[0])
    assert env_steps == 8 * 16 * 6 and float(stats.count) == env_steps
    assert np.isfinite(stats.var) and stats.var > 1.0  # Pendulum's discounted returns spread far wider than 1


def test_stats_update_where_nothing_is_normalised_is_an_error():
    with pytest.raises(ConfigError, match=r"rollout.stats_update = 'before_sgd' has no effect: nothing is normalised"):
        pa.RolloutConfig(normalize_obs=False, stats_update="before_sgd")
    assert pa.RolloutConfig(normalize_obs=False, normalize_reward=True, stats_update="before_sgd").stats_update == "before_sgd"
    with pytest.raises(ConfigError, match=r"rollout.stats_update = 'during' is invalid"):
        pa.RolloutConfig(stats_update="during")
