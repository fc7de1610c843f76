"""Ring buffer (pure core + thread-safe shell) and parameter store."""

from __future__ import annotations

import threading
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppo_async.runtime.buffer import RingBuffer, buffer_add, buffer_init, buffer_take
from ppo_async.runtime.param_store import ParamStore
from ppo_async.core.types import PolicySnapshot, RunningMeanStd


def make_chunk(i: int, seed: int = 0):
    """A small trajectory-like chunk `[T=3, N=2, ...]` with distinct random contents, tagged `i`."""
    rng = np.random.default_rng(seed * 1000 + i)
    return {
        "obs": rng.standard_normal((3, 2, 4)).astype(np.float32),
        "action": rng.integers(0, 5, (3, 2)).astype(np.int32),
        "done": rng.random((3, 2)) < 0.5,
        "id": np.asarray(i, np.int32),
    }


def assert_bitwise(actual, expected):
    jax.tree_util.tree_map(lambda a, e: np.testing.assert_array_equal(np.asarray(a), np.asarray(e)), actual, expected)
    jax.tree_util.tree_map(lambda a, e: chex.assert_equal(np.asarray(a).dtype, np.asarray(e).dtype), actual, expected)


def invariant(state) -> bool:
    return int(state.added) == int(state.taken) + int(state.overwritten) + int(state.size)


# ----------------------------------------------------------------------------- pure core
def test_init_shapes_and_zeros():
    state = buffer_init(make_chunk(0), 4)
    chex.assert_shape(state.data["obs"], (4, 3, 2, 4))
    assert state.data["action"].dtype == jnp.int32 and state.data["done"].dtype == jnp.bool_
    assert not np.any(np.asarray(state.data["obs"]))
    assert int(state.size) == int(state.write_index) == int(state.added) == 0
    with pytest.raises(ValueError, match="capacity_chunks"):
        buffer_init(make_chunk(0), 0)


def test_fifo_bitwise_and_wraparound():
    add, take = jax.jit(buffer_add), jax.jit(buffer_take)
    state = buffer_init(make_chunk(0), 3)
    chunks = [make_chunk(i) for i in range(8)]
    expected = []
    # interleave adds and takes so the write index wraps several times without overflow
    for i, chunk in enumerate(chunks):
        state = add(state, chunk)
        expected.append(chunk)
        if int(state.size) == 3:  # full: drain two so nothing is ever overwritten
            for _ in range(2):
                state, out = take(state)
                assert_bitwise(out, expected.pop(0))
        assert invariant(state)
    assert int(state.write_index) == 8 % 3
    while int(state.size) > 0:
        state, out = take(state)
        assert_bitwise(out, expected.pop(0))
    assert not expected and int(state.overwritten) == 0 and int(state.taken) == 8
    assert invariant(state)


def test_overwrite_oldest_counts():
    state = buffer_init(make_chunk(0), 3)
    for i in range(5):
        state = buffer_add(state, make_chunk(i))
    assert int(state.size) == 3 and int(state.overwritten) == 2 and int(state.added) == 5
    for i in (2, 3, 4):
        state, out = buffer_take(state)
        assert_bitwise(out, make_chunk(i))
        assert invariant(state)
    assert int(state.size) == 0
    # take on empty is a counted no-op
    state2, _ = buffer_take(state)
    assert int(state2.size) == 0 and int(state2.taken) == 3 and invariant(state2)


def test_jitted_add_does_not_retrace():
    add = jax.jit(chex.assert_max_traces(buffer_add, n=1))
    state = buffer_init(make_chunk(0), 2)
    for i in range(5):
        state = add(state, make_chunk(i))
    assert int(state.added) == 5

    buf = RingBuffer(make_chunk(0), 2)
    for i in range(6):
        buf.put(make_chunk(i))
        if i % 2:
            buf.get()
    assert buf.trace_counts == {"add": 1, "take": 1}


