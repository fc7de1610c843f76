"""Pure PPO learner: `ppo_update(ctx, state, trajectory, key, hparams) -> (state, metrics)`.

One call is one learner iteration (version += 1): value bootstrap through time-limit
truncations, GAE, then `num_epochs x num_minibatches` Adam steps on the PPO or dual-clip
objective. Hyperparameters that do not change shapes travel in `Hyperparams` as arrays, so
one compiled update serves a whole sweep; shape-changing and structural options are static
in `LearnerContext`. With `axis_name` set the update runs data-parallel under pmap /
shard_map and averages gradients and metrics over that axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from ppo_async import envs, losses, networks
from ppo_async.config import Config, PPOConfig
from ppo_async.networks import ActorCritic
from ppo_async.types import RunningMeanStd, TrainState, Trajectory


class Hyperparams(NamedTuple):
    """Shape-preserving hyperparameters as float32 scalars (traced inside jit; sweepable)."""

    learning_rate: chex.Array
    gamma: chex.Array
    gae_lambda: chex.Array
    clip_eps: chex.Array
    dual_clip: chex.Array  # ignored unless LearnerContext.use_dual_clip
    value_clip_eps: chex.Array  # ignored unless LearnerContext.use_value_clip
    vf_coef: chex.Array
    ent_coef: chex.Array
    max_grad_norm: chex.Array


def hyperparams_from_config(ppo: PPOConfig) -> Hyperparams:
    """The traced hyperparameters of a PPO config section."""
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return Hyperparams(
        learning_rate=f32(ppo.learning_rate),
        gamma=f32(ppo.gamma),
        gae_lambda=f32(ppo.gae_lambda),
        clip_eps=f32(ppo.clip_eps),
        dual_clip=f32(ppo.dual_clip if ppo.dual_clip is not None else 3.0),
        value_clip_eps=f32(ppo.value_clip_eps if ppo.value_clip_eps is not None else 0.2),
        vf_coef=f32(ppo.vf_coef),
        ent_coef=f32(ppo.ent_coef),
        max_grad_norm=f32(ppo.max_grad_norm),
    )


@dataclass(frozen=True)
class LearnerContext:
    """Static (compile-time) parts of the update."""

    network: ActorCritic
    num_epochs: int
    num_minibatches: int
    num_iterations: int  # for learning-rate annealing
    anneal_lr: bool
    normalize_advantages: bool
    normalize_obs: bool
    use_dual_clip: bool
    use_value_clip: bool
    adam_eps: float
    axis_name: str | None = None  # data-parallel axis (pmap / shard_map) or None

    def optimizer(self) -> optax.GradientTransformation:
        """Adam without the step size (the learning rate is applied from `Hyperparams`)."""
        return optax.scale_by_adam(eps=self.adam_eps)


def make_learner_context(config: Config, network: ActorCritic, axis_name: str | None = None) -> LearnerContext:
    """The static learner context of a config."""
    ppo = config.ppo
    return LearnerContext(
        network=network,
        num_epochs=ppo.num_epochs,
        num_minibatches=ppo.num_minibatches,
        num_iterations=config.num_iterations,
        anneal_lr=ppo.anneal_lr,
        normalize_advantages=ppo.normalize_advantages,
        normalize_obs=config.rollout.normalize_obs,
        use_dual_clip=ppo.dual_clip is not None,
        use_value_clip=ppo.value_clip_eps is not None,
        adam_eps=ppo.adam_eps,
        axis_name=axis_name,
    )


def init_train_state(ctx: LearnerContext, key: chex.PRNGKey, obs_shape: tuple[int, ...]) -> TrainState:
    """Fresh params, Adam state, identity obs statistics, version 0."""
    params = ctx.network.init(key)
    return TrainState(
        params=params,
        opt_state=ctx.optimizer().init(params),
        obs_stats=envs.init_obs_stats(obs_shape),
        version=jnp.zeros((), jnp.int32),
        sgd_steps=jnp.zeros((), jnp.int32),
        env_steps=jnp.zeros((), jnp.int32),
    )


def learning_rate_at(ctx: LearnerContext, hparams: Hyperparams, version: chex.Array) -> chex.Array:
    """Linear annealing to 0 over `num_iterations` learner versions (or constant)."""
    if not ctx.anneal_lr:
        return hparams.learning_rate
    frac = 1.0 - jnp.minimum(version, ctx.num_iterations).astype(jnp.float32) / ctx.num_iterations
    return hparams.learning_rate * frac


class Batch(NamedTuple):
    """Flattened learner inputs `[B, ...]` (B = T * N)."""

    obs: chex.Array
    action: chex.Array
    behavior_log_prob: chex.Array
    old_value: chex.Array  # V(s) under the params at the start of the iteration
    advantage: chex.Array
    target: chex.Array  # value target (GAE return)
    weight: chex.Array  # 1.0 kept, 0.0 dropped (e.g. stale)


def compute_targets(
    ctx: LearnerContext,
    params: Any,
    trajectory: Trajectory,
    hparams: Hyperparams,
    weight: chex.Array | None = None,
) -> Batch:
    """Values, truncation bootstrap and GAE for one trajectory; flattened to `[T * N, ...]`.

    A time-limit truncation at step t (not a termination) contributes
    `gamma * V(final_obs_t)` to r_t and then cuts the trace, so GAE bootstraps through it
    (Pardo et al. 2018, "Time Limits in Reinforcement Learning").
    """
    tr = trajectory.transitions
    apply = ctx.network.apply
    _, values = apply(params, tr.obs)  # [T, N]
    _, last_value = apply(params, trajectory.last_obs)  # [N]
    _, final_values = apply(params, tr.final_obs)  # [T, N]
    truncated = tr.truncated.astype(jnp.float32)
    rewards = tr.reward + hparams.gamma * truncated * final_values
    dones = jnp.logical_or(tr.terminated, tr.truncated).astype(jnp.float32)
    advantages, returns = losses.gae(rewards, values, dones, last_value, hparams.gamma, hparams.gae_lambda)
    if weight is None:
        weight = jnp.ones_like(values)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    return jax.lax.stop_gradient(
        Batch(
            obs=flat(tr.obs),
            action=flat(tr.action),
            behavior_log_prob=flat(tr.behavior_log_prob),
            old_value=flat(values),
            advantage=flat(advantages),
            target=flat(returns),
            weight=flat(weight),
        )
    )


def ppo_loss(
    params: Any, ctx: LearnerContext, batch: Batch, hparams: Hyperparams
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Total PPO loss of one minibatch and its diagnostics.

    loss = policy_loss + vf_coef * value_loss - ent_coef * entropy, with the policy loss
    `ppo_clip_loss` or `dual_clip_ppo_loss` (Schulman et al. 2017; Ye et al. 2020).
    """
    dist, values = ctx.network.apply(params, batch.obs)
    log_prob = networks.log_prob(dist, batch.action)
    mask = batch.weight
    advantages = batch.advantage
    if ctx.normalize_advantages:
        advantages = losses.normalize_advantages(advantages, mask)
    if ctx.use_dual_clip:
        policy_loss = losses.dual_clip_ppo_loss(
            log_prob, batch.behavior_log_prob, advantages, hparams.clip_eps, hparams.dual_clip, mask
        )
    else:
        policy_loss = losses.ppo_clip_loss(log_prob, batch.behavior_log_prob, advantages, hparams.clip_eps, mask)
    value_loss = losses.value_loss(
        values,
        batch.target,
        batch.old_value,
        hparams.value_clip_eps if ctx.use_value_clip else None,
        mask,
    )
    entropy = losses._masked_mean(networks.entropy(dist), mask)
    loss = policy_loss + hparams.vf_coef * value_loss - hparams.ent_coef * entropy
    stats = losses.ratio_stats(
        log_prob,
        batch.behavior_log_prob,
        advantages,
        hparams.clip_eps,
        hparams.dual_clip if ctx.use_dual_clip else None,
        mask,
    )
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": losses.approx_kl(log_prob, batch.behavior_log_prob, mask),
        **stats._asdict(),
    }
    return loss, metrics


