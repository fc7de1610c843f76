"""What one learner is: its static `LearnerContext`, its initial train state, its learning-rate
schedule and the batch it trains on (`Batch`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from ppo_async.config import Config
from ppo_async.core import normalization
from ppo_async.core.lag import is_stale
from ppo_async.core.networks import ActorCritic
from ppo_async.core.types import TrainState, Trajectory
from ppo_async.core.learner.hyperparams import Hyperparams, SgdSlots
from ppo_async.core.learner.optimizer import make_optimizer


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
    normalize_reward: bool = False  # scale rewards by TrainState.reward_stats, merged from consumed discounted returns
    obs_clip: float = 10.0  # normalised observations are clipped to [-obs_clip, obs_clip]
    reward_clip: float = 10.0  # normalised rewards are clipped to [-reward_clip, reward_clip]
    stats_before_sgd: bool = False  # rollout.stats_update = "before_sgd": merge the batch's moments before normalising it

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
        normalize_reward=config.rollout.normalize_reward,
        obs_clip=config.rollout.obs_clip,
        reward_clip=config.rollout.reward_clip,
        stats_before_sgd=config.rollout.stats_update == "before_sgd",
    )

def init_train_state(ctx: LearnerContext, key: chex.PRNGKey, obs_shape: tuple[int, ...]) -> TrainState:
    """Fresh params, Adam state, identity obs and reward statistics, version 0."""
    params = ctx.network.init(key)
    return TrainState(
        params=params,
        opt_state=ctx.optimizer().init(params),
        obs_stats=normalization.init_obs_stats(obs_shape),
        version=jnp.zeros((), jnp.int32),
        sgd_steps=jnp.zeros((), jnp.int32),
        env_steps=jnp.zeros((), jnp.int32),
        reward_stats=normalization.init_reward_stats(),
        prox_params=jax.tree.map(jnp.copy, params) if ctx.use_prox_ewma else None,
    )

def learning_rate_at(ctx: LearnerContext, hparams: Hyperparams, version: chex.Array) -> chex.Array:
    """The learning rate at learner version `version`: `hparams.learning_rate` annealed linearly
    to 0 over `num_iterations` versions (`optax.linear_schedule`; 0 from then on), or constant."""
    if not ctx.anneal_lr:
        return hparams.learning_rate
    return optax.linear_schedule(hparams.learning_rate, 0.0, ctx.num_iterations)(version)

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
    """1.0 for samples with lag <= max_lag, 0.0 for those dropped as stale (`lag.is_stale`;
    `max_lag = inf` keeps all)."""
    return jnp.where(is_stale(lag.astype(jnp.float32), max_lag), 0.0, 1.0).astype(jnp.float32)
