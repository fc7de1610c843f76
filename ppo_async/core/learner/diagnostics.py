"""Diagnostics of an update: per-minibatch ratio and KL statistics (the KL to the behaviour
policy and its two parts, staleness and update size), effective sample size, lag histograms,
explained variance and the per-iteration metrics dict."""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from ppo_async.core import collectives, losses
from ppo_async.core.learner.context import Batch, LearnerContext
from ppo_async.core.learner.hyperparams import Hyperparams


class KlParts(NamedTuple):
    """`approx_kl` split at the proximal policy (`kl_parts`): scalars, or `[E, M]` per minibatch."""

    staleness: chex.Array  # mean (r_s - 1) - log r_s, r_s = pi_prox / mu: KL(behaviour -> proximal)
    update: chex.Array  # mean (r_u - 1) - log r_u, r_u = pi_theta / pi_prox: KL(proximal -> updated)
    cross: chex.Array  # approx_kl - staleness - update: mean (r_s - 1)(r_u - 1)


def kl_parts(
    log_prob: chex.Array, prox_log_prob: chex.Array, behavior_log_prob: chex.Array, mask: chex.Array | None = None
) -> KlParts:
    """The KL to the behaviour policy (`losses.approx_kl`) split into staleness and update size.

    With r = pi_theta / mu = r_s * r_u, r_s = pi_prox / mu (how far the learner had moved from
    the behaviour policy when the iteration began: staleness, which the lag knobs move) and
    r_u = pi_theta / pi_prox (how far this iteration's SGD steps have moved it: update size,
    which the learning rate moves), each part is the same estimator as `approx_kl`, the mean of
    (r - 1) - log r over the samples (Schulman 2020's k3), and sample by sample

        (r - 1) - log r = [(r_s - 1) - log r_s] + [(r_u - 1) - log r_u] + (r_s - 1)(r_u - 1).

    So the parts sum to the total exactly where one ratio is 1: no staleness (pi_prox = mu,
    e.g. lag 0 with unchanged statistics) or no update yet (the first SGD step of an
    iteration). Elsewhere they do not: `cross`, the mean of (r_s - 1)(r_u - 1), is of the
    same order as the parts (a Gaussian mean moved d_s by staleness, then d_u by the update:
    KL = (d_s + d_u)^2 / 2 sigma^2, parts d_s^2 / 2 sigma^2 and d_u^2 / 2 sigma^2, the rest
    d_s d_u / sigma^2), positive where the update carries on the drift that made the samples
    stale, negative where it turns back. The samples come from mu: `staleness` estimates
    KL(mu || pi_prox) without bias, `update` estimates KL(pi_prox || pi_theta) without bias
    only where mu = pi_prox, and `update + cross` estimates E_mu[log pi_prox - log pi_theta] =
    KL(mu || pi_theta) - KL(mu || pi_prox) without bias. `cross` is computed as the rest of
    `approx_kl`, so `approx_kl = staleness + update + cross` holds to rounding even where
    approx_kl's cap on log r (20) binds (there `cross` is not (r_s - 1)(r_u - 1)).

    For plain PPO (`ppo.objective = "ppo"`) the proximal policy is the learner's params at the
    start of the iteration (`Batch.prox_log_prob`); for the decoupled objective it is the same,
    or its EWMA with `ppo.prox_ewma` (the proximal log-probs of each SGD step).

    Args:
      log_prob: `[b]` log pi_theta(a|s) under the params of the SGD step.
      prox_log_prob: `[b]` log pi_prox(a|s).
      behavior_log_prob: `[b]` log mu(a|s).
      mask: `[b]` 1 kept, 0 left out (None: all).

    Returns:
      `KlParts` of scalars (means over the kept samples; 0 when none is kept).
    """
    chex.assert_equal_shape([log_prob, prox_log_prob, behavior_log_prob])
    terms = losses.approx_kl_terms
    staleness = terms(prox_log_prob - behavior_log_prob)
    update = terms(log_prob - prox_log_prob)
    cross = terms(log_prob - behavior_log_prob) - staleness - update
    mean = lambda x: losses.masked_mean(x, mask)  # noqa: E731
    return KlParts(mean(staleness), mean(update), mean(cross))


