"""Field checks shared by every config section: each raises `ConfigError` naming the field
(with its section prefix), the value and the rule."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ppo_async.errors import ConfigError


def _fail(name: str, value: Any, rule: str) -> None:
    raise ConfigError(f"{name} = {value!r} is invalid: {rule}")

def _check_positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        _fail(name, value, "must be a number > 0")
    if isinstance(value, float) and not math.isfinite(value):
        _fail(name, value, "must be finite")

def _check_non_negative(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
        _fail(name, value, "must be a number >= 0")
    if isinstance(value, float) and not math.isfinite(value):
        _fail(name, value, "must be finite")

def _check_int(name: str, value: int, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        _fail(name, value, f"must be an integer >= {minimum}")

def _check_bool(name: str, value: bool) -> None:
    if not isinstance(value, bool):
        _fail(name, value, "must be True or False")

def _check_unit_interval(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < value <= 1.0:
        _fail(name, value, "must lie in (0, 1]")

_TYPE_RULES = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "True or False"),
    "str": ((str,), "a string"),
}

def _type_rule(annotation: str) -> tuple[tuple[type, ...], str, bool]:
    """(accepted types, description, None allowed) of a field annotation such as
    `"float | None"`, `"tuple[int, ...]"` or `"Literal['a', 'b']"` (annotations are strings)."""
    parts = [p.strip() for p in annotation.split("|")]
    optional = "None" in parts
    base = next((p for p in parts if p != "None"), "None")
    if base.startswith("tuple"):
        return (tuple, list), "a sequence", optional
    if base.startswith("Literal"):
        return (str,), "a string", optional
    types, what = _TYPE_RULES.get(base, ((object,), "a value"))
    return types, what, optional

def check_field_types(section: Any, prefix: str = "") -> None:
    """Raises ConfigError naming the first field of a config dataclass whose value has the wrong
    type (e.g. `threaded.latency_jitter = 'a'`), before any range check compares it.

    bool is not accepted as a number (True is an int in Python); ints are accepted as floats.
    """
    for f in dataclasses.fields(section):
        if not isinstance(f.type, str) or f.type in _SECTION_TYPE_NAMES:
            continue
        types, what, optional = _type_rule(f.type)
        value = getattr(section, f.name)
        if value is None and optional:
            continue
        wrong = not isinstance(value, types) or (bool not in types and isinstance(value, bool))
        if wrong:
            allowed = what + (" or None" if optional else "")
            _fail(f"{prefix}{f.name}", value, f"must be {allowed}, not {type(value).__name__}")

_SECTION_TYPE_NAMES = ("EnvOptions", "RolloutConfig", "PPOConfig", "NetworkConfig", "LagConfig", "ThreadedConfig", "DistributedConfig")

def _inert(name: str, value: Any, why: str) -> None:
    raise ConfigError(f"{name} = {value!r} has no effect: {why}")

def _changed(section: Any, default: Any) -> list[str]:
    """Fields of a section whose value differs from the section's default."""
    return [f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)]
