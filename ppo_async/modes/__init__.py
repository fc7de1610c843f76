"""Execution modes. Importing this package registers each one in `ppo_async.registry`."""

from ppo_async.modes import simulated, sync, threaded  # noqa: F401  (each registers its Mode)
