"""The exception types every layer raises (the bottom of the package: it imports nothing).

`ConfigError` is a bad input named by its field; `DistributedFailure` is another process of a
multi-process run failing. Both are re-exported by `ppo_async.config` and `ppo_async`.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, the value and the rule."""

class DistributedFailure(RuntimeError):
    """Another process of a multi-process run (`distributed.*`) failed, died or was killed."""

    exit_status = 4  # `python -m ppo_async`'s status for it: this process stopped because another failed
