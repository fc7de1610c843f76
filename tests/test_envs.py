"""Tests for `ppo_async.envs`: env facts, reset/step with auto-reset and episode accounting,
action clipping, running moments, observation normalisation, and no re-tracing from a reset."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async import envs
from ppo_async.config import ConfigError
from ppo_async.core.types import RunningMeanStd
from ppo_async.core import normalization


def scan_steps(env, num_envs: int, num_steps: int, seed: int, action_fn):
    """Resets `num_envs` envs and steps them `num_steps` times with `action_fn(key, N)`; returns
    the per-step `EnvStep`s and episode accumulators (after each step) stacked to `[T, N, ...]`."""

    @jax.jit
    def run(key):
        reset_key, key = jax.random.split(key)
        state0 = envs.reset_envs(env, reset_key, num_envs)

        def body(state, k):
            act_key, step_key = jax.random.split(k)
            state, step = envs.step_envs(env, state, action_fn(act_key, num_envs), step_key)
            return state, (step, state.episode_return, state.episode_length)

        _, out = jax.lax.scan(body, state0, jax.random.split(key, num_steps))
        return state0, out

    state0, (step, ep_return, ep_length) = run(jax.random.PRNGKey(seed))
    return jax.device_get((state0, step, ep_return, ep_length))


# --------------------------------------------------------------------------------------
# make_env
# --------------------------------------------------------------------------------------


def test_make_env_pendulum(pendulum):
    assert pendulum.name == "Pendulum-v1"
    assert not pendulum.discrete
    assert pendulum.num_actions == 0
    assert pendulum.obs_shape == (3,)
    assert pendulum.action_shape == (1,)
    np.testing.assert_array_equal(pendulum.action_low, [-2.0])
    np.testing.assert_array_equal(pendulum.action_high, [2.0])
    assert pendulum.action_low.dtype == np.float32


def test_make_env_cartpole(cartpole):
    assert cartpole.discrete
    assert cartpole.num_actions == 2
    assert cartpole.obs_shape == (4,)
    assert cartpole.action_shape == ()
    assert cartpole.action_low is None and cartpole.action_high is None


def test_make_env_unknown_name_lists_known():
    with pytest.raises(ConfigError) as info:
        envs.make_env("Pendulum-v0-typo")
    assert "Pendulum-v0-typo" in str(info.value) and "CartPole-v1" in str(info.value)


def test_env_equality_and_hash(pendulum):
    again = envs.make_env("Pendulum-v1")
    assert again == pendulum and hash(again) == hash(pendulum)
    assert envs.make_env("CartPole-v1") != pendulum


# --------------------------------------------------------------------------------------
# reset
# --------------------------------------------------------------------------------------


def test_reset_envs_distinct_and_reproducible(pendulum):
    state = envs.reset_envs(pendulum, jax.random.PRNGKey(0), 5)
    obs = np.asarray(state.obs)
    assert obs.shape == (5, 3) and obs.dtype == np.float32
    # every env has its own initial observation
    assert len({tuple(row) for row in obs.round(6)}) == 5
    # Pendulum obs = (cos th, sin th, th_dot) with th in [-pi, pi], th_dot in [-1, 1]
    np.testing.assert_allclose(obs[:, 0] ** 2 + obs[:, 1] ** 2, 1.0, rtol=1e-5)
    assert np.all(np.abs(obs[:, 2]) <= 1.0)
    np.testing.assert_array_equal(np.asarray(state.episode_return), np.zeros(5, np.float32))
    np.testing.assert_array_equal(np.asarray(state.episode_length), np.zeros(5, np.int32))
    assert state.episode_length.dtype == jnp.int32
    same = envs.reset_envs(pendulum, jax.random.PRNGKey(0), 5)
    np.testing.assert_array_equal(np.asarray(same.obs), obs)
    chex.assert_trees_all_equal(same.env_state, state.env_state)
    other = envs.reset_envs(pendulum, jax.random.PRNGKey(1), 5)
    assert not np.allclose(np.asarray(other.obs), obs)


def test_reset_leaves_are_strongly_typed(pendulum, cartpole):
    for env in (pendulum, cartpole):
        state = envs.reset_envs(env, jax.random.PRNGKey(0), 2)
        for leaf in jax.tree.leaves(state):
            assert not leaf.weak_type, (env.name, leaf)


# --------------------------------------------------------------------------------------
# step: auto-reset and episode accounting
# --------------------------------------------------------------------------------------


def test_pendulum_truncation_and_episode_accounting(pendulum):
    num_envs, num_steps = 3, 405
    uniform = lambda k, n: jax.random.uniform(k, (n, 1), minval=-3.0, maxval=3.0)  # noqa: E731
    state0, step, ep_return, ep_length = scan_steps(pendulum, num_envs, num_steps, 0, uniform)
    t_idx = np.arange(num_steps)
    ends = (t_idx + 1) % 200 == 0  # steps 200 and 400 (1-based) of every env
    assert ends.sum() == 2
    np.testing.assert_array_equal(step.truncated, np.repeat(ends[:, None], num_envs, axis=1))
    assert not step.terminated.any()
    assert step.reward.dtype == np.float32 and np.all(step.reward <= 0.0)

    # accumulate the episode return ourselves
    running = np.zeros(num_envs, np.float64)
    length = np.zeros(num_envs, np.int64)
    for t in range(num_steps):
        running += step.reward[t]
        length += 1
        if ends[t]:
            np.testing.assert_allclose(step.finished_return[t], running, rtol=1e-4)
            np.testing.assert_array_equal(step.finished_length[t], 200)
            running[:] = 0.0
            length[:] = 0
            np.testing.assert_array_equal(ep_return[t], 0.0)
            np.testing.assert_array_equal(ep_length[t], 0)
        else:
            np.testing.assert_array_equal(step.finished_return[t], 0.0)
            np.testing.assert_array_equal(step.finished_length[t], 0)
            np.testing.assert_allclose(ep_return[t], running, rtol=1e-4)
            np.testing.assert_array_equal(ep_length[t], length)

    # final_obs is the observation reached; it differs from obs only where the env auto-reset
    same = np.all(step.final_obs == step.obs, axis=-1)  # [T, N]
    np.testing.assert_array_equal(same, ~step.truncated)
    # the observation after a reset is a fresh start: |theta_dot| <= 1
    assert np.all(np.abs(step.obs[ends][..., 2]) <= 1.0)
    # while the reached states have long left that range (th_dot is clipped to +-8)
    assert np.max(np.abs(step.final_obs[ends][..., 2])) > 1.0
    assert np.all(np.abs(step.final_obs[..., 2]) <= 8.0)
    np.testing.assert_allclose(np.sum(step.final_obs[..., :2] ** 2, axis=-1), 1.0, rtol=1e-4)
    # the initial observations are fresh starts too
    assert np.all(np.abs(state0.obs[:, 2]) <= 1.0)


def test_pendulum_step_matches_gymnax_dynamics(pendulum):
    """One step by hand: theta_dot' = theta_dot + (3g/2l sin th + 3/(ml^2) u) dt, clipped to 8."""
    state = envs.reset_envs(pendulum, jax.random.PRNGKey(3), 2)
    th = np.asarray(state.env_state.theta, np.float64)
    thdot = np.asarray(state.env_state.theta_dot, np.float64)
    u = np.array([[1.5], [-2.0]], np.float32)
    _, step = jax.jit(lambda s, a, k: envs.step_envs(pendulum, s, a, k))(state, jnp.asarray(u), jax.random.PRNGKey(0))
    norm = ((th + np.pi) % (2 * np.pi)) - np.pi
    expected_reward = -(norm**2 + 0.1 * thdot**2 + 0.001 * u[:, 0] ** 2)
    np.testing.assert_allclose(np.asarray(step.reward), expected_reward, rtol=1e-5, atol=1e-6)
    new_thdot = np.clip(thdot + (15.0 * np.sin(th) + 3.0 * u[:, 0]) * 0.05, -8, 8)
    new_th = th + new_thdot * 0.05
    expected_obs = np.stack([np.cos(new_th), np.sin(new_th), new_thdot], axis=-1)
    np.testing.assert_allclose(np.asarray(step.obs), expected_obs, rtol=1e-5, atol=1e-5)


