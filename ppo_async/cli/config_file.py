"""`--config FILE` of `train` and `tune`: a (partial, nested or dotted) config in JSON or YAML.

Every problem is one `ConfigError` naming the file: a missing or unreadable file, a parse error
with its 1-based line (`DataFileError`), anything but a mapping, a key set twice. YAML numbers
in exponent form without a dot (`3e-4`, which YAML 1.1 reads as a string) are read as numbers
where the field is a float (`yaml_numbers`), as YAML 1.2 and JSON read them.
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from typing import Any, Iterator

import yaml

from ppo_async.cli.paths import check_input_file, read_utf8
from ppo_async.config import Config, config_from_dict
from ppo_async.config.checks import every_failure, field_rules
from ppo_async.errors import ConfigError, DataFileError

YAML12_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
"""A float in YAML 1.2's core schema (and JSON): `3e-4`, `1E5`, `.5`, `-2.5e+3`."""


def load_config_file(path: str) -> dict:
    """The nested mapping of config fields in `path` (JSON, or YAML for .yaml / .yml);
    ConfigError naming the file for a missing, unreadable or empty file, a parse error (with
    its 1-based line), anything but a mapping or a key set twice."""
    check_input_file("--config", path)
    text = read_utf8(path)
    if not text.strip():
        raise DataFileError(f"{path}: empty; expected a mapping of config fields (e.g. ppo: {{clip_eps: 0.1}})")
    is_yaml = path.endswith((".yaml", ".yml"))
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader) if is_yaml else json.loads(text, object_pairs_hook=_unique_pairs)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise DataFileError(f"{path}, {_where(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config fields, got a {type(data).__name__}")
    try:
        nested = nest_dotted_keys(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return yaml_numbers(nested) if is_yaml else nested


def _where(exc: yaml.YAMLError | json.JSONDecodeError) -> str:
    """`line N: what` of a parse error (1-based line and column)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"line {exc.lineno}: not JSON ({exc.msg}, column {exc.colno})"
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    within = f"; {context} from line {context_mark.line + 1}" if context and context_mark is not None else ""
    if mark is None:
        return f"not YAML ({problem}{within})"
    return f"line {mark.line + 1}: not YAML ({problem}, column {mark.column + 1}{within})"


def file_fields(data: dict, prefix: str = "") -> Iterator[str]:
    """The dotted fields a nested config mapping sets (`{"ppo": {"gamma": 1}}` -> `ppo.gamma`)."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from file_fields(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def yaml_numbers(data: dict, cls: type = Config) -> dict:
    """`data` (a nested config mapping read from YAML) with every string YAML 1.2 reads as a
    float (`YAML12_FLOAT`: `3e-4`) made a float where its field of `cls` is a float (or a tuple
    of floats); YAML 1.1, PyYAML's, reads `3e-4` as a string. Other values are left as they are."""
    hints = typing.get_type_hints(cls)
    rules = dict(field_rules(cls))
    out = dict(data)
    for key, value in data.items():
        hint = hints.get(key)
        if isinstance(value, dict) and dataclasses.is_dataclass(hint):
            out[key] = yaml_numbers(value, hint)
        elif key in rules and float in rules[key].types:
            out[key] = _as_float(value)
        elif isinstance(value, list) and typing.get_args(hint)[:1] == (float,):
            out[key] = [_as_float(v) for v in value]
    return out


def _as_float(value: Any) -> Any:
    return float(value) if isinstance(value, str) and YAML12_FLOAT.match(value.strip()) else value


def file_config(path: str, data: dict) -> Config:
    """The Config of a config file's fields alone (`config_from_dict`); one ConfigError naming
    the file and every key that failed (`every_failure`; the env's own check as the caller's
    context allows)."""
    try:
        with every_failure(own=True):
            return config_from_dict(data, source="file")  # deprecated fields warn: a file a person hands the command
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


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
