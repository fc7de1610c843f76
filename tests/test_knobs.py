"""Every knob does what it says or says why not: inert fields, wrong types, sweep keys,
run directories that would be overwritten, resuming complete runs and extending them,
threaded sweeps, groupable sweep DataFrames and masked-action entropy."""

from __future__ import annotations

import math
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.core.losses import categorical_entropy
from ppo_async.report.metrics import read_jsonl
from ppo_async.study.sweep import load_sweep, save_sweep

TINY = dict(env="CartPole-v1", total_env_steps=4 * 64, rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
            ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2))

Th, Lag, PPO, Net, Ro = pa.ThreadedConfig, pa.LagConfig, pa.PPOConfig, pa.NetworkConfig, pa.RolloutConfig

# (constructor, the field the error must name): wrong types, inert fields and bad values.
BAD_API_INPUTS = [
    # wrong types
    (lambda: Th(latency_jitter="a"), r"threaded.latency_jitter = 'a' .*must be a number"),
    (lambda: Th(num_samplers=2.0), r"threaded.num_samplers = 2.0 .*integer"),
    (lambda: pa.Config(mode="threaded", num_samplers=2.0), r"^num_samplers = 2.0 .*integer"),
    (lambda: Th(timeout_s="30"), r"threaded.timeout_s = '30'"),
    (lambda: Th(barrier="yes"), r"threaded.barrier = 'yes'"),
    (lambda: Th(sampler_step_latency_ms=1.0), r"threaded.sampler_step_latency_ms = 1.0 .*sequence"),
    (lambda: Th(full_policy=3), r"threaded.full_policy = 3"),
    (lambda: Lag(K="8"), r"lag.K = '8'"),
    (lambda: Lag(p=None), r"lag.p = None"),
    (lambda: Lag(per_sampler=3), r"lag.per_sampler = 3 .*sequence"),
    (lambda: Lag(replay_path=5), r"lag.replay_path = 5 .*string or None"),
    (lambda: PPO(learning_rate="1e-3"), r"ppo.learning_rate = '1e-3'"),
    (lambda: PPO(dual_clip="3"), r"ppo.dual_clip = '3' .*number or None"),
    (lambda: PPO(num_epochs=True), r"ppo.num_epochs = True"),
    (lambda: PPO(anneal_lr=1), r"ppo.anneal_lr = 1"),
    (lambda: Net(activation=1), r"network.activation = 1"),
    (lambda: Net(init_log_std="0"), r"network.init_log_std = '0'"),
    (lambda: Ro(num_envs="16"), r"rollout.num_envs = '16'"),
    (lambda: Ro(reward_scale=None), r"rollout.reward_scale = None"),
    (lambda: pa.Config(seed=1.5), r"seed = 1.5 .*integer"),
    (lambda: pa.Config(run_dir=3), r"run_dir = 3"),
    (lambda: pa.Config(overwrite="no"), r"overwrite = 'no'"),
    (lambda: pa.Config(total_env_steps="1000"), r"total_env_steps = '1000'"),
    (lambda: pa.Config(env=None), r"env = None"),
    # fields that would do nothing in this mode / schedule / estimator
    (lambda: pa.Config(lag=Lag(K=8)), r"lag.K = 8 has no effect.*mode='simulated'.*mode='sync'"),
    (lambda: pa.Config(mode="threaded", lag=Lag(K=8)), r"lag.K = 8 has no effect.*mode='threaded'"),
    (lambda: pa.Config(lag=Lag(schedule="uniform")), r"lag.schedule = 'uniform' has no effect"),
    (lambda: pa.Config(mode="simulated", lag=Lag(schedule="uniform", K=3)), r"lag.K = 3 .*'uniform' does not read it"),
    (lambda: pa.Config(mode="simulated", lag=Lag(p=0.3)), r"lag.p = 0.3 .*'fixed' does not read it.*'geometric'"),
    (lambda: pa.Config(mode="simulated", lag=Lag(slowdown=8)), r"lag.slowdown = 8 .*'straggler'"),
    (lambda: pa.Config(mode="simulated", lag=Lag(seed=3)), r"lag.seed = 3 .*'geometric', 'uniform'"),
    (lambda: pa.Config(num_samplers=4), r"^num_samplers = 4 has no effect.*mode='sync'"),
    (lambda: pa.Config(mode="simulated", threaded=Th(refresh_lag=3)), r"threaded.refresh_lag = 3 .*mode='simulated'"),
    (lambda: pa.Config(threaded=Th(buffer_capacity=1000)), r"threaded.buffer_capacity = 1000 has no effect"),
    (lambda: pa.Config(mode="threaded", threaded=Th(latency_jitter=0.2)), r"threaded.latency_jitter = 0.2 .*empty"),
    (lambda: pa.Config(ppo=PPO(rho_bar=2.0)), r"ppo.rho_bar = 2.0 .*vtrace"),
    (lambda: pa.Config(ppo=PPO(c_bar=0.5)), r"ppo.c_bar = 0.5 .*vtrace"),
    (lambda: pa.Config(checkpoint_every_steps=5000), r"checkpoint_every_steps = 5000 has no effect.*run_dir"),
    (lambda: pa.Config(keep_checkpoints=1), r"keep_checkpoints = 1 has no effect"),
    (lambda: pa.Config(overwrite=True), r"overwrite = True has no effect"),
    (lambda: pa.Config(plots=True), r"plots = True has no effect.*no run_dir to write the plots into"),
]


