"""Layer 1, `envs/`: environments behind one interface.

`registry` knows env names by family (gymnax names as they are, `brax/<name>`,
`playground/<name>`, `gymnasium/<id>`, `envpool/<id>`) and imports nothing heavy; `base` is the
`Env` record, `make_env` and the jittable vectorised reset / step with episode statistics;
`physics` wraps Brax and MuJoCo Playground behind gymnax's interface (stepped inside jitted
rollouts); `gymnasium` is the host-side vector env a sampler thread steps, `envpool` the same
interface on EnvPool's C++ thread pool (no GIL while it steps). May import:
`ppo_async.errors` only (the env options arrive as a plain record).
"""

import importlib
from typing import Any

_BASE_NAMES = ("Env", "EnvState", "EnvStep", "GymnasiumSpec", "env_action", "make_env", "reset_envs", "step_envs")


def __getattr__(name: str) -> Any:
    """`ppo_async.envs.<name>` from `envs.base`, imported on first use (PEP 562): importing the
    package (as `envs.registry`'s users do to check env names) imports no JAX."""
    if name not in _BASE_NAMES:
        raise AttributeError(f"module 'ppo_async.envs' has no attribute {name!r}")
    return getattr(importlib.import_module("ppo_async.envs.base"), name)


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
