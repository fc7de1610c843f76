"""Library noise silenced at the entry point: what orbax / tensorstore print around a failed
checkpoint read, and third-party notices (Brax's maintenance warning, deprecations)."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Any

try:
    from absl import logging as absl_logging
except ImportError:  # pragma: no cover - absl comes with orbax
    absl_logging = None


def _is_orbax_coroutine(obj: Any) -> bool:
    """A coroutine of orbax's own code (its array reads, left pending by a failed restore)."""
    code = getattr(obj, "cr_code", None)
    filename = getattr(code, "co_filename", "") or ""
    return f"{os.sep}orbax{os.sep}" in filename


def quiet_library_noise() -> None:
    """Silences what orbax / tensorstore print around a failed checkpoint read (entry point only).

    Reading a corrupted checkpoint makes orbax log ERROR lines through absl ("Failed to json
    parse Metadata file ..."), asyncio log "Task exception was never retrieved" with a
    TensorStore spec per array, and tensorstore's reader threads report dozens of unraisable
    `RuntimeError: Event loop is closed` (callbacks into the asyncio loop orbax has already
    closed). Python also reports every array-read coroutine the failure left pending ("Exception
    ignored in: <coroutine object _read_array_index_and_device_put>", each with a TensorStore
    spec: ~40-90 KB in all). The CheckpointError we raise says what is wrong in one line, so
    here: the "absl", "orbax" and "asyncio" loggers only pass CRITICAL records, and
    `sys.unraisablehook` drops exactly those RuntimeErrors and the unraisable exceptions of
    orbax's coroutines (any other unraisable exception is reported as before).
    Idempotent.
    """
    # ... and at exit "RuntimeWarning: coroutine 'Store._get_array_metadatas' was never
    # awaited" for orbax coroutines it never started (ppo_async itself has no coroutines).
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    # Third-party notices that say nothing about this run (the same filters as pytest's in
    # pyproject.toml): Brax's maintenance notice, gymnax's / Brax's / JAXopt's deprecations.
    warnings.filterwarnings("ignore", message="Brax System, piplines and environments are not actively being maintained",
                            category=UserWarning)
    warnings.filterwarnings("ignore", message="JAXopt is no longer maintained", category=DeprecationWarning)
    for module in ("gymnax", "brax"):
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    for name in ("absl", "orbax", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    if absl_logging is not None:
        absl_logging.set_verbosity(absl_logging.FATAL)
    previous = sys.unraisablehook
    if getattr(previous, "_ppo_async_quiet", False):
        return

    def hook(unraisable: "Any") -> None:
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        if _is_orbax_coroutine(unraisable.object):
            return
        previous(unraisable)

    hook._ppo_async_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
