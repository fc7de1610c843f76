"""Brax and MuJoCo Playground environments behind the gymnax interface the rollout uses.

`PhysicsEnv` wraps one Brax (`brax.envs.get_environment`) or MuJoCo Playground
(`mujoco_playground.registry.load`) environment - both expose `reset(rng) -> State` and
`step(State, action) -> State` with `obs`, `reward`, `done` - as a gymnax-style object:

    reset(key, params) -> (obs [O], state)
    step(key, state, action, params) -> (obs, state, reward, terminated, truncated, info)

with the time limit (`params.max_steps_in_episode`, truncation, not termination) and the
auto-reset done here. An ended episode restarts from the initial state its env slot drew at
`reset` (kept in the state), as Brax's and Playground's own training wrappers do: a fresh
reset per step is not affordable for these simulators (Playground's CheetahRun settles its
model for hundreds of physics steps in `reset`; computing it in every step, as gymnax does,
ran at 137 env steps/s against 15k). Every env slot has its own random initial state;
`info["final_observation"]` is the observation reached before the reset, for bootstrapping
a truncated episode. Everything is pure and jittable; `envs.step_envs` vmaps it like a
gymnax env, so the rollout stays one `lax.scan` in every mode.

Brax's reset state carries Python floats where its step state has arrays; the wrapper casts
the reset state to the step state's types (`_like`), so a rollout jitted on a fresh reset
does not recompile on its second call (MEASURED.md: ~20 s per recompile otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.errors import ConfigError

# Brax backends that ran best on CPU per env (MEASURED.md, steps/s at 16 and 256 envs);
# an env not listed uses brax's own default ("generalized").
BRAX_DEFAULT_BACKEND = {
    "inverted_pendulum": "generalized",
    "inverted_double_pendulum": "generalized",
    "reacher": "generalized",
    "hopper": "positional",
    "halfcheetah": "positional",
    "walker2d": "positional",
    "ant": "mjx",
}
DEFAULT_EPISODE_LENGTH = 1000  # brax's training default; playground tasks give their own


@dataclass(frozen=True)
class PhysicsParams:
    """The static facts of a wrapped physics env (hashable: part of the `Env` identity).

    Attributes:
      max_steps_in_episode: time limit in env steps (a truncation, bootstrapped).
      backend: brax pipeline or playground implementation it was built with.
    """

    max_steps_in_episode: int
    backend: str


class PhysicsState(NamedTuple):
    """A wrapped env's state: the simulator's own state, the steps taken in this episode, and
    the initial state the slot restarts from."""

    inner: Any
    time: chex.Array  # [] int32
    first: Any  # the simulator state drawn at reset


@dataclass(frozen=True, eq=False)
class PhysicsEnv:
    """A Brax / Playground env with the gymnax-style `reset` / `step` described above.

    Attributes:
      family: "brax" or "playground".
      task: the family's env name (e.g. "inverted_pendulum", "CartpoleBalance").
      sim: the family's env object.
      obs_size, action_size: flat sizes.
      action_low, action_high: actuator control range `[A]` (float32).
    """

    family: str
    task: str
    sim: Any
    obs_size: int
    action_size: int
    action_low: np.ndarray
    action_high: np.ndarray

    def reset(self, key: chex.PRNGKey, params: PhysicsParams) -> tuple[chex.Array, PhysicsState]:
        """A fresh episode: `(obs [O] float32, state)` with the step state's leaf types."""
        inner = _like(self.sim.reset(key), self._step_types())
        return jnp.asarray(inner.obs, jnp.float32), PhysicsState(inner, jnp.zeros((), jnp.int32), inner)

    def _step_types(self) -> Any:
        """Shapes and dtypes of the state `step` returns (traced once per env object)."""
        cached = self.__dict__.get("_step_types_cache")
        if cached is None:
            def one_step(key: chex.PRNGKey) -> Any:
                return self.sim.step(self.sim.reset(key), jnp.zeros((self.action_size,), jnp.float32))

            cached = jax.eval_shape(one_step, jax.random.PRNGKey(0))
            object.__setattr__(self, "_step_types_cache", cached)
        return cached

    def step(self, key: chex.PRNGKey, state: PhysicsState, action: chex.Array, params: PhysicsParams
             ) -> tuple[chex.Array, PhysicsState, chex.Array, chex.Array, chex.Array, dict]:
        """One control step with the time limit and the auto-reset to the slot's initial state.

        Returns `(obs, state, reward [], terminated [] bool, truncated [] bool,
        {"final_observation": obs reached before any reset})`. `key` is unused (the
        simulators step deterministically; it keeps the gymnax signature).
        """
        del key
        inner = _like(self.sim.step(state.inner, jnp.asarray(action, jnp.float32).reshape((self.action_size,))),
                      self._step_types())
        time = state.time + 1
        reached = jnp.asarray(inner.obs, jnp.float32)
        terminated = jnp.asarray(inner.done, jnp.float32).reshape(()) > 0.5
        truncated = jnp.logical_and(time >= params.max_steps_in_episode, ~terminated)
        done = jnp.logical_or(terminated, truncated)
        restart = jax.tree.map(lambda first, now: jnp.where(done, first, now), state.first, inner)
        next_state = PhysicsState(restart, jnp.where(done, 0, time), state.first)
        reward = jnp.asarray(inner.reward, jnp.float32).reshape(())
        obs = jnp.asarray(restart.obs, jnp.float32)
        return obs, next_state, reward, terminated, truncated, {"final_observation": reached}