@pytest.mark.parametrize("make, message", BAD_API_INPUTS, ids=[str(i) for i in range(len(BAD_API_INPUTS))])
def test_bad_api_input_is_a_config_error_naming_the_field(make, message):
    with pytest.raises(pa.ConfigError, match=message):
        make()


def test_fields_that_act_are_accepted():
    pa.Config(lag=Lag(max_lag=2))  # the stale filter acts in every mode
    pa.Config(mode="threaded", lag=Lag(max_lag=1), num_samplers=4, threaded=Th(latency_jitter=0.1,
                                                               sampler_step_latency_ms=(1.0,) * 4))
    pa.Config(mode="simulated", num_samplers=2, lag=Lag(schedule="uniform", low=1, high=3, seed=2))
    pa.Config(ppo=PPO(advantage_estimator="vtrace", rho_bar=2.0, c_bar=0.5))
    pa.Config(run_dir="somewhere", checkpoint_every_steps=5000, keep_checkpoints=1, overwrite=True)


BAD_CLI_INPUTS = [
    (["--lag.K", "8"], "--lag.K = 8 has no effect"),  # the CLI names the user's flags (issue 27)
    (["--num-samplers", "4"], "--num-samplers = 4 has no effect"),
    (["--threaded.refresh-lag", "4"], "--threaded.refresh-lag = 4 has no effect"),
    (["--mode", "simulated", "--lag.schedule", "uniform", "--lag.K", "2"], "--lag.K = 2"),
    (["--ppo.rho-bar", "2.0"], "--ppo.rho-bar = 2.0"),
    (["--mode", "threaded", "--threaded.latency-jitter", "0.5"], "--threaded.latency-jitter = 0.5"),
    (["--ppo.gamma", "0"], "--ppo.gamma"),
]


@pytest.mark.parametrize("args, needle", BAD_CLI_INPUTS, ids=[str(i) for i in range(len(BAD_CLI_INPUTS))])
def test_bad_cli_input_exits_2_with_one_line(cli_main, tmp_path, args, needle):
    proc = cli_main(["train", "--run-dir", str(tmp_path / "r"), *args])
    assert proc.returncode == 2, proc
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing was written


def test_run_dir_that_is_a_file_is_refused_before_compiling(tmp_path, cli_main):
    path = tmp_path / "a_file"
    path.write_text("x")
    proc = cli_main(["train", "--run-dir", str(path), "--quiet"])
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr, proc
    assert "compile" not in proc.stdout
    with pytest.raises(pa.ConfigError, match="is a file"):
        pa.train(pa.Config(**TINY, run_dir=str(path)))


# ---------------------------------------------------------------- sweeps


