"""XLA flags for entry points (CLI, tests, experiment scripts, notebooks) — never set at import.

On this project's 2-core CPU machines with jax 0.10.2, a jitted PPO program occasionally
hangs inside XLA with every thread idle (the host blocks forever in `device_get`). We saw it
with our own code: a sync run (CartPole, 60k steps) inside the test suite and a
`sweep(strategy="loop")` run, each stuck for minutes at ~0% CPU. Disabling XLA:CPU's
concurrency-optimised scheduler is the known workaround. The library passes it to every
training program it compiles (`program_compiler_options`), so a Python or notebook user need
not do anything; entry points also call `apply_cpu_workarounds()` before JAX initialises its
backend (before the first computation), which sets it for every program of the process.

`enable_compilation_cache()` turns on JAX's persistent compilation cache, so that a second
process compiling the same programs (same config shapes, jax version and XLA flags) loads
them from disk instead of recompiling. Entry points call it right after
`apply_cpu_workarounds()`; the test suite points it at a directory of its own run (never the
user's cache, see tests/conftest.py).
"""

from __future__ import annotations

import os

CPU_XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)
CPU_COMPILER_OPTIONS = {"xla_cpu_enable_concurrency_optimized_scheduler": False}
"""The same workaround as a per-program compiler option (`program_compiler_options`): the library
passes it to the programs it compiles itself, so a run started from Python or a notebook needs no
call before JAX starts (and no global flag is set at import)."""


def program_compiler_options() -> dict[str, bool] | None:
    """`CPU_COMPILER_OPTIONS` where JAX's default backend is the CPU (the hang is XLA:CPU's),
    None elsewhere: pass it as `jax.jit(..., compiler_options=...)` or `.compile(compiler_options=...)`
    to a training program."""
    import jax

    return dict(CPU_COMPILER_OPTIONS) if jax.default_backend() == "cpu" else None

COMPILATION_CACHE_ENV = "PPO_ASYNC_COMPILATION_CACHE"
_CACHE_OFF_VALUES = ("", "0", "off", "false", "no")


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


def default_compilation_cache_dir(environ: "os._Environ[str] | dict[str, str] | None" = None) -> str:
    """`$XDG_CACHE_HOME/ppo_async/jax`, or `~/.cache/ppo_async/jax` without XDG_CACHE_HOME."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ppo_async", "jax")


def compilation_cache_dir(
    path: str | None = None, environ: "os._Environ[str] | dict[str, str] | None" = None
) -> str | None:
    """The directory `enable_compilation_cache(path)` would use (absolute), or None when disabled.

    `path` wins when given; otherwise `$PPO_ASYNC_COMPILATION_CACHE`: unset = the default
    directory (`default_compilation_cache_dir`), `0` / `off` / `false` / `no` / empty = disabled,
    anything else = that directory (`~` expanded).
    """
    env = os.environ if environ is None else environ
    if path is None:
        value = env.get(COMPILATION_CACHE_ENV)
        if value is None:
            path = default_compilation_cache_dir(env)
        elif value.strip().lower() in _CACHE_OFF_VALUES:
            return None
        else:
            path = value.strip()
    return os.path.abspath(os.path.expanduser(path))


def enable_compilation_cache(path: str | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache; returns its directory (None: left off).

    Where (see `compilation_cache_dir`): `path` if given, else `$PPO_ASYNC_COMPILATION_CACHE`
    (unset = `$XDG_CACHE_HOME/ppo_async/jax` or `~/.cache/ppo_async/jax`; `0`, `off`, `false`,
    `no` or empty = off: nothing is configured and this returns None).

    Sets `jax_compilation_cache_dir`, and `jax_persistent_cache_min_compile_time_secs = 0` and
    `jax_persistent_cache_min_entry_size_bytes = 0`: JAX's defaults only store programs that
    took >= 1 s to compile, which skips most of ours on CPU. XLA:CPU in jax 0.10.2 serialises
    executables, so no further flag is needed (`jax_persistent_cache_enable_xla_caches` only
    concerns GPU autotuning / kernel caches). Programs with host callbacks are never cached.

    Safe to call before or after `apply_cpu_workarounds()` and before or after JAX's backend
    starts; it applies to compilations that happen after it (programs compiled earlier in this
    process stay uncached; calling it again with another directory switches to that one).
    The cache key covers the program, jax/jaxlib versions, XLA flags and the device, so a
    stale entry is never used for a different program. The directory is not size-limited
    (JAX's LRU eviction needs the `filelock` package); delete it to reclaim space. Like any
    JAX compilation cache it is trusted: do not point it at a directory others can write to.
    If the directory cannot be created, a warning is issued and the cache stays off (None).
    """
    directory = compilation_cache_dir(path)
    if directory is None:
        return None
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        import warnings

        warnings.warn(f"ppo_async: compilation cache left off, cannot create {directory!r}: {exc}", stacklevel=2)
        return None
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    current = jax.config.values.get("jax_compilation_cache_dir")
    if current and os.path.abspath(current) != directory:
        compilation_cache.reset_cache()  # an initialised cache keeps its directory otherwise
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory
