"""Sync mode: strict on-policy PPO, one jitted program per learner iteration.

`make_sync_program(config)` returns pure `init(key) -> RunnerState` and
`iteration(runner_state, hparams) -> (runner_state, metrics)`: rollout (`lax.scan` over T
steps of N vmapped envs) -> GAE -> epochs x minibatches of updates. Both vmap over seeds;
`run_sync` is the thin host loop (timing, logging) around `jit(vmap(iteration))`.
Lag is 0 by construction: every rollout uses the params the learner has now.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp

from ppo_async import envs, learner
from ppo_async.config import Config
from ppo_async.learner import Hyperparams, LearnerContext
from ppo_async.networks import make_actor_critic
from ppo_async.rollout import RolloutContext, rollout
from ppo_async.types import EnvState, RolloutStats, TrainState, snapshot_of


class RunnerState(NamedTuple):
    """Everything a sync run carries between iterations (per seed)."""

    train_state: TrainState
    env_state: EnvState
    key: chex.PRNGKey


@dataclass(frozen=True)
class SyncProgram:
    """Pure functions of one sync run (vmap them over seeds)."""

    rollout_ctx: RolloutContext
    learner_ctx: LearnerContext
    init: Callable[[chex.PRNGKey], RunnerState]
    iteration: Callable[[RunnerState, Hyperparams], tuple[RunnerState, dict[str, chex.Array]]]


def rollout_metrics(stats: RolloutStats) -> dict[str, chex.Array]:
    """Episode metrics of one rollout: mean return/length of finished episodes (NaN if none)."""
    count = stats.episode_count
    safe = jnp.maximum(count, 1.0)
    return {
        "episode_return": jnp.where(count > 0, stats.episode_return_sum / safe, jnp.nan),
        "episode_length": jnp.where(count > 0, stats.episode_length_sum / safe, jnp.nan),
        "episodes_finished": count,
        "nonfinite_env_values": stats.nonfinite_count,
    }


def make_contexts(
    config: Config, lag_buckets: int = 1, axis_name: str | None = None
) -> tuple[envs.Env, RolloutContext, LearnerContext]:
    """Env, rollout context and learner context of a config."""
    env = envs.make_env(config.env)
    network = make_actor_critic(env, config.network)
    rollout_ctx = RolloutContext(env=env, network=network, config=config.rollout)
    learner_ctx = learner.make_learner_context(config, network, lag_buckets=lag_buckets, axis_name=axis_name)
    return env, rollout_ctx, learner_ctx


def sampler_env_key(env_key: chex.PRNGKey, sampler: int) -> chex.PRNGKey:
    """Env-reset key of sampler s; sync mode is sampler 0, so it matches a one-sampler emulation."""
    return jax.random.fold_in(env_key, sampler)


def init_runner_state(config: Config, rollout_ctx: RolloutContext, learner_ctx: LearnerContext, key: chex.PRNGKey) -> RunnerState:
    """Fresh train state and N reset envs from one seed key."""
    param_key, env_key, run_key = jax.random.split(key, 3)
    train_state = learner.init_train_state(learner_ctx, param_key, rollout_ctx.env.obs_shape)
    env_state = envs.reset_envs(rollout_ctx.env, sampler_env_key(env_key, 0), config.rollout.num_envs)
    return RunnerState(train_state, env_state, run_key)


def sync_iteration(
    rollout_ctx: RolloutContext,
    learner_ctx: LearnerContext,
    state: RunnerState,
    hparams: Hyperparams,
) -> tuple[RunnerState, dict[str, chex.Array]]:
    """One on-policy iteration: rollout with the current params, then one PPO update."""
    key, rollout_key, update_key = jax.random.split(state.key, 3)
    env_state, trajectory = rollout(rollout_ctx, snapshot_of(state.train_state), state.env_state, rollout_key)
    train_state, metrics = learner.ppo_update(learner_ctx, state.train_state, trajectory, update_key, hparams)
    metrics.update(rollout_metrics(trajectory.stats))
    metrics["learner_version"] = train_state.version
    metrics["sgd_steps"] = train_state.sgd_steps
    return RunnerState(train_state, env_state, key), metrics


def make_sync_program(config: Config) -> SyncProgram:
    """The pure init / iteration functions of a sync run."""
    _, rollout_ctx, learner_ctx = make_contexts(config)
    return SyncProgram(
        rollout_ctx=rollout_ctx,
        learner_ctx=learner_ctx,
        init=lambda key: init_runner_state(config, rollout_ctx, learner_ctx, key),
        iteration=lambda state, hparams: sync_iteration(rollout_ctx, learner_ctx, state, hparams),
    )
