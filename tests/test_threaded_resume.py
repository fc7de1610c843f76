"""Resuming a threaded run: the learner's whole state restored exactly, the samplers restarted from
its params, the rows and env steps continuing from the checkpoint to the configured total.

A threaded run's lag emerges from timing, so a resumed run is not the uninterrupted one bit for
bit (sync and simulated are: tests/test_resume.py); what is exact is the learner's state at the
checkpoint, and what is tested after a SIGINT and a SIGKILL mid-run is that nothing written up
to the checkpoint is lost and that the run goes on consistently from there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.config import ThreadedConfig
from ppo_async.core import kl_control
from ppo_async.modes import threaded as threaded_module
from ppo_async.modes.threaded import resume as resume_module
from ppo_async.modes.threaded.learner import threaded_accounting
from ppo_async.run.checkpoint import Checkpointer, CheckpointError

from conftest import REPO_ROOT, sigkill_train_when

ACCOUNTING = ("samples_produced", "samples_consumed", "samples_dropped", "samples_resident")
SMALL = dict(
    rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)
BATCH = 8 * 16
ITERATIONS = 40
# a small threaded Pendulum-v1 run with a checkpoint per iteration (the logger's back-pressure
# paces the learner to the checkpoints), two samplers with a little simulated env latency
CLI_ARGS = ["train", "--mode", "threaded", "--env", "Pendulum-v1", "--quiet", "--total-env-steps", str(ITERATIONS * BATCH),
            "--checkpoint-every-steps", str(BATCH), "--rollout.num-envs", "8", "--rollout.num-steps", "16", "--ppo.num-epochs", "1",
            "--ppo.num-minibatches", "2", "--network.actor-hidden", "16", "--network.critic-hidden", "16",
            "--num-samplers", "2", "--threaded.sampler-step-latency-ms", "2", "2"]


class Stop(Exception):
    pass


def stop_at(iteration: int):
    def on_iteration(rows):
        if rows[0]["iteration"] == iteration:
            raise Stop

    return on_iteration


def small(run_dir, iterations: int, **kw) -> pa.Config:
    kw.setdefault("num_samplers", 2)
    return pa.Config(mode="threaded", total_env_steps=iterations * BATCH, run_dir=str(run_dir),
                     checkpoint_every_steps=2 * BATCH, **SMALL, **kw)


def checkpoint_steps(run_dir) -> list[int]:
    with Checkpointer(os.path.join(run_dir, "checkpoints")) as ckpt:
        return ckpt.all_steps()


def saved_at_least(run_dir, count: int) -> bool:
    """Whether another process has finished `count` checkpoints (orbax renames a step
    directory to its number only when it is complete)."""
    directory = os.path.join(run_dir, "checkpoints")
    return os.path.isdir(directory) and len([d for d in os.listdir(directory) if d.isdigit()]) >= count


def assert_continued(rows, resumed_at: int, total: int, batch: int = BATCH) -> None:
    """Rows 1..total, one each; env steps per iteration; the accounting identity; the rows after
    the checkpoint marked with it; the version never going back."""
    assert [r["iteration"] for r in rows] == list(range(1, total + 1))
    for r in rows:
        assert r["env_steps"] == r["iteration"] * batch
        produced, consumed, dropped, resident = (r[name] for name in ACCOUNTING)
        assert produced == consumed + dropped + resident, r["iteration"]
        assert r.get("resumed_at_iteration") == (resumed_at if r["iteration"] > resumed_at else None)
    versions = [r["learner_version"] for r in rows]
    assert versions == sorted(versions)
    # the samplers restart from the restored params: the first batch after the resume is theirs
    first = rows[resumed_at]
    assert first["behavior_version"] == rows[resumed_at - 1]["learner_version"] and first["lag_max"] == 0
    assert first["wall_time"] > rows[resumed_at - 1]["wall_time"]
    assert first["dropped_at_resume"] == rows[resumed_at - 1]["samples_resident"]


def assert_schedule(run_dir, total: int) -> None:
    schedule = pa.read_jsonl(os.path.join(run_dir, "version_schedule.jsonl"))
    assert [record["iteration"] for record in schedule] == list(range(1, total + 1))


# --------------------------------------------------------------------------------------
# by hand
# --------------------------------------------------------------------------------------


def test_a_resumed_runs_accounting_continues_from_its_checkpoint():
    # at the checkpoint: produced 1000 = consumed 600 + forced 100 + overwritten 64 + stale 36 + resident 200
    start = resume_module.LearnerStart(iteration=5, produced=1000, consumed=600, forced=100, overwritten=64, stale=36,
                                       lost=200)
    # since: 3 chunks of 64 added (1 overwritten, 1 resident), 128 discarded; the learner took 64 (+ 0 stale)
    acc = threaded_accounting({"added": 3, "overwritten": 1, "size": 1}, 64, 128, 600 + 64, 36, start)
    assert acc == {"samples_produced": 1000 + 192 + 128, "samples_consumed": 664, "samples_dropped": 228 + 128 + 36 + 200,
                   "samples_resident": 64, "dropped_forced_refresh": 228, "dropped_overwritten": 128,
                   "dropped_stale_total": 36, "dropped_at_resume": 200}
    assert acc["samples_produced"] == acc["samples_consumed"] + acc["samples_dropped"] + acc["samples_resident"]
    assert "dropped_at_resume" not in threaded_accounting({"added": 0, "overwritten": 0, "size": 0}, 64, 0, 0, 0)


def test_the_learner_state_beside_the_arrays_round_trips_through_json():
    knobs = kl_control.LagKnobs((True, False, True), 2, None)
    control = kl_control.ControllerState(knobs, kls=(0.01, 0.02), lag_max=3, kl_mean=0.015, action=-1, adjustments=4)
    assert resume_module.controller_from_json(resume_module.controller_to_json(control)) == control
    assert resume_module.controller_from_json(resume_module.controller_to_json(None)) is None
    key = jax.random.fold_in(jax.random.PRNGKey(3), 7)
    np.testing.assert_array_equal(resume_module.key_from_json(resume_module.key_to_json(key)), np.asarray(key))
    typed = jax.random.key(5)
    np.testing.assert_array_equal(resume_module.key_from_json(resume_module.key_to_json(typed)),
                                  np.asarray(jax.random.key_data(typed)))


# --------------------------------------------------------------------------------------
# in-process runs
# --------------------------------------------------------------------------------------


def test_resume_restores_the_learner_exactly(tmp_path, monkeypatch):
    """Params, optimiser, normalisation statistics, version, KL controller (moved by a tiny
    target before the checkpoint) and RNG key: the resumed learner starts from what the first
    one had after the checkpoint's iteration."""
    saved = {}
    real_mode_state = threaded_module.run.mode_state

    def spy_mode_state(state, row):
        saved[row["iteration"]] = state
        return real_mode_state(state, row)

    monkeypatch.setattr(threaded_module.run, "mode_state", spy_mode_state)
    config = small(tmp_path / "r", iterations=7, num_samplers=2, threaded=ThreadedConfig(kl_target=1e-6, kl_window=1))
    with pytest.raises(Stop):
        pa.train(config, on_iteration=stop_at(5))
    assert checkpoint_steps(tmp_path / "r") == [2, 4]
    before = saved[4]
    assert before.control.adjustments > 0  # the controller had moved its knobs: restoring it matters

    started = {}
    real_init = threaded_module.learner.Learner.__init__

    def spy_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        started.update(train_state=self.train_state, key=self.key, control=self.control, version=self.version,
                       max_lag=self.hparams.max_lag)

    monkeypatch.setattr(threaded_module.learner.Learner, "__init__", spy_init)
    rows = pa.resume(str(tmp_path / "r")).metrics
    for a, b in zip(jax.tree.leaves(before.train_state), jax.tree.leaves(started["train_state"]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # params, opt state, obs / reward stats, counters
    np.testing.assert_array_equal(np.asarray(before.key), np.asarray(started["key"]))
    assert started["control"] == before.control and started["version"] == int(before.train_state.version)
    max_lag = before.control.knobs.max_lag
    assert float(started["max_lag"]) == (np.inf if max_lag is None else max_lag)  # the stale filter follows it
    assert_continued(rows, resumed_at=4, total=7)
    assert rows[4]["controller_adjustments"] >= rows[3]["controller_adjustments"]
    assert_schedule(tmp_path / "r", 7)


def test_a_host_env_run_resumes_and_a_complete_one_says_so(tmp_path):
    config = pa.Config(env="gymnasium/Pendulum-v1", mode="threaded", total_env_steps=6 * 32, run_dir=str(tmp_path / "h"),
                       checkpoint_every_steps=2 * 32, rollout=pa.RolloutConfig(num_envs=4, num_steps=8),
                       num_samplers=2, ppo=SMALL["ppo"], network=SMALL["network"])
    with pytest.raises(Stop):
        pa.train(config, on_iteration=stop_at(3))
    rows = pa.resume(str(tmp_path / "h")).metrics
    assert_continued(rows, resumed_at=2, total=6, batch=32)
    assert_schedule(tmp_path / "h", 6)
    with pytest.raises(pa.ConfigError, match="is complete"):
        pa.resume(str(tmp_path / "h"))


def test_a_checkpoint_without_the_learner_state_is_refused_clearly(tmp_path, monkeypatch):
    """(as written before threaded runs could resume): its policy loads, the run cannot continue."""
    monkeypatch.setattr(threaded_module.run, "mode_state", lambda state, row: None)
    with pytest.raises(Stop):
        pa.train(small(tmp_path / "old", iterations=4), on_iteration=stop_at(3))
    assert pa.load(tmp_path / "old").iteration == 2
    with pytest.raises(CheckpointError, match="could not resume threaded runs"):
        pa.resume(str(tmp_path / "old"))


# --------------------------------------------------------------------------------------
# interrupted processes
# --------------------------------------------------------------------------------------


def test_sigint_says_how_to_resume_and_the_resumed_run_continues(tmp_path, cli_main):
    run_dir = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "ppo_async", *CLI_ARGS, "--run-dir", str(run_dir)], cwd=REPO_ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard only
        while time.monotonic() < deadline and proc.poll() is None and not saved_at_least(run_dir, 2):
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted: " + proc.communicate()[1]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"Resume with: python -m ppo_async train --resume {run_dir}" in err
    interrupted = pa.read_jsonl(run_dir / "metrics.jsonl")
    stopped_at = len(interrupted)
    assert [r["iteration"] for r in interrupted] == list(range(1, stopped_at + 1)) and stopped_at < ITERATIONS
    assert checkpoint_steps(run_dir)[-1] == stopped_at  # Ctrl-C checkpoints the last logged iteration
    assert f"checkpoint of iteration {stopped_at} is kept" in err

    done = cli_main(["train", "--resume", str(run_dir), "--quiet"])
    assert done.returncode == 0, done.stderr
    rows = pa.read_jsonl(run_dir / "metrics.jsonl")
    assert rows[:stopped_at] == interrupted  # nothing written before the interruption is lost
    assert_continued(rows, resumed_at=stopped_at, total=ITERATIONS)
    assert_schedule(run_dir, ITERATIONS)
    assert pa.load(run_dir).iteration == ITERATIONS


def test_every_checkpoint_finds_its_iterations_schedule_on_disk(tmp_path, monkeypatch):
    """A SIGKILL right after a checkpoint must not lose that iteration's version-schedule
    records (the resume cuts the schedule back to the checkpoint and makes only the later ones
    again): when checkpoint k is complete, the records of iterations 1..k are already in the
    file. (The clean-clone CI once lost iteration 2's this way: the checkpoint was saved before
    the records were appended.)"""
    from ppo_async.run.recorder import RunRecorder

    run_dir = tmp_path / "r"
    seen: list[tuple[int, list[int]]] = []
    save = RunRecorder.save_checkpoint

    def checked_save(self, iteration, *args, **kwargs):
        save(self, iteration, *args, **kwargs)
        records = pa.read_jsonl(run_dir / "version_schedule.jsonl") if (run_dir / "version_schedule.jsonl").exists() else []
        seen.append((iteration, sorted({r["iteration"] for r in records})))

    monkeypatch.setattr(RunRecorder, "save_checkpoint", checked_save)
    pa.train(small(run_dir, 6))  # a checkpoint every 2 iterations
    assert sorted({iteration for iteration, _ in seen}) == [2, 4, 6]
    for iteration, on_disk in seen:
        assert on_disk == list(range(1, iteration + 1)), (iteration, on_disk)


def test_sigkill_then_resume_keeps_everything_up_to_the_checkpoint(tmp_path):
    run_dir = tmp_path / "killed"
    sigkill_train_when([*CLI_ARGS, "--run-dir", str(run_dir)], lambda: saved_at_least(run_dir, 2), timeout=300)
    checkpoint = checkpoint_steps(run_dir)[-1]
    killed = pa.read_jsonl(run_dir / "metrics.jsonl")  # (a torn last line is ignored)
    assert checkpoint <= len(killed) < ITERATIONS

    rows = pa.resume(str(run_dir)).metrics  # the Python entry point (the CLI's is tested above)
    assert rows[:checkpoint] == killed[:checkpoint]  # nothing written up to the checkpoint is lost
    # the rows written after it were made again by the resumed run (the killed ones are gone)
    assert all(r["resumed_at_iteration"] == checkpoint for r in rows[checkpoint:])
    assert_continued(rows, resumed_at=checkpoint, total=ITERATIONS)
    assert_schedule(run_dir, ITERATIONS)
    assert pa.load(run_dir).iteration == ITERATIONS
