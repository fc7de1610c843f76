"""One rule for presets at every entry point (issue 40): a user gets the env's preset for every
field they did not set, from Python as from the command line, and can see which fields came
from it. Host-side envs choose threaded mode when no mode is given."""

from __future__ import annotations

import json

import pytest

import ppo_async as pa
from ppo_async.cli import parse_train_args
from ppo_async.config import config_to_dict, presets

ONE_PER_FAMILY = ["CartPole-v1", "brax/inverted_pendulum", "playground/CartpoleBalance", "gymnasium/Hopper-v5",
                  "envpool/Hopper-v5"]


@pytest.mark.parametrize("env", ONE_PER_FAMILY)
def test_python_and_cli_resolve_the_same_config(env, tmp_path):
    run_dir = str(tmp_path / "run")
    from_python = pa.Config(env=env, run_dir=run_dir)
    from_cli = parse_train_args(["--env", env, "--run-dir", run_dir]).cfg
    assert config_to_dict(from_python) == config_to_dict(from_cli)
    assert from_python == presets.config_for_env(env, {"run_dir": run_dir})
    for path, value in presets.env_defaults(env).items():
        assert pa.config.get_path(from_python, path) == value, path
    assert set(from_python.preset_fields) == set(presets.env_defaults(env))


def test_fields_the_caller_set_win_and_the_rest_come_from_the_preset():
    preset = presets.preset_for("gymnasium/Hopper-v5")
    config = pa.Config(env="gymnasium/Hopper-v5", ppo=pa.PPOConfig(learning_rate=1e-3, num_epochs=3), total_env_steps=30_000)
    assert (config.ppo.learning_rate, config.ppo.num_epochs) == (1e-3, 3)
    assert (config.ppo.gamma, config.ppo.num_minibatches) == (preset["ppo.gamma"], preset["ppo.num_minibatches"])
    assert config.network.init_log_std == preset["network.init_log_std"] and config.rollout.normalize_reward
    assert config.mode == "threaded" and config.total_env_steps == 30_000
    assert "ppo.learning_rate" not in config.preset_fields and "ppo.gamma" in config.preset_fields
    assert pa.Config().preset_fields == () and pa.Config() == presets.config_for_env("Pendulum-v1")


def test_a_host_env_takes_threaded_mode_unless_another_is_asked_for():
    assert pa.config_for_env("gymnasium/Hopper-v5").mode == "threaded"
    assert pa.Config(env="gymnasium/Hopper-v5").mode == "threaded"
    with pytest.raises(pa.ConfigError, match="mode = 'sync' is invalid: must be 'threaded' for the host-side env"):
        pa.Config(env="gymnasium/Hopper-v5", mode="sync")


def test_replacing_the_env_takes_the_new_envs_preset_not_the_old_ones_values():
    hopper = pa.Config(env="gymnasium/Hopper-v5", seed=3)
    pendulum = hopper.replace(env="Pendulum-v1")
    assert pendulum == pa.Config(seed=3) and pendulum.mode == "sync"
    assert hopper.replace(seed=4) == pa.Config(env="gymnasium/Hopper-v5", seed=4)


def test_a_complete_config_json_is_taken_as_written(tmp_path):
    """A run's config.json holds every field: read back, nothing is filled again."""
    config = pa.Config(env="gymnasium/Hopper-v5", ppo=pa.PPOConfig(gamma=0.95))
    data = json.loads(json.dumps(config_to_dict(config)))
    back = pa.config_from_dict(data)
    assert back == config and back.preset_fields == () and back.ppo.gamma == 0.95


def test_pa_train_and_train_cli_write_the_same_config_json(tmp_path, cli_main):
    """The written config.json, end to end (a tiny gymnasium run: the family whose preset and
    mode a Python user used to miss)."""
    small = ["--total-env-steps", "2048", "--rollout.num-envs", "2", "--rollout.num-steps", "64",
             "--ppo.num-minibatches", "2", "--ppo.num-epochs", "1", "--num-samplers", "1"]
    out = cli_main(["train", "--env", "gymnasium/Pendulum-v1", "--run-dir", str(tmp_path / "cli"), "--quiet", *small])
    assert out.returncode == 0, out.stderr
    pa.train(pa.Config(env="gymnasium/Pendulum-v1", run_dir=str(tmp_path / "py"), total_env_steps=2048,
                       rollout=pa.RolloutConfig(num_envs=2, num_steps=64), ppo=pa.PPOConfig(num_minibatches=2, num_epochs=1),
                       num_samplers=1))
    written = [json.loads((tmp_path / name / "config.json").read_text()) for name in ("cli", "py")]
    for data in written:
        data.pop("run_dir")
    assert written[0] == written[1] and written[0]["mode"] == "threaded"
