"""Host-side simulators (Gymnasium, EnvPool) stepped by each sampler thread, producing the
same `Trajectory` as the jitted rollout.

A threaded sampler on a host-side env owns its own vector env, seeds and episode accumulators:
a `HostVectorEnv` for `gymnasium/<id>` (Gymnasium's `SyncVectorEnv`, same-step auto-reset,
stepped in Python under the GIL) or an `EnvPoolVectorEnv` for `envpool/<id>` (EnvPool's C++
thread pool, the GIL released while it steps; same-step auto-reset too). Both have one
interface; `make_host_env` is the one place that maps a family to its class.
`HostRollout` is what the sampler calls in place of the jitted rollout,
`(snapshot, env_state, key) -> (env_state, Trajectory)`: per step one jitted policy call on
the sampler's device (`act`: normalise, sample, log-prob, distribution parameters) and one
host step of the simulator; after T steps one jitted `assemble` builds the `Trajectory`
(raw observations and rewards, behaviour log-probs and distributions, `policy_version`, the
observation reached at a time limit for bootstrapping, episode statistics, observation
moments, non-finite count) exactly as `rollout.rollout` does for JAX envs. The simulator's
own speed is the sampler's latency; `threaded.sampler_step_latency_ms` still adds to it.

Only this module touches the host vector envs; everything downstream (buffer, learner, lag
metrics, forced refresh, barrier) is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.core import networks, normalization
from ppo_async.core.rollout import RolloutContext, rollout_stats
from ppo_async.core.types import PolicySnapshot, Trajectory, Transition
from ppo_async.envs import base as envs
from ppo_async.envs.envpool import EnvPoolVectorEnv, pool_threads
from ppo_async.envs.gymnasium import HostVectorEnv, seed_of  # noqa: F401  (the sampler's env, re-exported)

HostEnv = HostVectorEnv | EnvPoolVectorEnv  # a sampler's host-side vector env (one interface)
HOST_ENV_TYPES = (HostVectorEnv, EnvPoolVectorEnv)


def make_host_env(env: envs.Env, num_envs: int, seed: int, num_samplers: int = 1) -> HostEnv:
    """A host-side vector env of `num_envs` copies of `env`, env i seeded `seed + i`, by family:
    `EnvPoolVectorEnv` for envpool/* (its pool's threads: the cores shared among `num_samplers`
    samplers, `envpool.pool_threads`), `HostVectorEnv` for gymnasium/*."""
    if env.family == "envpool":
        return EnvPoolVectorEnv(env.env, num_envs, seed, pool_threads(num_envs, num_samplers))
    return HostVectorEnv(env.env, num_envs, seed)



def act(ctx: RolloutContext, snapshot: PolicySnapshot, raw_obs: chex.Array, key: chex.PRNGKey) -> tuple[Any, ...]:
    """The behaviour policy on raw observations `[N, O...]`: `(action [N, A] or [N],
    behavior_log_prob [N], behavior_dist)` (the action unclipped, as stored)."""
    dist, _ = ctx.network.apply(snapshot.params, ctx.policy_input(snapshot, raw_obs))
    action = networks.sample_action(key, dist)
    return action, networks.log_prob(dist, action), dist

def assemble(
    ctx: RolloutContext, snapshot: PolicySnapshot, raw_obs: chex.Array, action: chex.Array,
    behavior_log_prob: chex.Array, behavior_dist: Any, reward: chex.Array, terminated: chex.Array,
    truncated: chex.Array, final_obs: chex.Array, last_obs: chex.Array, finished_return: chex.Array,
    finished_length: chex.Array, discounted: chex.Array,
) -> Trajectory:
    """The `Trajectory` of T host steps (pure; the same fields as `rollout.rollout`).

    Args: raw observations acted on `[T, N, O...]`, actions `[T, N, ...]`, behaviour log-probs
    `[T, N]` and distributions (leaves `[T, N, ...]`), rewards / flags `[T, N]`, the raw
    observations reached `[T, N, O...]`, the raw observation after the last step `[N, O...]`,
    finished-episode returns and lengths `[T, N]` (0 where none ended), the discounted returns
    G_t `[T, N]` (`normalization.discounted_return_step`).
    """
    num_steps, num_envs = reward.shape
    transitions = Transition(
        obs=jnp.asarray(raw_obs, jnp.float32),
        action=action,
        reward=jnp.asarray(reward, jnp.float32),
        terminated=terminated,
        truncated=truncated,
        final_obs=jnp.asarray(final_obs, jnp.float32),
        behavior_log_prob=behavior_log_prob,
        behavior_dist=behavior_dist,
        policy_version=jnp.full((num_steps, num_envs), snapshot.version, jnp.int32),
    )
    stats = rollout_stats(ctx, raw_obs, reward, discounted, finished_return, finished_length)
    return Trajectory(transitions=transitions, last_obs=jnp.asarray(last_obs, jnp.float32), stats=stats)

@dataclass(frozen=True)
class HostRollout:
    """A sampler's rollout on a host-side env: `(snapshot, HostEnv, key) -> (same env,
    Trajectory on the snapshot's device)`. Thread-safe: it holds only jitted functions."""

    ctx: RolloutContext

    def __post_init__(self) -> None:
        object.__setattr__(self, "_act", jax.jit(lambda snap, obs, key: act(self.ctx, snap, obs, key)))
        object.__setattr__(self, "_assemble", jax.jit(lambda snap, *arrays: assemble(self.ctx, snap, *arrays)))
        object.__setattr__(self, "_returns", jax.jit(lambda running, reward, done: normalization.discounted_returns(
            running, reward, done, self.ctx.gamma or 0.0)))

    def make_env(self, seed: int, num_samplers: int = 1) -> HostEnv:
        """The vector env of one of `num_samplers` samplers (the context's env and `num_envs`),
        its env i seeded `seed + i` (`make_host_env`)."""
        return make_host_env(self.ctx.env, self.ctx.config.num_envs, seed, num_samplers)

    def __call__(self, snapshot: PolicySnapshot, env: HostEnv, key: chex.PRNGKey) -> tuple[HostEnv, Trajectory]:
        ctx, num_steps = self.ctx, self.ctx.config.num_steps
        keys = np.asarray(jax.random.split(key, num_steps))  # one transfer, not one per step
        steps: list[tuple[Any, ...]] = []
        for t in range(num_steps):
            raw_obs = env.obs
            action, log_prob, dist = jax.device_get(self._act(snapshot, raw_obs, keys[t]))
            env_action = envs.env_action(ctx.env, action, ctx.config.clip_actions)  # NumPy in, NumPy out
            steps.append((raw_obs, action, log_prob, dist, *env.step(env_action)))
        stacked = [np.stack(column) if not isinstance(column[0], tuple) else jax.tree.map(lambda *x: np.stack(x), *column)
                   for column in zip(*steps)]
        raw_obs, action, log_prob, dist, reward, terminated, truncated, final_obs, fin_ret, fin_len = stacked
        discounted = self._discounted_returns(env, reward, terminated | truncated)
        return env, self._assemble(snapshot, raw_obs, action, log_prob, dist, reward, terminated, truncated,
                                   final_obs, env.obs, fin_ret, fin_len, discounted)

    def _discounted_returns(self, env: HostEnv, reward: np.ndarray, done: np.ndarray) -> Any:
        """G_t `[T, N]` of the chunk's rewards and done flags `[T, N]`, continuing the env's
        running discounted return (which it advances)."""
        if not self.ctx.config.normalize_reward:
            return np.zeros(reward.shape, np.float32)  # never read: no need to spend a call on it
        discounted, env.discounted_return = self._returns(env.discounted_return, reward, done)
        return discounted

    def _zeros(self, snapshot: PolicySnapshot) -> list[Any]:
        """Arguments of `assemble` for one all-zero chunk (shapes only matter)."""
        env, rc = self.ctx.env, self.ctx.config
        t, n = rc.num_steps, rc.num_envs
        obs = np.zeros((n, *env.obs_shape), np.float32)
        action, log_prob, dist = jax.eval_shape(self._act, snapshot, obs, jax.random.PRNGKey(0))
        over_t = lambda s: np.zeros((t, *s.shape), s.dtype)  # noqa: E731
        flags = np.zeros((t, n), bool)
        return [np.zeros((t, *obs.shape), np.float32), over_t(action), over_t(log_prob), jax.tree.map(over_t, dist),
                np.zeros((t, n), np.float32), flags, flags, np.zeros((t, *obs.shape), np.float32), obs,
                np.zeros((t, n), np.float32), np.zeros((t, n), np.int32), np.zeros((t, n), np.float32)]

    def trajectory_like(self, snapshot: PolicySnapshot) -> Trajectory:
        """ShapeDtypeStructs of one chunk (for sizing the ring buffer)."""
        return jax.eval_shape(self._assemble, snapshot, *self._zeros(snapshot))

    def warm_up(self, snapshot: PolicySnapshot) -> Trajectory:
        """Compiles `act` and `assemble` for the snapshot's device without stepping any env;
        returns an all-zero chunk there (the ring buffer's example)."""
        rc = self.ctx.config
        obs = np.zeros((rc.num_envs, *self.ctx.env.obs_shape), np.float32)
        jax.block_until_ready(self._act(snapshot, obs, jax.random.PRNGKey(0)))
        if rc.normalize_reward:
            flags = np.zeros((rc.num_steps, rc.num_envs), bool)
            jax.block_until_ready(self._returns(np.zeros((rc.num_envs,), np.float32), flags.astype(np.float32), flags))
        return self._assemble(snapshot, *self._zeros(snapshot))

def host_episodes_program(policy: Any, num_episodes: int, deterministic: bool, max_steps: int | None) -> Any:
    """`policy.episodes_program` for a host-side env: a `(params, obs_stats, seed) -> (returns
    [E], lengths [E])` that plays `num_episodes` Gymnasium episodes (one vector env, env i
    seeded `seed + i`), each until its first done or `max_steps` (default: the time limit)."""
    spec = policy.env.env
    limit = spec.max_steps_in_episode if max_steps is None else int(max_steps)

    def play(params: Any, obs_stats: Any, seed: Any) -> tuple[np.ndarray, np.ndarray]:
        env = make_host_env(policy.env, num_episodes, int(seed))
        try:
            returns = np.zeros((num_episodes,), np.float64)
            lengths = np.zeros((num_episodes,), np.int64)
            alive = np.ones((num_episodes,), bool)
            key = jax.random.PRNGKey(int(seed))
            for _ in range(limit):
                key, act_key = jax.random.split(key)
                action = np.asarray(policy._act(params, obs_stats, env.obs, None if deterministic else act_key))
                env_action = envs.env_action(policy.env, action, policy.config.rollout.clip_actions)
                reward, terminated, truncated, *_ = env.step(env_action)
                returns += np.where(alive, reward, 0.0)
                lengths += alive
                alive &= ~(terminated | truncated)
                if not alive.any():
                    break
        finally:
            env.close()
        return returns.astype(np.float32), lengths.astype(np.int32)

    return play