def test_cartpole_termination_accounting(cartpole):
    num_envs, num_steps = 4, 120
    random_action = lambda k, n: jax.random.randint(k, (n,), 0, 2)  # noqa: E731
    _, step, ep_return, ep_length = scan_steps(cartpole, num_envs, num_steps, 1, random_action)
    # random CartPole falls within ~10-60 steps: every env terminates at least once
    assert np.all(step.terminated.sum(axis=0) >= 1)
    assert not step.truncated.any()  # the 500-step limit is never reached
    np.testing.assert_array_equal(step.reward, 1.0)
    length = np.zeros(num_envs, np.int64)
    for t in range(num_steps):
        length += 1
        done = step.terminated[t]
        np.testing.assert_array_equal(step.finished_length[t], np.where(done, length, 0))
        # CartPole pays +1 per step, so the return equals the length
        np.testing.assert_allclose(step.finished_return[t], np.where(done, length, 0).astype(np.float32))
        length[done] = 0
        np.testing.assert_array_equal(ep_length[t], length)
        np.testing.assert_allclose(ep_return[t], length.astype(np.float32))
    same = np.all(step.final_obs == step.obs, axis=-1)
    np.testing.assert_array_equal(same, ~step.terminated)
    # a terminal observation is out of bounds: |x| > 2.4 or |theta| > 12 degrees
    final = step.final_obs[step.terminated]
    assert np.all((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 12 * 2 * np.pi / 360))


