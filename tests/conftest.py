"""Test configuration: shared fixtures. XLA flags (if any) belong here or in subprocess envs,
never in the library."""

from __future__ import annotations

import os
import subprocess
import sys

# Entry point of the test process: XLA flags before JAX starts (see ppo_async/xla_flags.py).
from ppo_async.runtime.xla_flags import apply_cpu_workarounds  # noqa: E402  (imports no JAX backend)

# Tests run tiny budgets, so compiling dominates their time. Three XLA CPU flags cut it:
# - backend optimisation level 0: about a third faster (two slow tests 53.6 s -> 35.8 s);
# - no fusion emitters, no expensive LLVM passes (FAST_COMPILE_FLAGS): on top of that, a tiny
#   sync `train` 8.6 s -> 5.0 s and the Playground/Brax tests 103.6 s -> 77.2 s (jaxlib 0.10.2,
#   2 cores); the suite 864 s -> 506 s.
# Tests compare runs of the same process or of subprocesses that inherit these flags, never
# against numbers from optimised code. But without fusion emitters XLA may round one value
# differently where two programs (or two fusions of one) compute it: the tests marked
# `exact_xla`, which compare such values bit for bit, run in a second pytest invocation,
# `EXACT_XLA_COMMAND`, under XLA's default code generation (PPO_ASYNC_TEST_EXACT_XLA=1: these
# flags are left off); the main run skips them, naming that command (`exact_xla_skip_reason`).
# XLA aborts the process on a flag it does not know, so FAST_COMPILE_FLAGS are only set on the
# jaxlib minor version they were measured on. Set before JAX starts; subprocesses inherit
# os.environ.
from importlib.metadata import version as _version  # noqa: E402

EXACT_XLA_ENV = "PPO_ASYNC_TEST_EXACT_XLA"  # "1": this pytest runs the exact_xla tests, fast flags off
EXACT_XLA_COMMAND = f"{EXACT_XLA_ENV}=1 python -m pytest -q -m exact_xla"  # README's test command ends with it
EXACT_XLA_RUN = os.environ.get(EXACT_XLA_ENV) == "1"
FAST_COMPILE_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_llvm_disable_expensive_passes=true")
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0",)
if _version("jaxlib").split(".")[:2] == ["0", "10"] and not EXACT_XLA_RUN:
    TEST_XLA_FLAGS += FAST_COMPILE_FLAGS
_flags = os.environ.get("XLA_FLAGS", "").split()
if EXACT_XLA_RUN:  # default code generation, whatever the caller's XLA_FLAGS asked
    _flags = [f for f in _flags if f not in FAST_COMPILE_FLAGS]
os.environ["XLA_FLAGS"] = " ".join(_flags + [f for f in TEST_XLA_FLAGS if f.split("=")[0] not in {g.split("=")[0] for g in _flags}])
apply_cpu_workarounds()
# The persistent compilation cache, in a directory of this test run (never the user's):
# many tests and their subprocesses compile the same tiny programs. The xdist workers of one
# run share it (PYTEST_XDIST_TESTRUNUID); PPO_ASYNC_COMPILATION_CACHE set by the caller wins
# (0 turns it off).
import tempfile  # noqa: E402

from ppo_async.runtime.xla_flags import COMPILATION_CACHE_ENV, enable_compilation_cache  # noqa: E402

_RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
os.environ.setdefault(COMPILATION_CACHE_ENV, os.path.join(tempfile.gettempdir(), f"ppo_async-test-cache-{_RUN_ID}"))
enable_compilation_cache()

