"""Progress a person can follow (issue 27 item 6): the compiling line before the first
iteration, `launch` folding its processes' output into one run's, and widget bars in notebooks.
No test sleeps for a cadence: clocks are injected and intervals are parameters."""

from __future__ import annotations

import io
import itertools
import sys


from ppo_async.cli import progress
from ppo_async.cli.progress import CLEAR_LINE, Waiting, waiting_text
from ppo_async.runtime import launch

TINY_TRAIN = ["train", "--env", "CartPole-v1", "--mode", "sync", "--rollout.num-envs", "4", "--rollout.num-steps", "8",
              "--ppo.num-minibatches", "2", "--ppo.num-epochs", "1", "--network.actor-hidden", "7",
              "--network.critic-hidden", "7", "--total-env-steps", "96"]


def fake_clock(step_s: float = 12.0):
    """A clock that moves `step_s` per reading (0 at the first)."""
    return itertools.count(0.0, step_s).__next__


# ------------------------------------------------------------------ the compiling line

def test_waiting_text_says_what_and_how_long():
    assert waiting_text("compiling", 12.4) == "compiling... 12 s"


def test_plain_lines_where_stderr_is_no_terminal():
    out = io.StringIO()
    waiting = Waiting("compiling", stream=out, tty=False, clock=fake_clock(), bar_live=lambda: False)
    assert waiting.tick() and waiting.tick()
    assert out.getvalue() == "compiling... 12 s\ncompiling... 24 s\n"  # whole lines, no \r frame
    waiting.stop()
    assert not waiting.tick() and out.getvalue().count("\n") == 2  # nothing after the wait ended
    waiting.stop()  # idempotent


def test_on_a_terminal_one_line_redrawn_and_wiped_at_the_end():
    out = io.StringIO()
    waiting = Waiting("compiling", stream=out, tty=True, clock=fake_clock(), bar_live=lambda: False)
    waiting.tick()
    waiting.tick()
    assert out.getvalue() == "\rcompiling... 12 s\x1b[K\rcompiling... 24 s\x1b[K" and "\n" not in out.getvalue()
    waiting.done([{"iteration": 1}])  # the first iteration's rows (as train's on_iteration)
    assert out.getvalue().endswith(CLEAR_LINE)
    waiting.done([{"iteration": 2}])
    assert out.getvalue().count(CLEAR_LINE) == 1


def test_a_live_bar_ends_the_wait_and_is_not_wiped():
    out, live = io.StringIO(), [False]
    waiting = Waiting("compiling", stream=out, tty=True, clock=fake_clock(), bar_live=lambda: live[0])
    assert waiting.tick()
    live[0] = True  # the run's bar drew over our line
    assert not waiting.tick()
    waiting.stop()
    assert CLEAR_LINE not in out.getvalue() and waiting.lines == ["compiling... 12 s"]


def test_a_live_tqdm_bar_is_seen():
    from tqdm import tqdm

    assert not progress.a_bar_is_live()
    bar = tqdm(total=3, file=io.StringIO())
    try:
        assert progress.a_bar_is_live()
    finally:
        bar.close()
    assert not progress.a_bar_is_live()


def test_disabled_prints_nothing_and_starts_no_thread():
    out = io.StringIO()
    with Waiting("compiling", enabled=False, stream=out, tty=False, every_s=0.001) as waiting:
        assert waiting._thread is None and not waiting.tick()
    assert out.getvalue() == ""


def test_the_thread_ticks_until_stopped():
    out = io.StringIO()
    waiting = Waiting("compiling", stream=out, tty=False, every_s=0.001, bar_live=lambda: False).start()
    for _ in range(5000):  # until the thread has ticked (no fixed sleep: the machine may be loaded)
        if waiting.lines:
            break
        waiting._ended.wait(0.001)
    waiting.stop()
    text = out.getvalue()
    assert waiting.lines and text.startswith("compiling... ") and waiting._thread is None
    assert out.getvalue() == text  # joined: nothing more comes


