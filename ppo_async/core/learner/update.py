"""The PPO update: `ppo_update(ctx, state, trajectory, key, hparams) -> (state, metrics)`.

One call is one learner iteration (version += 1): the batch normalised with the learner's own
statistics (`learner_view`; trajectories carry raw observations and rewards), value bootstrap
through time-limit truncations, GAE, then `num_epochs x num_minibatches` Adam steps on the PPO or dual-clip
objective. Hyperparameters that do not change shapes travel in `Hyperparams` as arrays, so
one compiled update serves a whole sweep; shape-changing and structural options are static
in `LearnerContext`. With `axis_name` set the update runs data-parallel under shard_map
(`ppo_async.runtime.placement.learner_placement`): each device holds the trajectory's envs `[T, N / D]`, gradients and
advantage-normalisation statistics are averaged over devices, so every replica takes the
same Adam step (the data-parallel SGD of Goyal et al. 2017).
"""

from __future__ import annotations

from typing import Any

import chex
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from ppo_async.core import losses, networks, normalization
from ppo_async.core.types import RunningMeanStd, TrainState, Trajectory
from ppo_async.core.learner.context import Batch, LearnerContext, learning_rate_at, sample_lag, stale_weight
from ppo_async.core.learner.diagnostics import iteration_metrics, minibatch_diagnostics
from ppo_async.core.learner.hyperparams import Hyperparams
from ppo_async.core.learner.optimizer import with_step_hyperparams


def updated_stats(
    ctx: LearnerContext, obs_stats: RunningMeanStd, reward_stats: RunningMeanStd, trajectory: Trajectory
) -> tuple[RunningMeanStd, RunningMeanStd]:
    """The learner's normalisation statistics after consuming `trajectory`: its raw observation
    moments and discounted-return moments merged in (Chan et al. 1979), each where that
    normalisation is on. `trajectory.stats` describes the whole batch (replicated under data
    parallelism), so every replica computes the same statistics."""
    if ctx.normalize_obs:
        obs_stats = normalization.merge_moments(obs_stats, trajectory.stats.obs_moments)
    if ctx.normalize_reward:
        reward_stats = normalization.merge_moments(reward_stats, trajectory.stats.return_moments)
    return obs_stats, reward_stats


def learner_view(ctx: LearnerContext, trajectory: Trajectory, obs_stats: RunningMeanStd,
                 reward_stats: RunningMeanStd) -> Trajectory:
    """A raw trajectory `[T, N, ...]` as the learner's policy sees it: observations (acted on,
    reached at a time limit, after the last step) normalised with `obs_stats`, rewards divided
    by the running std of the discounted return in `reward_stats` (each where that
    normalisation is on, clipped as configured). Behaviour log-probs stay the sampler's, so
    the importance ratio covers the whole policy's drift: parameters and statistics (the
    learner-owned normalisation of Sample Factory and SEED RL)."""
    norm_obs = lambda x: normalization.normalize_obs(obs_stats, x, ctx.obs_clip, ctx.normalize_obs)  # noqa: E731
    tr = trajectory.transitions
    transitions = tr._replace(
        obs=norm_obs(tr.obs),
        final_obs=norm_obs(tr.final_obs),
        reward=normalization.normalize_reward(reward_stats, tr.reward, ctx.reward_clip, ctx.normalize_reward),
    )
    return trajectory._replace(transitions=transitions, last_obs=norm_obs(trajectory.last_obs))


