"""Data-parallel learner and device placement.

Several CPU devices exist only if XLA_FLAGS is set before JAX starts, so the multi-device
checks run in a subprocess with `--xla_force_host_platform_device_count=4`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.core import losses
from ppo_async.modes.threaded import resolve_placement
from ppo_async.core.rollout import concat_trajectories

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = ["d0", "d1", "d2", "d3"]


def threaded(num_samplers: int | None = None, **kw) -> pa.Config:
    return pa.Config(mode="threaded", num_samplers=num_samplers, threaded=pa.ThreadedConfig(**kw))


def test_placement_defaults_share_one_device_and_split_several():
    one = resolve_placement(threaded(num_samplers=3), ["d0"])
    assert one.sampler_devices == ("d0",) * 3 and one.learner_devices == ("d0",)
    four = resolve_placement(threaded(num_samplers=3), FAKE)
    assert four.learner_devices == ("d2", "d3") and four.sampler_devices == ("d0", "d1", "d0")
    three = resolve_placement(threaded(num_samplers=2), FAKE[:3])
    assert three.learner_devices == ("d2",) and three.sampler_devices == ("d0", "d1")


def test_explicit_placement_and_its_errors():
    p = resolve_placement(threaded(num_samplers=3, sampler_devices=(3,), learner_devices=(0, 1, 2, 3)), FAKE)
    assert p.sampler_devices == ("d3",) * 3 and p.learner_devices == tuple(FAKE) and p.buffer_device == "d0"
    with pytest.raises(pa.ConfigError, match=r"threaded.learner_devices.*index 4 is out of range.*4 JAX device"):
        resolve_placement(threaded(learner_devices=(4,)), FAKE)
    with pytest.raises(pa.ConfigError, match=r"threaded.sampler_devices"):
        resolve_placement(threaded(sampler_devices=(0, 7)), FAKE)
    # 16 envs do not split over 3 devices
    with pytest.raises(pa.ConfigError, match=r"threaded.learner_devices = \(0, 1, 2\).*must divide"):
        resolve_placement(threaded(learner_devices=(0, 1, 2)), FAKE)
    with pytest.raises(pa.ConfigError, match="must not repeat"):
        pa.ThreadedConfig(learner_devices=(1, 1))


def test_barrier_and_chunk_config_rules():
    assert threaded(num_samplers=3, barrier=True).batch_size == 3 * 1024
    assert threaded(num_samplers=3, chunks_per_batch=2).batch_size == 2 * 1024
    assert threaded(num_samplers=3).batch_size == 1024
    with pytest.raises(pa.ConfigError, match=r"threaded.chunks_per_batch = 2 .*must equal num_samplers = 3"):
        threaded(num_samplers=3, barrier=True, chunks_per_batch=2)
    with pytest.raises(pa.ConfigError, match=r"threaded.buffer_capacity = 2048 .*must hold >= num_samplers = 4 chunks"):
        pa.Config(mode="threaded", total_env_steps=8192, num_samplers=4, threaded=pa.ThreadedConfig(
            barrier=True, buffer_capacity=2048, full_policy="overwrite_oldest"))
    with pytest.raises(pa.ConfigError, match=r"threaded.buffer_capacity = 1000 .*whole number of rollout chunks.*1024"):
        pa.Config(mode="threaded", threaded=pa.ThreadedConfig(buffer_capacity=1000))
    with pytest.raises(pa.ConfigError, match=r"threaded.buffer_capacity = 1000 has no effect.*mode='sync'"):
        pa.Config(mode="sync", threaded=pa.ThreadedConfig(buffer_capacity=1000))  # a threaded knob outside threaded mode
    assert pa.Config(mode="threaded", threaded=pa.ThreadedConfig(buffer_capacity=3072)).buffer_capacity_chunks == 3
    with pytest.raises(pa.ConfigError, match=r"total_env_steps.*chunks_per_batch"):
        pa.Config(mode="threaded", total_env_steps=2048, num_samplers=4, threaded=pa.ThreadedConfig(barrier=True))


def test_concat_trajectories_joins_env_columns_and_merges_stats():
    from ppo_async.modes.common import make_contexts
    from ppo_async.core.rollout import rollout
    from ppo_async import envs
    from ppo_async.core import learner
    from ppo_async.core.types import snapshot_of

    config = pa.Config(rollout=pa.RolloutConfig(num_envs=4, num_steps=8))
    _, rctx, lctx = make_contexts(config)
    state = learner.init_train_state(lctx, jax.random.PRNGKey(0), rctx.env.obs_shape)
    chunks = [
        rollout(rctx, snapshot_of(state), envs.reset_envs(rctx.env, jax.random.PRNGKey(s), 4), jax.random.PRNGKey(9 + s))[1]
        for s in range(2)
    ]
    both = concat_trajectories(chunks)
    assert both.transitions.obs.shape == (8, 8, 3) and both.last_obs.shape == (8, 3)
    np.testing.assert_array_equal(both.transitions.reward[:, 4:], chunks[1].transitions.reward)
    raw = jnp.concatenate([c.stats.obs_moments.mean for c in chunks])  # equal counts: mean of means
    np.testing.assert_allclose(both.stats.obs_moments.mean, raw.reshape(2, 3).mean(0), rtol=1e-6)
    assert float(both.stats.obs_moments.count) == sum(float(c.stats.obs_moments.count) for c in chunks)
    assert concat_trajectories(chunks[:1]) is chunks[0]


def test_normalize_advantages_over_an_axis_equals_normalizing_the_whole_batch():
    adv = jax.random.normal(jax.random.PRNGKey(0), (4, 32)) * 3.0 + 1.0
    mask = (jax.random.uniform(jax.random.PRNGKey(1), (4, 32)) > 0.3).astype(jnp.float32)
    sharded = jax.vmap(lambda a, m: losses.normalize_advantages(a, m, axis_name="dev"), axis_name="dev")(adv, mask)
    whole = losses.normalize_advantages(adv.reshape(-1), mask.reshape(-1)).reshape(4, 32)
    np.testing.assert_allclose(sharded * mask, whole * mask, rtol=1e-5, atol=1e-6)


MULTI_DEVICE_SCRIPT = textwrap.dedent(
    """
    import json, os
    from ppo_async.runtime.xla_flags import apply_cpu_workarounds
    apply_cpu_workarounds()
    import jax, numpy as np
    import ppo_async as pa
    from ppo_async import envs
    from ppo_async.core import learner
    from ppo_async.runtime import placement
    from ppo_async.modes.common import make_contexts
    from ppo_async.core.rollout import rollout
    from ppo_async.core.types import snapshot_of

    out = {"devices": len(jax.devices())}
    # (1) one data-parallel update over 4 devices == the single-device update (one minibatch,
    # so both see the same samples per Adam step; advantage statistics are all-reduced).
    cfg = pa.Config(rollout=pa.RolloutConfig(num_envs=8, num_steps=16), ppo=pa.PPOConfig(num_epochs=3, num_minibatches=1))
    _, rctx, ctx = make_contexts(cfg)
    _, _, dp_ctx = make_contexts(cfg, axis_name=placement.LEARNER_AXIS)
    hp = learner.hyperparams_from_config(cfg)
    state = learner.init_train_state(ctx, jax.random.PRNGKey(0), rctx.env.obs_shape)
    _, traj = rollout(rctx, snapshot_of(state), envs.reset_envs(rctx.env, jax.random.PRNGKey(1), 8), jax.random.PRNGKey(2))
    key = jax.random.PRNGKey(3)
    ref, ref_m = jax.jit(lambda s, t, k, h: learner.ppo_update(ctx, s, t, k, h))(state, traj, key, hp)
    update, place_state, place_traj = placement.learner_placement(dp_ctx, jax.devices())
    dp, dp_m = update(place_state(state), place_traj(traj), place_state(key), place_state(hp))
    out["param_max_abs_diff"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                    for a, b in zip(jax.tree.leaves(ref.params), jax.tree.leaves(dp.params)))
    out["param_max_abs"] = max(float(np.max(np.abs(np.asarray(a)))) for a in jax.tree.leaves(ref.params))
    out["update_moved_params"] = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                                     for a, b in zip(jax.tree.leaves(ref.params), jax.tree.leaves(state.params)))
    out["obs_mean_diff"] = float(np.max(np.abs(np.asarray(ref.obs_stats.mean) - np.asarray(dp.obs_stats.mean))))
    out["same_scalars"] = {k: [float(ref_m[k]), float(dp_m[k])] for k in (
        "policy_loss", "value_loss", "entropy", "approx_kl", "grad_norm", "approx_kl_max", "ratio_max", "ess_fraction",
        "clip_fraction", "explained_variance", "lag_mean", "lag_max")}
    out["same_vectors"] = {k: [np.asarray(ref_m[k]).tolist(), np.asarray(dp_m[k]).tolist()] for k in ("kl_per_lag", "ess_fraction_per_lag")}
    # the collectives of one iteration, as ops in the program (a loop body's ops once)
    hlo = update.lower(place_state(state), place_traj(traj), place_state(key), place_state(hp)).as_text()
    out["collective_ops"] = {op: hlo.count("stablehlo." + op) for op in ("all_reduce", "all_gather")}
    out["hist"] = [np.asarray(ref_m["lag_histogram"]).tolist(), np.asarray(dp_m["lag_histogram"]).tolist()]
    out["consumed"] = [int(ref_m["consumed"]), int(dp_m["consumed"])]
    out["version"] = int(dp.version)
    out["replicated"] = all(x.sharding.is_fully_replicated and len(x.sharding.device_set) == 4 for x in jax.tree.leaves(dp.params))

    # (2) a threaded run with the default split: samplers on devices 0-1, learner on 2-3.
    run = pa.train(pa.Config(mode="threaded", total_env_steps=128 * 12, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
                             ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
                             num_samplers=3, threaded=pa.ThreadedConfig(sampler_step_latency_ms=(0.2, 0.2, 0.5))))
    p = run.extras["placement"]
    out["auto"] = {"samplers": [d.id for d in p.sampler_devices], "learner": [d.id for d in p.learner_devices],
                   "iterations": len(run.metrics),
                   "identity": all(r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"] for r in run.metrics),
                   "hist_sums": sorted({sum(r["lag_histogram"]) for r in run.metrics})}
    # (3) barrier over all four learner devices, samplers pinned to device 3
    run = pa.train(pa.Config(mode="threaded", total_env_steps=256 * 4, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
                             ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
                             num_samplers=2, threaded=pa.ThreadedConfig(barrier=True, sampler_devices=(3,), learner_devices=(0, 1, 2, 3))))
    out["barrier"] = {"lag_max": max(r["lag_max"] for r in run.metrics), "iterations": len(run.metrics),
                      "samplers": [sorted(r["sampler_id"]) for r in run.metrics]}
    print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def multi_device():
    env = dict(os.environ, XLA_FLAGS=os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4")
    proc = subprocess.run(
        [sys.executable, "-c", MULTI_DEVICE_SCRIPT], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_data_parallel_update_matches_the_single_device_update(multi_device):
    r = multi_device
    assert r["devices"] == 4
    assert r["update_moved_params"] > 1e-4  # the comparison is not vacuous
    assert r["param_max_abs_diff"] < 1e-5 * max(1.0, r["param_max_abs"])
    assert r["obs_mean_diff"] < 1e-6
    for name, (ref, dp) in r["same_scalars"].items():
        assert dp == pytest.approx(ref, rel=1e-4, abs=1e-6), name
    for name, (ref, dp) in r["same_vectors"].items():
        np.testing.assert_allclose(np.asarray(dp, float), np.asarray(ref, float), rtol=1e-4, atol=1e-6, err_msg=name)
    assert r["hist"][0] == r["hist"][1] and r["consumed"] == [128, 128]
    # per iteration: the gradient's all-reduce inside the SGD loop, one all-gather of every
    # minibatch's advantage moments before it, one pmax and one psum of the diagnostics after it
    assert r["collective_ops"] == {"all_reduce": 3, "all_gather": 1}
    assert r["version"] == 1 and r["replicated"] is True


def test_threaded_runs_split_over_devices(multi_device):
    auto = multi_device["auto"]
    assert auto["samplers"] == [0, 1, 0] and auto["learner"] == [2, 3]
    assert auto["iterations"] == 12 and auto["identity"] and auto["hist_sums"] == [128]
    barrier = multi_device["barrier"]
    assert barrier["iterations"] == 4 and barrier["lag_max"] == 0 and barrier["samplers"] == [[0, 1]] * 4
