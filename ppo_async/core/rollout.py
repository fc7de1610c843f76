"""Pure rollout: `lax.scan` over T steps of N vmapped envs acting with one policy snapshot.

`rollout(ctx, snapshot, env_state, key) -> (env_state, Trajectory)` is jittable and has no
side effects. The snapshot acts on observations normalised with its own statistics, but the
trajectory stores **raw** observations and rewards: normalisation belongs to the policy, and
the learner applies its own statistics at learn time (`core.learner.update.learner_view`).
Every stored transition carries the behaviour policy's log-prob, its distribution parameters
and its `policy_version`, so a learner that consumes it later (asynchronously) computes exact
importance ratios of the whole policy (parameters and statistics).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp

from ppo_async import envs
from ppo_async.core import networks
from ppo_async.config import RolloutConfig
from ppo_async.core.networks import ActorCritic
from ppo_async.core.types import EnvState, PolicySnapshot, RolloutStats, Trajectory, Transition
from ppo_async.core import normalization


@dataclass(frozen=True)
class RolloutContext:
    """The static parts of a rollout: env, network and rollout section of the config.

    `gamma` (ppo.gamma) discounts the returns whose running std normalises rewards; it is
    required when `config.normalize_reward`.
    """

    env: envs.Env
    network: ActorCritic
    config: RolloutConfig
    gamma: float | None = None

    def __post_init__(self) -> None:
        if self.config.normalize_reward and self.gamma is None:
            raise ValueError("RolloutContext.gamma is required with rollout.normalize_reward (the discount of the return it normalises by)")

    def policy_input(self, snapshot: PolicySnapshot, raw_obs: chex.Array) -> chex.Array:
        """Raw observations `[..., O...]` -> normalised policy input under the snapshot's stats."""
        return normalization.normalize_obs(
            snapshot.obs_stats, raw_obs, self.config.obs_clip, self.config.normalize_obs
        )

    def return_step(self, running_return: chex.Array, reward: chex.Array, done: chex.Array) -> tuple[chex.Array, chex.Array]:
        """`normalization.discounted_return_step` at this context's gamma (0 when unused: the
        carry then stays 0 and the moments are never read)."""
        return normalization.discounted_return_step(running_return, reward, done, self.gamma or 0.0)


def rollout_step(
    ctx: RolloutContext, snapshot: PolicySnapshot, env_state: EnvState, key: chex.PRNGKey
) -> tuple[EnvState, tuple[Transition, chex.Array, chex.Array, chex.Array, chex.Array, chex.Array]]:
    """One step of N envs: act with the snapshot, step, record.

    Returns:
      `(next_env_state, (transition [N, ...], raw_obs [N, O...], raw reward [N],
      discounted return G_t [N], finished_return [N], finished_length [N]))`.
    """
    act_key, step_key = jax.random.split(key)
    obs = ctx.policy_input(snapshot, env_state.obs)
    dist, _ = ctx.network.apply(snapshot.params, obs)
    action = networks.sample_action(act_key, dist)
    behavior_log_prob = networks.log_prob(dist, action)
    next_state, step = envs.step_envs(ctx.env, env_state, action, step_key, ctx.config.clip_actions)
    num_envs = env_state.obs.shape[0]
    done = jnp.logical_or(step.terminated, step.truncated)
    discounted, running_return = ctx.return_step(env_state.discounted_return, step.reward, done)
    next_state = next_state._replace(discounted_return=running_return)
    transition = Transition(
        obs=env_state.obs,
        action=action,
        reward=step.reward,
        terminated=step.terminated,
        truncated=step.truncated,
        final_obs=step.final_obs,
        behavior_log_prob=behavior_log_prob,
        behavior_dist=dist,
        policy_version=jnp.full((num_envs,), snapshot.version, jnp.int32),
    )
    return next_state, (transition, env_state.obs, step.reward, discounted, step.finished_return, step.finished_length)


