"""Layer 1, `envs/`: environments behind one interface.

`registry` knows env names by family (gymnax names as they are, `brax/<name>`,
`playground/<name>`, `gymnasium/<id>`, `envpool/<id>`) and imports nothing heavy; `base` is the
`Env` record, `make_env` and the jittable vectorised reset / step with episode statistics;
`physics` wraps Brax and MuJoCo Playground behind gymnax's interface (stepped inside jitted
rollouts); `gymnasium` is the host-side vector env a sampler thread steps, `envpool` the same
interface on EnvPool's C++ thread pool (no GIL while it steps). May import:
`ppo_async.errors` only (the env options arrive as a plain record).
"""

from ppo_async.envs.base import (
    Env,
    EnvState,
    EnvStep,
    GymnasiumSpec,
    env_action,
    make_env,
    reset_envs,
    step_envs,
)

__all__ = [
    "Env",
    "EnvState",
    "EnvStep",
    "GymnasiumSpec",
    "env_action",
    "make_env",
    "reset_envs",
    "step_envs",
]
