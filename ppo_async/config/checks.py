"""Field checks shared by every config section: each raises `ConfigError` naming the field
(with its section prefix), the value and the rule."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import types
import typing
from typing import Any, NamedTuple

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

def _check_unit_interval(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0.0 < value <= 1.0:
        _fail(name, value, "must lie in (0, 1]")

_SCALAR_RULES: dict[Any, tuple[tuple[type, ...], str]] = {
    int: ((int,), "an integer"),
    float: ((int, float), "a number"),
    bool: ((bool,), "True or False"),
    str: ((str,), "a string"),
}

class FieldRule(NamedTuple):
    """What a field's annotation accepts: `types` and their `description`, or (for a
    `Literal[...]`) the allowed `choices`; `optional` when None is allowed too."""

    types: tuple[type, ...]
    description: str
    optional: bool
    choices: tuple[Any, ...] | None = None

def _is_union(hint: Any) -> bool:
    """Whether `hint` is `X | Y` (types.UnionType) or `typing.Union[X, Y]` / `Optional[X]`."""
    return typing.get_origin(hint) in (typing.Union, types.UnionType)

def _type_rule(hint: Any) -> FieldRule | None:
    """The rule of one resolved annotation (`float | None`, `tuple[int, ...]`,
    `Literal['a', 'b']`, `int`, ...); None for a nested dataclass section (it checks itself)."""
    optional = False
    if _is_union(hint):
        args = typing.get_args(hint)
        optional = type(None) in args
        rest = [a for a in args if a is not type(None)]
        hint = rest[0] if len(rest) == 1 else object
    if dataclasses.is_dataclass(hint):
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        return FieldRule(tuple(dict.fromkeys(type(c) for c in choices)), f"one of {choices}", optional, choices)
    if origin is tuple or hint is tuple:
        return FieldRule((tuple, list), "a sequence", optional)
    accepted, what = _SCALAR_RULES.get(hint, ((object,), "a value"))
    return FieldRule(accepted, what, optional)

@functools.cache
def field_rules(cls: type) -> tuple[tuple[str, FieldRule], ...]:
    """(field name, rule) of every checked field of a config dataclass, from its resolved
    annotations (`typing.get_type_hints`; cached per class)."""
    hints = typing.get_type_hints(cls)
    rules = ((f.name, _type_rule(hints[f.name])) for f in dataclasses.fields(cls))
    return tuple((name, rule) for name, rule in rules if rule is not None)

def _accepts(rule: FieldRule, value: Any) -> bool:
    """Whether `value` passes `rule`'s type (bool is no number) and, for a Literal, is a choice."""
    if not isinstance(value, rule.types) or (bool not in rule.types and isinstance(value, bool)):
        return False
    return rule.choices is None or value in rule.choices

def check_field_types(section: Any, prefix: str = "") -> None:
    """Raises ConfigError naming the first field of a config dataclass whose value has the wrong
    type (e.g. `threaded.latency_jitter = 'a'`) or, for a `Literal` field, is none of its
    values, before any range check compares it.

    bool is not accepted as a number (True is an int in Python); ints are accepted as floats.
    """
    for name, rule in field_rules(type(section)):
        value = getattr(section, name)
        if (value is None and rule.optional) or _accepts(rule, value):
            continue
        allowed = rule.description + (" or None" if rule.optional else "")
        if rule.choices is not None:
            _fail(f"{prefix}{name}", value, f"must be {allowed}")
        _fail(f"{prefix}{name}", value, f"must be {allowed}, not {type(value).__name__}")

def _inert(name: str, value: Any, why: str) -> None:
    raise ConfigError(f"{name} = {value!r} has no effect: {why}")

def _changed(section: Any, default: Any) -> list[str]:
    """Fields of a section whose value differs from the section's default."""
    return [f.name for f in dataclasses.fields(section) if getattr(section, f.name) != getattr(default, f.name)]


def did_you_mean(name: str, known: Any) -> str:
    """`"; did you mean 'ppo.gamma'?"` for the known names closest to `name` (difflib), else `""`."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?"

def field_paths(cls: type, prefix: str = "") -> list[str]:
    """Every dotted field path of a config dataclass (`"ppo.gamma"`, `"env"`, ...), sections included."""
    paths = []
    for f in dataclasses.fields(cls):
        paths.append(prefix + f.name)
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            paths.extend(field_paths(hint, f"{prefix}{f.name}."))
    return paths
