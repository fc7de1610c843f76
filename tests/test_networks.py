"""Tests for `ppo_async.core.networks`: output shapes, parameter counts, std parameterisations,
and consistency of sample_action / log_prob / entropy / mode_action with the distributions."""

from __future__ import annotations

import math

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.core import networks
from ppo_async.config import ConfigError, NetworkConfig
from ppo_async.core.types import CategoricalDist, GaussianDist

SMALL = NetworkConfig(actor_hidden=(8, 8), critic_hidden=(8, 8))


def count_params(params) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def obs_batch(shape, seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


def test_gaussian_shapes_state_independent_std(pendulum):
    config = NetworkConfig(actor_hidden=(8, 8), critic_hidden=(8, 8), init_log_std=-0.5)
    net = networks.make_actor_critic(pendulum, config)
    assert not net.discrete and net.obs_shape == (3,)
    params = net.init(jax.random.PRNGKey(0))
    apply = jax.jit(net.apply)
    for batch in [(), (5,), (4, 3)]:
        dist, value = apply(params, obs_batch(batch + (3,)))
        assert isinstance(dist, GaussianDist)
        assert dist.mean.shape == batch + (1,)
        assert dist.log_std.shape == batch + (1,)  # broadcast to the mean's shape
        assert value.shape == batch
        # state-independent: exactly the initial log-std for every observation
        np.testing.assert_array_equal(np.asarray(dist.log_std), np.full(batch + (1,), -0.5, np.float32))
    np.testing.assert_array_equal(np.asarray(params["params"]["log_std"]), [-0.5])
    # the mean head is initialised with scale 0.01: actions start near 0
    dist, _ = apply(params, obs_batch((64, 3)))
    assert float(jnp.max(jnp.abs(dist.mean))) < 0.1


def test_gaussian_state_dependent_std(pendulum):
    config = NetworkConfig(actor_hidden=(8, 8), critic_hidden=(8, 8), state_dependent_std=True, init_log_std=-1.0)
    net = networks.make_actor_critic(pendulum, config)
    params = net.init(jax.random.PRNGKey(0))
    assert "log_std" not in params["params"]
    assert "log_std_head" in params["params"]
    np.testing.assert_array_equal(np.asarray(params["params"]["log_std_head"]["bias"]), [-1.0])
    dist, value = jax.jit(net.apply)(params, obs_batch((6, 3)))
    assert dist.mean.shape == (6, 1) and dist.log_std.shape == (6, 1) and value.shape == (6,)
    log_std = np.asarray(dist.log_std)
    # near the initial value (small orthogonal kernel, scale 0.01, tanh features of width 8)
    np.testing.assert_allclose(log_std, -1.0, atol=0.01 * math.sqrt(8) + 1e-6)
    # but a function of the state
    assert np.ptp(log_std) > 0


def test_weight_init_orthogonal_gains_and_lecun_default(pendulum):
    """network.init: orthogonal kernels with the PPO gains (sqrt 2 hidden, 0.01 policy head, 1 value
    head: K^T K = gain^2 I for a tall kernel) or Flax's LeCun-normal (variance 1 / fan_in); zero
    biases in both; the same parameter tree either way (checkpoints do not care)."""
    wide = dict(actor_hidden=(256, 128), critic_hidden=(256, 128))
    ortho = networks.make_actor_critic(pendulum, NetworkConfig(**wide)).init(jax.random.PRNGKey(0))["params"]
    lecun = networks.make_actor_critic(pendulum, NetworkConfig(**wide, init="lecun")).init(jax.random.PRNGKey(0))["params"]
    assert jax.tree.structure(ortho) == jax.tree.structure(lecun)
    hidden = np.asarray(ortho["actor_torso"]["Dense_1"]["kernel"])  # [256, 128]: orthonormal columns x sqrt 2
    np.testing.assert_allclose(hidden.T @ hidden, 2.0 * np.eye(128), atol=1e-4)
    head = np.asarray(ortho["actor_head"]["kernel"])  # [128, 1]
    np.testing.assert_allclose(np.linalg.norm(head), 0.01, rtol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(ortho["critic_head"]["kernel"])), 1.0, rtol=1e-4)
    for name in ("actor_head", "critic_head"):  # LeCun-normal: each entry ~ N(0, 1 / fan_in), fan_in = 128
        kernel = np.asarray(lecun[name]["kernel"])
        assert 0.3 / math.sqrt(128) < np.linalg.norm(kernel) / math.sqrt(kernel.size) < 3 / math.sqrt(128)
    big = np.asarray(lecun["actor_torso"]["Dense_1"]["kernel"])
    np.testing.assert_allclose(big.std(), 1 / math.sqrt(256), rtol=0.05)
    assert not np.allclose(big.T @ big, 2.0 * np.eye(128), atol=0.1)
    for params in (ortho, lecun):
        assert all(float(np.abs(b).max()) == 0.0 for path, b in jax.tree_util.tree_leaves_with_path(params)
                   if "bias" in jax.tree_util.keystr(path))