def rollout(
    ctx: RolloutContext, snapshot: PolicySnapshot, env_state: EnvState, key: chex.PRNGKey
) -> tuple[EnvState, Trajectory]:
    """Runs `ctx.config.num_steps` steps of N envs with one params snapshot.

    Args:
      ctx: static env / network / rollout config.
      snapshot: behaviour params, obs statistics and their version.
      env_state: `EnvState` with leaves `[N, ...]`.
      key: PRNG key for actions and env randomness.

    Returns:
      `(env_state after T steps, Trajectory)` with transitions `[T, N, ...]`.
    """
    keys = jax.random.split(key, ctx.config.num_steps)

    def body(state: EnvState, step_key: chex.PRNGKey) -> tuple[EnvState, Any]:
        return rollout_step(ctx, snapshot, state, step_key)

    env_state, (transitions, raw_obs, raw_reward, discounted, finished_return, finished_length) = jax.lax.scan(
        body, env_state, keys
    )
    stats = rollout_stats(ctx, raw_obs, raw_reward, discounted, finished_return, finished_length)
    trajectory = Trajectory(
        transitions=transitions,
        last_obs=env_state.obs,
        stats=stats,
    )
    return env_state, trajectory


def rollout_stats(
    ctx: RolloutContext, raw_obs: chex.Array, raw_reward: chex.Array, discounted: chex.Array,
    finished_return: chex.Array, finished_length: chex.Array,
) -> RolloutStats:
    """What T steps of N envs saw (pure; shared by the jitted and the host rollout).

    Args: raw observations acted on `[T, N, O...]`, env rewards `[T, N]`, discounted returns
    G_t `[T, N]`, finished-episode returns and lengths `[T, N]` (0 where none ended).
    """
    nonfinite = jnp.sum(~jnp.isfinite(raw_reward)) + jnp.sum(~jnp.isfinite(raw_obs))
    return RolloutStats(
        episode_return_sum=jnp.sum(finished_return),
        episode_length_sum=jnp.sum(finished_length).astype(jnp.float32),
        episode_count=jnp.sum(finished_length > 0).astype(jnp.float32),
        obs_moments=normalization.batch_moments(raw_obs, len(ctx.env.obs_shape)),
        return_moments=normalization.batch_moments(discounted, 0),
        nonfinite_count=nonfinite.astype(jnp.int32),
    )


def merge_rollout_stats(stats: Sequence[RolloutStats]) -> RolloutStats:
    """The statistics of several rollouts taken together: episode sums and counts add up,
    observation moments merge (Chan et al. 1979). Also merges processes' shares of a batch."""
    merged = lambda name: functools.reduce(normalization.merge_moments, [getattr(s, name) for s in stats])  # noqa: E731
    total = lambda name: sum(getattr(s, name) for s in stats)  # noqa: E731
    return RolloutStats(
        episode_return_sum=total("episode_return_sum"),
        episode_length_sum=total("episode_length_sum"),
        episode_count=total("episode_count"),
        obs_moments=merged("obs_moments"),
        return_moments=merged("return_moments"),
        nonfinite_count=total("nonfinite_count"),
    )


def concat_trajectories(chunks: Sequence[Trajectory]) -> Trajectory:
    """Several rollout chunks `[T, N_i, ...]` as one trajectory `[T, sum N_i, ...]`.

    Env columns are independent, so GAE / V-trace over the result equal those of each chunk.
    Statistics merge as in `merge_rollout_stats`. Used when a learner batch holds several
    samplers' rollouts (threaded `chunks_per_batch`, barrier).
    """
    if len(chunks) == 1:
        return chunks[0]
    transitions = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=1), *[c.transitions for c in chunks])
    last_obs = jnp.concatenate([c.last_obs for c in chunks], axis=0)
    stats = merge_rollout_stats([c.stats for c in chunks])
    return Trajectory(transitions=transitions, last_obs=last_obs, stats=stats)
