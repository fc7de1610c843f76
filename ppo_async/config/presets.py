"""Per-env defaults where the global ones (tuned on gymnax Pendulum) do not learn.

Brax and MuJoCo Playground ship per-env PPO settings; so do we. A preset is a mapping of
dotted config fields to values, looked up by exact env name first, then by family prefix
(`"brax/"`, `"playground/"`, `"gymnasium/"`); the exact entry overrides the family's.

A preset fills only the fields the user did not set: `python -m ppo_async train` applies
it under the `--config` file and the command-line flags (and prints what it applied), and
`config_for_env(env, changes)` does the same from code. A `Config(...)` built directly is
taken as the user wrote it (no preset). The values come from the learning runs quoted in
README ("Per-env presets").
"""

from __future__ import annotations

from typing import Any, Mapping

from ppo_async.config import Config, ConfigError, get_path, replace_paths

# Long-horizon continuous control: 1000-step episodes, rewards of ~1 per step.
_PHYSICS = {
    "ppo.gamma": 0.99,
    "ppo.gae_lambda": 0.95,
    "ppo.num_epochs": 4,
    "ppo.num_minibatches": 8,
    "ppo.learning_rate": 1e-3,
    "rollout.num_envs": 64,
    "rollout.num_steps": 32,
}

ENV_PRESETS: dict[str, dict[str, Any]] = {
    "brax/": dict(_PHYSICS),
    "playground/": {**_PHYSICS, "ppo.gamma": 0.995},
    # MuJoCo on host threads at the reference implementations' setting (CleanRL's
    # ppo_continuous_action, SB3's VecNormalize): a 2,048-step learner batch (one 16 x 128
    # chunk), 10 epochs x 32 minibatches of 64, rewards normalised by the running std of the
    # discounted return, value clipping at 0.2 (issue 26); an initial policy std of 0.61
    # (log-std -0.5 instead of CleanRL's 0: the ablation's largest factor, every HalfCheetah seed
    # on the fast gait). Its figures are the benchmark's: `python -m ppo_async benchmark --suite
    # mujoco` (experiments/results/benchmark; the preset with log-std 0 beside it in
    # experiments/results/benchmark_init_log_std_0).
    "gymnasium/": {
        "ppo.gamma": 0.99,
        "ppo.num_epochs": 10,
        "ppo.num_minibatches": 32,
        "ppo.learning_rate": 3e-4,
        "ppo.value_clip_eps": 0.2,
        "network.init_log_std": -0.5,
        "rollout.num_envs": 16,
        "rollout.num_steps": 128,
        "rollout.normalize_reward": True,
        "rollout.reward_scale": 1.0,
    },
}
ENV_PRESETS["envpool/"] = ENV_PRESETS["gymnasium/"]  # the same MuJoCo tasks, stepped by EnvPool


def preset_for(env: str) -> dict[str, Any]:
    """The preset of `env` (dotted field -> value): its family's entry updated by its own."""
    family, sep, _ = env.partition("/")
    out: dict[str, Any] = {}
    if sep:
        out.update(ENV_PRESETS.get(f"{family}/", {}))
    out.update(ENV_PRESETS.get(env, {}))
    for path in out:
        get_path(Config(), path)  # an unknown field in the table is a bug here, not a user error
    return out


def _is_set(data: Mapping[str, Any], path: str) -> bool:
    """Whether nested `data` (a config file's contents) holds the dotted field `path`."""
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def preset_changes(env: str, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The preset fields of `env` that `given` (nested or dotted keys) does not set."""
    given = given or {}
    return {path: value for path, value in preset_for(env).items() if not _is_set(given, path) and path not in given}


def config_for_env(env: str, changes: Mapping[str, Any] | None = None, base: Config | None = None) -> Config:
    """`base` (default `Config()`) for `env` with its preset under `changes` (dotted fields,
    e.g. `{"ppo.gamma": 0.9}`): a field in `changes` wins, the preset fills the rest."""
    changes = dict(changes or {})
    if "env" in changes and changes["env"] != env:
        raise ConfigError(f"changes['env'] = {changes['env']!r} differs from env = {env!r}")
    base = base or Config()
    return replace_paths(base, {"env": env, **preset_changes(env, changes), **changes})


def describe(changes: Mapping[str, Any]) -> str:
    """`"ppo.gamma=0.99, rollout.num_envs=64"` for a printed line."""
    return ", ".join(f"{path}={value!r}" for path, value in changes.items())


