"""ppo_async: asynchronous PPO in JAX — sampling throughput, policy lag and learning efficiency."""

from ppo_async.report import analysis
from ppo_async.core import losses
from ppo_async.report.analysis import lag_histogram_of, per_sampler, summarize
from ppo_async.config import (
    Config,
    ConfigError,
    EnvOptions,
    LagConfig,
    NetworkConfig,
    PPOConfig,
    RolloutConfig,
    ThreadedConfig,
    config_from_dict,
    config_to_dict,
    replace_path,
)
from ppo_async.envs import Env, make_env
from ppo_async.report.metrics import NonFiniteError, read_jsonl
from ppo_async.core.networks import ActorCritic, make_actor_critic
from ppo_async.core.lag import LagSchedule, make_schedule, read_schedule, write_schedule
from ppo_async.study.sweep import load_sweep, save_sweep, sweep
from ppo_async.run.policy import Policy, evaluate
from ppo_async.config.presets import config_for_env, preset_for
from ppo_async.run.recorder import RunRecorder
from ppo_async.modes.registry import Mode, get_mode, register_mode
from ppo_async.run.result import TrainResult
from ppo_async.modes.train import load, resume, train
from ppo_async.study.tune import TuneResult, tune
from ppo_async.study.benchmark import benchmark

__version__ = "0.1.0"

__all__ = [
    "ActorCritic",
    "Config",
    "ConfigError",
    "Env",
    "LagConfig",
    "LagSchedule",
    "Mode",
    "NetworkConfig",
    "NonFiniteError",
    "Policy",
    "PPOConfig",
    "RunRecorder",
    "RolloutConfig",
    "ThreadedConfig",
    "TrainResult",
    "TuneResult",
    "analysis",
    "benchmark",
    "config_from_dict",
    "config_to_dict",
    "evaluate",
    "EnvOptions",
    "config_for_env",
    "preset_for",
    "get_mode",
    "lag_histogram_of",
    "load",
    "load_sweep",
    "losses",
    "make_actor_critic",
    "make_env",
    "make_schedule",
    "per_sampler",
    "read_jsonl",
    "read_schedule",
    "register_mode",
    "replace_path",
    "resume",
    "save_sweep",
    "summarize",
    "sweep",
    "train",
    "tune",
    "write_schedule",
]
