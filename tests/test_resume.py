"""Checkpoints and resumption: a resumed run computes bit for bit what an uninterrupted one does."""

from __future__ import annotations

import os

import jax
import numpy as np
import pytest

from ppo_async import Config, ConfigError, LagConfig, PPOConfig, RolloutConfig, read_jsonl, resume, train
from ppo_async.run.checkpoint import Checkpointer, CheckpointError
from ppo_async.run.recorder import LOSS_FIELDS

from conftest import sigkill_train_when

EXACT = LOSS_FIELDS + ("episode_return", "learner_version", "sgd_steps", "env_steps", "learning_rate",
                       "grad_norm", "clip_fraction", "samples_consumed", "samples_dropped")


def tiny(run_dir, iterations=6, **kw) -> Config:
    return Config(env="CartPole-v1", total_env_steps=iterations * 64, run_dir=None if run_dir is None else str(run_dir),
                  rollout=RolloutConfig(num_envs=4, num_steps=16), ppo=PPOConfig(num_epochs=1, num_minibatches=2), **kw)


def assert_same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in EXACT:
            if k in x:
                assert x[k] == y[k], (x["iteration"], k, x[k], y[k])


def assert_same_tree(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class Stop(Exception):
    pass


def test_config_fields_are_validated():
    with pytest.raises(ConfigError, match="checkpoint_every_steps = -1"):
        tiny(None, checkpoint_every_steps=-1)
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        tiny(None, keep_checkpoints=0)


def test_simulated_resume_is_exact_and_checkpoints_hold_the_run(tmp_path):
    """Two seeds, emulated lag 2: interrupted after iteration 5 (checkpoint at 4), resumed."""
    lag = LagConfig(schedule="fixed", K=2)
    ref = train(tiny(tmp_path / "a", mode="simulated", num_seeds=2, num_samplers=2, lag=lag, checkpoint_every_steps=2 * 64))
    with Checkpointer(tmp_path / "a" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [2, 4, 6]
    assert not list((tmp_path / "a").glob("*.png"))  # plots are drawn on demand (Config.plots = False)

    def stop_at_5(rows):
        if rows[0]["iteration"] == 5:
            raise Stop

    with pytest.raises(Stop):
        train(tiny(tmp_path / "b", mode="simulated", num_seeds=2, num_samplers=2, lag=lag, checkpoint_every_steps=2 * 64),
              on_iteration=stop_at_5)
    assert len(read_jsonl(tmp_path / "b" / "metrics.jsonl")) == 10  # iterations 1..5, 2 seeds
    with Checkpointer(tmp_path / "b" / "checkpoints") as ckpt:
        assert ckpt.latest_step() == 4
        _, meta = ckpt.restore(ckpt_state_like(tmp_path / "b"))
    assert meta["iteration"] == 4 and meta["samples_consumed"] == [4 * 64, 4 * 64]
    assert (meta["config"]["lag"]["K"], meta["config"]["num_samplers"]) == (2, 2)

    seen = []
    result = resume(str(tmp_path / "b"), on_iteration=lambda rows: seen.append(rows[0]["iteration"]))
    assert seen == [5, 6]
    rows = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [(r["iteration"], r["seed"]) for r in rows] == [(i, s) for i in range(1, 7) for s in (0, 1)]
    assert_same_rows(read_jsonl(tmp_path / "a" / "metrics.jsonl"), rows)
    assert_same_rows(ref.metrics, result.metrics)
    assert_same_tree(ref.train_state, result.train_state)


def ckpt_state_like(run_dir):
    from ppo_async.modes.registry import get_mode
    from ppo_async.run.rundir import read_run_config

    config = read_run_config(str(run_dir))
    return get_mode(config.mode).checkpoint_like(config)


def test_cadences_in_env_steps_evaluate_and_checkpoint_at_whole_iterations(tmp_path):
    """Pendulum, batch 64, 7 iterations: eval_every_steps = 150 is every 2 iterations (150 / 64
    = 2.3) and checkpoint_every_steps = 200 every 3 (3.1), each also after the last."""
    config = Config(env="Pendulum-v1", total_env_steps=7 * 64, run_dir=str(tmp_path / "r"), eval_every_steps=150,
                    eval_episodes=1, checkpoint_every_steps=200, rollout=RolloutConfig(num_envs=4, num_steps=16),
                    ppo=PPOConfig(num_epochs=1, num_minibatches=2))
    result = train(config)
    assert [r["iteration"] for r in result.metrics if r.get("eval_return") is not None] == [2, 4, 6, 7]
    with Checkpointer(tmp_path / "r" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [3, 6, 7]


def test_a_run_recorded_with_iteration_cadences_resumes_without_a_warning(tmp_path):
    """A run whose config.json and checkpoint hold the deprecated `eval_every` / `checkpoint_every`
    (learner iterations: every run written before the cadences counted env steps) resumes with
    the same cadences, and says nothing (its user typed nothing)."""
    import json
    import warnings

    from ppo_async.run.recorder import RESUME_FREE_FIELDS
    from ppo_async.run.rundir import check_config_matches, read_run_config

    run_dir = tmp_path / "r"

    def stop_at_5(rows):
        if rows[0]["iteration"] == 5:
            raise Stop

    with pytest.raises(Stop):
        train(tiny(run_dir, eval_every_steps=3 * 64, eval_episodes=1, checkpoint_every_steps=2 * 64), on_iteration=stop_at_5)
    data = json.loads((run_dir / "config.json").read_text())
    old = {**{k: v for k, v in data.items() if not k.endswith("_every_steps")}, "eval_every": 3, "checkpoint_every": 2}
    (run_dir / "config.json").write_text(json.dumps(old))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_config_matches(read_run_config(str(run_dir)), {"config": old}, RESUME_FREE_FIELDS)  # an old checkpoint's
        rows = resume(str(run_dir)).metrics
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    assert [r["iteration"] for r in rows if r.get("eval_return") is not None] == [3, 6]
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [2, 4, 6]


def test_resume_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        resume(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="run_dir"):
        train(tiny(None), resume=True)
    (tmp_path / "r").mkdir()
    tiny(tmp_path / "r")  # valid config
    from ppo_async.run.rundir import write_config

    write_config(str(tmp_path / "r"), tiny(tmp_path / "r"))
    with pytest.raises(CheckpointError, match="no checkpoints"):
        resume(str(tmp_path / "r"))


def test_sigkill_then_resume_matches_an_uninterrupted_run(tmp_path, cli_main):
    # Killed once two checkpoints exist; with a checkpoint per iteration (~0.4 s each here)
    # the 18 iterations left take long enough that the kill always lands mid-run (asserted).
    iterations = 20
    run_dir = tmp_path / "killed"
    args = ["train", "--env", "CartPole-v1", "--rollout.num-envs", "4",
            "--rollout.num-steps", "16", "--ppo.num-minibatches", "2", "--ppo.num-epochs", "1",
            "--total-env-steps", str(iterations * 64), "--checkpoint-every-steps", "64", "--run-dir", str(run_dir), "--quiet"]
    ckpt_dir = run_dir / "checkpoints"
    sigkill_train_when(args, lambda: ckpt_dir.is_dir() and len([d for d in os.listdir(ckpt_dir) if d.isdigit()]) >= 2)
    killed_rows = read_jsonl(run_dir / "metrics.jsonl")
    assert len(killed_rows) < iterations

    # the resume in this process (the same command line; what needs a process is the kill)
    done = cli_main(["train", "--resume", str(run_dir), "--quiet"])
    assert done.returncode == 0, done.stderr
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(1, iterations + 1))
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [iterations - 2, iterations - 1, iterations]

    reference = train(tiny(tmp_path / "ref", iterations=iterations))  # the checkpoint cadence does not change the maths
    assert_same_rows(reference.metrics, rows)
