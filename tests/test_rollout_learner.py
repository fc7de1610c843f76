"""Tests for `ppo_async.core.rollout` and `ppo_async.core.learner` on tiny Pendulum / CartPole configs.

Rollout: shapes of every transition field, policy versions, behaviour log-probs recomputed,
observation normalisation and raw-observation moments, episode accounting across a time
limit, no re-tracing. Learner: train-state init, counters of one update, ratio 1 at the first
minibatch, learning-rate annealing, truncation bootstrap on a hand-made trajectory, dropped
(weight 0) samples, explained variance, hyperparameters traced without re-compiling.

One jitted rollout and one jitted update are shared by the module (they count their traces).
"""

from __future__ import annotations

import dataclasses
import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async import envs
from ppo_async.core import learner, networks
from ppo_async.config import Config, NetworkConfig, PPOConfig, RolloutConfig
from ppo_async.core.networks import make_actor_critic
from ppo_async.core.rollout import RolloutContext, rollout
from ppo_async.core.types import (
    GaussianDist,
    PolicySnapshot,
    RolloutStats,
    RunningMeanStd,
    Trajectory,
    Transition,
    snapshot_of,
)
from ppo_async.core import normalization

T, N = 8, 4  # batch 32
CONFIG = Config(
    env="Pendulum-v1",
    total_env_steps=4 * T * N,  # 4 iterations (for annealing)
    rollout=RolloutConfig(num_envs=N, num_steps=T, reward_scale=0.5),
    ppo=PPOConfig(num_epochs=2, num_minibatches=2, learning_rate=3e-3),
    network=NetworkConfig(actor_hidden=(8, 8), critic_hidden=(8, 8)),
)
ENV = envs.make_env(CONFIG.env)
NETWORK = make_actor_critic(ENV, CONFIG.network)
RCTX = RolloutContext(env=ENV, network=NETWORK, config=CONFIG.rollout)
LCTX = learner.make_learner_context(CONFIG, NETWORK)
HPARAMS = learner.hyperparams_from_config(CONFIG)

ROLLOUT_TRACES: list[int] = []
UPDATE_TRACES: list[int] = []


def _rollout(snapshot, env_state, key):
    ROLLOUT_TRACES.append(1)
    return rollout(RCTX, snapshot, env_state, key)


def _update(state, trajectory, key, hparams):
    UPDATE_TRACES.append(1)
    return learner.ppo_update(LCTX, state, trajectory, key, hparams)


ROLLOUT = jax.jit(_rollout)
UPDATE = jax.jit(_update)


def fresh_state(seed: int = 0):
    train_state = learner.init_train_state(LCTX, jax.random.PRNGKey(seed), ENV.obs_shape)
    env_state = envs.reset_envs(ENV, jax.random.PRNGKey(seed + 100), N)
    return train_state, env_state


@pytest.fixture(scope="module")
def first_rollout():
    """(train_state, env_state before, env_state after, trajectory) of one rollout from init."""
    train_state, env_state = fresh_state()
    after, trajectory = ROLLOUT(snapshot_of(train_state), env_state, jax.random.PRNGKey(1))
    return train_state, env_state, after, trajectory


def custom_stats() -> RunningMeanStd:
    return RunningMeanStd(
        mean=jnp.array([0.1, -0.2, 0.3], jnp.float32),
        var=jnp.array([0.5, 2.0, 4.0], jnp.float32),
        count=jnp.asarray(50.0, jnp.float32),
    )


# --------------------------------------------------------------------------------------
# rollout
# --------------------------------------------------------------------------------------


def test_transition_shapes_and_versions():
    train_state, env_state = fresh_state(1)
    snapshot = PolicySnapshot(train_state.params, train_state.obs_stats, jnp.asarray(7, jnp.int32), train_state.reward_stats)
    after, traj = ROLLOUT(snapshot, env_state, jax.random.PRNGKey(2))
    tr = traj.transitions
    assert tr.obs.shape == (T, N, 3) and tr.obs.dtype == jnp.float32
    assert tr.action.shape == (T, N, 1) and tr.action.dtype == jnp.float32
    assert tr.reward.shape == (T, N) and tr.reward.dtype == jnp.float32
    assert tr.terminated.shape == (T, N) and tr.terminated.dtype == jnp.bool_
    assert tr.truncated.shape == (T, N) and tr.truncated.dtype == jnp.bool_
    assert tr.final_obs.shape == (T, N, 3)
    assert tr.behavior_log_prob.shape == (T, N)
    assert isinstance(tr.behavior_dist, GaussianDist)
    assert tr.behavior_dist.mean.shape == (T, N, 1) and tr.behavior_dist.log_std.shape == (T, N, 1)
    assert tr.policy_version.shape == (T, N) and tr.policy_version.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(tr.policy_version), 7)
    assert traj.last_obs.shape == (N, 3)
    assert after.obs.shape == (N, 3) and after.episode_length.shape == (N,)
    # Pendulum episodes are 200 steps: nothing ends within 8
    np.testing.assert_array_equal(np.asarray(after.episode_length), T)
    assert not np.asarray(tr.terminated).any() and not np.asarray(tr.truncated).any()
    assert float(traj.stats.episode_count) == 0.0
    assert int(traj.stats.nonfinite_count) == 0