def test_log_std_is_clamped(pendulum):
    net = networks.make_actor_critic(pendulum, SMALL)
    params = net.init(jax.random.PRNGKey(0))
    params = flax.core.unfreeze(params)
    params["params"]["log_std"] = jnp.array([5.0])
    dist, _ = net.apply(params, obs_batch((2, 3)))
    np.testing.assert_array_equal(np.asarray(dist.log_std), 2.0)
    params["params"]["log_std"] = jnp.array([-30.0])
    dist, _ = net.apply(params, obs_batch((2, 3)))
    np.testing.assert_array_equal(np.asarray(dist.log_std), -20.0)


def test_categorical_shapes(cartpole):
    net = networks.make_actor_critic(cartpole, SMALL)
    assert net.discrete and net.obs_shape == (4,)
    params = net.init(jax.random.PRNGKey(0))
    for batch in [(), (7,), (3, 2)]:
        dist, value = net.apply(params, obs_batch(batch + (4,)))
        assert isinstance(dist, CategoricalDist)
        assert dist.logits.shape == batch + (2,)
        assert value.shape == batch
    # logits head scale 0.01: the initial policy is nearly uniform
    dist, _ = net.apply(params, obs_batch((32, 4)))
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(dist.logits)), 0.5, atol=0.05)


def test_param_counts_and_shared_torso(pendulum, cartpole):
    # Pendulum, obs 3, hidden (8, 8), A = 1
    # actor torso 3*8+8 + 8*8+8 = 104; critic torso 104; value head 9; mean head 9; log_std 1
    separate = networks.make_actor_critic(pendulum, SMALL)
    assert count_params(separate.init(jax.random.PRNGKey(0))) == 227
    shared = networks.make_actor_critic(
        pendulum, NetworkConfig(actor_hidden=(8, 8), critic_hidden=(8, 8), shared_torso=True)
    )
    shared_params = shared.init(jax.random.PRNGKey(0))
    assert count_params(shared_params) == 123  # no critic torso
    assert "critic_torso" not in shared_params["params"]
    # critic_hidden is ignored with a shared torso
    shared_other = networks.make_actor_critic(
        pendulum, NetworkConfig(actor_hidden=(8, 8), critic_hidden=(32,), shared_torso=True)
    )
    assert count_params(shared_other.init(jax.random.PRNGKey(0))) == 123
    # CartPole obs 4, K = 2, actor (16,), critic (4, 4):
    # actor 4*16+16 = 80; critic 4*4+4 + 4*4+4 = 40; value 4+1 = 5; logits 16*2+2 = 34 -> 159
    cp = networks.make_actor_critic(cartpole, NetworkConfig(actor_hidden=(16,), critic_hidden=(4, 4)))
    assert count_params(cp.init(jax.random.PRNGKey(0))) == 159


