"""Which fields a config's caller set, and the env's defaults for the others.

`Config(env="gymnasium/Hopper-v5")` is the same config as `train --env gymnasium/Hopper-v5`:
the env's preset (`preset_table.env_defaults`, with threaded mode for a host-side env) fills
every field its caller did not pass, at every entry point. To know which those are, each
config section records the names its constructor was given (`record_given`, a class
decorator); `apply_env_defaults` then fills the rest of a `Config` before it is validated and
records what it filled (`preset_fields`). A section built without an argument (a default)
sets nothing; `pa.PPOConfig(learning_rate=1e-3)` sets `ppo.learning_rate` alone. Configs read
from a file or a run's config.json pass every field they hold, so a complete config.json is
taken as written.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

GIVEN_ATTR = "_given_fields"
PRESET_ATTR = "_preset_fields"


def record_given(cls: type) -> type:
    """Class decorator for a frozen config dataclass: every instance remembers the names of
    the fields its constructor was given (positionally or by keyword), `given_fields`."""
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, GIVEN_ATTR, frozenset(names[:len(args)]) | frozenset(kwargs))
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


def given_fields(section: Any) -> frozenset[str]:
    """The field names `section`'s caller set (empty for an object built without them); every
    field of an object whose class does not record them (a subclass with its own generated
    constructor, e.g. the CLI's `CliConfig`): taken as written, never filled."""
    given = getattr(section, GIVEN_ATTR, None)
    if given is None:
        return frozenset(f.name for f in dataclasses.fields(section) if f.init)
    return given


def preset_fields(config: Any) -> tuple[str, ...]:
    """The dotted fields of `config` that its env's defaults filled in (none for a config
    every field of which was given, e.g. one read from a complete config.json)."""
    return getattr(config, PRESET_ATTR, ())


def _with_values(section: Any, values: Mapping[str, Any]) -> Any:
    """`section` with `values` set, remembering only its caller's fields as given."""
    new = dataclasses.replace(section, **values)
    object.__setattr__(new, GIVEN_ATTR, given_fields(section))
    return new


def with_fields(section: Any, values: Mapping[str, Any]) -> Any:
    """`section` with `values` set by its caller: its caller's fields and these count as given
    (validated by the section's constructor)."""
    new = dataclasses.replace(section, **values)
    object.__setattr__(new, GIVEN_ATTR, given_fields(section) | frozenset(values))
    return new


def defaults_to_fill(config: Any, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `defaults` (dotted field -> value) whose field `config`'s caller did not
    set: a top-level field not given, or a section field whose section was not given or was
    given without it."""
    given = given_fields(config)
    fill = {}
    for path, value in defaults.items():
        section, _dot, name = path.partition(".")
        if not name:
            taken = section in given
        else:
            taken = section in given and name in given_fields(getattr(config, section))
        if not taken:
            fill[path] = value
    return fill


def apply_env_defaults(config: Any, defaults: Mapping[str, Any]) -> None:
    """Fills, in place and before validation, `defaults_to_fill(config, defaults)` into a
    `Config` being built, and records their paths (`preset_fields`)."""
    fill = defaults_to_fill(config, defaults)
    by_section: dict[str, dict[str, Any]] = {}
    for path, value in fill.items():
        section, _dot, name = path.partition(".")
        if name:
            by_section.setdefault(section, {})[name] = value
        else:
            object.__setattr__(config, section, value)
    for section, values in by_section.items():
        object.__setattr__(config, section, _with_values(getattr(config, section), values))
    object.__setattr__(config, PRESET_ATTR, tuple(fill))


def as_given(config: Any) -> dict[str, Any]:
    """The constructor arguments that rebuild what `config`'s caller set and nothing else: its
    given top-level fields, each given section rebuilt from its own given fields."""
    out = {}
    for name in given_fields(config):
        value = getattr(config, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = type(value)(**{f: getattr(value, f) for f in given_fields(value)})
        out[name] = value
    return out
