"""Env families beyond gymnax: brax/*, playground/* (inside the jitted rollout, every mode) and
gymnasium/* (host-side, stepped by each sampler thread): names, options, shapes, truncation
bootstrap, no recompile, threaded runs with the accounting identity, a failing host sampler,
the missing-extra error, presets and zero-size checkpoint leaves."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.run import checkpoint
from ppo_async import envs
from ppo_async.core import host_rollout, learner, networks
from ppo_async.config import presets
from ppo_async.config import ConfigError, EnvOptions, ThreadedConfig
from ppo_async.envs.registry import split_env_name
from ppo_async.modes import threaded as threaded_module
from ppo_async.core.rollout import RolloutContext
from ppo_async.core.networks import make_actor_critic
from ppo_async.core.types import snapshot_of

TINY = dict(
    rollout=pa.RolloutConfig(num_envs=4, num_steps=8),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)


def threaded_run(env: str, num_samplers: int = 2, iterations: int = 6, **kw) -> tuple[pa.Config, pa.TrainResult]:
    config = pa.Config(env=env, mode="threaded", total_env_steps=32 * iterations,
                       num_samplers=num_samplers, **TINY, **kw)
    return config, pa.train(config)


def assert_accounting(config: pa.Config, result: pa.TrainResult) -> None:
    rows = result.metrics
    assert [r["iteration"] for r in rows] == list(range(1, config.num_iterations + 1))
    for r in rows:
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
        assert sum(r["lag_histogram"]) == config.batch_size
        assert np.isfinite(r["approx_kl"]) and np.isfinite(r["policy_loss"])


# --------------------------------------------------------------------------------------
# names, options, extras
# --------------------------------------------------------------------------------------


def test_family_by_prefix():
    assert split_env_name("brax/ant") == ("brax", "ant")
    assert split_env_name("playground/CheetahRun") == ("playground", "CheetahRun")
    assert split_env_name("gymnasium/HalfCheetah-v5") == ("gymnasium", "HalfCheetah-v5")
    assert split_env_name("Pendulum-v1") == ("gymnax", "Pendulum-v1")
    assert split_env_name("MinAtar/Breakout") == ("gymnax", "MinAtar/Breakout")


# The tests of one family go to one xdist worker: its import (brax ~8 s here) and the eager ops
# its env set-up compiles (~250 for brax) are paid once, not once per worker.
BRAX = pytest.mark.xdist_group("brax")
PLAYGROUND = pytest.mark.xdist_group("playground")


@pytest.mark.parametrize("name, known", [pytest.param("brax/antt", "brax/ant", marks=BRAX),
                                         pytest.param("playground/CartpoleBalanse", "playground/CartpoleBalance", marks=PLAYGROUND),
                                         ("gymnasium/HalfCheetah-v0", "gymnasium/HalfCheetah-v5")])
def test_unknown_names_list_the_family(name, known):
    with pytest.raises(ConfigError, match=f"env = '{name}' is not a known .* environment; known: .*{known}"):
        pa.Config(env=name)


def test_missing_extra_names_the_pip_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "brax" else real(name, *a))
    with pytest.raises(ConfigError, match=r"'brax' is not installed: pip install -e \"\.\[brax\]\""):
        pa.Config(env="brax/ant")


def test_host_side_env_needs_threaded_mode():
    for mode in ("sync", "simulated"):
        with pytest.raises(ConfigError, match=r"mode = .* must be 'threaded' for the host-side env 'gymnasium/Pendulum-v1'"):
            pa.Config(env="gymnasium/Pendulum-v1", mode=mode)
    pa.Config(env="gymnasium/Pendulum-v1", mode="threaded")


def test_env_options_that_would_do_nothing_or_are_wrong():
    with pytest.raises(ConfigError, match=r"env_options.backend = 'mjx' has no effect: .*gymnax env 'Pendulum-v1'"):
        pa.Config(env_options=EnvOptions(backend="mjx"))
    with pytest.raises(ConfigError, match=r"env_options.episode_length = 5 has no effect: .*gymnasium"):
        pa.Config(env="gymnasium/Pendulum-v1", mode="threaded", env_options=EnvOptions(episode_length=5))
    with pytest.raises(ConfigError, match=r"env_options.backend = 'jax' is invalid: must be one of \('generalized'"):
        pa.Config(env="brax/ant", env_options=EnvOptions(backend="jax"))
    with pytest.raises(ConfigError, match=r"env_options.backend = 'mjx' is invalid: must be one of \('jax', 'warp'\)"):
        pa.Config(env="playground/CartpoleBalance", env_options=EnvOptions(backend="mjx"))
    with pytest.raises(ConfigError, match=r"env_options.episode_length = 0 is invalid"):
        EnvOptions(episode_length=0)


# --------------------------------------------------------------------------------------
# JAX-native physics: shapes, truncation bootstrap, no recompile
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, obs, act", [pytest.param("brax/inverted_pendulum", 4, 1, marks=BRAX),
                                            pytest.param("playground/CartpoleBalance", 5, 1, marks=PLAYGROUND)])
def test_physics_env_shapes_truncation_and_no_recompile(name, obs, act):
    env = envs.make_env(name, EnvOptions(episode_length=3))
    assert env.obs_shape == (obs,) and env.action_shape == (act,) and not env.discrete and not env.host_side
    assert env.params.max_steps_in_episode == 3
    assert np.all(env.action_low < env.action_high)
    chex.clear_trace_counter()
    step = jax.jit(chex.assert_max_traces(lambda s, a, k: envs.step_envs(env, s, a, k), n=1))
    # a jitted reset (op by op, MJX's reset takes ~40 s here): brax's reset leaves Python floats
    # and weak types where its step has arrays, which would retrace a function of the state
    state = jax.jit(lambda k: envs.reset_envs(env, k, 2))(jax.random.PRNGKey(0))
    initial_obs = np.asarray(state.obs)
    assert not np.allclose(initial_obs[0], initial_obs[1])  # each slot draws its own initial state
    assert state.obs.shape == (2, obs) and state.obs.dtype == jnp.float32
    seen = []
    for t in range(4):
        before = state
        state, out = step(state, jnp.zeros((2, act)), jax.random.PRNGKey(t))  # traced once for all 4
        seen.append(out)
        assert out.obs.dtype == jnp.float32 and out.reward.shape == (2,) and out.reward.dtype == jnp.float32
    # 3-step time limit: truncated (not terminated) at the 3rd step, then a new episode
    assert [bool(o.truncated[0]) for o in seen] == [False, False, True, False]
    assert not any(bool(o.terminated.any()) for o in seen)
    third = seen[2]
    assert np.all(np.asarray(third.finished_length) == 3)
    np.testing.assert_allclose(third.finished_return, sum(np.asarray(o.reward) for o in seen[:3]), rtol=1e-6)
    # the bootstrap observation is the one reached; the next episode starts from the slot's initial state
    assert not np.allclose(third.final_obs, third.obs)
    np.testing.assert_allclose(third.obs, initial_obs, rtol=1e-6)
    assert np.allclose(seen[1].final_obs, seen[1].obs)


@BRAX
def test_physics_envs_are_distinct_by_options():
    a = envs.make_env("brax/inverted_pendulum")
    b = envs.make_env("brax/inverted_pendulum", EnvOptions(episode_length=10))
    assert a.params.backend == "generalized" and a.params.max_steps_in_episode == 1000
    assert a != b and a == envs.make_env("brax/inverted_pendulum")


@PLAYGROUND
def test_playground_sync_run_learns_nothing_wrong_and_checkpoints(tmp_path):
    """sync mode end to end on a Playground env, with the env state (MJX data has zero-size
    leaves) in the final checkpoint, which loads again."""
    config = pa.Config(env="playground/CartpoleBalance", total_env_steps=32 * 4, run_dir=str(tmp_path / "run"), **TINY)
    result = pa.train(config)
    rows = result.metrics
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["policy_loss"]) and r["samples_produced"] == 32 * r["iteration"] for r in rows)
    policy = pa.load(str(tmp_path / "run"))
    action = policy.act(np.zeros((3, 5), np.float32))
    assert action.shape == (3, 1)


@BRAX
def test_brax_threaded_run_keeps_the_accounting():
    """Brax and Playground share `PhysicsEnv` inside the jitted rollout (Playground runs end to
    end in the sync test above), so one threaded run of a physics env covers both families."""
    config, result = threaded_run("brax/inverted_pendulum")
    assert_accounting(config, result)


# --------------------------------------------------------------------------------------
# host-side Gymnasium envs on sampler threads
# --------------------------------------------------------------------------------------


def _host_rollout(num_steps: int, num_envs: int = 3) -> tuple[RolloutContext, host_rollout.HostRollout, pa.TrainState]:
    config = pa.Config(env="gymnasium/Pendulum-v1", mode="threaded",
                       rollout=pa.RolloutConfig(num_envs=num_envs, num_steps=num_steps), ppo=pa.PPOConfig(num_minibatches=1),
                       total_env_steps=num_envs * num_steps)
    env = envs.make_env(config.env)
    ctx = RolloutContext(env, make_actor_critic(env, config.network), config.rollout, gamma=config.ppo.gamma)
    from ppo_async.modes.common import make_contexts

    _, _, learner_ctx = make_contexts(config)
    state = learner.init_train_state(learner_ctx, jax.random.PRNGKey(0), env.obs_shape)
    return ctx, host_rollout.HostRollout(ctx), state


def test_host_rollout_trajectory_matches_the_policy_and_bootstraps_at_the_time_limit():
    ctx, roll, state = _host_rollout(num_steps=205)
    env = host_rollout.HostVectorEnv(ctx.env.env, 3, seed=7)
    try:
        _, traj = roll(snapshot_of(state), env, jax.random.PRNGKey(1))
    finally:
        env.close()
    tr = traj.transitions
    assert tr.obs.shape == (205, 3, 3) and tr.action.shape == (205, 3, 1) and tr.reward.dtype == jnp.float32
    like = roll.trajectory_like(snapshot_of(state))
    assert jax.tree.structure(like) == jax.tree.structure(traj)
    assert all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(jax.tree.leaves(like), jax.tree.leaves(traj)))
    # Pendulum-v1's 200-step limit: truncated at step 199 in every env, never terminated
    assert np.flatnonzero(np.asarray(tr.truncated[:, 0])).tolist() == [199]
    assert not np.asarray(tr.terminated).any()
    assert float(traj.stats.episode_count) == 3 and float(traj.stats.episode_length_sum) == 600
    np.testing.assert_allclose(float(traj.stats.episode_return_sum), float(np.sum(np.asarray(tr.reward[:200]))), rtol=1e-5)
    # the bootstrap observation at the limit is the one reached, the next obs a fresh reset
    assert not np.allclose(tr.final_obs[199], tr.obs[200])
    np.testing.assert_allclose(tr.final_obs[198], tr.obs[199], rtol=1e-6)
    # behaviour log-probs are the snapshot policy's on the stored (normalised) observations
    dist, _ = ctx.network.apply(state.params, tr.obs)
    np.testing.assert_allclose(networks.log_prob(dist, tr.action), tr.behavior_log_prob, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(tr.policy_version) == int(state.version))


def test_host_samplers_are_seeded_apart():
    ctx, roll, state = _host_rollout(num_steps=4)
    a, b = host_rollout.HostVectorEnv(ctx.env.env, 3, 1), host_rollout.HostVectorEnv(ctx.env.env, 3, 2)
    again = host_rollout.HostVectorEnv(ctx.env.env, 3, 1)
    try:
        assert not np.allclose(a.obs, b.obs) and np.allclose(a.obs, again.obs)
        assert len({tuple(row) for row in a.obs}) == 3  # env i is seeded seed + i
    finally:
        for e in (a, b, again):
            e.close()


def test_gymnasium_threaded_run_keeps_the_accounting_and_evaluates(tmp_path):
    config, result = threaded_run("gymnasium/Pendulum-v1", num_samplers=2, iterations=8,
                                  run_dir=str(tmp_path / "run"), eval_every_steps=8 * 32, eval_episodes=2)
    assert_accounting(config, result)
    assert sorted({r["sampler_id"] for r in result.metrics}) == [0, 1]
    assert np.isfinite(result.metrics[-1]["eval_return"])
    returns = pa.evaluate(pa.load(str(tmp_path / "run")), num_episodes=2)
    assert returns["lengths"].tolist() == [200, 200] and np.all(returns["returns"] < 0)


def test_gymnasium_halfcheetah_threaded_run():
    config, result = threaded_run("gymnasium/HalfCheetah-v5", num_samplers=2, iterations=4)
    assert_accounting(config, result)


MUJOCO_SETTOTALMASS_NOTICE = (  # what MuJoCo 3.17.0, 4.0.0 and 4.0.1 send (3.3.7 sends none)
    "compiler attribute 'settotalmass' is deprecated and will be removed in a future release: scale the masses "
    "and densities in the model, or call mj_setTotalmass and mj_setConst on the compiled model"
)


@pytest.mark.parametrize("message", [
    MUJOCO_SETTOTALMASS_NOTICE,  # the full sentence of today's builds
    "compiler attribute 'settotalmass' is deprecated",  # the fragment alone (a reworded tail)
    "XML: compiler attribute 'settotalmass' is deprecated; see the changelog",  # a prefix and another tail
])
def test_the_settotalmass_notice_is_dropped_in_each_form(capfd, message):
    from ppo_async.envs import mujoco_notices

    mujoco_notices.mujoco_warning(message)
    mujoco_notices.mujoco_warning("Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.")
    out, err = capfd.readouterr()
    assert out == "" and err == "WARNING: Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.\n"


def test_gymnasium_model_notices_are_dropped_and_other_mujoco_warnings_kept():
    """HalfCheetah-v5's XML sets MuJoCo's deprecated `settotalmass`: MuJoCo printed one
    WARNING line per model compiled (the probe that reads the spaces, then one per env); the
    hook drops that notice only. In a fresh process, so that no earlier test has installed the
    hook already (the probe is the first model compiled there)."""
    pytest.importorskip("mujoco")
    check = (
        "import mujoco\n"
        "from ppo_async import envs\n"
        "from ppo_async.envs import gymnasium as host_envs, mujoco_notices\n"
        "env = host_envs.HostVectorEnv(envs.make_env('gymnasium/HalfCheetah-v5').env, 2, seed=0)\n"
        "env.close()\n"
        "assert mujoco.get_mju_user_warning() is mujoco_notices.mujoco_warning\n"
        "mujoco_notices.mujoco_warning('Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable.')\n"
    )
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "settotalmass" not in done.stdout + done.stderr
    assert "WARNING: Nan, Inf or huge value in QACC at DOF 0. The simulation is unstable." in done.stderr


def test_a_host_sampler_that_raises_reaches_train_within_5s(monkeypatch, time_bound):
    calls, raised_at = [0], []
    real = host_rollout.HostVectorEnv.step

    def exploding(self, action):
        calls[0] += 1
        if calls[0] == 50:
            raised_at.append(time.perf_counter())
            raise RuntimeError("simulator crashed")
        return real(self, action)

    monkeypatch.setattr(host_rollout.HostVectorEnv, "step", exploding)
    with pytest.raises(threaded_module.ThreadFailure, match=r"(?s)sampler-\d.*simulator crashed"):
        threaded_run("gymnasium/Pendulum-v1", iterations=10_000)
    assert time.perf_counter() - raised_at[0] < time_bound(5.0)


# --------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------


def test_presets_fill_only_what_is_not_set():
    config = presets.config_for_env("brax/inverted_pendulum", {"ppo.gamma": 0.9})
    assert config.ppo.gamma == 0.9 and config.rollout.num_envs == presets.preset_for("brax/inverted_pendulum")["rollout.num_envs"]
    assert presets.preset_for("Pendulum-v1") == {}
    assert presets.config_for_env("Pendulum-v1") == pa.Config()
    assert presets.preset_for("playground/CartpoleBalance")["ppo.gamma"] == 0.995


def test_cli_applies_the_preset_under_flags_and_config_file(tmp_path):
    from ppo_async.cli import parse_train_args

    parsed = parse_train_args(["--env", "brax/inverted_pendulum", "--ppo.gamma", "0.9", "--run-dir", str(tmp_path / "a")])
    preset = presets.preset_for("brax/inverted_pendulum")
    assert parsed.cfg.ppo.gamma == 0.9 and "ppo.gamma" not in parsed.preset
    assert parsed.cfg.rollout.num_envs == preset["rollout.num_envs"] and parsed.preset["rollout.num_envs"] == preset["rollout.num_envs"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"env": "brax/inverted_pendulum", "rollout": {"num_envs": 8}}))
    parsed = parse_train_args(["--config", str(path), "--run-dir", str(tmp_path / "b")])
    assert parsed.cfg.rollout.num_envs == 8 and "rollout.num_envs" not in parsed.preset
    assert parsed.cfg.ppo.gamma == preset["ppo.gamma"]
    assert parse_train_args(["--run-dir", str(tmp_path / "d")]).preset == {}
    host = parse_train_args(["--mode", "threaded", "--env", "gymnasium/HalfCheetah-v5", "--run-dir", str(tmp_path / "e")])
    assert host.cfg.mode == "threaded" and host.cfg.ppo.learning_rate == presets.preset_for("gymnasium/HalfCheetah-v5")["ppo.learning_rate"]


# --------------------------------------------------------------------------------------
# checkpoints of states with zero-size leaves (MJX)
# --------------------------------------------------------------------------------------


def test_checkpoint_round_trips_zero_size_leaves(tmp_path):
    state = {"act": jnp.zeros((4, 0), jnp.float32), "qpos": jnp.arange(6.0).reshape(2, 3), "n": jnp.int32(3)}
    with checkpoint.Checkpointer(tmp_path / "ck") as ck:
        ck.save(1, state, {"iteration": 1})
        restored, meta = ck.restore(jax.tree.map(jnp.zeros_like, state))
    assert restored["act"].shape == (4, 0) and restored["act"].dtype == jnp.float32
    np.testing.assert_array_equal(restored["qpos"], state["qpos"])
    assert int(restored["n"]) == 3 and meta["iteration"] == 1


def test_brax_names_read_from_its_source_are_the_names_it_registers():
    """known_env_names('brax') reads brax's `_envs` dict literal without importing brax (seconds
    of MJX imports for an error message); the names equal the imported registry's."""

    from brax import envs as brax_envs

    from ppo_async.envs import registry

    names = registry._brax_registry_from_source()
    assert names is not None and sorted(names) == sorted(brax_envs._envs) and "ant" in names
    assert registry.known_env_names("brax") == tuple(sorted(brax_envs._envs))
    check = ("import sys; from ppo_async.envs import registry; names = registry.known_env_names('brax'); "
             "assert 'ant' in names and 'brax' not in sys.modules, sorted(m for m in sys.modules if 'brax' in m)")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