def compute_targets(
    ctx: LearnerContext,
    params: Any,
    trajectory: Trajectory,
    hparams: Hyperparams,
    lag: chex.Array,
) -> Batch:
    """Values, truncation bootstrap and advantages for one trajectory as the learner sees it
    (`learner_view`: normalised observations and rewards); flattened to `[T * N, ...]`.

    Values are recomputed with the learner's current params (fresher than the behaviour's).
    A time-limit truncation at step t (not a termination) contributes
    `gamma * V(final_obs_t)` to r_t and then cuts the trace, so the estimator bootstraps
    through it (Pardo et al. 2018, "Time Limits in Reinforcement Learning").
    Advantages are GAE (Schulman et al. 2016) or, with `advantage_estimator="vtrace"`,
    V-trace with truncated importance weights (Espeholt et al. 2018).

    Args:
      ctx: static learner context.
      params: current learner params.
      trajectory: transitions `[T, N, ...]`.
      hparams: traced hyperparameters.
      lag: `[T, N]` int32 sample lags (stale ones, lag > max_lag, get weight 0).
    """
    tr = trajectory.transitions
    apply = ctx.network.apply
    dist, values = apply(params, tr.obs)  # [T, N]
    learner_log_prob = networks.log_prob(dist, tr.action)  # the proximal policy at the start of the iteration
    _, last_value = apply(params, trajectory.last_obs)  # [N]
    _, final_values = apply(params, tr.final_obs)  # [T, N]
    truncated = tr.truncated.astype(jnp.float32)
    rewards = tr.reward * hparams.reward_scale + hparams.gamma * truncated * final_values
    dones = jnp.logical_or(tr.terminated, tr.truncated).astype(jnp.float32)
    if ctx.advantage_estimator == "vtrace":
        log_rho = learner_log_prob - tr.behavior_log_prob
        advantages, returns = losses.vtrace_advantages(
            rewards, values, dones, last_value, log_rho, hparams.gamma, hparams.gae_lambda,
            hparams.rho_bar, hparams.c_bar,
        )
    else:
        advantages, returns = losses.gae(rewards, values, dones, last_value, hparams.gamma, hparams.gae_lambda)
    weight = stale_weight(lag, hparams.max_lag)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
    return jax.lax.stop_gradient(
        Batch(
            obs=flat(tr.obs),
            action=flat(tr.action),
            behavior_log_prob=flat(tr.behavior_log_prob),
            prox_log_prob=flat(learner_log_prob),
            old_value=flat(values),
            advantage=flat(advantages),
            target=flat(returns),
            weight=flat(weight),
            lag=flat(lag),
        )
    )

