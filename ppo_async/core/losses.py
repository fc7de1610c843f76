"""Pure, jittable loss functions for (asynchronous) PPO.

Every function here is side-effect free, batched over arbitrary leading dimensions,
and takes its hyperparameters as plain arguments (which may be traced values, so a
sweep can vmap over them). Callers bind hyperparameters with `functools.partial`.

Conventions (see DESIGN.md):
  * time-major shapes `[T, N, ...]`;
  * `behavior_log_prob` is the log-probability of the stored action under the
    params snapshot that produced it (the behaviour policy);
  * `r = exp(log_prob - behavior_log_prob)` is the importance ratio pi_theta / pi_behaviour.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import math

import chex
import jax
import jax.numpy as jnp

from ppo_async.core import normalization

LOG_STD_MIN = -20.0
LOG_STD_MAX = 2.0
_LOG_2PI = math.log(2.0 * math.pi)
# Upper bound on log(pi / mu) inside the policy objectives: exp(88) ~ 1.65e38 is still finite
# in float32 (max ~3.4e38), so the objectives are unchanged wherever the ratio is representable.
# Without it, r = exp(>= 88.73) = inf and the backward pass of a *clipped* branch computes
# 0 * inf = NaN, although the true gradient there is exactly 0.
_LOG_RATIO_MAX = 88.0
# Upper bound on log(pi / mu) inside `approx_kl` (a diagnostic): exp(20) ~ 4.9e8 per sample
# leaves room to sum ~1e29 samples in float32 without overflowing to inf.
_KL_LOG_RATIO_MAX = 20.0


# --------------------------------------------------------------------------------------
# Distributions
# --------------------------------------------------------------------------------------


def clamp_log_std(log_std: chex.Array) -> chex.Array:
    """Clamps a Gaussian log standard deviation to [LOG_STD_MIN, LOG_STD_MAX] = [-20, 2]."""
    return jnp.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


def gaussian_log_prob(mean: chex.Array, log_std: chex.Array, action: chex.Array) -> chex.Array:
    """Log-density of a diagonal Gaussian, summed over the last (action) axis.

    log N(a; mu, sigma) = sum_i [ -(a_i - mu_i)^2 / (2 sigma_i^2) - log sigma_i - log(2 pi) / 2 ]

    `log_std` is clamped to [-20, 2] first.

    Args:
      mean: `[..., A]` Gaussian means.
      log_std: `[..., A]` (or broadcastable, e.g. `[A]`) log standard deviations.
      action: `[..., A]` actions.

    Returns:
      `[...]` log-densities.
    """
    chex.assert_equal_shape([mean, action])
    log_std = clamp_log_std(log_std)
    z = (action - mean) * jnp.exp(-log_std)
    log_std = jnp.broadcast_to(log_std, mean.shape)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * _LOG_2PI, axis=-1)


def gaussian_entropy(log_std: chex.Array) -> chex.Array:
    """Entropy of a diagonal Gaussian, summed over the last axis.

    H = sum_i [ log sigma_i + (1 + log 2 pi) / 2 ], with `log_std` clamped to [-20, 2].

    Args:
      log_std: `[..., A]` log standard deviations.

    Returns:
      `[...]` entropies.
    """
    log_std = clamp_log_std(log_std)
    return jnp.sum(log_std + 0.5 * (1.0 + _LOG_2PI), axis=-1)


def gaussian_sample(key: chex.PRNGKey, mean: chex.Array, log_std: chex.Array) -> chex.Array:
    """Samples `mean + exp(log_std) * eps`, eps ~ N(0, I); `[..., A]` -> `[..., A]`."""
    log_std = jnp.broadcast_to(clamp_log_std(log_std), mean.shape)
    return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape, mean.dtype)


def categorical_log_prob(logits: chex.Array, action: chex.Array) -> chex.Array:
    """Log-probability of integer actions under a categorical distribution.

    Args:
      logits: `[..., K]` unnormalised log-probabilities.
      action: `[...]` integer actions in [0, K).

    Returns:
      `[...]` log-probabilities.
    """
    chex.assert_rank(logits, action.ndim + 1)
    chex.assert_equal_shape_prefix([logits, action], action.ndim)  # no silent broadcasting
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_p, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def categorical_entropy(logits: chex.Array) -> chex.Array:
    """Entropy -sum_k p_k log p_k of a categorical; `[..., K]` -> `[...]`.

    Actions masked out with a logit of -inf (p_k = 0) contribute 0 (the limit of p log p), so
    the result is the entropy of the remaining actions, and so is its gradient (finite; the
    masked logits get none). A row whose logits are all -inf has no distribution: NaN.
    """
    log_p = jax.nn.log_softmax(logits, axis=-1)
    p = jnp.exp(log_p)
    safe_log_p = jnp.where(p > 0, log_p, 0.0)  # 0 * -inf would be NaN, in the value and the gradient
    return -jnp.sum(p * safe_log_p, axis=-1)


def categorical_sample(key: chex.PRNGKey, logits: chex.Array) -> chex.Array:
    """Samples integer actions; `[..., K]` -> `[...]` int32."""
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


# --------------------------------------------------------------------------------------
# Advantage estimation
# --------------------------------------------------------------------------------------


def gae(
    rewards: chex.Array,
    values: chex.Array,
    dones: chex.Array,
    last_value: chex.Array,
    gamma: float | chex.Array,
    gae_lambda: float | chex.Array,
) -> tuple[chex.Array, chex.Array]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438).

    delta_t = r_t + gamma * (1 - d_t) * V(s_{t+1}) - V(s_t)
    A_t     = delta_t + gamma * lambda * (1 - d_t) * A_{t+1}

    `dones[t] = 1` means the episode ended at step t: nothing is bootstrapped across it.
    (A time-limit truncation is handled upstream by folding gamma * V(final_obs) into
    the reward, see `rollout.py`, so it can be marked done here.)

    Args:
      rewards: `[T, ...]` r_t.
      values: `[T, ...]` V(s_t).
      dones: `[T, ...]` 1.0 where the episode ended at step t.
      last_value: `[...]` V(s_T), the value after the last step.
      gamma: discount.
      gae_lambda: GAE lambda.

    Returns:
      `(advantages, returns)`, both `[T, ...]`, with `returns = advantages + values`.
    """
    chex.assert_equal_shape([rewards, values, dones])
    chex.assert_equal_shape([values[0], last_value])
    not_done = 1.0 - dones.astype(values.dtype)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    deltas = rewards + gamma * not_done * next_values - values

    def step(carry, inputs):
        delta_t, not_done_t = inputs
        advantage_t = delta_t + gamma * gae_lambda * not_done_t * carry
        return advantage_t, advantage_t

    _, advantages = jax.lax.scan(
        step, jnp.zeros_like(last_value), (deltas, not_done), reverse=True
    )
    return advantages, advantages + values


