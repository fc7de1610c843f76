"""Sync mode: strict on-policy PPO, one jitted program per learner iteration.

`make_sync_program(config)` returns pure `init(key) -> RunnerState` and
`iteration(runner_state, hparams) -> (runner_state, metrics)`: rollout (`lax.scan` over T
steps of N vmapped envs) -> GAE -> epochs x minibatches of updates. Both vmap over seeds;
the host loop is `common.run_jitted` around `jit(vmap(iteration))`.
Lag is 0 by construction: every rollout uses the params the learner has now.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, NamedTuple

import chex
import jax

from ppo_async import envs
from ppo_async.core import learner
from ppo_async.config import Config
from ppo_async.core.learner import Hyperparams, LearnerContext, hyperparams_from_config
from ppo_async.modes.common import (
    JittedProgram,
    jitted_checkpoint_like,
    make_contexts,
    over_seeds,
    rollout_and_update,
    run_jitted,
    sampler_env_key,
)
from ppo_async.modes.registry import Mode, register_mode
from ppo_async.core.rollout import RolloutContext
from ppo_async.core.types import EnvState, TrainState, snapshot_of


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
    snapshot = snapshot_of(state.train_state)
    train_state, env_state, key, metrics = rollout_and_update(
        rollout_ctx, learner_ctx, state.train_state, snapshot, state.env_state, state.key, hparams
    )
    return RunnerState(train_state, env_state, key), metrics


def make_sync_program(config: Config) -> SyncProgram:
    """The pure init / iteration functions of a sync run."""
    _, rollout_ctx, learner_ctx = make_contexts(config)
    return SyncProgram(
        rollout_ctx=rollout_ctx,
        learner_ctx=learner_ctx,
        # plain functions (not partials), so chex.assert_max_traces can wrap them
        init=lambda key: init_runner_state(config, rollout_ctx, learner_ctx, key),
        iteration=lambda state, hparams: sync_iteration(rollout_ctx, learner_ctx, state, hparams),
    )


def build_sync(config: Config) -> JittedProgram:
    """The seed-vmapped sync program of a config."""
    program = make_sync_program(config)
    return JittedProgram(
        init=over_seeds(program.init, config.num_seeds),
        step=over_seeds(program.iteration, config.num_seeds, in_axes=(0, None)),
        args=(hyperparams_from_config(config),),
    )


MODE = register_mode(
    Mode(
        name="sync",
        run=functools.partial(run_jitted, build_sync),
        checkpoint_like=jitted_checkpoint_like(build_sync),
    )
)
