"""experiments/lag_tolerance.py (issue 41 item 2): each cell's config over the benchmark's barrier
mode, the report's numbers against hand-computed ones, and the whole script end to end on a tiny
budget: its outputs, a second call that trains nothing (resumable), K = 0 read from another
benchmark output."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import shutil
import sys

import numpy as np
import pandas as pd
import pytest

from ppo_async.config.paths import replace_paths
from ppo_async.study import benchmark as bm
from ppo_async.study.benchmark import runner

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = importlib.util.spec_from_file_location("lag_tolerance", os.path.join(HERE, "..", "experiments", "lag_tolerance.py"))
lag_tolerance = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = lag_tolerance  # dataclasses look the module up while the script's Args is built
SPEC.loader.exec_module(lag_tolerance)

HOPPER = "gymnasium/Hopper-v5"


def cell_config(env: str, correction: str, k: int, suite: str = "mujoco"):
    plan = bm.resolve_plan(suite, envs=[env], modes=["barrier"],
                           changes=lag_tolerance.cell_changes(env, correction, k))
    return bm.run_config(plan, env, "barrier", 0, None)


def test_each_cell_is_the_barrier_run_with_its_lag_and_correction():
    barrier = cell_config(HOPPER, "-", 0)
    assert barrier == bm.run_config(bm.resolve_plan("mujoco", envs=[HOPPER], modes=["barrier"]), HOPPER, "barrier", 0, None)
    assert (barrier.mode, barrier.threaded.barrier, barrier.num_samplers, barrier.lag.K) == ("threaded", True, 1, 0)
    assert cell_config(HOPPER, "ppo", 4) == replace_paths(barrier, {"lag.K": 4, "ppo.clip_eps": 0.2})
    assert cell_config(HOPPER, "dual-clip", 2) == replace_paths(barrier, {"lag.K": 2, "ppo.dual_clip": 3.0})
    assert cell_config(HOPPER, "vtrace", 8) == replace_paths(barrier, {"lag.K": 8, "ppo.advantage_estimator": "vtrace"})
    decoupled = cell_config(HOPPER, "decoupled", 1)
    assert barrier.sgd_steps_per_iteration == 320 and decoupled.ppo.prox_ewma == pytest.approx(0.99375)
    assert decoupled == replace_paths(barrier, {"lag.K": 1, "ppo.objective": "decoupled", "ppo.is_clip": 2.0,
                                                "ppo.prox_ewma": 1 - 2 / 320})
    assert lag_tolerance.ewma_decay(80) == pytest.approx(0.975)  # experiments/lag_sweep.py's value at its 80 steps


def test_cell_numbers_hand_computed():
    runs = pd.DataFrame({"seed": [0, 0, 1, 1], "env_steps": [100, 200, 100, 200], "eval_return": [50.0, 90.0, 85.0, 70.0],
                         "final": [0, 1, 0, 1]})
    assert lag_tolerance.steps_to(runs[runs.seed == 0], 80.0) == 200.0
    assert lag_tolerance.steps_to(runs[runs.seed == 1], 80.0) == 100.0
    assert math.isnan(lag_tolerance.steps_to(runs[runs.seed == 0], 95.0))
    assert lag_tolerance.fraction_target(100.0, 0.8) == 80.0 and math.isnan(lag_tolerance.fraction_target(-5.0, 0.8))
    means = [{"approx_kl": 0.01, "kl_staleness": 0.05, "clip_fraction": 0.1, "ess_fraction": 0.9, "entropy_end": -1.0},
             {"approx_kl": 0.03, "kl_staleness": 0.07, "clip_fraction": math.nan, "ess_fraction": 0.7, "entropy_end": 0.5}]
    row = lag_tolerance.cell_row(runs, reference=100.0, target=80.0, means=means)
    # finals 90 and 70 over a reference of 100: 0.9 and 0.7
    assert row["seeds"] == 2 and row["eval_mean"] == 80.0
    assert row["norm_mean"] == pytest.approx(0.8) and row["norm_worst"] == pytest.approx(0.7)
    assert row["norm_ci_low"] <= 0.8 <= row["norm_ci_high"]
    assert row["steps_to_target"] == 150.0 and row["reached"] == 2
    assert row["approx_kl"] == pytest.approx(0.02) and row["clip_fraction"] == pytest.approx(0.1)
    assert row["ess_fraction"] == pytest.approx(0.8) and row["kl_staleness"] == pytest.approx(0.06)
    assert row["entropy_end"] == pytest.approx(-0.25)


def test_bad_options_are_one_line_errors():
    for args, match in ((lag_tolerance.Args(corrections=("nope",)), "--corrections"),
                        (lag_tolerance.Args(ks=(0, 2)), "--ks"), (lag_tolerance.Args(fraction=1.5), "--fraction"),
                        (lag_tolerance.Args(emergent_from="/nonexistent"), "--emergent-from"),
                        (lag_tolerance.Args(seeds=5, top_up_seeds=5), "--top-up-seeds 5: must exceed --seeds 5"),
                        (lag_tolerance.Args(top_up_seeds=-1), "--top-up-seeds"), (lag_tolerance.Args(jobs=0), "--jobs")):
        with pytest.raises(SystemExit, match=match):
            lag_tolerance.check_args(args)


TINY = dict(suite="classic", envs=("Pendulum-v1",), total_env_steps=2048, seeds=1, ks=(1,),
            corrections=("ppo", "decoupled"), eval_every_steps=1024, eval_episodes=2, progress=False, top_up_seeds=0,
            k0_from=None, emergent_from=None)


def test_the_script_end_to_end_on_a_tiny_budget(tmp_path, monkeypatch):
    out = str(tmp_path / "lt")
    table = lag_tolerance.main(lag_tolerance.Args(**TINY, out=out))
    assert [(r.correction, r.K) for r in table.itertuples()] == [("-", 0), ("ppo", 1), ("decoupled", 1)]
    assert (table["seeds"] == 1).all() and table["eval_mean"].notna().all() and table["approx_kl"].notna().all()
    assert table["ess_fraction"].between(0, 1).all()
    for cell in ("barrier-K0", "ppo-K1", "decoupled-K1"):  # each cell a benchmark output of its own
        cell_dir = os.path.join(out, "Pendulum-v1", cell)
        results = bm.results_frame(cell_dir)
        assert results["final"].sum() == 1 and os.path.isfile(os.path.join(cell_dir, "manifest.json"))
    with open(os.path.join(out, "Pendulum-v1", "ppo-K1", bm.SPEC_FILE), encoding="utf-8") as f:
        spec = json.load(f)
    assert spec["configs"]["Pendulum-v1 barrier"]["lag"]["K"] == 1
    # the lag was the schedule's: every batch after warm-up one version old
    run = bm.run_dir_of(os.path.join(out, "Pendulum-v1", "ppo-K1"), "Pendulum-v1", "barrier", 0)
    assert [r["lag"] for r in map(json.loads, open(os.path.join(run, "version_schedule.jsonl")))] == [0, 1]
    for name in ("table.csv", "summary.txt", "lag_tolerance_Pendulum-v1.png", "manifest.json"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        assert json.load(f)["completed"] is True
    # a second call trains nothing: every run is finished
    monkeypatch.setattr(runner, "train_run", lambda *a, **k: pytest.fail("a finished run was trained again"))
    again = lag_tolerance.main(lag_tolerance.Args(**TINY, out=out))
    pd.testing.assert_frame_equal(again, table)
    # a fresh checkout (no run directories: they are git-ignored) gives the cells the same numbers,
    # from each cell's committed run_means.csv
    for cell in ("ppo-K1", "decoupled-K1"):
        shutil.rmtree(os.path.join(out, "Pendulum-v1", cell, "runs"))
    fresh = lag_tolerance.main(lag_tolerance.Args(**TINY, out=out, summarise_only=True))
    pd.testing.assert_frame_equal(fresh[fresh.K > 0], table[table.K > 0])
    assert fresh[fresh.K > 0]["clip_fraction"].notna().all()
    # K = 0 read from another benchmark output with the same barrier config (read only)
    k0 = os.path.join(out, "Pendulum-v1", "barrier-K0")
    other = str(tmp_path / "other")
    reused = lag_tolerance.main(lag_tolerance.Args(**{**TINY, "k0_from": k0}, out=other, summarise_only=True))
    assert [(r.correction, r.K) for r in reused.itertuples()] == [("-", 0)]  # no cell of its own yet
    assert reused["eval_mean"].item() == table.loc[table.K == 0, "eval_mean"].item()
    assert not os.path.exists(os.path.join(other, "Pendulum-v1", "barrier-K0"))  # read there, not run here
    spec_path = os.path.join(k0, bm.SPEC_FILE)  # a K = 0 recorded before num_samplers left threaded.*
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    recorded = spec["configs"]["Pendulum-v1 barrier"]
    recorded["threaded"]["num_samplers"], recorded["num_samplers"] = recorded.pop("num_samplers"), None
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    lag_tolerance.check_k0_source(lag_tolerance.Args(**{**TINY, "k0_from": k0}, out=other), "Pendulum-v1")  # the same K = 0
    with pytest.raises(SystemExit, match="differ from this call's K = 0 in eval_episodes"):
        lag_tolerance.main(lag_tolerance.Args(**{**TINY, "eval_episodes": 3, "k0_from": k0}, out=other))
    assert np.isfinite(table["norm_mean"]).all()  # Pendulum-v1 has a normalising reference


def test_the_emergent_lag_is_placed_beside_the_fixed_k_cell_of_its_mean_lag(tmp_path):
    """--emergent-from: the default async mode's runs as a row at their mean lag (timings.csv),
    with the lag shares of their summed histograms and their KL, against the fixed ppo cell of
    that lag (issue 41 item 3); hand-made benchmark output, hand-computed numbers."""
    from ppo_async.study.benchmark.timings import write_timing

    source, mode = str(tmp_path / "bench"), bm.DEFAULT_ASYNC_MODE
    os.makedirs(source)
    bm.write_results(source, [{"env": HOPPER, "mode": m, "seed": s, "checkpoint": c, "iteration": c // 2048,
                               "env_steps": c, "eval_return": r, "train_return": 0.0, "episodes": 1, "wall_s": 1.0,
                               "train_wall_s": 1.0, "approx_kl": 0.02, "lag_mean": 1.0, "final": int(c == 200_000)}
                              for m, s, c, r in [(mode, 0, 100_000, 1000.0), (mode, 0, 200_000, 2383.0),
                                                 (mode, 1, 100_000, 3000.0), (mode, 1, 200_000, 3574.5),
                                                 ("barrier", 0, 200_000, 9.0)]])
    for seed, lag, histogram in ((0, 1.0, [0, 90, 10]), (1, 1.2, [10, 60, 20, 10])):
        write_timing(source, {"env": HOPPER, "mode": mode, "seed": seed, "iterations": 97, "sample_s": 0.3, "learn_s": 0.05,
                              "wait_s": 0.01, "wall_s": 100.0, "approx_kl": 0.01 * (seed + 1), "lag_mean": lag,
                              "lag_histogram": json.dumps(histogram), "kl_staleness": 0.1 * (seed + 1),
                              "entropy_end": float(seed)})
    row = lag_tolerance.emergent_row(source, HOPPER, seeds=3, reference=2383.0, target=2000.0)
    assert row["correction"] == lag_tolerance.EMERGENT and row["K"] == pytest.approx(1.1)
    assert row["seeds"] == 2 and row["norm_mean"] == pytest.approx((1.0 + 1.5) / 2)  # 2,383 and 3,574.5 over 2,383
    assert row["steps_to_target"] == pytest.approx((200_000 + 100_000) / 2) and row["reached"] == 2
    assert row["approx_kl"] == pytest.approx(0.015)  # timings.csv: no run directories here
    assert row["kl_staleness"] == pytest.approx(0.15) and row["entropy_end"] == pytest.approx(0.5)
    assert json.loads(row["lag_shares"]) == pytest.approx([0.05, 0.75, 0.15, 0.05])  # (0+10, 90+60, 10+20, 0+10) / 200
    assert lag_tolerance.emergent_row(source, "gymnasium/Walker2d-v5", 3, 1.0, 1.0) is None
    fixed = {"env": HOPPER, "correction": "ppo", "K": 1, "target": 2000.0, "seeds": 3, "eval_mean": 3000.0,
             "norm_mean": 1.2, "norm_ci_low": 1.0, "norm_ci_high": 1.4, "norm_worst": 1.0, "steps_to_target": 1.0,
             "reached": 3, "approx_kl": 0.012, "kl_staleness": 0.02, "clip_fraction": 0.1, "ess_fraction": 0.9,
             "entropy_end": -1.0}
    table = pd.DataFrame([fixed, row])
    line = lag_tolerance.emergent_match(table, HOPPER)
    assert f"{mode} (emergent lag, mean 1.10; lag 0 5.0%, 1 75.0%, 2 15.0%, >= 3 5.0%) norm 1.25" in line
    assert line.endswith("against fixed ppo-K1: norm 1.20 [1.00, 1.40], KL 0.0120: inside its 95% CI")
    assert lag_tolerance.emergent_match(table.assign(norm_ci_high=[1.22, 1.6]), HOPPER).endswith("outside its 95% CI")
    assert lag_tolerance.emergent_match(table[table.correction == "emergent"], HOPPER).endswith("no fixed ppo-K1 cell to compare with yet")
    assert "1.10 (mean)" in lag_tolerance.formatted(table).to_string()
    path = str(tmp_path / "fig.png")
    lag_tolerance.plot_env(table, HOPPER, path)
    assert os.path.getsize(path) > 0


def test_the_largest_tolerated_k_by_hand():
    """Tolerated: the cell's mean final eval and every smaller K's within 10% of K = 0's; a K
    within again after one that is not does not count (issue 41's finding per correction)."""
    rows = [("-", 0, 1000.0), ("ppo", 1, 1050.0), ("ppo", 2, 905.0), ("ppo", 4, 850.0), ("ppo", 8, 950.0),
            ("vtrace", 1, 899.0), ("vtrace", 2, 990.0)]
    table = pd.DataFrame([{"env": HOPPER, "correction": c, "K": k, "eval_mean": v, "seeds": 3} for c, k, v in rows])
    line = lag_tolerance.tolerance_line(table, HOPPER, "ppo")
    assert line.startswith(f"ppo on {HOPPER}: tolerates up to K = 2 within 10% of K = 0's 1,000 (K = 1 1,050 (1.05x, 3 seeds)")
    assert "K = 4 850 (0.85x, 3 seeds); K = 8 950 (0.95x, 3 seeds)" in line
    assert "tolerates no K tested" in lag_tolerance.tolerance_line(table, HOPPER, "vtrace")
    assert lag_tolerance.tolerance_line(table, HOPPER, "decoupled") is None
    gap = pd.concat([table, pd.DataFrame([{"env": HOPPER, "correction": "decoupled", "K": 2, "eval_mean": 980.0, "seeds": 3}])])
    assert lag_tolerance.tolerance_line(gap, HOPPER, "decoupled") == (  # K = 1 not run: K = 2 alone proves nothing
        f"decoupled on {HOPPER}: tolerates no K tested within 10% of K = 0's 1,000 (K = 1 not run; K = 2 980 (0.98x, 3 seeds))")
    assert lag_tolerance.tolerance_line(table[table.K > 0], HOPPER, "ppo") is None


def test_the_cells_a_finding_hangs_on_by_hand():
    """Walking K up to the first cell under the 10% line (900 for K = 0's 1,000): the cells whose
    95% CI of the mean eval holds 900 and that have fewer seeds than asked."""
    rows = [("-", 0, 1000.0, 990.0, 1010.0, 5), ("ppo", 1, 1050.0, 1000.0, 1100.0, 3), ("ppo", 2, 920.0, 850.0, 990.0, 3),
            ("ppo", 4, 880.0, 700.0, 950.0, 3), ("ppo", 8, 700.0, 600.0, 910.0, 3),
            ("vtrace", 1, 800.0, 700.0, 850.0, 3), ("vtrace", 2, 910.0, 850.0, 950.0, 3),
            ("dual-clip", 1, 950.0, 880.0, 990.0, 5), ("dual-clip", 2, 890.0, 850.0, 950.0, 3)]
    table = pd.DataFrame([{"env": HOPPER, "correction": c, "K": k, "eval_mean": m, "eval_ci_low": lo,
                           "eval_ci_high": hi, "seeds": n} for c, k, m, lo, hi, n in rows])
    assert lag_tolerance.hanging_ks(table, HOPPER, "ppo", 5) == [2, 4]  # K = 8 lies past the first K under the line
    assert lag_tolerance.hanging_ks(table, HOPPER, "vtrace", 5) == []  # K = 1 is under it, its CI clear of the line
    assert lag_tolerance.hanging_ks(table, HOPPER, "dual-clip", 5) == [2]  # K = 1 holds the line but has its 5 seeds
    assert lag_tolerance.hanging_ks(table, HOPPER, "decoupled", 5) == []
    assert lag_tolerance.hanging_ks(table[table.K > 0], HOPPER, "ppo", 5) == []  # no K = 0: no line


def test_top_up_runs_the_hanging_cells_round_after_round(tmp_path, monkeypatch):
    """`top_up`: the hanging cells to --top-up-seeds, again while new seeds move the first K under
    the line; K = 0 run here takes as many seeds as the topped-up cells."""
    state = {("ppo", 1): (950.0, 880.0, 990.0, 3), ("ppo", 2): (850.0, 700.0, 920.0, 3), ("ppo", 4): (500.0, 400.0, 600.0, 3)}
    ran = []

    def table(args, out):
        rows = [("-", 0, 1000.0, 990.0, 1010.0, 5)] + [(c, k, *v) for (c, k), v in state.items()]
        return pd.DataFrame([{"env": HOPPER, "correction": c, "K": k, "eval_mean": m, "eval_ci_low": lo,
                              "eval_ci_high": hi, "seeds": n} for c, k, m, lo, hi, n in rows])

    def run_cell(args, out, env, correction, k, seeds=None):
        ran.append((correction, k, seeds))
        if (correction, k) == ("ppo", 2):  # its new seeds lift it over the line: K = 4 now decides, and hangs
            state[("ppo", 4)] = (850.0, 700.0, 950.0, 3)
        state[(correction, k)] = (960.0, 920.0, 990.0, seeds) if k == 2 else (*state[(correction, k)][:3], seeds)

    monkeypatch.setattr(lag_tolerance, "summarise", table)
    monkeypatch.setattr(lag_tolerance, "run_cell", run_cell)
    lag_tolerance.top_up(lag_tolerance.Args(envs=(HOPPER,), corrections=("ppo",), seeds=3, top_up_seeds=5), str(tmp_path))
    assert ran == [("ppo", 1, 5), ("ppo", 2, 5), ("ppo", 4, 5)]
    monkeypatch.undo()
    calls, args = [], lag_tolerance.Args(envs=(HOPPER,), seeds=3, top_up_seeds=5)
    monkeypatch.setattr(lag_tolerance.pa, "benchmark", lambda *a, **k: calls.append((k["seeds"], k["jobs"])))
    lag_tolerance.run_cell(args, str(tmp_path), HOPPER, "-", 0)
    lag_tolerance.run_cell(args, str(tmp_path), HOPPER, "ppo", 2)
    lag_tolerance.run_cell(dataclasses.replace(args, jobs=2), str(tmp_path), HOPPER, "ppo", 2, seeds=5)
    cell = lag_tolerance.cell_dir(str(tmp_path), HOPPER, "ppo", 4)  # topped up before: the grid's pass keeps its 5
    os.makedirs(cell)
    with open(os.path.join(cell, bm.SPEC_FILE), "w", encoding="utf-8") as f:
        json.dump({"seeds": 5}, f)
    lag_tolerance.run_cell(args, str(tmp_path), HOPPER, "ppo", 4)
    assert calls == [(5, 1), (3, 1), (5, 2), (5, 1)]


def test_the_defaults_read_k0_and_the_emergent_lag_from_the_committed_benchmark():
    """`python experiments/lag_tolerance.py --out experiments/results/lag_tolerance` reproduces the
    published table: K = 0 and the emergent lag are the committed mujoco benchmark's runs, whose
    barrier config is each env's K = 0 today (a preset change that breaks this is caught here)."""
    args = lag_tolerance.Args()
    assert args.k0_from == args.emergent_from == os.path.join("experiments", "results", "benchmark")
    assert set(args.envs) == {HOPPER, "gymnasium/Walker2d-v5", "gymnasium/HalfCheetah-v5"}
    resolved = lag_tolerance.in_repo(args.k0_from)
    assert os.path.isfile(os.path.join(resolved, bm.RESULTS_FILE))
    for env in args.envs:
        lag_tolerance.check_k0_source(lag_tolerance.Args(k0_from=resolved), env)