def minibatch_diagnostics(
    ctx: LearnerContext,
    hparams: Hyperparams,
    log_prob: chex.Array,
    anchor: chex.Array,
    behavior_log_prob: chex.Array,
    advantage: chex.Array,
    weight: chex.Array,
    lag: chex.Array,
    prox_log_prob: chex.Array | None = None,
) -> dict[str, chex.Array]:
    """KL, ratio and per-lag diagnostics of every SGD step's minibatch, computed together.

    Inputs are `[E, M, b]` (epochs x minibatches x minibatch size): the log-probabilities
    each step saw under its params and under the objective's anchor (`anchor_log_prob`: the
    behaviour policy for PPO, the proximal policy for decoupled PPO), and that minibatch's
    behaviour log-probs, advantages, weights and lags. Per minibatch (`[E, M]`): `approx_kl`
    to the behaviour policy (Schulman 2020) and, given the proximal log-probs `prox_log_prob`,
    its parts `kl_staleness`, `kl_update`, `kl_cross` (`kl_parts`), clip / dual-clip fractions and ratio mean / std /
    max of the clipped ratio pi / pi_anchor (`losses.ratio_stats`), `is_clip_fraction` (share
    of samples whose weight pi_anchor / mu is truncated at `is_clip`; 0 for PPO); summed over
    all minibatches (`[lag_buckets]`): sample counts, KL terms and clip indicators per lag
    bucket. One batched computation per iteration instead of many tiny ones per SGD step (on
    XLA:CPU each small op has a fixed cost), with the same values.
    """
    per_minibatch = lambda f: jax.vmap(jax.vmap(f))  # noqa: E731  over [E, M]
    kl = per_minibatch(losses.approx_kl)(log_prob, behavior_log_prob, weight)
    stats = per_minibatch(
        lambda lp, alp, adv, w: losses.ratio_stats(lp, alp, adv, hparams.clip_eps, hparams.dual_clip, w)
    )(log_prob, anchor, advantage, weight)
    truncated = (anchor - behavior_log_prob > jnp.log(hparams.is_clip)).astype(jnp.float32)
    is_clip_fraction = per_minibatch(losses.masked_mean)(truncated, weight)
    kl_terms = losses.approx_kl_terms(log_prob - behavior_log_prob).reshape(-1)
    clipped = (jnp.abs(jnp.exp(log_prob - anchor) - 1.0) > hparams.clip_eps).astype(jnp.float32).reshape(-1)
    bucket = jax.nn.one_hot(jnp.minimum(lag, ctx.lag_buckets - 1).reshape(-1), ctx.lag_buckets) * weight.reshape(-1)[:, None]
    parts = {}
    if prox_log_prob is not None:
        split = per_minibatch(kl_parts)(log_prob, prox_log_prob, behavior_log_prob, weight)
        parts = {"kl_staleness": split.staleness, "kl_update": split.update, "kl_cross": split.cross}
    return {
        "approx_kl": kl,
        **parts,
        "kept": jnp.sum(weight, -1),
        **stats._asdict(),
        "is_clip_fraction": is_clip_fraction,
        "lag_count": jnp.sum(bucket, axis=0),
        "lag_kl_sum": kl_terms @ bucket,
        "lag_clip_sum": clipped @ bucket,
    }

def iteration_metrics(
    ctx: LearnerContext, per_minibatch: dict[str, chex.Array], batch: Batch, lag: chex.Array,
    step_ran: chex.Array | None = None,
) -> dict[str, chex.Array]:
    """One iteration's metrics from the per-minibatch diagnostics `[E, M]`, the per-lag sums
    `[lag_buckets]` (`minibatch_diagnostics`) and the batch; `consumed` is the count of kept samples.

    Scalars are means over minibatches (over those with `step_ran` `[E, M]`, when given:
    `slotted_epochs`); `ratio_max` the largest ratio, `approx_kl_max` the largest KL of a whole
    minibatch (every device's share of it); per-lag KL and clip fractions are pooled sums over
    buckets (NaN where no sample had that lag); `ess_fraction` and
    `ess_fraction_per_lag` the effective sample size of the batch's importance weights
    pi_learner / mu (the learner at the start of the iteration over the behaviour policy) as a
    fraction of the kept samples (`losses.ess_fraction`; staleness spreads the weights, and a
    falling ESS is an early sign of collapse under lag). Under data parallelism every shard
    holds the same number of samples, so means average over devices, counts and per-lag sums add
    up and maxima take the max: two collectives in all (`collectives.folded_pmax`, then
    `folded_psum`: the ESS sums need the global maxima first).
    """
    per_minibatch = dict(per_minibatch)
    sums = {k: per_minibatch.pop(k) for k in ("lag_count", "lag_kl_sum", "lag_clip_sum")}
    kept = per_minibatch.pop("kept")  # [E, M] kept samples of each step's minibatch (this device's share)
    sums.update(minibatch_kl_sum=per_minibatch["approx_kl"] * kept, minibatch_kept=kept)
    lag_stats = lag_metrics(lag, batch.weight.reshape(lag.shape), ctx.lag_buckets)
    if step_ran is None:
        mean, largest = jnp.mean, jnp.max
    else:
        mean = lambda x: jnp.sum(jnp.where(step_ran, x, 0.0)) / jnp.maximum(jnp.sum(step_ran), 1)  # noqa: E731
        largest = lambda x: jnp.max(jnp.where(step_ran, x, -jnp.inf))  # noqa: E731
    means = {name: mean(value) for name, value in per_minibatch.items()}
    means["lag_mean"] = lag_stats.pop("lag_mean")
    log_weight = batch.prox_log_prob - batch.behavior_log_prob
    bucket = jnp.minimum(batch.lag, ctx.lag_buckets - 1)
    values = {"target": batch.target, "residual": batch.target - batch.old_value}  # explained variance's
    maxima = {"ratio_max": largest(per_minibatch["ratio_max"]), "lag_max": lag_stats.pop("lag_max"),
              **{f"{name}_range": jnp.stack([jnp.max(x), -jnp.min(x)]) for name, x in values.items()},
              "ess_top": losses.ess_segment_max(log_weight, batch.weight),
              "ess_top_per_lag": losses.ess_segment_max(log_weight, batch.weight, bucket, ctx.lag_buckets)}
    if ctx.axis_name is not None:
        maxima = collectives.folded_pmax(maxima, ctx.axis_name)
    for name, x in values.items():  # shifted by the global midrange: (max - (-min)) / 2
        top, neg_bottom = maxima.pop(f"{name}_range")
        sums[f"{name}_sums"] = variance_sums(x, 0.5 * (top - neg_bottom))
    sums.update(lag_stats, consumed=jnp.sum(batch.weight).astype(jnp.int32), devices=jnp.ones((), jnp.int32),
                ess=losses.ess_segment_sums(log_weight, batch.weight, None, 1, maxima.pop("ess_top")),
                ess_per_lag=losses.ess_segment_sums(log_weight, batch.weight, bucket, ctx.lag_buckets,
                                                    maxima.pop("ess_top_per_lag")))
    if ctx.axis_name is not None:
        means, sums = collectives.folded_psum((means, sums), ctx.axis_name)
        means = {name: value / sums["devices"] for name, value in means.items()}
    lag_count, lag_kl_sum, lag_clip_sum = (sums.pop(k) for k in ("lag_count", "lag_kl_sum", "lag_clip_sum"))
    maxima["approx_kl_max"] = largest(sums["minibatch_kl_sum"] / jnp.maximum(sums["minibatch_kept"], 1.0))
    metrics = {**means, **maxima, "lag_histogram": sums["lag_histogram"], "dropped_stale": sums["dropped_stale"],
               "consumed": sums["consumed"]}
    metrics["kl_per_lag"] = jnp.where(lag_count > 0, lag_kl_sum / jnp.maximum(lag_count, 1.0), jnp.nan)
    metrics["clip_fraction_per_lag"] = jnp.where(lag_count > 0, lag_clip_sum / jnp.maximum(lag_count, 1.0), jnp.nan)
    metrics["explained_variance"] = explained_variance_from_sums(sums["residual_sums"], sums["target_sums"])
    metrics["ess_fraction"] = losses.ess_from_sums(sums["ess"])[0]
    metrics["ess_fraction_per_lag"] = losses.ess_from_sums(sums["ess_per_lag"])
    return metrics