def test_train_prints_compiling_lines_before_the_first_progress_line(cli_main, monkeypatch, tmp_path):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.01)  # stderr is captured: plain lines
    done = cli_main([*TINY_TRAIN, "--run-dir", str(tmp_path / "run")])
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    compiling = [i for i, line in enumerate(lines) if line.startswith("compiling... ")]
    first_progress = next(i for i, line in enumerate(lines) if "env steps (" in line)
    assert compiling and max(compiling) < first_progress, done.stderr
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    quiet = cli_main([*TINY_TRAIN, "--run-dir", str(tmp_path / "quiet"), "--quiet"])
    assert quiet.returncode == 0 and "compiling..." not in quiet.stdout + quiet.stderr


# ------------------------------------------------------------------ launch: one run's output

def test_launch_recognises_gloo_and_peer_end_lines():
    assert launch.gloo_rank("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n") == 1
    assert launch.gloo_rank("ring buffer 0.0 MB") is None
    line = launch.peer_done_line(2, "1.1s (+14.2s compile), final return 3.0")
    assert launch.peer_done(line + "\n") == (2, "1.1s (+14.2s compile), final return 3.0")
    assert launch.peer_done("done: 1024 env steps") is None


def test_launch_folds_connection_and_end_lines_into_one_summary():
    out = io.StringIO()
    folder = launch.OutputFolder(2, out)
    folder.line(0, "ppo_async: Pendulum-v1, mode=threaded -> runs/x; compiling first\n")
    folder.line(0, "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n")
    folder.line(1, "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n")
    folder.line(1, launch.peer_done_line(1, "1.1s (+14.2s compile), final return -150.0") + "\n")
    folder.line(0, "done: 1024 env steps per seed in 1.3s\n")
    folder.line(0, "metrics: runs/x/metrics.jsonl\n")
    folder.summary([0, 0])
    assert out.getvalue().splitlines() == [
        "[0] ppo_async: Pendulum-v1, mode=threaded -> runs/x; compiling first",
        "launch: 2 processes connected (Gloo)",
        "[0] done: 1024 env steps per seed in 1.3s",
        "[0] metrics: runs/x/metrics.jsonl",
        "launch: 2 processes done (exit status 0, 0); process 1: 1.1s (+14.2s compile), final return -150.0",
    ]


def test_launch_keeps_every_line_of_a_failed_run():
    out = io.StringIO()
    folder = launch.OutputFolder(3, out)
    folder.line(1, "error: --num-seeds = 2 is invalid\n")
    folder.line(2, launch.peer_done_line(2, "0.5s") + "\n")
    folder.summary([2, 2, 0])
    assert out.getvalue().splitlines() == ["[1] error: --num-seeds = 2 is invalid", "[2] process 2 done: 0.5s"]


def test_only_process_0_names_the_run_directory(capsys, tmp_path, monkeypatch):
    """A process other than 0 prints one end line, without paths, for `launch` to fold (its
    training is stubbed: the joined processes are test_distributed's)."""
    from ppo_async.cli import train as cli_train
    from ppo_async.modes import train as train_module

    class Result:
        run_seconds, compile_seconds, extras = 1.25, 3.5, {"warnings": ["stale samples"]}

        @staticmethod
        def final_returns():
            return [-150.0]

    monkeypatch.setattr(train_module, "train", lambda *args, **kwargs: Result())
    run_dir = str(tmp_path / "run")
    args = [*TINY_TRAIN[1:], "--mode", "threaded", "--run-dir", run_dir, "--distributed.num-processes", "2",
            "--distributed.process-id", "1", "--distributed.coordinator-address", "127.0.0.1:1"]
    assert cli_train.run_train(cli_train.parse_train_args(args)) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["process 1 done: 1.2s (+3.5s compile), final return -150.0"] and err == ""
    assert launch.peer_done(out) == (1, "1.2s (+3.5s compile), final return -150.0")


# ------------------------------------------------------------------ notebooks: widget bars