def vtrace_advantages(
    rewards: chex.Array,
    values: chex.Array,
    dones: chex.Array,
    last_value: chex.Array,
    log_rho: chex.Array,
    gamma: float | chex.Array,
    gae_lambda: float | chex.Array,
    rho_bar: float | chex.Array = 1.0,
    c_bar: float | chex.Array = 1.0,
) -> tuple[chex.Array, chex.Array]:
    """Advantages with truncated importance weights (V-trace, Espeholt et al. 2018, arXiv:1802.01561).

    With rho_t = min(rho_bar, pi/mu), c_t = lambda * min(c_bar, pi/mu):
      delta_t = rho_t * (r_t + gamma (1 - d_t) V(s_{t+1}) - V(s_t))
      v_s - V(s) = delta_s + gamma (1 - d_s) c_s (v_{s+1} - V(s_{s+1}))
    Policy-gradient advantage: A_t = r_t + gamma (1 - d_t) v_{t+1} - V(s_t) (scaled by
    rho_t inside the PPO ratio, so it is *not* multiplied by rho_t here).
    With pi = mu and lambda = 1 the value targets v_s equal GAE(lambda=1) returns.

    Args:
      rewards, values, dones: `[T, ...]` as in `gae`.
      last_value: `[...]` V(s_T).
      log_rho: `[T, ...]` log(pi_theta / pi_behaviour) of the stored actions (no gradient).
      gamma, gae_lambda: discount and trace decay.
      rho_bar, c_bar: truncation levels (>= 0).

    Returns:
      `(advantages, value_targets)`, both `[T, ...]`.
    """
    chex.assert_equal_shape([rewards, values, dones, log_rho])
    chex.assert_equal_shape([values[0], last_value])
    rho = jnp.exp(jax.lax.stop_gradient(log_rho))
    clipped_rho = jnp.minimum(rho_bar, rho)
    cs = gae_lambda * jnp.minimum(c_bar, rho)
    not_done = 1.0 - dones.astype(values.dtype)
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    deltas = clipped_rho * (rewards + gamma * not_done * next_values - values)

    def step(carry, inputs):
        delta_t, not_done_t, c_t = inputs
        diff_t = delta_t + gamma * not_done_t * c_t * carry
        return diff_t, diff_t

    _, diffs = jax.lax.scan(
        step, jnp.zeros_like(last_value), (deltas, not_done, cs), reverse=True
    )
    value_targets = diffs + values
    next_targets = jnp.concatenate([value_targets[1:], last_value[None]], axis=0)
    advantages = rewards + gamma * not_done * next_targets - values
    return advantages, value_targets


