"""Pure PPO learner: `ppo_update(ctx, state, trajectory, key, hparams) -> (state, metrics)`.

One call is one learner iteration (version += 1): value bootstrap through time-limit
truncations, GAE, then `num_epochs x num_minibatches` Adam steps on the PPO or dual-clip
objective. Hyperparameters that do not change shapes travel in `Hyperparams` as arrays, so
one compiled update serves a whole sweep; shape-changing and structural options are static
in `LearnerContext`. With `axis_name` set the update runs data-parallel under shard_map
(`data_parallel_update`): each device holds the trajectory's envs `[T, N / D]`, gradients and
advantage-normalisation statistics are averaged over devices, so every replica takes the
same Adam step (the data-parallel SGD of Goyal et al. 2017).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppo_async.core import losses, networks
from ppo_async.config import Config, get_path
from ppo_async.core.networks import ActorCritic
from ppo_async.core.types import TrainState, Trajectory
from ppo_async.core import normalization


class Hyperparams(NamedTuple):
    """Shape-preserving hyperparameters as float32 scalars (traced inside jit; sweepable).

    `dual_clip = inf` is plain PPO: max(obj, inf * A) = obj for A < 0, bit for bit, so one
    compiled update serves `dual_clip=None` and numeric values alike. `max_lag = inf` keeps
    every sample.
    """

    learning_rate: chex.Array
    gamma: chex.Array
    gae_lambda: chex.Array
    clip_eps: chex.Array
    dual_clip: chex.Array  # inf = off
    value_clip_eps: chex.Array  # ignored unless LearnerContext.use_value_clip
    vf_coef: chex.Array
    ent_coef: chex.Array
    max_grad_norm: chex.Array
    reward_scale: chex.Array
    rho_bar: chex.Array  # V-trace truncations (used when advantage_estimator == "vtrace")
    c_bar: chex.Array
    value_update_every: chex.Array  # the critic is updated when version % k == 0
    max_lag: chex.Array  # stale filter: samples with lag > max_lag get weight 0 (inf = off)
    decoupled: chex.Array  # 1.0: decoupled objective (clip to pi_prox), 0.0: PPO (clip to mu)
    is_clip: chex.Array  # truncation of pi_prox / mu (inf = off)
    prox_ewma: chex.Array  # EWMA decay of the proximal params (used when LearnerContext.use_prox_ewma)
    # The SGD shape, read only when LearnerContext.sgd_slots is set (a sweep group whose configs
    # differ in it); otherwise the static LearnerContext.num_epochs / num_minibatches rule.
    num_epochs: chex.Array
    num_minibatches: chex.Array


# The one list of traced hyperparameters: each `Hyperparams` field and the config field it
# comes from. `sweep` derives its compile groups from it (fields here never split a group).
TRACED_CONFIG_FIELDS: dict[str, str] = {
    "learning_rate": "ppo.learning_rate",
    "gamma": "ppo.gamma",
    "gae_lambda": "ppo.gae_lambda",
    "clip_eps": "ppo.clip_eps",
    "dual_clip": "ppo.dual_clip",
    "value_clip_eps": "ppo.value_clip_eps",
    "vf_coef": "ppo.vf_coef",
    "ent_coef": "ppo.ent_coef",
    "max_grad_norm": "ppo.max_grad_norm",
    "reward_scale": "rollout.reward_scale",
    "rho_bar": "ppo.rho_bar",
    "c_bar": "ppo.c_bar",
    "value_update_every": "ppo.value_update_every",
    "max_lag": "lag.max_lag",
    "decoupled": "ppo.objective",
    "is_clip": "ppo.is_clip",
    "prox_ewma": "ppo.prox_ewma",
}
# What a None config value stands for, as a traced number.
_NONE_AS = {"dual_clip": math.inf, "value_clip_eps": 0.2, "max_lag": math.inf, "is_clip": math.inf, "prox_ewma": 0.0}
# Traced fields whose config value is not a number: how it becomes one.
_AS_NUMBER = {"decoupled": lambda objective: float(objective == "decoupled")}
# Traced fields whose None / not-None is static (it switches a code path) while the value is traced.
STATIC_WHEN_SET = ("ppo.value_clip_eps", "ppo.prox_ewma")


# The SGD shape as traced numbers: `Hyperparams` fields a program reads only when it was built
# with `LearnerContext.sgd_slots` (`sweep` does so for a group whose configs differ in them, e.g.
# `tune`'s step 4); every other program takes them from the static context, and they stay in
# the compile key (`without_traced_fields` keeps them).
SGD_SHAPE_FIELDS: dict[str, str] = {"num_epochs": "ppo.num_epochs", "num_minibatches": "ppo.num_minibatches"}


def hyperparams_from_config(config: Config) -> Hyperparams:
    """The traced hyperparameters of a config (`TRACED_CONFIG_FIELDS`, `SGD_SHAPE_FIELDS`), float32 scalars."""
    values = {}
    for name, path in TRACED_CONFIG_FIELDS.items():
        value = get_path(config, path)
        value = _NONE_AS[name] if value is None else _AS_NUMBER.get(name, float)(value)
        values[name] = jnp.asarray(value, jnp.float32)
    for name, path in SGD_SHAPE_FIELDS.items():
        values[name] = jnp.asarray(float(get_path(config, path)), jnp.float32)
    return Hyperparams(**values)


def without_traced_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A config as a dict (`config_to_dict`) without the traced hyperparameters: what decides
    the compiled program (for a `STATIC_WHEN_SET` field, only whether it is set is kept)."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for path in TRACED_CONFIG_FIELDS.values():
        section, _, name = path.partition(".")
        if section in data and name in data[section]:
            value = data[section].pop(name)
            if path in STATIC_WHEN_SET:
                data[section][f"{name}_is_set"] = value is not None
    return data


class SgdSlots(NamedTuple):
    """Static bounds of an SGD shape traced in `Hyperparams` (`num_epochs`, `num_minibatches`):
    the update scans `max_epochs x max_minibatches` step slots of `batch / min_minibatches`
    samples each and skips (`lax.cond`) the slots past the traced shape; a minibatch smaller
    than its slot is padded with weight-0 samples. Built by `sgd_slots_of` for a sweep group."""

    max_epochs: int
    min_minibatches: int
    max_minibatches: int


def sgd_slots_of(configs: Sequence[Config]) -> SgdSlots | None:
    """The slots that hold every config's SGD shape, or None when they all share one (the
    static update, bit for bit today's)."""
    shapes = {(c.ppo.num_epochs, c.ppo.num_minibatches) for c in configs}
    if len(shapes) <= 1:
        return None
    epochs, minibatches = zip(*shapes)
    return SgdSlots(max(epochs), min(minibatches), max(minibatches))


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
    use_value_clip: bool
    adam_eps: float
    advantage_estimator: str = "gae"  # "gae" | "vtrace"
    lag_buckets: int = 1  # lags 0..lag_buckets-1 get their own KL / clip-fraction bucket; the last also holds larger lags
    axis_name: str | None = None  # data-parallel axis (pmap / shard_map) or None
    use_prox_ewma: bool = False  # the train state carries EWMA proximal params (ppo.prox_ewma set)
    sgd_slots: SgdSlots | None = None  # the SGD shape is traced in Hyperparams within these bounds

    def optimizer(self) -> optax.GradientTransformationExtraArgs:
        """The optimiser: see `make_optimizer`."""
        return make_optimizer(self.adam_eps)


