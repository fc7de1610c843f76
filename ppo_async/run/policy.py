"""A trained policy read back from a run directory, and deterministic evaluation.

`ppo_async.load(run_dir)` (in `ppo_async.modes.train`) returns a `Policy` read from a run's
checkpoint, `TrainResult.policy(i)` one from a finished run. `evaluate(policy, num_episodes)`
plays whole episodes, vmapped and jitted, acting on raw observations normalised with the
policy's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async import envs
from ppo_async.core import host_rollout
from ppo_async.config import Config, ConfigError
from ppo_async.envs import Env
from ppo_async.core.networks import ActorCritic, make_actor_critic, mode_action, sample_action
from ppo_async.core.types import RunningMeanStd
from ppo_async.core import normalization

__all__ = ["Policy", "evaluate"]


def check_seed_index(config: Config, seed_index: Any) -> None:
    """Raises ConfigError unless `seed_index` is an integer in [0, config.num_seeds)."""
    if not isinstance(seed_index, int) or isinstance(seed_index, bool) or not 0 <= seed_index < config.num_seeds:
        raise ConfigError(f"seed_index = {seed_index!r} is invalid: the run has {config.num_seeds} seed(s)")


@dataclass(frozen=True)
class Policy:
    """One seed's trained actor-critic.

    Attributes:
      config: the run's config.
      env: its `Env`.
      network: its `ActorCritic`.
      params: network params of seed `seed_index` (no seed axis).
      obs_stats: that seed's observation normalisation statistics.
      iteration: learner iteration of the checkpoint.
      seed_index: which seed of the run (its seed is `config.seed + seed_index`).
    """

    config: Config
    env: Env
    network: ActorCritic
    params: Any
    obs_stats: RunningMeanStd
    iteration: int
    seed_index: int = 0
    _act: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def of_seed(cls, config: Config, train_state: Any, seed_index: int, iteration: int | None = None) -> "Policy":
        """Seed `seed_index`'s policy from a seed-stacked `TrainState` (leaves `[num_seeds, ...]`).

        `iteration` defaults to that seed's learner version. Raises ConfigError for a seed
        index out of range.
        """
        check_seed_index(config, seed_index)
        state = jax.tree.map(lambda x: x[seed_index], train_state)
        env = envs.make_env(config.env, config.env_options)
        return cls(
            config=config,
            env=env,
            network=make_actor_critic(env, config.network),
            params=state.params,
            obs_stats=state.obs_stats,
            iteration=int(state.version) if iteration is None else int(iteration),
            seed_index=seed_index,
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "_act", jax.jit(self._act_impl))

    def _act_impl(self, params: Any, obs_stats: RunningMeanStd, obs: chex.Array, key: chex.PRNGKey | None) -> chex.Array:
        rc = self.config.rollout
        dist, _ = self.network.apply(params, normalization.normalize_obs(obs_stats, jnp.asarray(obs, jnp.float32), rc.obs_clip, rc.normalize_obs))
        return mode_action(dist) if key is None else sample_action(key, dist)

    def act(self, obs: chex.Array, key: chex.PRNGKey | None = None) -> chex.Array:
        """Actions for raw observations `[..., O...]`: sampled with `key`, else the mean / argmax.

        Continuous actions are unclipped; `envs.env_action` clips them to the bounds.
        """
        return self._act(self.params, self.obs_stats, obs, key)


def episodes_program(policy: Policy, num_episodes: int, deterministic: bool = True,
                     max_steps: int | None = None) -> Any:
    """A jitted `(params, obs_stats, seed) -> (returns [E], lengths [E])` playing `num_episodes`
    episodes (vmapped) of `policy`'s env and network from independent resets.

    Params are arguments, not constants, so one compile serves every params of the same shapes
    (evaluation during training calls it with the learner's params again and again). Each
    episode runs until its first `done` (termination or the env's time limit), at most
    `max_steps` steps (default: the env's `max_steps_in_episode`).
    """
    if not isinstance(num_episodes, int) or isinstance(num_episodes, bool) or num_episodes < 1:
        raise ConfigError(f"num_episodes = {num_episodes!r} is invalid: must be an integer >= 1")
    env = policy.env
    if env.host_side:  # Gymnasium: stepped on the host, not jittable
        return host_rollout.host_episodes_program(policy, num_episodes, deterministic, max_steps)
    if max_steps is None:
        max_steps = int(getattr(env.params, "max_steps_in_episode", 1000))
    clip = policy.config.rollout.clip_actions

    def episode(params: Any, obs_stats: RunningMeanStd, key: chex.PRNGKey) -> tuple[chex.Array, chex.Array]:
        reset_key, key = jax.random.split(key)
        obs, state = env.env.reset(reset_key, env.params)

        def body(carry: Any, _: Any) -> tuple[Any, None]:
            obs, state, ret, length, alive, key = carry
            key, act_key, step_key = jax.random.split(key, 3)
            action = policy._act_impl(params, obs_stats, obs, None if deterministic else act_key)
            obs, state, reward, terminated, truncated, _ = env.env.step(
                step_key, state, envs.env_action(env, action, clip), env.params
            )
            ret = ret + jnp.where(alive, jnp.asarray(reward, jnp.float32).reshape(()), 0.0)
            length = length + alive.astype(jnp.int32)
            done = jnp.logical_or(jnp.asarray(terminated, bool), jnp.asarray(truncated, bool)).reshape(())
            alive = alive & ~done
            return (obs, state, ret, length, alive, key), None

        init = (obs, state, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), jnp.ones((), bool), key)
        (_, _, ret, length, _, _), _ = jax.lax.scan(body, init, None, length=max_steps)
        return ret, length

    def play(params: Any, obs_stats: RunningMeanStd, seed: chex.Array) -> tuple[chex.Array, chex.Array]:
        keys = jax.random.split(jax.random.PRNGKey(seed), num_episodes)
        return jax.vmap(episode, in_axes=(None, None, 0))(params, obs_stats, keys)

    return jax.jit(play)


def evaluate(policy: Policy, num_episodes: int = 20, seed: int = 0, deterministic: bool = True, max_steps: int | None = None) -> dict[str, np.ndarray]:
    """Plays `num_episodes` episodes (vmapped, one jitted program, `episodes_program`) from
    independent resets; returns per-episode `{"returns": [E] float, "lengths": [E] int}`."""
    play = episodes_program(policy, num_episodes, deterministic, max_steps)
    returns, lengths = play(policy.params, policy.obs_stats, seed)
    return {"returns": np.asarray(returns), "lengths": np.asarray(lengths)}