# --------------------------------------------------------------------------------------
# Policy losses
# --------------------------------------------------------------------------------------


def masked_mean(x: chex.Array, mask: chex.Array | None) -> chex.Array:
    """mean(x) over samples with mask 1 (all samples when mask is None); 0 when none is kept."""
    if mask is None:
        return jnp.mean(x)
    mask = mask.astype(x.dtype)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def ppo_clip_objective(
    log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
) -> chex.Array:
    """Per-sample PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), to maximise.

    min(r * A, clip(r, 1 - eps, 1 + eps) * A),  r = exp(log_prob - behavior_log_prob).

    The log ratio is capped at 88 (e^88 is the largest integer power of e finite in float32),
    so a huge stale ratio yields a zero, not NaN, gradient where a clip is active.

    Args: all `[...]` of equal shape; `clip_eps` a scalar.
    Returns: `[...]` per-sample objective.
    """
    chex.assert_equal_shape([log_prob, behavior_log_prob, advantages])
    ratio = jnp.exp(jnp.minimum(log_prob - behavior_log_prob, _LOG_RATIO_MAX))
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return jnp.minimum(ratio * advantages, clipped_ratio * advantages)


def ppo_clip_loss(
    log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
    mask: chex.Array | None = None,
) -> chex.Array:
    """PPO clipped policy loss (Schulman et al. 2017), a scalar to minimise.

    L = -mean(min(r * A, clip(r, 1 - eps, 1 + eps) * A)),  r = exp(log_prob - behavior_log_prob).

    Args:
      log_prob: `[...]` log pi_theta(a|s) (differentiated).
      behavior_log_prob: `[...]` log pi_behaviour(a|s) from the sampling snapshot.
      advantages: `[...]` advantage estimates (treated as constants).
      clip_eps: clip range eps > 0.
      mask: optional `[...]` 0/1 weights (e.g. samples dropped as stale); mean over kept ones.

    Returns:
      scalar loss.
    """
    return -masked_mean(ppo_clip_objective(log_prob, behavior_log_prob, advantages, clip_eps), mask)


def dual_clip_ppo_objective(
    log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
    dual_clip: float | chex.Array,
) -> chex.Array:
    """Per-sample dual-clip PPO objective (Ye et al. 2020, arXiv:1912.09729), to maximise.

    Where A >= 0 it equals the PPO clip objective; where A < 0 it is
    max(min(r * A, clip(r, 1 - eps, 1 + eps) * A), c * A), bounding how negative the
    objective of one sample can get when a stale sample has a huge ratio r.
    The `A < 0` mask matters: applying the outer max for A >= 0 would zero the gradient
    of every sample with r * A > c * A.

    Args: all `[...]` of equal shape; `clip_eps` > 0 and `dual_clip` = c > 1 scalars.
    Returns: `[...]` per-sample objective.
    """
    clipped = ppo_clip_objective(log_prob, behavior_log_prob, advantages, clip_eps)
    dual = jnp.maximum(clipped, dual_clip * advantages)
    return jnp.where(advantages < 0, dual, clipped)


