"""`python -m ppo_async ...` (see ppo_async.cli)."""

from ppo_async.runtime.xla_flags import apply_cpu_workarounds

apply_cpu_workarounds()  # entry point: before JAX starts its backend

from ppo_async.cli.dispatch import entry_point  # noqa: E402

entry_point()  # main(); then flushes, runs the atexit handlers and skips the interpreter's teardown