def make_learner_context(
    config: Config, network: ActorCritic, lag_buckets: int = 1, axis_name: str | None = None,
    sgd_slots: SgdSlots | None = None,
) -> LearnerContext:
    """The static learner context of a config (with `sgd_slots`, of every config whose SGD
    shape fits them: `sgd_slots_of`)."""
    ppo = config.ppo
    return LearnerContext(
        network=network,
        num_epochs=ppo.num_epochs,
        num_minibatches=ppo.num_minibatches,
        num_iterations=config.num_iterations,
        anneal_lr=ppo.anneal_lr,
        normalize_advantages=ppo.normalize_advantages,
        normalize_obs=config.rollout.normalize_obs,
        use_value_clip=ppo.value_clip_eps is not None,
        adam_eps=ppo.adam_eps,
        advantage_estimator=ppo.advantage_estimator,
        lag_buckets=lag_buckets,
        axis_name=axis_name,
        use_prox_ewma=ppo.prox_ewma is not None,
        sgd_slots=sgd_slots,
    )


def init_train_state(ctx: LearnerContext, key: chex.PRNGKey, obs_shape: tuple[int, ...]) -> TrainState:
    """Fresh params, Adam state, identity obs statistics, version 0."""
    params = ctx.network.init(key)
    return TrainState(
        params=params,
        opt_state=ctx.optimizer().init(params),
        obs_stats=normalization.init_obs_stats(obs_shape),
        version=jnp.zeros((), jnp.int32),
        sgd_steps=jnp.zeros((), jnp.int32),
        env_steps=jnp.zeros((), jnp.int32),
        prox_params=jax.tree.map(jnp.copy, params) if ctx.use_prox_ewma else None,
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
    prox_log_prob: chex.Array  # log pi_prox(a|s): the learner at the start of the iteration (or its EWMA, per step)
    old_value: chex.Array  # V(s) under the params at the start of the iteration
    advantage: chex.Array
    target: chex.Array  # value target (GAE or V-trace)
    weight: chex.Array  # 1.0 kept, 0.0 dropped (stale)
    lag: chex.Array  # int32 learner version at consumption - policy_version


def sample_lag(trajectory: Trajectory, version: chex.Array) -> chex.Array:
    """`[T, N]` int32 lag of every sample: learner version at consumption - policy_version."""
    return (version - trajectory.transitions.policy_version).astype(jnp.int32)


def stale_weight(lag: chex.Array, max_lag: chex.Array) -> chex.Array:
    """1.0 for samples with lag <= max_lag, 0.0 for those dropped as stale (`max_lag = inf` keeps all)."""
    return (lag.astype(jnp.float32) <= max_lag).astype(jnp.float32)


def compute_targets(
    ctx: LearnerContext,
    params: Any,
    trajectory: Trajectory,
    hparams: Hyperparams,
    lag: chex.Array,
) -> Batch:
    """Values, truncation bootstrap and advantages for one trajectory; flattened to `[T * N, ...]`.

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
    policy_loss is `losses.decoupled_ppo_loss` with the anchor of the clip
    `anchor_log_prob(batch, hparams)`: the behaviour policy (`decoupled = 0`: then the weight
    pi_anchor / mu is exactly 1 and this is the dual-clip PPO loss, Schulman et al. 2017; Ye et
    al. 2020; `dual_clip = inf` is plain PPO clipping) or the proximal policy (`decoupled = 1`,
    Hilton et al. 2021). Samples with weight 0 (stale) take no part. The aux dict holds the
    three loss terms (scalars) and, per sample `[b]`, the log-probabilities under the params
    of this step, the anchor's, and the (normalised) advantages the objective used:
    `minibatch_diagnostics` turns them into the KL / ratio / per-lag metrics once per
    iteration for all minibatches together.
    """
    dist, values = ctx.network.apply(params, batch.obs)
    log_prob = networks.log_prob(dist, batch.action)
    mask = batch.weight
    advantages = batch.advantage
    if ctx.normalize_advantages:
        advantages = losses.normalize_advantages(advantages, mask, axis_name=ctx.axis_name)
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
        "advantage": jax.lax.stop_gradient(advantages),
    }
    return loss, aux