def dual_clip_ppo_loss(
    log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
    dual_clip: float | chex.Array,
    mask: chex.Array | None = None,
) -> chex.Array:
    """Dual-clip PPO policy loss (Ye et al. 2020, "Mastering Complex Control in MOBA Games
    with Deep Reinforcement Learning", arXiv:1912.09729), a scalar to minimise.

    L = -mean(obj),  obj = min(r A, clip(r, 1-eps, 1+eps) A)               where A >= 0
                     obj = max(min(r A, clip(r, 1-eps, 1+eps) A), c A)     where A < 0

    Args:
      log_prob, behavior_log_prob, advantages: `[...]` as in `ppo_clip_loss`.
      clip_eps: clip range eps > 0.
      dual_clip: c > 1 (the constructor of `PPOConfig` checks this; a traced value cannot be
        checked here).
      mask: optional `[...]` 0/1 sample weights.

    Returns:
      scalar loss.
    """
    objective = dual_clip_ppo_objective(
        log_prob, behavior_log_prob, advantages, clip_eps, dual_clip
    )
    return -masked_mean(objective, mask)


def proximal_weight(
    prox_log_prob: chex.Array, behavior_log_prob: chex.Array, is_clip: float | chex.Array
) -> chex.Array:
    """Per-sample importance weight of the proximal policy over the behaviour policy, truncated
    and treated as a constant: `w = min(pi_prox / mu, is_clip)` (Hilton et al. 2021).

    Args: `[...]` log-probabilities of equal shape; `is_clip` >= 1 a scalar (inf = untruncated).
    Returns: `[...]` weights, no gradient.
    """
    chex.assert_equal_shape([prox_log_prob, behavior_log_prob])
    ratio = jnp.exp(jnp.minimum(prox_log_prob - behavior_log_prob, _LOG_RATIO_MAX))
    return jax.lax.stop_gradient(jnp.minimum(ratio, is_clip))


def decoupled_ppo_objective(
    log_prob: chex.Array,
    prox_log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
    dual_clip: float | chex.Array,
    is_clip: float | chex.Array,
) -> chex.Array:
    """Per-sample decoupled PPO objective (Hilton, Cobbe & Schulman 2021, "Batch size-invariance
    for policy optimization", arXiv:2110.00641, eq. 2), to maximise.

    w * min(r A, clip(r, 1 - eps, 1 + eps) A),  r = pi_theta / pi_prox,  w = min(pi_prox / mu, is_clip)

    The behaviour policy mu (which produced the sample) only importance-weights it; the clip
    keeps the update close to the proximal policy pi_prox (e.g. the learner at the start of
    the iteration, or an EWMA of its params). With a dual clip c < inf the clipped term is the
    dual-clip objective of r (Ye et al. 2020) where A < 0. With pi_prox == mu, w = 1 and this is
    exactly `dual_clip_ppo_objective(log_prob, behavior_log_prob, ...)` (PPO).

    Args: `[...]` arrays of equal shape (`prox_log_prob` and `behavior_log_prob` are constants);
      scalars `clip_eps` in (0, 1), `dual_clip` > 1 (inf = off), `is_clip` >= 1 (inf = untruncated).
    Returns: `[...]` per-sample objective.
    """
    weight = proximal_weight(prox_log_prob, behavior_log_prob, is_clip)
    return weight * dual_clip_ppo_objective(log_prob, prox_log_prob, advantages, clip_eps, dual_clip)