@pytest.mark.parametrize("key, values, needle", [
    ("mode", ["sync", "threaded"], "one sweep per mode"),
    ("num_seeds", [2], "seeds="),
    ("seed", [0, 1], "seeds="),
    ("run_dir", ["a", "b"], "save_sweep"),
    ("checkpoint_every_steps", [64], "no checkpoints"),
    ("checkpoint_every", [1], "no checkpoints"),
])
def test_sweep_refuses_keys_it_cannot_honour(key, values, needle):
    with pytest.raises(pa.ConfigError, match=rf"grid key '{key}' cannot be swept.*{needle}"):
        pa.sweep(pa.Config(**TINY), {key: values})


def test_sweep_of_threaded_knobs_outside_threaded_mode_is_an_error():
    with pytest.raises(pa.ConfigError, match="threaded.refresh_lag = 4 has no effect.*mode='simulated'"):
        pa.sweep(pa.Config(**TINY), {"threaded.refresh_lag": [4, 2]})


def test_grid_points_are_set_at_once_in_any_key_order():
    df = pa.sweep(pa.Config(**TINY, mode="simulated"),
                  {"ppo.rho_bar": [2.0], "ppo.advantage_estimator": ["vtrace"]}, progress=False)
    assert set(df["ppo.advantage_estimator"]) == {"vtrace"} and len(df) == 4


def test_threaded_sweep_runs_real_threaded_runs_and_reuses_compiles(capsys):
    base = pa.Config(**{**TINY, "total_env_steps": 8 * 64}, mode="threaded")
    grid = {"num_samplers": [1, 2], "threaded.refresh_lag": [1, 2]}
    df = pa.sweep(base, grid, seeds=2)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("sweep run ")]
    assert len(lines) == 8 and lines[0].startswith("sweep run 1/8: config 0") and "final return" in lines[0]
    assert df.attrs["strategy"] == "threaded" and df.attrs["compiles"] == 1  # only thread knobs differ
    sizes = df.groupby(list(grid) + ["seed"]).size()
    assert len(sizes) == 8 and set(sizes) == {8}
    # real threaded rows: per-sampler columns, sampler ids within range, the accounting identity
    two = df[df["num_samplers"] == 2]
    assert set(two["sampler_id"]) <= {0, 1} and set(df[df["num_samplers"] == 1]["sampler_id"]) == {0}
    assert "sampler_wait_buffer_s" in df.columns and "sampler_forced_refreshes" in df.columns
    ok = df.samples_produced == df.samples_consumed + df.samples_dropped + df.samples_resident
    assert ok.all()
    # seeds differ (own env and param keys), configs keep their grid labels
    first = df[(df.config_id == 0) & (df.iteration == 1)]
    assert sorted(first.seed) == [0, 1] and first.policy_loss.nunique() == 2


def test_sweep_dataframe_groups_by_grid_keys_and_round_trips_csv(tmp_path):
    grid = {"ppo.dual_clip": [None, 3.0], "lag.max_lag": [None, 1]}
    df = pa.sweep(pa.Config(**TINY, mode="simulated"), grid, seeds=2, progress=False)
    sizes = df.groupby(list(grid)).size()
    assert len(sizes) == 4 and set(sizes) == {2 * 4}  # one group per config; None is inf, not NaN
    assert sorted(set(df["ppo.dual_clip"])) == [3.0, math.inf]
    assert df.attrs["none_as_inf"] == ["ppo.dual_clip", "lag.max_lag"]
    for name in ("sweep.csv", "sweep.jsonl"):
        save_sweep(df, tmp_path / name)
        back = load_sweep(tmp_path / name)
        assert len(back.groupby(list(grid)).size()) == 4
        assert back["lag_histogram"].tolist() == df["lag_histogram"].tolist()  # list cells survive as lists
        np.testing.assert_array_equal(back["approx_kl"].to_numpy(), df["approx_kl"].to_numpy())


# ---------------------------------------------------------------- run directories


def test_a_run_dir_holding_a_run_is_refused_unless_overwrite(tmp_path):
    run_dir = str(tmp_path / "r")
    pa.train(pa.Config(**TINY, run_dir=run_dir))
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    with pytest.raises(pa.ConfigError, match=r"already holds a run.*overwrite=True \(CLI: --overwrite\)"):
        pa.train(pa.Config(**TINY, run_dir=run_dir, seed=1))
    assert read_jsonl(os.path.join(run_dir, "metrics.jsonl")) == rows  # untouched
    pa.train(pa.Config(**TINY, run_dir=run_dir, seed=1, overwrite=True))
    assert read_jsonl(os.path.join(run_dir, "metrics.jsonl"))[0]["seed"] == 1


