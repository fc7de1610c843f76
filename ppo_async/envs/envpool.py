"""Host-side MuJoCo on EnvPool's C++ thread pool: one sampler's vector env with the interface
of `ppo_async.envs.gymnasium.HostVectorEnv` (`obs`, `num_envs`, `step`, `episode_return`,
`episode_length`, `discounted_return`, `close`), so `core.host_rollout.HostRollout` steps either.

Why: a `SyncVectorEnv` steps its envs in Python under the GIL, so several sampler threads
stepping theirs barely run in parallel; EnvPool steps a batch in C++ worker threads with the
GIL released, so sampler threads overlap (experiments/bench_envs.py, part (b)).

Auto-reset. EnvPool resets a finished env on its *next* step: that step ignores the action,
returns the reset observation and reward 0. The sampler's `Trajectory` needs same-step
semantics (Gymnasium's `AutoresetMode.SAME_STEP`): at a done step the observation reached
(`final_obs`, which bootstraps a truncated episode) and, as the next observation to act on,
the reset one. So right after every step the env ids that finished are reset with EnvPool's
per-env `reset(env_ids)` (one extra round trip through the pool, only on steps where an
episode ended; all the finished envs in one call, in parallel), and their next step applies
the sampler's action. Left to EnvPool's next-step reset, every episode would add a fake
transition (an ignored action, its log-prob, reward 0) that the fixed `[T, N]` chunk cannot
skip. Async `send` / `recv` with a batch smaller than the pool would return whichever envs
finish first, mixing time steps within a `[T, N]` row; the pool runs synchronously
(`batch_size = num_envs`): each step waits for all its envs, stepped in parallel by its threads.

Truncation: EnvPool counts the time limit itself (`max_episode_steps`, set from the spec)
and reports it as truncated, not terminated, as Gymnasium's `TimeLimit` does.

Only this module makes and steps EnvPool pools (`core.host_rollout` through it); `envs.registry`
reads EnvPool's ids. `envpool` is imported lazily (the `[envpool]` extra).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ppo_async.errors import ConfigError


@dataclass(frozen=True)
class EnvPoolSpec:
    """What identifies a host-side EnvPool env (each sampler thread builds its own pool from it).

    Attributes:
      task_id: EnvPool's id (e.g. "HalfCheetah-v5").
      max_steps_in_episode: the time limit handed to EnvPool (`max_episode_steps`); its
        registered one unless a caller asks for another.
    """

    task_id: str
    max_steps_in_episode: int


def envpool_spaces(name: str, task_id: str) -> tuple[EnvPoolSpec, tuple[int, ...], Any]:
    """`(spec, observation shape, Gymnasium action space)` of EnvPool task `task_id`, read from
    its spec (no pool is started); `envs.make_env` builds the `Env` from them."""
    import envpool
    from gymnasium import spaces

    spec = envpool.make_spec(task_id)
    obs_space = spec.gymnasium_observation_space
    if not isinstance(obs_space, spaces.Box):
        raise ConfigError(f"env = {name!r}: observation space {type(obs_space).__name__} is not supported (only Box)")
    record = EnvPoolSpec(task_id, int(spec.config.max_episode_steps))
    return record, tuple(obs_space.shape), spec.gymnasium_action_space


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity where the OS says, else the count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def pool_threads(num_envs: int, num_samplers: int, cores: int | None = None) -> int:
    """EnvPool worker threads for one sampler's pool: the cores shared out among the samplers
    (at least 1, at most one per env), so the pools of all samplers together have about one
    thread per core: one sampler on 2 cores gets 2, two get 1 each (four get 1 each: never 0)."""
    cores = usable_cores() if cores is None else cores
    return max(1, min(num_envs, cores // max(1, num_samplers)))


def env_seeds(seed: int, num_envs: int) -> list[int]:
    """Env i's seed `seed + i` (Gymnasium's vector reset does the same), kept in int32 as
    EnvPool requires."""
    return [(seed + i) % 2**31 for i in range(num_envs)]


def in_env_order(env_id: np.ndarray, *arrays: np.ndarray) -> list[np.ndarray]:
    """Rows of `arrays` (each `[B, ...]`, row b from env `env_id[b]`) sorted by env id."""
    order = np.argsort(env_id)
    return [np.asarray(a)[order] for a in arrays]


class EnvPoolVectorEnv:
    """One sampler's EnvPool (a C++ pool of `num_envs` envs) and the running episode accumulators.

    Mutable and owned by one sampler thread. Env i is seeded `seed + i`, as a `HostVectorEnv`.
    Same-step auto-reset by an explicit per-env reset after each done step (module docstring).

    Attributes:
      pool: the `envpool` Gymnasium-style pool (synchronous: `batch_size = num_envs`).
      obs: `[N, O...]` float32 raw observation to act on next (after any reset).
      episode_return, episode_length: `[N]` of the running episodes.
      discounted_return: `[N]` float32, advanced by the rollout (it knows gamma).
    """

    def __init__(self, spec: EnvPoolSpec, num_envs: int, seed: int, num_threads: int = 1) -> None:
        import envpool

        self.spec = spec
        self.pool = envpool.make_gymnasium(
            spec.task_id, num_envs=num_envs, batch_size=num_envs, num_threads=num_threads,
            seed=env_seeds(seed, num_envs), max_episode_steps=spec.max_steps_in_episode,
            thread_affinity_offset=-1,  # no pinning: every sampler's pool would pin to the same cores
        )
        obs, info = self.pool.reset()
        (self.obs,) = in_env_order(info["env_id"], np.asarray(obs, np.float32))
        self.episode_return = np.zeros((num_envs,), np.float64)
        self.episode_length = np.zeros((num_envs,), np.int64)
        self.discounted_return = np.zeros((num_envs,), np.float32)

    @property
    def num_envs(self) -> int:
        return self.obs.shape[0]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, ...]:
        """Steps every env with `action` `[N, A]`; returns `(reward, terminated, truncated,
        final_obs, finished_return, finished_length)`, each `[N, ...]` in env order (final_obs:
        the observation reached, before any reset). Finished envs are reset before it returns."""
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray(action))
        final_obs, reward, terminated, truncated = in_env_order(
            info["env_id"], np.asarray(obs, np.float32), np.asarray(reward, np.float32),
            np.asarray(terminated, bool), np.asarray(truncated, bool))
        truncated = truncated & ~terminated
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        finished_return = np.where(done, self.episode_return, 0.0).astype(np.float32)
        finished_length = np.where(done, self.episode_length, 0).astype(np.int32)
        self.episode_return[done] = 0.0
        self.episode_length[done] = 0
        self.obs = self._reset_finished(final_obs, done)
        return reward, terminated, truncated, final_obs, finished_return, finished_length

    def _reset_finished(self, final_obs: np.ndarray, done: np.ndarray) -> np.ndarray:
        """`[N, O...]` observations to act on next: `final_obs` with the envs where `done` `[N]`
        replaced by their reset observation (reset now, so their next step takes the action)."""
        if not done.any():
            return final_obs
        next_obs = final_obs.copy()
        reset_obs, info = self.pool.reset(np.flatnonzero(done).astype(np.int32))
        next_obs[np.asarray(info["env_id"])] = np.asarray(reset_obs, np.float32)
        return next_obs

    def close(self) -> None:
        self.pool.close()