def decoupled_ppo_loss(
    log_prob: chex.Array,
    prox_log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
    dual_clip: float | chex.Array,
    is_clip: float | chex.Array,
    mask: chex.Array | None = None,
) -> chex.Array:
    """Decoupled PPO policy loss (Hilton et al. 2021, arXiv:2110.00641), a scalar to minimise.

    L = -mean(w * min(r A, clip(r, 1-eps, 1+eps) A)),  r = pi_theta / pi_prox,  w = min(pi_prox / mu, is_clip)
    (`decoupled_ppo_objective`; the dual clip applies where A < 0 when `dual_clip` < inf).
    The same surrogate with bounded staleness is AReaL's (Fu et al. 2025, arXiv:2505.24298).

    Args:
      log_prob: `[...]` log pi_theta(a|s) (differentiated).
      prox_log_prob: `[...]` log pi_prox(a|s) (a constant).
      behavior_log_prob: `[...]` log mu(a|s), the stored behaviour log-probability.
      advantages: `[...]` advantage estimates (constants).
      clip_eps, dual_clip, is_clip: scalars, see `decoupled_ppo_objective`.
      mask: optional `[...]` 0/1 sample weights; mean over kept samples.

    Returns:
      scalar loss.
    """
    objective = decoupled_ppo_objective(
        log_prob, prox_log_prob, behavior_log_prob, advantages, clip_eps, dual_clip, is_clip
    )
    return -masked_mean(objective, mask)


def ess_fraction(
    log_weight: chex.Array,
    mask: chex.Array | None = None,
    segment_ids: chex.Array | None = None,
    num_segments: int = 1,
    axis_name: str | None = None,
) -> chex.Array:
    """Effective sample size of importance weights as a fraction of the sample count, per segment.

    ESS / n = (sum w)^2 / (n * sum w^2) with w = exp(log_weight) (Kong 1992; Elvira et al. 2022,
    "Rethinking the effective sample size"): 1 when every weight is equal, 1/n when one sample
    carries all the weight. It is scale-invariant, so each segment's weights are divided by its
    largest before squaring (no overflow for stale samples with huge ratios).

    Args:
      log_weight: `[B]` log importance weights, e.g. log pi_learner - log mu.
      mask: optional `[B]` 0/1: samples that take part (e.g. not dropped as stale).
      segment_ids: optional `[B]` int32 in [0, num_segments) (e.g. a lag bucket); None = one segment.
      num_segments: static number of segments.
      axis_name: data-parallel axis: sums (and the per-segment maximum) over its devices.

    Returns:
      `[num_segments]` fractions in (0, 1]; NaN for a segment without samples.
    """
    top = ess_segment_max(log_weight, mask, segment_ids, num_segments)
    if axis_name is not None:
        top = jax.lax.pmax(top, axis_name)
    sums = ess_segment_sums(log_weight, mask, segment_ids, num_segments, top)
    if axis_name is not None:
        sums = jax.lax.psum(sums, axis_name)
    return ess_from_sums(sums)


def _ess_inputs(log_weight, mask, segment_ids):
    log_weight = log_weight.reshape(-1)
    keep = jnp.ones_like(log_weight) if mask is None else mask.reshape(-1).astype(log_weight.dtype)
    segment = jnp.zeros(log_weight.shape, jnp.int32) if segment_ids is None else segment_ids.reshape(-1)
    return jnp.where(keep > 0, log_weight, -jnp.inf), keep, segment


def ess_segment_max(log_weight: chex.Array, mask: chex.Array | None = None, segment_ids: chex.Array | None = None,
                    num_segments: int = 1) -> chex.Array:
    """`[num_segments]` largest kept log-weight per segment (-inf where none): `ess_fraction`'s
    first stage, whose maximum over devices every device then scales by."""
    masked_log, _, segment = _ess_inputs(log_weight, mask, segment_ids)
    return jax.ops.segment_max(masked_log, segment, num_segments=num_segments)


def ess_segment_sums(log_weight: chex.Array, mask: chex.Array | None, segment_ids: chex.Array | None,
                     num_segments: int, top: chex.Array) -> chex.Array:
    """`[3, num_segments]` (count, sum w, sum w^2) per segment with w = exp(log_weight - top)
    (`top` `[num_segments]`: the segment's largest log-weight, `ess_segment_max`; so w is in
    [0, 1]): `ess_fraction`'s second stage, summed over devices."""
    masked_log, keep, segment = _ess_inputs(log_weight, mask, segment_ids)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    w = jnp.exp(jnp.minimum(masked_log - top[segment], 0.0)) * keep  # in [0, 1], exactly 1 at the maximum
    return jnp.stack([
        jax.ops.segment_sum(keep, segment, num_segments=num_segments),
        jax.ops.segment_sum(w, segment, num_segments=num_segments),
        jax.ops.segment_sum(w * w, segment, num_segments=num_segments),
    ])


