"""ppo_async: asynchronous PPO in JAX — sampling throughput, policy lag and learning efficiency.

The public API, `pa.*` (listed in `__all__`). Names are loaded on first use (PEP 562 module
`__getattr__`): `import ppo_async` imports no JAX, so the command line's `--help` and config
errors come before JAX, gymnax or Brax start; `pa.train`, `pa.Config`, ... import their
modules when first touched.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # name -> the module it lives in (a module itself when the name is the module's last part)
    "analysis": "ppo_async.report.analysis",
    "losses": "ppo_async.core.losses",
    "lag_histogram_of": "ppo_async.report.analysis",
    "per_sampler": "ppo_async.report.analysis",
    "summarize": "ppo_async.report.analysis",
    "plot_run": "ppo_async.report.plots",
    "Config": "ppo_async.config",
    "ConfigError": "ppo_async.config",
    "EnvOptions": "ppo_async.config",
    "LagConfig": "ppo_async.config",
    "NetworkConfig": "ppo_async.config",
    "PPOConfig": "ppo_async.config",
    "RolloutConfig": "ppo_async.config",
    "ThreadedConfig": "ppo_async.config",
    "config_from_dict": "ppo_async.config",
    "config_to_dict": "ppo_async.config",
    "replace_path": "ppo_async.config",
    "Env": "ppo_async.envs",
    "make_env": "ppo_async.envs",
    "DataFileError": "ppo_async.errors",
    "DistributedFailure": "ppo_async.errors",
    "CheckpointError": "ppo_async.run.checkpoint",
    "StalledThread": "ppo_async.modes.threaded.liveness",
    "NonFiniteError": "ppo_async.report.metrics",
    "read_jsonl": "ppo_async.report.metrics",
    "ActorCritic": "ppo_async.core.networks",
    "make_actor_critic": "ppo_async.core.networks",
    "LagSchedule": "ppo_async.core.lag",
    "make_schedule": "ppo_async.core.lag",
    "read_schedule": "ppo_async.core.lag",
    "write_schedule": "ppo_async.core.lag",
    "load_sweep": "ppo_async.study.sweep",
    "save_sweep": "ppo_async.study.sweep",
    "sweep": "ppo_async.study.sweep",
    "Policy": "ppo_async.run.policy",
    "evaluate": "ppo_async.run.policy",
    "config_for_env": "ppo_async.config.presets",
    "preset_for": "ppo_async.config.presets",
    "RunRecorder": "ppo_async.run.recorder",
    "Mode": "ppo_async.modes.registry",
    "get_mode": "ppo_async.modes.registry",
    "register_mode": "ppo_async.modes.registry",
    "TrainResult": "ppo_async.run.result",
    "load": "ppo_async.modes.train",
    "resume": "ppo_async.modes.train",
    "train": "ppo_async.modes.train",
    "TuneResult": "ppo_async.study.tune",
    "tune": "ppo_async.study.tune",
    "benchmark": "ppo_async.study.benchmark",
}
"""Where each public name lives; `__getattr__` imports it from there on first use."""

_MODULES = {"analysis", "losses"}  # names that are modules, not attributes of their module

__all__ = sorted(_EXPORTS, key=str.lower)


def __getattr__(name: str) -> Any:
    """`ppo_async.<name>` for a public name (imported on first use and kept in the module's
    globals); AttributeError otherwise, as for any missing attribute."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'ppo_async' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's own names and every public name, loaded or not (for `dir(pa)` and completion)."""
    return sorted(set(globals()) | set(_EXPORTS))