def anchor_log_prob(batch: Batch, hparams: Hyperparams) -> chex.Array:
    """`[b]` log-probability the objective clips the ratio to: the behaviour policy's (PPO) or,
    with `hparams.decoupled = 1`, the proximal policy's (a traced select: one compile serves both)."""
    return jax.lax.stop_gradient(jnp.where(hparams.decoupled > 0.5, batch.prox_log_prob, batch.behavior_log_prob))


def minibatch_diagnostics(
    ctx: LearnerContext,
    hparams: Hyperparams,
    log_prob: chex.Array,
    anchor: chex.Array,
    behavior_log_prob: chex.Array,
    advantage: chex.Array,
    weight: chex.Array,
    lag: chex.Array,
) -> dict[str, chex.Array]:
    """KL, ratio and per-lag diagnostics of every SGD step's minibatch, computed together.

    Inputs are `[E, M, b]` (epochs x minibatches x minibatch size): the log-probabilities
    each step saw under its params and under the objective's anchor (`anchor_log_prob`: the
    behaviour policy for PPO, the proximal policy for decoupled PPO), and that minibatch's
    behaviour log-probs, advantages, weights and lags. Per minibatch (`[E, M]`): `approx_kl`
    to the behaviour policy (Schulman 2020), clip / dual-clip fractions and ratio mean / std /
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
    return {
        "approx_kl": kl,
        **stats._asdict(),
        "is_clip_fraction": is_clip_fraction,
        "lag_count": jnp.sum(bucket, axis=0),
        "lag_kl_sum": kl_terms @ bucket,
        "lag_clip_sum": clipped @ bucket,
    }


def critic_mask(params: Any) -> Any:
    """Pytree of bools, True for the critic's own parameters (modules named `critic*`)."""

    def is_critic(path, _leaf) -> bool:
        return any(getattr(k, "key", "").startswith("critic") for k in path)

    return jax.tree_util.tree_map_with_path(is_critic, params)


