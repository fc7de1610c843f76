"""Test configuration: shared fixtures. XLA flags (if any) belong here or in subprocess envs,
never in the library."""

from __future__ import annotations

import os
import subprocess
import sys

# Entry point of the test process: XLA flags before JAX starts (see ppo_async/xla_flags.py).
from ppo_async.xla_flags import apply_cpu_workarounds  # noqa: E402  (imports no JAX backend)

apply_cpu_workarounds()
# Entry points (the CLI, subprocesses of it) enable a persistent compilation cache in the user's
# cache directory; tests leave it off unless PPO_ASYNC_COMPILATION_CACHE is set explicitly.
os.environ.setdefault("PPO_ASYNC_COMPILATION_CACHE", "0")

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
