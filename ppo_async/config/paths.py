"""Configs as nested dicts (JSON-friendly, by section) and dotted field paths
(`"ppo.clip_eps"`): reading, replacing and building them, each validated once at the end."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Mapping, Sequence

from ppo_async.config.checks import canonical_path, did_you_mean, field_paths
from ppo_async.config.applicability import check_given_apply
from ppo_async.config.preset_table import env_defaults
from ppo_async.config.run_config import DEPRECATED_CADENCES, Config, stored_config
from ppo_async.config.samplers import SAMPLER_ALIASES, convert_sampler_aliases
from ppo_async.config.sections import (
    DistributedConfig,
    EnvOptions,
    LagConfig,
    NetworkConfig,
    PPOConfig,
    RolloutConfig,
    ThreadedConfig,
)
from ppo_async.errors import ConfigError


_SECTIONS = {"env_options": EnvOptions, "rollout": RolloutConfig, "ppo": PPOConfig, "network": NetworkConfig, "lag": LagConfig, "threaded": ThreadedConfig, "distributed": DistributedConfig}

def config_to_dict(config: Config) -> dict[str, Any]:
    """Nested plain-Python dict of every field (JSON-serialisable)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))

def _refuse_unknown(data: Mapping[str, Any], cls: type, what: str, prefix: str = "") -> None:
    """ConfigError listing the keys of `data` that are not fields of the dataclass `cls`, the
    nearest known names of the first (difflib) and every known one."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(map(str, set(data) - known))
    if unknown:
        hint = did_you_mean(prefix + unknown[0], field_paths(Config)) or did_you_mean(unknown[0], known)
        raise ConfigError(f"{what} {unknown}{hint} (known: {', '.join(sorted(known))})")


def _unknown_path(path: str) -> ConfigError:
    """The error of an unknown dotted field, with the nearest known paths."""
    return ConfigError(f"unknown config field {path!r}{did_you_mean(path, field_paths(Config))}")


def config_from_dict(data: dict[str, Any], source: Literal["stored", "file", "input"] = "stored") -> Config:
    """Builds (and validates) a Config from a nested dict; unknown keys raise ConfigError.

    `source` says who wrote its deprecated fields (`stored_config`): "stored", a file this code
    wrote, read back (config.json, a checkpoint's or a study's spec): they convert as such a
    file holds them, silently; "file", a config file handed to a command (`--config FILE`): the
    same, with a FutureWarning; "input", fields a caller sets (`replace_paths`, `--set`, a
    sweep grid): each deprecated field set warns and sets its field."""
    if not isinstance(data, dict):
        raise ConfigError(f"config must be a mapping, got {type(data).__name__}")
    _refuse_unknown(data, Config, "unknown config keys")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS:
            cls = _SECTIONS[key]
            if isinstance(value, cls):
                kwargs[key] = value
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"{key} must be a mapping of its fields, got {value!r}")
            _refuse_unknown(value, cls, f"unknown keys in {key}:", prefix=f"{key}.")
            section = dict(value)
            for f in dataclasses.fields(cls):
                if f.name in section and isinstance(section[f.name], list):
                    section[f.name] = tuple(section[f.name])
            kwargs[key] = cls(**section)
        else:
            kwargs[key] = value
    if source == "input":
        return Config(**kwargs)
    with stored_config(warn=source == "file"):  # deprecated fields as an older config.json holds them
        return Config(**kwargs)

def convert_deprecated_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """A stored config dict (a config.json, a benchmark.json's configs, a checkpoint's metadata)
    in today's spelling, to compare with today's: the sampler count's deprecated spellings
    (`threaded.num_samplers`, `lag.num_samplers`) as `num_samplers`, by what its mode read
    (`samplers.convert_sampler_aliases`), and its deprecated iteration cadences
    (`DEPRECATED_CADENCES`, e.g. `eval_every: 49`) as the env-step fields of the config it
    makes (`eval_every_steps: 49 * batch_size`), the old keys at None / 0, every other key as
    it was; silently. ConfigError when the dict makes no valid config (e.g. both spellings set)."""
    data = convert_sampler_aliases(data, _mode_of(data))
    if not any(data.get(old) for old in DEPRECATED_CADENCES):
        return dict(data)
    config = config_from_dict(dict(data))
    return {**data, **{old: 0 for old in DEPRECATED_CADENCES if old in data},
            **{new: getattr(config, new) for old, new in DEPRECATED_CADENCES.items() if data.get(old)}}


def _mode_of(data: Mapping[str, Any]) -> str:
    """The mode of the config a dict makes: its own, else its env's (a host-side env's is
    threaded: `preset_table.env_defaults`), else Config's default."""
    if isinstance(data.get("mode"), str):
        return data["mode"]
    env = data.get("env", Config.__dataclass_fields__["env"].default)
    return env_defaults(env).get("mode", Config.__dataclass_fields__["mode"].default) if isinstance(env, str) else "sync"


def get_path(config: Config, path: str) -> Any:
    """The value of a dotted field, e.g. `get_path(c, "ppo.clip_eps")`; ConfigError if unknown."""
    node: Any = config
    path = canonical_path(path)
    for part in path.split("."):
        if not dataclasses.is_dataclass(node) or part not in {f.name for f in dataclasses.fields(node)}:
            raise _unknown_path(path)
        node = getattr(node, part)
    return node

def replace_path(config: Config, path: str, value: Any) -> Config:
    """Returns a copy with a dotted field replaced, e.g. `replace_path(c, "ppo.clip_eps", 0.1)`."""
    return replace_paths(config, {path: value})

def replace_paths(config: Config, changes: Mapping[str, Any]) -> Config:
    """A copy with several dotted fields replaced at once, validated once at the end (so
    `{"ppo.rho_bar": 2.0, "ppo.advantage_estimator": "vtrace"}` works in either order)."""
    changes = {canonical_path(path): value for path, value in changes.items()}
    data = config_to_dict(config)
    if any(changes.get(path) is not None for path in SAMPLER_ALIASES) and "num_samplers" not in changes:
        data["num_samplers"] = None  # a deprecated spelling sets it, over the value the config had
    for path, value in changes.items():
        parts = path.split(".")
        node = data
        for part in parts[:-1]:
            if part not in node or not isinstance(node[part], dict):
                raise ConfigError(f"unknown config section {part!r} in {path!r}{did_you_mean(path, field_paths(Config))}")
            node = node[part]
        if parts[-1] not in node or isinstance(node[parts[-1]], dict):
            raise _unknown_path(path)
        node[parts[-1]] = value
    config = config_from_dict(data, source="input")
    check_given_apply(config, changes)
    return config


def parse_assignments(items: Sequence[str]) -> dict[str, Any]:
    """`["ppo.gamma=0.99", "network.actor-hidden=[64, 64]", "env=Pendulum-v1"]` -> dotted field
    (either spelling, `canonical_path`) ->
    value, each value read as JSON when it parses (numbers, booleans, lists, null) and as the
    string otherwise. ConfigError for an item without `=` or with an empty name (the fields
    themselves are checked when the config is built)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{item!r} is not a dotted.field=value assignment")
        key = canonical_path(key)  # `ppo.clip-eps` (a flag's spelling) or `ppo.clip_eps`
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out
