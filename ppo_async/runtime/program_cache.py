"""A persistent cache of traced and lowered training programs (`jax.export`), beside JAX's own.

JAX's persistent compilation cache spares a second process XLA's compile, but not what comes
before it: the process still traces its Python into a jaxpr and lowers that to StableHLO just to
compute the cache key - 0.9 s of the 5.0 s a warm CartPole run took end to end
(experiments/bench_startup, issue 40 item 12). This cache keeps the lowered program itself:
`jax.export` turns a jitted function at given input shapes into an `Exported` (its StableHLO and
its input / output trees), kept as a file; a later process asking for the same key reads it and
calls it through a thin `jax.jit` wrapper, whose trace and lowering are trivial and whose compile
hits JAX's cache. The program is the same StableHLO, so its results are bitwise those of tracing
it again (tests/test_program_cache.py).

The key covers what decides the traced program: the caller's key (for the jitted modes,
`modes.common.jitted_program_key`: every config field that is not host-side or traced), the
shapes and dtypes of the inputs, the source of `ppo_async` itself, the versions of the packages
whose code is traced (jax, jaxlib, flax, optax, chex, gymnax, brax, mujoco, playground, numpy),
the JAX settings that change tracing (x64, default matmul precision, PRNG implementation), the
backend and its devices. A change in any of them is a miss, never a stale program.

A program `jax.export` refuses (host callbacks, custom calls outside its stable set) is traced
as before, uncached, and so is every program while the cache is off. A file that cannot be read
is a miss and is written again. Files are written whole (a temporary file renamed), so processes
sharing the directory never read half a program.

Where: `<JAX's compilation cache directory>-programs`, and only while JAX's persistent cache is
on (`runtime.xla_flags.enable_compilation_cache`): `$PPO_ASYNC_COMPILATION_CACHE=0` turns both
off. The files are pickles (an `Exported` holds pytree definitions): trusted like JAX's cache,
never a directory others can write to. Delete the directory to reclaim space.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import os
import pickle
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

PROGRAM_CACHE_EVENT = "/ppo_async/program_cache/load_duration"
"""`jax.monitoring` duration event of a program read from this cache (`run.startup` counts them)."""

TRACED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "chex", "gymnax", "brax", "mujoco", "mujoco-mjx",
                   "playground", "numpy")
"""Distributions whose code a training program traces: their versions are part of every key."""

_TRACING_SETTINGS = ("jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl",
                     "jax_threefry_partitionable", "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion")
_SUFFIX = ".exported"


def program_cache_dir() -> str | None:
    """The cache's directory (`<jax_compilation_cache_dir>-programs`), None while JAX's
    persistent compilation cache is off."""
    import jax

    jax_dir = jax.config.values.get("jax_compilation_cache_dir")
    if not jax_dir:
        return None
    return os.path.abspath(os.fspath(jax_dir)).rstrip(os.sep) + "-programs"


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 of every `.py` file of the `ppo_async` package (paths and contents) and of the
    versions of `TRACED_PACKAGES` (absent ones as such). Computed once per process."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, package).encode())
                with open(path, "rb") as f:
                    digest.update(hashlib.sha256(f.read()).digest())
    for dist in TRACED_PACKAGES:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{dist}=={version};".encode())
    return digest.hexdigest()


TRACED_PACKAGES_OF_OURS = ("ppo_async.core", "ppo_async.envs", "ppo_async.modes")
"""The sub-packages whose functions a training program traces (`live_fingerprint`)."""


def _code_digest(code: Any) -> str:
    """sha256 of a code object's bytecode, names and constants (nested code objects by their own
    digest: their repr holds an address)."""
    digest = hashlib.sha256(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        digest.update((_code_digest(const) if hasattr(const, "co_code") else repr(const)).encode())
    return digest.hexdigest()


_CONSTANT_TYPES = (bool, int, float, complex, str, bytes, tuple, frozenset, type(None))


def _describe(value: Any) -> str | None:
    """What a module or class attribute is, for `live_fingerprint`: a function as its module,
    qualified name and bytecode; a class as its module and name; a constant (number, string,
    tuple, ...) as its repr; a callable object as its repr (or, where that holds an address,
    its identity in this process); anything else (modules, mutable containers) None."""
    code = getattr(value, "__code__", None)
    if code is not None:
        digest = _code_digest(code)[:16]
        return f"{getattr(value, '__module__', None)}.{getattr(value, '__qualname__', None)}:{digest}"
    if isinstance(value, type):
        return f"class {value.__module__}.{value.__qualname__}"
    wrapped = getattr(value, "__wrapped__", None)  # functools.lru_cache, functools.wraps
    if wrapped is not None and wrapped is not value:
        return f"{type(value).__qualname__}({_describe(wrapped)})"
    if callable(value) or isinstance(value, _CONSTANT_TYPES):
        text = repr(value)  # constants, typing aliases and the like print the same in every process
        return text if " at 0x" not in text else f"{type(value).__qualname__}@{id(value)}"  # per process
    return None


def live_fingerprint() -> str:
    """sha256 of what the loaded modules of `TRACED_PACKAGES_OF_OURS` (and the classes they
    define) bind their names to right now: a function or constant patched in at run time (a
    notebook's own loss, a test's spy) changes it, so a patched program is never read from the cache; an
    object with no stable identity (a partial, a callable instance) bound there makes every
    key of this process its own. Computed on every key (a few ms)."""
    digest = hashlib.sha256()
    for name in sorted(m for m in list(sys.modules) if m.startswith(TRACED_PACKAGES_OF_OURS)):
        module = sys.modules.get(name)
        for attr, value in sorted(vars(module).items() if module is not None else ()):
            described = _describe(value)
            if described is not None:
                digest.update(f"{name}.{attr}={described};".encode())
            if isinstance(value, type) and value.__module__ == name:
                for member, inner in sorted(vars(value).items()):
                    inner = getattr(inner, "__func__", inner)  # staticmethod / classmethod
                    described = _describe(inner) if callable(inner) else None
                    if described is not None:
                        digest.update(f"{name}.{attr}.{member}={described};".encode())
    return digest.hexdigest()


def program_key(caller_key: str, args: Sequence[Any]) -> str:
    """The cache key (hex sha256) of a program: `caller_key`, the shapes / dtypes / tree of
    `args` (arrays or `jax.ShapeDtypeStruct`s), `source_fingerprint()`, `live_fingerprint()`,
    the JAX settings that change tracing and the backend's devices."""
    import jax

    leaves, treedef = jax.tree.flatten(tuple(args))
    avals = [(tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x).__name__))) for x in leaves]
    devices = jax.devices()
    settings = {name: str(jax.config.values.get(name)) for name in _TRACING_SETTINGS}
    data = [caller_key, str(treedef), avals, source_fingerprint(), live_fingerprint(), settings, jax.default_backend(),
            [d.device_kind for d in devices], os.environ.get("XLA_FLAGS", "")]
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: str) -> Any | None:
    """The `Exported` in `path`, None when it is missing or cannot be read as one."""
    from jax import export

    try:
        with open(path, "rb") as f:
            exported = pickle.load(f)
    except Exception:  # missing, or a truncated, corrupt or foreign file: a miss, written again
        return None
    return exported if isinstance(exported, export.Exported) else None