def _like(tree: Any, types: Any) -> Any:
    """`tree` with every leaf cast to the dtype of the matching leaf of `types` (ShapeDtypeStructs)."""
    leaves, treedef = jax.tree.flatten(tree)
    type_leaves, type_def = jax.tree.flatten(types)
    if treedef != type_def:
        raise ValueError(f"reset and step states differ in structure:\n{treedef}\n{type_def}")
    return treedef.unflatten([jnp.asarray(x, t.dtype) for x, t in zip(leaves, type_leaves)])


def _bounds(ctrl_range: Any, limited: Any, action_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Control range `[A, 2]` -> (low, high) float32; unlimited actuators get [-1, 1]."""
    low = -np.ones((action_size,), np.float32)
    high = np.ones((action_size,), np.float32)
    if ctrl_range is not None and np.asarray(ctrl_range).shape == (action_size, 2):
        rng = np.asarray(ctrl_range, np.float32)
        mask = np.ones((action_size,), bool) if limited is None else np.asarray(limited, bool)
        low = np.where(mask, rng[:, 0], low).astype(np.float32)
        high = np.where(mask, rng[:, 1], high).astype(np.float32)
    return low, high


def make_brax(task: str, backend: str | None, episode_length: int | None) -> tuple[PhysicsEnv, PhysicsParams]:
    """A Brax env by name (`brax.envs.get_environment`) with its per-env default backend."""
    from brax import envs as brax_envs

    backend = backend or BRAX_DEFAULT_BACKEND.get(task, "generalized")
    sim = brax_envs.get_environment(task, backend=backend)
    actuator = getattr(sim.sys, "actuator", None)
    low, high = _bounds(getattr(actuator, "ctrl_range", None), None, sim.action_size)
    env = PhysicsEnv("brax", task, sim, int(sim.observation_size), int(sim.action_size), low, high)
    return env, PhysicsParams(int(episode_length or DEFAULT_EPISODE_LENGTH), backend)


def make_playground(task: str, backend: str | None, episode_length: int | None) -> tuple[PhysicsEnv, PhysicsParams]:
    """A MuJoCo Playground env by name with `impl='jax'` unless `backend` says otherwise; the
    time limit defaults to the task's `episode_length`."""
    from mujoco_playground import registry

    backend = backend or "jax"
    defaults = registry.get_default_config(task)
    sim = registry.load(task, config_overrides={"impl": backend})
    if not isinstance(sim.observation_size, int):
        raise ConfigError(f"env = 'playground/{task}' has dict observations {sim.observation_size}; only flat ones are supported")
    model = sim.mj_model
    low, high = _bounds(model.actuator_ctrlrange, model.actuator_ctrllimited, int(sim.action_size))
    length = int(episode_length or defaults.get("episode_length", DEFAULT_EPISODE_LENGTH))
    env = PhysicsEnv("playground", task, sim, int(sim.observation_size), int(sim.action_size), low, high)
    return env, PhysicsParams(length, backend)
