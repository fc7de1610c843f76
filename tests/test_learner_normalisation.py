"""Learner-owned normalisation (issue 39): the policy is a function of raw observations.

Trajectories carry raw observations and rewards; the learner normalises each batch with its own
statistics; the statistics are merged from consumed batches once per batch and travel to the
samplers with the parameters of the same version; checkpoints keep them exactly.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async import envs
from ppo_async.core import learner, networks
from ppo_async.core.types import RunningMeanStd, snapshot_of
from ppo_async.modes import common
from ppo_async.modes.common import make_contexts
from ppo_async.modes.threaded import sampler as sampler_module

T, N = 16, 4
CONFIG = pa.Config(
    env="Pendulum-v1", total_env_steps=T * N * 8,
    rollout=pa.RolloutConfig(num_envs=N, num_steps=T, normalize_reward=True),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=1, gamma=0.9),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)


def stats(mean, var, count=40.0) -> RunningMeanStd:
    return RunningMeanStd(jnp.asarray(mean, jnp.float32), jnp.asarray(var, jnp.float32), jnp.asarray(count, jnp.float32))


def hand_normalised(raw: np.ndarray, s: RunningMeanStd, clip: float = 10.0) -> np.ndarray:
    return np.clip((raw - np.asarray(s.mean, np.float64)) / np.sqrt(np.asarray(s.var, np.float64) + 1e-8), -clip, clip)


def test_a_lagged_batch_is_normalised_with_the_learners_statistics_not_the_samplers(monkeypatch):
    """Simulated-mode step (`rollout_and_update`) with a behaviour snapshot K versions old whose
    statistics differ from the learner's: the batch the update receives holds the raw
    observations, and its first-step KL is the one of the learner's network on the batch
    normalised by hand with the learner's statistics (not the sampler's)."""
    env, rollout_ctx, learner_ctx = make_contexts(CONFIG)
    network = learner_ctx.network
    state = learner.init_train_state(learner_ctx, jax.random.PRNGKey(0), env.obs_shape)
    sampler_stats = stats([0.5, -0.5, 1.0], [0.25, 4.0, 9.0])
    learner_stats = stats([-0.3, 0.2, 0.0], [1.5, 0.5, 16.0], 80.0)
    behaviour = snapshot_of(state)._replace(obs_stats=sampler_stats, version=jnp.asarray(3, jnp.int32))
    state = state._replace(obs_stats=learner_stats, version=jnp.asarray(5, jnp.int32))  # lag K = 2
    seen = []
    real = learner.ppo_update

    def spy(ctx, train_state, trajectory, key, hparams):
        seen.append(trajectory)
        return real(ctx, train_state, trajectory, key, hparams)

    monkeypatch.setattr(common.learner, "ppo_update", spy)
    env_state = envs.reset_envs(env, jax.random.PRNGKey(1), N)
    new_state, _, _, metrics = common.rollout_and_update(
        rollout_ctx, learner_ctx, state, behaviour, env_state, jax.random.PRNGKey(2), learner.hyperparams_from_config(CONFIG))
    tr = seen[0].transitions
    raw = np.asarray(tr.obs, np.float64)
    np.testing.assert_array_equal(np.asarray(tr.obs[0]), np.asarray(env_state.obs))  # raw, not the sampler's view
    assert np.all(np.asarray(tr.policy_version) == 3) and int(new_state.version) == 6
    # the sampler acted on its own statistics' view ...
    dist_b, _ = network.apply(state.params, jnp.asarray(hand_normalised(raw, sampler_stats), jnp.float32))
    np.testing.assert_allclose(np.asarray(networks.log_prob(dist_b, tr.action)), np.asarray(tr.behavior_log_prob),
                               rtol=1e-5, atol=1e-5)
    # ... the learner's ratio is its network on the learner's view (one SGD step: the first step's KL)
    def approx_kl(view_stats):
        dist, _ = network.apply(state.params, jnp.asarray(hand_normalised(raw, view_stats), jnp.float32))
        log_ratio = np.asarray(networks.log_prob(dist, tr.action), np.float64) - np.asarray(tr.behavior_log_prob, np.float64)
        return float(np.mean(np.expm1(log_ratio) - log_ratio))

    assert float(metrics["approx_kl"]) == pytest.approx(approx_kl(learner_stats), rel=1e-3)
    assert abs(approx_kl(sampler_stats)) < 1e-9 < approx_kl(learner_stats)
    # the statistics merged once from the consumed batch (after SGD: the default)
    assert float(new_state.obs_stats.count) == 80.0 + T * N


@pytest.mark.parametrize("env", ["Pendulum-v1", "gymnasium/Pendulum-v1"])
def test_threaded_samplers_receive_statistics_and_parameters_of_one_version(monkeypatch, env):
    """Every rollout a sampler makes acts with a snapshot whose statistics are those of its
    parameters' version: merged from exactly `version` consumed batches (count = v x batch)."""
    seen = []
    real = sampler_module.Sampler.make

    def spy(self):
        snap = self.snapshot
        seen.append((int(snap.version), float(snap.obs_stats.count), float(snap.reward_stats.count)))
        return real(self)

    monkeypatch.setattr(sampler_module.Sampler, "make", spy)
    config = dataclasses.replace(CONFIG, env=env, mode="threaded", num_samplers=2)
    result = pa.train(config)
    assert len(result.metrics) == config.num_iterations and len(seen) >= config.num_iterations
    assert len({v for v, _, _ in seen}) >= 2  # the samplers refreshed
    for version, obs_count, reward_count in seen:
        assert obs_count == reward_count == version * config.batch_size, (version, obs_count)


def test_checkpoint_round_trip_keeps_the_statistics_exactly(tmp_path):
    """A sync run's checkpoint restores the learner's statistics bit for bit, and a resumed run
    continues to the same statistics as an uninterrupted one."""
    base = CONFIG.replace(mode="sync", checkpoint_every_steps=4 * T * N, run_dir=str(tmp_path / "run"),
                          ppo=dataclasses.replace(CONFIG.ppo, anneal_lr=False))  # an extension keeps the schedule
    full = pa.train(base)
    half = pa.train(base.replace(run_dir=str(tmp_path / "half"), total_env_steps=T * N * 4))
    resumed = pa.resume(str(tmp_path / "half"), total_env_steps=T * N * 8)
    for a, b in zip(jax.tree.leaves((full.train_state.obs_stats, full.train_state.reward_stats)),
                    jax.tree.leaves((resumed.train_state.obs_stats, resumed.train_state.reward_stats))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(np.asarray(half.train_state.obs_stats.count).ravel()[0]) == T * N * 4