import pytest  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_module(args: list[str], cwd: str | None = None, env_extra: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python -m ppo_async ARGS` in a subprocess and returns the completed process."""
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "ppo_async", *args],
        cwd=cwd or REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def sigkill_train_when(args: list[str], ready, timeout: float = 120) -> None:
    """Starts `python -m ppo_async ARGS`, waits until `ready()` (polled every 20 ms), then kills it
    with SIGKILL. Fails if the run ends (or dies) before it could be killed."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "ppo_async", *args], cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None and not ready():
            time.sleep(0.02)
        assert proc.poll() is None, "the run finished (or died) before it could be killed: " + proc.stderr.read().decode()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL


TIME_SCALE_ENV = "PPO_ASYNC_TEST_TIME_SCALE"


def time_scale() -> float:
    """How much slower than on idle cores the tests may see things happen: the value of
    PPO_ASYNC_TEST_TIME_SCALE when set, else 1 + the load per core when the test starts
    (1-minute load average; a benchmark beside the suite on 2 cores: ~3). Tests assert events;
    where a bound on a duration is the point (an error must reach the caller within seconds,
    a process must not wait out a timeout) it is written for idle cores and multiplied by this."""
    if os.environ.get(TIME_SCALE_ENV):
        return float(os.environ[TIME_SCALE_ENV])
    return 1.0 + os.getloadavg()[0] / (os.cpu_count() or 1)


@pytest.fixture
def time_bound():
    """`time_bound(seconds)`: a bound written for idle cores, scaled by `time_scale()`."""
    scale = time_scale()
    return lambda seconds: seconds * scale


@pytest.fixture(scope="module")
def pendulum():
    from ppo_async import envs

    return envs.make_env("Pendulum-v1")


@pytest.fixture(scope="module")
def cartpole():
    from ppo_async import envs

    return envs.make_env("CartPole-v1")


@pytest.fixture
def nan_rewards(monkeypatch):
    """Makes every env step return NaN rewards (patched where rollouts look it up, at trace time)."""
    import jax.numpy as jnp

    from ppo_async import envs

    real_step = envs.step_envs

    def poisoned(env, state, action, key, clip_actions=True):
        next_state, step = real_step(env, state, action, key, clip_actions)
        return next_state, step._replace(reward=step.reward * jnp.nan)

    monkeypatch.setattr(envs, "step_envs", poisoned)
    # threaded runs keep compiled programs across runs of one shape: trace them anew, poisoned
    # (and again after the test, unpoisoned)
    from ppo_async.modes.threaded import clear_program_cache

    clear_program_cache()
    yield
    clear_program_cache()


@pytest.fixture
def run_cli():
    """`python -m ppo_async ARGS` in a subprocess (for what needs a process: exit codes of
    the interpreter, signals, a fresh JAX, what a user's shell sees)."""
    return run_module


@pytest.fixture
def cli_main(capsys):
    """`ppo_async.cli.main(ARGS)` in this process, as a CompletedProcess (returncode, stdout,
    stderr): the same command line without paying a new interpreter's JAX and gymnax imports
    (~7 s each here) and sharing this process's compiled programs."""
    from ppo_async.cli import main

    def call(args: list[str]) -> subprocess.CompletedProcess:
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse / tyro exit for --help and usage errors
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    return call


def exact_xla_skip_reason(marked: bool, exact_run: bool = EXACT_XLA_RUN) -> str | None:
    """Why a test is skipped in this pytest, or None when it runs here: an `exact_xla` test runs
    only in the second invocation (`EXACT_XLA_COMMAND`), every other test in both (the second
    selects only exact_xla ones with `-m`). So each exact_xla test runs in exactly one of the two."""
    if not marked or exact_run:
        return None
    return (f"exact_xla: compares compiled programs bit for bit, so it runs under XLA's default code generation "
            f"in the second invocation: {EXACT_XLA_COMMAND}")


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup hook reads the marks
def pytest_collection_modifyitems(config, items):
    """Skips the `exact_xla` tests outside their own invocation (`exact_xla_skip_reason`). Under
    pytest-xdist `--dist loadgroup`, the tests of a module that share one of its own
    module-scoped fixtures (a trained run, a subprocess) go to one worker, so the fixture is
    built once, not once per worker; every other test is distributed on its own."""
    for item in items:
        reason = exact_xla_skip_reason(item.get_closest_marker("exact_xla") is not None)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
        info = getattr(item, "_fixtureinfo", None)
        module = getattr(item, "module", None)
        if info is None or module is None:
            continue
        module_id = item.nodeid.split("::")[0]  # fixtures defined in the test module itself have it as baseid
        shared = [
            name for name in item.fixturenames
            for d in info.name2fixturedefs.get(name, ())
            if d.scope == "module" and d.baseid == module_id
        ]
        if shared:
            item.add_marker(pytest.mark.xdist_group(module.__name__))
    # The longest modules first: xdist hands out work in this order, so the last minute holds
    # short tests that even out the two workers, not one 50 s test with the other worker idle.
    items.sort(key=lambda item: LONGEST_FIRST.index(item.nodeid.split("::")[0]) if item.nodeid.split("::")[0] in LONGEST_FIRST
               else len(LONGEST_FIRST))


# Modules by descending worker time in the suite (measured with --durations=0, 2 workers, 2026-12-05).
LONGEST_FIRST = [f"tests/{name}.py" for name in (
    "test_docs", "test_distributed", "test_env_families", "test_benchmark", "test_sync", "test_knobs", "test_cli_tools",
    "test_threaded", "test_simulated", "test_resume", "test_sweep", "test_bad_inputs", "test_program_cache", "test_compare",
)]