@pytest.mark.parametrize("activation", ["tanh", "relu", "gelu", "silu"])
def test_value_matches_numpy_forward_pass(cartpole, activation):
    """V(s) = w_v . act(W s + b) + b_v with the critic torso's single hidden layer (width 8)."""
    net = networks.make_actor_critic(cartpole, NetworkConfig(actor_hidden=(6,), critic_hidden=(8,), activation=activation))
    params = net.init(jax.random.PRNGKey(0))
    obs = obs_batch((4, 4)) * 2.0
    _, value = net.apply(params, obs)
    p = params["params"]
    (layer,) = p["critic_torso"].values()
    # the value head is the only top-level layer reading 8 features into 1 output
    (head,) = [v for k, v in p.items() if "torso" not in k and v["kernel"].shape == (8, 1)]
    act = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0),
           "gelu": lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
           "silu": lambda x: x / (1.0 + np.exp(-x))}[activation]
    h = act(np.asarray(obs, np.float64) @ np.asarray(layer["kernel"]) + np.asarray(layer["bias"]))
    expected = h @ np.asarray(head["kernel"])[:, 0] + np.asarray(head["bias"])[0]
    np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-5, atol=1e-5)


def test_init_is_deterministic_in_the_key(pendulum):
    net = networks.make_actor_critic(pendulum, SMALL)
    a, b, c = (net.init(jax.random.PRNGKey(k)) for k in (0, 0, 1))
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    assert not all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(c)))


# --------------------------------------------------------------------------------------
# distribution helpers
# --------------------------------------------------------------------------------------


def test_categorical_log_prob_of_samples_is_log_softmax(cartpole):
    net = networks.make_actor_critic(cartpole, SMALL)
    params = net.init(jax.random.PRNGKey(1))
    dist, _ = net.apply(params, obs_batch((50, 4), seed=3) * 3.0)
    # make the logits far from uniform so the check is not trivial
    dist = CategoricalDist(dist.logits * 100.0 + jnp.array([0.3, -0.2]))
    action = networks.sample_action(jax.random.PRNGKey(2), dist)
    assert action.shape == (50,) and action.dtype == jnp.int32
    lp = np.asarray(networks.log_prob(dist, action))
    log_softmax = np.asarray(jax.nn.log_softmax(dist.logits))
    expected = log_softmax[np.arange(50), np.asarray(action)]
    np.testing.assert_allclose(lp, expected, rtol=1e-6, atol=1e-6)
    # entropy = -sum p log p
    p = np.exp(log_softmax)
    np.testing.assert_allclose(np.asarray(networks.entropy(dist)), -(p * log_softmax).sum(-1), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(networks.mode_action(dist)), np.argmax(np.asarray(dist.logits), -1))


def test_categorical_sample_frequencies():
    logits = jnp.log(jnp.array([0.2, 0.5, 0.3]))
    dist = CategoricalDist(jnp.broadcast_to(logits, (40_000, 3)))
    action = np.asarray(networks.sample_action(jax.random.PRNGKey(0), dist))
    freq = np.bincount(action, minlength=3) / action.size
    # standard error sqrt(0.25 / 40000) = 0.0025; allow 4 sigma
    np.testing.assert_allclose(freq, [0.2, 0.5, 0.3], atol=0.01)
    np.testing.assert_allclose(float(networks.entropy(CategoricalDist(logits))),
                               -(0.2 * math.log(0.2) + 0.5 * math.log(0.5) + 0.3 * math.log(0.3)), rtol=1e-6)