def test_resuming_a_complete_run_says_so_and_a_larger_total_extends_it(tmp_path):
    run_dir = str(tmp_path / "r")
    base = pa.Config(**TINY, run_dir=run_dir, checkpoint_every_steps=2 * 64)
    pa.train(base)
    other = str(tmp_path / "s")
    shutil.copytree(run_dir, other)  # the same finished run, extended again below
    with pytest.raises(pa.ConfigError, match=r"is complete: 4 of 4 learner iterations.*--total-env-steps"):
        pa.resume(run_dir)
    with pytest.raises(pa.ConfigError, match="extended, not shortened"):
        pa.resume(run_dir, total_env_steps=2 * 64)
    extended = pa.resume(run_dir, total_env_steps=7 * 64)
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    assert [r["iteration"] for r in rows] == list(range(1, 8))
    assert pa.load(run_dir).iteration == 7
    assert len(extended.metrics) == 7
    # annealing follows the new total from the resumed iteration on (documented)
    lr = base.ppo.learning_rate
    assert rows[4]["learning_rate"] == pytest.approx(lr * (1 - 4 / 7), rel=1e-5)
    # the same extension twice gives the same rows
    pa.resume(other, total_env_steps=7 * 64)
    again = read_jsonl(os.path.join(other, "metrics.jsonl"))
    for a, b in zip(rows, again):
        assert {k: a[k] for k in ("policy_loss", "value_loss", "approx_kl", "episode_return")} == \
            {k: b[k] for k in ("policy_loss", "value_loss", "approx_kl", "episode_return")}


# ---------------------------------------------------------------- entropy with masked actions


def test_categorical_entropy_of_masked_logits_is_the_entropy_of_the_rest():
    masked = jnp.array([[1.0, -jnp.inf, 0.0, -jnp.inf], [0.0, 0.0, 0.0, -jnp.inf]])
    p = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    expected = [-(p * np.log(p)).sum(), math.log(3.0)]  # hand values: 2 and 3 remaining actions
    np.testing.assert_allclose(categorical_entropy(masked), expected, rtol=1e-6)
    np.testing.assert_allclose(categorical_entropy(masked[:, :3][:1, [0, 2]]), expected[:1], rtol=1e-6)
    grad = jax.grad(lambda l: categorical_entropy(l).sum())(masked)
    assert np.isfinite(np.asarray(grad)).all() and float(grad[0, 1]) == 0.0


# ---------------------------------------------------------------- warnings, eval during training


def test_run_health_windows_drops_and_counts_the_kl_streak():
    from ppo_async.report.health import RunHealth, first_warnings, short_warning

    health = RunHealth(window=2)
    # cumulative counters per iteration: (consumed, dropped)
    counts = [(64, 0), (64, 64), (64, 192), (128, 192), (192, 192)]
    kls = [0.01, 0.04, 0.05, 0.06, 0.07]
    out = [health.update({"samples_consumed": c, "samples_dropped": d, "approx_kl": k, "iteration": i + 1})
           for i, ((c, d), k) in enumerate(zip(counts, kls))]
    # window of 2 iterations: deltas over the last two rows
    # window of 2 iterations (the first rows count from the start): d(dropped) / d(consumed + dropped)
    assert [o["dropped_fraction_window"] for o in out] == pytest.approx([0.0, 64 / 64, 192 / 192, 128 / 192, 0.0])
    assert [o["kl_high_streak"] for o in out] == [0, 1, 2, 3, 4]
    assert out[0]["warning"] == "" and out[4]["warning"] == ""
    assert out[1]["warning"].startswith("100% of the samples of the last 1 iterations")
    assert out[3]["warning"].startswith("67% of the samples of the last 2 iterations")
    health.kl_streak = 4
    row = {**health.update({"samples_consumed": 256, "samples_dropped": 192, "approx_kl": 0.08}), "iteration": 6}
    assert row["warning"].startswith("approx_kl above 0.03 for 5 iterations (now 0.080): the lag is hurting")
    no_lag = RunHealth(kl_streak=4).update({"approx_kl": 0.05, "lag_mean": 0.0})["warning"]
    assert no_lag.startswith("approx_kl above 0.03 for 5 iterations (now 0.050) with no lag: ") and "lag is" not in no_lag
    assert short_warning(row) == "kl>0.03 x5"
    first = first_warnings([{**out[3], "iteration": 4, "seed": 0}, row])
    assert list(first) == ["dropped", "kl"] and first["dropped"].startswith("iteration 4 (seed 0): 67%")


