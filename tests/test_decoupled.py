"""Decoupled PPO in the learner (issue: decoupled PPO and the lag-robustness table): config
rules, the proximal EWMA, one compile for both objectives, equality with PPO when the
proximal policy is the behaviour policy, the ESS metrics, and threaded runs."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import ppo_async as pa
from ppo_async import envs
from ppo_async.core import learner
from ppo_async.modes.common import make_contexts
from ppo_async.core.rollout import rollout
from ppo_async.core.types import snapshot_of

PPO = pa.PPOConfig
SMALL = dict(env="Pendulum-v1", rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
             network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)))


@pytest.mark.parametrize("make, message", [
    (lambda: PPO(objective="dppo"), r"ppo.objective = 'dppo' .*'ppo', 'decoupled'"),
    (lambda: PPO(objective="decoupled", is_clip=0.5), r"ppo.is_clip = 0.5 .*>= 1"),
    (lambda: PPO(objective="decoupled", is_clip=math.inf), r"ppo.is_clip = inf .*finite"),
    (lambda: PPO(objective="decoupled", prox_ewma=1.0), r"ppo.prox_ewma = 1.0 .*\[0, 1\)"),
    (lambda: PPO(objective="decoupled", prox_ewma=-0.1), r"ppo.prox_ewma = -0.1"),
    (lambda: PPO(objective="decoupled", prox_ewma="0.9"), r"ppo.prox_ewma = '0.9'"),
    (lambda: pa.Config(ppo=PPO(is_clip=5.0)), r"ppo.is_clip = 5.0 has no effect.*'decoupled'"),
    (lambda: pa.Config(ppo=PPO(prox_ewma=0.9)), r"ppo.prox_ewma = 0.9 has no effect.*'decoupled'"),
])
def test_bad_decoupled_config_is_a_config_error(make, message):
    with pytest.raises(pa.ConfigError, match=message):
        make()


def test_hyperparams_trace_the_objective_and_its_scalars():
    hp = learner.hyperparams_from_config(pa.Config(ppo=PPO(objective="decoupled", is_clip=None, prox_ewma=0.95)))
    assert float(hp.decoupled) == 1.0 and math.isinf(float(hp.is_clip)) and float(hp.prox_ewma) == pytest.approx(0.95)
    hp = learner.hyperparams_from_config(pa.Config())
    assert float(hp.decoupled) == 0.0 and float(hp.is_clip) == 2.0 and float(hp.prox_ewma) == 0.0
    from ppo_async.study.sweep import static_key

    # the objective and the scalars are traced; whether an EWMA is kept is static
    assert static_key(pa.Config(ppo=PPO(objective="decoupled", is_clip=4.0))) == static_key(pa.Config())
    ewma = [static_key(pa.Config(ppo=PPO(objective="decoupled", prox_ewma=d))) for d in (0.5, 0.99)]
    assert ewma[0] == ewma[1] != static_key(pa.Config())


def test_prox_ewma_moves_the_proximal_params_once_per_sgd_step():
    """One epoch of one minibatch: one Adam step, so prox = d * prox_0 + (1 - d) * params_1."""
    config = pa.Config(ppo=PPO(num_epochs=1, num_minibatches=1, objective="decoupled", prox_ewma=0.75), **SMALL)
    _, rctx, ctx = make_contexts(config)
    assert ctx.use_prox_ewma
    hp = learner.hyperparams_from_config(config)
    state = learner.init_train_state(ctx, jax.random.PRNGKey(0), rctx.env.obs_shape)
    for a, b in zip(jax.tree.leaves(state.prox_params), jax.tree.leaves(state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    _, traj = rollout(rctx, snapshot_of(state), envs.reset_envs(rctx.env, jax.random.PRNGKey(1), 4), jax.random.PRNGKey(2))
    update = jax.jit(lambda s, t, k, h: learner.ppo_update(ctx, s, t, k, h))
    new, metrics = update(state, traj, jax.random.PRNGKey(3), hp)
    moved = 0.0
    for prox, p0, p1 in zip(*(jax.tree.leaves(t) for t in (new.prox_params, state.params, new.params))):
        np.testing.assert_allclose(np.asarray(prox), 0.75 * np.asarray(p0) + 0.25 * np.asarray(p1), rtol=1e-6, atol=1e-7)
        moved = max(moved, float(np.max(np.abs(np.asarray(p1) - np.asarray(p0)))))
    assert moved > 1e-4
    # on-policy at the first step: pi_prox = mu, so every weight is 1 and nothing is truncated
    assert float(metrics["ess_fraction"]) == pytest.approx(1.0, abs=1e-5) and float(metrics["is_clip_fraction"]) == 0.0
    # no EWMA: the train state carries no proximal params (checkpoints keep their layout)
    _, _, plain = make_contexts(pa.Config(ppo=PPO(objective="decoupled"), **SMALL))
    assert learner.init_train_state(plain, jax.random.PRNGKey(0), rctx.env.obs_shape).prox_params is None


def test_one_compile_serves_both_objectives_and_lag_zero_decoupled_is_ppo():
    # a narrow clip, so that it is active: unclipped, w * pi / pi_prox = pi / mu and both objectives agree
    base = pa.Config(mode="simulated", total_env_steps=64 * 8, ppo=PPO(num_epochs=2, num_minibatches=2, clip_eps=0.01), **SMALL)
    df = pa.sweep(base, {"lag.K": [0, 4], "ppo.objective": ["ppo", "decoupled"]}, seeds=1, progress=False)
    assert df.attrs["compiles"] == 1
    runs = {(k, o): g.sort_values("iteration") for (k, o), g in df.groupby(["lag.K", "ppo.objective"])}
    # lag 0: the learner at the start of the iteration is the behaviour policy, so pi_prox = mu
    # (recomputed: equal to float rounding) and decoupled PPO is PPO
    for column in ("policy_loss", "approx_kl", "value_loss"):
        np.testing.assert_allclose(runs[(0, "decoupled")][column], runs[(0, "ppo")][column], rtol=2e-3, atol=1e-6)
    assert (runs[(0, "ppo")]["ess_fraction"] > 1.0 - 1e-6).all()
    # lag 4: the weights spread (ESS < 1; by little, after 8 small updates) and the objectives differ
    stale = runs[(4, "ppo")].iloc[4:]
    assert (stale["ess_fraction"] < 1.0 - 2e-5).all() and (stale["ess_fraction"] > 0.0).all()
    assert not np.allclose(runs[(4, "decoupled")]["policy_loss"].iloc[4:], stale["policy_loss"], rtol=1e-3)
    assert (stale["clip_fraction"] > runs[(4, "decoupled")]["clip_fraction"].iloc[4:].to_numpy()).all()  # mu is further away
    assert (runs[(4, "ppo")]["is_clip_fraction"] == 0.0).all()
    per_lag = runs[(4, "ppo")]["ess_fraction_per_lag"].iloc[-1]
    assert per_lag[4] == pytest.approx(runs[(4, "ppo")]["ess_fraction"].iloc[-1])  # every sample has lag 4
    assert all(v is None for v in per_lag[:4])


def test_decoupled_ewma_runs_in_threaded_mode_with_real_lag():
    config = pa.Config(mode="threaded", total_env_steps=64 * 12, ppo=PPO(num_epochs=2, num_minibatches=2,
                       objective="decoupled", prox_ewma=0.9),
                       num_samplers=3, threaded=pa.ThreadedConfig(sampler_step_latency_ms=(0.2, 0.2, 1.0)), **SMALL)
    rows = pa.train(config).metrics
    assert len(rows) == 12 and max(r["lag_max"] for r in rows) >= 1
    for r in rows:
        assert 0.0 < r["ess_fraction"] <= 1.0 + 1e-6 and 0.0 <= r["is_clip_fraction"] <= 1.0
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
