"""Host-side Gymnasium simulators: one sampler's vector env (`SyncVectorEnv`, same-step
auto-reset), its seeds and its episode accumulators. Only this module and
`ppo_async.core.host_rollout` touch Gymnasium objects.
"""

from __future__ import annotations

import chex
import jax
import numpy as np

from ppo_async.envs.base import GymnasiumSpec
from ppo_async.envs.mujoco_notices import filter_mujoco_notices


def seed_of(key: chex.PRNGKey) -> int:
    """A Gymnasium seed (int in [0, 2**31 - 1)) drawn from a JAX key (one per sampler)."""
    return int(jax.random.randint(key, (), 0, 2**31 - 1))


class HostVectorEnv:
    """One sampler's Gymnasium vector env and the running episode accumulators.

    Mutable and owned by one sampler thread. Env i of a sampler is seeded `seed + i`
    (Gymnasium's vector reset), so samplers with different seeds step different episodes.

    Attributes:
      vec: `gymnasium.vector.SyncVectorEnv` with same-step auto-reset.
      obs: `[N, O...]` float32 raw observation to act on next.
      episode_return, episode_length: `[N]` of the running episodes.
    """

    def __init__(self, spec: GymnasiumSpec, num_envs: int, seed: int) -> None:
        import gymnasium
        from gymnasium.vector import AutoresetMode, SyncVectorEnv

        self.spec = spec
        filter_mujoco_notices()
        self.vec = SyncVectorEnv([lambda: gymnasium.make(spec.env_id) for _ in range(num_envs)],
                                 autoreset_mode=AutoresetMode.SAME_STEP)
        obs, _ = self.vec.reset(seed=seed)
        self.obs = np.asarray(obs, np.float32)
        self.episode_return = np.zeros((num_envs,), np.float64)
        self.episode_length = np.zeros((num_envs,), np.int64)
        self.discounted_return = np.zeros((num_envs,), np.float32)  # advanced by the rollout (it knows gamma)

    @property
    def num_envs(self) -> int:
        return self.obs.shape[0]

    def step(self, action: np.ndarray) -> tuple[np.ndarray, ...]:
        """Steps every env; returns `(reward, terminated, truncated, final_obs, finished_return,
        finished_length)`, each `[N, ...]` (final_obs: the observation reached, before any reset)."""
        obs, reward, terminated, truncated, info = self.vec.step(action)
        obs = np.asarray(obs, np.float32)
        reward = np.asarray(reward, np.float32).reshape(self.num_envs)
        terminated = np.asarray(terminated, bool).reshape(self.num_envs)
        truncated = np.asarray(truncated, bool).reshape(self.num_envs) & ~terminated
        done = terminated | truncated
        final_obs = obs.copy()
        if done.any():
            mask = np.asarray(info.get("_final_obs", done), bool)
            for i in np.flatnonzero(mask):
                final_obs[i] = np.asarray(info["final_obs"][i], np.float32)
        self.episode_return += reward
        self.episode_length += 1
        finished_return = np.where(done, self.episode_return, 0.0).astype(np.float32)
        finished_length = np.where(done, self.episode_length, 0).astype(np.int32)
        self.episode_return[done] = 0.0
        self.episode_length[done] = 0
        self.obs = obs
        return reward, terminated, truncated, final_obs, finished_return, finished_length

    def close(self) -> None:
        self.vec.close()
