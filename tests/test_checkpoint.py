"""Checkpointer: bitwise round trips, retention, interrupted saves, clear mismatch errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppo_async.run.checkpoint import CheckpointError, Checkpointer


class Counters(NamedTuple):
    version: jax.Array  # int32 []
    sgd_steps: jax.Array  # int32 []


class Inner(NamedTuple):
    params: dict
    opt_state: Any


class State(NamedTuple):
    inner: Inner
    key: jax.Array  # [S, 2] uint32 (legacy PRNGKey, one per seed)
    counters: Counters
    obs_mean: jax.Array  # [S, 3] float32


def make_state(seed: int, num_seeds: int = 2) -> State:
    rng = np.random.default_rng(seed)
    params = {
        "dense": {"kernel": jnp.asarray(rng.standard_normal((num_seeds, 4, 5), dtype=np.float32)), "bias": jnp.asarray(rng.standard_normal((num_seeds, 5), dtype=np.float32))},
        "log_std": jnp.asarray(rng.standard_normal((num_seeds, 2), dtype=np.float32)),
    }
    opt_state = optax.scale_by_adam().init(params)
    # Make the adam moments and count non-trivial.
    opt_state = opt_state._replace(
        count=jnp.int32(seed + 7),
        mu=jax.tree.map(lambda x: x * 0.5 + 1e-7, params),
        nu=jax.tree.map(lambda x: x * x, params),
    )
    keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(num_seeds) + seed)
    obs_mean = rng.standard_normal((num_seeds, 3), dtype=np.float32)
    obs_mean[0, 0] = -0.0  # signed zero and a denormal must survive bitwise
    obs_mean[0, 1] = np.float32(1e-45)
    return State(
        inner=Inner(params=params, opt_state=opt_state),
        key=keys,
        counters=Counters(version=jnp.int32(seed * 3 + 1), sgd_steps=jnp.int32(2**31 - 1 - seed)),
        obs_mean=jnp.asarray(obs_mean),
    )


def zeros_like_state(num_seeds: int = 2) -> State:
    return jax.tree.map(jnp.zeros_like, make_state(0, num_seeds))


def assert_bitwise_equal(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
        where = jax.tree_util.keystr(path)
        assert isinstance(y, jax.Array), where
        assert x.dtype == y.dtype and x.shape == y.shape, where
        xa, ya = np.asarray(x), np.asarray(y)
        assert xa.tobytes() == ya.tobytes(), where


def test_round_trip_is_bitwise_with_exact_types(tmp_path):
    state = make_state(3)
    meta = {"config": {"env": "Pendulum-v1", "lr": 3e-4, "sizes": [64, 64]}, "env_steps": 12345, "note": None}
    with Checkpointer(str(tmp_path / "ck")) as ck:
        assert ck.latest_step() is None and ck.all_steps() == []
        ck.save(10, state, meta)
        assert ck.latest_step() == 10 and ck.all_steps() == [10]
        restored, restored_meta = ck.restore(zeros_like_state())
    assert restored_meta == meta
    assert_bitwise_equal(state, restored)
    assert type(restored) is State and type(restored.inner) is Inner and type(restored.counters) is Counters
    assert type(restored.inner.opt_state) is optax.ScaleByAdamState
    assert restored.counters.version.dtype == jnp.int32 and restored.key.dtype == jnp.uint32
    # The restored key draws the same numbers.
    np.testing.assert_array_equal(jax.random.uniform(restored.key[1], (4,)), jax.random.uniform(state.key[1], (4,)))


def test_optax_chain_with_empty_states_none_and_typed_keys(tmp_path):
    params = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
    opt_state = opt.init(params)
    _, opt_state = opt.update(jax.tree.map(jnp.ones_like, params), opt_state, params)  # non-zero moments
    state = (params, opt_state, None, jax.random.key(42), jax.random.split(jax.random.key(1), 3))
    like = jax.tree.map(jnp.zeros_like, (params, opt_state, None)) + (jax.random.key(0), jax.random.split(jax.random.key(0), 3))
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(0, state, {})
        restored, meta = ck.restore(like)
    assert meta == {}
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    assert_bitwise_equal(state[:3], restored[:3])
    for orig, back in zip(state[3:], restored[3:]):
        assert jax.dtypes.issubdtype(back.dtype, jax.dtypes.prng_key) and back.shape == orig.shape
        np.testing.assert_array_equal(jax.random.key_data(back), jax.random.key_data(orig))


def test_restore_into_shape_dtype_structs(tmp_path):
    state = make_state(1)
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(1, state, {"a": 1})
        restored, _ = ck.restore(jax.eval_shape(lambda: state))
    assert_bitwise_equal(state, restored)


def test_keeps_only_last_max_to_keep_and_restores_any_kept_step(tmp_path):
    with Checkpointer(str(tmp_path), max_to_keep=2) as ck:
        for step in range(5):
            ck.save(step * 10, make_state(step), {"step": step * 10})
        assert ck.all_steps() == [30, 40]
        assert ck.latest_step() == 40
        s30, m30 = ck.restore(zeros_like_state(), step=30)
        s_latest, m_latest = ck.restore(zeros_like_state())
        with pytest.raises(CheckpointError, match=r"step 10 .*available steps: \[30, 40\]"):
            ck.restore(zeros_like_state(), step=10)
    assert m30 == {"step": 30} and m_latest == {"step": 40}
    assert_bitwise_equal(make_state(3), s30)
    assert_bitwise_equal(make_state(4), s_latest)
    assert sorted(os.listdir(tmp_path)) == ["30", "40"]


def test_wrong_structure_shape_or_dtype_is_a_clear_error(tmp_path):
    state = make_state(0)
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(5, state, {})
        # Shape: a different number of seeds on one leaf.
        bad = state._replace(obs_mean=jnp.zeros((3, 3), jnp.float32))
        with pytest.raises(CheckpointError, match=r"\.obs_mean has shape \(2, 3\) in the checkpoint but \(3, 3\) in state_like") as info:
            ck.restore(bad)
        assert isinstance(info.value, ValueError) and "step 5" in str(info.value)
        # Dtype.
        bad = state._replace(counters=Counters(version=jnp.float32(0), sgd_steps=jnp.int32(0)))
        with pytest.raises(CheckpointError, match=r"\.counters\.version has dtype int32 in the checkpoint but float32"):
            ck.restore(bad)
        # Structure: a missing and an extra leaf.
        params = dict(state.inner.params)
        params["extra"] = jnp.zeros(2)
        del params["log_std"]
        bad = state._replace(inner=state.inner._replace(params=params))
        with pytest.raises(CheckpointError) as info:
            ck.restore(bad)
        msg = str(info.value)
        assert "['extra'] is in state_like but not in the checkpoint" in msg
        assert "['log_std'] is in the checkpoint but not in state_like" in msg
        # Completely different tree.
        with pytest.raises(CheckpointError, match="does not match state_like"):
            ck.restore({"w": jnp.zeros(3)})
        # A correct restore still works after the failures.
        restored, _ = ck.restore(zeros_like_state())
    assert_bitwise_equal(state, restored)


def test_save_errors_are_clear(tmp_path):
    with Checkpointer(str(tmp_path)) as ck:
        with pytest.raises(CheckpointError, match="no complete checkpoint"):
            ck.restore(zeros_like_state())
        ck.save(5, make_state(0), {})
        with pytest.raises(CheckpointError, match="already exists"):
            ck.save(5, make_state(1), {})
        with pytest.raises(CheckpointError, match="older than the latest checkpoint 5"):
            ck.save(3, make_state(1), {})
        with pytest.raises(CheckpointError, match="not JSON-serialisable"):
            ck.save(6, make_state(1), {"x": object()})
        with pytest.raises(CheckpointError, match="not JSON-serialisable"):
            ck.save(6, make_state(1), {"x": float("nan")})
        assert ck.all_steps() == [5]
    with pytest.raises(CheckpointError, match="closed"):
        ck.latest_step()
    with pytest.raises(CheckpointError, match="max_to_keep"):
        Checkpointer(str(tmp_path), max_to_keep=0)


def test_incomplete_directories_are_never_returned(tmp_path):
    with Checkpointer(str(tmp_path)) as ck:
        ck.save(2, make_state(2), {"step": 2})
    # What a save killed mid-write leaves (orbax's temp dir), and a step-named directory
    # without orbax's commit marker (e.g. a half-finished copy).
    tmp_dir = tmp_path / "7.orbax-checkpoint-tmp"
    (tmp_dir / "state").mkdir(parents=True)
    (tmp_dir / "state" / "garbage").write_bytes(b"\x00" * 10)
    (tmp_path / "9" / "state").mkdir(parents=True)
    with Checkpointer(str(tmp_path)) as ck:
        assert ck.all_steps() == [2]
        assert ck.latest_step() == 2
        restored, meta = ck.restore(zeros_like_state())
        assert meta == {"step": 2}
        with pytest.raises(CheckpointError, match="available steps: \\[2\\]"):
            ck.restore(zeros_like_state(), step=9)
        # Saving the step of the leftover temp dir works (the stale temp dir is replaced).
        ck.save(7, make_state(7), {"step": 7})
        assert ck.all_steps() == [2, 7]
        with pytest.raises(CheckpointError, match="not a complete checkpoint"):
            ck.save(9, make_state(9), {})
    assert_bitwise_equal(make_state(2), restored)


_CHILD = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {tests_dir!r})
    from test_checkpoint import make_state
    from ppo_async.run.checkpoint import Checkpointer
    from orbax.checkpoint._src.path import atomicity

    ck = Checkpointer({directory!r})
    ck.save(1, make_state(1), {{"step": 1}})
    print("saved 1", flush=True)

    async def killed_rename(*args, **kwargs):
        # Everything of step 2 is written except the final rename: die like SIGKILL.
        os._exit(17)

    atomicity.async_path.rename = killed_rename
    ck.save(2, make_state(2), {{"step": 2}})
    print("unreachable", flush=True)
    """
)


def test_save_killed_mid_write_in_another_process(tmp_path):
    directory = str(tmp_path / "ck")
    code = _CHILD.format(tests_dir=os.path.dirname(os.path.abspath(__file__)), directory=directory)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 17, proc.stderr[-3000:]
    assert "saved 1" in proc.stdout and "unreachable" not in proc.stdout
    leftovers = [n for n in os.listdir(directory) if n.startswith("2.")]
    assert leftovers, os.listdir(directory)  # the interrupted step-2 temp dir is there...
    with Checkpointer(directory) as ck:
        assert ck.all_steps() == [1]  # ...but never seen as a checkpoint
        # Step 1, saved by another (now dead) process right before, restores bitwise.
        restored, meta = ck.restore(zeros_like_state())
        assert meta == {"step": 1}
        assert_bitwise_equal(make_state(1), restored)
        # The run resumes and re-saves step 2.
        ck.save(2, make_state(2), {"step": 2})
        assert ck.latest_step() == 2
        restored, meta = ck.restore(zeros_like_state())
    assert meta == {"step": 2}
    assert_bitwise_equal(make_state(2), restored)
