"""ppo_async.report.analysis: hand-computed numbers on small DataFrames."""

from __future__ import annotations

import ast
import json
import math
import os

import numpy as np
import pandas as pd
import pytest

from ppo_async.report import analysis

NAN = float("nan")


def runs() -> pd.DataFrame:
    """Three seeds x 10 iterations of 100 env steps; rows interleaved by seed (as a vmapped run).

    seed 0: returns -10, -9, ..., -1 (reaches -5 at iteration 5 = 600 env steps)
    seed 1: all -100 except NaN at iterations 8 and 9 (never reaches -5)
    seed 2: NaN, NaN, -60 (300 env steps), -50 x 5, -40, -20
    """
    rows = []
    seed1 = [-100.0] * 8 + [NAN, NAN]
    seed2 = [NAN, NAN, -60.0, -50, -50, -50, -50, -50, -40, -20]
    for it in range(10):
        for seed, ret in ((2, seed2[it]), (0, -10.0 + it), (1, seed1[it])):  # seed order unsorted
            rows.append(
                {
                    "seed": seed,
                    "iteration": it,
                    "env_steps": 100 * (it + 1),
                    "wall_time": 0.5 * (it + 1) + seed,
                    "episode_return": ret,
                }
            )
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- first_reach


def test_first_reach_values():
    df = runs()
    s0 = df[df.seed == 0]
    assert analysis.first_reach(s0, -5.0) == (600.0, 3.0)
    assert analysis.first_reach(s0, -10.0) == (100.0, 0.5)  # >=, not >
    assert analysis.first_reach(s0, -0.5) == (math.inf, math.inf)
    s2 = df[df.seed == 2]
    assert analysis.first_reach(s2, -60.0) == (300.0, 3.5)  # leading NaNs never count
    assert analysis.first_reach(df[df.seed == 1], -100.0) == (100.0, 1.5)
    assert analysis.first_reach(df[df.seed == 1], -99.0) == (math.inf, math.inf)


def test_first_reach_types_and_other_column():
    df = runs()
    steps, wall = analysis.first_reach(df[df.seed == 0], -5.0)
    assert type(steps) is float and type(wall) is float
    df["approx_kl"] = [0.001 * i for i in range(len(df))]
    # row 12 (iteration 4, seed 2) is the first with approx_kl >= 0.0115
    assert analysis.first_reach(df, 0.0115, column="approx_kl") == (500.0, 4.5)


def test_first_reach_without_wall_time():
    df = runs().drop(columns="wall_time")
    assert analysis.first_reach(df[df.seed == 0], -5.0) == (600.0, math.inf)
    df = runs()
    df.loc[(df.seed == 0) & (df.iteration == 5), "wall_time"] = NAN
    assert analysis.first_reach(df[df.seed == 0], -5.0) == (600.0, math.inf)


def test_first_reach_empty_and_missing_column():
    df = runs()
    assert analysis.first_reach(df.iloc[:0], 0.0) == (math.inf, math.inf)
    with pytest.raises(ValueError, match=r"'returns'.*available columns: seed, iteration, env_steps"):
        analysis.first_reach(df, 0.0, column="returns")
    with pytest.raises(ValueError, match="'env_steps'"):
        analysis.first_reach(df.drop(columns="env_steps"), 0.0)


# ---------------------------------------------------------------------------- steps_to_threshold


def test_steps_to_threshold_per_seed():
    s = analysis.steps_to_threshold(runs(), -5.0)
    assert isinstance(s, pd.Series) and s.name == "steps_to_threshold"
    assert not isinstance(s.index, pd.MultiIndex) and s.index.name == "seed"
    assert s.index.tolist() == [0, 1, 2]  # sorted, although the rows come 2, 0, 1
    assert s.dtype == np.float64
    assert s.loc[0] == 600.0
    assert math.isnan(s.loc[1]) and math.isnan(s.loc[2])
    s = analysis.steps_to_threshold(runs(), -50.0)
    assert s.loc[0] == 100.0 and math.isnan(s.loc[1]) and s.loc[2] == 400.0
    s = analysis.steps_to_threshold(runs(), -30.0, by="seed")  # a single name works too
    assert s.loc[0] == 100.0 and math.isnan(s.loc[1]) and s.loc[2] == 1000.0


def test_steps_to_threshold_coerces_strings_and_objects():
    df = runs()
    df["episode_return"] = df["episode_return"].astype(object)
    df.loc[(df.seed == 0) & (df.iteration == 9), "episode_return"] = "n/a"
    s = analysis.steps_to_threshold(df, -1.0)
    assert math.isnan(s.loc[0])  # the only row reaching -1 is not a number now
    assert analysis.steps_to_threshold(df, -2.0).loc[0] == 900.0
    df.loc[(df.seed == 2) & (df.iteration == 9), "episode_return"] = None
    finals = analysis.final_returns(df, 0.3)  # last 3 rows; "n/a", None and NaN ignored
    assert finals.tolist() == [-2.5, -100.0, -45.0]  # (-3, -2, n/a), (-100, NaN, NaN), (-50, -40, None)


def test_steps_to_threshold_two_keys():
    a, b = runs(), runs()
    a["config_id"], b["config_id"] = 1, 0
    b["episode_return"] = b["episode_return"] + 3.0  # seed 0: -7, -6, -5 (iteration 2, 300 steps)
    df = pd.concat([a, b], ignore_index=True)
    s = analysis.steps_to_threshold(df, -5.0, by=("config_id", "seed"))
    assert isinstance(s.index, pd.MultiIndex) and list(s.index.names) == ["config_id", "seed"]
    assert s.index.tolist() == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    np.testing.assert_array_equal(s.to_numpy(), [300.0, NAN, NAN, 600.0, NAN, NAN])


def test_steps_to_threshold_missing_column():
    with pytest.raises(ValueError, match=r"'config_id'.*available columns: seed, iteration"):
        analysis.steps_to_threshold(runs(), 0.0, by=("config_id", "seed"))
    with pytest.raises(ValueError, match="'score'"):
        analysis.steps_to_threshold(runs(), 0.0, column="score")


# ---------------------------------------------------------------------------- final_returns


