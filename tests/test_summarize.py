"""analysis.summarize / lag_histogram_of / per_sampler on hand-made metrics rows (every number
below is worked out by hand in the comments), a real TrainResult, and a sweep-shaped frame."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

import ppo_async as pa
from ppo_async.report import analysis, plots

NAN = float("nan")


def two_seeds() -> pd.DataFrame:
    """2 seeds x 4 iterations (the last 10% of 4 iterations is the last one)."""
    rows = []
    per_seed = {
        0: dict(ret=[1.0, None, 5.0, 10.0], kl=[0.01, 0.02, 0.03, 0.04], lag=[0, 1, 2, 3], lag_max=[0, 2, 4, 6],
                dropped=[0, 0, 16, 32]),
        1: dict(ret=[2.0, 8.0, 12.0, 20.0], kl=[0.05, 0.06, 0.07, None], lag=[1, 1, 1, 1], lag_max=[1, 1, 1, 9],
                dropped=[0, 0, 0, 0]),
    }
    for i in range(4):
        for seed, v in per_seed.items():
            rows.append({
                "seed": seed, "iteration": i + 1, "env_steps": 100 * (i + 1), "wall_time": 0.5 * (i + 1),
                "steps_per_second": 100.0 * (i + 1), "episode_return": v["ret"][i], "approx_kl": v["kl"][i],
                "lag_mean": float(v["lag"][i]), "lag_max": v["lag_max"][i],
                "samples_consumed": 64 * (i + 1), "samples_dropped": v["dropped"][i],  # running totals
            })
    return pd.DataFrame(rows)


def test_summarize_one_run_pools_seeds():
    table = pa.summarize(two_seeds())
    assert list(table.columns) == ["num_seeds", "final_return_mean", "final_return_std", "approx_kl_mean",
                                   "ess_fraction_mean", "lag_mean_mean", "lag_max", "env_steps_per_s", "dropped_fraction"]
    assert np.isnan(table["ess_fraction_mean"].iloc[0])  # a metric not in the rows is NaN
    with_ess = pa.summarize(two_seeds().assign(ess_fraction=[1.0, 0.5] * 4))
    assert with_ess["ess_fraction_mean"].iloc[0] == pytest.approx(0.75)
    row = table.iloc[0]
    assert len(table) == 1 and row["num_seeds"] == 2
    assert row["final_return_mean"] == pytest.approx(15.0)  # seeds' last rows: 10 and 20
    assert row["final_return_std"] == pytest.approx(5.0)  # population std of (10, 20)
    assert row["approx_kl_mean"] == pytest.approx(0.28 / 7)  # 7 finite values summing to 0.28
    assert row["lag_mean_mean"] == pytest.approx(10 / 8)  # (0+1+2+3 + 4 * 1) / 8
    assert row["lag_max"] == 9
    assert row["env_steps_per_s"] == pytest.approx(250.0)
    # running totals at each seed's last row: dropped 32 + 0, consumed 256 + 256
    assert row["dropped_fraction"] == pytest.approx(32 / (512 + 32))


def test_summarize_threshold_median_and_reached():
    df = two_seeds()
    # >= 8: seed 0 first at 400 env steps, seed 1 at 200 -> median 300, both reach
    row = pa.summarize(df, threshold=8).iloc[0]
    assert row["steps_to_threshold_median"] == 300 and row["reached"] == "2/2"
    # >= 15: only seed 1 (at 400); the median is over the seeds that reach it
    row = pa.summarize(df, threshold=15).iloc[0]
    assert row["steps_to_threshold_median"] == 400 and row["reached"] == "1/2"
    row = pa.summarize(df, threshold=100).iloc[0]
    assert math.isnan(row["steps_to_threshold_median"]) and row["reached"] == "0/2"
    assert list(pa.summarize(df, threshold=8).columns)[3:5] == ["steps_to_threshold_median", "reached"]


def test_summarize_by_seed():
    table = pa.summarize(two_seeds(), threshold=8, by_seed=True)
    assert list(table["seed"]) == [0, 1] and list(table["num_seeds"]) == [1, 1]
    np.testing.assert_allclose(table["final_return_mean"], [10.0, 20.0])
    np.testing.assert_allclose(table["final_return_std"], [0.0, 0.0])
    np.testing.assert_allclose(table["steps_to_threshold_median"], [400, 200])
    assert list(table["reached"]) == ["1/1", "1/1"]
    np.testing.assert_allclose(table["approx_kl_mean"], [0.025, 0.06])
    np.testing.assert_allclose(table["lag_mean_mean"], [1.5, 1.0])
    np.testing.assert_allclose(table["lag_max"], [6, 9])
    np.testing.assert_allclose(table["dropped_fraction"], [32 / 288, 0.0])


def test_summarize_last_fraction():
    # last half of 4 iterations: seed 0 mean(5, 10) = 7.5, seed 1 mean(12, 20) = 16
    row = pa.summarize(two_seeds(), last_fraction=0.5).iloc[0]
    assert row["final_return_mean"] == pytest.approx(11.75)
    assert row["final_return_std"] == pytest.approx(4.25)


def test_summarize_train_result_uses_its_dataframe():
    rows = two_seeds().to_dict("records")
    result = pa.TrainResult(config=pa.Config(), train_state=None, metrics=rows, compile_seconds=0.0, run_seconds=1.0)
    table = pa.summarize(result, threshold=8)
    pd.testing.assert_frame_equal(table, pa.summarize(pd.DataFrame(rows), threshold=8))
    assert table.iloc[0]["final_return_mean"] == pytest.approx(float(np.mean(result.final_returns())))


def sweep_frame(attrs: bool = True) -> pd.DataFrame:
    frames = []
    for config_id, (k, clip) in enumerate([(0, None), (4, 3.0)]):
        for seed in (0, 1):
            df = two_seeds()
            df = df[df["seed"] == seed].assign(config_id=config_id, **{"lag.K": k, "ppo.dual_clip": clip})
            df["episode_return"] = pd.to_numeric(df["episode_return"]) + 100 * config_id
            frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    if attrs:
        df.attrs["grid"] = {"lag.K": [0, 4], "ppo.dual_clip": [None, 3.0]}
    return df


def test_summarize_sweep_one_row_per_config_with_grid_columns():
    table = pa.summarize(sweep_frame(), threshold=8)
    assert list(table.columns[:3]) == ["config_id", "lag.K", "ppo.dual_clip"]
    assert list(table["config_id"]) == [0, 1] and list(table["lag.K"]) == [0, 4]
    assert table["ppo.dual_clip"].iloc[0] is None or math.isnan(table["ppo.dual_clip"].iloc[0])
    assert table["ppo.dual_clip"].iloc[1] == 3.0
    np.testing.assert_allclose(table["final_return_mean"], [15.0, 115.0])
    np.testing.assert_allclose(table["final_return_std"], [5.0, 5.0])
    # config 1 returns are +100: every seed reaches 8 at its first finite row (100 steps; seed 0's
    # second row is None)
    np.testing.assert_allclose(table["steps_to_threshold_median"], [300, 100])
    assert list(table["num_seeds"]) == [2, 2]
    by_seed = pa.summarize(sweep_frame(), by_seed=True)
    assert list(by_seed.columns[:4]) == ["config_id", "lag.K", "ppo.dual_clip", "seed"]
    assert list(zip(by_seed["config_id"], by_seed["seed"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    np.testing.assert_allclose(by_seed["final_return_mean"], [10, 20, 110, 120])
    # Without attrs the grid columns are unknown: config_id only.
    assert list(pa.summarize(sweep_frame(attrs=False)).columns[:2]) == ["config_id", "num_seeds"]


def test_summarize_of_a_saved_and_loaded_sweep(tmp_path):
    df = sweep_frame()
    pa.save_sweep(df, tmp_path / "s.jsonl")
    table = pa.summarize(pa.load_sweep(tmp_path / "s.jsonl"))
    assert list(table["lag.K"]) == [0, 4]
    np.testing.assert_allclose(table["final_return_mean"], [15.0, 115.0])


def test_missing_columns_are_nan_not_errors():
    df = pd.DataFrame({"seed": [0, 0], "iteration": [1, 2], "env_steps": [10, 20], "episode_return": [1.0, 3.0]})
    row = pa.summarize(df, threshold=2).iloc[0]
    assert row["final_return_mean"] == 3.0 and row["steps_to_threshold_median"] == 20 and row["reached"] == "1/1"
    for name in ("approx_kl_mean", "lag_mean_mean", "lag_max", "env_steps_per_s", "dropped_fraction"):
        assert math.isnan(row[name]), name
    row = pa.summarize(pd.DataFrame({"approx_kl": [0.5, 1.5]}), threshold=2).iloc[0]  # no seed, no returns
    assert row["num_seeds"] == 1 and row["approx_kl_mean"] == 1.0
    assert math.isnan(row["final_return_mean"]) and row["reached"] == "0/1"


def test_summarize_errors():
    with pytest.raises(ValueError, match="TrainResult or a pandas DataFrame.*list"):
        pa.summarize([{"seed": 0}])
    with pytest.raises(ValueError, match="no rows"):
        pa.summarize(two_seeds().iloc[:0])
    for bad in ("high", NAN, True):
        with pytest.raises(ValueError, match="threshold"):
            pa.summarize(two_seeds(), threshold=bad)
    with pytest.raises(ValueError, match=r"by_seed=True\) needs a .seed. column"):
        pa.summarize(two_seeds().drop(columns="seed"), by_seed=True)
    with pytest.raises(ValueError, match="last_fraction"):
        pa.summarize(two_seeds(), last_fraction=0)


def test_lag_histogram_of_sums_and_pads():
    df = pd.DataFrame({"lag_histogram": [[5, 3, 0, 1], [2, 2, 2, 2], None, [1, 0, 0, 0]]})
    np.testing.assert_array_equal(pa.lag_histogram_of(df), [8, 5, 2, 3])
    np.testing.assert_array_equal(plots.summed_lag_histogram(df), [8, 5, 2, 3])  # the same function
    np.testing.assert_array_equal(pa.lag_histogram_of(pd.DataFrame({"lag_histogram": [[1, 2], [3]]})), [4, 2])
    with pytest.raises(ValueError, match="'lag_histogram' is not in the DataFrame"):
        pa.lag_histogram_of(two_seeds())
    with pytest.raises(ValueError, match="no list-valued rows"):
        pa.lag_histogram_of(pd.DataFrame({"lag_histogram": [None, None]}))


def test_per_sampler_scalar_and_multi_chunk_rows():
    df = pd.DataFrame([
        {"sampler_id": 0, "behavior_version": 4, "lag_mean": 1.0, "lag_max": 1, "approx_kl": 0.01},
        {"sampler_id": 1, "behavior_version": 3, "lag_mean": 3.0, "lag_max": 3, "approx_kl": 0.03},
        {"sampler_id": 0, "behavior_version": 5, "lag_mean": 2.0, "lag_max": 2, "approx_kl": 0.02},
        # two chunks: versions 5 and 3, oldest lag 5 -> sampler 0 lag 5 - (5 - 3) = 3, sampler 1 lag 5
        {"sampler_id": [0, 1], "behavior_version": [5, 3], "lag_mean": 4.0, "lag_max": 5, "approx_kl": 0.05},
        # two chunks of sampler 1, both version 2 at lag 4
        {"sampler_id": [1, 1], "behavior_version": [2, 2], "lag_mean": 4.0, "lag_max": 4, "approx_kl": 0.1},
    ])
    table = pa.per_sampler(df)
    assert list(table.index) == [0, 1] and table.index.name == "sampler_id"
    assert list(table.columns) == ["lag_mean", "lag_max", "approx_kl_mean", "rows", "chunks"]
    np.testing.assert_allclose(table["lag_mean"], [(1 + 2 + 3) / 3, (3 + 5 + 4 + 4) / 4])
    np.testing.assert_allclose(table["lag_max"], [3, 5])
    np.testing.assert_allclose(table["approx_kl_mean"], [(0.01 + 0.02 + 0.05) / 3, (0.03 + 0.05 + 0.1 + 0.1) / 4])
    assert list(table["rows"]) == [3, 3] and list(table["chunks"]) == [3, 4]


def test_per_sampler_without_versions_or_lag_columns():
    df = pd.DataFrame({"sampler_id": [0, [0, 1]], "lag_mean": [2.0, 1.0]})
    table = pa.per_sampler(df)
    np.testing.assert_allclose(table["lag_mean"], [1.5, 1.0])  # the row's lag_mean for each of its chunks
    assert table["approx_kl_mean"].isna().all()
    with pytest.raises(ValueError, match="'sampler_id' column"):
        pa.per_sampler(two_seeds())
    with pytest.raises(ValueError, match="names a sampler"):
        pa.per_sampler(pd.DataFrame({"sampler_id": [None, None]}))


def test_exported_names():
    assert pa.summarize is analysis.summarize
    assert {"summarize", "lag_histogram_of", "per_sampler"} <= set(pa.__all__)
