"""Metric names, per-iteration rows, the JSONL writer and the console progress bar.

A *row* is one learner iteration of one seed: a flat dict of JSON scalars (lists for
histograms). Rows go to `metrics.jsonl` (one JSON object per line) and to
`TrainResult.metrics`, which converts to a pandas DataFrame.
"""

from __future__ import annotations

import array
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from ppo_async.errors import DataFileError
from ppo_async.report.health import short_warning

# Columns every mode writes (DESIGN.md vocabulary). Later modes add their own.
CORE_FIELDS = (
    "seed",
    "iteration",
    "learner_version",
    "env_steps",
    "sgd_steps",
    "wall_time",
    "steps_per_second",
    "episode_return",
    "episode_length",
    "episodes_finished",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "approx_kl_max",
    "clip_fraction",
    "dual_clip_fraction",
    "ratio_mean",
    "ratio_std",
    "ratio_max",
    "grad_norm",
    "learning_rate",
    "explained_variance",
)


def check_fraction(last_fraction: Any) -> float:
    """`last_fraction` as a float; ValueError unless it is a number in (0, 1]."""
    try:
        fraction = float(last_fraction)
    except (TypeError, ValueError):
        fraction = math.nan
    if isinstance(last_fraction, (bool, str, bytes)) or not 0 < fraction <= 1:  # NaN fails too
        raise ValueError(f"last_fraction = {last_fraction!r} is invalid: it must be in (0, 1]")
    return fraction


def _as_float(value: Any) -> float:
    """A number (or a string that spells one, as pandas' `to_numeric` reads it) as a float; NaN otherwise."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def tail_mean(values: Sequence[Any], last_fraction: float = 0.1) -> float:
    """The mean of the last `max(1, int(n * last_fraction))` of n values (one run's rows in
    iteration order): the "final return" of `TrainResult.final_returns` and
    `analysis.final_returns`. None and non-numbers in the tail are ignored; NaN if the tail
    holds no number (or there are no values). Pure numpy: the `train` command's last line
    needs no pandas."""
    fraction = check_fraction(last_fraction)
    tail = values[len(values) - max(1, int(len(values) * fraction)):] if len(values) else []
    numbers = np.array([_as_float(v) for v in tail], dtype=np.float64)
    numbers = numbers[~np.isnan(numbers)]
    return float(numbers.mean()) if numbers.size else math.nan


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or infinity; the message names the quantity and the iteration."""


def to_python(value: Any) -> Any:
    """numpy / jax scalars and arrays -> JSON-friendly Python (NaN -> None)."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        item = arr.item()
        if isinstance(item, float) and not math.isfinite(item):
            return None
        return item
    return [to_python(v) for v in arr]


def split_seeds(batched: Mapping[str, Any], num_seeds: int) -> list[dict[str, Any]]:
    """`{name: [S, ...]}` -> S dicts of Python values."""
    host = {k: np.asarray(v) for k, v in batched.items()}
    return [{k: to_python(v[i]) for k, v in host.items()} for i in range(num_seeds)]


def check_finite(rows: Iterable[Mapping[str, Any]], names: Iterable[str], iteration: int) -> None:
    """Raises NonFiniteError if any listed loss metric is None (was NaN/inf) in any row."""
    for row in rows:
        for name in names:
            if name in row and row[name] is None:
                where = ", ".join(f"{k} {row[k]}" for k in ("config_id", "seed") if k in row)
                raise NonFiniteError(
                    f"{name} became NaN or infinite at iteration {iteration} ({where}); "
                    "check the env's observations/rewards, the learning rate and max_grad_norm"
                )


class JsonlWriter:
    """Appends rows to a JSONL file, flushing each write (a killed run keeps what it wrote)."""

    def __init__(self, path: str | os.PathLike, append: bool = False) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, row: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def iter_jsonl(path: str | os.PathLike, columns: Iterable[str] | None = None) -> Iterator[dict[str, Any]]:
    """The rows of a metrics.jsonl one at a time; with `columns`, each row keeps only those of
    its fields. Nothing but the current row is held.

    A torn last line (a killed run) is ignored. Raises `DataFileError` (a ConfigError) naming
    the file and the 1-based line for any other line that is not JSON, a line that is not a
    JSON object, or bytes that are not UTF-8; OSError (e.g. FileNotFoundError) as `open` does.
    """
    keep = None if columns is None else set(columns)
    torn: DataFileError | None = None  # a line that did not parse: an error unless it is the last one
    with open(path, "rb") as f:  # bytes, decoded line by line: a bad byte is named by its line
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            if torn is not None:
                raise torn
            try:
                row = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                torn = bad_line(path, number, _not_json(exc) + "; only a torn last line (a killed run) is skipped")
                continue
            if not isinstance(row, dict):
                raise bad_line(path, number, f"a JSON {type(row).__name__} where a row (a JSON object) belongs")
            yield row if keep is None else {k: v for k, v in row.items() if k in keep}


def _not_json(exc: UnicodeDecodeError | json.JSONDecodeError) -> str:
    """What is wrong with a line that did not parse, and where in it."""
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text ({exc.reason} at byte {exc.start + 1})"
    return f"not JSON ({exc.msg}, column {exc.colno})"


def bad_line(path: str | os.PathLike, number: int, what: str) -> DataFileError:
    """The error of line `number` (1-based) of the file `path`: `PATH, line N: WHAT`."""
    return DataFileError(f"{os.fspath(path)}, line {number}: {what}")


def first_row(path: str | os.PathLike) -> dict[str, Any] | None:
    """The first row of a metrics.jsonl (`iter_jsonl`), None when it has none (an empty file,
    or one torn line); reads no further than that row."""
    return next(iter(iter_jsonl(path)), None)


def read_jsonl(path: str | os.PathLike, columns: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a torn last line from a killed run is ignored), read line by
    line (`iter_jsonl`); with `columns`, each row keeps only those of its fields. Raises
    `DataFileError` naming the file and the 1-based line of a corrupt line."""
    return list(iter_jsonl(path, columns))


BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} env steps [{elapsed}<{remaining}{postfix}]"
"""The bar without tqdm's own rate: the one throughput figure is the run's `sps` in the postfix."""


class Progress:
    """Progress over env steps showing steps/s, return, KL (and lag where there is one).

    On a terminal (stderr a TTY) or in a notebook (tqdm.auto's widget) a bar; otherwise (redirected to a file, a CI log) plain
    lines, one per `every_s` seconds and one at the end, never `\r` frames.
    """

    def __init__(self, total_env_steps: int, enabled: bool = True, desc: str = "train", tty: bool | None = None,
                 every_s: float = 10.0) -> None:
        self._bar = None
        self._last_return: Any = None
        self._total, self._desc, self._every_s = total_env_steps, desc, every_s
        self.enabled = enabled
        self.tty = _interactive() if tty is None else tty
        self.postfix = ""
        self._n = 0
        self._started = time.perf_counter()
        self._last_line = -math.inf
        if not enabled:
            return
        if self.tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_env_steps, desc=desc, unit="step", unit_scale=True, dynamic_ncols=True,
                             bar_format=BAR_FORMAT)

    def update(self, env_steps: int, row: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        if row.get("episode_return") is not None:  # iterations with no finished episode keep the last one
            self._last_return = row["episode_return"]
        post = {"sps": _fmt(row.get("steps_per_second")), "return": _fmt(self._last_return), "kl": _fmt(row.get("approx_kl"), 4)}
        if row.get("lag_mean") is not None:
            post["lag"] = _fmt(row.get("lag_mean"), 2)
        warn = short_warning(row)
        if warn:
            post["WARN"] = warn
        self.postfix = ", ".join(f"{k}={v}" for k, v in post.items())
        self._n = env_steps
        if self._bar is not None:
            self._bar.update(env_steps - self._bar.n)
            self._bar.set_postfix(post, refresh=False)
            return
        now = time.perf_counter()
        if now - self._last_line >= self._every_s or env_steps >= self._total:
            self._last_line = now
            self._print_line()

    def _print_line(self) -> None:
        pct = 100.0 * self._n / max(self._total, 1)
        print(f"{self._desc}: {self._n:,}/{self._total:,} env steps ({pct:.0f}%, {time.perf_counter() - self._started:.0f}s), "
              f"{self.postfix}", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        """A line above the bar, or a plain line without one (nothing when progress is off)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.enabled and self._n and time.perf_counter() - self._last_line > 0 and self._n < self._total:
            self._print_line()  # where a run stopped early: its last state
        self.enabled = False


def _interactive() -> bool:
    """Whether a live bar can redraw: stderr is a terminal, or this process is a running Jupyter
    kernel (IPython's shell has a kernel; `ipykernel` merely imported, as by a test run or a
    library, is not one)."""
    return sys.stderr.isatty() or in_jupyter_kernel()


def in_jupyter_kernel() -> bool:
    """Whether code runs inside a live Jupyter kernel (where tqdm.auto draws a widget)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return getattr(shell, "kernel", None) is not None


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)


def scalar_items(row: Mapping[str, Any]) -> dict[str, float]:
    """The plain numeric entries of a row (no lists, None or booleans), e.g. for W&B / TensorBoard."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class MetricsLog(Sequence):
    """The metrics rows of a run, held compactly: `TrainResult.metrics`.

    A sequence of row dicts (index, slice, iterate, `len`, `==` with any sequence of rows), in
    one of two forms, so that memory does not grow with the run:
      * in memory (runs without a run directory, sweeps): one column per field, numbers in a
        float64 `array` (~8 bytes per value; integers come back as integers, None as None),
        lists as their JSON text, other values as they are;
      * read back from RUN_DIR/metrics.jsonl (`MetricsLog.from_file`): nothing is held while
        the run goes. Iterating (`rows`, `to_dataframe`) parses the file line by line each
        time and keeps no row; indexing first loads the file into the compact columns above.
    """

    def __init__(self, rows: Iterable[Mapping[str, Any]] = ()) -> None:
        self._path: str | None = None
        self._filled = False  # a file-backed log whose file was loaded into the columns (for indexing)
        self._columns: dict[str, tuple[str, Any, Any]] = {}  # name -> (kind, values, flags: 0 absent, 1 present, 2 an int)
        self._length = 0
        self.extend(rows)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "MetricsLog":
        """The rows of a metrics.jsonl, read when first needed."""
        log = cls()
        log._path = os.fspath(path)
        return log

    # -- building ------------------------------------------------------------------------
    def append(self, row: Mapping[str, Any]) -> None:
        if self._path is not None:
            raise TypeError("a MetricsLog read from a file is read-only")
        self._add(row)

    def _add(self, row: Mapping[str, Any]) -> None:
        """Appends one row to the columns (a field new to the log gets a column)."""
        for name, value in row.items():
            number = value is None or _is_number(value)
            if name not in self._columns:
                self._columns[name] = ("number", array.array("d"), array.array("b")) if number else ("object", [], array.array("b"))
            kind, values, present = self._columns[name]
            if kind == "number" and not number:
                values = [self._decode("number", v, p) for v, p in zip(values, present)]
                kind = "object"
                self._columns[name] = (kind, values, present)
            while len(present) < self._length:  # the field was absent from earlier rows
                values.append(math.nan if kind == "number" else None)
                present.append(0)
            if kind == "number":
                values.append(math.nan if value is None else float(value))
            else:
                values.append(_ListText(json.dumps(value)) if isinstance(value, list) else value)
            present.append(2 if isinstance(value, int) and _is_number(value) else 1)
        self._length += 1

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)

    @staticmethod
    def _decode(kind: str, value: Any, present: int) -> Any:
        if not present:
            return None
        if kind == "number":
            return None if math.isnan(value) else (int(value) if present == 2 else value)
        if isinstance(value, _ListText):
            return json.loads(value)
        return value

    # -- reading -------------------------------------------------------------------------
    def _fill(self) -> None:
        """A file-backed log: loads the file into the compact columns, once (for indexing)."""
        if self._path is not None and not self._filled:
            if os.path.isfile(self._path):
                for row in iter_jsonl(self._path):
                    self._add(row)
            self._filled = True

    def _row(self, index: int, columns: Any = None) -> dict[str, Any]:
        return {name: self._decode(kind, values[index], present[index])
                for name, (kind, values, present) in self._columns.items()
                if index < len(present) and present[index] and (columns is None or name in columns)}

    def rows(self, columns: Iterable[str] | None = None) -> Iterator[dict[str, Any]]:
        """The rows one at a time, each with only `columns` (of those it has) when given;
        a file-backed log parses its file line by line (`iter_jsonl`) and holds no row."""
        keep = None if columns is None else set(columns)
        if self._path is not None:
            return iter_jsonl(self._path, keep) if os.path.isfile(self._path) else iter(())
        return (self._row(i, keep) for i in range(self._length))

    def __len__(self) -> int:
        if self._path is not None and not self._filled:  # count the rows without holding them
            if not os.path.isfile(self._path):
                return 0
            with open(self._path, encoding="utf-8") as f:
                return sum(1 for line in f if line.strip())
        return self._length

    def __getitem__(self, index):  # type: ignore[override]
        self._fill()
        if isinstance(index, slice):
            return [self._row(i) for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("MetricsLog index out of range")
        return self._row(index)

    def __iter__(self):
        return self.rows()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __repr__(self) -> str:
        where = f" from {self._path!r}" if self._path else ""
        return f"MetricsLog({len(self)} rows{where})"


class _ListText(str):
    """A list value held as its JSON text (a few bytes per element instead of a Python list)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