def sgd_step(
    ctx: LearnerContext,
    hparams: Hyperparams,
    learning_rate: chex.Array,
    carry: tuple[Any, Any],
    minibatch: Batch,
) -> tuple[tuple[Any, Any], dict[str, chex.Array]]:
    """One clipped-gradient Adam step on a minibatch: `(params, opt_state) -> (params, opt_state)`."""
    params, opt_state = carry
    grads, metrics = jax.grad(ppo_loss, has_aux=True)(params, ctx, minibatch, hparams)
    if ctx.axis_name is not None:
        grads = jax.lax.pmean(grads, ctx.axis_name)
    grad_norm = optax.tree.norm(grads)
    scale = jnp.minimum(1.0, hparams.max_grad_norm / jnp.maximum(grad_norm, 1e-12))
    grads = jax.tree.map(lambda g: g * scale, grads)
    updates, opt_state = ctx.optimizer().update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - learning_rate * u, params, updates)
    metrics["grad_norm"] = grad_norm
    return (params, opt_state), metrics


def ppo_update(
    ctx: LearnerContext,
    state: TrainState,
    trajectory: Trajectory,
    key: chex.PRNGKey,
    hparams: Hyperparams,
    weight: chex.Array | None = None,
) -> tuple[TrainState, dict[str, chex.Array]]:
    """One learner iteration on a trajectory `[T, N, ...]` (version += 1).

    Args:
      ctx: static learner context.
      state: the learner's `TrainState`.
      trajectory: transitions `[T, N, ...]` (possibly from older policy versions).
      key: PRNG key for minibatch shuffling.
      hparams: traced hyperparameters.
      weight: optional `[T, N]` 0/1 sample weights (0 = dropped, e.g. too stale).

    Returns:
      `(new_state, metrics)`: metrics are scalars averaged over all minibatches, plus
      `approx_kl_max` (max over minibatches) and `ratio_max` (max over all samples).
    """
    batch = compute_targets(ctx, state.params, trajectory, hparams, weight)
    batch_size = batch.advantage.shape[0]
    chex.assert_is_divisible(batch_size, ctx.num_minibatches)
    learning_rate = learning_rate_at(ctx, hparams, state.version)

    def epoch(carry, epoch_key):
        perm = jax.random.permutation(epoch_key, batch_size)
        shuffled = jax.tree.map(
            lambda x: x[perm].reshape((ctx.num_minibatches, -1) + x.shape[1:]), batch
        )
        return jax.lax.scan(
            lambda c, mb: sgd_step(ctx, hparams, learning_rate, c, mb), carry, shuffled
        )

    (params, opt_state), per_minibatch = jax.lax.scan(
        epoch, (state.params, state.opt_state), jax.random.split(key, ctx.num_epochs)
    )
    metrics = {name: jnp.mean(value) for name, value in per_minibatch.items()}
    metrics["approx_kl_max"] = jnp.max(per_minibatch["approx_kl"])
    metrics["ratio_max"] = jnp.max(per_minibatch["ratio_max"])
    metrics["learning_rate"] = learning_rate
    metrics["explained_variance"] = explained_variance(batch.old_value, batch.target)
    if ctx.axis_name is not None:
        metrics = jax.lax.pmean(metrics, ctx.axis_name)

    obs_stats = state.obs_stats
    if ctx.normalize_obs:
        moments = trajectory.stats.obs_moments
        if ctx.axis_name is not None:
            moments = _all_moments(moments, ctx.axis_name)
        obs_stats = envs.merge_moments(obs_stats, moments)
    consumed = jnp.sum(batch.weight).astype(jnp.int32)
    if ctx.axis_name is not None:
        consumed = jax.lax.psum(consumed, ctx.axis_name)
    new_state = TrainState(
        params=params,
        opt_state=opt_state,
        obs_stats=obs_stats,
        version=state.version + 1,
        sgd_steps=state.sgd_steps + ctx.num_epochs * ctx.num_minibatches,
        env_steps=state.env_steps + consumed,
    )
    return new_state, metrics


def _all_moments(moments: RunningMeanStd, axis_name: str) -> RunningMeanStd:
    """Moments over every replica of a data-parallel axis (equal counts assumed)."""
    mean = jax.lax.pmean(moments.mean, axis_name)
    second = jax.lax.pmean(moments.var + jnp.square(moments.mean), axis_name)
    return RunningMeanStd(mean=mean, var=second - jnp.square(mean), count=jax.lax.psum(moments.count, axis_name))


def explained_variance(predictions: chex.Array, targets: chex.Array) -> chex.Array:
    """1 - Var[targets - predictions] / Var[targets] (1 is perfect, <= 0 is useless)."""
    var_targets = jnp.var(targets)
    return jnp.where(var_targets > 0, 1.0 - jnp.var(targets - predictions) / var_targets, jnp.nan)