def test_categorical_rollout_shapes():
    env = envs.make_env("CartPole-v1")
    net = make_actor_critic(env, NetworkConfig(actor_hidden=(8,), critic_hidden=(8,)))
    ctx = RolloutContext(env=env, network=net, config=RolloutConfig(num_envs=3, num_steps=40))
    params = net.init(jax.random.PRNGKey(0))
    snapshot = PolicySnapshot(params, normalization.init_obs_stats(env.obs_shape), jnp.asarray(2, jnp.int32),
                              normalization.init_reward_stats())
    state = envs.reset_envs(env, jax.random.PRNGKey(0), 3)
    _, traj = jax.jit(lambda s, e, k: rollout(ctx, s, e, k))(snapshot, state, jax.random.PRNGKey(1))
    tr = traj.transitions
    assert tr.obs.shape == (40, 3, 4)
    assert tr.action.shape == (40, 3) and tr.action.dtype == jnp.int32
    assert set(np.unique(np.asarray(tr.action))) <= {0, 1}
    assert tr.behavior_dist.logits.shape == (40, 3, 2)
    np.testing.assert_array_equal(np.asarray(tr.policy_version), 2)
    # log pi(a) is log_softmax(logits)[a], recomputed from the stored logits
    log_p = np.asarray(jax.nn.log_softmax(tr.behavior_dist.logits))
    expected = np.take_along_axis(log_p, np.asarray(tr.action)[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(np.asarray(tr.behavior_log_prob), expected, rtol=1e-6, atol=1e-6)
    # CartPole rewards are 1 and random play terminates within 40 steps in some env
    np.testing.assert_array_equal(np.asarray(tr.reward), 1.0)
    terminated = np.asarray(tr.terminated)
    assert terminated.any()
    stats = traj.stats
    assert float(stats.episode_count) == terminated.sum()
    # each finished episode paid +1 per step: return sum = length sum
    assert float(stats.episode_return_sum) == float(stats.episode_length_sum) > 0


def test_behavior_log_prob_and_dist_match_recomputation(first_rollout):
    train_state, _, _, traj = first_rollout
    tr = traj.transitions
    dist, _ = NETWORK.apply(train_state.params, tr.obs)
    np.testing.assert_allclose(np.asarray(tr.behavior_dist.mean), np.asarray(dist.mean), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(tr.behavior_dist.log_std), np.asarray(dist.log_std), rtol=1e-6)
    recomputed = networks.log_prob(dist, tr.action)
    np.testing.assert_allclose(np.asarray(tr.behavior_log_prob), np.asarray(recomputed), rtol=1e-5, atol=1e-5)
    # log-probs of a 1-D Gaussian with log_std 0: -(a - mu)^2 / 2 - log(2 pi) / 2
    a = np.asarray(tr.action)[..., 0]
    mu = np.asarray(dist.mean)[..., 0]
    np.testing.assert_allclose(np.asarray(tr.behavior_log_prob), -0.5 * (a - mu) ** 2 - 0.5 * math.log(2 * math.pi),
                               rtol=1e-5, atol=1e-5)


def test_stored_actions_are_unclipped_and_rewards_raw():
    """With std e^1.5 ~ 4.5 many sampled actions exceed the bounds [-2, 2]: the transition keeps
    the sample, the env acts with the clipped torque, and the reward is the raw env reward."""
    train_state, env_state = fresh_state(2)
    params = flax.core.unfreeze(train_state.params)
    params["params"]["log_std"] = jnp.array([1.5], jnp.float32)
    snapshot = PolicySnapshot(params, train_state.obs_stats, train_state.version, train_state.reward_stats)
    _, traj = ROLLOUT(snapshot, env_state, jax.random.PRNGKey(3))
    tr = traj.transitions
    u = np.asarray(tr.action, np.float64)[..., 0]
    assert np.mean(np.abs(u) > 2.0) > 0.3
    raw = np.asarray(tr.obs, np.float64)  # identity normaliser at init
    theta = np.arctan2(raw[..., 1], raw[..., 0])
    cost = theta**2 + 0.1 * raw[..., 2] ** 2
    reward = np.asarray(tr.reward, np.float64)
    np.testing.assert_allclose(reward, -(cost + 0.001 * np.clip(u, -2, 2) ** 2), rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(reward + cost + 0.001 * u**2)) > 1e-3  # unclipped torque would not match


@pytest.mark.exact_xla
def test_trajectory_carries_raw_obs_and_the_snapshot_acts_on_its_normalised_ones():
    """Normalisation is part of the policy: the snapshot acts on (obs - mean) / std under its
    own statistics, the trajectory keeps the env's raw observations (the learner normalises)."""
    train_state, env_state = fresh_state(3)
    stats = custom_stats()
    snapshot = PolicySnapshot(train_state.params, stats, train_state.version, train_state.reward_stats)
    after, traj = ROLLOUT(snapshot, env_state, jax.random.PRNGKey(4))
    tr = traj.transitions
    np.testing.assert_array_equal(np.asarray(tr.obs[0]), np.asarray(env_state.obs))
    np.testing.assert_array_equal(np.asarray(traj.last_obs), np.asarray(after.obs))
    # no episode ends: the observation reached at t is the one acted on at t + 1
    np.testing.assert_array_equal(np.asarray(tr.final_obs[:-1]), np.asarray(tr.obs[1:]))
    np.testing.assert_array_equal(np.asarray(tr.final_obs[-1]), np.asarray(traj.last_obs))
    # the behaviour log-prob is the snapshot's network on the hand-normalised observation
    raw = np.asarray(tr.obs, np.float64)
    mean, std = np.asarray(stats.mean, np.float64), np.sqrt(np.asarray(stats.var, np.float64) + 1e-8)
    dist, _ = NETWORK.apply(train_state.params, jnp.asarray((raw - mean) / std, jnp.float32))
    np.testing.assert_allclose(np.asarray(networks.log_prob(dist, tr.action)), np.asarray(tr.behavior_log_prob), rtol=1e-5, atol=1e-5)
    dist_raw, _ = NETWORK.apply(train_state.params, tr.obs)  # (on the raw inputs it would differ)
    assert not np.allclose(np.asarray(networks.log_prob(dist_raw, tr.action)), np.asarray(tr.behavior_log_prob), atol=1e-3)
    # obs_moments are of the raw observations
    m = traj.stats.obs_moments
    np.testing.assert_allclose(np.asarray(m.mean), raw.reshape(-1, 3).mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(m.var), raw.reshape(-1, 3).var(0), rtol=1e-4, atol=1e-5)
    assert float(m.count) == T * N


def test_learner_view_normalises_with_the_learners_statistics_hand_values():
    """`learner_view`: every observation field through (x - mean) / sqrt(var + 1e-8) clipped to
    obs_clip, rewards divided by the return std clipped to reward_clip; behaviour fields as
    they are. Hand-computed on a 2 x 1 trajectory."""
    ctx = dataclasses.replace(LCTX, normalize_reward=True, obs_clip=3.0, reward_clip=2.0)
    obs_stats = RunningMeanStd(jnp.array([1.0, 0.0, -1.0]), jnp.array([4.0, 1.0, 0.25]), jnp.asarray(10.0))
    reward_stats = RunningMeanStd(jnp.asarray(0.0), jnp.asarray(16.0), jnp.asarray(10.0))
    obs = jnp.array([[[3.0, 2.0, -1.5]], [[1.0, 10.0, 0.0]]])  # [T=2, N=1, 3]
    tr = Transition(
        obs=obs, action=jnp.zeros((2, 1, 1)), reward=jnp.array([[4.0], [-40.0]]),
        terminated=jnp.zeros((2, 1), bool), truncated=jnp.array([[False], [True]]),
        final_obs=obs + 1.0, behavior_log_prob=jnp.array([[-0.5], [-0.7]]),
        behavior_dist=GaussianDist(jnp.zeros((2, 1, 1)), jnp.zeros((2, 1, 1))),
        policy_version=jnp.array([[3], [3]], jnp.int32),
    )
    traj = Trajectory(tr, last_obs=jnp.array([[5.0, -5.0, -1.0]]), stats=None)
    view = learner.learner_view(ctx, traj, obs_stats, reward_stats)
    s = 1.0 + 1e-8  # sqrt(var + 1e-8) ~ sqrt(var): within float32 of 2, 1, 0.5
    np.testing.assert_allclose(np.asarray(view.transitions.obs)[:, 0], [[1.0, 2.0, -1.0], [0.0, 3.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(view.transitions.final_obs)[:, 0], [[1.5, 3.0, 1.0], [0.5, 3.0, 3.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(view.last_obs), [[2.0, -3.0, 0.0]], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(view.transitions.reward)[:, 0], [1.0 / s, -2.0], rtol=1e-6)  # 4/4, clip(-10)
    for field in ("action", "behavior_log_prob", "policy_version", "terminated", "truncated"):
        np.testing.assert_array_equal(np.asarray(getattr(view.transitions, field)), np.asarray(getattr(tr, field)))
    off = dataclasses.replace(ctx, normalize_obs=False, normalize_reward=False)
    same = learner.learner_view(off, traj, obs_stats, reward_stats)
    for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(traj)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rollout_is_reproducible_and_key_dependent(first_rollout):
    train_state, env_state, _, traj = first_rollout
    _, again = ROLLOUT(snapshot_of(train_state), env_state, jax.random.PRNGKey(1))
    np.testing.assert_array_equal(np.asarray(again.transitions.action), np.asarray(traj.transitions.action))
    _, other = ROLLOUT(snapshot_of(train_state), env_state, jax.random.PRNGKey(2))
    assert not np.array_equal(np.asarray(other.transitions.action), np.asarray(traj.transitions.action))


def test_episode_accounting_across_the_time_limit():
    """T = 205 spans the 200-step Pendulum limit: each env finishes exactly one episode."""
    steps, num_envs = 205, 2
    ctx = RolloutContext(ENV, NETWORK, RolloutConfig(num_envs=num_envs, num_steps=steps, reward_scale=0.25))
    train_state, _ = fresh_state(4)
    env_state = envs.reset_envs(ENV, jax.random.PRNGKey(5), num_envs)
    after, traj = jax.jit(lambda s, e, k: rollout(ctx, s, e, k))(snapshot_of(train_state), env_state, jax.random.PRNGKey(6))
    tr = jax.device_get(traj.transitions)
    expected_truncated = np.zeros((steps, num_envs), bool)
    expected_truncated[199] = True
    np.testing.assert_array_equal(tr.truncated, expected_truncated)
    assert not tr.terminated.any()
    stats = traj.stats
    assert float(stats.episode_count) == 2.0
    assert float(stats.episode_length_sum) == 400.0
    # returns are unscaled env rewards (reward_scale is the learner's business)
    np.testing.assert_allclose(float(stats.episode_return_sum), tr.reward[:200].sum(dtype=np.float64), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(after.episode_length), 5)
    np.testing.assert_allclose(np.asarray(after.episode_return), tr.reward[200:].sum(0), rtol=1e-5)
    # the reset: the observation reached at step 200 is not the one acted on next
    assert not np.allclose(tr.final_obs[199], tr.obs[200])
    np.testing.assert_allclose(tr.final_obs[198], tr.obs[199], rtol=1e-6, atol=1e-7)  # one observation (gymnax rounds it twice)
    assert int(stats.nonfinite_count) == 0
    np.testing.assert_array_equal(np.asarray(jnp.isfinite(tr.reward)), True)


def test_jitted_rollout_does_not_retrace():
    train_state, env_state = fresh_state(5)
    state, _ = ROLLOUT(snapshot_of(train_state), env_state, jax.random.PRNGKey(0))  # fresh reset
    count = len(ROLLOUT_TRACES)
    assert count >= 1
    state, _ = ROLLOUT(snapshot_of(train_state), state, jax.random.PRNGKey(1))  # its own output
    state, _ = ROLLOUT(PolicySnapshot(train_state.params, custom_stats(), jnp.asarray(3, jnp.int32), train_state.reward_stats), state,
                       jax.random.PRNGKey(2))
    assert len(ROLLOUT_TRACES) == count
    # every call in this module shares one compilation
    assert len(ROLLOUT_TRACES) == 1


# --------------------------------------------------------------------------------------
# learner
# --------------------------------------------------------------------------------------


def test_init_train_state():
    state = learner.init_train_state(LCTX, jax.random.PRNGKey(9), ENV.obs_shape)
    for counter in (state.version, state.sgd_steps, state.env_steps):
        assert counter.shape == () and counter.dtype == jnp.int32 and int(counter) == 0
    np.testing.assert_array_equal(np.asarray(state.obs_stats.mean), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(state.obs_stats.var), np.ones(3))
    assert float(state.obs_stats.count) == 0.0
    fresh = NETWORK.init(jax.random.PRNGKey(9))
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(fresh)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Adam moments start at zero
    adam = learner.adam_state(state.opt_state)
    assert all(float(jnp.abs(x).sum()) == 0.0 for x in jax.tree.leaves((adam.mu, adam.nu)))


def test_one_update_counters_params_and_obs_stats(first_rollout):
    train_state, _, _, traj = first_rollout
    new_state, metrics = UPDATE(train_state, traj, jax.random.PRNGKey(0), HPARAMS)
    assert int(new_state.version) == 1
    assert int(new_state.sgd_steps) == 2 * 2  # epochs x minibatches
    assert int(new_state.env_steps) == T * N
    for value in (new_state.version, new_state.sgd_steps, new_state.env_steps):
        assert value.dtype == jnp.int32
    changed = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(train_state.params), jax.tree.leaves(new_state.params))]
    assert all(changed)  # every parameter got a gradient step
    # normalize_obs: the stats are the raw-observation moments of the batch (merged into count 0)
    m = traj.stats.obs_moments
    np.testing.assert_allclose(np.asarray(new_state.obs_stats.mean), np.asarray(m.mean), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(new_state.obs_stats.var), np.asarray(m.var), rtol=1e-6)
    assert float(new_state.obs_stats.count) == T * N
    assert float(metrics["learning_rate"]) == pytest.approx(3e-3)
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"):
        assert np.isfinite(float(metrics[name])), name
    # entropy of a 1-D Gaussian with log_std ~ 0: (1 + log 2 pi) / 2
    assert float(metrics["entropy"]) == pytest.approx(0.5 * (1 + math.log(2 * math.pi)), abs=0.02)
    # the minibatches after the first see moved params: the ratio is no longer 1 everywhere
    assert float(metrics["approx_kl_max"]) > 0.0

    # a second iteration: counters add up, the learning rate anneals to 3/4
    _, traj2 = ROLLOUT(snapshot_of(new_state), first_rollout[2], jax.random.PRNGKey(7))
    newer, metrics2 = UPDATE(new_state, traj2, jax.random.PRNGKey(1), HPARAMS)
    assert (int(newer.version), int(newer.sgd_steps), int(newer.env_steps)) == (2, 8, 64)
    assert float(metrics2["learning_rate"]) == pytest.approx(3e-3 * 0.75)
    assert float(newer.obs_stats.count) == 2 * T * N
    raw = np.concatenate([np.asarray(traj.transitions.obs, np.float64), np.asarray(traj2.transitions.obs, np.float64)]).reshape(-1, 3)
    np.testing.assert_allclose(np.asarray(newer.obs_stats.mean), raw.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(newer.obs_stats.var), raw.var(0), rtol=1e-4, atol=1e-5)


def test_first_minibatch_ratio_is_exactly_one(first_rollout):
    """With 1 epoch x 1 minibatch the only gradient step sees the behaviour params: r = 1."""
    train_state, _, _, traj = first_rollout
    ctx = dataclasses.replace(LCTX, num_epochs=1, num_minibatches=1)
    new_state, metrics = jax.jit(lambda s, t, k, h: learner.ppo_update(ctx, s, t, k, h))(
        train_state, traj, jax.random.PRNGKey(0), HPARAMS
    )
    assert abs(float(metrics["approx_kl"])) < 1e-7
    assert abs(float(metrics["approx_kl_max"])) < 1e-7
    assert float(metrics["clip_fraction"]) == 0.0
    assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["ratio_max"]) == pytest.approx(1.0, abs=1e-5)
    assert float(metrics["ratio_std"]) < 1e-5
    assert int(new_state.sgd_steps) == 1 and int(new_state.version) == 1


def test_lag_0_ratio_is_exactly_one_with_trained_statistics_after_sgd_and_not_before(first_rollout):
    """Learner-owned statistics: a batch made at the learner's own version (lag 0) with
    non-trivial statistics is normalised, under `stats_update = "after_sgd"`, with exactly the
    statistics the sampler acted with, so the first step's ratio is 1; under "before_sgd" the
    batch's own moments are merged first and the ratio measures that change."""
    train_state, _, after, traj = first_rollout
    state1, _ = UPDATE(train_state, traj, jax.random.PRNGKey(0), HPARAMS)  # statistics of 32 raw observations
    assert float(state1.obs_stats.count) == T * N and not np.allclose(np.asarray(state1.obs_stats.var), 1.0)
    _, traj1 = ROLLOUT(snapshot_of(state1), after, jax.random.PRNGKey(9))  # lag 0 against state1
    kls = {}
    for before in (False, True):
        ctx = dataclasses.replace(LCTX, num_epochs=1, num_minibatches=1, stats_before_sgd=before)
        new_state, metrics = jax.jit(lambda s, t, k, h: learner.ppo_update(ctx, s, t, k, h))(
            state1, traj1, jax.random.PRNGKey(0), HPARAMS
        )
        kls[before] = float(metrics["approx_kl"])
        assert float(new_state.obs_stats.count) == 2 * T * N  # merged once either way
    assert abs(kls[False]) < 1e-7
    assert kls[True] > 1e-6


def test_learning_rate_at_hand_values():
    hp = HPARAMS._replace(learning_rate=jnp.asarray(1e-3, jnp.float32))
    ctx = dataclasses.replace(LCTX, num_iterations=4, anneal_lr=True)
    expected = {0: 1e-3, 1: 7.5e-4, 2: 5e-4, 3: 2.5e-4, 4: 0.0, 9: 0.0}
    for version, lr in expected.items():
        got = float(learner.learning_rate_at(ctx, hp, jnp.asarray(version, jnp.int32)))
        assert got == pytest.approx(lr, abs=1e-10), version
    constant = dataclasses.replace(ctx, anneal_lr=False)
    for version in (0, 3, 100):
        assert float(learner.learning_rate_at(constant, hp, jnp.asarray(version, jnp.int32))) == pytest.approx(1e-3)


class ValueIsFirstObsFeature:
    """A stand-in network whose value is obs[..., 0] (and whose policy is never used by GAE)."""

    def apply(self, params, obs):
        zeros = jnp.zeros(obs.shape[:-1] + (1,))
        return GaussianDist(zeros, zeros), obs[..., 0]


def hand_trajectory() -> Trajectory:
    """T = 3, N = 2; V(s) is the single obs feature.

    env 0: V = 1, 2, 3; rewards 1, 1, 1; truncated at t = 1 with V(final_obs) = 10; V(s_T) = 4
    env 1: V = 0, 1, 0; rewards 0, 2, 0; terminated at t = 0 (V(final_obs) = 7 must be ignored); V(s_T) = 5
    """
    obs = np.array([[1.0, 0.0], [2.0, 1.0], [3.0, 0.0]], np.float32)[..., None]
    final = np.array([[2.0, 7.0], [10.0, 0.0], [4.0, 5.0]], np.float32)[..., None]
    reward = np.array([[1.0, 0.0], [1.0, 2.0], [1.0, 0.0]], np.float32)
    terminated = np.array([[False, True], [False, False], [False, False]])
    truncated = np.array([[False, False], [True, False], [False, False]])
    zeros = jnp.zeros((3, 2))
    transitions = Transition(
        obs=jnp.asarray(obs), action=jnp.zeros((3, 2, 1)), reward=jnp.asarray(reward),
        terminated=jnp.asarray(terminated), truncated=jnp.asarray(truncated), final_obs=jnp.asarray(final),
        behavior_log_prob=zeros, behavior_dist=GaussianDist(jnp.zeros((3, 2, 1)), jnp.zeros((3, 2, 1))),
        policy_version=jnp.zeros((3, 2), jnp.int32),
    )
    stats = RolloutStats(jnp.zeros(()), jnp.zeros(()), jnp.zeros(()), normalization.init_obs_stats((1,)),
                         normalization.init_reward_stats(), jnp.zeros((), jnp.int32))
    return Trajectory(transitions, jnp.array([[4.0], [5.0]]), stats)


def test_compute_targets_truncation_bootstrap_hand_values():
    """gamma = 0.5, lambda = 0.5, reward_scale = 2; rewards become 2 r + gamma V(final) at truncations.

    env 0: r' = 2, 2 + 0.5 * 10 = 7, 2; dones 0, 1, 0
      t=2: delta = 2 + 0.5*4 - 3 = 1;  A = 1
      t=1: delta = 7 - 2 = 5 (cut);    A = 5
      t=0: delta = 2 + 0.5*2 - 1 = 2;  A = 2 + 0.25*5 = 3.25;   returns 4.25, 7, 4
    env 1: r' = 0, 4, 0; dones 1, 0, 0
      t=2: delta = 0 + 0.5*5 - 0 = 2.5; A = 2.5
      t=1: delta = 4 + 0.5*0 - 1 = 3;   A = 3 + 0.25*2.5 = 3.625
      t=0: delta = 0 - 0 = 0 (terminal, no bootstrap); A = 0;     returns 0, 4.625, 2.5
    Flattened time-major: index t * N + n.
    """
    ctx = dataclasses.replace(LCTX, network=ValueIsFirstObsFeature())
    hp = HPARAMS._replace(gamma=jnp.float32(0.5), gae_lambda=jnp.float32(0.5), reward_scale=jnp.float32(2.0),
                          max_lag=jnp.float32(jnp.inf))
    traj = hand_trajectory()
    lag = jnp.zeros((3, 2), jnp.int32)
    batch = learner.compute_targets(ctx, None, traj, hp, lag)
    np.testing.assert_allclose(np.asarray(batch.advantage), [3.25, 0.0, 5.0, 3.625, 1.0, 2.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(batch.target), [4.25, 0.0, 7.0, 4.625, 4.0, 2.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(batch.old_value), [1.0, 0.0, 2.0, 1.0, 3.0, 0.0])
    np.testing.assert_array_equal(np.asarray(batch.weight), 1.0)
    assert batch.obs.shape == (6, 1) and batch.action.shape == (6, 1)

    # final_obs matters at truncated steps only
    final = np.asarray(traj.transitions.final_obs).copy()
    final[[0, 0, 2, 2], [0, 1, 0, 1]] = -123.0  # every non-truncated step
    garbage = traj._replace(transitions=traj.transitions._replace(final_obs=jnp.asarray(final)))
    same = learner.compute_targets(ctx, None, garbage, hp, lag)
    np.testing.assert_array_equal(np.asarray(same.advantage), np.asarray(batch.advantage))
    final[1, 0] = 20.0  # the truncated one: r' grows by gamma * 10 = 5 at (t=1, n=0)
    moved = learner.compute_targets(ctx, None, traj._replace(transitions=traj.transitions._replace(final_obs=jnp.asarray(final))), hp, lag)
    np.testing.assert_allclose(np.asarray(moved.advantage) - np.asarray(batch.advantage),
                               [5 * 0.25, 0.0, 5.0, 0.0, 0.0, 0.0], rtol=1e-6, atol=1e-6)


def test_compute_targets_matches_numpy_gae_reference(first_rollout):
    """On a real rollout: values from the network, GAE by a plain loop (no dones within T = 8)."""
    train_state, _, _, traj = first_rollout
    batch = learner.compute_targets(LCTX, train_state.params, traj, HPARAMS, jnp.zeros((T, N), jnp.int32))
    _, values = NETWORK.apply(train_state.params, traj.transitions.obs)
    _, last = NETWORK.apply(train_state.params, traj.last_obs)
    values, last = np.asarray(values, np.float64), np.asarray(last, np.float64)
    rewards = np.asarray(traj.transitions.reward, np.float64) * CONFIG.rollout.reward_scale
    gamma, lam = CONFIG.ppo.gamma, CONFIG.ppo.gae_lambda
    adv = np.zeros((T, N))
    next_adv, next_value = np.zeros(N), last
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * next_value - values[t]
        next_adv = delta + gamma * lam * next_adv
        adv[t] = next_adv
        next_value = values[t]
    np.testing.assert_allclose(np.asarray(batch.advantage), adv.reshape(-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(batch.target), (adv + values).reshape(-1), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(batch.behavior_log_prob), np.asarray(traj.transitions.behavior_log_prob).reshape(-1))


def test_stale_weight_hand_values():
    lag = jnp.array([0, 1, 2, 3], jnp.int32)
    np.testing.assert_array_equal(np.asarray(learner.stale_weight(lag, jnp.float32(1.0))), [1, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(learner.stale_weight(lag, jnp.float32(0.0))), [1, 0, 0, 0])
    np.testing.assert_array_equal(np.asarray(learner.stale_weight(lag, jnp.float32(jnp.inf))), [1, 1, 1, 1])


def test_weight_zero_samples_do_not_affect_the_gradient(first_rollout):
    train_state, _, _, traj = first_rollout
    params = train_state.params
    batch = learner.compute_targets(LCTX, params, traj, HPARAMS, jnp.zeros((T, N), jnp.int32))
    keep = np.arange(T * N) % 2 == 0
    masked = batch._replace(weight=jnp.asarray(keep, jnp.float32))
    rng = np.random.default_rng(0)

    def garble(x):
        x = np.asarray(x).copy()
        noise = rng.normal(0.0, 5.0, size=x[~keep].shape).astype(x.dtype) if x.dtype != np.int32 else x[~keep]
        x[~keep] = noise
        return jnp.asarray(x)

    garbled = masked._replace(
        obs=garble(masked.obs), action=garble(masked.action), behavior_log_prob=garble(masked.behavior_log_prob),
        old_value=garble(masked.old_value), advantage=garble(masked.advantage), target=garble(masked.target),
    )
    subset = jax.tree.map(lambda x: x[keep], masked)  # only the kept samples, all weight 1
    grad = jax.jit(jax.grad(lambda p, b: learner.ppo_loss(p, LCTX, b, HPARAMS, jnp.float32(1.0))[0]))
    g_masked, g_garbled, g_subset, g_full = (grad(params, b) for b in (masked, garbled, subset, batch))
    for a, b, c, full in zip(*(jax.tree.leaves(g) for g in (g_masked, g_garbled, g_subset, g_full))):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.asarray(c), np.asarray(a), rtol=1e-4, atol=1e-6)
    # and the mask does something: the full batch gives another gradient
    assert any(not np.allclose(a, f, rtol=1e-3) for a, f in zip(jax.tree.leaves(g_masked), jax.tree.leaves(g_full)))


def test_stale_samples_are_dropped_from_the_update(first_rollout):
    """Envs 0 and 1 were sampled by version -1 (lag 1 at version 0); max_lag = 0 drops them.
    Garbage in the dropped samples then leaves the update unchanged."""
    train_state, _, _, traj = first_rollout
    tr = traj.transitions
    stale = np.zeros((T, N), bool)
    stale[:, :2] = True
    versions = jnp.where(jnp.asarray(stale), -1, tr.policy_version).astype(jnp.int32)
    aged = traj._replace(transitions=tr._replace(policy_version=versions))
    hp = HPARAMS._replace(max_lag=jnp.float32(0.0))
    new_state, metrics = UPDATE(train_state, aged, jax.random.PRNGKey(0), hp)
    assert int(new_state.env_steps) == T * N // 2
    assert int(metrics["dropped_stale"]) == T * N // 2
    assert int(new_state.version) == 1

    rng = np.random.default_rng(1)

    def garble(x):
        x = np.asarray(x).copy()
        x[:, :2] = rng.normal(0.0, 3.0, size=x[:, :2].shape).astype(x.dtype)
        return jnp.asarray(x)

    garbled = aged._replace(transitions=aged.transitions._replace(
        obs=garble(tr.obs), action=garble(tr.action), reward=garble(tr.reward),
        final_obs=garble(tr.final_obs), behavior_log_prob=garble(tr.behavior_log_prob),
    ))
    other_state, _ = UPDATE(train_state, garbled, jax.random.PRNGKey(0), hp)
    for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(other_state.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
    # keeping everything (max_lag = inf) gives a different update
    kept_state, _ = UPDATE(train_state, aged, jax.random.PRNGKey(0), HPARAMS)
    assert int(kept_state.env_steps) == T * N
    assert any(not np.allclose(a, b) for a, b in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(kept_state.params)))


def test_explained_variance_hand_values():
    ev = lambda p, t: float(learner.explained_variance(jnp.asarray(p, jnp.float32), jnp.asarray(t, jnp.float32)))  # noqa: E731
    assert ev([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    # var(t) = 2/3, var(t - p) = var([0, 0, -1]) = 2/9  ->  1 - 1/3
    assert ev([1.0, 2.0, 4.0], [1.0, 2.0, 3.0]) == pytest.approx(2.0 / 3.0, rel=1e-6)
    # a constant prediction (the mean) explains nothing; a shifted copy explains everything
    assert ev([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == pytest.approx(0.0, abs=1e-6)
    assert ev([11.0, 12.0, 13.0], [1.0, 2.0, 3.0]) == pytest.approx(1.0)
    # anti-correlated: var(t - p) = var([2, 0, -2]) = 8/3 -> 1 - 4 = -3
    assert ev([-1.0, 2.0, 5.0], [1.0, 2.0, 3.0]) == pytest.approx(-3.0, rel=1e-6)
    assert math.isnan(ev([1.0, 2.0], [5.0, 5.0]))


def test_traced_hyperparameters_do_not_retrace(first_rollout):
    """clip_eps (and the learning rate) are traced: one compiled update serves every value."""
    train_state, _, _, traj = first_rollout
    hp = HPARAMS._replace(learning_rate=jnp.float32(3e-2))
    _, wide = UPDATE(train_state, traj, jax.random.PRNGKey(0), hp._replace(clip_eps=jnp.float32(0.99)))
    count = len(UPDATE_TRACES)
    _, tight = UPDATE(train_state, traj, jax.random.PRNGKey(0), hp._replace(clip_eps=jnp.float32(1e-4)))
    _, mid = UPDATE(train_state, traj, jax.random.PRNGKey(0), hp._replace(clip_eps=jnp.float32(0.1), dual_clip=jnp.float32(2.0)))
    assert len(UPDATE_TRACES) == count
    assert len(UPDATE_TRACES) == 1  # every update in this module shares one compilation
    # and the traced value is really used: after the first step most ratios leave [1 - 1e-4, 1 + 1e-4]
    assert float(wide["clip_fraction"]) == 0.0
    assert float(tight["clip_fraction"]) > 0.3
    assert float(tight["policy_loss"]) != float(wide["policy_loss"])
