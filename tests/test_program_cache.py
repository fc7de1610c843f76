"""The jitted modes keep compiled programs across runs of one process (`common._JITTED`):
a repeat of a shape reuses its program and gives the same numbers; a different shape or
static field compiles its own. Across processes, `runtime.program_cache` keeps the traced
programs (`jax.export`): a run that reads them gives bitwise the numbers of one that traced
them; a patched function, a corrupt file or an unexportable program is never a stale program."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.modes import common
from ppo_async.runtime import program_cache
from ppo_async.runtime.xla_flags import enable_compilation_cache
from ppo_async.modes.common import jitted_program_key
from ppo_async.modes.simulated import build_simulated
from ppo_async.modes.sync import build_sync

SMALL = dict(
    total_env_steps=64 * 3,
    rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(8,), critic_hidden=(8,)),
)


def returns_of(result: pa.TrainResult) -> list:
    return [(r["policy_loss"], r["approx_kl"]) for r in result.metrics]


def test_a_repeated_shape_reuses_its_program_with_identical_results():
    common.clear_jitted_cache()
    first = pa.train(pa.Config(**SMALL))
    assert len(common._JITTED) == 1
    other_seed = pa.train(pa.Config(seed=3, **SMALL))  # the seed enters as an argument
    lr = pa.train(pa.Config(**{**SMALL, "ppo": pa.PPOConfig(num_epochs=1, num_minibatches=2, learning_rate=1e-4)}))
    assert len(common._JITTED) == 1  # the learning rate is traced
    again = pa.train(pa.Config(**SMALL))
    assert returns_of(again) == returns_of(first)
    assert returns_of(other_seed) != returns_of(first) and returns_of(lr) != returns_of(first)
    assert again.compile_seconds < first.compile_seconds
    common.clear_jitted_cache()
    fresh = pa.train(pa.Config(**SMALL))
    assert returns_of(fresh) == returns_of(first)


def test_static_fields_and_modes_get_their_own_program():
    common.clear_jitted_cache()
    pa.train(pa.Config(**SMALL))
    pa.train(pa.Config(mode="simulated", **SMALL))
    keys = list(common._JITTED)
    assert len(keys) == 2 and any("simulated" in k for k in keys)
    more_epochs = pa.Config(**{**SMALL, "ppo": pa.PPOConfig(num_epochs=2, num_minibatches=2)})
    base = pa.Config(**SMALL)
    assert jitted_program_key(build_sync, more_epochs) != jitted_program_key(build_sync, base)
    assert jitted_program_key(build_sync, base.replace(seed=5, log_every=3)) == jitted_program_key(build_sync, base)
    assert jitted_program_key(build_sync, base) != jitted_program_key(build_simulated, base)


# ---------------------------------------------------------------------------- across processes


@pytest.fixture
def disk_cache(tmp_path):
    """JAX's persistent cache (and so the program cache) in a directory of this test, the
    suite's own restored after; the in-process programs forgotten before and after. Yields
    the list the program cache's reads are appended to (one entry per program read)."""
    from jax import monitoring

    previous = jax.config.values.get("jax_compilation_cache_dir")
    enable_compilation_cache(str(tmp_path / "jax"))
    common.clear_jitted_cache()
    reads: list[float] = []

    def on_duration(event, duration, **kwargs):
        if event == program_cache.PROGRAM_CACHE_EVENT:
            reads.append(duration)

    monitoring.register_event_duration_secs_listener(on_duration)
    yield reads
    monitoring.unregister_event_duration_listener(on_duration)
    common.clear_jitted_cache()
    if previous:
        enable_compilation_cache(previous)


def stored(tmp_path) -> list[str]:
    directory = tmp_path / "jax-programs"
    return sorted(os.listdir(directory)) if directory.is_dir() else []


def fresh_run(config: pa.Config) -> pa.TrainResult:
    """A run as a new process would make it: nothing kept in this one."""
    common.clear_jitted_cache()
    return pa.train(config)


