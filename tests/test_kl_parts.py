"""The KL to the behaviour policy split at the proximal policy (`diagnostics.kl_parts`):
staleness KL(mu -> pi_prox) and update size KL(pi_prox -> pi_theta), against hand-computed
values on fixed distributions, where they sum to `approx_kl` and where they do not; the parts
as the update measures them; and the KL controller's learning-rate scale reaching the
optimiser state, before and after a checkpoint round trip of the controller's state."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ppo_async import envs
from ppo_async.config import Config, NetworkConfig, PPOConfig, RolloutConfig
from ppo_async.core import kl_control, learner, losses
from ppo_async.core.learner.diagnostics import kl_parts
from ppo_async.core.networks import make_actor_critic
from ppo_async.core.rollout import RolloutContext, rollout
from ppo_async.core.types import snapshot_of
from ppo_async.modes.threaded.learner import controlled_hparams
from ppo_async.modes.threaded.resume import controller_from_json, controller_to_json

f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
LN2 = math.log(2.0)


def categorical_batch(*dists):
    """Log-probabilities, per distribution, of a batch whose actions come with the frequencies
    of the first (mu = (1/2, 1/4, 1/4): actions 0, 0, 1, 2), so a mean over the batch is the
    exact expectation under mu."""
    actions = np.array([0, 0, 1, 2])
    return [f32(np.log(np.asarray(d, np.float64)[actions])) for d in dists]


MU, PROX, PI = (0.5, 0.25, 0.25), (0.25, 0.5, 0.25), (0.25, 0.25, 0.5)


# --------------------------------------------------------------------------------------
# by hand
# --------------------------------------------------------------------------------------


def test_the_parts_on_three_categoricals_hand_values():
    """mu -> pi_prox -> pi_theta: KL(mu || prox) = ln 2 / 4 = KL(mu || pi); the update part
    on mu's samples is E_mu[r_u] - 1 - E_mu[log r_u] = 9/8 - 1 - 0 = 1/8 (not KL(prox || pi) =
    ln 2 / 4: the samples are mu's), and the cross term 1 - E_mu[r_u] = -1/8 makes up the total."""
    behaviour, prox, pi = categorical_batch(MU, PROX, PI)
    parts = kl_parts(pi, prox, behaviour)
    assert float(parts.staleness) == pytest.approx(LN2 / 4, rel=1e-6)
    assert float(parts.update) == pytest.approx(1 / 8, rel=1e-6)
    assert float(parts.cross) == pytest.approx(-1 / 8, rel=1e-5)
    total = float(losses.approx_kl(pi, behaviour))
    assert total == pytest.approx(LN2 / 4, rel=1e-6)
    assert float(parts.staleness + parts.update) == pytest.approx(LN2 / 4 + 1 / 8, rel=1e-6)  # not the total
    assert float(parts.staleness + parts.update + parts.cross) == pytest.approx(total, abs=1e-7)


def test_the_parts_sum_to_the_total_where_one_of_them_is_zero():
    behaviour, prox, pi = categorical_batch(MU, PROX, PI)
    fresh = kl_parts(pi, behaviour, behaviour)  # pi_prox = mu: no staleness
    assert float(fresh.staleness) == 0.0 and float(fresh.cross) == pytest.approx(0.0, abs=1e-7)
    assert float(fresh.update) == pytest.approx(float(losses.approx_kl(pi, behaviour)), abs=1e-7)
    unmoved = kl_parts(prox, prox, behaviour)  # pi_theta = pi_prox: no update yet
    assert float(unmoved.update) == 0.0 and float(unmoved.cross) == pytest.approx(0.0, abs=1e-7)
    assert float(unmoved.staleness) == pytest.approx(float(losses.approx_kl(prox, behaviour)), abs=1e-7)