def test_a_results_final_returns_equal_the_frames_and_need_no_pandas():
    """`TrainResult.final_returns` (the `train` command's last line) reads its rows with numpy
    only, and gives what `analysis.final_returns` gives on the result's DataFrame."""
    import subprocess
    import sys

    code = """
import json, sys
from ppo_async.run.result import TrainResult
rows = [{"seed": s, "iteration": i, "episode_return": v} for s, values in
        ((1, [None, 4.0, "n/a", 8.0]), (0, [1.0, 2.0, 3.0, 5.0, None, 7.0, 9.0, 10.0, None, None])) for i, v in enumerate(values)]
result = TrainResult(config=None, train_state=None, metrics=rows, compile_seconds=0.0, run_seconds=0.0)
print(json.dumps([result.final_returns(0.3).tolist(), result.final_returns().tolist(), "pandas" in sys.modules]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    at_03, at_default, pandas_loaded = json.loads(out)
    assert at_03 == [10.0, 8.0]  # seed 0: last 3 of 10 (10, None, None); seed 1: int(1.2) = 1 row
    assert at_default == [pytest.approx(float("nan"), nan_ok=True), 8.0]  # seed 0's last row is None
    assert not pandas_loaded
    df = pd.DataFrame([{"seed": s, "episode_return": v} for s, v in ((1, None), (1, 4.0), (1, "n/a"), (1, 8.0))])
    assert analysis.final_returns(df, 0.5).tolist() == [8.0]  # ("n/a", 8.0)




def test_final_returns_default_fraction():
    # 10 rows per seed, last 10% = the last row
    s = analysis.final_returns(runs())
    assert isinstance(s, pd.Series) and s.name == "final_return" and s.index.name == "seed"
    assert s.index.tolist() == [0, 1, 2]
    assert s.loc[0] == -1.0
    assert math.isnan(s.loc[1])  # the tail is only None
    assert s.loc[2] == -20.0


def test_final_returns_fractions():
    df = runs()
    s = analysis.final_returns(df, 0.3)  # last 3 rows
    assert s.loc[0] == -2.0  # mean(-3, -2, -1)
    assert s.loc[1] == -100.0  # mean(-100, None, None): NaN ignored
    assert s.loc[2] == pytest.approx(-110.0 / 3)  # mean(-50, -40, -20)
    s = analysis.final_returns(df, 0.25)  # int(2.5) = 2 rows
    assert s.loc[0] == -1.5 and math.isnan(s.loc[1]) and s.loc[2] == -30.0
    s = analysis.final_returns(df, 1.0)  # every row
    assert s.loc[0] == -5.5 and s.loc[1] == -100.0 and s.loc[2] == -46.25  # -370 / 8 non-NaN rows
    s = analysis.final_returns(df, 0.01)  # int(0.1) = 0 -> at least one row
    assert s.loc[0] == -1.0 and s.loc[2] == -20.0


def test_final_returns_matches_train_result_formula_on_uneven_groups():
    # groups of 7 and 23 rows; tail = max(1, int(n * 0.3)) = 2 and 6 rows
    df = pd.DataFrame({"seed": [5] * 7 + [3] * 23, "episode_return": list(range(7)) + list(range(100, 123))})
    s = analysis.final_returns(df, 0.3)
    assert s.index.tolist() == [3, 5]
    assert s.loc[5] == 5.5  # mean(5, 6)
    assert s.loc[3] == 119.5  # mean(117..122)


def test_final_returns_two_keys_and_other_column():
    a = runs()
    a["config_id"] = "b"
    b = runs()
    b["config_id"] = "a"
    b["episode_return"] = -b["episode_return"]
    df = pd.concat([a, b], ignore_index=True)
    s = analysis.final_returns(df, 0.2, by=["config_id", "seed"])
    assert list(s.index.names) == ["config_id", "seed"]
    assert s.index.tolist() == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    np.testing.assert_array_equal(s.to_numpy(), [1.5, NAN, 30.0, -1.5, NAN, -30.0])
    wall = analysis.final_returns(df, 0.2, by=("config_id",), column="wall_time")
    assert wall.index.tolist() == ["a", "b"] and wall.index.name == "config_id"
    # last 20% of 30 rows per config = the last 6 rows, iterations 8, 9 of seeds 2, 0, 1:
    # (6.5 + 4.5 + 5.5 + 7.0 + 5.0 + 6.0) / 6
    assert wall.loc["a"] == 5.75 and wall.loc["b"] == 5.75


def test_final_returns_nan_group_key_kept():
    df = pd.DataFrame({"dual_clip": [None, None, 3.0, 3.0], "episode_return": [1.0, 2.0, 3.0, 4.0]})
    s = analysis.final_returns(df, 0.5, by="dual_clip")
    assert len(s) == 2
    assert s.loc[3.0] == 4.0
    assert s[s.index.isna()].tolist() == [2.0]


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.5, NAN, True, "0.1", None])
def test_final_returns_bad_fraction(bad):
    with pytest.raises(ValueError, match="last_fraction"):
        analysis.final_returns(runs(), bad)


def test_final_returns_missing_column():
    with pytest.raises(ValueError, match=r"'returns'.*available columns: seed, iteration, env_steps, wall_time, episode_return"):
        analysis.final_returns(runs(), column="returns")
    with pytest.raises(ValueError, match="'run'"):
        analysis.final_returns(runs(), by=("run",))


def test_empty_frame_gives_empty_series():
    df = runs().iloc[:0]
    assert len(analysis.final_returns(df)) == 0
    s = analysis.steps_to_threshold(df, 0.0, by=("seed", "iteration"))
    assert len(s) == 0 and list(s.index.names) == ["seed", "iteration"]


def test_leaf_module():
    """analysis imports no JAX and nothing of ours but the rows' own module (`report.metrics`:
    numpy only, the tail mean it shares with `TrainResult.final_returns`)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ppo_async", "report", "analysis.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    imported, ours = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
            if (node.module or "").startswith("ppo_async"):
                ours.add(node.module)
    assert imported <= {"__future__", "math", "typing", "numpy", "pandas", "ppo_async"}, imported
    assert ours <= {"ppo_async.report.metrics"}, ours
