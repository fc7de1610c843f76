"""`ppo_async.study.sweep`: one compile per shape group, tidy rows, equality with `train`,
vmap vs loop, save/load round trip, argument errors.

The 12-config x 2-seed grid runs once per strategy (module fixtures, 4 iterations each).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import ppo_async as pa
from ppo_async.study.sweep import expand_grid, static_key

BATCH = 64
ITERATIONS = 4
BASE = pa.Config(
    env="Pendulum-v1",
    total_env_steps=BATCH * ITERATIONS,
    rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=2, num_minibatches=4),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)
GRID = {"lag.K": [0, 1, 3], "ppo.dual_clip": [None, 3.0], "ppo.clip_eps": [0.2, 0.1]}
SEEDS = [3, 4]
NUM_CONFIGS = 12
FLOAT_METRICS = [
    "policy_loss", "value_loss", "entropy", "approx_kl", "approx_kl_max", "clip_fraction",
    "dual_clip_fraction", "ratio_mean", "ratio_std", "ratio_max", "grad_norm", "learning_rate",
    "explained_variance", "lag_mean", "value_updated",
]


@pytest.fixture(scope="module")
def loop_df():
    return pa.sweep(BASE, GRID, seeds=SEEDS, strategy="loop")


@pytest.fixture(scope="module")
def vmap_df():
    return pa.sweep(BASE, GRID, seeds=SEEDS, strategy="vmap")


def grid_point(config_id: int) -> dict:
    return dict(zip(GRID, list(itertools.product(*GRID.values()))[config_id]))


@pytest.mark.parametrize("which", ["loop", "vmap"])
def test_one_compile_one_trace_and_tidy_rows(which, loop_df, vmap_df):
    df = loop_df if which == "loop" else vmap_df
    assert df.attrs["none_as_inf"] == ["ppo.dual_clip"]
    groups = df.groupby(list(GRID)).size()  # plain groupby: one group per config, none lost to NaN keys
    assert len(groups) == NUM_CONFIGS and set(groups) == {len(SEEDS) * ITERATIONS}
    assert df.attrs["strategy"] == which
    assert df.attrs["compiles"] == 1 and df.attrs["traces"] == 1
    assert df.attrs["seeds"] == SEEDS and df.attrs["grid"] == GRID
    assert df.attrs["compile_seconds"] > 0 and df.attrs["run_seconds"] > 0
    assert len(df) == NUM_CONFIGS * len(SEEDS) * ITERATIONS
    for col in ("config_id", "lag.K", "ppo.dual_clip", "ppo.clip_eps", "seed", "iteration", "approx_kl", "lag_mean",
                "kl_per_lag", "lag_histogram", "samples_produced", "samples_consumed"):
        assert col in df.columns, col
    # sorted by config, seed, iteration; every (config, seed) has iterations 1..I
    keys = list(zip(df.config_id, df.seed, df.iteration))
    assert keys == sorted(keys)
    assert sorted(set(keys)) == keys
    assert set(df.config_id) == set(range(NUM_CONFIGS))
    for config_id, group in df.groupby("config_id"):
        point = grid_point(config_id)
        assert group["lag.K"].unique().tolist() == [point["lag.K"]]
        assert group["ppo.clip_eps"].unique().tolist() == [point["ppo.clip_eps"]]
        dual = group["ppo.dual_clip"].unique().tolist()
        assert dual == ([math.inf] if point["ppo.dual_clip"] is None else [3.0]), dual  # None -> inf: groupable
        assert group.seed.tolist() == [3] * ITERATIONS + [4] * ITERATIONS
        assert group.iteration.tolist() == [1, 2, 3, 4] * 2
        # each config consumed its own lag schedule (ring sized for the group's largest lag)
        K = point["lag.K"]
        assert group.lag_mean.tolist() == [float(min(K, i)) for i in range(ITERATIONS)] * 2
        assert all(len(h) == 4 for h in group.lag_histogram)
        if point["ppo.dual_clip"] is None:
            assert (group.dual_clip_fraction == 0).all()
    assert np.all(np.isfinite(df[FLOAT_METRICS].to_numpy()))


def test_configs_differ_where_their_knobs_act(loop_df):
    # config ids follow the grid order: K major, then dual_clip, then clip_eps
    assert grid_point(0) == {"lag.K": 0, "ppo.dual_clip": None, "ppo.clip_eps": 0.2}
    assert grid_point(9) == {"lag.K": 3, "ppo.dual_clip": None, "ppo.clip_eps": 0.1}
    assert grid_point(11) == {"lag.K": 3, "ppo.dual_clip": 3.0, "ppo.clip_eps": 0.1}
    by = {c: g.reset_index(drop=True) for c, g in loop_df.groupby("config_id")}
    lag0, lag3 = by[0], by[8]  # same seeds and clip, K = 0 vs 3
    first = (lag0.iteration == 1).to_numpy()
    # iteration 1 is lag 0 in both: bit for bit; later iterations see stale data
    np.testing.assert_array_equal(lag0.policy_loss.to_numpy()[first], lag3.policy_loss.to_numpy()[first])
    assert not np.any(lag0.policy_loss.to_numpy()[~first] == lag3.policy_loss.to_numpy()[~first])
    # at K=3 some ratios leave [0.9, 1.1]: clip 0.1 vs 0.2 changes the run
    assert by[9].clip_fraction.max() > 0
    assert not np.array_equal(by[8][FLOAT_METRICS].to_numpy(), by[9][FLOAT_METRICS].to_numpy())
    # dual clip 3.0 acts only where a ratio exceeds 3; below that it is plain PPO, bit for bit
    for plain in (0, 1, 4, 5, 8, 9):
        dual = plain + 2
        assert by[dual].ratio_max.max() < 3.0 and (by[dual].dual_clip_fraction == 0).all()
        np.testing.assert_array_equal(by[plain][FLOAT_METRICS].to_numpy(), by[dual][FLOAT_METRICS].to_numpy())


def test_loop_rows_equal_train_of_the_same_config(loop_df):
    """Sweep (loop) rows of a config are pa.train of that config with the same seeds, bit for bit."""
    config_id = 4  # K=1, dual_clip None, clip 0.2: its own ring would be 2, the group's is 4
    assert grid_point(config_id) == {"lag.K": 1, "ppo.dual_clip": None, "ppo.clip_eps": 0.2}
    config = BASE.replace(mode="simulated", seed=SEEDS[0], num_seeds=len(SEEDS), lag=pa.LagConfig(K=1))
    trained = pa.train(config).to_dataframe().sort_values(["seed", "iteration"], kind="stable").reset_index(drop=True)
    swept = loop_df[loop_df.config_id == config_id].reset_index(drop=True)
    assert trained.seed.tolist() == swept.seed.tolist()
    assert trained.iteration.tolist() == swept.iteration.tolist()
    for col in FLOAT_METRICS:
        assert np.array_equal(trained[col].to_numpy(), swept[col].to_numpy()), col
    for col in ("learner_version", "sgd_steps", "behavior_version", "sampler_id", "samples_consumed", "env_steps"):
        assert trained[col].tolist() == swept[col].tolist(), col
    # the histogram is longer in the sweep (group ring 4 vs 2) but holds the same counts
    for short, long in zip(trained.lag_histogram, swept.lag_histogram):
        assert len(short) == 2 and long == short + [0, 0]


def test_vmap_matches_loop(loop_df, vmap_df):
    assert list(loop_df.columns) == list(vmap_df.columns)
    for col in ("config_id", "seed", "iteration", "lag.K", "ppo.clip_eps", "lag_mean", "learner_version"):
        assert loop_df[col].tolist() == vmap_df[col].tolist(), col
    # one batched program vs one per config: equal up to float reassociation
    np.testing.assert_allclose(vmap_df[FLOAT_METRICS].to_numpy(), loop_df[FLOAT_METRICS].to_numpy(),
                               rtol=1e-4, atol=1e-6)


def test_shape_changing_field_splits_compiles():
    grid = {"rollout.num_envs": [4, 8], "lag.K": [0, 2]}
    df = pa.sweep(BASE, grid, seeds=1, strategy="loop")
    assert df.attrs["compiles"] == 2 and df.attrs["traces"] == 2
    assert df.attrs["seeds"] == [BASE.seed]
    # 256 env steps: 4 iterations of 64 (4 envs) or 2 of 128 (8 envs)
    sizes = df.groupby("config_id").size().to_dict()
    assert sizes == {0: 4, 1: 4, 2: 2, 3: 2}
    wide = df[df["rollout.num_envs"] == 8]
    assert wide.env_steps.tolist() == [128, 256, 128, 256]
    k2 = df[(df["rollout.num_envs"] == 8) & (df["lag.K"] == 2)]
    assert k2.lag_mean.tolist() == [0.0, 1.0]


def test_epochs_and_minibatches_share_one_compile_and_match_their_own_runs():
    """A grid over the SGD shape is one compile (`learner.slotted_epochs`: skipped epochs,
    skipped steps, minibatches padded into larger slots), and each config's rows equal those
    of its own plain (static-shape) program; lag K = 1 puts stale-free but lagged samples in."""
    grid = {"ppo.num_epochs": [1, 3], "ppo.num_minibatches": [2, 4], "lag.K": [1]}
    df = pa.sweep(BASE, grid, seeds=SEEDS, strategy="loop", progress=False)
    assert df.attrs["compiles"] == 1 and df.attrs["traces"] == 1
    for epochs, minibatches in ((1, 4), (3, 2)):  # padded slots + a skipped epoch; skipped steps
        rows = df[(df["ppo.num_epochs"] == epochs) & (df["ppo.num_minibatches"] == minibatches)].reset_index(drop=True)
        alone = pa.sweep(BASE, {"ppo.num_epochs": [epochs], "ppo.num_minibatches": [minibatches], "lag.K": [1]},
                         seeds=SEEDS, strategy="loop", progress=False)
        assert alone.attrs["compiles"] == 1
        assert rows.sgd_steps.tolist() == alone.sgd_steps.tolist() == [epochs * minibatches * (i + 1) for i in range(ITERATIONS)] * 2
        np.testing.assert_allclose(rows[FLOAT_METRICS].to_numpy(float), alone[FLOAT_METRICS].to_numpy(float), rtol=1e-5, atol=1e-6)


def test_static_key_groups_traced_fields_together():
    points = expand_grid(BASE, {"ppo.clip_eps": [0.2, 0.1], "lag.max_lag": [None, 2], "ppo.value_update_every": [1, 3],
                                "lag.schedule": ["fixed", "uniform"], "ppo.num_epochs": [1, 2], "ppo.num_minibatches": [2, 4]})
    assert len(points) == 64
    assert len({static_key(cfg) for _, cfg in points}) == 1
    assert all(cfg.mode == "simulated" and cfg.num_seeds == 1 and cfg.run_dir is None for _, cfg in points)
    split = expand_grid(BASE, {"rollout.num_steps": [16, 32], "ppo.advantage_estimator": ["gae", "vtrace"],
                               "num_samplers": [1, 2]})
    assert len({static_key(cfg) for _, cfg in split}) == 8


def test_save_load_round_trip(loop_df, tmp_path):
    path = tmp_path / "out" / "sweep.jsonl"
    pa.save_sweep(loop_df, path)
    back = pa.load_sweep(path)
    assert list(back.columns) == list(loop_df.columns)
    assert len(back) == len(loop_df)
    for col in ("config_id", "seed", "iteration", "lag.K", "learner_version"):
        assert back[col].tolist() == loop_df[col].tolist(), col
    np.testing.assert_array_equal(back[FLOAT_METRICS].to_numpy(), loop_df[FLOAT_METRICS].to_numpy())  # exact
    np.testing.assert_array_equal(back["ppo.clip_eps"].to_numpy(), loop_df["ppo.clip_eps"].to_numpy())
    assert back["ppo.dual_clip"].isna().tolist() == loop_df["ppo.dual_clip"].isna().tolist()
    assert back.lag_histogram.tolist() == loop_df.lag_histogram.tolist()
    for a, b in zip(back.kl_per_lag, loop_df.kl_per_lag):
        assert [v is None for v in a] == [v is None for v in b]
        assert [v for v in a if v is not None] == [v for v in b if v is not None]
    for key in ("strategy", "compiles", "traces", "grid", "seeds"):
        assert back.attrs[key] == loop_df.attrs[key], key
    assert back.attrs["compile_seconds"] == pytest.approx(loop_df.attrs["compile_seconds"])
    # without the sidecar the rows still load
    (tmp_path / "out" / "sweep.jsonl.attrs.json").unlink()
    assert len(pa.load_sweep(path)) == len(loop_df)


def test_argument_errors():
    with pytest.raises(pa.ConfigError, match="strategy = 'pmap'"):
        pa.sweep(BASE, {"lag.K": [0]}, strategy="pmap")
    with pytest.raises(pa.ConfigError, match="grid is empty"):
        pa.sweep(BASE, {})
    with pytest.raises(pa.ConfigError, match=r"grid\['lag.K'\] must be a non-empty list"):
        pa.sweep(BASE, {"lag.K": []})
    with pytest.raises(pa.ConfigError, match="non-empty list"):
        pa.sweep(BASE, {"lag.K": 3})
    with pytest.raises(pa.ConfigError, match="unknown config field 'lag.nope'"):
        pa.sweep(BASE, {"lag.nope": [1]})
    with pytest.raises(pa.ConfigError, match="unknown config field 'nope.K'"):
        pa.sweep(BASE, {"nope.K": [1]})
    with pytest.raises(pa.ConfigError, match="lag.K = -1"):
        pa.sweep(BASE, {"lag.K": [-1]})
    with pytest.raises(pa.ConfigError, match="seeds"):
        pa.sweep(BASE, {"lag.K": [0]}, seeds=[1, 1])
    with pytest.raises(pa.ConfigError, match="must be a mapping"):
        pa.sweep(BASE, [("lag.K", [0])])