def test_per_sample_terms_mask_and_the_cap():
    """Sample by sample the cross term is (r_s - 1)(r_u - 1); masked samples take no part; where
    approx_kl's cap on log r (20) binds, the parts still add up to it but the rest is no longer
    that product."""
    log_rs, log_ru = np.array([0.1, -0.3, 0.5]), np.array([0.2, 0.1, 2.0])
    behaviour = f32(np.zeros(3))
    prox, pi = f32(log_rs), f32(log_rs + log_ru)
    mask = f32([1.0, 1.0, 0.0])
    parts = kl_parts(pi, prox, behaviour, mask)
    k3 = lambda x: math.expm1(x) - x  # noqa: E731
    assert float(parts.staleness) == pytest.approx((k3(0.1) + k3(-0.3)) / 2, rel=1e-5)
    assert float(parts.update) == pytest.approx((k3(0.2) + k3(0.1)) / 2, rel=1e-5)
    cross = (math.expm1(0.1) * math.expm1(0.2) + math.expm1(-0.3) * math.expm1(0.1)) / 2
    assert float(parts.cross) == pytest.approx(cross, rel=1e-4)
    capped = kl_parts(f32([25.0]), f32([12.0]), f32([0.0]))  # log r = 25 > 20: the total is capped
    total = float(losses.approx_kl(f32([25.0]), f32([0.0])))
    assert float(capped.staleness + capped.update + capped.cross) == pytest.approx(total, rel=1e-5)
    assert float(capped.cross) == pytest.approx(k3(20.0) - k3(12.0) - k3(13.0), rel=1e-5)
    assert float(capped.cross) < math.expm1(12.0) * math.expm1(13.0) / 100  # the product would be e^25


def test_gaussian_mean_shifts_match_their_closed_forms():
    """mu = N(0, 1), pi_prox = N(d_s, 1), pi_theta = N(d_s + d_u, 1), expectations under mu on a
    fine grid of its quantiles: staleness d_s^2 / 2, total (d_s + d_u)^2 / 2, update
    exp(-d_s d_u) - 1 + (2 d_s d_u + d_u^2) / 2 and cross 1 - exp(-d_s d_u)."""
    d_s, d_u, n = 0.2, 0.1, 200_001
    a = stats.norm.ppf((np.arange(n) + 0.5) / n)
    log_n = lambda m: stats.norm.logpdf(a, loc=m)  # noqa: E731
    behaviour, prox, pi = (f32(log_n(m)) for m in (0.0, d_s, d_s + d_u))
    parts = kl_parts(pi, prox, behaviour)
    total = float(losses.approx_kl(pi, behaviour))
    assert float(parts.staleness) == pytest.approx(d_s ** 2 / 2, rel=1e-3)
    assert float(parts.update) == pytest.approx(math.exp(-d_s * d_u) - 1 + (2 * d_s * d_u + d_u ** 2) / 2, rel=1e-3)
    assert float(parts.cross) == pytest.approx(1 - math.exp(-d_s * d_u), rel=1e-3)
    assert total == pytest.approx((d_s + d_u) ** 2 / 2, rel=1e-3)


# --------------------------------------------------------------------------------------
# as the update measures them
# --------------------------------------------------------------------------------------

T, N = 8, 4
CONFIG = Config(
    env="Pendulum-v1", total_env_steps=4 * T * N,
    rollout=RolloutConfig(num_envs=N, num_steps=T),
    ppo=PPOConfig(num_epochs=2, num_minibatches=2, learning_rate=3e-3, anneal_lr=True),
    network=NetworkConfig(actor_hidden=(8,), critic_hidden=(8,)),
)
ENV = envs.make_env(CONFIG.env)
NETWORK = make_actor_critic(ENV, CONFIG.network)
LCTX = learner.make_learner_context(CONFIG, NETWORK)
HPARAMS = learner.hyperparams_from_config(CONFIG)
UPDATE = jax.jit(lambda s, t, k, h: learner.ppo_update(LCTX, s, t, k, h))


@pytest.fixture(scope="module")
def start():
    """(train state at version 0, a trajectory made by it)."""
    state = learner.init_train_state(LCTX, jax.random.PRNGKey(0), ENV.obs_shape)
    env_state = envs.reset_envs(ENV, jax.random.PRNGKey(1), N)
    rctx = RolloutContext(env=ENV, network=NETWORK, config=CONFIG.rollout)
    _, trajectory = jax.jit(lambda s, e, k: rollout(rctx, s, e, k))(snapshot_of(state), env_state, jax.random.PRNGKey(2))
    return state, trajectory