# --------------------------------------------------------------------------------------
# actions
# --------------------------------------------------------------------------------------


def test_env_action_clips_continuous_actions(pendulum, cartpole):
    action = jnp.array([[5.0], [-3.0], [0.5], [2.0]])
    np.testing.assert_array_equal(np.asarray(envs.env_action(pendulum, action, True)), [[2.0], [-2.0], [0.5], [2.0]])
    np.testing.assert_array_equal(np.asarray(envs.env_action(pendulum, action, False)), np.asarray(action))
    discrete = jnp.array([0, 1, 1])
    np.testing.assert_array_equal(np.asarray(envs.env_action(cartpole, discrete, True)), [0, 1, 1])
    host = np.asarray(action)  # a host sampler's action after device_get: clipped by NumPy, the same values
    clipped = envs.env_action(pendulum, host, True)
    assert type(clipped) is np.ndarray and clipped.dtype == np.float32
    np.testing.assert_array_equal(clipped, [[2.0], [-2.0], [0.5], [2.0]])


def test_step_with_out_of_bounds_action_equals_bound(pendulum):
    state = envs.reset_envs(pendulum, jax.random.PRNGKey(2), 2)
    step_fn = jax.jit(lambda s, a: envs.step_envs(pendulum, s, a, jax.random.PRNGKey(0)))
    _, big = step_fn(state, jnp.array([[7.0], [-9.0]]))
    _, bound = step_fn(state, jnp.array([[2.0], [-2.0]]))
    np.testing.assert_array_equal(np.asarray(big.obs), np.asarray(bound.obs))
    np.testing.assert_array_equal(np.asarray(big.reward), np.asarray(bound.reward))


# --------------------------------------------------------------------------------------
# running moments and normalisation
# --------------------------------------------------------------------------------------


def np_moments(x: np.ndarray, obs_ndim: int) -> RunningMeanStd:
    axes = tuple(range(x.ndim - obs_ndim))
    count = float(np.prod([x.shape[a] for a in axes]))
    return RunningMeanStd(
        mean=jnp.asarray(x.mean(axis=axes), jnp.float32),
        var=jnp.asarray(x.var(axis=axes), jnp.float32),
        count=jnp.asarray(count, jnp.float32),
    )


def test_init_obs_stats_is_identity_normaliser():
    stats = normalization.init_obs_stats((2, 3))
    np.testing.assert_array_equal(np.asarray(stats.mean), np.zeros((2, 3)))
    np.testing.assert_array_equal(np.asarray(stats.var), np.ones((2, 3)))
    assert float(stats.count) == 0.0
    obs = jnp.array([[[0.5, -2.0, 3.0], [1.0, 0.0, -7.0]]])
    np.testing.assert_allclose(np.asarray(normalization.normalize_obs(stats, obs, 10.0)), np.asarray(obs), rtol=1e-7)


def test_batch_moments_equal_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(5, 4, 3)).astype(np.float32)
    m = normalization.batch_moments(jnp.asarray(x), 1)
    np.testing.assert_allclose(np.asarray(m.mean), x.reshape(-1, 3).mean(0), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(m.var), x.reshape(-1, 3).var(0), rtol=1e-5)
    assert float(m.count) == 20.0
    m2 = normalization.batch_moments(jnp.asarray(x), 2)  # obs shape (4, 3): reduce over axis 0 only
    np.testing.assert_allclose(np.asarray(m2.var), x.var(0), rtol=1e-5)
    assert float(m2.count) == 5.0


def test_merge_moments_equals_moments_of_concatenation():
    rng = np.random.default_rng(1)
    a = rng.normal(1.0, 3.0, size=(37, 3))
    b = rng.normal(-4.0, 0.5, size=(11, 3))
    merged = normalization.merge_moments(np_moments(a, 1), np_moments(b, 1))
    both = np.concatenate([a, b])
    np.testing.assert_allclose(np.asarray(merged.mean), both.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(merged.var), both.var(0), rtol=1e-5)
    assert float(merged.count) == 48.0
    # merging is symmetric and associative (up to rounding)
    c = rng.normal(0.0, 1.0, size=(5, 3))
    left = normalization.merge_moments(normalization.merge_moments(np_moments(a, 1), np_moments(b, 1)), np_moments(c, 1))
    right = normalization.merge_moments(np_moments(c, 1), normalization.merge_moments(np_moments(b, 1), np_moments(a, 1)))
    all3 = np.concatenate([a, b, c])
    for m in (left, right):
        np.testing.assert_allclose(np.asarray(m.mean), all3.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.asarray(m.var), all3.var(0), rtol=1e-5)


