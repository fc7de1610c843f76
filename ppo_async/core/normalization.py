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

def chan_merge(
    count_a: chex.Array, mean_a: chex.Array, m2_a: chex.Array,
    count_b: chex.Array, mean_b: chex.Array, m2_b: chex.Array,
) -> tuple[chex.Array, chex.Array, chex.Array]:
    """Count, mean and M2 (sum of squared deviations from the mean) of the union of two disjoint
    sets of samples from each set's: the parallel algorithm of Chan, Golub & LeVeque (1979),

        n = n_a + n_b,  delta = mean_b - mean_a,  mean = mean_a + delta n_b / n,
        M2 = M2_a + M2_b + delta^2 n_a n_b / n.

    The library's one variance merge: `merge_moments` (running statistics) and
    `losses.pooled_moments` (advantage moments of several devices) call it. A side with count 0
    leaves the other's mean and M2; two empty sides give count 0, `mean_a` and M2 0.

    Args: counts, means and M2s of the two sets (counts broadcast against means and M2s: `[]`
      beside `[O...]`, or all `[...]`).
    Returns: `(count, mean, M2)` of the union.
    """
    total = count_a + count_b
    safe_total = jnp.maximum(total, 1.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * count_b / safe_total
    m2 = m2_a + m2_b + jnp.square(delta) * count_a * count_b / safe_total
    return total, mean, m2

def merge_moments(a: RunningMeanStd, b: RunningMeanStd) -> RunningMeanStd:
    """Combines two sets of moments (`chan_merge`, M2 = var * count).

    Merging with a zero-count side returns the other side unchanged.
    """
    total, mean, m2 = chan_merge(a.count, a.mean, a.var * a.count, b.count, b.mean, b.var * b.count)
    var = jnp.where(total > 0, m2 / total, 1.0)  # (counts are whole: total > 0 means total >= 1)
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
