"""experiments/ablation.py: each variant's mode and fields over the preset, its table's figures
against hand-computed ones, and only finished variants (with a manifest) in the table."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys

import pandas as pd

import ppo_async as pa

from ppo_async.config.paths import replace_paths
from ppo_async.study import benchmark as bm

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("ablation", os.path.join(HERE, "..", "experiments", "ablation.py"))
ablation = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = ablation  # dataclasses look the module up while the script's Args is built
SPEC.loader.exec_module(ablation)

HOPPER = "gymnasium/Hopper-v5"


def config_of(variant: str):
    mode = ablation.mode_of(variant)
    plan = bm.resolve_plan("mujoco", envs=[HOPPER], modes=[mode], changes=ablation.variant_changes(variant))
    return bm.run_config(plan, HOPPER, mode, 0, None)


def test_async_variants_change_one_thing_of_the_async_mode():
    assert [v for v in ablation.VARIANTS if ablation.mode_of(v) == "async-decoupled"] == ["async", "async+ppo_objective",
                                                                               "async+lag_0", "async+log_std_-0.5",
                                                                               "async+log_std_-0.5+vtrace",
                                                                               "async+log_std_-0.5+lr_1.5e-4",
                                                                               "async+log_std_-0.5+ent_0.01",
                                                                               "async+log_std_-0.5+learner_norm",
                                                                               "async+log_std_-0.5+learner_norm+stats_before_sgd"]
    base = config_of("async")
    assert (base.num_samplers, base.threaded.chunks_per_batch, base.rollout.num_envs) == (4, 4, 4)
    assert (base.threaded.barrier, base.ppo.objective) == (False, "decoupled")
    assert config_of("async+ppo_objective") == replace_paths(base, {"ppo.objective": "ppo"})
    assert config_of("async+lag_0") == replace_paths(base, {"threaded.barrier": True})
    today = config_of("async+log_std_-0.5")
    assert today == replace_paths(base, {"network.init_log_std": -0.5})
    assert config_of("async+log_std_-0.5+vtrace") == replace_paths(today, {"ppo.advantage_estimator": "vtrace"})
    assert config_of("async+log_std_-0.5+lr_1.5e-4") == replace_paths(today, {"ppo.learning_rate": 1.5e-4})
    assert config_of("async+log_std_-0.5+ent_0.01") == replace_paths(today, {"ppo.ent_coef": 0.01})
    # learner-owned normalisation: the factor is the code (the same config), then when it updates
    assert config_of("async+log_std_-0.5+learner_norm") == today
    assert config_of("async+log_std_-0.5+learner_norm+stats_before_sgd") == replace_paths(today, {"rollout.stats_update": "before_sgd"})
    assert base.batch_size == config_of("preset").batch_size == 2048  # the same samples per update as barrier


def test_every_variant_is_measured_against_the_preset_with_log_std_0():
    """The preset took log-std -0.5 after the ablation; its variants keep the value they were run with."""
    assert pa.preset_for(HOPPER)["network.init_log_std"] == -0.5
    assert config_of("preset").network.init_log_std == config_of("async").network.init_log_std == 0.0
    assert config_of("preset+log_std_-0.5").network.init_log_std == -0.5
    published = os.path.join(HERE, "..", "experiments", "results", "ablation")
    finished = [name for name in ablation.VARIANTS if os.path.isfile(os.path.join(published, name, "manifest.json"))]
    assert len(finished) >= 18
    for name in finished:  # each committed variant resumes under today's preset (no ConfigError)
        spec = os.path.join(published, name, "benchmark.json")
        assert os.path.isfile(spec), name  # check_spec would write a missing one
        with open(spec, encoding="utf-8") as f:
            recorded = json.load(f)
        plan = bm.resolve_plan("mujoco", envs=recorded["envs"], modes=[ablation.mode_of(name)],
                               seeds=recorded["seeds"], changes=ablation.variant_changes(name))
        bm.check_spec(os.path.dirname(spec), bm.plan_spec(plan))


def test_barrier_variants_run_one_sampler_at_lag_0():
    for variant in ("preset", "old", "preset-value_clip", "preset+gamma_0.995"):
        assert ablation.mode_of(variant) == "barrier", variant
        config = config_of(variant)
        assert (config.num_samplers, config.threaded.barrier, config.rollout.num_envs) == (1, True, 16)
    assert config_of("preset+gamma_0.995").ppo.gamma == 0.995
    assert config_of("old").ppo.num_epochs == 4 and config_of("preset").ppo.num_epochs == 10


def test_the_table_of_finished_variants_against_hand_computed_figures(tmp_path):
    def write(variant, rows, finished):
        os.makedirs(tmp_path / variant)
        pd.DataFrame(rows).to_csv(tmp_path / variant / "results.csv", index=False)
        if finished:
            (tmp_path / variant / "manifest.json").write_text("{}")

    row = lambda seed, train, evaluation, final=1: {"env": HOPPER, "mode": "barrier", "seed": seed,  # noqa: E731
                                                    "train_return": train, "eval_return": evaluation, "final": final}
    write("preset", [row(0, 1000.0, 2000.0), row(1, 3000.0, 4000.0), row(2, 2000.0, 900.0), row(0, 5.0, 5.0, 0)], True)
    write("async", [row(0, 1.0, 1.0)], False)  # still running: no manifest, so not in the table
    table = ablation.variant_table(ablation.final_rows(str(tmp_path)), {HOPPER: 2000.0})
    assert list(table["variant"]) == ["preset"]
    got = table.iloc[0]
    assert (got["seeds"], got["train_mean"], got["train_worst"], got["eval_mean"], got["eval_worst"]) == (
        3, 2000.0, 1000.0, 2300.0, 900.0)
    assert math.isclose(got["train_std"], 1000.0) and math.isclose(got["vs_cleanrl"], 1.0)  # sample std of 1k/3k/2k
