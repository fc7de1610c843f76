"""The persistent compilation cache of the entry points (`xla_flags.enable_compilation_cache`).

The subprocess tests point PPO_ASYNC_COMPILATION_CACHE at a temporary directory of their own
(the rest of the suite shares one cache directory per test run, set in conftest.py), so a
cold and a warm process can be compared.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ppo_async.runtime import xla_flags
from ppo_async.runtime.xla_flags import COMPILATION_CACHE_ENV, compilation_cache_dir, enable_compilation_cache

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 128  # two iterations of the small shape below (4 envs x 16 steps)
SMALL = ["--rollout.num-envs", "4", "--rollout.num-steps", "16", "--ppo.num-epochs", "1", "--ppo.num-minibatches", "2",
         "--network.actor-hidden", "16", "--network.critic-hidden", "16"]  # compiles faster; the cache works alike


def cache_env(cache: str) -> dict[str, str]:
    env = dict(os.environ)
    env[COMPILATION_CACHE_ENV] = cache
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def cache_files(cache: str) -> set[str]:
    return set(os.listdir(cache)) if os.path.isdir(cache) else set()


def test_cli_fills_and_reuses_the_cache(tmp_path):
    """A second identical `train` hits the cache for every program: it writes no new entry
    (every compile writes one: `jax_persistent_cache_min_compile_time_secs = 0`). How much time
    that saves is measured by experiments/bench_sync.py, not asserted here: under the suite's
    fast-compile flags and two busy workers the difference is within the noise."""
    cache = str(tmp_path / "cache")
    env = cache_env(cache)
    train = ["-m", "ppo_async", "train", "--total-env-steps", str(STEPS), *SMALL]
    compile_s = re.compile(r"\(\+([0-9.]+)s compile\)")
    cold = run(train + ["--run-dir", str(tmp_path / "r1")], env)
    first = cache_files(cache)
    assert any(name.endswith("-cache") for name in first), first
    warm = run(train + ["--run-dir", str(tmp_path / "r2")], env)
    assert cache_files(cache) == first  # every program of the second run was a cache hit
    cold_s, warm_s = (float(compile_s.search(p.stdout).group(1)) for p in (cold, warm))
    print(f"time to first iteration: cold {cold_s:.2f}s, warm {warm_s:.2f}s")


@pytest.mark.parametrize("value", ["0", "off", "OFF", "false", "no", "", " 0 "])
def test_disabled_by_environment(value, tmp_path, monkeypatch):
    import jax

    monkeypatch.setenv(COMPILATION_CACHE_ENV, value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    before = jax.config.values["jax_compilation_cache_dir"]
    assert compilation_cache_dir() is None
    assert enable_compilation_cache() is None
    assert jax.config.values["jax_compilation_cache_dir"] == before
    jax.block_until_ready(jax.jit(lambda x: x * 3.0 + 1.0)(jax.numpy.ones(7)))
    assert list(tmp_path.iterdir()) == []  # nothing created, nothing written


def test_directory_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv(COMPILATION_CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compilation_cache_dir() == str(tmp_path / "xdg" / "ppo_async" / "jax")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compilation_cache_dir() == str(tmp_path / "home" / ".cache" / "ppo_async" / "jax")
    monkeypatch.setenv(COMPILATION_CACHE_ENV, str(tmp_path / "mine"))
    assert compilation_cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv(COMPILATION_CACHE_ENV, "0")
    assert compilation_cache_dir(str(tmp_path / "explicit")) == str(tmp_path / "explicit")  # an argument wins
    assert compilation_cache_dir(environ={}) is not None  # unset -> the default directory
    assert compilation_cache_dir(environ={COMPILATION_CACHE_ENV: "rel"}) == os.path.abspath("rel")


@pytest.fixture
def restore_cache_config():
    """Puts this process's JAX cache settings back (the test process must not keep a cache on)."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")
    saved = {name: jax.config.values[name] for name in names}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


def test_path_is_used(tmp_path, monkeypatch, restore_cache_config):
    import jax

    monkeypatch.setenv(COMPILATION_CACHE_ENV, str(tmp_path / "from_env"))
    assert enable_compilation_cache() == str(tmp_path / "from_env")
    assert jax.config.values["jax_compilation_cache_dir"] == str(tmp_path / "from_env")
    assert jax.config.values["jax_persistent_cache_min_compile_time_secs"] == 0.0
    jax.block_until_ready(jax.jit(lambda x: x * 5.0 - 2.0)(jax.numpy.ones(11)))
    assert cache_files(str(tmp_path / "from_env"))
    # a second call with another directory switches to it (the initialised cache is reset)
    explicit = tmp_path / "explicit"
    assert enable_compilation_cache(str(explicit)) == str(explicit)
    jax.block_until_ready(jax.jit(lambda x: x * 7.0 - 3.0)(jax.numpy.ones(13)))
    assert cache_files(str(explicit))


def test_unwritable_directory_leaves_the_cache_off(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.warns(UserWarning, match="compilation cache left off"):
        assert xla_flags.enable_compilation_cache(str(blocker / "cache")) is None