def test_mostly_dropped_run_warns_in_rows_and_result():
    config = pa.Config(**{**TINY, "total_env_steps": 20 * 64}, mode="simulated", lag=Lag(K=8, max_lag=4))
    result = pa.train(config)
    assert any(r["warning"] for r in result.metrics)
    assert result.metrics[-1]["dropped_fraction_window"] > 0.5
    assert len(result.extras["warnings"]) >= 1 and "dropped as stale" in result.extras["warnings"][0]
    clean = pa.train(pa.Config(**TINY))
    assert clean.extras["warnings"] == [] and all(r["warning"] == "" for r in clean.metrics)


def test_eval_every_steps_logs_the_learners_deterministic_return():
    from ppo_async.run.policy import evaluate
    from ppo_async.run.recorder import EVAL_SEED_OFFSET

    config = pa.Config(**{**TINY, "total_env_steps": 5 * 64}, num_seeds=2, eval_every_steps=2 * 64, eval_episodes=3)
    result = pa.train(config)
    evaluated = [(r["iteration"], r["seed"]) for r in result.metrics if r.get("eval_return") is not None]
    assert evaluated == [(2, 0), (2, 1), (4, 0), (4, 1), (5, 0), (5, 1)]  # every 2nd and the last
    for seed_index in (0, 1):
        direct = evaluate(result.policy(seed_index), num_episodes=3, seed=EVAL_SEED_OFFSET + seed_index)
        assert result.metrics[-2 + seed_index]["eval_return"] == pytest.approx(float(direct["returns"].mean()))
    with pytest.raises(pa.ConfigError, match="eval_episodes = 5 has no effect"):
        pa.Config(eval_episodes=5)


def test_block_with_max_lag_holds_samplers_back_instead_of_making_stale_rollouts():
    """The issue's reproduction (8 samplers of 4 x 16 envs, a 1-chunk blocking buffer,
    max_lag 1), at a smaller budget: a sampler reserves a place before a rollout, so with one
    chunk committed at a time (max(1, max_lag) x chunks_per_batch) the other seven wait for
    space instead of making rollouts that the learner would drop or the freshness gate would
    discard; every consumed sample is within max_lag, and the learner publishes every iteration."""
    config = pa.Config(env="Pendulum-v1", mode="threaded", total_env_steps=4000,
                       rollout=Ro(num_envs=4, num_steps=16), ppo=PPO(num_minibatches=4), lag=Lag(max_lag=1),
                       num_samplers=8, threaded=Th(buffer_capacity=64, full_policy="block"))
    rows = pa.train(config).metrics
    last = rows[-1]
    assert last["dropped_stale_total"] == 0 and sum(sum(r["lag_histogram"][2:]) for r in rows) == 0
    # discarded before samplers held back: 86% (25,472 of 29,504 transitions); now a few, where
    # the timing of a loaded machine defeats the estimate
    assert last["dropped_forced_refresh"] <= 0.2 * last["samples_produced"], last["dropped_forced_refresh"]
    assert sum(last["sampler_wait_space_s"]) > 0.0  # the seven without a place waited for one
    assert last["samples_produced"] == last["samples_consumed"] + last["samples_dropped"] + last["samples_resident"]
    versions = [0] + [r["learner_version"] for r in rows]
    published = sum(b > a for a, b in zip(versions, versions[1:]))
    assert published >= 0.95 * len(rows), (published, len(rows))


