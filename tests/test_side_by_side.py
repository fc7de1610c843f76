"""experiments/brax_side_by_side.py: our preset translated into Brax's PPO trainer's arguments
(the same env steps per update and per run), untranslatable fields refused, sides alternating."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

import ppo_async as pa

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("brax_side_by_side", os.path.join(HERE, "..", "experiments", "brax_side_by_side.py"))
sbs = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = sbs  # dataclasses look the module up while the script's Args is built
SPEC.loader.exec_module(sbs)


def test_brax_batch_equals_ours():
    config = sbs.ours_config("brax/inverted_pendulum", 3, 100_000, 7)
    kw = sbs.brax_kwargs(config, 1000, True)
    # Brax: batch_size * num_minibatches unrolls of unroll_length steps per update
    assert kw["batch_size"] * kw["num_minibatches"] * kw["unroll_length"] == config.batch_size == 64 * 32
    assert kw["num_timesteps"] == config.num_iterations * config.batch_size == 98_304  # 48 whole batches
    assert (kw["num_envs"], kw["num_updates_per_batch"], kw["learning_rate"], kw["discounting"]) == (64, 4, 1e-3, 0.99)
    assert (kw["seed"], kw["num_eval_envs"], kw["deterministic_eval"], kw["episode_length"]) == (3, 7, True, 1000)
    assert kw["bootstrap_on_timeout"] and not sbs.brax_kwargs(config, 1000, False)["bootstrap_on_timeout"]
    nets = sbs.network_kwargs(config)
    assert nets["policy_hidden_layer_sizes"] == (64, 64) and nets["distribution_type"] == "normal"
    assert nets["init_noise_std"] == pytest.approx(1.0)  # exp(init_log_std = 0)


def test_what_brax_cannot_do_is_refused():
    config = pa.config_for_env("gymnasium/Hopper-v5", {"mode": "threaded"})  # normalize_reward
    with pytest.raises(SystemExit, match="rollout.normalize_reward: no counterpart"):
        sbs.check_translatable(config)
    sbs.check_translatable(sbs.ours_config("brax/inverted_pendulum", 0, 100_000, 5))  # the preset itself translates
    odd = pa.config_for_env("brax/inverted_pendulum", {"ppo.num_minibatches": 16, "rollout.num_envs": 24})
    with pytest.raises(SystemExit, match="rollout.num_envs = 24 is invalid"):
        sbs.brax_kwargs(odd, 1000, False)


def test_sides_alternate_and_summary():
    order = sbs.plan(sbs.Args(envs=("a",), seeds=3))
    assert order == [("a", "ppo_async", 0), ("a", "brax", 0), ("a", "brax", 1), ("a", "ppo_async", 1),
                     ("a", "ppo_async", 2), ("a", "brax", 2)]
    rows = [{"env": "a", "side": side, "seed": str(s), "eval_return": str(v), "wall_s": "1"}
            for side, values in (("ppo_async", (100, 300)), ("brax", (200, 200))) for s, v in enumerate(values)]
    lines = sbs.summary_lines(rows, ("a",))
    assert lines[-1].endswith("ours - Brax's mean: +0.0, ours / Brax's: 1.00x")
    negative = [{"env": "a", "side": side, "seed": "0", "eval_return": value, "wall_s": "1"}  # reacher-like returns
                for side, value in (("ppo_async", "-50"), ("brax", "-100"))]
    assert sbs.summary_lines(negative, ("a",))[-1].endswith("ours - Brax's mean: +50.0 (a ratio of returns below 0 means nothing)")
    assert lines[1].split()[2:4] == ["2", "200.0"] and lines[1].split()[-2] == "100.0"  # seeds, mean, worst


def test_time_out_bootstrap_only_where_the_env_reports_it():
    """Brax's bootstrap_on_timeout reads info["time_out"], which only some Brax envs set: asking
    for it elsewhere crashed Brax's trainer (KeyError 'time_out' on brax/inverted_double_pendulum)."""
    pytest.importorskip("brax")
    for env, sets in (("brax/inverted_pendulum", True), ("brax/inverted_double_pendulum", False)):
        config = sbs.ours_config(env, 0, 100_000, 5)
        assert sbs.env_sets_time_out(sbs.brax_env(env, config)[0]) is sets
