"""Running observation and reward normalisation: moments of batches, merged exactly across
batches (Chan, Golub & LeVeque 1979), the clipped normaliser applied to policy inputs, and
rewards scaled by the running standard deviation of the discounted return (the reward
normalisation of PPO's reference implementations: OpenAI baselines' `VecNormalize`, kept by
CleanRL and Stable-Baselines3; its effect on MuJoCo is measured by Engstrom et al. 2020,
"Implementation Matters in Deep RL", arXiv:2005.12729).

Shapes: `O...` = observation shape; a batch `[..., O...]` is reduced over its leading axes.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.core.types import RunningMeanStd


def init_obs_stats(obs_shape: tuple[int, ...]) -> RunningMeanStd:
    """Statistics of no data: mean 0, var 1, count 0 (normalisation is the identity at first)."""
    return RunningMeanStd(
        mean=jnp.zeros(obs_shape, jnp.float32),
        var=jnp.ones(obs_shape, jnp.float32),
        count=jnp.zeros((), jnp.float32),
    )

def batch_moments(obs: chex.Array, obs_ndim: int) -> RunningMeanStd:
    """Mean, (population) variance and count of a batch `[..., O...]` over its leading axes."""
    axes = tuple(range(obs.ndim - obs_ndim))
    count = float(np.prod([obs.shape[a] for a in axes]))
    return RunningMeanStd(
        mean=jnp.mean(obs, axis=axes),
        var=jnp.var(obs, axis=axes),
        count=jnp.asarray(count, jnp.float32),
    )

def merge_moments(a: RunningMeanStd, b: RunningMeanStd) -> RunningMeanStd:
    """Combines two sets of moments (parallel algorithm of Chan, Golub & LeVeque 1979).

    Merging with a zero-count side returns the other side unchanged.
    """
    total = a.count + b.count
    safe_total = jnp.maximum(total, 1.0)
    delta = b.mean - a.mean
    mean = a.mean + delta * b.count / safe_total
    m2 = a.var * a.count + b.var * b.count + jnp.square(delta) * a.count * b.count / safe_total
    var = jnp.where(total > 0, m2 / safe_total, 1.0)
    # With no data at all keep the identity normaliser.
    return RunningMeanStd(mean=jnp.where(total > 0, mean, 0.0), var=var, count=total)

def normalize_obs(stats: RunningMeanStd, obs: chex.Array, clip: float, enabled: bool = True) -> chex.Array:
    """(obs - mean) / sqrt(var + 1e-8), clipped to [-clip, clip]; identity when disabled."""
    if not enabled:
        return obs
    return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + 1e-8), -clip, clip)


def init_reward_stats() -> RunningMeanStd:
    """Moments of no discounted returns (scalars): normalising rewards is the identity at first."""
    return init_obs_stats(())


def discounted_return_step(
    running_return: chex.Array, reward: chex.Array, done: chex.Array, gamma: float | chex.Array
) -> tuple[chex.Array, chex.Array]:
    """One step of each env's discounted return, the quantity whose variance scales rewards.

    G_t = gamma * G_{t-1} + r_t, and G restarts from 0 after an episode ends (terminated or
    truncated), as baselines' `VecNormalize` does.

    Args: `running_return` `[N]` G_{t-1} (0 at an episode's start), `reward` `[N]` raw r_t,
      `done` `[N]` bool, the episode ended at t.
    Returns: `(G_t [N], the carry for step t + 1 [N])`.
    """
    discounted = gamma * running_return + reward
    return discounted, jnp.where(done, 0.0, discounted)


def discounted_returns(
    running_return: chex.Array, reward: chex.Array, done: chex.Array, gamma: float | chex.Array
) -> tuple[chex.Array, chex.Array]:
    """`discounted_return_step` over T steps: `(G [T, N], the carry after step T [N])` from the
    carry before the first step `[N]` and rewards / done flags `[T, N]`."""
    def body(carry: chex.Array, step: tuple[chex.Array, chex.Array]) -> tuple[chex.Array, chex.Array]:
        discounted, carry = discounted_return_step(carry, step[0], step[1], gamma)
        return carry, discounted

    carry, discounted = jax.lax.scan(body, jnp.asarray(running_return, jnp.float32), (reward, done))
    return discounted, carry


def normalize_reward(stats: RunningMeanStd, reward: chex.Array, clip: float, enabled: bool = True) -> chex.Array:
    """r / sqrt(var(G) + 1e-8), clipped to [-clip, clip]; identity when disabled.

    `stats` are the moments of the discounted return G (`discounted_return_step`); only its
    variance is used (rewards are scaled, not centred, so their sign and the optimal policy
    stay as they are).
    """
    if not enabled:
        return reward
    return jnp.clip(reward / jnp.sqrt(stats.var + 1e-8), -clip, clip)
