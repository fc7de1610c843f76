"""Simulated mode end to end on tiny Pendulum configs.

Lag 0 is bit-for-bit sync PPO; fixed(K) lags are exact after warm-up; the ring holds the
right past params; samplers have their own env seeds and are consumed round-robin; the
max-lag filter drops (and counts) stale batches; the per-lag KL breakdown; V-trace; the
value-update cadence. Runs are shared by the module through fixtures.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.core import learner, networks
from ppo_async.modes.simulated import make_simulated_program, read_ring, schedule_arrays, simulated_setup
from ppo_async.modes.common import make_contexts
from ppo_async.modes.sync import init_runner_state, make_sync_program
from ppo_async.core.rollout import rollout
from ppo_async.core.types import snapshot_of

BATCH = 64
ITERATIONS = 8
TINY = dict(
    env="Pendulum-v1",
    total_env_steps=BATCH * ITERATIONS,
    rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)
TIMING = {"wall_time", "steps_per_second"}


def tiny(**kw) -> pa.Config:
    return pa.Config(**{**TINY, **kw})


def by_seed(rows: list[dict], seed: int) -> list[dict]:
    return sorted((r for r in rows if r["seed"] == seed), key=lambda r: r["iteration"])


@pytest.fixture(scope="module")
def sync_and_lag0():
    """(sync result, simulated lag-0 result), seeds 5 and 6 in one vmapped run each."""
    sync = pa.train(tiny(mode="sync", seed=5, num_seeds=2))
    sim = pa.train(tiny(mode="simulated", seed=5, num_seeds=2))
    return sync, sim


@pytest.fixture(scope="module")
def fixed3():
    """Two identical runs of fixed lag K=3, seeds 5 and 6."""
    config = tiny(mode="simulated", seed=5, num_seeds=2, lag=pa.LagConfig(K=3))
    return pa.train(config), pa.train(config)


# --------------------------------------------------------------------------------------
# lag 0 == sync
# --------------------------------------------------------------------------------------


@pytest.mark.exact_xla
def test_lag0_is_bitwise_sync(sync_and_lag0):
    sync, sim = sync_and_lag0
    a, b = sync.to_dataframe(), sim.to_dataframe()
    assert len(a) == len(b) == 2 * ITERATIONS
    # the simulated mode only adds which sampler and which params version produced the batch
    assert set(b.columns) - set(a.columns) == {"sampler_id", "behavior_version"}
    compared = []
    for col in sorted((set(a.columns) & set(b.columns)) - TIMING):
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True), col
            compared.append(col)
        else:  # ints, None-able episode stats, histogram lists
            assert x.tolist() == y.tolist(), col
    for col in ("policy_loss", "value_loss", "approx_kl", "entropy", "grad_norm", "clip_fraction", "ratio_max"):
        assert col in compared
    # both seeds move, and differently
    assert not np.array_equal(a[a.seed == 5].policy_loss.to_numpy(), a[a.seed == 6].policy_loss.to_numpy())
    chex.assert_trees_all_equal(sync.train_state.params, sim.train_state.params)
    chex.assert_trees_all_equal(sync.train_state.opt_state, sim.train_state.opt_state)
    assert b.sampler_id.tolist() == [0] * 2 * ITERATIONS
    assert b.lag_mean.tolist() == [0.0] * 2 * ITERATIONS
    # behaviour params are the current ones: the version before the update
    assert (b.behavior_version == b.learner_version - 1).all()


# --------------------------------------------------------------------------------------
# fixed(K)
# --------------------------------------------------------------------------------------


def test_fixed_lag_is_exact_after_warm_up(fixed3):
    rows = fixed3[0].metrics
    K = 3
    for seed in (5, 6):
        seed_rows = by_seed(rows, seed)
        assert len(seed_rows) == ITERATIONS
        for r in seed_rows:
            i = r["iteration"]
            version_before = r["learner_version"] - 1
            assert version_before == i - 1
            assert r["behavior_version"] == max(version_before - K, 0)
            expected_lag = K if i > K else i - 1  # warm-up: params never older than version 0
            assert r["lag_mean"] == expected_lag and r["lag_max"] == expected_lag
            assert r["lag_histogram"] == [BATCH if b == expected_lag else 0 for b in range(K + 1)]
            assert r["dropped_stale"] == 0
            assert r["samples_consumed"] == i * BATCH
        assert [r["lag_mean"] for r in seed_rows] == [0, 1, 2, 3, 3, 3, 3, 3]


def assert_frames_equal(a, b, columns) -> None:
    for col in columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind == "f":
            assert np.array_equal(x, y, equal_nan=True), col
        else:
            assert x.tolist() == y.tolist(), col


def test_same_seed_is_identical_and_seeds_differ(fixed3):
    first, second = (res.to_dataframe() for res in fixed3)
    assert_frames_equal(first, second, sorted(set(first.columns) - TIMING))
    chex.assert_trees_all_equal(fixed3[0].train_state.params, fixed3[1].train_state.params)
    s5, s6 = first[first.seed == 5], first[first.seed == 6]
    for col in ("policy_loss", "value_loss", "approx_kl", "entropy"):
        assert not np.any(s5[col].to_numpy() == s6[col].to_numpy()), col
    for leaf in jax.tree.leaves(fixed3[0].train_state.params):
        assert not np.array_equal(leaf[0], leaf[1])


@pytest.mark.exact_xla
def test_lag_only_acts_after_the_first_iteration(sync_and_lag0, fixed3):
    """Same seeds: K=3 consumes a fresh batch at iteration 1 (bit for bit lag 0), stale ones after."""
    lag0 = sync_and_lag0[1].to_dataframe()
    lag3 = fixed3[0].to_dataframe()
    cols = ["policy_loss", "value_loss", "approx_kl", "entropy", "grad_norm"]
    first = lag3.iteration == 1
    assert_frames_equal(lag0[first], lag3[first], cols)
    later = ~first
    for col in cols:
        assert not np.any(lag0[later][col].to_numpy() == lag3[later][col].to_numpy()), col
    # the KL to a 1-3 versions old behaviour exceeds the on-policy KL of the same iteration
    warm = lag3.iteration.between(2, 4)
    assert np.all(lag3[warm].approx_kl.to_numpy() > lag0[warm].approx_kl.to_numpy())


def test_per_lag_breakdown(fixed3):
    for r in fixed3[0].metrics:
        bucket = int(r["lag_mean"])
        kl = r["kl_per_lag"]
        clip = r["clip_fraction_per_lag"]
        assert len(kl) == len(clip) == 4
        assert all((v is None) == (b != bucket) for b, v in enumerate(kl)), kl
        assert all((v is None) == (b != bucket) for b, v in enumerate(clip)), clip
        assert np.isfinite(kl[bucket]) and kl[bucket] >= 0
        # equal-size minibatches: the mean of minibatch means is the per-sample mean
        np.testing.assert_allclose(r["approx_kl"], kl[bucket], rtol=1e-4, atol=1e-9)
        np.testing.assert_allclose(r["clip_fraction"], clip[bucket], rtol=1e-5, atol=1e-7)
    assert any(r["lag_mean"] == 3 and r["kl_per_lag"][3] > 1e-4 for r in fixed3[0].metrics)


# --------------------------------------------------------------------------------------
# the ring, samplers and env seeds
# --------------------------------------------------------------------------------------


def test_ring_holds_past_params_and_samplers_step_only_their_envs():
    """Step a 3-sampler fixed(3) program by hand: the ring holds versions v-3..v, only the
    consumed sampler's envs move, and the jitted step never retraces across hparams/schedules."""
    config = tiny(mode="simulated", num_samplers=3, lag=pa.LagConfig(K=3), total_env_steps=BATCH * 6)
    program, schedule = simulated_setup(config)
    assert (program.num_samplers, program.ring_size) == (3, 4)
    step = jax.jit(chex.assert_max_traces(program.iteration, n=1))
    state = jax.jit(program.init)(jax.random.PRNGKey(0))
    hparams = learner.hyperparams_from_config(config)
    sched = schedule_arrays(schedule)
    history = {0: jax.device_get(state.train_state.params)}
    for i in range(6):
        before = jax.device_get(state.env_states)
        state, metrics = step(state, hparams, sched)
        v = int(state.train_state.version)
        assert v == i + 1 and int(metrics["sampler_id"]) == i % 3
        assert int(metrics["behavior_version"]) == max(i - 3, 0)
        history[v] = jax.device_get(state.train_state.params)
        for u in range(max(v - 3, 0), v + 1):
            snap = read_ring(state.ring, jnp.asarray(u))
            assert int(snap.version) == u
            chex.assert_trees_all_equal(snap.params, history[u])
        after = jax.device_get(state.env_states)
        for s in range(3):
            same = all(np.array_equal(x[s], y[s]) for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
            assert same == (s != i % 3), (i, s)
    # other traced hyperparameters and another schedule with the same ring: no retrace
    other_h = hparams._replace(clip_eps=jnp.float32(0.1), dual_clip=jnp.float32(3.0))
    other_s = schedule_arrays(pa.make_schedule(pa.LagConfig(schedule="uniform", low=0, high=3, seed=1), 6, num_samplers=3))
    state, metrics = step(jax.jit(program.init)(jax.random.PRNGKey(1)), other_h, other_s)
    assert int(metrics["sampler_id"]) == 0 and int(state.train_state.version) == 1
    # the guard is live: a different ring size is a new shape, so the step would retrace
    bigger = make_simulated_program(config, ring_size=5)
    with pytest.raises(AssertionError, match="traced"):
        step(jax.jit(bigger.init)(jax.random.PRNGKey(0)), hparams, sched)


def test_samplers_have_distinct_env_seeds():
    config = tiny(mode="simulated", num_samplers=3)
    program = make_simulated_program(config, ring_size=1)
    state = jax.jit(program.init)(jax.random.PRNGKey(4))
    obs = np.asarray(state.env_states.obs)
    assert obs.shape == (3, 4, 3)  # [samplers, envs, obs]
    for s in range(3):
        for t in range(s + 1, 3):
            assert not np.any(np.all(obs[s] == obs[t], axis=-1)), (s, t)
    # sampler 0 is the sync mode's env batch for the same seed
    sync = make_sync_program(tiny(mode="sync"))
    runner = jax.jit(sync.init)(jax.random.PRNGKey(4))
    np.testing.assert_array_equal(obs[0], np.asarray(runner.env_state.obs))
    chex.assert_trees_all_equal(state.train_state.params, runner.train_state.params)
    # and the emulated ring starts filled with version 0
    np.testing.assert_array_equal(np.asarray(state.ring.version), [0])


def test_per_sampler_lags_round_robin():
    config = tiny(mode="simulated", seed=3, lag=pa.LagConfig(schedule="per_sampler", per_sampler=(0, 2, 5)))
    rows = pa.train(config).metrics
    assert [r["sampler_id"] for r in rows] == [0, 1, 2, 0, 1, 2, 0, 1]
    requested = [0, 2, 5, 0, 2, 5, 0, 2]
    measured = [min(k, i) for i, k in enumerate(requested)]  # floored at version 0 in warm-up
    assert measured == [0, 1, 2, 0, 2, 5, 0, 2]
    assert [r["lag_mean"] for r in rows] == measured
    assert [r["behavior_version"] for r in rows] == [i - k for i, k in enumerate(measured)]
    assert all(len(r["lag_histogram"]) == 6 for r in rows)


# --------------------------------------------------------------------------------------
# max_lag stale filter
# --------------------------------------------------------------------------------------


def test_max_lag_drops_stale_batches_and_counts_them():
    config = tiny(mode="simulated", seed=1, lag=pa.LagConfig(K=4, max_lag=2))
    rows = pa.train(config).metrics
    for r in rows:
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
        assert r["samples_produced"] == r["iteration"] * BATCH == r["env_steps"]
    warm, stale = rows[:3], rows[3:]
    # iterations 1..3: lags 0, 1, 2 <= max_lag, consumed
    assert [r["lag_mean"] for r in warm] == [0, 1, 2]
    assert [r["dropped_stale"] for r in warm] == [0, 0, 0]
    assert [r["learner_version"] for r in warm] == [1, 2, 3]
    # from iteration 4 on the learner is at version 3 and every batch is 3 > 2 versions old
    for r in stale:
        assert r["lag_mean"] == 3 and r["dropped_stale"] == BATCH
        assert r["learner_version"] == 3 and r["sgd_steps"] == 3 * 8
        assert r["samples_consumed"] == 3 * BATCH
        assert r["samples_dropped"] == (r["iteration"] - 3) * BATCH
        assert r["policy_loss"] == 0.0 and r["approx_kl"] == 0.0
        assert all(v is None for v in r["kl_per_lag"])  # nothing consumed, no per-lag KL


# --------------------------------------------------------------------------------------
# V-trace
# --------------------------------------------------------------------------------------


def test_vtrace_runs_and_differs_from_gae_under_lag(fixed3):
    config = tiny(mode="simulated", seed=5, num_seeds=2, lag=pa.LagConfig(K=3),
                  ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4, advantage_estimator="vtrace"))
    vtrace = pa.train(config).to_dataframe()
    gae = fixed3[0].to_dataframe()
    assert vtrace.lag_mean.tolist() == gae.lag_mean.tolist()
    for col in ("policy_loss", "value_loss", "approx_kl"):
        v, g = vtrace[col].to_numpy(), gae[col].to_numpy()
        assert np.all(np.isfinite(v)), col
        stale = (gae.iteration >= 2).to_numpy()
        assert not np.any(v[stale] == g[stale]), col


