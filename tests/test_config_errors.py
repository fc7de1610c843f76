"""Config errors say everything at once and in the user's words (issue 40 items 7 and 8).

- YAML numbers written `3e-4` (a string in YAML 1.1) are numbers where the field is a float;
- a failure of a --config FILE key names the file and the key, never a flag nobody typed;
- several invalid fields are reported in one line, "; " between them, the env first;
- resuming a run whose config.json no longer matches its checkpoint names the fields that
  differ, in one line, instead of the checkpoint's leaf-by-leaf state diff.
"""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest

import ppo_async as pa
from ppo_async.cli import parse_train_args
from ppo_async.config.checks import FieldFailures, every_failure

FAST = ["--rollout.num-envs", "4", "--rollout.num-steps", "16", "--ppo.num-minibatches", "2", "--ppo.num-epochs", "1"]


def cli(argv: list[str]) -> tuple[int, str]:
    """`ppo_async.cli.main(argv)` in this process: (exit status, stdout + stderr)."""
    from ppo_async.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(argv)
    return status, out.getvalue()


def error_line(argv: list[str]) -> str:
    """The one `error:` line of a refused command line (exit status 2, no traceback)."""
    status, output = cli(argv)
    lines = [line for line in output.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), (status, output)
    return lines[0][len("error: "):]


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------ item 7: YAML numbers, file and key


def test_yaml_exponent_numbers_are_numbers_where_the_field_is_one(tmp_path):
    path = write(tmp_path, "c.yaml", "ppo:\n  learning_rate: 3e-4\n  adam_eps: 1E-8\nrollout.obs_clip: 5e+0\n"
                                     "wandb_project: 1e3\n")
    cfg = parse_train_args(["--config", path, "--run-dir", str(tmp_path / "r")]).cfg
    assert cfg.ppo.learning_rate == 3e-4 and cfg.ppo.adam_eps == 1e-8 and cfg.rollout.obs_clip == 5.0
    assert cfg.wandb_project == "1e3"  # a string field keeps the string


def test_yaml_numbers_reads_nested_sections_and_lists():
    from ppo_async.cli.config_file import yaml_numbers

    data = {"threaded": {"sampler_step_latency_ms": ["1e-1", 2], "timeout_s": "3e1"}, "env": "1e3",
            "ppo": {"num_epochs": "1e1", "clip_eps": "0.2x"}}
    assert yaml_numbers(data) == {"threaded": {"sampler_step_latency_ms": [0.1, 2], "timeout_s": 30.0}, "env": "1e3",
                                  "ppo": {"num_epochs": "1e1", "clip_eps": "0.2x"}}


def test_a_config_file_error_names_the_file_and_the_key(tmp_path):
    path = write(tmp_path, "c.yaml", "ppo:\n  clip_eps: 2.0\n")
    line = error_line(["train", "--config", path])
    assert line.startswith(f"{path}: ppo.clip_eps = 2.0 is invalid") and "--ppo.clip-eps" not in line, line
    path = write(tmp_path, "typo.json", '{"ppo": {"gama": 0.9}}')
    line = error_line(["train", "--config", path])
    assert line.startswith(f"{path}: unknown keys in ppo: ['gama']") and "'ppo.gamma'" in line, line


def test_a_file_value_refused_later_is_still_named_in_the_file(tmp_path):
    path = write(tmp_path, "c.yaml", "env: NoSuchEnv-v9\n")
    line = error_line(["train", "--config", path])
    assert line.startswith(f"{path}: env = 'NoSuchEnv-v9' is not a known gymnax environment"), line
    assert "--env" not in line
    path = write(tmp_path, "steps.yaml", "total_env_steps: 1000\n")
    line = error_line(["train", "--config", path])
    assert line.startswith(f"{path}: total_env_steps = 1000 is invalid"), line


def test_a_flag_over_the_file_is_named_as_the_flag(tmp_path):
    path = write(tmp_path, "c.yaml", "ppo:\n  gamma: 0.9\n")
    line = error_line(["train", "--config", path, "--ppo.gamma", "3"])
    assert line.startswith("--ppo.gamma = 3.0 is invalid") and path not in line, line


def test_tune_names_the_file_and_its_keys(tmp_path):
    path = write(tmp_path, "c.yaml", "ppo:\n  clip_eps: 2.0\n  gamma: 3\n")
    line = error_line(["tune", "--config", path])
    assert line.startswith(f"{path}: ") and "ppo.clip_eps = 2.0" in line and "ppo.gamma = 3" in line, line
    assert "--ppo" not in line