def test_a_later_process_reads_the_traced_programs_and_runs_bitwise_the_same(disk_cache, tmp_path):
    assert program_cache.program_cache_dir() == str(tmp_path / "jax") + "-programs"
    cold = fresh_run(pa.Config(**SMALL))
    assert disk_cache == [] and len(stored(tmp_path)) == 2  # init and step
    warm = fresh_run(pa.Config(**SMALL))
    assert len(disk_cache) == 2 and len(stored(tmp_path)) == 2
    assert returns_of(warm) == returns_of(cold)
    for a, b in zip(jax.tree.leaves(warm.params), jax.tree.leaves(cold.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    simulated = fresh_run(pa.Config(mode="simulated", **SMALL))  # another program: its own files
    assert len(disk_cache) == 2 and len(stored(tmp_path)) == 4 and returns_of(simulated)
    # the same numbers as with no program cache at all
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        assert program_cache.program_cache_dir() is None
        uncached = fresh_run(pa.Config(**SMALL))
    finally:
        enable_compilation_cache(str(tmp_path / "jax"))
    assert returns_of(uncached) == returns_of(cold) and len(disk_cache) == 2


def test_a_function_patched_at_run_time_is_traced_not_read(disk_cache, tmp_path, monkeypatch):
    """A notebook's or a test's replacement of a traced function changes the key: the patched
    program runs (here an update that changes nothing), the stored one is not used."""
    cold = fresh_run(pa.Config(**SMALL))
    real = common.learner.ppo_update

    def frozen_update(ctx, train_state, trajectory, key, hparams):
        _, metrics = real(ctx, train_state, trajectory, key, hparams)
        return train_state, metrics

    monkeypatch.setattr(common.learner, "ppo_update", frozen_update)
    patched = fresh_run(pa.Config(**SMALL))
    assert disk_cache == [] and len(stored(tmp_path)) == 4
    initial = fresh_run(pa.Config(**{**SMALL, "total_env_steps": 64}))  # one iteration of the patched program
    for a, b in zip(jax.tree.leaves(patched.params), jax.tree.leaves(initial.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # never updated
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(patched.params), jax.tree.leaves(cold.params)))
    monkeypatch.undo()
    again = fresh_run(pa.Config(**SMALL))  # unpatched: the first run's programs again
    assert len(disk_cache) >= 2 and returns_of(again) == returns_of(cold)


def test_a_corrupt_file_is_a_miss_and_is_written_again(disk_cache, tmp_path):
    cold = fresh_run(pa.Config(**SMALL))
    for name in stored(tmp_path):
        (tmp_path / "jax-programs" / name).write_bytes(b"not a program")
    again = fresh_run(pa.Config(**SMALL))
    assert disk_cache == [] and returns_of(again) == returns_of(cold)
    third = fresh_run(pa.Config(**SMALL))
    assert len(disk_cache) == 2 and returns_of(third) == returns_of(cold)


def test_a_program_jax_export_refuses_is_traced_as_before(disk_cache, tmp_path, monkeypatch):
    from jax import export

    cold = fresh_run(pa.Config(**SMALL))
    for name in stored(tmp_path):
        os.remove(tmp_path / "jax-programs" / name)

    def refuse(*args, **kwargs):
        raise ValueError("custom call target not in the stable set")

    monkeypatch.setattr(export, "export", refuse)
    again = fresh_run(pa.Config(**SMALL))
    assert returns_of(again) == returns_of(cold) and stored(tmp_path) == [] and disk_cache == []


def test_the_key_follows_shapes_dtypes_and_the_callers_key():
    x = jax.ShapeDtypeStruct((4, 2), np.float32)
    key = program_cache.program_key("a", (x,))
    assert key == program_cache.program_key("a", (np.zeros((4, 2), np.float32),))  # arrays or their shapes
    assert len({key, program_cache.program_key("b", (x,)), program_cache.program_key("a", (jax.ShapeDtypeStruct((4, 3), np.float32),)),
                program_cache.program_key("a", (jax.ShapeDtypeStruct((4, 2), np.int32),)),
                program_cache.program_key("a", ((x,),))}) == 5


def test_the_live_fingerprint_follows_patched_functions_and_constants(monkeypatch):
    """What a traced program reads from ppo_async's modules at trace time: a constant or a
    function patched in changes the fingerprint (so the key); putting it back restores it."""
    from ppo_async.core import losses

    before = program_cache.live_fingerprint()
    assert program_cache.live_fingerprint() == before  # stable while nothing changes
    monkeypatch.setattr(losses, "LOG_STD_MIN", -5.0)
    constant = program_cache.live_fingerprint()
    monkeypatch.setattr(losses, "approx_kl", lambda *args: 0.0)
    function = program_cache.live_fingerprint()
    assert len({before, constant, function}) == 3
    monkeypatch.undo()
    assert program_cache.live_fingerprint() == before