def freeze_where(
    inner: optax.GradientTransformation, mask_fn: Callable[[Any], Any], frozen: chex.Array
) -> optax.GradientTransformation:
    """`inner`, except that while `frozen > 0.5` the leaves selected by `mask_fn(params)` get a
    zero update and keep their part of `inner`'s state (e.g. Adam's moments) unchanged.

    A traced `frozen` flag (0.0 / 1.0), so one compiled update serves frozen and unfrozen
    steps; written like optax's own transforms (`optax.masked` selects statically).
    """

    def frozen_update(updates: Any, state: Any, params: Any) -> tuple[Any, Any]:
        new_updates, new_state = inner.update(updates, state, params)
        mask = mask_fn(updates)
        new_updates = jax.tree.map(lambda m, u: jnp.zeros_like(u) if m else u, mask, new_updates)
        state_mask = optax.tree_map_params(inner, lambda _, m: m, new_state, mask, transform_non_params=lambda _: False)
        new_state = jax.tree.map(lambda m, n, o: o if m else n, state_mask, new_state, state)
        return new_updates, new_state

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        # A cond, not a select: unfrozen steps (the common case) pay nothing for the freeze
        # (a select over every parameter and moment cost ~8% of a default-shape iteration).
        return jax.lax.cond(
            jnp.asarray(frozen) > 0.5, frozen_update, inner.update, updates, state, params
        )

    return optax.GradientTransformation(inner.init, update)


def _optimizer_chain(learning_rate: chex.Array, max_grad_norm: chex.Array, freeze_critic: chex.Array, adam_eps: float):
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        freeze_where(optax.scale_by_adam(eps=adam_eps), critic_mask, freeze_critic),
        optax.scale_by_learning_rate(learning_rate),
    )


def make_optimizer(adam_eps: float) -> optax.GradientTransformationExtraArgs:
    """Global-norm gradient clipping -> Adam (critic frozen on demand) -> step size, as one optax chain.

    `learning_rate`, `max_grad_norm` and `freeze_critic` are injected hyperparameters
    (`optax.inject_hyperparams`): they live in the optimiser state and are set, traced, at the
    start of every learner iteration by `with_step_hyperparams`, so one compile serves a sweep.
    """
    return optax.inject_hyperparams(_optimizer_chain, static_args=("adam_eps",))(
        learning_rate=0.0, max_grad_norm=1.0, freeze_critic=0.0, adam_eps=adam_eps
    )


def with_step_hyperparams(opt_state: Any, learning_rate: chex.Array, max_grad_norm: chex.Array, value_flag: chex.Array) -> Any:
    """The optimiser state with this iteration's learning rate, clip norm and critic freeze (1 - value_flag)."""
    as_f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    hyperparams = dict(
        opt_state.hyperparams,
        learning_rate=as_f32(learning_rate),
        max_grad_norm=as_f32(max_grad_norm),
        freeze_critic=as_f32(1.0 - value_flag),
    )
    return opt_state._replace(hyperparams=hyperparams)