def ppo_loss(
    params: Any, ctx: LearnerContext, batch: Batch, hparams: Hyperparams, value_flag: chex.Array
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Total loss of one minibatch `[b]`, its terms and what the diagnostics need.

    loss = policy_loss + value_flag * vf_coef * value_loss - ent_coef * entropy, where
    policy_loss is `losses.decoupled_ppo_loss` (on the minibatch's advantages as given: the epoch
    loops standardise them) with the anchor of the clip
    `anchor_log_prob(batch, hparams)`: the behaviour policy (`decoupled = 0`: then the weight
    pi_anchor / mu is exactly 1 and this is the dual-clip PPO loss, Schulman et al. 2017; Ye et
    al. 2020; `dual_clip = inf` is plain PPO clipping) or the proximal policy (`decoupled = 1`,
    Hilton et al. 2021). Samples with weight 0 (stale) take no part. The aux dict holds the
    three loss terms (scalars) and, per sample `[b]`, the log-probabilities under the params
    of this step, the anchor's, the proximal policy's (the KL's split into staleness and
    update size, `diagnostics.kl_parts`) and the (normalised) advantages the objective used:
    `minibatch_diagnostics` turns them into the KL / ratio / per-lag metrics once per
    iteration for all minibatches together.
    """
    dist, values = ctx.network.apply(params, batch.obs)
    log_prob = networks.log_prob(dist, batch.action)
    mask = batch.weight
    advantages = batch.advantage  # standardised per minibatch already (`epoch_advantage_moments`)
    anchor = anchor_log_prob(batch, hparams)
    policy_loss = losses.decoupled_ppo_loss(
        log_prob, anchor, batch.behavior_log_prob, advantages, hparams.clip_eps, hparams.dual_clip, hparams.is_clip, mask
    )
    value_loss = losses.value_loss(
        values,
        batch.target,
        batch.old_value,
        hparams.value_clip_eps if ctx.use_value_clip else None,
        mask,
    )
    entropy = losses.masked_mean(networks.entropy(dist), mask)
    loss = policy_loss + value_flag * hparams.vf_coef * value_loss - hparams.ent_coef * entropy
    aux = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "log_prob": jax.lax.stop_gradient(log_prob),
        "anchor_log_prob": anchor,
        "prox_log_prob": jax.lax.stop_gradient(batch.prox_log_prob),
        "advantage": jax.lax.stop_gradient(advantages),
    }
    return loss, aux

def anchor_log_prob(batch: Batch, hparams: Hyperparams) -> chex.Array:
    """`[b]` log-probability the objective clips the ratio to: the behaviour policy's (PPO) or,
    with `hparams.decoupled = 1`, the proximal policy's (a traced select: one compile serves both)."""
    return jax.lax.stop_gradient(jnp.where(hparams.decoupled > 0.5, batch.prox_log_prob, batch.behavior_log_prob))

def sgd_step(
    ctx: LearnerContext,
    hparams: Hyperparams,
    value_flag: chex.Array,
    carry: tuple[Any, Any, Any],
    minibatch: Batch,
) -> tuple[tuple[Any, Any, Any], dict[str, chex.Array]]:
    """One clipped-gradient Adam step on a minibatch:
    `(params, opt_state, prox_params) -> (params, opt_state, prox_params)`.

    Data-parallel: gradients are averaged over `ctx.axis_name` (one all-reduce of the flattened
    gradients) before the optimiser, so every replica takes the same step. The optimiser state carries the iteration's step size and
    critic freeze (`with_step_hyperparams`). With `ctx.use_prox_ewma` the proximal policy is
    `prox_params` (its log-probabilities replace the minibatch's `prox_log_prob`), which then
    move towards the new params: `prox <- d * prox + (1 - d) * params`, d = `hparams.prox_ewma`
    (PPO-EWMA, Hilton et al. 2021); otherwise `prox_params` is None.
    """
    params, opt_state, prox_params = carry
    if ctx.use_prox_ewma:
        prox_dist, _ = ctx.network.apply(prox_params, minibatch.obs)
        minibatch = minibatch._replace(prox_log_prob=jax.lax.stop_gradient(networks.log_prob(prox_dist, minibatch.action)))
    grads, metrics = jax.grad(ppo_loss, has_aux=True)(params, ctx, minibatch, hparams, value_flag)
    if ctx.axis_name is not None:  # one all-reduce of the flattened gradients, not one per leaf
        flat, unravel = ravel_pytree(grads)  # (several times faster across processes; MEASURED.md)
        grads = unravel(jax.lax.pmean(flat, ctx.axis_name))
    metrics["grad_norm"] = optax.tree.norm(grads)
    updates, opt_state = ctx.optimizer().update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    if ctx.use_prox_ewma:
        prox_params = optax.incremental_update(params, prox_params, 1.0 - hparams.prox_ewma)
    return (params, opt_state, prox_params), metrics

def minibatch_moments(ctx: LearnerContext, advantage: chex.Array, weight: chex.Array) -> chex.Array:
    """`[E, M, 3]` moments (`losses.weighted_moments`) of every SGD step's minibatch of kept
    advantages, `[E, M, b]` in, pooled over `ctx.axis_name`'s devices: one collective for the
    whole iteration instead of one per minibatch (the advantages do not change within an
    iteration, so each step's statistics are known before the first; exact, Chan et al. 1979)."""
    return losses.gathered_moments(losses.weighted_moments(advantage, weight), ctx.axis_name)


def standardized_minibatch(ctx: LearnerContext, minibatch: Batch, moments: chex.Array) -> Batch:
    """`minibatch` with its advantages standardised by their (global) `moments` `[3]` when
    `ppo.normalize_advantages` is on (per minibatch, as CleanRL and the PPO baselines do)."""
    if not ctx.normalize_advantages:
        return minibatch
    return minibatch._replace(advantage=losses.standardize(minibatch.advantage, moments))


def static_epochs(
    ctx: LearnerContext, hparams: Hyperparams, value_flag: chex.Array, carry: tuple[Any, Any, Any], batch: Batch,
    key: chex.PRNGKey,
) -> tuple[tuple[Any, Any, Any], dict[str, chex.Array], tuple[chex.Array, ...], None, int]:
    """`ctx.num_epochs` passes over `batch` `[B]`, each a fresh permutation cut into
    `ctx.num_minibatches` minibatches, one `sgd_step` each (advantages standardised per minibatch
    with `minibatch_moments`, all computed before the first step).

    Returns the carry, the steps' outputs `[E, M, ...]`, each step's minibatch
    (behaviour log-probs, weights, lags; `[E, M, B / M]`), None (every step ran) and E * M.
    """
    batch_size = batch.advantage.shape[0]
    chex.assert_is_divisible(batch_size, ctx.num_minibatches)
    perms = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(jax.random.split(key, ctx.num_epochs))  # [E, B]
    cut = lambda x: x[perms].reshape((ctx.num_epochs, ctx.num_minibatches, -1))  # noqa: E731  [E, M, B / M]
    moments = minibatch_moments(ctx, cut(batch.advantage), cut(batch.weight))

    def epoch(carry, epoch_input):
        perm, epoch_moments = epoch_input
        shuffled = jax.tree.map(
            lambda x: x[perm].reshape((ctx.num_minibatches, -1) + x.shape[1:]), batch
        )

        def step(c, minibatch_input):
            minibatch, step_moments = minibatch_input
            return sgd_step(ctx, hparams, value_flag, c, standardized_minibatch(ctx, minibatch, step_moments))

        carry, out = jax.lax.scan(step, carry, (shuffled, epoch_moments))
        return carry, (out, (shuffled.behavior_log_prob, shuffled.weight, shuffled.lag))

    carry, (per_step, minibatches) = jax.lax.scan(epoch, carry, (perms, moments))
    return carry, per_step, minibatches, None, ctx.num_epochs * ctx.num_minibatches

def slotted_epochs(
    ctx: LearnerContext, hparams: Hyperparams, value_flag: chex.Array, carry: tuple[Any, Any, Any], batch: Batch,
    key: chex.PRNGKey,
) -> tuple[tuple[Any, Any, Any], dict[str, chex.Array], tuple[chex.Array, ...], chex.Array, chex.Array]:
    """`static_epochs` with the SGD shape traced: `hparams.num_epochs` (E) passes of
    `hparams.num_minibatches` (M) steps, inside the static `ctx.sgd_slots`.

    Epoch e uses permutation e of the same keys as `static_epochs` (`split(key, E_max)[e]`
    equals `split(key, E)[e]`), and step j takes the samples `perm[j * B/M : (j + 1) * B/M]`
    into a slot of `B / min_minibatches`, the rest of the slot weight 0: every loss and
    diagnostic is a mean weighted by `Batch.weight`, so a padded slot computes the minibatch's
    values. Slots past (E, M) are skipped by `lax.cond` (params, Adam state and EWMA untouched).
    Advantages are standardised per minibatch with `minibatch_moments`, as in `static_epochs`.

    Returns as `static_epochs`, with `[E_max, M_max, ...]` outputs, the `[E_max, M_max]` mask of
    the steps that ran (their minibatch weights are zero elsewhere) and E * M (traced).
    """
    slots = ctx.sgd_slots
    batch_size = batch.advantage.shape[0]
    chex.assert_is_divisible(batch_size, slots.min_minibatches)
    slot = batch_size // slots.min_minibatches
    num_epochs = hparams.num_epochs.astype(jnp.int32)
    num_minibatches = hparams.num_minibatches.astype(jnp.int32)
    minibatch_size = batch_size // num_minibatches
    offsets = jnp.arange(slot)
    epochs, steps = jnp.arange(slots.max_epochs), jnp.arange(slots.max_minibatches)
    perms = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(jax.random.split(key, slots.max_epochs))
    # [E_max, M_max, slot]: each step's sample indices, and which of them it takes (0 past its
    # minibatch or in a step that does not run)
    index = perms[:, jnp.minimum(steps[:, None] * minibatch_size + offsets, batch_size - 1)]
    ran = jnp.logical_and(epochs[:, None] < num_epochs, steps[None, :] < num_minibatches)  # [E_max, M_max]
    taken = jnp.logical_and(offsets < minibatch_size, ran[..., None]).astype(batch.weight.dtype)
    moments = minibatch_moments(ctx, batch.advantage[index], batch.weight[index] * taken)

    def epoch(carry, epoch_input):
        e, epoch_index, epoch_moments = epoch_input

        def step(carry, step_input):
            j, step_index, step_moments = step_input
            minibatch = jax.tree.map(lambda x: x[step_index], batch)
            step_ran = jnp.logical_and(e < num_epochs, j < num_minibatches)
            weight = minibatch.weight * jnp.logical_and(offsets < minibatch_size, step_ran).astype(minibatch.weight.dtype)
            minibatch = standardized_minibatch(ctx, minibatch._replace(weight=weight), step_moments)
            run = lambda c: sgd_step(ctx, hparams, value_flag, c, minibatch)  # noqa: E731
            skipped = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(run, carry)[1])
            carry, out = jax.lax.cond(step_ran, run, lambda c: (c, skipped), carry)
            return carry, (out, (minibatch.behavior_log_prob, weight, minibatch.lag), step_ran)

        return jax.lax.scan(step, carry, (steps, epoch_index, epoch_moments))

    carry, (per_step, minibatches, ran) = jax.lax.scan(epoch, carry, (epochs, index, moments))
    return carry, per_step, minibatches, ran, num_epochs * num_minibatches

