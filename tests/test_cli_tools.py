"""TensorBoard events, plots, `load` / `evaluate` and the `plot` / `eval` commands."""

from __future__ import annotations

import glob
import os
import struct

import numpy as np
import pytest

import ppo_async
from ppo_async import Config, PPOConfig, RolloutConfig, train
from ppo_async.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """CartPole, default hyperparameters, 30k env steps (learns to > 100 return), with its plots."""
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    train(Config(env="CartPole-v1", total_env_steps=30_000, run_dir=str(run_dir), plots=True))
    return run_dir


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """Pendulum (continuous), two seeds, two tiny iterations."""
    run_dir = tmp_path_factory.mktemp("runs") / "pendulum"
    train(Config(env="Pendulum-v1", num_seeds=2, total_env_steps=128, run_dir=str(run_dir),
                 rollout=RolloutConfig(num_envs=4, num_steps=16), ppo=PPOConfig(num_epochs=1, num_minibatches=2)))
    return run_dir


def read_event_tags(tb_dir) -> set[str]:
    """Scalar tags of every tensorboardX events file in `tb_dir` (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    tags = set()
    for path in glob.glob(os.path.join(tb_dir, "events.out.tfevents.*")):
        data = open(path, "rb").read()
        pos = 0
        while pos + 12 <= len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + length])
            pos += 12 + length + 4
            tags.update(v.tag for v in event.summary.value)
    return tags


def test_tensorboard_events_hold_every_scalar(trained, short):
    tags = read_event_tags(trained / "tb")
    assert {"episode_return", "policy_loss", "approx_kl", "steps_per_second", "learning_rate"} <= tags
    tags = read_event_tags(short / "tb")
    assert {"seed_0/policy_loss", "seed_1/policy_loss", "seed_1/value_loss"} <= tags


def test_run_writes_plots_with_plots_on_and_always_its_final_checkpoint(trained, short):
    for name in ("learning_curve.png", "kl_over_time.png", "throughput.png"):
        assert (trained / name).stat().st_size > 0
    assert (trained / "checkpoints" / "29").is_dir()
    assert not list(short.glob("*.png")) and (short / "checkpoints" / "2").is_dir()  # plots = False, the default


def test_plot_command_regenerates_and_combines(trained, short, tmp_path, capsys):
    os.remove(trained / "kl_over_time.png")
    assert main(["plot", str(trained), str(short), "--out", str(tmp_path)]) == 0
    assert (trained / "kl_over_time.png").is_file()
    assert (tmp_path / "learning_curve_combined.png").stat().st_size > 0
    assert "learning_curve_combined.png" in capsys.readouterr().out


def test_load_returns_a_policy(trained, short):
    policy = ppo_async.load(str(trained))
    assert policy.iteration == 29 and policy.env.name == "CartPole-v1"
    obs = np.zeros((3, 4), np.float32)
    assert policy.act(obs).shape == (3,)
    import jax

    assert policy.act(obs, jax.random.PRNGKey(0)).shape == (3,)
    p1 = ppo_async.load(str(short), seed_index=1)
    assert p1.act(np.zeros(3, np.float32)).shape == (1,)
    with pytest.raises(ppo_async.ConfigError, match="seed_index"):
        ppo_async.load(str(short), seed_index=2)


def test_eval_of_a_trained_policy_beats_random(trained, capsys):
    assert main(["eval", str(trained), "--episodes", "20"]) == 0
    out = capsys.readouterr().out
    assert "over 20 episodes" in out
    mean = float(out.split("mean return ")[1].split(" +-")[0])
    assert mean > 100, out


def test_eval_of_a_short_run_works(short, capsys):
    assert main(["eval", str(short), "--episodes", "3", "--seed-index", "1"]) == 0
    assert "over 3 episodes" in capsys.readouterr().out


def test_user_errors_exit_2_with_one_line(tmp_path, capsys):
    for argv in (["eval", str(tmp_path / "nope")], ["plot", str(tmp_path / "nope")],
                 ["train", "--resume", str(tmp_path / "nope")], ["eval"], ["plot"], [], ["nosuch"],
                 ["eval", "a", "b"], ["eval", "a", "--bogus"], ["train", "--resume", "a", "--seed", "1"],
                 ["launch", "--num-processes", "2"], ["launch", "--num-processes", "x", "--", "train"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error:") and err.count("\n") == 1, err
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "metrics.jsonl").write_text("")
    train_cfg = Config(env="CartPole-v1", total_env_steps=64, run_dir=str(tmp_path / "r"),
                       rollout=RolloutConfig(num_envs=4, num_steps=16), ppo=PPOConfig(num_epochs=1, num_minibatches=2))
    from ppo_async.run.rundir import write_config

    write_config(str(tmp_path / "r"), train_cfg)
    assert main(["eval", str(tmp_path / "r")]) == 2
    assert "no checkpoints" in capsys.readouterr().err


def test_usage_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("train", "plot", "eval", "--resume"):
        assert command in out


class _FakeWandb:
    """Stands in for the wandb package: records init arguments and logged rows."""

    def __init__(self):
        self.inits, self.logs, self.finished = [], [], 0

    def init(self, **kwargs):
        self.inits.append(kwargs)
        return self

    def log(self, data, step):
        self.logs.append((step, dict(data)))

    def finish(self):
        self.finished += 1


@pytest.mark.parametrize("mode,num_seeds", [("sync", 1), ("sync", 2), ("threaded", 1)])
def test_wandb_logging_gets_every_iteration_when_asked_for(monkeypatch, tmp_path, mode, num_seeds):
    import sys

    fake = _FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = Config(mode=mode, total_env_steps=3 * 64, num_seeds=num_seeds, wandb_project="lag-study", run_dir=str(tmp_path / "r"),
                    rollout=RolloutConfig(num_envs=4, num_steps=16), ppo=PPOConfig(num_epochs=1, num_minibatches=2))
    result = train(config)
    assert fake.inits[0]["project"] == "lag-study" and fake.inits[0]["name"] == "r"
    assert fake.inits[0]["config"]["rollout"]["num_envs"] == 4 and fake.finished == 1
    assert [step for step, _ in fake.logs] == [64, 128, 192]
    key = "approx_kl" if num_seeds == 1 else "seed_1/approx_kl"
    expected = [r["approx_kl"] for r in result.metrics if r["seed"] == num_seeds - 1]
    assert [data[key] for _, data in fake.logs] == pytest.approx(expected)


def test_wandb_without_the_package_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(ppo_async.ConfigError, match=r"wandb_project = 'p' needs the wandb package: pip install wandb"):
        train(Config(total_env_steps=1024, wandb_project="p"))
    with pytest.raises(ppo_async.ConfigError, match="wandb_project"):
        Config(wandb_project="  ")


def test_train_result_policy_equals_the_checkpointed_policy(tmp_path):
    import jax

    config = Config(env="Pendulum-v1", num_seeds=2, total_env_steps=128, run_dir=str(tmp_path / "r"),
                    rollout=RolloutConfig(num_envs=4, num_steps=16), ppo=PPOConfig(num_epochs=1, num_minibatches=2))
    result = train(config)
    mine, saved = result.policy(1), ppo_async.load(tmp_path / "r", seed_index=1)
    assert mine.iteration == saved.iteration == 2
    for a, b in zip(jax.tree.leaves((mine.params, mine.obs_stats)), jax.tree.leaves((saved.params, saved.obs_stats))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(ppo_async.evaluate(mine, 2)["returns"], ppo_async.evaluate(saved, 2)["returns"])
    with pytest.raises(ppo_async.ConfigError, match="seed_index"):
        result.policy(2)
