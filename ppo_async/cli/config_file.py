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
        data = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is a user error
        raise ConfigError(f"--config {path!r}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r}: expected a mapping of config fields")
    return nest_dotted_keys(data)


def nest_dotted_keys(data: dict) -> dict:
    """`{"ppo.gamma": 0.9, "ppo": {"clip_eps": 0.1}}` -> `{"ppo": {"gamma": 0.9, "clip_eps": 0.1}}`:
    config files may use dotted keys (as the command line does), nested sections, or both."""
    out: dict = {}
    for key, value in data.items():
        section, dot, name = str(key).partition(".")
        if dot:
            out.setdefault(section, {})
            if not isinstance(out[section], dict):
                raise ConfigError(f"config key {key!r}: {section!r} is not a section")
            out[section][name.replace("-", "_")] = value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out
