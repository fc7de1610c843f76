"""XLA flags for entry points (CLI, tests, experiment scripts, notebooks) — never set at import.

On this project's 2-core CPU machines with jax 0.10.2, a jitted PPO program occasionally
hangs inside XLA with every thread idle (the host blocks forever in `device_get`). We saw it
with our own code: a sync run (CartPole, 60k steps) inside the test suite and a
`sweep(strategy="loop")` run, each stuck for minutes at ~0% CPU. Disabling XLA:CPU's
concurrency-optimised scheduler is the known workaround. Call `apply_cpu_workarounds()`
before JAX initialises its backend (before the first computation).
"""

from __future__ import annotations

import os

CPU_XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)


def apply_cpu_workarounds(environ: "os._Environ[str] | dict[str, str] | None" = None) -> str:
    """Appends `CPU_XLA_FLAGS` to XLA_FLAGS (idempotent) and returns the new value.

    Must run before JAX's backend starts; afterwards it has no effect on this process
    (but still on subprocesses that inherit the environment).
    """
    env = os.environ if environ is None else environ
    flags = env.get("XLA_FLAGS", "").split()
    for flag in CPU_XLA_FLAGS:
        name = flag.split("=")[0]
        if not any(f.split("=")[0] == name for f in flags):
            flags.append(flag)
    env["XLA_FLAGS"] = " ".join(flags)
    return env["XLA_FLAGS"]


def backend_started() -> bool:
    """True once JAX has initialised a backend (flags set later do not apply to this process)."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge._backends)
    except Exception:  # noqa: BLE001 - private API; assume started if unknown
        return True