# ------------------------------------------------------------------ item 8: every invalid field at once


def test_the_api_reports_every_invalid_field_env_first():
    with pytest.raises(pa.ConfigError) as info:
        pa.Config(env="NoSuchEnv-v9", total_env_steps=1000)
    message = str(info.value)
    assert message.startswith("env = 'NoSuchEnv-v9' is not a known") and "\n" not in message
    assert "; total_env_steps = 1000 is invalid: must be at least one learner batch" in message
    with pytest.raises(FieldFailures) as info:
        pa.Config(seed=-1, num_seeds=0, eval_episodes=0, eval_every_steps=1024)
    assert [field for field, _ in info.value.failures] == ["seed", "num_seeds", "eval_episodes"]


def test_the_cli_reports_every_invalid_field_env_first():
    line = error_line(["train", "--env", "NoSuchEnv-v9", "--total-env-steps", "1000"])
    assert line.startswith("--env = 'NoSuchEnv-v9' is not a known gymnax environment"), line
    assert line.endswith("; --total-env-steps = 1000 is invalid: must be at least one learner batch "
                         "(rollout.num_envs * rollout.num_steps = 1024)"), line
    line = error_line(["train", "--ppo.clip-eps", "2", "--ppo.gamma", "3", "--rollout.num-envs", "0", "--seed", "-1"])
    for flag in ("--ppo.clip-eps = 2.0", "--ppo.gamma = 3.0", "--rollout.num-envs = 0", "--seed = -1"):
        assert flag in line, (flag, line)
    assert line.count("; ") == 3


def test_a_config_file_reports_every_invalid_key(tmp_path):
    path = write(tmp_path, "c.json", json.dumps({"ppo": {"clip_eps": 2.0, "gamma": 3.0}, "rollout": {"num_envs": 0},
                                                 "lag": {"max_lag": -1}}))
    line = error_line(["train", "--config", path])
    assert line.startswith(f"{path}: ") and line.count(path) == 1
    for key in ("ppo.clip_eps = 2.0", "ppo.gamma = 3.0", "rollout.num_envs = 0", "lag.max_lag = -1"):
        assert key in line, (key, line)


def test_every_failure_collects_across_sections_and_checks_no_consequence():
    with pytest.raises(FieldFailures) as info, every_failure():
        pa.config_from_dict({"ppo": {"num_minibatches": 0}, "threaded": {"sampler_step_latency_ms": ["a"]},
                             "distributed": {"num_processes": 0}})
    assert [f for f, _ in info.value.failures] == ["ppo.num_minibatches", "threaded.sampler_step_latency_ms",
                                                   "distributed.num_processes"]
    # a wrong type lists every wrong field of its section and stops it (no range check of a string)
    with pytest.raises(FieldFailures) as info, every_failure():
        pa.config_from_dict({"ppo": {"learning_rate": "fast", "gamma": "high"}})
    assert [f for f, _ in info.value.failures] == ["ppo.learning_rate", "ppo.gamma"]
    # outside every_failure, a section still raises its first failure, as before
    with pytest.raises(pa.ConfigError, match=r"^ppo.gamma = 3.0 is invalid") as info:
        pa.PPOConfig(gamma=3.0, clip_eps=2.0)
    assert not isinstance(info.value, FieldFailures) or len(info.value.failures) == 1


# ------------------------------------------------------------------ item 7: resuming another config


def test_resuming_a_run_whose_config_names_another_env_lists_the_fields_that_differ(tmp_path):
    run_dir = str(tmp_path / "run")
    status, output = cli(["train", "--env", "Pendulum-v1", *FAST, "--total-env-steps", "256", "--checkpoint-every-steps", "128",
                          "--run-dir", run_dir, "--quiet"])
    assert status == 0, output
    path = os.path.join(run_dir, "config.json")
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    config["env"], config["ppo"]["gamma"] = "MountainCarContinuous-v0", 0.9
    with open(path, "w", encoding="utf-8") as f:
        json.dump(config, f)
    line = error_line(["train", "--resume", run_dir, "--total-env-steps", "512"])
    assert line.startswith(f"{path}: cannot resume: the config differs from the checkpoint's in "), line
    assert "env ('Pendulum-v1' in the checkpoint, 'MountainCarContinuous-v0' now)" in line
    assert "ppo.gamma (0.95 in the checkpoint, 0.9 now)" in line and "leaf" not in line