def test_a_straggler_whose_rollouts_would_be_stale_waits_instead_of_making_them():
    """max_lag 1 with two fast samplers and one whose rollouts take 0.8 s (50 ms per env step):
    the learner publishes many versions during one of them, so after its first rollout (made
    before its duration was known) the straggler holds back while its rollout seconds x the
    learner's versions per second are over max_lag, instead of making rollouts the freshness
    gate would discard: at most one of its rollouts is."""
    config = pa.Config(env="Pendulum-v1", mode="threaded", total_env_steps=64 * 60, seed=3,
                       rollout=Ro(num_envs=4, num_steps=16), ppo=PPO(num_minibatches=2, num_epochs=1), lag=Lag(max_lag=1),
                       num_samplers=3, threaded=Th(buffer_capacity=64 * 4, full_policy="block",
                                                   sampler_step_latency_ms=(0.0, 0.0, 50.0)))
    rows = pa.train(config).metrics
    last = rows[-1]
    assert last["sampler_forced_refreshes"][2] <= 1, last["sampler_forced_refreshes"]  # its rollouts are not thrown away
    assert last["sampler_wait_space_s"][2] > 0.0  # it waited instead
    assert last["dropped_forced_refresh"] <= 0.25 * last["samples_produced"], last["dropped_forced_refresh"]
    assert last["dropped_stale_total"] == 0 and all(sum(r["lag_histogram"][2:]) == 0 for r in rows)


def test_a_sampler_stuck_in_the_env_is_named_in_a_timeout_error(monkeypatch, tmp_path):
    import threading

    from ppo_async.modes import threaded

    release = threading.Event()
    real_setup = threaded.make_threaded_setup

    def setup_with_a_hanging_env(config, resume=None):
        setup = real_setup(config, resume)
        rollout_fn, calls = setup.rollout_fn, []

        def rollout_that_hangs(*args):
            if threading.current_thread().name == "ppo_async-sampler-1":
                calls.append(1)
                if len(calls) > 2:
                    release.wait()  # foreign code that never returns (until the test ends)
            return rollout_fn(*args)

        setup.rollout_fn = rollout_that_hangs
        return setup

    monkeypatch.setattr(threaded.run, "make_threaded_setup", setup_with_a_hanging_env)
    monkeypatch.setattr(threaded.run, "JOIN_TIMEOUT_S", 1.0)
    config = pa.Config(**{**TINY, "total_env_steps": 30 * 64}, mode="threaded", run_dir=str(tmp_path / "r"),
                       num_samplers=2, threaded=Th(timeout_s=2.0, sampler_step_latency_ms=(0.0, 0.0)))
    try:
        with pytest.raises(TimeoutError) as info:
            pa.train(config)  # sampler 0 feeds the learner to the end; sampler 1 never comes back
    finally:
        release.set()
    text = str(info.value) + " ".join(getattr(info.value, "__notes__", []))
    assert "ppo_async-sampler-1 (in rollout for" in text and "cannot be killed" in text, text
    rows = read_jsonl(tmp_path / "r" / "metrics.jsonl")
    assert len(rows) == 30 and os.path.isfile(tmp_path / "r" / "version_schedule.jsonl")  # finalised
    assert pa.load(tmp_path / "r").iteration == 30


def test_config_files_accept_dotted_keys_as_well_as_nested_ones(cli_main, tmp_path):
    from ppo_async.cli import nest_dotted_keys

    assert nest_dotted_keys({"ppo.gamma": 0.9, "ppo": {"clip_eps": 0.1}, "env": "CartPole-v1"}) == \
        {"ppo": {"gamma": 0.9, "clip_eps": 0.1}, "env": "CartPole-v1"}
    path = tmp_path / "c.json"
    path.write_text('{"env": "CartPole-v1", "ppo.gamma": 0.9, "rollout": {"num_envs": 4}, "rollout.num_steps": 16}')
    proc = cli_main(["train", "--config", str(path), "--run-dir", str(tmp_path / "r"), "--ppo.num-minibatches", "2",
                     "--ppo.num-epochs", "1", "--total-env-steps", "128", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    import json

    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["ppo"]["gamma"] == 0.9 and saved["rollout"]["num_envs"] == 4 and saved["rollout"]["num_steps"] == 16
