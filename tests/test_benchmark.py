"""The benchmark runner (`ppo_async.study.benchmark`, `python -m ppo_async benchmark`): a tiny
classic suite writes its rows, resumes after a kill without re-running finished runs and
rebuilds lost rows from the run directories; the aggregate IQM and probability of improvement
against numbers computed by hand; one-line errors; the command's help."""

from __future__ import annotations

import dataclasses
import typing
import json
import math
import os
import shutil

import numpy as np
import pandas as pd
import pytest

import ppo_async as pa
from ppo_async.config import parse_assignments
from ppo_async.config import ConfigError
from ppo_async.report import stats
from ppo_async.study import benchmark as bm

TINY = dict(suite="classic", seeds=2, envs=["Pendulum-v1", "CartPole-v1"], modes=["sync"], total_env_steps=2048,
            eval_every_steps=1024, eval_episodes=2, progress=False)
RUNS = [(env, "sync", seed) for seed in (0, 1) for env in ("Pendulum-v1", "CartPole-v1")]


class Killed(Exception):
    pass


def metrics_mtime(out, env, mode, seed) -> int:
    return os.stat(os.path.join(bm.run_dir_of(str(out), env, mode, seed), "metrics.jsonl")).st_mtime_ns


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny suite killed after its first run, then run again to the end."""
    out = tmp_path_factory.mktemp("bench")

    def kill_after_first(env, mode, seed, how):
        raise Killed()

    with pytest.raises(Killed):
        pa.benchmark(out=out, on_run=kill_after_first, **TINY)
    first_rows = bm.read_results(str(out))
    first_mtime = metrics_mtime(out, *RUNS[0])
    calls = []
    df = pa.benchmark(out=out, on_run=lambda *a: calls.append(a), **TINY)
    return out, first_rows, first_mtime, calls, df


def test_a_killed_benchmark_resumes_without_rerunning_finished_runs(tiny):
    out, first_rows, first_mtime, calls, df = tiny
    assert {bm._key(r) for r in first_rows} == {RUNS[0]} and first_rows[-1]["final"] == "1"
    assert [c[:3] for c in calls] == RUNS
    assert [c[3] for c in calls] == ["skipped", "fresh", "fresh", "fresh"]
    assert metrics_mtime(out, *RUNS[0]) == first_mtime  # the finished run was not trained again
    # one row per evaluation: after iterations 1 (1,024 steps) and 2 (the end), per run
    assert len(df) == 8 and set(df.columns) == set(bm.COLUMNS)
    assert sorted(df.groupby(["env", "seed"]).size()) == [2] * 4
    assert set(df["checkpoint"]) == {1024, 2048} and set(df.loc[df["final"] == 1, "checkpoint"]) == {2048}
    assert df["eval_return"].notna().all() and (df["wall_s"] > 0).all() and (df["lag_mean"] == 0).all()
    for name in ("report.md", "learning_curves.png", "manifest.json", "benchmark.json"):
        assert os.path.isfile(os.path.join(out, name)), name
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    assert manifest["completed"] and manifest["runs"] == {"fresh": 3, "skipped": 1}


def test_lost_rows_are_rebuilt_from_the_run_directory_not_rerun(tiny):
    out, *_ , df = tiny
    env, mode, seed = RUNS[2]
    lost = bm.read_results(str(out))
    kept = [r for r in lost if bm._key(r) != (env, mode, seed)]
    bm.write_results(str(out), kept[:-1], append=False)  # lose a run's rows and tear another's final row
    os.remove(os.path.join(bm.run_dir_of(str(out), *RUNS[0]), bm.DONE_FILE))  # a marker lost too
    before = {run: metrics_mtime(out, *run) for run in RUNS}
    calls = []
    again = pa.benchmark(out=out, on_run=lambda *a: calls.append(a[3]), **TINY)
    assert {run: metrics_mtime(out, *run) for run in RUNS} == before  # nothing trained
    assert sorted(calls) == ["rows rebuilt", "rows rebuilt", "skipped", "skipped"]
    key = ["env", "mode", "seed", "checkpoint"]
    pd.testing.assert_frame_equal(again.sort_values(key).reset_index(drop=True), df.sort_values(key).reset_index(drop=True))
    assert os.path.isfile(os.path.join(bm.run_dir_of(str(out), *RUNS[0]), bm.DONE_FILE))


def test_other_arguments_on_the_same_out_are_refused(tiny):
    out = tiny[0]
    with pytest.raises(ConfigError, match=r"other arguments: total_env_steps=2048 \(now 4096\)"):
        pa.benchmark(out=out, **{**TINY, "total_env_steps": 4096})


def test_changes_that_give_the_same_configs_resume_and_others_are_refused(tmp_path):
    """`--set` matters through the configs it makes: pinning a field at the value it has is the
    same plan (a preset that moves later can be pinned without losing the runs); a change that
    moves a config is refused, naming the field."""
    plan = bm.resolve_plan("classic", envs=["Pendulum-v1"], modes=["sync"], seeds=1)
    out = str(tmp_path)
    bm.check_spec(out, bm.plan_spec(plan))
    gamma = bm.run_config(plan, "Pendulum-v1", "sync", 0, None).ppo.gamma
    pinned = bm.resolve_plan("classic", envs=["Pendulum-v1"], modes=["sync"], seeds=1, changes={"ppo.gamma": gamma})
    assert pinned.changes != plan.changes
    bm.check_spec(out, bm.plan_spec(pinned))  # no ConfigError
    moved = bm.resolve_plan("classic", envs=["Pendulum-v1"], modes=["sync"], seeds=1, changes={"ppo.gamma": 0.5})
    with pytest.raises(ConfigError, match=r"configs differ from today's.*ppo.gamma"):
        bm.check_spec(out, bm.plan_spec(moved))


def test_more_seeds_extend_a_benchmark_without_rerunning_its_runs(tiny, tmp_path):
    out = tmp_path / "more"
    shutil.copytree(tiny[0], out)
    before = {run: metrics_mtime(out, *run) for run in RUNS}
    calls = []
    df = pa.benchmark(out=out, on_run=lambda *a: calls.append(a), **{**TINY, "seeds": 3})
    assert [how for *_, how in calls] == ["skipped"] * 4 + ["fresh"] * 2  # seed 2 of both envs is new
    assert {run: metrics_mtime(out, *run) for run in RUNS} == before
    assert sorted(set(df["seed"])) == [0, 1, 2]
    with open(os.path.join(out, "benchmark.json"), encoding="utf-8") as f:
        assert json.load(f)["seeds"] == 3
    with pytest.raises(ConfigError, match=r"seeds=3 \(now 2\)"):  # fewer seeds than recorded: other arguments
        pa.benchmark(out=out, **TINY)


def test_an_out_without_its_runs_is_published_from_the_runs_elsewhere(tiny, tmp_path):
    """OUT holding only results.csv and benchmark.json, the run directories elsewhere (--runs-dir):
    every run is skipped, nothing is trained, and OUT gets the report and a manifest naming only
    its own files, ready to commit."""
    out = tmp_path / "published"
    out.mkdir()
    for name in ("results.csv", "benchmark.json"):
        shutil.copy(os.path.join(tiny[0], name), out / name)
    calls = []
    pa.benchmark(out=out, on_run=lambda *a: calls.append(a), runs_dir=os.path.join(tiny[0], "runs"), **TINY)
    assert [how for *_, how in calls] == ["skipped"] * 4
    assert not (out / "runs").exists() and (out / "report.md").is_file()
    with open(out / "manifest.json", encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["completed"] is True and not [f for f in manifest["files_written"] if f.startswith("runs")]


def test_report_only_from_results_csv(tiny, cli_main, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    (out / "results.csv").write_text((tiny[0] / "results.csv").read_text())
    proc = cli_main(["benchmark", "--report-only", "--out", str(out)])
    assert proc.returncode == 0, proc.stderr
    text = (out / "report.md").read_text()
    assert "| Pendulum-v1 | sync | 2 | 2,048 |" in text and "RL Baselines3 Zoo benchmark.md: -172" in text
    # each interval names its method (report.stats), and why it is not rliable's own bootstrap
    assert "`ppo_async.report.stats.bootstrap_mean_ci`" in text and stats.WHY_NOT_RLIABLE_BOOTSTRAP in text
    assert "TypeError" not in text
    assert (out / "learning_curves.png").is_file()


def hand_table(rows) -> pd.DataFrame:
    """Final-evaluation rows: (env, mode, seed, eval_return)."""
    return pd.DataFrame([{"env": e, "mode": m, "seed": s, "eval_return": r, "final": 1} for e, m, s, r in rows])


def test_iqm_and_probability_of_improvement_by_hand():
    refs = {"A": 100.0, "B": -50.0}  # B: a negative reference (normalised 1 + (x - ref) / |ref|)
    a = {"barrier": [50, 100, 150, 200], "async": [100, 100, 300, 120]}
    b = {"barrier": [-50, -25, -100, -75], "async": [-50, -25, -100, -75]}
    rows = [(env, mode, seed, scores[mode][seed]) for env, scores in (("A", a), ("B", b))
            for mode in ("barrier", "async") for seed in range(4)]
    agg = bm.aggregate(hand_table(rows), refs, reps=200)
    assert agg["tasks"] == ["A", "B"] and agg["runs"] == 4 and agg["ci_method"] == stats.STRATIFIED_METHOD
    # barrier: A -> 0.5, 1, 1.5, 2; B -> 1, 1.5, 0, 0.5. Sorted: 0 .5 .5 1 1 1.5 1.5 2; the middle
    # four (IQM drops the lowest and highest 25% = 2 of 8 each side): .5 1 1 1.5 -> 1.0
    assert agg["iqm"]["barrier"][0] == pytest.approx(1.0)
    # async: A -> 1, 1, 3, 1.2; B as barrier. Sorted: 0 .5 1 1 1 1.2 1.5 3 -> middle 1 1 1 1.2 -> 1.05
    assert agg["iqm"]["async"][0] == pytest.approx(1.05)
    # P(async > barrier): A counts pairs (x > y: 1, tie: 1/2) over 16: async 100 beats 50 and ties 100
    # (1.5, twice), 300 beats all 4, 120 beats 50 and 100 (2): (1.5 + 1.5 + 4 + 2) / 16 = 9/16; B equal -> 1/2
    assert agg["improvement"][0] == pytest.approx((9 / 16 + 0.5) / 2)
    for value, low, high in [*agg["iqm"].values(), agg["improvement"]]:
        assert low <= value + 1e-9 and value <= high + 1e-9


def test_bootstrap_ci_and_checkpoint_table():
    assert np.isnan(bm.bootstrap_mean_ci([3.0])[0])
    low, high = bm.bootstrap_mean_ci([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= low < 2.5 < high <= 4.0
    df = hand_table([("A", "async", s, v) for s, v in enumerate([1.0, 2.0, 6.0])]).assign(
        checkpoint=10, train_return=0.0, env_steps=10, wall_s=1.0)
    row = bm.checkpoint_table(df).iloc[0]
    assert (row["seeds"], row["mean"], row["worst"]) == (3, 3.0, 1.0)


def test_reach_ratio_by_hand():
    barrier = pd.DataFrame({"mean": [10.0, 20.0], "wall_s": [50.0, 100.0]})
    asynchronous = pd.DataFrame({"mean": [15.0, 25.0, 30.0], "wall_s": [20.0, 40.0, 60.0]})
    assert bm.reach_ratio(barrier, asynchronous) == pytest.approx(40.0 / 100.0)  # 25 >= 20 first, at 40 s
    assert np.isnan(bm.reach_ratio(barrier, asynchronous.assign(mean=5.0)))
    # 95% of barrier's 20 = 19: still 25 at 40 s; 70% = 14: 15 at 20 s
    assert bm.reach_ratio(barrier, asynchronous, 0.95) == pytest.approx(0.4)
    assert bm.reach_ratio(barrier, asynchronous, 0.7) == pytest.approx(0.2)
    # a negative final return (-20): 95% of the way = 1 below it (-21), reached by -21 at 20 s
    negative = pd.DataFrame({"mean": [-30.0, -20.0], "wall_s": [50.0, 100.0]})
    assert bm.reach_ratio(negative, pd.DataFrame({"mean": [-21.0, -20.5], "wall_s": [20.0, 40.0]}), 0.95) == pytest.approx(0.2)
    assert np.isnan(bm.reach_ratio(negative, pd.DataFrame({"mean": [-21.0, -20.5], "wall_s": [20.0, 40.0]})))


def test_returns_at_equal_wall_clock_by_hand():
    """Async finishes at 60 s: barrier's return then is its 50 s checkpoint's (10), async's its last (30);
    a barrier that finishes first (at 100 s against async's 120 s) is met by async's 90 s checkpoint."""
    barrier = pd.DataFrame({"mean": [10.0, 20.0], "wall_s": [50.0, 100.0]})
    asynchronous = pd.DataFrame({"mean": [15.0, 25.0, 30.0], "wall_s": [20.0, 40.0, 60.0]})
    assert bm.returns_at_equal_wall(barrier, asynchronous) == (60.0, 10.0, 30.0)
    slower = asynchronous.assign(wall_s=[30.0, 90.0, 120.0])
    assert bm.returns_at_equal_wall(barrier, slower) == (100.0, 20.0, 25.0)
    late = asynchronous.assign(wall_s=[70.0, 80.0, 90.0])  # barrier's first checkpoint after async's end
    wall, barrier_then, async_then = bm.returns_at_equal_wall(barrier.assign(wall_s=[95.0, 100.0]), late)
    assert (wall, async_then) == (90.0, 30.0) and np.isnan(barrier_then)


@pytest.mark.parametrize("kwargs,message", [
    (dict(suite="atari"), "suite = 'atari' is not a benchmark suite (mujoco, mujoco-envpool, mujoco-slow, dmc, classic)"),
    (dict(suite="mujoco", modes=["sync"]), "mode 'sync' cannot run env 'gymnasium/HalfCheetah-v5'"),
    (dict(suite="classic", modes=["fast"]), "modes: 'fast' is not a benchmark mode (sync, barrier, async, async-decoupled)"),
    (dict(suite="classic", envs=["Pong"]), "envs: 'Pong' is not in suite 'classic'"),
    (dict(suite="classic", seeds=0), "seeds = 0 is invalid: must be an integer >= 1"),
    (dict(suite="classic", changes={"seed": 3}), "seed is set by the benchmark itself"),
    (dict(suite="classic", changes={"ppo.gama": 0.9}), "unknown config field 'ppo.gama'"),
])
def test_bad_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError) as info:
        bm.resolve_plan(**kwargs)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_plan_defaults_and_run_configs():
    plan = bm.resolve_plan("mujoco")
    assert plan.modes == ("barrier", "async", "async-decoupled") and plan.total_env_steps == 1_000_000 and plan.eval_every_steps == 100_000
    assert bm.resolve_plan("classic").modes == ("sync", "barrier", "async", "async-decoupled")
    config = bm.run_config(plan, "gymnasium/Hopper-v5", "async-decoupled", 3, "somewhere")
    preset = pa.config_for_env("gymnasium/Hopper-v5", {"mode": "threaded"})
    assert (config.mode, config.num_samplers, config.threaded.barrier, config.seed) == ("threaded", 1, False, 3)
    assert config.ppo == dataclasses.replace(preset.ppo, objective="decoupled")  # the rest of the preset stays
    assert (config.ppo.objective, config.ppo.num_epochs, config.ppo.num_minibatches) == ("decoupled", 10, 32)
    # barrier's sampler of the preset's 16 envs, a batch of one chunk: barrier's batch of 2,048 steps
    barrier = bm.run_config(plan, "gymnasium/Hopper-v5", "barrier", 3, None)
    assert (config.rollout.num_envs, config.effective_chunks_per_batch, barrier.rollout.num_envs) == (16, 1, 16)
    assert config.batch_size == barrier.batch_size == 2048 and barrier.ppo == preset.ppo
    # 100k env steps in whole iterations (100,000 / 2,048 = 48.8 -> 49), recorded as such: 49 x 2,048
    assert (config.eval_every_iterations, config.eval_every_steps) == (49, 49 * 2048)
    # threaded runs resume too: a checkpoint at each evaluation
    assert config.checkpoint_every_steps == config.eval_every_steps and (config.eval_every, config.checkpoint_every) == (0, 0)
    sync = bm.run_config(bm.resolve_plan("classic"), "CartPole-v1", "sync", 0, "somewhere")  # resumable: a checkpoint at each evaluation
    assert sync.checkpoint_every_steps == sync.eval_every_steps > 0 and sync.checkpoint_every_iterations == sync.eval_every_iterations
    assert bm.checkpoint_of(config.num_iterations, config.eval_every_iterations, config.num_iterations, 100_000,
                            1_000_000) == 1_000_000


def test_modes_are_data_each_its_parent_plus_what_it_changes():
    """barrier -> async removes the barrier alone (the same sampler and batch, lag from
    overlap); async -> async-decoupled changes the objective alone; the CLI's choices are the
    modes; the default async mode is one of them."""
    from ppo_async.cli.benchmark import ModeChoice

    assert tuple(bm.MODES) == typing.get_args(ModeChoice) == tuple(bm.MODE_DEFS)
    assert bm.ASYNC_MODES == ("async", "async-decoupled") and bm.DEFAULT_ASYNC_MODE == "async"
    assert bm.MODE_DEFS["async-decoupled"].parent == "async"
    assert dict(bm.MODE_DEFS["async-decoupled"].changes) == {"ppo.objective": "decoupled"}
    assert bm.MODES["async-decoupled"] == {**bm.MODES["async"], "ppo.objective": "decoupled"}
    assert bm.MODES["async"] == {**bm.MODES["barrier"], "threaded.barrier": False}
    plan = bm.resolve_plan("mujoco", envs=["gymnasium/Hopper-v5"])
    configs = {m: bm.run_config(plan, "gymnasium/Hopper-v5", m, 0, None) for m in plan.modes}
    assert configs["async-decoupled"] == configs["async"].replace(ppo=dataclasses.replace(configs["async"].ppo, objective="decoupled"))
    assert configs["async"].ppo == configs["barrier"].ppo  # PPO's clip, as barrier
    assert {m: c.batch_size for m, c in configs.items()} == {"barrier": 2048, "async": 2048, "async-decoupled": 2048}
    assert {m: (c.num_samplers, c.rollout.num_envs, c.effective_chunks_per_batch)
            for m, c in configs.items()} == {m: (1, 16, 1) for m in configs}  # one sampler of the preset's 16 envs


def test_the_envpool_suite_runs_the_mujoco_tasks_with_their_references_and_configs():
    """mujoco-envpool: the four tasks as EnvPool builds them, the same modes, preset and
    layout as the mujoco suite's, scored against Gymnasium's reference figures."""
    plan = bm.resolve_plan("mujoco-envpool", seeds=1)
    assert plan.envs == tuple("envpool/" + e.split("/")[1] for e in bm.SUITES["mujoco"].envs)
    gym_plan = bm.resolve_plan("mujoco", seeds=1)
    assert plan.modes == gym_plan.modes
    for mode in plan.modes:
        config = bm.run_config(plan, "envpool/Hopper-v5", mode, 0, None)
        gym = bm.run_config(gym_plan, "gymnasium/Hopper-v5", mode, 0, None)
        assert config.replace(env=gym.env) == gym, mode  # only the env's family differs
    norm = bm.normalising_references(bm.load_references())
    for env in plan.envs:
        assert norm[env] == norm["gymnasium/" + env.split("/")[1]]
    copied = [r for r in bm.load_references() if r["env"] == "envpool/Hopper-v5"]
    assert copied and all(r["same_task_as"] == "gymnasium/Hopper-v5" for r in copied)


def test_the_slow_simulator_suite_is_the_articles_regime_for_every_mode():
    """mujoco-slow: 8 samplers sharing the preset's 16 envs, each env step +5 ms, the last 4x
    slower; barrier waits for all 8 chunks, the async modes take a batch of 8 chunks."""
    plan = bm.resolve_plan("mujoco-slow", envs=["gymnasium/Walker2d-v5"], seeds=1)
    assert plan.modes == ("barrier", "async", "async-decoupled") and plan.total_env_steps == 1_000_000
    configs = {m: bm.run_config(plan, "gymnasium/Walker2d-v5", m, 0, None) for m in plan.modes}
    for mode, config in configs.items():
        t = config.threaded
        assert (config.num_samplers, config.rollout.num_envs, config.batch_size) == (8, 2, 2048), mode
        assert t.sampler_step_latency_ms == (5.0,) * 7 + (20.0,), mode
        assert t.barrier == (mode == "barrier")
    assert configs["async"].threaded.chunks_per_batch == configs["async-decoupled"].threaded.chunks_per_batch == 8
    same = {m: c.replace(threaded=configs["barrier"].threaded, ppo=configs["barrier"].ppo) for m, c in configs.items()}
    assert same["async"] == same["async-decoupled"] == same["barrier"]  # nothing else differs


def test_async_needs_envs_its_samplers_can_share():
    plan = bm.resolve_plan("mujoco-slow", envs=["gymnasium/Hopper-v5"], modes=["async"],
                           changes=parse_assignments(["rollout.num_envs=12"]))
    with pytest.raises(ConfigError, match=r"rollout.num_envs = 12 is invalid: .* 8 samplers, so it must be a multiple of 8"):
        bm.run_config(plan, "gymnasium/Hopper-v5", "async", 0, None)
    plan = plan._replace(changes=(("rollout.num_envs", 24),))
    assert bm.run_config(plan, "gymnasium/Hopper-v5", "async", 0, None).rollout.num_envs == 3


def test_an_ablation_sets_its_fields_over_the_preset_and_the_mode():
    plan = bm.resolve_plan("mujoco", envs=["gymnasium/Hopper-v5"], modes=["barrier"],
                           changes=parse_assignments(["rollout.normalize_reward=false", "ppo.num_epochs=4"]))
    assert plan.changes == (("ppo.num_epochs", 4), ("rollout.normalize_reward", False))
    config = bm.run_config(plan, "gymnasium/Hopper-v5", "barrier", 0, None)
    preset = pa.config_for_env("gymnasium/Hopper-v5", {"mode": "threaded"})
    assert (config.ppo.num_epochs, config.rollout.normalize_reward) == (4, False)
    assert (config.ppo.num_minibatches, config.threaded.barrier) == (preset.ppo.num_minibatches, True)  # the rest stays
    assert bm.plan_spec(plan)["changes"] == [["ppo.num_epochs", 4], ["rollout.normalize_reward", False]]


def test_cli_errors_and_help(cli_main):
    proc = cli_main(["benchmark", "--suite", "atari", "--out", "unused"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: --suite = 'atari'")  # the flag (issue 27)
    proc = cli_main(["benchmark", "--modes", "fast"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--modes" in proc.stderr
    proc = cli_main(["benchmark", "--help"])
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m ppo_async benchmark")
    for option in ("--suite NAME", "--envs NAME", "--total-env-steps N", "--modes MODE", "--eval-every-steps N",
                   "--eval-episodes N", "--report-only"):
        assert option in proc.stdout, option


def test_added_modes_or_envs_extend_a_benchmark_whose_recorded_configs_are_unchanged(tmp_path):
    """check_spec: a call naming every recorded mode (env) and more extends OUT (benchmark.json
    rewritten); one whose recorded env x mode has another config, or that drops one, is refused."""
    plan = bm.resolve_plan("classic", envs=["Pendulum-v1"], modes=["sync"], seeds=2, total_env_steps=2048)
    first = bm.plan_spec(plan)
    bm.check_spec(str(tmp_path), first)
    wider = bm.plan_spec(plan._replace(modes=("sync", "barrier")))
    assert set(wider["configs"]) == {"Pendulum-v1 sync", "Pendulum-v1 barrier"}
    bm.check_spec(str(tmp_path), wider)
    with open(tmp_path / "benchmark.json", encoding="utf-8") as f:
        assert json.load(f)["modes"] == ["sync", "barrier"]
    with pytest.raises(ConfigError, match=r"modes=\['sync', 'barrier'\] \(now \['sync'\]\)"):
        bm.check_spec(str(tmp_path), first)  # a mode dropped: other arguments
    changed = bm.plan_spec(plan._replace(modes=("sync", "barrier"), envs=("Pendulum-v1", "CartPole-v1")))
    changed["configs"]["Pendulum-v1 barrier"]["ppo"]["clip_eps"] = 0.3
    with pytest.raises(ConfigError, match=r"configs differ from today's .*Pendulum-v1 barrier\.ppo\.clip_eps"):
        bm.check_spec(str(tmp_path), changed)


def test_a_config_field_added_since_a_benchmark_was_recorded_counts_only_when_not_at_its_default(tmp_path):
    """A benchmark recorded before a field existed (its configs lack it) resumes when today's
    config holds the field's default there (the recorded runs ran with it), not otherwise."""
    plan = bm.resolve_plan("classic", envs=["Pendulum-v1"], modes=["sync"], seeds=2, total_env_steps=2048)
    recorded = bm.plan_spec(plan)
    del recorded["configs"]["Pendulum-v1 sync"]["ppo"]["clip_eps"]
    del recorded["configs"]["Pendulum-v1 sync"]["distributed"]
    bm.check_spec(str(tmp_path), recorded)
    bm.check_spec(str(tmp_path), bm.plan_spec(plan))  # today's: clip_eps and distributed.* at their defaults
    changed = bm.plan_spec(plan)
    changed["configs"]["Pendulum-v1 sync"]["ppo"]["clip_eps"] = 0.3
    with pytest.raises(ConfigError, match=r"configs differ from today's .*Pendulum-v1 sync\.ppo\.clip_eps"):
        bm.check_spec(str(tmp_path), changed)


def test_timing_row_and_roofline_by_hand():
    """Two iterations of a barrier run of 2 samplers (one chunk each per iteration): the busiest
    sampler's rollout + latency over its 2 chunks; the learner's work summed over its parts."""
    from ppo_async.study.benchmark import timings

    rows = [{"iteration": 1, "learner_update_s": 0.10, "learner_place_s": 0.01, "learner_wait_s": 0.5, "approx_kl": 0.01,
             "kl_staleness": 0.0, "kl_update": 0.01, "lag_mean": 0.0, "lag_histogram": [8], "wall_time": 1.0},
            {"iteration": 2, "learner_update_s": 0.20, "learner_place_s": 0.01, "learner_fetch_s": 0.02, "learner_wait_s": 0.7,
             "approx_kl": 0.03, "kl_staleness": 0.08, "kl_update": 0.05, "lag_mean": 1.0, "lag_histogram": [2, 6],
             "wall_time": 2.5,
             "sampler_rollout_s": [1.0, 1.4], "sampler_latency_s": [0.2, 0.0]}]
    row = timings.timing_row(rows, "E", "barrier", 0, chunks_per_iteration=2, num_samplers=2)
    assert row["sample_s"] == pytest.approx(1.4 / 2)  # max(1.0 + 0.2, 1.4 + 0.0) over 2 chunks each
    assert row["learn_s"] == pytest.approx((0.11 + 0.23) / 2) and row["wait_s"] == pytest.approx(0.6)
    assert (row["iterations"], row["wall_s"], row["lag_histogram"]) == (2, 2.5, "[10, 6]")
    assert row["approx_kl"] == pytest.approx(0.02)
    assert (row["kl_staleness"], row["kl_update"]) == (pytest.approx(0.04), pytest.approx(0.03))
    assert math.isnan(row["entropy_end"])  # (no entropy in these rows)
    tail = [{**rows[0], "iteration": i, "entropy": float(i)} for i in range(1, 21)]  # the last 10%: iterations 19, 20
    assert timings.timing_row(tail, "E", "barrier", 0, 2, 2)["entropy_end"] == pytest.approx(19.5)
    assert timings.roofline(0.3, 0.1) == pytest.approx(4 / 3) and timings.roofline(0.1, 0.1) == 2.0
    assert math.isnan(timings.roofline(math.nan, 0.1))
    assert timings.lag_fractions(["[10, 6]", "[0, 0, 2, 2]"]) == pytest.approx([0.5, 0.3, 0.1, 0.1])
    assert timings.timing_row([{"iteration": 1, "policy_loss": 0.1}], "E", "sync", 0, 1, 1) is None  # no learner timings


def test_runs_side_by_side_record_what_runs_one_after_another_record(tmp_path):
    """jobs = 2: two runs trained at once in worker processes, recorded by the parent; seed 0's
    rows equal those of the same run trained in this process (sync mode: deterministic), the
    manifest says how many ran at once, and a second call finds both done."""
    from ppo_async.study.manifest import read_manifest

    spec = dict(suite="classic", envs=["Pendulum-v1"], modes=["sync"], total_env_steps=2048, eval_every_steps=1024,
                eval_episodes=1, progress=False, changes={"rollout.num_envs": 4, "rollout.num_steps": 64,
                                                           "ppo.num_minibatches": 2})
    seen: list[tuple[int, str]] = []
    side = pa.benchmark(seeds=2, out=tmp_path / "side", jobs=2, on_run=lambda e, m, s, how: seen.append((s, how)), **spec)
    serial = pa.benchmark(seeds=1, out=tmp_path / "serial", **spec)
    assert sorted(seen) == [(0, "fresh"), (1, "fresh")]
    columns = ["checkpoint", "env_steps", "eval_return", "train_return", "final"]
    pd.testing.assert_frame_equal(side[side["seed"] == 0][columns].reset_index(drop=True), serial[columns])
    assert side[side["seed"] == 1]["eval_return"].notna().all()
    manifest = read_manifest(str(tmp_path / "side"))
    assert manifest["jobs"] == 2 and manifest["runs"] == {"fresh": 2}
    seen.clear()
    pa.benchmark(seeds=2, out=tmp_path / "side", jobs=2, on_run=lambda e, m, s, how: seen.append((s, how)), **spec)
    assert sorted(seen) == [(0, "skipped"), (1, "skipped")]
    with pytest.raises(ConfigError, match=r"^jobs = 0 is invalid: must be an integer >= 1"):
        pa.benchmark(seeds=1, out=tmp_path / "bad", jobs=0, **spec)


def test_a_threaded_benchmark_writes_timings_and_the_report_its_roofline(tmp_path):
    """A tiny classic benchmark in barrier and async: timings.csv holds a row per run and
    the report where the time goes, the roofline and the lag histogram."""
    from ppo_async.study.benchmark import timings

    out = tmp_path / "bench"
    pa.benchmark(suite="classic", seeds=1, envs=["Pendulum-v1"], modes=["barrier", "async"], total_env_steps=4096,
                 eval_every_steps=2048, eval_episodes=1, out=out, progress=False,
                 changes={"rollout.num_envs": 4, "rollout.num_steps": 64, "ppo.num_minibatches": 2})
    df = timings.read_timings(str(out))
    assert sorted(df["mode"]) == ["async", "barrier"] and (df["iterations"] > 0).all()
    assert (df["sample_s"] > 0).all() and (df["learn_s"] > 0).all()
    barrier = df[df["mode"] == "barrier"].iloc[0]
    assert json.loads(barrier["lag_histogram"])[0] == barrier["iterations"] * 256  # barrier: every sample at lag 0
    text = (out / "report.md").read_text()
    assert "## Where the time goes" in text and "roofline" in text and "| Pendulum-v1 | async |" in text
    assert "async-decoupled" not in text  # (a mode the benchmark did not run has no row)
    assert "| approx KL | KL staleness | KL update | entropy |" in text
    assert df["kl_staleness"].notna().all() and (df[df["mode"] == "barrier"]["kl_staleness"] < 1e-3).all()
    # A timings.csv written before the KL parts and the entropy were recorded, one row lost: the
    # backfill rewrites both rows from the run directories, equal to the rows written at the end.
    from ppo_async.study.benchmark.runner import backfill_timings

    df.drop(columns=["kl_staleness", "kl_update", "entropy_end"]).iloc[:1].to_csv(out / timings.TIMINGS_FILE, index=False)
    assert timings.read_timings(str(out))["entropy_end"].isna().all()
    plan = bm.resolve_plan("classic", ["Pendulum-v1"], ["barrier", "async"], 1, 4096, 2048, 1,
                           {"rollout.num_envs": 4, "rollout.num_steps": 64, "ppo.num_minibatches": 2})
    assert backfill_timings(str(out), plan, None) == 2
    again = timings.read_timings(str(out)).sort_values("mode", ignore_index=True)
    pd.testing.assert_frame_equal(again, df.sort_values("mode", ignore_index=True), check_dtype=False)
    assert backfill_timings(str(out), plan, None) == 0  # complete rows are left alone


def test_a_threaded_run_cut_short_resumes_from_its_last_evaluation(tmp_path, monkeypatch):
    """Threaded runs checkpoint at each evaluation and a benchmark run again resumes one that was
    killed from its checkpoint (not from scratch): its earlier rows and wall log are kept."""
    from ppo_async.study.benchmark import runner

    spec = dict(suite="classic", seeds=1, envs=["Pendulum-v1"], modes=["barrier"], total_env_steps=4096,
                eval_every_steps=1024, eval_episodes=2, progress=False)
    plan = bm.resolve_plan(**{k: v for k, v in spec.items() if k != "progress"})
    config = bm.run_config(plan, "Pendulum-v1", "barrier", 0, "somewhere")
    assert config.num_iterations == 4 and config.checkpoint_every_iterations == config.eval_every_iterations == 1

    class KilledAtThree(bm.WallLog):
        def __call__(self, rows):
            if int(rows[0]["iteration"]) == 3:
                raise Killed()
            super().__call__(rows)

    monkeypatch.setattr(runner, "WallLog", KilledAtThree)
    with pytest.raises(Exception):
        pa.benchmark(out=tmp_path, **spec)
    run_dir = bm.run_dir_of(str(tmp_path), "Pendulum-v1", "barrier", 0)
    assert not os.path.isfile(os.path.join(run_dir, bm.DONE_FILE))
    monkeypatch.setattr(runner, "WallLog", bm.WallLog)
    calls = []
    df = pa.benchmark(out=tmp_path, on_run=lambda *a: calls.append(a[3]), **spec)
    assert calls == ["resumed"]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8")]
    # iteration 3's row and checkpoint were written before its wall-log entry killed the run:
    # the rows up to 3 are kept and only iteration 4 ran after the resume
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert [r.get("resumed_at_iteration") for r in rows] == [None, None, None, 3]
    walls = bm.read_walls(run_dir)
    assert sorted(walls) == [1, 2, 4] and walls[4] > walls[2]  # 3's entry died with the run; 4's counts on from 2's
    assert sorted(df["checkpoint"]) == [1024, 2048, 3072, 4096] and df["eval_return"].notna().all()
