"""Data types shared by every mode: transitions, trajectories, running statistics, train state.

Shapes are time-major: `T` = rollout.num_steps, `N` = rollout.num_envs, `A` = action dims,
`K` = discrete actions, `O...` = observation shape.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import chex
import jax.numpy as jnp

from ppo_async.envs.base import EnvState  # noqa: F401  (re-exported: the state of N envs)


class GaussianDist(NamedTuple):
    """Diagonal Gaussian policy output."""

    mean: chex.Array  # [..., A]
    log_std: chex.Array  # [..., A] (broadcast to the mean's shape)


class CategoricalDist(NamedTuple):
    """Categorical policy output."""

    logits: chex.Array  # [..., K]


Dist = GaussianDist | CategoricalDist


class RunningMeanStd(NamedTuple):
    """Running mean / variance of observations `[O...]` or of discounted returns `[]`
    (parallel Welford; Chan et al. 1979)."""

    mean: chex.Array  # [O...] (or []) float32
    var: chex.Array  # [O...] (or []) float32
    count: chex.Array  # [] float32


class Transition(NamedTuple):
    """One step of N envs, stacked to `[T, N, ...]` by a rollout.

    Observations and rewards are the env's own (raw): normalisation is part of the policy,
    and the learner applies its own statistics to every batch (`learner_view`). The behaviour
    log-prob is the one the sampler computed with its snapshot (parameters and statistics), so
    the importance ratio covers the drift of the whole policy. A time-limit truncation keeps
    the observation reached in `final_obs` so the learner can bootstrap through it.
    """

    obs: chex.Array  # [T, N, O...] raw observation acted on at step t
    action: chex.Array  # [T, N, A] float32 (unclipped sample) or [T, N] int32
    reward: chex.Array  # [T, N] the env's reward r_t (the learner scales it: normalize_reward, reward_scale)
    terminated: chex.Array  # [T, N] bool: the MDP ended at step t (no bootstrap)
    truncated: chex.Array  # [T, N] bool: a time limit cut the episode at step t (bootstrap)
    final_obs: chex.Array  # [T, N, O...] raw observation reached by step t, before any auto-reset
    behavior_log_prob: chex.Array  # [T, N] log pi_behaviour(a_t | s_t)
    behavior_dist: Any  # GaussianDist [T, N, A] or CategoricalDist [T, N, K]
    policy_version: chex.Array  # [T, N] int32 learner version of the behaviour params


class RolloutStats(NamedTuple):
    """What a rollout saw, reduced over its T x N steps (cheap to carry with a trajectory)."""

    episode_return_sum: chex.Array  # [] sum of undiscounted, unscaled returns of finished episodes
    episode_length_sum: chex.Array  # [] sum of their lengths
    episode_count: chex.Array  # [] number of episodes finished in the rollout
    obs_moments: RunningMeanStd  # moments of the raw observations seen (for normalisation)
    return_moments: RunningMeanStd  # [] moments of the discounted returns G_t seen (reward normalisation)
    nonfinite_count: chex.Array  # [] count of non-finite rewards/observations seen


class Trajectory(NamedTuple):
    """A rollout: transitions plus the observation after the last step."""

    transitions: Transition  # [T, N, ...]
    last_obs: chex.Array  # [N, O...] raw observation s_T
    stats: RolloutStats


class TrainState(NamedTuple):
    """Everything the learner owns (and a checkpoint must hold)."""

    params: Any  # network params pytree
    opt_state: Any  # optax state
    obs_stats: RunningMeanStd
    version: chex.Array  # [] int32 learner version: +1 per learner iteration
    sgd_steps: chex.Array  # [] int32 gradient steps taken
    env_steps: chex.Array  # [] int32 env steps consumed by the learner
    reward_stats: RunningMeanStd  # [] moments of consumed discounted returns (rollout.normalize_reward)
    prox_params: Any = None  # EWMA of `params`, the proximal policy of ppo.prox_ewma (None when unused)


class PolicySnapshot(NamedTuple):
    """What a sampler acts with: params, normalisation statistics and their version."""

    params: Any
    obs_stats: RunningMeanStd
    version: chex.Array  # [] int32
    reward_stats: RunningMeanStd  # [] the learner's discounted-return moments (rollout.normalize_reward)


def snapshot_of(state: TrainState) -> PolicySnapshot:
    """The behaviour policy a sampler would pull from this train state."""
    return PolicySnapshot(state.params, state.obs_stats, state.version, state.reward_stats)


def scalar(x: Any, dtype: Any = jnp.float32) -> chex.Array:
    """A 0-d array of `dtype`."""
    return jnp.asarray(x, dtype=dtype)
