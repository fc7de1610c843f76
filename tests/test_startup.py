"""Time to a first result (issue 40 item 12): where a run's start goes (`ppo_async.run.startup`),
RUN_DIR/startup.json, `train --timings`, the lazy imports on the way to the first result, and
experiments/bench_startup.py at toy sizes. Behaviour only: no duration is asserted."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

import ppo_async as pa
from ppo_async.run import startup
from ppo_async.run.startup import (CACHE_LOAD_EVENT, COMPILE_EVENT, LOWER_EVENT, PROGRAM_CACHE_EVENT, STARTUP_FIELDS, TRACE_EVENT,
                                   StartupClock)

from conftest import REPO_ROOT

TINY = ["--env", "CartPole-v1", "--total-env-steps", "128", "--rollout.num-envs", "4", "--rollout.num-steps", "16",
        "--ppo.num-epochs", "1", "--ppo.num-minibatches", "2"]


def span_listeners() -> list:
    from jax._src import monitoring

    return monitoring.get_event_time_span_listeners() + monitoring.get_event_duration_listeners()


def test_breakdown_of_hand_made_events():
    """Events at known wall times: train() at 100, trace 101-102, lowering 102-102.5, compile
    102.5-105 (one loaded from the cache in 0.5 of it), writers opened in 0.25 s after it,
    first result at 106."""
    clock = StartupClock()
    clock.stop()
    clock._listening = True  # fed by hand below, not by JAX
    clock.started, clock.before_train = 100.0, 3.0
    clock._on_span(TRACE_EVENT, 101.0, 102.0)
    clock._on_span(LOWER_EVENT, 102.0, 102.5)
    clock._on_span(COMPILE_EVENT, 102.5, 105.0)
    clock._on_duration(CACHE_LOAD_EVENT, 0.5)
    clock._on_duration(PROGRAM_CACHE_EVENT, 0.01)  # one traced program read from the program cache
    clock._on_span("/jax/some/other_event", 0.0, 50.0)  # not counted
    clock.writers_opened(0.25)
    clock._writers_at = 105.25
    clock.first_result_at = 106.0
    got = clock.breakdown()
    assert list(got) == list(STARTUP_FIELDS)
    assert got == pytest.approx({
        "before_train_s": 3.0, "setup_s": 6.0 - 1.0 - 0.5 - 2.5 - 0.25 - 0.75, "tracing_s": 1.0, "lowering_s": 0.5,
        "compile_s": 2.5, "cache_load_s": 0.5, "writers_s": 0.25, "first_iteration_s": 0.75,
        "train_to_first_result_s": 6.0, "first_result_s": 9.0, "traces": 1, "compiles": 1, "cache_hits": 1,
        "program_cache_hits": 1,
    })
    line = startup.describe(got)
    assert line.startswith("first result after 9.0s: before train() 3.0s, set-up (env, programs) 1.0s, tracing 1.0s")
    assert "XLA compile 2.5s (1 programs, 1 from the cache; 1 traced programs from the program cache)" in line and line.endswith("first iteration 0.8s")


def test_a_clock_without_events_or_process_age():
    clock = StartupClock()
    clock.stop()
    clock.before_train = None
    clock.first_result()
    got = clock.breakdown()
    assert got["before_train_s"] is None and got["first_result_s"] is None
    assert got["compiles"] == 0 and got["first_iteration_s"] == pytest.approx(got["train_to_first_result_s"])
    assert "first result after ?:" in startup.describe(got)


def test_process_age_is_read_on_linux():
    age = startup.process_age()
    if not os.path.isfile("/proc/self/stat"):
        assert age is None
    else:
        assert age is not None and age > 0


def test_a_run_records_its_start(tmp_path):
    before = len(span_listeners())
    run_dir = tmp_path / "run"
    config = pa.Config(env="CartPole-v1", total_env_steps=2 * 64, run_dir=str(run_dir),
                       rollout=pa.RolloutConfig(num_envs=4, num_steps=16), ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2))
    result = pa.train(config)
    assert len(span_listeners()) == before  # the clock stopped listening
    with open(run_dir / startup.STARTUP_FILE, encoding="utf-8") as f:
        saved = json.load(f)
    assert list(saved) == list(STARTUP_FIELDS) and result.extras["startup"] == saved
    assert all(saved[name] is None or saved[name] >= 0 for name in STARTUP_FIELDS)
    parts = ("setup_s", "tracing_s", "lowering_s", "compile_s", "writers_s", "first_iteration_s")
    if saved["setup_s"] > 0:  # (0 only where compiles overlapped; not in a sync run)
        assert sum(saved[p] for p in parts) == pytest.approx(saved["train_to_first_result_s"])
    assert saved["cache_load_s"] <= saved["compile_s"] and saved["cache_hits"] <= saved["compiles"]
    # a run without a run directory keeps it in its result only
    assert set(pa.train(config.replace(run_dir=None)).extras["startup"]) == set(STARTUP_FIELDS)


def test_train_timings_prints_the_breakdown(tmp_path, monkeypatch):
    from ppo_async.cli import main

    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(["train", *TINY, "--run-dir", "run", "--quiet", "--timings"])
    assert status == 0, out.getvalue()
    lines = out.getvalue().strip().splitlines()
    assert lines[-1].startswith("first result after ") and lines[-1].endswith(f"({os.path.join('run', 'startup.json')})")
    assert "XLA compile" in lines[-1] and os.path.isfile(tmp_path / "run" / "startup.json")


def test_the_way_to_a_first_result_imports_no_orbax_or_pandas():
    """Checkpoints (orbax) are written at the end of a default run and the summary (pandas)
    after it: importing the training entry points imports neither."""
    code = ("import sys, ppo_async.modes.train, ppo_async.modes, ppo_async.run.recorder\n"
            "print([m for m in ('orbax', 'pandas', 'matplotlib') if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_gymnax_env_is_made_without_the_plotting_stack_its_renderers_import():
    """gymnax 1.0.1's env modules import seaborn (with scipy.stats and pandas) and pyplot at
    module level, for rendering only (~1,000 modules): making a gymnax env and checking its
    name import none of them, a later `import seaborn` / `import matplotlib.pyplot` gets the
    real module, and a gymnax renderer still reaches it (envs/gymnax_import.py)."""
    code = (
        "import sys\n"
        "from ppo_async.config import Config\n"
        "from ppo_async.envs import make_env\n"
        "Config(env='CartPole-v1'); make_env('MountainCar-v0')\n"
        "print(sorted(m for m in ('seaborn', 'matplotlib.pyplot', 'pandas', 'scipy.stats') if m in sys.modules))\n"
        "from gymnax.environments.misc import pong\n"
        "import seaborn, matplotlib.pyplot as plt\n"
        "from ppo_async.envs.gymnax_import import DeferredModule\n"
        "print(isinstance(seaborn, DeferredModule), isinstance(plt, DeferredModule),\n"
        "      pong.sns.color_palette is seaborn.color_palette, pong.plt.figure is plt.figure)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-2:] == ["[]", "False False True True"]


FAKE_PEER = """import jax, jax.numpy as jnp


