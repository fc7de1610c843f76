"""The version-schedule file a config names (`lag.replay_path`), read where the config needs it:
its records (`read_rows`, checked for the columns replay uses) and the samplers it names
(`replayed_num_samplers`: what a simulated run replaying it emulates when `num_samplers` is
None). The format, and the schedules built from a file, are `ppo_async.core.lag`'s.
Side effects: file reads only.
"""

from __future__ import annotations

import csv
import functools
import json
import os
from typing import Any

from ppo_async.errors import ConfigError


def read_rows(path: str | os.PathLike | None) -> tuple[str, list[dict[str, Any]], list[int]]:
    """`(path, rows, iterations)` of a version-schedule file, each row with a sampler_id and a
    lag, `iterations[i]` the learner iteration of row i (its record's, else i + 1).

    Raises ConfigError naming the file: missing, unparsable, empty, or a row without those columns.
    """
    if path is None or not os.path.isfile(path):
        raise ConfigError(f"lag.replay_path = {path!r}: no such file")
    path = os.fspath(path)
    try:
        if path.endswith(".csv"):
            with open(path, newline="", encoding="utf-8") as f:
                rows = list(csv.DictReader(f))
        else:
            with open(path, encoding="utf-8") as f:
                rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        raise ConfigError(f"lag.replay_path = {path!r}: cannot parse: {exc}") from None
    if not rows:
        raise ConfigError(f"lag.replay_path = {path!r}: the schedule is empty")
    needed = ("sampler_id", "lag")
    for i, row in enumerate(rows):
        missing = [c for c in needed if row.get(c) in (None, "")]
        if missing:
            raise ConfigError(f"lag.replay_path = {path!r}: record {i + 1} lacks {missing}")
    return path, rows, [int(r.get("iteration") or i + 1) for i, r in enumerate(rows)]


def file_key(path: str | os.PathLike | None) -> tuple[str | None, float, int]:
    """(path, mtime, size): a cache key that changes when the file does."""
    if path is None or not os.path.isfile(path):
        return (None if path is None else os.fspath(path), 0.0, -1)
    stat = os.stat(path)
    return os.fspath(path), stat.st_mtime, stat.st_size


def replayed_num_samplers(path: str | os.PathLike | None) -> int:
    """The samplers a version-schedule file names: its largest sampler_id + 1 (read once while
    the file is unchanged). ConfigError naming the file as `read_rows`."""
    return _samplers_named(*file_key(path))


@functools.lru_cache(maxsize=8)
def _samplers_named(path: str | None, _mtime: float, _size: int) -> int:
    path, rows, _iterations = read_rows(path)
    ids = [int(row["sampler_id"]) for row in rows]
    if min(ids) < 0:
        raise ConfigError(f"lag.replay_path = {path!r}: sampler ids and lags must be >= 0")
    return max(ids) + 1
