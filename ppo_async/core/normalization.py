"""Running observation normalisation: moments of batches, merged exactly across batches
(Chan, Golub & LeVeque 1979), and the clipped normaliser applied to policy inputs.

Shapes: `O...` = observation shape; a batch `[..., O...]` is reduced over its leading axes.
"""

from __future__ import annotations

import chex
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