def ess_from_sums(sums: chex.Array) -> chex.Array:
    """`[3, S]` sums (`ess_segment_sums`) -> `[S]` ESS / n = (sum w)^2 / (n sum w^2); NaN where n = 0."""
    count, s1, s2 = sums
    return jnp.where(count > 0, jnp.square(s1) / jnp.maximum(count * s2, 1e-30), jnp.nan)


def value_loss(
    values: chex.Array,
    returns: chex.Array,
    behavior_values: chex.Array | None = None,
    clip_eps: float | chex.Array | None = None,
    mask: chex.Array | None = None,
) -> chex.Array:
    """Squared-error value loss, optionally clipped around the behaviour values (PPO2 style).

    unclipped: 0.5 * mean((V - R)^2)
    clipped:   0.5 * mean(max((V - R)^2, (V_b + clip(V - V_b, -eps, eps) - R)^2))

    Args:
      values: `[...]` V_theta(s).
      returns: `[...]` value targets R.
      behavior_values: `[...]` V(s) stored at sampling time (needed when clipping).
      clip_eps: None (no clipping) or the clip range.
      mask: optional `[...]` 0/1 sample weights.

    Returns:
      scalar loss.
    """
    chex.assert_equal_shape([values, returns])
    squared = jnp.square(values - returns)
    if clip_eps is not None:
        if behavior_values is None:
            raise ValueError("value_loss: clip_eps given but behavior_values is None")
        chex.assert_equal_shape([values, behavior_values])
        clipped_values = behavior_values + jnp.clip(values - behavior_values, -clip_eps, clip_eps)
        squared = jnp.maximum(squared, jnp.square(clipped_values - returns))
    return 0.5 * masked_mean(squared, mask)


# --------------------------------------------------------------------------------------
# Diagnostics
# --------------------------------------------------------------------------------------


def approx_kl(
    log_prob: chex.Array, behavior_log_prob: chex.Array, mask: chex.Array | None = None
) -> chex.Array:
    """Approximate KL(pi_behaviour || pi_theta) = mean((r - 1) - log r), r = pi_theta / pi_behaviour.

    The low-variance, always non-negative estimator of Schulman (2020), "Approximating KL
    divergence" (http://joschu.net/blog/kl-approx.html). Field thresholds: < 0.01 fine,
    0.01-0.03 watch, > 0.03 lag is hurting.

    The log ratio is capped at 20 (r <= 4.9e8) so that one sample with log ratio >= 89, or a
    large batch at ~80, does not overflow the float32 mean to inf; above the cap the estimate
    is a (huge) lower bound with zero gradient.

    Args: `[...]` log-probabilities of the stored actions. Returns: scalar.
    """
    chex.assert_equal_shape([log_prob, behavior_log_prob])
    return masked_mean(approx_kl_terms(log_prob - behavior_log_prob), mask)


def approx_kl_terms(log_ratio: chex.Array) -> chex.Array:
    """Per-sample KL estimator terms (r - 1) - log r from log r (capped at 20, see `approx_kl`); `[...]`."""
    log_ratio = jnp.minimum(log_ratio, _KL_LOG_RATIO_MAX)
    return jnp.expm1(log_ratio) - log_ratio


class RatioStats(NamedTuple):
    """Importance-ratio diagnostics of one minibatch (all scalars)."""

    clip_fraction: chex.Array  # fraction of samples with |r - 1| > clip_eps
    dual_clip_fraction: chex.Array  # fraction with A < 0 and r > dual_clip (outer clip active)
    ratio_mean: chex.Array
    ratio_std: chex.Array
    ratio_max: chex.Array


