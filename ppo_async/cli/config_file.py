"""`--config FILE` of `train` and `tune`: a (partial, nested or dotted) config in JSON or YAML."""

from __future__ import annotations

import json
import os

import yaml

from ppo_async.errors import ConfigError


def load_config_file(path: str) -> dict:
    """The nested mapping of config fields in `path` (JSON, or YAML for .yaml / .yml);
    ConfigError for a missing file, a parse error or anything but a mapping."""
    if not os.path.isfile(path):
        raise ConfigError(f"--config {path!r}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) if path.endswith((".yaml", ".yml")) else json.loads(
            text, object_pairs_hook=_unique_pairs)
    except ConfigError as exc:
        raise ConfigError(f"--config {path!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any parse error is a user error
        raise ConfigError(f"--config {path!r}: cannot parse: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r}: expected a mapping of config fields")
    try:
        return nest_dotted_keys(data)
    except ConfigError as exc:
        raise ConfigError(f"--config {path!r}: {exc}") from None


def _unique_pairs(pairs: list) -> dict:
    """A JSON object's pairs as a dict; ConfigError for a key given twice."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"{key} is set twice ({out[key]!r} and {value!r}); set each field once")
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml's safe loader, refusing a mapping that sets one key twice (yaml keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        keys = [self.construct_object(key_node, deep=deep) for key_node, _ in node.value]
        for i, key in enumerate(keys):
            if key in keys[:i]:
                raise ConfigError(f"{key} is set twice (line {node.start_mark.line + 1}); set each field once")
        return super().construct_mapping(node, deep=deep)


def nest_dotted_keys(data: dict) -> dict:
    """`{"ppo.gamma": 0.9, "ppo": {"clip_eps": 0.1}}` -> `{"ppo": {"gamma": 0.9, "clip_eps": 0.1}}`:
    config files may use dotted keys (as the command line does), nested sections, or both;
    ConfigError when two of them set the same field (`rollout.num_envs: 32` beside
    `rollout: {num_envs: 64}`), naming both."""
    out: dict = {}
    given: dict[str, str] = {}  # dotted field -> the key that set it

    def put(section: str, name: str, value: object, key: str) -> None:
        path = f"{section}.{name}"
        if path in given:
            raise ConfigError(f"{path} is set twice: by {given[path]!r} and by {key!r}; set each field once")
        given[path] = key
        out[section][name] = value

    for key, value in data.items():
        section, dot, name = str(key).partition(".")
        if dot:
            out.setdefault(section, {})
            if not isinstance(out[section], dict):
                raise ConfigError(f"config key {key!r}: {section!r} is not a section")
            put(section, name.replace("-", "_"), value, str(key))
        elif isinstance(value, dict):
            if key in out and not isinstance(out[key], dict):
                raise ConfigError(f"config key {key!r}: set twice")
            out.setdefault(key, {})
            for inner, inner_value in value.items():
                put(str(key), str(inner), inner_value, f"{key}: {inner}")
        else:
            out[key] = value
    return out
