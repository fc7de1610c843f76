"""Test configuration: shared fixtures. XLA flags (if any) belong here or in subprocess envs,
never in the library."""

from __future__ import annotations

import os
import subprocess
import sys

# Entry point of the test process: XLA flags before JAX starts (see ppo_async/xla_flags.py).
from ppo_async.xla_flags import apply_cpu_workarounds  # noqa: E402  (imports no JAX backend)

apply_cpu_workarounds()
# The persistent compilation cache, in a directory of this test run (never the user's):
# many tests and their subprocesses compile the same tiny programs. The xdist workers of one
# run share it (PYTEST_XDIST_TESTRUNUID); PPO_ASYNC_COMPILATION_CACHE set by the caller wins
# (0 turns it off).
import tempfile  # noqa: E402

from ppo_async.xla_flags import COMPILATION_CACHE_ENV, enable_compilation_cache  # noqa: E402

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


@pytest.fixture
def run_cli():
    return run_module