# ----------------------------------------------------------------------------- shell
def test_shell_overwrite_and_counters():
    buf = RingBuffer(make_chunk(0), 3, full_policy="overwrite_oldest")
    assert buf.fill == 0.0
    for i in range(5):
        assert buf.put(make_chunk(i), timeout=0.1)
    assert buf.fill == 1.0
    assert buf.counters() == {"added": 5, "taken": 0, "overwritten": 2, "size": 3}
    assert [int(buf.get(timeout=0.1)["id"]) for _ in range(3)] == [2, 3, 4]
    assert buf.counters() == buf.device_counters() == {"added": 5, "taken": 3, "overwritten": 2, "size": 0}


def test_shell_donation_makes_shell_sole_owner():
    buf = RingBuffer(make_chunk(0), 2)
    old = buf._state
    buf.put(make_chunk(1))
    if old.data["obs"].is_deleted():  # donation honoured on this backend
        with pytest.raises(RuntimeError):
            np.asarray(old.data["obs"])


def test_block_policy_times_out():
    buf = RingBuffer(make_chunk(0), 2, full_policy="block")
    assert buf.put(make_chunk(0), timeout=0.1) and buf.put(make_chunk(1), timeout=0.1)
    t0 = time.monotonic()
    assert buf.put(make_chunk(2), timeout=0.2) is False
    assert 0.15 <= time.monotonic() - t0 < 2.0
    assert buf.counters() == {"added": 2, "taken": 0, "overwritten": 0, "size": 2}
    # space frees up: a blocked producer proceeds
    result = {}
    t = threading.Thread(target=lambda: result.setdefault("ok", buf.put(make_chunk(2), timeout=5.0)), name="producer")
    t.start()
    time.sleep(0.05)
    assert int(buf.get(timeout=0.1)["id"]) == 0
    t.join(timeout=5.0)
    assert not t.is_alive() and result["ok"] is True
    assert [int(buf.get(timeout=0.1)["id"]) for _ in range(2)] == [1, 2]


def test_put_timings_split_lock_space_and_write():
    """overwrite_oldest never waits for space (space_s is exactly 0); block's wait for space
    is counted as space, and a thread holding the lock shows up as lock time."""
    over = RingBuffer(make_chunk(0), 2, full_policy="overwrite_oldest")
    timings: dict[str, float] = {}
    for i in range(5):  # the last three overwrite
        assert over.put(make_chunk(i), timings=timings)
    assert timings["space_s"] == 0.0 and timings["write_s"] > 0.0 and timings["lock_s"] >= 0.0
    # another thread holds the lock for 0.2 s: the put waits for the lock, not for space
    held, release = threading.Event(), threading.Event()

    def hold():
        with over._cond:
            held.set()
            release.wait(5.0)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    held.wait(5.0)
    threading.Timer(0.2, release.set).start()
    locked: dict[str, float] = {}
    assert over.put(make_chunk(5), timings=locked)
    holder.join(5.0)
    assert locked["lock_s"] >= 0.15 and locked["space_s"] == 0.0

    block = RingBuffer(make_chunk(0), 1, full_policy="block")
    assert block.put(make_chunk(0))
    threading.Timer(0.2, lambda: block.get(timeout=1.0)).start()
    waited: dict[str, float] = {}
    assert block.put(make_chunk(1), timeout=5.0, timings=waited)
    assert waited["space_s"] >= 0.15 and waited["lock_s"] < waited["space_s"]  # the wait was for space
    refused: dict[str, float] = {}
    assert block.put(make_chunk(2), timeout=0.1, timings=refused) is False  # full: timed out waiting for space
    assert refused["space_s"] >= 0.08 and refused["write_s"] < refused["space_s"]  # nothing to write: it waited