def test_the_update_reports_the_parts(start):
    """Lag 0 (the learner's own version and statistics): no staleness, the update part is the
    whole KL. The same batch again one version later (lag 1): the staleness part is the KL from
    the behaviour policy to the learner at the start of that iteration, and the three parts add
    up to approx_kl."""
    state, trajectory = start
    state1, fresh = UPDATE(state, trajectory, jax.random.PRNGKey(3), HPARAMS)
    assert abs(float(fresh["kl_staleness"])) < 1e-7 and abs(float(fresh["kl_cross"])) < 1e-7  # (recomputed log-probs round)
    assert float(fresh["kl_update"]) == pytest.approx(float(fresh["approx_kl"]), abs=1e-7) and float(fresh["kl_update"]) > 0
    _, stale = UPDATE(state1, trajectory, jax.random.PRNGKey(4), HPARAMS)
    view = learner.learner_view(LCTX, trajectory, state1.obs_stats, state1.reward_stats)
    batch = learner.compute_targets(LCTX, state1.params, view, HPARAMS, jnp.ones((T, N), jnp.int32))
    expected = float(losses.approx_kl(batch.prox_log_prob, batch.behavior_log_prob))  # equal minibatches: the batch mean
    assert float(stale["kl_staleness"]) == pytest.approx(expected, rel=1e-4) and expected > 0
    parts = float(stale["kl_staleness"] + stale["kl_update"] + stale["kl_cross"])
    assert parts == pytest.approx(float(stale["approx_kl"]), rel=1e-5, abs=1e-8)


def test_with_an_ewma_proximal_policy_the_parts_still_add_up(start):
    state, trajectory = start
    ctx = dataclasses.replace(LCTX, use_prox_ewma=True)
    hparams = HPARAMS._replace(prox_ewma=f32(0.5), decoupled=f32(1.0))
    update = jax.jit(lambda s, t, k, h: learner.ppo_update(ctx, s, t, k, h))
    ewma_state = learner.init_train_state(ctx, jax.random.PRNGKey(0), ENV.obs_shape)
    state1, _ = update(ewma_state, trajectory, jax.random.PRNGKey(3), hparams)
    _, metrics = update(state1, trajectory, jax.random.PRNGKey(4), hparams)
    parts = float(metrics["kl_staleness"] + metrics["kl_update"] + metrics["kl_cross"])
    assert parts == pytest.approx(float(metrics["approx_kl"]), rel=1e-5, abs=1e-8)
    assert float(metrics["kl_staleness"]) > 0 and float(metrics["kl_update"]) > 0


# --------------------------------------------------------------------------------------
# the learning-rate actuator and the optimiser state
# --------------------------------------------------------------------------------------


def test_the_lr_scale_reaches_the_optimiser_state_and_survives_a_round_trip(start):
    """The controller's scale multiplies the scheduled rate the update writes into the
    optimiser state (`with_step_hyperparams`); after the controller's state goes through the
    checkpoint's JSON and back, the learner's hyperparameters give the same rate again."""
    state, trajectory = start
    limits = kl_control.ControllerLimits(target=0.01, window=1, num_samplers=1, refresh_lag=1, max_lag=None,
                                         learning_rate=CONFIG.ppo.learning_rate)
    control = kl_control.initial_state(limits)
    control = kl_control.step(limits, control, kl_control.KlSample(0.5, 0.0, 0.5), 0, [1.0])  # update far over its aim
    assert control.lr_action == -1 and control.lr_scale == pytest.approx(1 / kl_control.LR_STEP_MAX)  # the largest step: 0.5 is 50x its aim
    scale = control.lr_scale
    restored = controller_from_json(json.loads(json.dumps(controller_to_json(control))))
    assert restored == control
    for ctl in (control, restored):
        hparams = controlled_hparams(HPARAMS, CONFIG, ctl)
        assert float(hparams.learning_rate) == pytest.approx(CONFIG.ppo.learning_rate * scale, rel=1e-6)
        new_state, metrics = UPDATE(state, trajectory, jax.random.PRNGKey(3), hparams)
        scheduled = float(learner.learning_rate_at(LCTX, HPARAMS, state.version))
        assert float(new_state.opt_state.hyperparams["learning_rate"]) == pytest.approx(scheduled * scale, rel=1e-6)
        assert float(metrics["learning_rate"]) == pytest.approx(scheduled * scale, rel=1e-6)
    unmoved = controlled_hparams(HPARAMS, CONFIG, kl_control.initial_state(limits))
    assert unmoved is HPARAMS  # a controller that has not moved the rate leaves the config's arrays
