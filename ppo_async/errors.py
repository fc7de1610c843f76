"""The exception types every layer raises (the bottom of the package: it imports nothing).

`ConfigError` is a bad input named by its field; `DataFileError` (a `ConfigError`) a data file
that cannot be read, named with its 1-based line; `DistributedFailure` is another process of a
multi-process run failing. All three are public (`pa.ConfigError`, `pa.DataFileError`,
`pa.DistributedFailure`); `ConfigError` and `DistributedFailure` are also re-exported by
`ppo_async.config`. The errors of a run live where they are raised and are public too:
`pa.NonFiniteError` (report.metrics), `pa.CheckpointError` (run.checkpoint) and
`pa.StalledThread` (modes.threaded.liveness, a `TimeoutError`).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, the value and the rule."""


class DataFileError(ConfigError):
    """A data file a command reads (metrics.jsonl, a config file, results.csv) is empty or
    corrupt; the message names the file and, where there is one, the 1-based line:
    `runs/a/metrics.jsonl, line 7: not JSON (...)`. The CLI ends with exit status 2 on it."""


class DistributedFailure(RuntimeError):
    """Another process of a multi-process run (`distributed.*`) failed, died or was killed."""

    exit_status = 4  # `python -m ppo_async`'s status for it: this process stopped because another failed