def test_reservations_count_with_resident_chunks_until_put_or_release():
    """`reserve(depth)` holds a place while fewer than `depth` chunks are resident or reserved;
    a reserved put ends its reservation, `release` ends one whose chunk is not put, and a close
    refuses new ones."""
    buf = RingBuffer(make_chunk(0), capacity_chunks=8, full_policy="block")
    assert buf.reserve(2, timeout=0.0) and buf.reserve(2, timeout=0.0) and buf.reserved == 2
    assert not buf.reserve(2, timeout=0.05)  # two committed: no third place at depth 2
    assert buf.put(make_chunk(1), timeout=0.0, reserved=True) and (buf.size, buf.reserved) == (1, 1)
    assert not buf.reserve(2, timeout=0.0)  # one resident + one reserved
    buf.release()
    assert buf.reserved == 0 and buf.reserve(2, timeout=0.0)  # one resident, this one reserved
    assert buf.put(make_chunk(2), timeout=0.0) and (buf.size, buf.reserved) == (2, 1)  # unreserved: keeps it
    assert int(buf.get(timeout=0.0)["id"]) == 1 and buf.reserve(3, timeout=0.0) and buf.reserved == 2

    waiter: list[bool] = []
    thread = threading.Thread(target=lambda: waiter.append(buf.reserve(3, timeout=10.0)))
    thread.start()  # 1 resident + 2 reserved = 3: it waits until a place is given back
    buf.release()
    thread.join(timeout=10.0)
    assert waiter == [True] and buf.reserved == 2
    buf.close()
    assert not buf.reserve(100, timeout=0.0)


def test_get_on_empty_times_out():
    buf = RingBuffer(make_chunk(0), 2)
    t0 = time.monotonic()
    assert buf.get(timeout=0.2) is None
    assert 0.15 <= time.monotonic() - t0 < 2.0


def test_close_wakes_blocked_getter_and_putter():
    buf = RingBuffer(make_chunk(0), 1, full_policy="block")
    got = {}
    getter = threading.Thread(target=lambda: got.setdefault("get", buf.get(timeout=30.0)), name="getter")
    getter.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    buf.close()
    getter.join(timeout=1.0)
    assert not getter.is_alive() and time.monotonic() - t0 < 1.0
    assert got["get"] is None
    assert buf.put(make_chunk(0), timeout=0.1) is False

    buf2 = RingBuffer(make_chunk(0), 1, full_policy="block")
    assert buf2.put(make_chunk(0), timeout=0.1)
    putter = threading.Thread(target=lambda: got.setdefault("put", buf2.put(make_chunk(1), timeout=30.0)), name="putter")
    putter.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    buf2.close()
    putter.join(timeout=1.0)
    assert not putter.is_alive() and time.monotonic() - t0 < 1.0
    assert got["put"] is False


