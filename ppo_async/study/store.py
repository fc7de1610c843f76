"""Resume by skipping: the one mechanism of the studies that run for hours and are run again on
the same output directory (the benchmark, tune; experiments/ablation.py through the benchmark).

The directory holds
- a spec file, JSON, written by the first call and checked by every later one (`check_spec`):
  a call with other arguments is refused (a ConfigError), so results are never silently mixed;
- a log of finished work (`RowLog`): rows appended in one flushed write per item of work, each
  row naming its item's key; a CSV of fixed columns (the benchmark's results.csv) or JSON lines
  (tune's measurements.jsonl). `finished` reads it back: the rows of every finished item, the
  rows of an unfinished one (a write cut short) removed from the file.
A later call skips every finished key. The formats are the callers'; nothing here rewrites a
file it has no row to remove from. Side effects: file reads and writes only.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping, Sequence

from ppo_async.config import convert_deprecated_fields
from ppo_async.errors import ConfigError, DataFileError
from ppo_async.report.metrics import read_jsonl


def read_spec(path: str) -> dict[str, Any] | None:
    """The JSON document at `path`; None when there is no file. DataFileError naming the file
    and the 1-based line when it does not parse."""
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as exc:
            raise DataFileError(f"{path}, line {exc.lineno}: not JSON ({exc.msg}, column {exc.colno})") from None


_MISSING = object()


def changed_paths(recorded: Any, today: Any, prefix: str = "", defaults: Any = _MISSING) -> list[str]:
    """Dotted paths where nested dicts `recorded` and `today` differ. A key `recorded` lacks (a
    config field added to the code since) does not differ when `today` holds its default there
    (`defaults`: the same nesting): the recorded runs ran with that default."""
    if isinstance(recorded, dict) and isinstance(today, dict):
        sub = lambda k: defaults.get(k, _MISSING) if isinstance(defaults, dict) else _MISSING  # noqa: E731
        return [p for k in sorted(set(recorded) | set(today))
                if not (k not in recorded and sub(k) is not _MISSING and today.get(k) == sub(k))
                for p in changed_paths(recorded.get(k), today.get(k), f"{prefix}{k}.", sub(k))]
    return [] if recorded == today else [prefix.rstrip(".")]


def as_today(config: Any) -> Any:
    """A recorded config dict in today's spelling, to compare with today's
    (`convert_deprecated_fields`: `eval_every: 49` of batch 2048 is `eval_every_steps: 100352`,
    `threaded.num_samplers: 8` of a threaded run is `num_samplers: 8`);
    as recorded when it is no dict or today's code refuses it (the comparison names what differs)."""
    try:
        return convert_deprecated_fields(config) if isinstance(config, dict) else config
    except ConfigError:
        return config


def check_spec(path: str, spec: Mapping[str, Any], refusal: Callable[[dict, dict], str | None],
               write: Callable[[str, dict], None], rewrite: Callable[[dict, dict], bool] | None = None) -> None:
    """Writes `spec` to `path` (with `write(path, spec)`) on the first call; on a later one,
    raises ConfigError(`refusal(recorded, spec)`) when that names a difference, and writes
    `spec` again only when `rewrite(recorded, spec)` says it extends the recorded one."""
    recorded = read_spec(path)
    if recorded is None:
        write(path, dict(spec))
        return
    message = refusal(recorded, dict(spec))
    if message:
        raise ConfigError(message)
    if rewrite is not None and rewrite(recorded, dict(spec)):
        write(path, dict(spec))


@dataclass(frozen=True)
class RowLog:
    """A file of rows appended one flushed write at a time: CSV with `columns` (its rows read
    back as strings, a row with missing or extra fields, a torn write, left out) or, when
    `columns` is None, JSON lines (a torn last line left out; `read_jsonl`)."""

    path: str
    columns: tuple[str, ...] | None = None

    def read(self) -> list[dict[str, Any]]:
        """Every whole row, in file order; [] when there is no file."""
        if not os.path.isfile(self.path):
            return []
        if self.columns is None:
            return read_jsonl(self.path)
        with open(self.path, encoding="utf-8", newline="") as f:
            return [row for row in csv.DictReader(f) if None not in row and None not in row.values()]

    def append(self, rows: Sequence[Mapping[str, Any]], fresh: bool = False) -> None:
        """Appends `rows` (a CSV's header first when the file is new or empty) in one write,
        flushed; `fresh` replaces the file's rows with them."""
        new = fresh or not os.path.isfile(self.path) or os.path.getsize(self.path) == 0
        with open(self.path, "w" if fresh else "a", encoding="utf-8", newline="") as f:
            if self.columns is None:
                f.write("".join(json.dumps(dict(row)) + "\n" for row in rows))
            else:
                writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
                if new:
                    writer.writeheader()
                writer.writerows(rows)
            f.flush()

    def data_lines(self) -> int:
        """The non-blank lines of the file that are not a CSV's header (0 without a file)."""
        if not os.path.isfile(self.path):
            return 0
        with open(self.path, encoding="utf-8") as f:
            lines = sum(1 for line in f if line.strip())
        return max(lines - 1, 0) if self.columns is not None else lines


def finished(log: RowLog, key: Callable[[dict], Hashable], is_final: Callable[[dict], bool],
             rows: Sequence[dict] | None = None) -> dict[Hashable, list[dict]]:
    """{key: its rows, in file order} of every finished item of `log` (one of its rows is final)
    from `rows` (default: `log.read()`); when the file holds any other line (an unfinished
    item's rows, a torn row), it is rewritten with the finished items' rows alone."""
    rows = log.read() if rows is None else rows
    done = {key(r) for r in rows if is_final(r)}
    out: dict[Hashable, list[dict]] = {}
    for row in rows:
        if key(row) in done:
            out.setdefault(key(row), []).append(row)
    kept = [row for row in rows if key(row) in done]
    if len(kept) != log.data_lines():
        log.append(kept, fresh=True)
    return out
