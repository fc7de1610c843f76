"""Thread-safe versioned store of policy snapshots (side effects: locks, clocks).

The learner `publish`es a `PolicySnapshot` after each iteration; samplers pull it with
`get_if_newer` (non-blocking) or `wait_for_newer` (blocking, with a timeout). Versions
must strictly increase.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import jax

from ppo_async.core.types import PolicySnapshot


class ParamStore:
    """Holds the latest `PolicySnapshot`; every blocking call takes a timeout."""

    def __init__(self, snapshot: PolicySnapshot | None = None):
        self._cond = threading.Condition(threading.Lock())
        self._snapshot: PolicySnapshot | None = None
        self._version: int | None = None
        self._closed = False
        self.publish_count = 0
        # Copies of the latest snapshot placed on sampler devices, made once per (version,
        # device) under `_place_lock`: samplers on one device share a copy, and no two threads
        # reshard the same arrays at once (seen to fail inside jax.device_put with a snapshot
        # replicated over several learner devices: "safe_zip() argument 1 has length 4 but
        # argument 0 has length 3").
        self._place_lock = threading.Lock()
        self._placed: dict[Any, tuple[int, PolicySnapshot]] = {}
        if snapshot is not None:
            self.publish(snapshot)

    def publish(self, snapshot: PolicySnapshot) -> None:
        """Store `snapshot` as the latest. Raises ValueError unless its version increases."""
        version = int(snapshot.version)
        with self._cond:
            if self._version is not None and version <= self._version:
                raise ValueError(
                    f"snapshot.version = {version} is invalid: must be > latest version {self._version}"
                )
            self._snapshot, self._version = snapshot, version
            self.publish_count += 1
            self._cond.notify_all()

    def latest_version(self) -> int | None:
        """Version of the latest snapshot, None before the first publish."""
        with self._cond:
            return self._version

    def latest(self) -> PolicySnapshot | None:
        with self._cond:
            return self._snapshot

    def get_if_newer(self, version: int | None, device: Any = None) -> PolicySnapshot | None:
        """The latest snapshot (placed on `device` if given) when newer than `version`, else None.

        `version=None` means "I have none": any published snapshot is newer.
        """
        with self._cond:
            snapshot, latest = self._snapshot, self._version
        if snapshot is None or (version is not None and latest <= int(version)):
            return None
        return snapshot if device is None else self._placed_on(snapshot, latest, device)

    def _placed_on(self, snapshot: PolicySnapshot, version: int, device: Any) -> PolicySnapshot:
        """`snapshot` (of `version`) on `device`, transferred once and shared."""
        with self._place_lock:
            cached = self._placed.get(device)
            if cached is None or cached[0] != version:
                placed = jax.device_put(snapshot, device)
                jax.block_until_ready(placed)
                self._placed[device] = cached = (version, placed)
            return cached[1]

    def wait_for_newer(self, version: int | None, timeout: float, device: Any = None) -> PolicySnapshot | None:
        """Block until a snapshot newer than `version` is published; None on timeout or close."""
        deadline = time.monotonic() + max(float(timeout), 0.0)
        with self._cond:
            while not self._closed and (
                self._version is None or (version is not None and self._version <= int(version))
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if self._closed and (self._version is None or (version is not None and self._version <= int(version))):
                return None
        return self.get_if_newer(version, device)

    def close(self) -> None:
        """Wake every waiter (they return None)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
