"""Field checks shared by every config section: each raises `ConfigError` naming the field
(with its section prefix), the value and the rule.

Within `every_failure()` a failed check is recorded instead and the checks go on, so one
`FieldFailures` (a ConfigError) lists every field that failed, the env first, in one line
separated by "; ". `Config` checks its own fields that way; the CLI and config files wrap the
whole build (sections, then the Config) in it. The checks that compare fields with each other
start only when every field so far passed (`stop_if_failed`); a wrong type stops its section.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from typing import Any, Callable, Iterator, NamedTuple, Sequence

from ppo_async.errors import ConfigError

_RECORDED: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar("config_failures", default=None)
FIRST_FIELDS = ("env",)
"""Fields named first when several fail (the env decides what the other fields mean)."""
_FIELD = re.compile(r"^(?:[a-z]+: )?(--)?([A-Za-z_][\w.-]*) = ")


class FieldFailures(ConfigError):
    """Several checks failed at once (`every_failure`): `failures` lists (field, message) in
    the order they are reported, the env first; the message joins them with "; "."""

    def __init__(self, failures: Sequence[tuple[str, str]]) -> None:
        self.failures = list(failures)
        super().__init__("; ".join(message for _, message in self.failures))


def field_of(message: str) -> str:
    """The dotted field a failure message starts with (`"ppo.gamma = 3 is invalid"` ->
    `"ppo.gamma"`, a flag `--ppo.gamma` too), else ""."""
    match = _FIELD.match(message)
    if match is None:
        return ""
    return match.group(2).replace("-", "_") if match.group(1) else match.group(2)


def _ordered(failures: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """`failures` with those of `FIRST_FIELDS` first, the rest in their order."""
    return sorted(failures, key=lambda failure: failure[0] not in FIRST_FIELDS)


@contextlib.contextmanager
def every_failure(own: bool = False) -> Iterator[None]:
    """Within it, config checks record each failed field (the first failure of each) and go
    on; at the end one `FieldFailures` lists them all, the env first. A ConfigError that ends
    the block early (a wrong type, a failed size check, `stop_if_failed`) is merged into it.
    Nested blocks share the outermost one's record, which alone raises; with `own`, a block
    keeps its own record and raises its own failures (a config file checked on its own)."""
    if _RECORDED.get() is not None and not own:  # nested: the outer block reports
        yield
        return
    recorded: list[tuple[str, str]] = []
    token = _RECORDED.set(recorded)
    try:
        yield
    except ConfigError as exc:
        if not recorded:
            raise
        raise FieldFailures(_merged(recorded, exc)) from None
    finally:
        _RECORDED.reset(token)
    if recorded:
        raise FieldFailures(_ordered(recorded))


def _merged(recorded: list[tuple[str, str]], exc: ConfigError) -> list[tuple[str, str]]:
    """The recorded failures and, unless it only repeats them, the error that ended the block."""
    if isinstance(exc, FieldFailures):
        extra = [f for f in exc.failures if f not in recorded]
    elif all(message in str(exc) for _, message in recorded):
        extra = []
    else:
        extra = [(field_of(str(exc)), str(exc))]
    return _ordered(recorded + extra)


def _report(name: str, message: str) -> None:
    """Raises ConfigError(message), or within `every_failure` records it (once per field)."""
    recorded = _RECORDED.get()
    if recorded is None:
        raise ConfigError(message)
    if all(field != name for field, _ in recorded):
        recorded.append((name, message))


@contextlib.contextmanager
def failure_of(name: str) -> Iterator[None]:
    """A check that raises ConfigError itself (e.g. the env-name check), recorded under the
    field `name` within `every_failure` (raised as it is outside)."""
    try:
        yield
    except ConfigError as exc:
        _report(name, str(exc))


def stop_if_failed(but: Sequence[str] = FIRST_FIELDS, then: Callable[[], None] | None = None) -> None:
    """Within `every_failure`: ends the checks when a field other than `but` failed so far
    (the checks after this point compare fields with each other: each must be valid), after
    running `then` (the checks of `but`, so those fields are named too)."""
    recorded = _RECORDED.get()
    if recorded and any(field not in but for field, _ in recorded):
        if then is not None:
            then()
        raise FieldFailures(_ordered(recorded))


def _fail(name: str, value: Any, rule: str) -> None:
    _report(name, f"{name} = {value!r} is invalid: {rule}")

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
    """Raises ConfigError naming every field of a config dataclass whose value has the wrong
    type (e.g. `threaded.latency_jitter = 'a'`) or, for a `Literal` field, is none of its
    values, before any range check compares it (within `every_failure`, recorded first).

    bool is not accepted as a number (True is an int in Python); ints are accepted as floats.
    """
    failed = []
    for name, rule in field_rules(type(section)):
        value = getattr(section, name)
        if (value is None and rule.optional) or _accepts(rule, value):
            continue
        allowed = rule.description + (" or None" if rule.optional else "")
        if rule.choices is None:
            allowed += f", not {type(value).__name__}"
        failed.append((f"{prefix}{name}", f"{prefix}{name} = {value!r} is invalid: must be {allowed}"))
    for name, message in failed:
        _report(name, message)
    if failed:  # the section's other checks would compare values of the wrong type: stop here
        raise FieldFailures(failed)

def _inert(name: str, value: Any, why: str) -> None:
    _report(name, f"{name} = {value!r} has no effect: {why}")

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


def canonical_path(path: Any) -> Any:
    """A dotted field as the config spells it: `"ppo.clip-eps"` (the flag's spelling, as in
    `--ppo.clip-eps`) and `" ppo.clip_eps "` are both `"ppo.clip_eps"`; a leading `--` is dropped.
    Field names hold no `-`, so the two spellings never name different fields. A non-string is
    returned as it is (its own check reports it)."""
    if not isinstance(path, str):
        return path
    return path.strip().removeprefix("--").replace("-", "_")