def adam_state(opt_state: Any) -> optax.ScaleByAdamState:
    """The Adam moments inside the optimiser state (for inspection and tests)."""
    return opt_state.inner_state[1]


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


def static_epochs(
    ctx: LearnerContext, hparams: Hyperparams, value_flag: chex.Array, carry: tuple[Any, Any, Any], batch: Batch,
    key: chex.PRNGKey,
) -> tuple[tuple[Any, Any, Any], dict[str, chex.Array], tuple[chex.Array, ...], None, int]:
    """`ctx.num_epochs` passes over `batch` `[B]`, each a fresh permutation cut into
    `ctx.num_minibatches` minibatches, one `sgd_step` each.

    Returns the carry, the steps' outputs `[E, M, ...]`, each step's minibatch
    (behaviour log-probs, weights, lags; `[E, M, B / M]`), None (every step ran) and E * M.
    """
    batch_size = batch.advantage.shape[0]
    chex.assert_is_divisible(batch_size, ctx.num_minibatches)

    def epoch(carry, epoch_key):
        perm = jax.random.permutation(epoch_key, batch_size)
        shuffled = jax.tree.map(
            lambda x: x[perm].reshape((ctx.num_minibatches, -1) + x.shape[1:]), batch
        )
        carry, out = jax.lax.scan(lambda c, mb: sgd_step(ctx, hparams, value_flag, c, mb), carry, shuffled)
        return carry, (out, (shuffled.behavior_log_prob, shuffled.weight, shuffled.lag))

    carry, (per_step, minibatches) = jax.lax.scan(epoch, carry, jax.random.split(key, ctx.num_epochs))
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

    def epoch(carry, epoch_input):
        e, epoch_key = epoch_input
        perm = jax.random.permutation(epoch_key, batch_size)

        def step(carry, j):
            minibatch = jax.tree.map(lambda x: x[perm[jnp.minimum(j * minibatch_size + offsets, batch_size - 1)]], batch)
            ran = jnp.logical_and(e < num_epochs, j < num_minibatches)
            weight = minibatch.weight * jnp.logical_and(offsets < minibatch_size, ran).astype(minibatch.weight.dtype)
            minibatch = minibatch._replace(weight=weight)
            run = lambda c: sgd_step(ctx, hparams, value_flag, c, minibatch)  # noqa: E731
            skipped = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), jax.eval_shape(run, carry)[1])
            carry, out = jax.lax.cond(ran, run, lambda c: (c, skipped), carry)
            return carry, (out, (minibatch.behavior_log_prob, weight, minibatch.lag), ran)

        return jax.lax.scan(step, carry, jnp.arange(slots.max_minibatches))

    epochs = (jnp.arange(slots.max_epochs), jax.random.split(key, slots.max_epochs))
    carry, (per_step, minibatches, ran) = jax.lax.scan(epoch, carry, epochs)
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

    Args:
      ctx: static learner context.
      state: the learner's `TrainState`.
      trajectory: transitions `[T, N, ...]`.
      key: PRNG key for minibatch shuffling.
      hparams: traced hyperparameters.

    Returns:
      `(new_state, metrics)`: scalars averaged over all minibatches, plus `approx_kl_max` (max
      over minibatches), `ratio_max` (max over samples), lag statistics of the consumed batch
      (`lag_histogram`, `lag_mean`, `lag_max`, `dropped_stale`) and per-lag-bucket
      `kl_per_lag` / `clip_fraction_per_lag` (NaN where no sample had that lag).
    """
    lag = sample_lag(trajectory, state.version)
    batch = compute_targets(ctx, state.params, trajectory, hparams, lag)
    learning_rate = learning_rate_at(ctx, hparams, state.version)
    every = jnp.maximum(hparams.value_update_every.astype(jnp.int32), 1)
    value_flag = (state.version % every == 0).astype(jnp.float32)

    opt_state = with_step_hyperparams(state.opt_state, learning_rate, hparams.max_grad_norm, value_flag)
    run_epochs = static_epochs if ctx.sgd_slots is None else slotted_epochs
    (params, opt_state, prox_params), per_step, (behavior_log_prob, weight, step_lag), step_valid, sgd_steps = run_epochs(
        ctx, hparams, value_flag, (state.params, opt_state, state.prox_params), batch, key
    )
    log_prob, anchor, advantage = (per_step.pop(k) for k in ("log_prob", "anchor_log_prob", "advantage"))
    per_step.update(minibatch_diagnostics(ctx, hparams, log_prob, anchor, behavior_log_prob, advantage, weight, step_lag))
    metrics = iteration_metrics(ctx, per_step, batch, lag, step_valid)
    metrics.update(ess_metrics(ctx, batch))
    metrics["learning_rate"] = learning_rate
    metrics["value_updated"] = value_flag

    obs_stats = state.obs_stats
    if ctx.normalize_obs:
        # `trajectory.stats` describes the whole rollout (replicated under data parallelism).
        obs_stats = normalization.merge_moments(obs_stats, trajectory.stats.obs_moments)
    consumed = jnp.sum(batch.weight).astype(jnp.int32)
    if ctx.axis_name is not None:
        consumed = jax.lax.psum(consumed, ctx.axis_name)
    new_state = TrainState(
        params=params,
        opt_state=opt_state,
        obs_stats=obs_stats,
        version=state.version + 1,
        sgd_steps=state.sgd_steps + sgd_steps,
        env_steps=state.env_steps + consumed,
        prox_params=prox_params,
    )
    # Nothing consumed (every sample stale): keep the old state bit for bit.
    new_state = jax.tree.map(lambda n, o: jnp.where(consumed > 0, n, o), new_state, state)
    metrics["consumed"] = consumed
    return new_state, metrics


def ess_metrics(ctx: LearnerContext, batch: Batch) -> dict[str, chex.Array]:
    """Effective sample size of the batch's importance weights pi_learner / mu (the learner at
    the start of the iteration over the behaviour policy), as a fraction of the kept samples:
    `ess_fraction` (scalar) and `ess_fraction_per_lag` (`[lag_buckets]`, NaN where no sample
    had that lag). Staleness spreads the weights, and a falling ESS is an early sign of
    collapse under lag. Independent of the objective."""
    log_weight = batch.prox_log_prob - batch.behavior_log_prob
    bucket = jnp.minimum(batch.lag, ctx.lag_buckets - 1)
    return {
        "ess_fraction": losses.ess_fraction(log_weight, batch.weight, axis_name=ctx.axis_name)[0],
        "ess_fraction_per_lag": losses.ess_fraction(log_weight, batch.weight, bucket, ctx.lag_buckets, ctx.axis_name),
    }


def iteration_metrics(
    ctx: LearnerContext, per_minibatch: dict[str, chex.Array], batch: Batch, lag: chex.Array,
    step_ran: chex.Array | None = None,
) -> dict[str, chex.Array]:
    """One iteration's metrics from the per-minibatch diagnostics `[E, M]`, the per-lag sums
    `[lag_buckets]` (`minibatch_diagnostics`) and the batch.

    Scalars are means over minibatches (over those with `step_ran` `[E, M]`, when given:
    `slotted_epochs`); `approx_kl_max` / `ratio_max` maxima; per-lag KL and
    clip fractions are pooled sums over buckets (NaN where no sample had that lag). Under data
    parallelism every shard holds the same number of samples, so means average over devices,
    counts and per-lag sums add up and maxima take the max.
    """
    per_minibatch = dict(per_minibatch)
    lag_count, lag_kl_sum, lag_clip_sum = (per_minibatch.pop(k) for k in ("lag_count", "lag_kl_sum", "lag_clip_sum"))
    lag_stats = lag_metrics(lag, batch.weight.reshape(lag.shape), ctx.lag_buckets)
    if step_ran is None:
        mean, largest = jnp.mean, jnp.max
    else:
        mean = lambda x: jnp.sum(jnp.where(step_ran, x, 0.0)) / jnp.maximum(jnp.sum(step_ran), 1)  # noqa: E731
        largest = lambda x: jnp.max(jnp.where(step_ran, x, -jnp.inf))  # noqa: E731
    metrics = {name: mean(value) for name, value in per_minibatch.items()}
    metrics["explained_variance"] = explained_variance(batch.old_value, batch.target)
    metrics["lag_mean"] = lag_stats.pop("lag_mean")
    approx_kl_max = largest(per_minibatch["approx_kl"])
    ratio_max = largest(per_minibatch["ratio_max"])
    if ctx.axis_name is not None:
        metrics = jax.lax.pmean(metrics, ctx.axis_name)
        lag_count, lag_kl_sum, lag_clip_sum, lag_stats = jax.lax.psum(
            (lag_count, lag_kl_sum, lag_clip_sum, lag_stats), ctx.axis_name
        )
        lag_stats["lag_max"] = jax.lax.pmax(jnp.max(lag), ctx.axis_name).astype(jnp.int32)
        approx_kl_max, ratio_max = jax.lax.pmax((approx_kl_max, ratio_max), ctx.axis_name)
    metrics.update(lag_stats)
    metrics["approx_kl_max"] = approx_kl_max
    metrics["ratio_max"] = ratio_max
    metrics["kl_per_lag"] = jnp.where(lag_count > 0, lag_kl_sum / jnp.maximum(lag_count, 1.0), jnp.nan)
    metrics["clip_fraction_per_lag"] = jnp.where(lag_count > 0, lag_clip_sum / jnp.maximum(lag_count, 1.0), jnp.nan)
    return metrics


LEARNER_AXIS = "learner"


def learner_mesh(devices: Sequence[Any]) -> Mesh:
    """A 1-D mesh over the learner's devices, axis `LEARNER_AXIS`."""
    return Mesh(np.asarray(list(devices)), (LEARNER_AXIS,))


