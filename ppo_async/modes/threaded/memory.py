"""What a threaded run puts on its devices (ring buffer, parameter snapshots) and whether the
ring buffer fits where JAX reports the device's memory."""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from ppo_async.config import Config, ConfigError


def tree_bytes(tree: Any) -> int:
    """Bytes of a pytree of arrays (or of `jax.ShapeDtypeStruct`s)."""
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def device_memory_report(chunk_like: Any, snapshot_like: Any, capacity_chunks: int, device: Any) -> dict[str, Any]:
    """Sizes a threaded run puts on its devices: the ring buffer (`capacity_chunks` chunks shaped
    like `chunk_like`), one parameter snapshot per sampler, and the buffer device's memory
    where JAX reports it (`device.memory_stats()`: accelerators; None on CPU)."""
    chunk_bytes = tree_bytes(chunk_like)
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 - backends without memory statistics
        stats = {}
    limit = stats.get("bytes_limit")
    return {
        "chunk_bytes": chunk_bytes,
        "buffer_bytes": chunk_bytes * int(capacity_chunks),
        "snapshot_bytes_per_sampler": tree_bytes(snapshot_like),
        "buffer_device": str(device),
        "device_bytes_limit": limit,
        "device_bytes_free": None if limit is None else int(limit) - int(stats.get("bytes_in_use", 0)),
    }


def check_buffer_fits(config: Config, report: Mapping[str, Any]) -> None:
    """ConfigError naming `threaded.buffer_capacity` when the ring buffer cannot fit in the free
    memory of its device (checked only where JAX reports the device's memory)."""
    free = report["device_bytes_free"]
    if free is not None and report["buffer_bytes"] > free:
        raise ConfigError(
            f"threaded.buffer_capacity = {config.threaded.buffer_capacity or config.buffer_capacity_chunks * config.chunk_size} "
            f"transitions is invalid: the ring buffer needs {report['buffer_bytes']:,} bytes "
            f"({config.buffer_capacity_chunks} chunks of {report['chunk_bytes']:,} bytes) on {report['buffer_device']}, "
            f"which has {report['device_bytes_free']:,} bytes free of {report['device_bytes_limit']:,}; lower it"
        )