def ppo_update(
    ctx: LearnerContext,
    state: TrainState,
    trajectory: Trajectory,
    key: chex.PRNGKey,
    hparams: Hyperparams,
) -> tuple[TrainState, dict[str, chex.Array]]:
    """One learner iteration on a trajectory `[T, N, ...]`, possibly from older policy versions.

    Samples with lag > `hparams.max_lag` are dropped (weight 0) and counted. If every sample
    is dropped, the state is returned unchanged (no version bump, no Adam step).

    The batch is normalised with the learner's statistics (`learner_view`): those of its
    version (`rollout.stats_update = "after_sgd"`, then merged with the batch's moments after
    the SGD steps) or already merged with them (`"before_sgd"`). Either way the new version's
    parameters and statistics travel to samplers together (`snapshot_of`).

    Args:
      ctx: static learner context.
      state: the learner's `TrainState`.
      trajectory: transitions `[T, N, ...]`.
      key: PRNG key for minibatch shuffling.
      hparams: traced hyperparameters.

    Returns:
      `(new_state, metrics)`: scalars averaged over all minibatches (`approx_kl` and its parts
      `kl_staleness` + `kl_update` + `kl_cross`, `diagnostics.kl_parts`), plus `approx_kl_max` (max
      over minibatches), `ratio_max` (max over samples), lag statistics of the consumed batch
      (`lag_histogram`, `lag_mean`, `lag_max`, `dropped_stale`) and per-lag-bucket
      `kl_per_lag` / `clip_fraction_per_lag` (NaN where no sample had that lag).
    """
    lag = sample_lag(trajectory, state.version)
    obs_stats, reward_stats = updated_stats(ctx, state.obs_stats, state.reward_stats, trajectory)
    view_stats = (obs_stats, reward_stats) if ctx.stats_before_sgd else (state.obs_stats, state.reward_stats)
    batch = compute_targets(ctx, state.params, learner_view(ctx, trajectory, *view_stats), hparams, lag)
    learning_rate = learning_rate_at(ctx, hparams, state.version)
    every = jnp.maximum(hparams.value_update_every.astype(jnp.int32), 1)
    value_flag = (state.version % every == 0).astype(jnp.float32)

    opt_state = with_step_hyperparams(state.opt_state, learning_rate, hparams.max_grad_norm, value_flag)
    run_epochs = static_epochs if ctx.sgd_slots is None else slotted_epochs
    (params, opt_state, prox_params), per_step, (behavior_log_prob, weight, step_lag), step_valid, sgd_steps = run_epochs(
        ctx, hparams, value_flag, (state.params, opt_state, state.prox_params), batch, key
    )
    log_prob, anchor, prox, advantage = (per_step.pop(k) for k in ("log_prob", "anchor_log_prob", "prox_log_prob", "advantage"))
    per_step.update(minibatch_diagnostics(ctx, hparams, log_prob, anchor, behavior_log_prob, advantage, weight, step_lag,
                                          prox))
    metrics = iteration_metrics(ctx, per_step, batch, lag, step_valid)  # (global under data parallelism)
    metrics["learning_rate"] = learning_rate
    metrics["value_updated"] = value_flag

    consumed = metrics.pop("consumed")
    new_state = TrainState(
        params=params,
        opt_state=opt_state,
        obs_stats=obs_stats,
        version=state.version + 1,
        sgd_steps=state.sgd_steps + sgd_steps,
        env_steps=state.env_steps + consumed,
        reward_stats=reward_stats,
        prox_params=prox_params,
    )
    # Nothing consumed (every sample stale): keep the old state bit for bit.
    new_state = jax.tree.map(lambda n, o: jnp.where(consumed > 0, n, o), new_state, state)
    metrics["consumed"] = consumed
    return new_state, metrics