def _write(directory: str, path: str, exported: Any) -> None:
    """Writes `exported` to `path` whole (a temporary file renamed); nothing where it cannot be
    pickled or written (the program then runs uncached next time too)."""
    tmp = None
    try:
        payload = pickle.dumps(dataclasses.replace(exported, _get_vjp=None))  # a closure: not data
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except Exception:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


def cached_jit(fn: Callable, caller_key: str, args: Sequence[Any], donate_argnums: tuple[int, ...] = ()
               ) -> tuple[Callable, bool]:
    """`(jitted, hit)`: a jitted function equal to `jax.jit(fn, donate_argnums=...)` at the
    shapes of `args` (arrays or `jax.ShapeDtypeStruct`s), and whether its traced program came
    from the cache. With the cache on, a hit calls the stored program; a miss exports `fn` at
    those shapes, stores it and calls it the same way (so a cold and a warm process run the
    same program); a program that cannot be exported, or the cache off, gives the plain
    `jax.jit(fn)`. Call the result (or `.lower(...).compile()` it) with arguments of those shapes."""
    import jax
    from jax import export, monitoring

    directory = program_cache_dir()
    if directory is None:
        return jax.jit(fn, donate_argnums=donate_argnums), False
    path = os.path.join(directory, program_key(caller_key, args) + _SUFFIX)
    start = time.perf_counter()
    exported = _read(path)
    hit = exported is not None
    if hit:
        monitoring.record_event_duration_secs(PROGRAM_CACHE_EVENT, time.perf_counter() - start)
    else:
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tuple(args))
        try:
            exported = export.export(jax.jit(fn, donate_argnums=donate_argnums))(*abstract)
        except Exception:  # not exportable (host callbacks, unstable custom calls): traced as before
            return jax.jit(fn, donate_argnums=donate_argnums), False
        _write(directory, path, exported)
    return jax.jit(exported.call, donate_argnums=donate_argnums), hit

