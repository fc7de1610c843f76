"""Resuming from Python checks the config before restoring, as `train --resume` does (issue 40):
a run directory whose config.json was edited to another env is refused in one line naming the
fields that differ, and nothing in the run directory changes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import ppo_async as pa


def tiny(run_dir) -> pa.Config:
    return pa.Config(env="CartPole-v1", total_env_steps=2 * 64, run_dir=str(run_dir), checkpoint_every_steps=64,
                     rollout=pa.RolloutConfig(num_envs=4, num_steps=16), ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("resume_config") / "run"
    pa.train(tiny(run_dir))
    return str(run_dir)


def edit_config(run_dir: str, **changes) -> str:
    """Rewrites RUN_DIR/config.json with `changes` (dotted names as `section__field`); returns its path."""
    path = os.path.join(run_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for name, value in changes.items():
        section, _, field = name.partition("__")
        if field:
            data[section][field] = value
        else:
            data[section] = value
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return path


def snapshot(run_dir: str) -> dict[str, int]:
    """Every file of the run directory but config.json, with its modification time."""
    out = {}
    for root, _, files in os.walk(run_dir):
        for name in files:
            path = os.path.join(root, name)
            if name != "config.json":
                out[os.path.relpath(path, run_dir)] = os.stat(path).st_mtime_ns
    return out


def test_resume_of_a_config_edited_to_another_env_names_env_in_one_line(finished_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    path = edit_config(run_dir, env="Pendulum-v1")
    before = snapshot(run_dir)
    with pytest.raises(pa.ConfigError) as info:
        pa.resume(run_dir, total_env_steps=4 * 64)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}: cannot resume: the config differs from the checkpoint's in env "), message
    assert "env ('CartPole-v1' in the checkpoint, 'Pendulum-v1' now)" in message
    assert message.endswith("restore it, or train a new run"), message
    assert snapshot(run_dir) == before  # nothing restored, metrics.jsonl not cut


def test_every_differing_field_is_named(finished_run, tmp_path):
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    edit_config(run_dir, env="Acrobot-v1", ppo__gamma=0.9)
    with pytest.raises(pa.ConfigError) as info:
        pa.resume(run_dir)  # complete, too: the config is what is wrong, and said first
    message = str(info.value)
    assert "env ('CartPole-v1' in the checkpoint, 'Acrobot-v1' now)" in message
    assert "ppo.gamma (" in message and "0.9 now)" in message and "\n" not in message


def test_train_resume_with_another_config_is_refused_before_restoring(finished_run, tmp_path):
    """`pa.train(config, resume=True)` with a config built in Python: the same one line, without
    a file to blame."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run, run_dir)
    before = snapshot(run_dir)
    config = tiny(run_dir).replace(env="Pendulum-v1", total_env_steps=4 * 64)
    with pytest.raises(pa.ConfigError, match=r"^cannot resume: the config differs from the checkpoint's in env ") as info:
        pa.train(config, resume=True)
    assert "\n" not in str(info.value)
    assert snapshot(run_dir) == before


def test_check_resume_config_without_a_checkpoint_says_nothing(tmp_path):
    from ppo_async.run.recorder import check_resume_config

    check_resume_config(tiny(tmp_path / "none"))  # no run directory yet: nothing to compare
    check_resume_config(tiny(tmp_path / "none").replace(run_dir=None, checkpoint_every_steps=0))
