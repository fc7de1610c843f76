"""Per-env defaults where the global ones (tuned on gymnax Pendulum) do not learn.

Brax and MuJoCo Playground ship per-env PPO settings; so do we. A preset is a mapping of
dotted config fields to values, looked up by exact env name first, then by family prefix
(`"brax/"`, `"playground/"`, `"gymnasium/"`); the exact entry overrides the family's.

A preset fills only the fields the user did not set, the same way at every entry point:
`python -m ppo_async train` applies it under the `--config` file and the command-line flags
(and prints what it applied), `config_for_env(env, changes)` does the same from code, and a
`Config(env=...)` built directly fills every field its caller did not pass (`Config.preset_fields`
names them). A host-side env also brings threaded mode when no mode is given. The values come
from the learning runs quoted in the docs (reference/presets.md).
"""

from __future__ import annotations

from typing import Any, Mapping

from ppo_async.config import Config, ConfigError, get_path, preset_table, replace_paths
from ppo_async.config.preset_table import ENV_PRESETS, env_defaults  # noqa: F401  (re-exported: the table)


def preset_for(env: str) -> dict[str, Any]:
    """The preset of `env` (dotted field -> value): its family's entry updated by its own."""
    out = preset_table.preset_for(env)
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
    """The fields `env` brings (`env_defaults`: its preset, and threaded mode for a host-side
    env) that `given` (nested or dotted keys) does not set."""
    given = given or {}
    preset_for(env)  # checks the table's paths
    return {path: value for path, value in env_defaults(env).items() if not _is_set(given, path) and path not in given}


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


