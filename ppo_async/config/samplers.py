"""One count of samplers, `Config.num_samplers`: samplers, each with its own envs, env seeds and
parameter snapshot, in every mode (threads in threaded mode, emulated samplers in simulated
mode, the one sampler of sync mode). What None stands for in a mode (`default_num_samplers`),
and its two deprecated spellings, `threaded.num_samplers` and `lag.num_samplers` (one release),
read as `num_samplers` (`read_aliases`) by a `Config` being built and in a stored config dict
(`convert_sampler_aliases`).

An alias a caller sets (Python, a flag, `--set`, a sweep grid, `replace_paths`) sets
num_samplers. A config read from a file (a run's config.json, a checkpoint's, a benchmark's or
tune's spec, a `--config` file) may be one written before the one field, which holds both
aliases, as every config did: its mode read one of them (threaded: `threaded.num_samplers`;
simulated: `lag.num_samplers`) and the other held its old default where it did nothing
(`threaded.num_samplers = 2`, `lag.num_samplers = 1`); such a config drops those
(`held_where_inert`). Side effects: a replayed file's samplers are read from it (`schedule_file`).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from ppo_async.config.schedule_file import replayed_num_samplers
from ppo_async.errors import ConfigError

DEFAULT_THREADED_SAMPLERS = 2
"""Sampler threads of a threaded run with num_samplers = None."""

SAMPLER_ALIASES = ("threaded.num_samplers", "lag.num_samplers")
"""The deprecated spellings of `num_samplers` (one release), as dotted fields."""

_OLD_DEFAULTS = {"threaded.num_samplers": DEFAULT_THREADED_SAMPLERS, "lag.num_samplers": 1}
"""What a config written before the one field holds in an alias its mode did not read (the
old `threaded.num_samplers` default; 1, which `lag.num_samplers` accepted in every mode)."""


def default_num_samplers(mode: str, lag: Any) -> int:
    """The samplers `num_samplers = None` stands for in `mode`: 2 threads (threaded), one sampler
    (sync), and in simulated mode what the lag schedule names (`lag`, a `LagConfig`):
    len(lag.per_sampler) for schedule='per_sampler', the replayed file's samplers for
    schedule='replay' (its largest sampler_id + 1, read from lag.replay_path), else 1.

    Raises:
      ConfigError: (simulated replay) the file is missing or malformed, naming lag.replay_path.
    """
    if mode == "threaded":
        return DEFAULT_THREADED_SAMPLERS
    if mode != "simulated":
        return 1
    if lag.schedule == "per_sampler":
        return len(lag.per_sampler)
    if lag.schedule == "replay":
        return replayed_num_samplers(lag.replay_path)
    return 1


def held_where_inert(path: str, value: Any, mode: str, schedule: str) -> bool:
    """Whether alias `path` = `value` is what a config written before the one field holds where
    the field did nothing (so it carries no count): `threaded.num_samplers = 2` outside threaded
    mode; `lag.num_samplers = 1` outside simulated mode or with schedule='per_sampler' (whose
    samplers were len(lag.per_sampler) whatever it said)."""
    if value != _OLD_DEFAULTS[path]:
        return False
    if path == "threaded.num_samplers":
        return mode != "threaded"
    return mode != "simulated" or schedule == "per_sampler"


class AliasReading(NamedTuple):
    """What a config's aliases make of `num_samplers`: its `value`, the aliases that `set_it`
    ((dotted field, value) each, for the FutureWarning) or the `failure` (field, value, rule)
    when they disagree with each other or with num_samplers."""

    value: int | None
    set_it: tuple[tuple[str, Any], ...] = ()
    failure: tuple[str, Any, str] | None = None


def read_aliases(num_samplers: Any, aliases: Mapping[str, Any], mode: str, schedule: str,
                 stored: bool) -> AliasReading:
    """`num_samplers` after its deprecated spellings (`aliases`: dotted field -> value, None =
    unset): an alias set sets it; two set to different values, or one beside a num_samplers of
    another value, is a failure naming both. A `stored` config (one written before the one
    field, read back: `held_where_inert`) first drops an alias at the old default its mode did
    not read."""
    setting = {path: value for path, value in aliases.items()
               if value is not None and not (stored and held_where_inert(path, value, mode, schedule))}
    if not setting:
        return AliasReading(num_samplers)
    (first, value), *others = setting.items()
    for path, other in others:
        if other != value:
            return AliasReading(num_samplers, failure=(path, other, f"{first} = {value!r} is set too: set num_samplers "
                                                       "alone (both are its deprecated spellings)"))
    if num_samplers is not None and num_samplers != value:
        return AliasReading(num_samplers, failure=(first, value, f"num_samplers = {num_samplers!r} is set too: set "
                                                   f"num_samplers alone ({first} is its deprecated spelling)"))
    return AliasReading(value, tuple(setting.items()))


def alias_warning(path: str, value: Any) -> str:
    """The FutureWarning of alias `path` = `value`, naming the field and value to use."""
    return (f"{path} = {value!r} is deprecated and goes in the next release: use num_samplers = {value!r} (samplers "
            f"in every mode: threads in threaded mode, emulated samplers in simulated mode), which this config now "
            f"holds ({path} reads None)")


def convert_sampler_aliases(data: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """A stored config dict (nested by section) in today's spelling of its samplers: its aliases
    read as a stored `Config` reads them (`read_aliases`), the count in `num_samplers`, the
    aliases at None, every other key as it was; silently. `mode` is the mode of the config
    the dict makes. ConfigError when its aliases disagree."""
    sections = {name: data.get(name) for name in ("threaded", "lag")}
    aliases = {f"{name}.num_samplers": section.get("num_samplers") for name, section in sections.items()
               if isinstance(section, Mapping)}
    if all(value is None for value in aliases.values()):
        return dict(data)
    lag = sections["lag"] if isinstance(sections["lag"], Mapping) else {}
    reading = read_aliases(data.get("num_samplers"), aliases, mode, lag.get("schedule", "fixed"), stored=True)
    if reading.failure is not None:
        field, value, rule = reading.failure
        raise ConfigError(f"{field} = {value!r} is invalid: {rule}")
    out = {**data, "num_samplers": reading.value}
    for name, section in sections.items():
        if isinstance(section, Mapping):
            out[name] = {**section, "num_samplers": None}
    return out
