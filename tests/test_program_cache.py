"""The jitted modes keep compiled programs across runs of one process (`common._JITTED`):
a repeat of a shape reuses its program and gives the same numbers; a different shape or
static field compiles its own."""

from __future__ import annotations


import ppo_async as pa
from ppo_async.modes import common
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
