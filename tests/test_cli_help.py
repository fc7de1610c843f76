"""CLI details: every command's --help, --quiet's one-line summary, the default run dir,
`eval --step`, and a corrupted checkpoint reported in one line (a real subprocess: the noise
came from orbax / tensorstore threads and interpreter shutdown)."""

from __future__ import annotations

import os
import re
import shutil

import pandas as pd
import pytest

import ppo_async as pa

FAST = ["--env", "CartPole-v1", "--rollout.num-envs", "4", "--rollout.num-steps", "16", "--ppo.num-minibatches", "2",
        "--ppo.num-epochs", "1", "--total-env-steps", "128"]


def flat(text: str) -> str:
    """Help text without tyro's box drawing, whitespace collapsed (wrapped lines rejoined)."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())


def test_train_help_describes_resume_quiet_config_and_the_run_dir_default(cli_main):
    proc = cli_main(["train", "--help"])
    assert proc.returncode == 0
    text = flat(proc.stdout)
    for needle in (
        "--resume RUN_DIR Continue the run in RUN_DIR from its latest complete checkpoint",
        "--quiet, --no-quiet No progress bar or start line; still prints the one-line summary (final return, run dir)",
        "--config FILE JSON or YAML file",
        "CLI default: a new runs/<env>-<mode>-<timestamp>",
        "(default: 'runs/<env>-<mode>-<timestamp>')",
    ):
        assert needle in text, needle
    # --help after --resume still shows the help, not an "unexpected arguments" error
    again = cli_main(["train", "--resume", "somewhere", "--help"])
    assert again.returncode == 0 and "--resume RUN_DIR" in flat(again.stdout)


@pytest.mark.parametrize("command,options", [
    ("eval", ["RUN_DIR The run directory", "--episodes N Episodes to play. (default: 20)",
              "--step N The checkpoint step (learner iteration) to load", "(default: the latest)",
              "--seed-index I Which seed of a multi-seed run. (default: 0)", "--seed S Seed of the evaluation episodes",
              "--stochastic, --no-stochastic Sample actions instead of the deterministic"]),
    ("plot", ["RUN_DIR The run directories", "--labels A B ... One label per RUN_DIR",
              "(default: the directories' names)", "--out DIR Where the combined learning curve",
              "(default: runs/plots/<timestamp>)"]),
    ("compare", ["RUN_DIR The run directories", "--labels A B ... One label per RUN_DIR", "--out DIR Output directory",
                 "(default: runs/compare/<timestamp>)",
                 "--threshold X Also report the median env steps to reach return X"]),
    ("tune", ["--config FILE JSON or YAML starting config", "--env NAME The env", "--kl-target X Mean KL",
              "(default: 0.02)", "--budget-per-run N Env steps of each run", "--out DIR Output directory",
              "--seeds N Threaded runs per setting", "--max-samplers N The most samplers step 2 tries",
              "--throughput-target X Env steps/s at which step 3 is skipped", "--replay-seeds N Seeds of step 4",
              "--quiet, --no-quiet Print only the chosen setting"]),
    ("launch", ["--num-processes N Processes to start (>= 2). (required)", "--port PORT Coordinator port",
                "-- train [TRAIN OPTIONS]"]),
])
def test_command_help_shows_its_own_options(cli_main, command, options):
    """The help tyro generates from each command's dataclass: the usage line names the command
    (and RUN_DIR where it takes run directories), every option with its description."""
    for flag in ("--help", "-h"):
        proc = cli_main([command, flag])
        assert proc.returncode == 0 and proc.stderr == ""
        usage = proc.stdout.splitlines()[0]
        assert usage.startswith(f"usage: python -m ppo_async {command} ")
        assert ("RUN_DIR" in usage) == (command in ("eval", "plot", "compare")), usage
        text = flat(proc.stdout)
        for option in options:
            assert option in text, option


def test_quiet_prints_only_the_one_line_summary(cli_main, tmp_path):
    run_dir = tmp_path / "r"
    proc = cli_main(["train", *FAST, "--run-dir", str(run_dir), "--quiet"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    final = pa.analysis.final_returns(pd.DataFrame(pa.read_jsonl(run_dir / "metrics.jsonl")))  # what is printed
    assert lines[0] == f"final return (mean of last 10% of iterations): {final.iloc[0]:.1f}; run dir: {run_dir}"
    assert proc.stderr == ""  # no progress bar


def test_default_run_dir_is_runs_env_mode_timestamp(cli_main, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # --checkpoint-every-steps needs a run dir: the CLI default counts as one (64 steps: every iteration)
    proc = cli_main(["train", *FAST, "--checkpoint-every-steps", "64", "--quiet"])
    assert proc.returncode == 0, proc.stderr
    (made,) = os.listdir(tmp_path / "runs")
    assert re.fullmatch(r"CartPole-v1-sync-\d{8}-\d{6}", made), made
    assert f"run dir: {os.path.join('runs', made)}" in proc.stdout
    assert sorted(os.listdir(tmp_path / "runs" / made / "checkpoints")) == ["1", "2"]


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """CartPole, 2 iterations, a checkpoint after each."""
    run_dir = tmp_path_factory.mktemp("ckpt") / "run"
    pa.train(pa.Config(env="CartPole-v1", total_env_steps=128, checkpoint_every_steps=64, run_dir=str(run_dir),
                       rollout=pa.RolloutConfig(num_envs=4, num_steps=16), ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2)))
    return run_dir


def test_eval_step_picks_a_checkpoint(cli_main, checkpointed):
    for step in (1, 2):
        proc = cli_main(["eval", str(checkpointed), "--step", str(step), "--episodes", "1"])
        assert proc.returncode == 0, proc.stderr
        assert f"iteration {step})" in proc.stdout
    proc = cli_main(["eval", str(checkpointed), "--episodes", "1"])
    assert "iteration 2)" in proc.stdout  # default: the latest
    proc = cli_main(["eval", str(checkpointed), "--step", "7"])
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "step 7" in proc.stderr and "available steps: [1, 2]" in proc.stderr
    proc = cli_main(["eval", str(checkpointed), "--step", "two"])
    assert proc.returncode == 2 and "--step = 'two' is invalid" in proc.stderr


def corrupt_copy(source, dest, pattern: str) -> str:
    """A copy of a run whose step-2 files under `pattern` are truncated to 0 bytes."""
    shutil.copytree(source, dest)
    step_dir = os.path.join(dest, "checkpoints", "2")
    hit = 0
    for root, _, files in os.walk(step_dir):
        for name in files:
            path = os.path.join(root, name)
            if re.search(pattern, os.path.relpath(path, step_dir)):
                open(path, "w").close()
                hit += 1
    assert hit, pattern
    return step_dir


def assert_one_clear_line(proc, step_dir: str, what: str) -> None:
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr
    assert len(err.encode()) < 2048 and err.count("\n") == 1, err[:3000]
    assert err.startswith(f"error: checkpoint step 2 in {step_dir} is corrupted or unreadable: cannot read its {what}")
    assert "TensorStore" not in err and "Traceback" not in err
    assert "other complete steps: [1]" in err


def test_corrupted_checkpoint_is_one_line(run_cli, checkpointed, tmp_path):
    # the array data (tensorstore chunks) of the latest checkpoint
    arrays = corrupt_copy(checkpointed, tmp_path / "arrays", r"^state/ocdbt\.process_0/d/")
    assert_one_clear_line(run_cli(["eval", str(tmp_path / "arrays")]), arrays, "arrays")
    # every file of the latest checkpoint (its metadata too): resume
    everything = corrupt_copy(checkpointed, tmp_path / "all", r".")
    assert_one_clear_line(run_cli(["train", "--resume", str(tmp_path / "all"), "--quiet"]), everything, "metadata")


def test_progress_bar_keeps_the_last_known_return():
    """Pendulum finishes an episode every 200 steps: rows without one keep showing the last return."""
    from ppo_async.report.metrics import Progress

    progress = Progress(total_env_steps=3000, enabled=True, tty=True)
    try:
        progress.update(1000, {"steps_per_second": 5000.0, "episode_return": -1234.5, "approx_kl": 0.01})
        assert "return=-1234.5" in progress._bar.postfix
        progress.update(2000, {"steps_per_second": 5000.0, "episode_return": None, "approx_kl": 0.02})
        assert "return=-1234.5" in progress._bar.postfix and "kl=0.0200" in progress._bar.postfix
        progress.update(3000, {"steps_per_second": 5000.0, "episode_return": -900.0, "approx_kl": 0.02})
        assert "return=-900.0" in progress._bar.postfix
    finally:
        progress.close()
    fresh = Progress(total_env_steps=10, enabled=True, tty=True)  # no episode finished yet: a dash
    fresh.update(5, {"episode_return": None})
    assert "return=-," in fresh._bar.postfix
    fresh.close()