def trajectory_partition(trajectory: Trajectory) -> Trajectory:
    """PartitionSpecs of a data-parallel trajectory: envs split over the learner axis.

    Transitions `[T, N, ...]` and `last_obs [N, ...]` are split along N; the rollout
    statistics (reduced over the whole rollout) are replicated.
    """
    return Trajectory(
        transitions=jax.tree.map(lambda _: PartitionSpec(None, LEARNER_AXIS), trajectory.transitions),
        last_obs=PartitionSpec(LEARNER_AXIS),
        stats=jax.tree.map(lambda _: PartitionSpec(), trajectory.stats),
    )


def data_parallel_update(ctx: LearnerContext, devices: Sequence[Any]) -> tuple[Callable, Callable, Callable]:
    """`ppo_update` data-parallel over `devices` with `jit(shard_map)`.

    Each device runs the update on its `[T, N / D]` slice of the trajectory; `ctx.axis_name`
    must be `LEARNER_AXIS` so gradients, advantage statistics and metrics are reduced over
    devices and every replica stays identical (train state and outputs are replicated).

    Returns:
      `(update, place_state, place_trajectory)`: the jitted update
      `(state, trajectory, key, hparams) -> (state, metrics)` and two functions that put a
      train state (replicated) or a trajectory (split along N) onto the mesh.
    """
    if ctx.axis_name != LEARNER_AXIS:
        raise ValueError(f"ctx.axis_name = {ctx.axis_name!r} is invalid: must be {LEARNER_AXIS!r}")
    mesh = learner_mesh(devices)
    replicated = NamedSharding(mesh, PartitionSpec())

    def run(state, trajectory, key, hparams):
        specs = trajectory_partition(trajectory)
        mapped = jax.shard_map(
            lambda st, tr, k, hp: ppo_update(ctx, st, tr, k, hp),
            mesh=mesh,
            in_specs=(PartitionSpec(), specs, PartitionSpec(), PartitionSpec()),
            out_specs=(PartitionSpec(), PartitionSpec()),
            check_vma=False,  # replicas agree by construction: every update is all-reduced
        )
        return mapped(state, trajectory, key, hparams)

    def place_state(tree: Any) -> Any:
        return jax.device_put(tree, replicated)

    def place_trajectory(trajectory: Trajectory) -> Trajectory:
        specs = trajectory_partition(trajectory)
        shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
        return jax.device_put(trajectory, shardings)

    return jax.jit(run), place_state, place_trajectory


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
    var_targets = jnp.var(targets)
    return jnp.where(var_targets > 0, 1.0 - jnp.var(targets - predictions) / var_targets, jnp.nan)