def test_the_bar_is_tqdm_auto_and_a_notebook_gets_it(monkeypatch):
    """In a Jupyter kernel the bar is on (stderr is no terminal there) and comes from tqdm.auto,
    which gives the ipywidgets bar when the `notebooks` extra is installed."""
    import tqdm.auto

    from ppo_async.report import metrics

    made = []

    class FakeBar:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.n = 0

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    kernel_shell = type("Shell", (), {"kernel": object()})()  # what IPython's get_ipython() is in a kernel
    fake_ipython = type(sys)("IPython")
    fake_ipython.get_ipython = lambda: kernel_shell
    monkeypatch.setitem(sys.modules, "IPython", fake_ipython)
    bar = metrics.Progress(total_env_steps=100, enabled=True)
    assert bar.tty and made and made[0]["total"] == 100
    bar.close()


def test_an_imported_ipykernel_is_no_notebook(monkeypatch):
    """A test run or a library may import ipykernel (test_notebooks does, at collection): the
    CLI still prints plain lines where stderr is no terminal."""
    from ppo_async.report import metrics

    monkeypatch.setitem(sys.modules, "ipykernel", type(sys)("ipykernel"))
    plain_shell = type(sys)("IPython")
    plain_shell.get_ipython = lambda: None  # IPython imported, no shell running
    monkeypatch.setitem(sys.modules, "IPython", plain_shell)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not metrics.in_jupyter_kernel() and not metrics._interactive()


# ------------------------------------------------------------------ tune: step i/4, run j/J, ETA

def test_tune_bounds_its_runs_and_estimates_the_rest():
    from ppo_async.study import tune

    assert tune.sampler_counts(4) == [4, 2, 1] and tune.sampler_counts(3) == [3, 1]
    # 4 samplers x 16 chunks: 5 lengths x 3 counts, then 6 counts, 3 batches, 3 checks
    assert tune.most_runs(1, 4, 16, 6, 3, seeds=1) == 15 + 6 + 3 + tune.VERIFY_TRIES
    assert tune.most_runs(3, 4, 16, 6, 3, seeds=2) == 2 * (3 + tune.VERIFY_TRIES)
    assert tune.progress_line(2, 5, 17, 80.4, 50.0, 5) == "tune: step 2/4, run 5 of at most 17, 80s elapsed, ETA at most 120s"
    assert tune.progress_line(1, 2, 17, 1.0, 0.0, 0).endswith("ETA after the first run")  # all read back so far


def test_tune_prints_its_overall_progress_after_each_setting(monkeypatch, capsys):
    import pandas as pd

    import ppo_async as pa
    from ppo_async.study import tune

    class Result:
        extras = {"version_schedule": []}

        @staticmethod
        def to_dataframe():
            return pd.DataFrame()

    measures = {"consumer_steps_per_s": 1000.0, "approx_kl_mean": 0.01, "lag_mean": 1.0, "final_return": 5.0}
    monkeypatch.setattr(tune, "train", lambda config: Result())
    monkeypatch.setattr(tune, "run_measurements", lambda df, warmup: measures)
    monkeypatch.setattr(tune, "write_schedule", lambda path, records: None)
    base = pa.Config(mode="threaded", total_env_steps=128 * 10, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
                     num_samplers=2, threaded=pa.ThreadedConfig(buffer_capacity=4 * 128))
    tuner = tune._Tuner(base, 0.02, 128 * 10, seeds=1, out=None, progress=True)
    tuner.plan(max_samplers=2, batch_factors=1)
    assert tuner.most == 3 * 2 + 2 + 1 + tune.VERIFY_TRIES
    first = tune.step_buffer(tuner)  # KL 0.01 < 0.02: the first setting is kept
    tuner.step_done(first)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tune: ")]
    assert lines[0].startswith("tune: step 1/4, run 1 of at most 12, ") and "ETA at most" in lines[0]
    # once step 1 is done, J is the runs so far plus the most steps 2-4 can take
    assert lines[1].startswith(f"tune: step 1/4 done, run 1 of at most {1 + 2 + 1 + tune.VERIFY_TRIES}, ")
    tune.step_knee(tuner, 4, 2)  # (2 samplers, 4 chunks) was measured in step 1: read back, still counted
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tune: ")]
    assert [line.split(",")[1] for line in lines] == [" run 2 of at most 7"]