@pytest.mark.exact_xla
def test_vtrace_targets_equal_gae_on_policy_with_lambda_one():
    base = tiny(mode="simulated", ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4, gae_lambda=1.0))
    vt_config = base.replace(ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4, gae_lambda=1.0,
                                              advantage_estimator="vtrace"))
    _, rctx, gae_ctx = make_contexts(base)
    _, _, vt_ctx = make_contexts(vt_config)
    runner = init_runner_state(base, rctx, gae_ctx, jax.random.PRNGKey(0))
    params = runner.train_state.params
    _, traj = jax.jit(lambda s, e, k: rollout(rctx, s, e, k))(
        snapshot_of(runner.train_state), runner.env_state, jax.random.PRNGKey(1)
    )
    hparams = learner.hyperparams_from_config(base)
    lag = learner.sample_lag(traj, runner.train_state.version)
    targets = jax.jit(learner.compute_targets, static_argnums=0)
    # params == behaviour: log rho = 0 (the learner recomputes exactly the sampler's log-probs)
    dist, _ = gae_ctx.network.apply(params, traj.transitions.obs)
    log_rho = networks.log_prob(dist, traj.transitions.action) - traj.transitions.behavior_log_prob
    np.testing.assert_array_equal(log_rho, 0.0)
    g = targets(gae_ctx, params, traj, hparams, lag)
    v = targets(vt_ctx, params, traj, hparams, lag)
    np.testing.assert_allclose(v.target, g.target, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(v.advantage, g.advantage, rtol=1e-4, atol=1e-5)
    assert np.std(np.asarray(g.target)) > 0.1  # not a degenerate trajectory
    # with stale behaviour (params moved, log rho != 0) and rho_bar < 1 the targets differ
    moved = jax.tree.map(lambda p: p + 0.3, params)
    truncated = hparams._replace(rho_bar=jnp.float32(0.5), c_bar=jnp.float32(0.5))
    g2 = targets(gae_ctx, moved, traj, truncated, lag)
    v2 = targets(vt_ctx, moved, traj, truncated, lag)
    assert np.max(np.abs(np.asarray(v2.target) - np.asarray(g2.target))) > 1e-3


# --------------------------------------------------------------------------------------
# value-update cadence
# --------------------------------------------------------------------------------------


def test_value_update_every_two_freezes_the_critic_on_odd_versions():
    config = tiny(mode="simulated", ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4, value_update_every=2))
    _, rctx, lctx = make_contexts(config)
    runner = init_runner_state(config, rctx, lctx, jax.random.PRNGKey(0))
    _, traj = jax.jit(lambda s, e, k: rollout(rctx, s, e, k))(
        snapshot_of(runner.train_state), runner.env_state, jax.random.PRNGKey(1)
    )
    hparams = learner.hyperparams_from_config(config)
    update = jax.jit(chex.assert_max_traces(lambda s, k: learner.ppo_update(lctx, s, traj, k, hparams), n=1))
    mask = learner.critic_mask(runner.train_state.params)
    flags = jax.tree.leaves(mask)
    assert any(flags) and not all(flags)

    def parts(tree):
        leaves = jax.tree.leaves(jax.device_get(tree))
        critic = [x for x, f in zip(leaves, flags) if f]
        actor = [x for x, f in zip(leaves, flags) if not f]
        return critic, actor

    def changed(a, b):
        return any(not np.array_equal(x, y) for x, y in zip(a, b))

    states = [runner.train_state]
    updated = []
    for k in range(3):
        state, metrics = update(states[-1], jax.random.PRNGKey(10 + k))
        states.append(state)
        updated.append(float(metrics["value_updated"]))
    assert updated == [1.0, 0.0, 1.0]  # version 0, 1, 2 before the update
    for v in range(3):
        c0, a0 = parts(states[v].params)
        c1, a1 = parts(states[v + 1].params)
        assert changed(a0, a1), v  # the actor always learns
        assert changed(c0, c1) == (v % 2 == 0), v
        if v % 2:  # frozen critic: its Adam moments stay put too
            adam0, adam1 = learner.adam_state(states[v].opt_state), learner.adam_state(states[v + 1].opt_state)
            for moment in ("mu", "nu"):
                m0, _ = parts(getattr(adam0, moment))
                m1, _ = parts(getattr(adam1, moment))
                assert not changed(m0, m1), moment
