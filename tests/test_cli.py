"""The command-line contract: `python -m ppo_async train ...`.

The first test runs the real `python -m ppo_async` process; the others call `cli.main` in
this process (the `cli_main` fixture), which parses and runs the same command line."""

from __future__ import annotations

import json

from ppo_async.report.metrics import read_jsonl

FAST = ["--rollout.num-envs", "4", "--rollout.num-steps", "16", "--ppo.num-minibatches", "2",
        "--ppo.num-epochs", "1", "--total-env-steps", "128", "--quiet"]


def test_train_writes_config_and_metrics(run_cli, tmp_path):
    run_dir = tmp_path / "r"
    proc = run_cli(["train", "--env", "CartPole-v1", "--mode", "sync", "--seed", "5",
                    "--run-dir", str(run_dir), "--ppo.clip-eps", "0.1", *FAST])
    assert proc.returncode == 0, proc.stderr
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "CartPole-v1" and config["seed"] == 5
    assert config["ppo"]["clip_eps"] == 0.1 and config["rollout"]["num_envs"] == 4
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["env_steps"] for r in rows] == [64, 128]
    assert {"iteration", "wall_time", "steps_per_second", "episode_return", "policy_loss",
            "value_loss", "entropy", "approx_kl", "clip_fraction"} <= set(rows[0])
    # the process ends without the interpreter's teardown (`dispatch.exit_process`): everything
    # was written and said first
    assert (run_dir / "checkpoints" / "2" / "commit_success.txt").is_file() and list((run_dir / "tb").iterdir())
    assert proc.stdout.startswith("final return (mean of last 10% of iterations): ") and str(run_dir) in proc.stdout


EXIT_CODE = """
import atexit, sys, threading, time
from ppo_async.cli.dispatch import exit_process
print("said before the exit", end="")  # buffered: stdout is a pipe
atexit.register(lambda: print(" / atexit ran", file=sys.stderr))
if sys.argv[1] == "thread":  # a non-daemon thread still running: the usual exit, which waits for it
    threading.Thread(target=lambda: (time.sleep(0.5), print(" / thread finished", file=sys.stderr))).start()
exit_process(int(sys.argv[2]))
"""


def test_a_reader_closing_the_pipe_early_gets_no_traceback():
    import subprocess
    import sys

    # `true` reads nothing and has exited long before the interpreter writes: the write fails (EPIPE)
    shell = f"{sys.executable} -m ppo_async train --help | true"
    proc = subprocess.run(["bash", "-c", f"{shell}; echo ${{PIPESTATUS[0]}}"], capture_output=True, text=True, timeout=120)
    assert (proc.stdout, proc.stderr) == ("1\n", "")


def test_exit_process_flushes_runs_atexit_and_keeps_the_status():
    import subprocess
    import sys

    fast = subprocess.run([sys.executable, "-c", EXIT_CODE, "none", "3"], capture_output=True, text=True, timeout=120)
    assert (fast.returncode, fast.stdout, fast.stderr) == (3, "said before the exit", " / atexit ran\n")
    waits = subprocess.run([sys.executable, "-c", EXIT_CODE, "thread", "0"], capture_output=True, text=True, timeout=120)
    assert (waits.returncode, waits.stdout) == (0, "said before the exit")
    assert waits.stderr == " / thread finished\n / atexit ran\n"


def test_summary_is_printed_without_quiet(cli_main, tmp_path):
    args = [a for a in FAST if a != "--quiet"]
    proc = cli_main(["train", "--run-dir", str(tmp_path / "r"), *args])
    assert proc.returncode == 0, proc.stderr
    assert "final return" in proc.stdout


def test_config_file_with_overrides(cli_main, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("env: CartPole-v1\nppo:\n  gamma: 0.9\n  num_epochs: 1\n")
    run_dir = tmp_path / "r"
    proc = cli_main(["train", "--config", str(path), "--ppo.gamma", "0.8", "--run-dir", str(run_dir), *FAST])
    assert proc.returncode == 0, proc.stderr
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"] == "CartPole-v1" and config["ppo"]["gamma"] == 0.8


def test_unknown_env_is_a_one_line_user_error(cli_main, tmp_path):
    proc = cli_main(["train", "--env", "NoSuchEnv-v0", "--run-dir", str(tmp_path / "r")])
    assert proc.returncode == 2
    assert "NoSuchEnv-v0" in proc.stderr and "CartPole-v1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bad_values_exit_2_naming_the_field(cli_main, tmp_path):
    for args, needle in ((["--ppo.num-minibatches", "7"], "error: --ppo.num-minibatches = 7 is invalid"),
                         (["--ppo.dual-clip", "0.5"], "error: --ppo.dual-clip = 0.5 is invalid"),
                         (["--ppo.gamma", "1.5"], "error: --ppo.gamma = 1.5 is invalid")):  # the user's flags (issue 27)
        proc = cli_main(["train", "--run-dir", str(tmp_path / "r"), *args])
        assert proc.returncode == 2, (args, proc.stderr)
        assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_fields_with_descriptions(cli_main):
    proc = cli_main(["train", "--help"])
    assert proc.returncode == 0
    for needle in ("--ppo.clip-eps", "--ppo.dual-clip", "--rollout.num-envs", "--total-env-steps",
                   "Dual-clip constant", "--config"):
        assert needle in proc.stdout, needle


def test_cadence_flags_count_env_steps_and_the_deprecated_ones_warn(tmp_path):
    """`--eval-every-steps` / `--checkpoint-every-steps` (env steps, in whole learner iterations
    of batch 8 x 128 = 1,024); the deprecated `--eval-every` (iterations) still parses, with a
    FutureWarning giving the steps, and both spellings at once are refused naming both."""
    import pytest

    from ppo_async.cli import parse_train_args
    from ppo_async.config import ConfigError

    run = ["--env", "Pendulum-v1", "--rollout.num-envs", "8", "--rollout.num-steps", "128", "--run-dir", str(tmp_path / "r")]
    config = parse_train_args([*run, "--eval-every-steps", "3000", "--checkpoint-every-steps", "2500"]).cfg
    assert (config.eval_every_steps, config.eval_every_iterations) == (3000, 3)
    assert (config.checkpoint_every_steps, config.checkpoint_every_iterations) == (2500, 2)
    with pytest.warns(FutureWarning, match=r"eval_every = 3 \(learner iterations\) is deprecated.*use eval_every_steps = 3072"):
        config = parse_train_args([*run, "--eval-every", "3"]).cfg
    assert (config.eval_every, config.eval_every_steps) == (0, 3072)
    with pytest.raises(ConfigError, match=r"eval_every = 3 is invalid: eval_every_steps = 3000 is set too"):
        parse_train_args([*run, "--eval-every", "3", "--eval-every-steps", "3000"])