def test_merge_moments_hand_values():
    # {1, 3} (mean 2, var 1) + {6} (mean 6, var 0) = {1, 3, 6}: mean 10/3, var 38/9
    a = RunningMeanStd(jnp.array([2.0]), jnp.array([1.0]), jnp.array(2.0))
    b = RunningMeanStd(jnp.array([6.0]), jnp.array([0.0]), jnp.array(1.0))
    m = normalization.merge_moments(a, b)
    np.testing.assert_allclose(np.asarray(m.mean), [10.0 / 3.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(m.var), [np.var([1.0, 3.0, 6.0])], rtol=1e-6)
    assert abs(np.var([1.0, 3.0, 6.0]) - 38.0 / 9.0) < 1e-12


def test_merge_with_zero_count_is_identity():
    rng = np.random.default_rng(2)
    x = rng.normal(5.0, 2.0, size=(9, 3))
    stats = np_moments(x, 1)
    empty = normalization.init_obs_stats((3,))
    for merged in (normalization.merge_moments(empty, stats), normalization.merge_moments(stats, empty)):
        np.testing.assert_allclose(np.asarray(merged.mean), np.asarray(stats.mean), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(merged.var), np.asarray(stats.var), rtol=1e-6)
        assert float(merged.count) == 9.0
    both_empty = normalization.merge_moments(empty, empty)
    np.testing.assert_array_equal(np.asarray(both_empty.mean), np.zeros(3))
    np.testing.assert_array_equal(np.asarray(both_empty.var), np.ones(3))
    assert float(both_empty.count) == 0.0


def test_normalize_obs_hand_values_and_clipping():
    stats = RunningMeanStd(mean=jnp.array([1.0, -2.0]), var=jnp.array([4.0, 0.25]), count=jnp.array(10.0))
    obs = jnp.array([[3.0, -2.5], [1.0, 100.0], [-100.0, -2.0]])
    out = np.asarray(normalization.normalize_obs(stats, obs, clip=5.0))
    # (3 - 1)/2 = 1, (-2.5 + 2)/0.5 = -1; (1 - 1)/2 = 0, (100 + 2)/0.5 = 204 -> 5; (-101)/2 -> -5, 0
    np.testing.assert_allclose(out, [[1.0, -1.0], [0.0, 5.0], [-5.0, 0.0]], rtol=1e-6, atol=1e-7)
    # disabled: the identity, even for values beyond the clip
    np.testing.assert_array_equal(np.asarray(normalization.normalize_obs(stats, obs, 5.0, enabled=False)), np.asarray(obs))
    # zero variance does not divide by zero: 1e-8 is added
    flat = RunningMeanStd(mean=jnp.zeros(1), var=jnp.zeros(1), count=jnp.array(3.0))
    np.testing.assert_allclose(np.asarray(normalization.normalize_obs(flat, jnp.array([[1e-5]]), 10.0)), [[0.1]], rtol=1e-4)


# --------------------------------------------------------------------------------------
# tracing
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Pendulum-v1", "CartPole-v1"])
def test_jitted_step_from_fresh_reset_does_not_retrace(name):
    """gymnax resets return weakly-typed leaves; a jitted step fed a fresh reset and then its own
    output must compile once (the weak-type pitfall)."""
    env = envs.make_env(name)
    traces = []

    def step(state, action, key):
        traces.append(1)
        return envs.step_envs(env, state, action, key)

    jitted = jax.jit(step)
    for reset in (lambda: envs.reset_envs(env, jax.random.PRNGKey(0), 3),
                  lambda: jax.jit(lambda k: envs.reset_envs(env, k, 3))(jax.random.PRNGKey(0))):
        state = reset()
        action = jnp.zeros((3, 1), jnp.float32) if not env.discrete else jnp.zeros((3,), jnp.int32)
        for i in range(3):
            state, _ = jitted(state, action, jax.random.PRNGKey(i))
    # eager reset, jitted reset and the step's own output all share one compilation
    assert len(traces) == 1, f"traced {len(traces)} times"
    # the same with chex's own counter (keyed by code location, so reset it per parameter)
    chex.clear_trace_counter()
    counted = jax.jit(chex.assert_max_traces(lambda s, a, k: envs.step_envs(env, s, a, k), n=1))
    state = envs.reset_envs(env, jax.random.PRNGKey(4), 3)
    for i in range(3):
        state, _ = counted(state, action, jax.random.PRNGKey(i))
