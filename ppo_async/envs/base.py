"""Environments by name, vectorised reset/step with episode statistics.

Pure functions over `EnvState` (N envs); `Env` bundles a gymnax-style env with its params
and a description of its spaces. Names choose the family by prefix: gymnax names as they
are, `brax/<name>` and `playground/<name>` (wrapped by `physics.PhysicsEnv` behind the same
gymnax interface, so every mode runs them inside the jitted rollout), and `gymnasium/<id>`
(host-side simulators stepped by each sampler thread: `host_envs`, threaded mode only). Every env in a batch gets its own PRNG key, derived from the
caller's key, so seeds are distinct and reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import chex
import jax
import jax.numpy as jnp
import numpy as np

import ppo_async.envs.physics as physics
from ppo_async.envs.gymnax_import import import_gymnax
from ppo_async.envs.mujoco_notices import filter_mujoco_notices
from ppo_async.envs.registry import HOST_ENV_FAMILIES, check_env_name, split_env_name
from ppo_async.errors import ConfigError


class EnvState(NamedTuple):
    """State of N vectorised environments plus per-env episode accumulators."""

    env_state: Any  # gymnax state, leaves [N, ...]
    obs: chex.Array  # [N, O...] raw observation
    episode_return: chex.Array  # [N] float32 return so far of the running episode
    episode_length: chex.Array  # [N] int32
    discounted_return: chex.Array  # [N] float32 running discounted return (the rollout keeps it for reward normalisation)


@dataclass(frozen=True)
class Env:
    """A gymnax environment, its params and the facts the networks need.

    Attributes:
      name: the env name as configured (e.g. "Pendulum-v1", "brax/hopper").
      env: the gymnax(-style) environment object (`physics.PhysicsEnv` for brax and
        playground, `host_envs.HostEnvSpec` for gymnasium, which has no jittable step).
      params: its `EnvParams`.
      obs_shape: observation shape `O...`.
      discrete: True for a categorical action space.
      num_actions: K for discrete spaces, else 0.
      action_shape: `(A,)` for continuous spaces, `()` for discrete.
      action_low, action_high: continuous bounds (float32 arrays `[A]`), None for discrete.
    """

    name: str
    env: Any
    params: Any
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int
    action_shape: tuple[int, ...]
    action_low: np.ndarray | None
    action_high: np.ndarray | None

    def __hash__(self) -> int:  # used as a static argument of jitted functions
        return hash((self.name, self.obs_shape, self.action_shape))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Env) and (self.name, self.params) == (other.name, other.params)


    @property
    def family(self) -> str:
        """"gymnax", "brax", "playground", "gymnasium" or "envpool"."""
        return split_env_name(self.name)[0]

    @property
    def host_side(self) -> bool:
        """True for envs stepped on the host (gymnasium, envpool), outside any jitted program."""
        return self.family in HOST_ENV_FAMILIES


class PhysicsOptions(Protocol):
    """What `make_env` reads of its options (`ppo_async.config.EnvOptions` is one)."""

    backend: str | None
    episode_length: int | None


def make_env(name: str, options: PhysicsOptions | None = None) -> Env:
    """Builds an env by name (family by prefix, see the module docstring) with its options.

    Unknown names raise ConfigError listing the known ones; a missing optional family names
    the pip extra to install.
    """
    check_env_name(name)
    family, task = split_env_name(name)
    if family in ("brax", "playground"):
        build = physics.make_brax if family == "brax" else physics.make_playground
        backend, episode_length = (options.backend, options.episode_length) if options else (None, None)
        sim, params = build(task, backend, episode_length)
        shape = (sim.action_size,)
        return Env(name, sim, params, (sim.obs_size,), False, 0, shape, sim.action_low, sim.action_high)
    if family == "gymnasium":
        return _gymnasium_env(name, task)
    if family == "envpool":
        from gymnasium import spaces

        from ppo_async.envs.envpool import envpool_spaces  # lazily: needs the [envpool] extra

        spec, obs_shape, space = envpool_spaces(name, task)
        return _env_of_space(name, spec, spec, obs_shape, space, spaces.Discrete, spaces.Box)
    gymnax = import_gymnax()
    from gymnax.environments import spaces

    env, params = gymnax.make(name)
    obs_shape = tuple(env.observation_space(params).shape)
    return _env_of_space(name, env, params, obs_shape, env.action_space(params), spaces.Discrete, spaces.Box)

def _env_of_space(name: str, env: Any, params: Any, obs_shape: tuple[int, ...], space: Any,
                  discrete: type, box: type) -> Env:
    """An `Env` for an action space of gymnax's or Gymnasium's `Discrete` / `Box` classes."""
    if isinstance(space, discrete):
        return Env(name, env, params, obs_shape, True, int(space.n), (), None, None)
    if isinstance(space, box):
        shape = tuple(space.shape) if space.shape else (1,)
        low = np.broadcast_to(np.asarray(space.low, np.float32), shape).copy()
        high = np.broadcast_to(np.asarray(space.high, np.float32), shape).copy()
        return Env(name, env, params, obs_shape, False, 0, shape, low, high)
    raise ConfigError(f"env = {name!r}: action space {type(space).__name__} is not supported")

@dataclass(frozen=True)
class GymnasiumSpec:
    """What identifies a host-side Gymnasium env: its registered id (each sampler thread
    builds its own vector env from it, `host_envs`).

    Attributes:
      env_id: the Gymnasium id (e.g. "HalfCheetah-v5").
      max_steps_in_episode: its registered time limit (`max_episode_steps`), 1000 if none.
    """

    env_id: str
    max_steps_in_episode: int

def _gymnasium_env(name: str, env_id: str) -> Env:
    """An `Env` describing Gymnasium env `env_id` (one instance is made to read its spaces)."""
    import gymnasium
    from gymnasium import spaces

    filter_mujoco_notices()  # before the probe compiles the first model
    try:
        probe = gymnasium.make(env_id)
    except Exception as exc:  # noqa: BLE001 - a registered id whose simulator is missing (mujoco)
        raise ConfigError(f"env = {name!r} could not be made: {type(exc).__name__}: {exc} "
                          "(MuJoCo tasks need the [gymnasium] extra: gymnasium[mujoco])") from exc
    try:
        obs_space, space = probe.observation_space, probe.action_space
        limit = probe.spec.max_episode_steps if probe.spec is not None else None
    finally:
        probe.close()
    if not isinstance(obs_space, spaces.Box):
        raise ConfigError(f"env = {name!r}: observation space {type(obs_space).__name__} is not supported (only Box)")
    spec = GymnasiumSpec(env_id, int(limit or 1000))
    return _env_of_space(name, spec, spec, tuple(obs_space.shape), space, spaces.Discrete, spaces.Box)

def _strongly_typed(tree: Any) -> Any:
    """Casts every leaf to a strongly-typed array of its own dtype.

    gymnax resets leave weakly-typed leaves that `step` returns strongly typed, which makes
    a jitted rollout started from a fresh reset recompile on its second call.
    """
    return jax.tree.map(lambda x: jnp.asarray(x, dtype=jnp.asarray(x).dtype), tree)

def reset_envs(env: Env, key: chex.PRNGKey, num_envs: int) -> EnvState:
    """Resets `num_envs` envs, each with its own key. Returns `EnvState` with leaves `[N, ...]`."""
    keys = jax.random.split(key, num_envs)
    obs, state = jax.vmap(env.env.reset, in_axes=(0, None))(keys, env.params)
    return EnvState(
        env_state=_strongly_typed(state),
        obs=jnp.asarray(obs, jnp.float32),
        episode_return=jnp.zeros((num_envs,), jnp.float32),
        episode_length=jnp.zeros((num_envs,), jnp.int32),
        discounted_return=jnp.zeros((num_envs,), jnp.float32),
    )

class EnvStep(NamedTuple):
    """What stepping N envs returns (all `[N, ...]`)."""

    obs: chex.Array  # [N, O...] raw observation to act on next (after auto-reset)
    reward: chex.Array  # [N] float32
    terminated: chex.Array  # [N] bool
    truncated: chex.Array  # [N] bool (time limit, not terminated)
    final_obs: chex.Array  # [N, O...] raw observation reached, before auto-reset
    finished_return: chex.Array  # [N] return of the episode that ended here, else 0
    finished_length: chex.Array  # [N] int32 its length, else 0

def env_action(env: Env, action: chex.Array, clip_actions: bool) -> chex.Array:
    """The action handed to the env: clipped to the bounds for continuous control if asked.

    A NumPy action (a host-side sampler's, after `device_get`) is clipped with NumPy: the same
    values without a JAX dispatch per env step; a JAX array or tracer with `jnp`.
    """
    if env.discrete or not clip_actions:
        return action
    xp = np if isinstance(action, np.ndarray) else jnp
    return xp.clip(action, env.action_low, env.action_high)

def step_envs(
    env: Env, state: EnvState, action: chex.Array, key: chex.PRNGKey, clip_actions: bool = True
) -> tuple[EnvState, EnvStep]:
    """Steps N envs with auto-reset and accumulates episode returns.

    Args:
      env: the environment.
      state: `EnvState` of N envs.
      action: `[N, A]` float or `[N]` int actions.
      key: one key; split per env.
      clip_actions: clip continuous actions to the env bounds.

    Returns:
      `(next_state, EnvStep)`.
    """
    num_envs = state.obs.shape[0]
    keys = jax.random.split(key, num_envs)
    env_act = env_action(env, action, clip_actions)
    obs, env_state, reward, terminated, truncated, info = jax.vmap(
        env.env.step, in_axes=(0, 0, 0, None)
    )(keys, state.env_state, env_act, env.params)
    reward = jnp.asarray(reward, jnp.float32).reshape(num_envs)
    terminated = jnp.asarray(terminated, bool).reshape(num_envs)
    truncated = jnp.logical_and(jnp.asarray(truncated, bool).reshape(num_envs), ~terminated)
    done = jnp.logical_or(terminated, truncated)
    episode_return = state.episode_return + reward
    episode_length = state.episode_length + 1
    step = EnvStep(
        obs=jnp.asarray(obs, jnp.float32),
        reward=reward,
        terminated=terminated,
        truncated=truncated,
        final_obs=jnp.asarray(info["final_observation"], jnp.float32),
        finished_return=jnp.where(done, episode_return, 0.0),
        finished_length=jnp.where(done, episode_length, 0),
    )
    next_state = EnvState(
        env_state=_strongly_typed(env_state),
        obs=step.obs,
        episode_return=jnp.where(done, 0.0, episode_return),
        episode_length=jnp.where(done, 0, episode_length),
        discounted_return=state.discounted_return,  # the rollout advances it (it knows gamma)
    )
    return next_state, step
