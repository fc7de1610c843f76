"""The paths a command line names, checked before a command reads or writes them (side effects:
disk I/O only). Each check raises one-line `ConfigError`s naming the option or argument, the
path and what is wrong, so a bad path ends with exit status 2 instead of a traceback."""

from __future__ import annotations

import contextlib
import os
import tempfile

from ppo_async.errors import ConfigError, DataFileError

METRICS_FILE = "metrics.jsonl"


def check_run_dir(run_dir: str) -> None:
    """ConfigError unless `run_dir` is a directory holding a metrics.jsonl with at least one
    row; `DataFileError` (file and 1-based line) when that file's first lines are corrupt."""
    if not os.path.isdir(run_dir):
        what = "is a file, not a directory" if os.path.exists(run_dir) else "does not exist"
        raise ConfigError(f"run directory {run_dir!r} {what}")
    path = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(path):
        raise ConfigError(f"{run_dir!r} is not a run directory: no {METRICS_FILE} in it")
    check_has_rows(path)


def check_has_rows(path: str) -> None:
    """DataFileError when the metrics file `path` holds no row (empty, blank, or one torn
    line); reads no further than its first row."""
    from ppo_async.report.metrics import first_row

    try:
        row = first_row(path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    if row is None:
        raise DataFileError(f"{path}: no rows (the run wrote no learner iteration yet, or only a torn line)")


def check_output_dir(option: str, path: str) -> None:
    """ConfigError (one line: `option`, the path and the reason) when the output directory
    `path` cannot be created or a file cannot be written in it: a file there or above it, a
    read-only place, no permission. Creates what is missing and one probe file, then removes
    both: a refused command leaves nothing behind."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{option} = {path!r} is invalid: it is a file, not a directory")
    created = []  # the directories this check makes, deepest first
    here = os.path.abspath(path)
    while not os.path.exists(here) and os.path.dirname(here) != here:
        created.append(here)
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise ConfigError(f"{option} = {path!r} is invalid: {here!r} above it is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} = {path!r} is invalid: cannot create or write it "
                          f"({exc.strerror or type(exc).__name__}); choose a directory you can write") from None
    finally:
        for directory in created:
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def check_input_file(option: str, path: str) -> None:
    """ConfigError unless `path` is a readable file: missing, a directory, or unreadable."""
    if not os.path.exists(path):
        raise ConfigError(f"{option} {path!r}: no such file")
    if os.path.isdir(path):
        raise ConfigError(f"{option} {path!r}: is a directory, not a file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{option} {path!r}: cannot read it (permission denied)")


def read_utf8(path: str) -> str:
    """The text of `path`; DataFileError naming the file and the 1-based line of the first byte
    that is not UTF-8."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataFileError(f"{path}, line {line}: not UTF-8 text ({exc.reason})") from None


def check_csv(path: str) -> None:
    """DataFileError (the file and the 1-based line) when the CSV table `path` is not UTF-8,
    has an unterminated quote, or a row with more or fewer fields than its header."""
    import csv
    import io

    reader = csv.reader(io.StringIO(read_utf8(path), newline=""), strict=True)
    try:
        header = next(reader, None)
        for row in reader:
            if row and header is not None and len(row) != len(header):
                raise DataFileError(f"{path}, line {reader.line_num}: {len(row)} fields where the header has "
                                    f"{len(header)}")
    except csv.Error as exc:
        raise DataFileError(f"{path}, line {reader.line_num}: not CSV ({exc})") from None