@pytest.mark.parametrize("full_policy", ["block", "overwrite_oldest"])
def test_concurrent_producers_consumer_no_loss_no_duplicates(full_policy):
    buf = RingBuffer(make_chunk(0), 4, full_policy=full_policy)
    num_producers, per_producer = 3, 40
    accepted: list[int] = []
    consumed: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    done = threading.Event()

    def producer(p):
        try:
            for k in range(per_producer):
                i = p * per_producer + k
                if buf.put(make_chunk(i), timeout=5.0):
                    with lock:
                        accepted.append(i)
        except BaseException as e:  # noqa: BLE001 - surfaced below
            errors.append(e)

    def consumer():
        try:
            while not (done.is_set() and buf.size == 0):
                chunk = buf.get(timeout=0.05)
                if chunk is not None:
                    i = int(chunk["id"])
                    assert_bitwise(chunk, make_chunk(i))
                    consumed.append(i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    producers = [threading.Thread(target=producer, args=(p,), name=f"producer-{p}") for p in range(num_producers)]
    cons = threading.Thread(target=consumer, name="consumer")
    cons.start()
    for t in producers:
        t.start()
    for t in producers:
        t.join(timeout=15.0)
        assert not t.is_alive()
    done.set()
    cons.join(timeout=15.0)
    assert not cons.is_alive()
    assert not errors, errors

    c = buf.counters()
    assert c == buf.device_counters()
    assert c["added"] == len(accepted) == num_producers * per_producer
    assert c["added"] == c["taken"] + c["overwritten"] + c["size"]
    assert c["size"] == 0 and c["taken"] == len(consumed)
    assert len(set(consumed)) == len(consumed)  # no duplicates
    assert set(consumed) <= set(accepted)
    if full_policy == "block":
        assert c["overwritten"] == 0 and sorted(consumed) == sorted(accepted)  # no loss
    # per producer, chunks come out in the order they went in (FIFO)
    for p in range(num_producers):
        mine = [i for i in consumed if i // per_producer == p]
        assert mine == sorted(mine)


# ----------------------------------------------------------------------------- param store
def snap(version: int) -> PolicySnapshot:
    stats = RunningMeanStd(jnp.zeros(3), jnp.ones(3), jnp.asarray(1.0))
    return PolicySnapshot({"w": jnp.full((2, 2), float(version))}, stats, jnp.asarray(version, jnp.int32),
                          RunningMeanStd(jnp.zeros(()), jnp.ones(()), jnp.asarray(1.0)))


def test_param_store_version_monotonic():
    store = ParamStore()
    assert store.latest_version() is None
    store.publish(snap(0))
    store.publish(snap(2))
    assert store.latest_version() == 2
    for bad in (2, 1):
        with pytest.raises(ValueError, match="version"):
            store.publish(snap(bad))
    assert store.latest_version() == 2


def test_param_store_version_rate_over_its_last_publishes_until_now():
    """Versions per second over the last RATE_WINDOW publishes, measured to now (a clock set by
    hand): 0 before two publishes; a learner that stops publishing reads as slowing down."""
    now = [0.0]
    store = ParamStore(clock=lambda: now[0])
    assert store.version_rate() == 0.0
    store.publish(snap(0))
    assert store.version_rate() == 0.0
    for v in range(1, 5):  # every 0.5 s
        now[0] += 0.5
        store.publish(snap(v))
    assert store.version_rate() == pytest.approx(4 / 2.0)
    now[0] += 2.0  # no publish for 2 s
    assert store.version_rate() == pytest.approx(4 / 4.0)
    for v in range(5, 5 + 2 * ParamStore.RATE_WINDOW):  # 10 a second since
        now[0] += 0.1
        store.publish(snap(v))
    assert store.version_rate() == pytest.approx(ParamStore.RATE_WINDOW / (0.1 * ParamStore.RATE_WINDOW))


def test_param_store_get_if_newer():
    store = ParamStore()
    assert store.get_if_newer(None) is None
    store.publish(snap(3))
    assert int(store.get_if_newer(None).version) == 3
    assert int(store.get_if_newer(2).version) == 3
    assert store.get_if_newer(3) is None and store.get_if_newer(4) is None
    device = jax.devices()[0]
    placed = store.get_if_newer(1, device=device)
    assert int(placed.version) == 3
    for leaf in jax.tree_util.tree_leaves(placed):
        assert leaf.devices() == {device}
    np.testing.assert_array_equal(placed.params["w"], np.full((2, 2), 3.0))


def test_param_store_wait_for_newer():
    store = ParamStore(snap(1))
    t0 = time.monotonic()
    assert store.wait_for_newer(1, timeout=0.2) is None
    assert 0.15 <= time.monotonic() - t0 < 2.0
    assert int(store.wait_for_newer(0, timeout=0.1).version) == 1

    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("s", store.wait_for_newer(1, timeout=5.0)), name="waiter")
    waiter.start()
    time.sleep(0.05)
    store.publish(snap(2))
    waiter.join(timeout=2.0)
    assert not waiter.is_alive() and int(got["s"].version) == 2

    waiter = threading.Thread(target=lambda: got.setdefault("c", store.wait_for_newer(2, timeout=30.0)), name="waiter2")
    waiter.start()
    time.sleep(0.05)
    store.close()
    waiter.join(timeout=1.0)
    assert not waiter.is_alive() and got["c"] is None


def test_warm_up_compiles_put_and_get_without_touching_the_buffer():
    chunk = {"x": jnp.arange(6.0).reshape(2, 3)}
    ring = RingBuffer(chunk, 3, "block")
    ring.warm_up(chunk)
    assert ring.trace_counts == {"add": 1, "take": 1}
    assert ring.counters() == {"added": 0, "taken": 0, "overwritten": 0, "size": 0}
    assert ring.device_counters() == {"added": 0, "taken": 0, "overwritten": 0, "size": 0}
    assert ring.put(chunk, timeout=0.0)
    np.testing.assert_array_equal(ring.get(timeout=0.0)["x"], chunk["x"])
    assert ring.trace_counts == {"add": 1, "take": 1}  # the warm-up's compiles were reused