def make_train(config):
    def train(key):
        return {"metrics": jax.random.normal(key, (config["NUM_ENVS"], config["NUM_STEPS"])).sum()}
    return train
"""


def test_bench_startup_runs_at_toy_sizes(tmp_path):
    """The script's whole plumbing (fresh processes, startup.json, the report and the manifest)
    at toy sizes, with a stand-in for PureJaxRL (a checkout whose two scripts' make_train run a
    tiny program): both comparisons with the peer are made and reported."""
    peer = tmp_path / "fake_purejaxrl"
    (peer / "purejaxrl").mkdir(parents=True)
    for name in ("ppo.py", "ppo_continuous_action.py"):
        (peer / "purejaxrl" / name).write_text(FAKE_PEER)
    out = tmp_path / "bench"
    done = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "experiments", "bench_startup.py"), "--smoke", "--repeats", "1",
         "--peer-dir", str(peer), "--out", str(out)],
        capture_output=True, text=True, timeout=1200, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(out / "results.json", encoding="utf-8") as f:
        results = json.load(f)
    assert set(results["sides"]) == {"bare_import", "cold", "warm", "steady", "peer", "peer_steady"}
    assert results["peer"]["available"] is True and results["peer"]["versions"]["jax"]
    assert results["peer"]["cold_over_peer"] > 0 and results["peer"]["steady_over_peer"] > 0
    assert results["peer"]["steady_env_steps_per_s"] == pytest.approx(
        results["args"]["steady_steps"] / results["sides"]["peer_steady"][0]["run_s"])
    assert results["warm"]["startup"] and set(results["warm"]["startup"]) == set(STARTUP_FIELDS)
    # the warm process reads both traced programs (init, step) the cold one stored
    assert results["cold"]["startup"]["program_cache_hits"] == 0 and results["warm"]["startup"]["program_cache_hits"] == 2
    assert results["steady"]["env_steps_per_s"] > 0
    report = (out / "report.txt").read_text()
    assert "ours / peer = " in report and "the peer (ppo_continuous_action.py" in report
    with open(out / "manifest.json", encoding="utf-8") as f:
        assert json.load(f)["completed"] is True


def test_bench_startup_says_why_the_peer_is_missing(tmp_path):
    sys.path.insert(0, os.path.join(REPO_ROOT, "experiments"))
    try:
        import bench_startup
    finally:
        sys.path.pop(0)
    assert bench_startup.find_peer(str(tmp_path))[0] is None and "holds no purejaxrl/ppo.py" in bench_startup.find_peer(str(tmp_path))[1]
    assert bench_startup.find_peer(None)[0] is None or os.environ.get(bench_startup.PEER_ENV)
