"""Thread-safe versioned store of policy snapshots (side effects: locks, clocks).

The learner `publish`es a `PolicySnapshot` after each iteration; samplers pull it with
`get_if_newer` (non-blocking) or `wait_for_newer` (blocking, with a timeout). Versions
must strictly increase.

With `history` = R > 1 the store also keeps the R - 1 snapshots before the latest (a ring: a
publish evicts the oldest), and a sampler of a scheduled-lag run takes one exact version with
`wait_for_version` + `get_version`. A snapshot carries the params and the normalisation
statistics under one version, so an old version is the whole old policy. Memory: R snapshots
(params and statistics), nothing else.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import jax

from ppo_async.core.types import PolicySnapshot


class ParamStore:
    """Holds the latest `PolicySnapshot` and the `history - 1` before it; every blocking call
    takes a timeout."""

    RATE_WINDOW = 16
    """Publishes `version_rate` measures over (the last RATE_WINDOW + 1 publish instants)."""

    def __init__(self, snapshot: PolicySnapshot | None = None, history: int = 1, clock: Any = time.monotonic):
        if int(history) < 1:
            raise ValueError(f"history = {history} is invalid: must be >= 1 (the latest snapshot)")
        self._cond = threading.Condition(threading.Lock())
        self._snapshot: PolicySnapshot | None = None
        self._version: int | None = None
        self.history = int(history)
        # version -> snapshot for the last `history` published versions (oldest first)
        self._ring: collections.OrderedDict[int, PolicySnapshot] = collections.OrderedDict()
        self._closed = False
        self.publish_count = 0
        self._clock = clock
        self._published_at: collections.deque[float] = collections.deque(maxlen=self.RATE_WINDOW + 1)
        # Copies of held snapshots placed on sampler devices, made once per (version,
        # device) under `_place_lock`: samplers on one device share a copy, and no two threads
        # reshard the same arrays at once (seen to fail inside jax.device_put with a snapshot
        # replicated over several learner devices: "safe_zip() argument 1 has length 4 but
        # argument 0 has length 3").
        self._place_lock = threading.Lock()
        self._placed: dict[tuple[Any, int], PolicySnapshot] = {}
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
            self._ring[version] = snapshot
            while len(self._ring) > self.history:  # the ring keeps the last `history` versions only
                self._ring.popitem(last=False)
            self.publish_count += 1
            self._published_at.append(self._clock())
            self._cond.notify_all()

    def version_rate(self) -> float:
        """Versions published per second lately: the last RATE_WINDOW publishes (fewer early in a
        run) over the time from the first of them to now, so a learner that stops publishing
        reads as slowing down; 0.0 before two publishes."""
        with self._cond:
            times, now = tuple(self._published_at), self._clock()
        if len(times) < 2 or now <= times[0]:
            return 0.0
        return (len(times) - 1) / (now - times[0])

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

    def held_versions(self) -> tuple[int, ...]:
        """The versions the ring holds now, oldest first."""
        with self._cond:
            return tuple(self._ring)

    def get_version(self, version: int, device: Any = None) -> PolicySnapshot:
        """The snapshot of exactly `version` (placed on `device` if given).

        Raises LookupError when it is not held: not published yet, or evicted from the ring
        (older than the last `history` versions).
        """
        with self._cond:
            snapshot, held = self._ring.get(int(version)), tuple(self._ring)
        if snapshot is None:
            raise LookupError(f"params version {int(version)} is not held: the store holds versions {list(held)} "
                              f"(history = {self.history})")
        return snapshot if device is None else self._placed_on(snapshot, int(version), device)

    def wait_for_version(self, version: int, timeout: float) -> bool:
        """Blocks until a snapshot of at least `version` is published: True then, False on
        timeout or close."""
        deadline = time.monotonic() + max(float(timeout), 0.0)
        with self._cond:
            while self._version is None or self._version < int(version):
                remaining = deadline - time.monotonic()
                if self._closed or remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def _placed_on(self, snapshot: PolicySnapshot, version: int, device: Any) -> PolicySnapshot:
        """`snapshot` (of `version`) on `device`, transferred once and shared (one copy per device
        and held version)."""
        with self._place_lock:
            cached = self._placed.get((device, version))
            if cached is None:
                cached = jax.device_put(snapshot, device)
                jax.block_until_ready(cached)
                self._placed[(device, version)] = cached
                with self._cond:
                    held = set(self._ring)
                for key in [k for k in self._placed if k[1] not in held and k[1] != version]:
                    del self._placed[key]  # copies of evicted versions go with them
            return cached

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