def lag_metrics(lag: chex.Array, weight: chex.Array, num_buckets: int) -> dict[str, chex.Array]:
    """Lag statistics of one consumed batch.

    Args:
      lag: `[...]` int32 sample lags.
      weight: `[...]` 1.0 kept, 0.0 dropped as stale.
      num_buckets: histogram length H; lags >= H - 1 share the last bucket.

    Returns:
      `lag_histogram [H]` (counts of all produced samples by lag, kept or not), `lag_mean`,
      `lag_max`, `dropped_stale` (count with weight 0).
    """
    lag_f = lag.astype(jnp.float32)
    histogram = jnp.sum(jax.nn.one_hot(jnp.minimum(lag, num_buckets - 1).reshape(-1), num_buckets), axis=0)
    return {
        "lag_histogram": histogram.astype(jnp.int32),
        "lag_mean": jnp.mean(lag_f),
        "lag_max": jnp.max(lag).astype(jnp.int32),
        "dropped_stale": jnp.sum(1.0 - weight).astype(jnp.int32),
    }

def explained_variance(predictions: chex.Array, targets: chex.Array) -> chex.Array:
    """1 - Var[targets - predictions] / Var[targets] (1 is perfect, <= 0 is useless)."""
    residual = targets - predictions
    return explained_variance_from_sums(variance_sums(residual, midrange(residual)), variance_sums(targets, midrange(targets)))


def midrange(x: chex.Array) -> chex.Array:
    """(max + min) / 2 of `x`: a shift that keeps |x - shift| <= range / 2 (`variance_sums`)."""
    return 0.5 * (jnp.max(x) + jnp.min(x))


def variance_sums(x: chex.Array, shift: chex.Array) -> chex.Array:
    """`[3]` (n, sum(x - shift), sum((x - shift)^2)): sums that add up over devices (with one
    shift for all, e.g. the global `midrange`, which bounds the cancellation of
    E[d^2] - E[d]^2 by the range rather than the mean)."""
    d = x.reshape(-1) - shift
    return jnp.stack([jnp.asarray(d.size, d.dtype), jnp.sum(d), jnp.sum(d * d)])


def explained_variance_from_sums(residual: chex.Array, targets: chex.Array) -> chex.Array:
    """`explained_variance` from the `variance_sums` of the residuals and of the targets; NaN
    when the targets do not vary."""
    variance = lambda s: jnp.maximum(s[2] / s[0] - jnp.square(s[1] / s[0]), 0.0)  # noqa: E731
    var_targets = variance(targets)
    return jnp.where(var_targets > 0, 1.0 - variance(residual) / var_targets, jnp.nan)