def test_gaussian_sample_moments_and_log_prob():
    mean = jnp.array([1.5, -0.5])
    log_std = jnp.log(jnp.array([0.5, 2.0]))
    n = 50_000
    dist = GaussianDist(jnp.broadcast_to(mean, (n, 2)), jnp.broadcast_to(log_std, (n, 2)))
    action = networks.sample_action(jax.random.PRNGKey(0), dist)
    assert action.shape == (n, 2) and action.dtype == jnp.float32
    a = np.asarray(action, np.float64)
    # standard errors: std / sqrt(n) = 0.0022 / 0.0089 for the means
    np.testing.assert_allclose(a.mean(0), [1.5, -0.5], atol=0.04)
    np.testing.assert_allclose(a.std(0), [0.5, 2.0], rtol=0.02)
    # log_prob: independent normals, summed over the action axis
    sigma = np.array([0.5, 2.0])
    ref = np.sum(-0.5 * ((a - [1.5, -0.5]) / sigma) ** 2 - np.log(sigma) - 0.5 * math.log(2 * math.pi), axis=-1)
    np.testing.assert_allclose(np.asarray(networks.log_prob(dist, action)), ref, rtol=1e-5, atol=1e-4)
    # entropy: sum(log sigma) + A/2 (1 + log 2 pi); and the Monte-Carlo estimate -E[log p] agrees
    expected_h = math.log(0.5) + math.log(2.0) + (1 + math.log(2 * math.pi))
    np.testing.assert_allclose(np.asarray(networks.entropy(dist))[:3], expected_h, rtol=1e-6)
    assert abs(-ref.mean() - expected_h) < 0.02
    np.testing.assert_array_equal(np.asarray(networks.mode_action(dist)), np.asarray(dist.mean))


def test_network_dist_sample_roundtrip(pendulum):
    """Samples from the network's own Gaussian: log_prob is highest at the mean."""
    net = networks.make_actor_critic(pendulum, NetworkConfig(actor_hidden=(8,), critic_hidden=(8,), init_log_std=-1.0))
    params = net.init(jax.random.PRNGKey(0))
    dist, _ = net.apply(params, obs_batch((10, 3)))
    action = networks.sample_action(jax.random.PRNGKey(1), dist)
    assert action.shape == (10, 1)
    at_mean = networks.log_prob(dist, dist.mean)
    # log N(mu; mu, sigma) = -log sigma - log(2 pi)/2 with log sigma = -1
    np.testing.assert_allclose(np.asarray(at_mean), 1.0 - 0.5 * math.log(2 * math.pi), rtol=1e-6)
    assert np.all(np.asarray(networks.log_prob(dist, action)) < np.asarray(at_mean))


def test_bounded_mean_hand_values():
    raw = jnp.array([[0.0, 0.5], [50.0, -50.0]])
    out = np.asarray(networks.bounded(raw, (-1.0, 0.0), (3.0, 1.0)))
    # centre (1, 0.5), half range (2, 0.5)
    np.testing.assert_allclose(out, [[1.0, 0.5 + 0.5 * math.tanh(0.5)], [3.0, 0.0]], rtol=1e-6)


def test_bounded_mean_keeps_the_mean_inside_the_bounds_and_log_probs_exact(pendulum, cartpole):
    net = networks.make_actor_critic(pendulum, NetworkConfig(actor_hidden=(8,), critic_hidden=(8,), bounded_mean=True))
    params = net.init(jax.random.PRNGKey(0))
    big = jax.tree.map(lambda x: x * 1e4, params)  # drives an unbounded mean far outside [-2, 2]
    dist, _ = net.apply(big, obs_batch((64, 3)))
    mean = np.asarray(dist.mean)
    assert np.all(np.abs(mean) <= 2.0) and np.abs(mean).max() > 1.9  # Pendulum's torque bounds are +-2
    unbounded = networks.make_actor_critic(pendulum, NetworkConfig(actor_hidden=(8,), critic_hidden=(8,)))
    raw, _ = unbounded.apply(big, obs_batch((64, 3)))  # the same params: the raw mean
    np.testing.assert_allclose(mean, 2.0 * np.tanh(np.asarray(raw.mean)), rtol=1e-5, atol=1e-6)
    action = jnp.full((64, 1), 2.5)  # outside the bounds: still a Gaussian sample's value
    std = np.exp(np.asarray(dist.log_std))
    want = -0.5 * ((2.5 - mean) / std) ** 2 - np.log(std) - 0.5 * math.log(2 * math.pi)
    np.testing.assert_allclose(np.asarray(networks.log_prob(dist, action)), want[:, 0], rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(networks.mode_action(dist)), mean)
    with pytest.raises(ConfigError, match=r"network.bounded_mean = True has no effect: CartPole-v1 has discrete actions"):
        networks.make_actor_critic(cartpole, NetworkConfig(bounded_mean=True))