def ratio_stats(
    log_prob: chex.Array,
    behavior_log_prob: chex.Array,
    advantages: chex.Array,
    clip_eps: float | chex.Array,
    dual_clip: float | chex.Array | None,
    mask: chex.Array | None = None,
) -> RatioStats:
    """Clip fractions and importance-ratio moments, r = exp(log_prob - behavior_log_prob).

    The dual clip is active where A < 0 and r * A < c * A, i.e. r > c (Ye et al. 2020). With
    `dual_clip=None` the dual-clip fraction is 0.

    Args: `[...]` arrays of equal shape; scalar `clip_eps`, `dual_clip`. Returns: `RatioStats`.
    """
    chex.assert_equal_shape([log_prob, behavior_log_prob, advantages])
    ratio = jnp.exp(log_prob - behavior_log_prob)
    clipped = (jnp.abs(ratio - 1.0) > clip_eps).astype(ratio.dtype)
    if dual_clip is None:
        dual = jnp.zeros_like(ratio)
    else:
        dual = ((advantages < 0) & (ratio > dual_clip)).astype(ratio.dtype)
    mean = masked_mean(ratio, mask)
    var = masked_mean(jnp.square(ratio - mean), mask)
    if mask is None:
        ratio_max = jnp.max(ratio)
    else:
        ratio_max = jnp.max(jnp.where(mask > 0, ratio, -jnp.inf))
    return RatioStats(
        clip_fraction=masked_mean(clipped, mask),
        dual_clip_fraction=masked_mean(dual, mask),
        ratio_mean=mean,
        ratio_std=jnp.sqrt(var),
        ratio_max=ratio_max,
    )


def weighted_moments(values: chex.Array, weight: chex.Array | None = None) -> chex.Array:
    """`[..., 3]`: (count, mean, M2) of `values` `[..., b]` over its last axis, counting the
    samples with weight 1 (all when `weight` is None); M2 = sum of squared deviations from the
    mean. A shard's moments, pooled exactly with `pooled_moments` (Chan, Golub & LeVeque 1979)."""
    w = jnp.ones_like(values) if weight is None else weight.astype(values.dtype)
    count = jnp.sum(w, -1)
    mean = jnp.sum(values * w, -1) / jnp.maximum(count, 1.0)
    m2 = jnp.sum(jnp.square(values - mean[..., None]) * w, -1)
    return jnp.stack([count, mean, m2], -1)


def pooled_moments(moments: chex.Array) -> chex.Array:
    """`[D, ..., 3]` moments of D disjoint shards -> `[..., 3]` moments of their union (exact in
    real arithmetic): the shards merged in order by `normalization.chan_merge`, Chan et al.
    1979's parallel variance."""
    shards = [(m[..., 0], m[..., 1], m[..., 2]) for m in moments]
    count, mean, m2 = functools.reduce(lambda a, b: normalization.chan_merge(*a, *b), shards)
    return jnp.stack([count, mean, m2], -1)


def gathered_moments(moments: chex.Array, axis_name: str | None) -> chex.Array:
    """`weighted_moments` of this shard -> those of every shard along `axis_name` together, in
    one collective (an all-gather of the small moments array); unchanged when `axis_name` is None."""
    if axis_name is None:
        return moments
    return pooled_moments(jax.lax.all_gather(moments, axis_name))


def standardize(values: chex.Array, moments: chex.Array, eps: float = 1e-8) -> chex.Array:
    """(values - mean) / (std + eps) with `moments` `[..., 3]` (`weighted_moments`) of `values`
    `[..., b]`: the population std sqrt(M2 / count)."""
    count, mean, m2 = moments[..., 0:1], moments[..., 1:2], moments[..., 2:3]
    return (values - mean) / (jnp.sqrt(m2 / jnp.maximum(count, 1.0)) + eps)


def normalize_advantages(
    advantages: chex.Array, mask: chex.Array | None = None, eps: float = 1e-8, axis_name: str | None = None
) -> chex.Array:
    """(A - mean(A)) / (std(A) + eps) over all elements (optionally masked); shape preserved.

    With `axis_name` (inside shard_map / pmap) mean and std are taken over the shards of every
    device along that axis (one collective, `gathered_moments`), so a data-parallel minibatch is
    normalised as one minibatch.
    """
    flat = advantages.reshape(-1)
    moments = gathered_moments(weighted_moments(flat, None if mask is None else mask.reshape(-1)), axis_name)
    return standardize(flat, moments, eps).reshape(advantages.shape)
