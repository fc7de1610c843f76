"""Device-side circular buffer of trajectory chunks: a pure core and a thin thread-safe shell.

Pure core (jittable, optax style): `buffer_init`, `buffer_add`, `buffer_take` on a
`BufferState` whose `data` leaves carry a leading slot axis `[C, ...]` (e.g. a `Trajectory`
with transitions `[C, T, N, ...]`). Slots are consumed FIFO (oldest first). When the buffer
is full, `buffer_add` overwrites the oldest chunk and counts it in `overwritten`, so
`added == taken + overwritten + size` holds after every operation (nothing is dropped
silently).

Shell (side effects: threads, locks, clocks): `RingBuffer` is the single owner of the state
and updates it with jitted, state-donating functions under a `threading.Condition`. Every
blocking call takes a timeout; `close()` wakes every waiter.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
from jax import lax

from ppo_async.config import FULL_POLICIES  # the allowed values, written once as config's Literal


class ChunkTag(NamedTuple):
    """What a threaded sampler tags each chunk with (`RingBuffer.put(tag=...)`): who made it,
    when (seconds since the run's start, at delivery) and with which params version."""

    sampler_id: int
    made_at: float
    policy_version: int


class BufferState(NamedTuple):
    """Ring of `C` chunk slots plus int32 scalar counters."""

    data: Any  # pytree, leaves [C, ...]
    write_index: chex.Array  # [] int32: next slot written
    size: chex.Array  # [] int32: slots filled, 0 <= size <= C
    added: chex.Array  # [] int32: chunks ever added
    overwritten: chex.Array  # [] int32: chunks overwritten before being taken
    taken: chex.Array  # [] int32: chunks ever taken


def capacity_of(state: BufferState) -> int:
    """Number of slots `C` (static: the leading axis of the data leaves)."""
    return int(jax.tree_util.tree_leaves(state.data)[0].shape[0])


def buffer_init(example_chunk: Any, capacity_chunks: int) -> BufferState:
    """An empty buffer of `capacity_chunks` slots shaped like `example_chunk` (zeros)."""
    if int(capacity_chunks) < 1:
        raise ValueError(f"capacity_chunks = {capacity_chunks} is invalid: must be >= 1")
    if not jax.tree_util.tree_leaves(example_chunk):
        raise ValueError("example_chunk has no array leaves")
    data = jax.tree_util.tree_map(
        lambda x: jnp.zeros((int(capacity_chunks),) + jnp.shape(x), jnp.asarray(x).dtype), example_chunk
    )
    # distinct arrays per counter: a shared buffer could not be donated to the jitted add
    zeros = [jnp.zeros((), jnp.int32) for _ in range(5)]
    return BufferState(data, *zeros)


def buffer_add(state: BufferState, chunk: Any) -> BufferState:
    """Write `chunk` at `write_index`; when full, overwrite the oldest chunk and count it."""
    capacity = capacity_of(state)
    full = state.size >= capacity
    data = jax.tree_util.tree_map(
        lambda d, x: lax.dynamic_update_index_in_dim(d, jnp.asarray(x, d.dtype), state.write_index, 0),
        state.data,
        chunk,
    )
    return BufferState(
        data=data,
        write_index=(state.write_index + 1) % capacity,
        size=jnp.minimum(state.size + 1, capacity).astype(jnp.int32),
        added=state.added + 1,
        overwritten=state.overwritten + full.astype(jnp.int32),
        taken=state.taken,
    )


def buffer_take(state: BufferState) -> tuple[BufferState, Any]:
    """Pop the oldest chunk (FIFO). The caller must check `size > 0`.

    On an empty buffer the state is unchanged and the returned chunk is meaningless.
    """
    capacity = capacity_of(state)
    read_index = (state.write_index - state.size) % capacity
    chunk = jax.tree_util.tree_map(lambda d: lax.dynamic_index_in_dim(d, read_index, 0, keepdims=False), state.data)
    nonempty = (state.size > 0).astype(jnp.int32)
    return state._replace(size=state.size - nonempty, taken=state.taken + nonempty), chunk


class RingBuffer:
    """Thread-safe owner of a `BufferState` (side effects: locks, clocks).

    Args:
      example_chunk: pytree shaped like one chunk (e.g. a `Trajectory` `[T, N, ...]`).
      capacity_chunks: number of slots `C`.
      full_policy: "overwrite_oldest" (`put` never blocks; overwrites are counted) or
        "block" (`put` waits for space up to its timeout).
      device: where the storage lives (default: JAX's default device).
    """

    def __init__(
        self, example_chunk: Any, capacity_chunks: int, full_policy: str = "overwrite_oldest", device: Any = None
    ):
        if full_policy not in FULL_POLICIES:
            raise ValueError(f"full_policy = {full_policy!r} is invalid: choose one of {FULL_POLICIES}")
        self.capacity = int(capacity_chunks)
        self.full_policy = full_policy
        self._state = buffer_init(example_chunk, self.capacity)
        if device is not None:  # the storage lives on this device; producers put chunks there first
            self._state = jax.device_put(self._state, device)
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        # Host mirrors of the device counters, so waiting never syncs with the device.
        self._size = 0
        self._consumers_waiting = 0  # consumers blocked in get_tagged (under the lock)
        self._reserved = 0  # places reserved by producers making a chunk (`reserve`)
        self._tags: collections.deque = collections.deque()  # host-side tag per resident chunk, FIFO
        self._added = self._overwritten = self._taken = 0
        self.trace_counts = {"add": 0, "take": 0}

        def _add(state, chunk):
            self.trace_counts["add"] += 1  # runs at trace time only
            return buffer_add(state, chunk)

        def _take(state):
            self.trace_counts["take"] += 1
            return buffer_take(state)

        self._add = jax.jit(_add, donate_argnums=0)
        self._take = jax.jit(_take, donate_argnums=0)

    def warm_up(self, example_chunk: Any) -> None:
        """Compile `put`'s and `get`'s device functions on a scratch buffer (this one is untouched).

        Call it before timing starts, so the first put / get of a run does not pay a compile.
        """
        scratch = jax.device_put(buffer_init(example_chunk, self.capacity), self._state.added.sharding)
        scratch = self._add(scratch, example_chunk)
        jax.block_until_ready(self._take(scratch))

    # -- producer / consumer ------------------------------------------------------------
    def put(self, chunk: Any, timeout: float | None = 1.0, tag: Any = None,
            admit: Callable[[int, bool], bool] | None = None, timings: dict[str, float] | None = None,
            reserved: bool = False) -> bool:
        """Add a chunk. False if the buffer is closed, ("block") no space came in `timeout` s, or
        `admit()` said no.

        `tag` (any host object, e.g. the producer's id) travels with the chunk and comes back
        from `get_tagged`; an overwritten chunk's tag goes with it. `admit(resident,
        consumer_waiting)` is asked under the buffer's lock at the moment the chunk would go in
        (after any wait for space), with the chunks already resident and whether a consumer is
        blocked in `get` right now: a producer uses it to withhold a chunk that would be too
        stale by the time it is consumed. `reserved`: the chunk holds a reservation (`reserve`),
        which ends when it is written (a producer whose chunk is refused calls `release()`).

        `timings`, when given, gets this call's seconds added under three keys: `lock_s`
        (waiting to acquire the buffer's lock while other threads hold it), `space_s` (waiting
        for a free slot: "block" only, so always 0.0 for "overwrite_oldest") and `write_s`
        (writing the chunk into the device ring, under the lock).
        """
        deadline = None if timeout is None else time.monotonic() + max(float(timeout), 0.0)
        t_call = time.perf_counter()
        with self._cond:
            t_locked = time.perf_counter()
            has_space = self._wait_for_space(deadline)
            t_space = time.perf_counter() if self.full_policy == "block" else t_locked  # overwrite never waits
            admitted = has_space and not self._closed and (admit is None or admit(self._size, self._consumers_waiting > 0))
            if admitted:
                if reserved:
                    self._reserved = max(0, self._reserved - 1)
                self._write(chunk, tag)
            if timings is not None:
                t_end = time.perf_counter()
                for name, seconds in (("lock_s", t_locked - t_call), ("space_s", t_space - t_locked), ("write_s", t_end - t_space)):
                    timings[name] = timings.get(name, 0.0) + seconds
            return admitted

    def reserve(self, depth: int, timeout: float | None = 1.0) -> bool:
        """Wait until fewer than `depth` chunks are committed - resident, or reserved by producers
        still making theirs - then reserve a place for one more: True then; False on timeout or
        when the buffer is closed. The reservation ends at the producer's `put(...,
        reserved=True)` that writes its chunk, or at its `release()`. (A producer with a
        freshness bound reserves before making a chunk, so that the chunks in the making count
        as well as those resident: see `threaded.sampler`.)"""
        deadline = None if timeout is None else time.monotonic() + max(float(timeout), 0.0)
        with self._cond:
            while not self._closed and self._size + self._reserved >= depth:
                if not self._wait(deadline):
                    return False
            if self._closed:
                return False
            self._reserved += 1
            return True

    def release(self) -> None:
        """Ends one reservation whose chunk will not be put (`reserve`); wakes the waiters."""
        with self._cond:
            self._reserved = max(0, self._reserved - 1)
            self._cond.notify_all()

    def _wait_for_space(self, deadline: float | None) -> bool:
        """("block") Wait, holding the lock, until a slot is free; False on timeout. Always True for "overwrite_oldest"."""
        if self.full_policy == "block":
            while not self._closed and self._size >= self.capacity:
                if not self._wait(deadline):
                    return False
        return True

    def _write(self, chunk: Any, tag: Any) -> None:
        """Adds `chunk` with its tag (the caller holds the lock); overwrites the oldest when full."""
        self._state = self._add(self._state, chunk)
        self._added += 1
        self._tags.append(tag)
        if self._size >= self.capacity:
            self._overwritten += 1
            self._tags.popleft()
        else:
            self._size += 1
        self._cond.notify_all()

    def get(self, timeout: float | None = 1.0) -> Any | None:
        """Pop the oldest chunk; None if none arrived within `timeout` s or the buffer is closed and empty."""
        item = self.get_tagged(timeout)
        return None if item is None else item[0]

    def get_tagged(self, timeout: float | None = 1.0) -> tuple[Any, Any] | None:
        """Pop the oldest `(chunk, tag)`; None as for `get`."""
        deadline = None if timeout is None else time.monotonic() + max(float(timeout), 0.0)
        with self._cond:
            self._consumers_waiting += 1
            try:
                while self._size == 0:
                    if self._closed or not self._wait(deadline):
                        return None
            finally:
                self._consumers_waiting -= 1
            self._state, chunk = self._take(self._state)
            self._size -= 1
            self._taken += 1
            tag = self._tags.popleft()
            self._cond.notify_all()
            return chunk, tag

    def close(self) -> None:
        """Refuse further puts and wake every waiter (they return False / None promptly)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _wait(self, deadline: float | None) -> bool:
        """Wait on the condition; False once `deadline` passed. `None` waits in 1 s slices until woken."""
        if deadline is None:
            self._cond.wait(1.0)
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self._cond.wait(remaining)
        return True

    # -- introspection ------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def size(self) -> int:
        return self._size

    @property
    def reserved(self) -> int:
        """Places reserved by producers still making their chunk (`reserve`)."""
        return self._reserved

    @property
    def fill(self) -> float:
        """Fraction of slots filled, in [0, 1]."""
        return self._size / self.capacity

    def counters(self) -> dict[str, int]:
        """Host counters; `added == taken + overwritten + size` always holds."""
        with self._cond:
            return {
                "added": self._added,
                "taken": self._taken,
                "overwritten": self._overwritten,
                "size": self._size,
            }

    def device_counters(self) -> dict[str, int]:
        """The same counters read from the device state (synchronises with the device)."""
        with self._cond:
            s = self._state
            return {k: int(getattr(s, k)) for k in ("added", "taken", "overwritten", "size")}
