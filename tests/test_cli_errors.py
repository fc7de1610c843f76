"""Bad paths and corrupt or empty files end every command with exit status 2 and one line
naming the file (and the 1-based line where there is one), never a traceback (issue 40 item 4).

The command lines run in-process through `ppo_async.cli.main`; nothing trains: the places a
run, a tune or a benchmark would start raise `Started`, so a bad input wrongly accepted fails
its case at once.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex

import pytest

import ppo_async as pa
from ppo_async.errors import DataFileError

ROW = {"seed": 0, "iteration": 1, "learner_version": 1, "env_steps": 64, "wall_time": 0.5, "steps_per_second": 128.0,
       "episode_return": -1.0, "approx_kl": 0.001}


class Started(Exception):
    """Raised where training would start: the input was accepted."""


def _started(*args, **kwargs):
    raise Started()


@pytest.fixture
def no_training(monkeypatch, tmp_path):
    """Training, tuning and benchmarking stop where they would start; the working directory is a scratch one."""
    import ppo_async.modes.train as train_module
    import ppo_async.study.benchmark as benchmark_module
    import ppo_async.study.tune as tune_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_module, "RunRecorder", _started)
    monkeypatch.setattr(tune_module, "train", _started)
    monkeypatch.setattr(benchmark_module, "benchmark", _started)


def _write(path, text: str | bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode() if isinstance(text, str) else text)
    return str(path)


def _rows(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


GOOD = json.dumps(ROW)


@pytest.fixture
def files(tmp_path) -> dict[str, str]:
    """Run directories, config files and results tables, good and bad; name -> path."""
    root = tmp_path / "f"
    made = {
        "good/metrics.jsonl": _rows(GOOD, GOOD),
        "corrupt/metrics.jsonl": _rows(GOOD, '{"seed": 0, "iteration": 2,', GOOD),
        "not_object/metrics.jsonl": _rows(GOOD, "[1, 2]", GOOD),
        "binary/metrics.jsonl": _rows(GOOD).encode() + b"\xff\xfe\n" + _rows(GOOD).encode(),
        "empty/metrics.jsonl": "",
        "torn_only/metrics.jsonl": '{"seed": 0, "itera',
        "no_metrics/notes.txt": "x",
        "bad_config_run/config.json": '{"env": "Pendulum-v1",\n "seed": }\n',
        "bad_config_run/metrics.jsonl": _rows(GOOD),
        "empty_config_run/config.json": "",
        "plain_file": "not a directory\n",
        "empty.yaml": "",
        "blank.json": "  \n",
        "broken3.json": '{\n  "seed": 1,\n  "ppo": {"gamma": }\n}\n',
        "broken2.yaml": "ppo:\n  gamma: [0.9\nseed: 1\n",
        "latin1.yaml": "ppo:\n  gamma: 0.9\n".encode() + b"env: caf\xe9\n",
        "bench_bad/results.csv": "env,mode,seed\nPendulum-v1,sync,0\nPendulum-v1,sync,1,extra\n",
        "bench_quote/results.csv": 'env,mode,seed\n"Pendulum-v1,sync,0\n',
        "tune_bad/tune.json": '{"config": \n',
        "tune_rows/measurements.jsonl": _rows('{"key": "a"}', "{oops", '{"key": "b"}'),
    }
    paths = {name: _write(root / name, text) for name, text in made.items()}
    out = {name.partition("/")[0] if "/" in name else name: os.path.dirname(p) if "/" in name else p
           for name, p in paths.items()}
    out["root"] = str(root)
    return out


def run_cli(argv: list[str]) -> tuple[int | str, str]:
    """`ppo_async.cli.main(argv)` in this process: (exit status, or "started"; stdout + stderr)."""
    from ppo_async.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status: int | str = main(argv)
        except Started:
            status = "started"
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - a traceback is what the table looks for
            import traceback

            traceback.print_exc()
            status = 1
    return status, out.getvalue()


# (command line, what the one error line must contain, in order). {name} is a path of `files`.
CASES = [
    # plot
    ("plot {corrupt}", ["corrupt/metrics.jsonl, line 2: not JSON"]),
    ("plot {not_object}", ["not_object/metrics.jsonl, line 2: a JSON list"]),
    ("plot {binary}", ["binary/metrics.jsonl, line 2: not UTF-8"]),
    ("plot {empty}", ["empty/metrics.jsonl: no rows"]),
    ("plot {torn_only}", ["torn_only/metrics.jsonl: no rows"]),
    ("plot {no_metrics}", ["no_metrics", "no metrics.jsonl"]),
    ("plot {plain_file}", ["plain_file", "not a directory"]),
    ("plot {root}/missing", ["missing", "does not exist"]),
    ("plot {good} {good} --labels a b --out {plain_file}", ["--out", "plain_file", "not a directory"]),
    ("plot {good} --labels a --out {plain_file}/sub", ["--out", "plain_file", "not a directory"]),
    # compare
    ("compare {good} {corrupt}", ["corrupt/metrics.jsonl, line 2: not JSON"]),
    ("compare {corrupt}", ["corrupt/metrics.jsonl, line 2"]),
    ("compare {good} {empty}", ["empty/metrics.jsonl: no rows"]),
    ("compare {good} --out {plain_file}", ["--out", "plain_file", "not a directory"]),
    ("compare {good} --out /proc/ppo_async_x", ["--out", "/proc/ppo_async_x", "cannot create or write"]),
    ("compare {root}/missing", ["missing", "does not exist"]),
    # eval
    ("eval {root}/missing", ["missing", "does not exist"]),
    ("eval {no_metrics}", ["no_metrics", "no config.json"]),
    ("eval {bad_config_run}", ["bad_config_run/config.json", "line 2"]),
    ("eval {empty_config_run}", ["empty_config_run/config.json", "line 1"]),
    # train --config
    ("train --config {root}/missing.yaml", ["missing.yaml", "no such file"]),
    ("train --config {root}", ["is a directory"]),
    ("train --config {empty.yaml}", ["empty.yaml: empty"]),
    ("train --config {blank.json}", ["blank.json: empty"]),
    ("train --config {broken3.json}", ["broken3.json, line 3: not JSON"]),
    ("train --config {broken2.yaml}", ["broken2.yaml, line ", "not YAML"]),
    ("train --config {latin1.yaml}", ["latin1.yaml, line 3: not UTF-8"]),
    # train --resume
    ("train --resume {root}/missing", ["missing", "does not exist"]),
    ("train --resume {good}", ["good", "no config.json"]),
    ("train --resume {bad_config_run}", ["bad_config_run/config.json", "line 2"]),
    # tune
    ("tune --config {broken3.json}", ["broken3.json, line 3: not JSON"]),
    ("tune --config {empty.yaml}", ["empty.yaml: empty"]),
    ("tune --out {plain_file}", ["--out", "plain_file", "not a directory"]),
    ("tune --out /proc/ppo_async_x", ["--out", "cannot create or write"]),
    ("tune --out {tune_bad}", ["tune_bad/tune.json, line 2: not JSON"]),
    ("tune --out {tune_rows}", ["tune_rows/measurements.jsonl, line 2: not JSON"]),
    # benchmark
    ("benchmark --suite classic --out {plain_file}", ["--out", "plain_file", "not a directory"]),
    ("benchmark --suite classic --out {plain_file}/sub", ["--out", "plain_file", "not a directory"]),
    ("benchmark --suite classic --out /proc/ppo_async_x", ["--out", "cannot create or write"]),
    ("benchmark --suite classic --out {root}/b --runs-dir {plain_file}", ["--runs-dir", "not a directory"]),
    ("benchmark --suite classic --out {bench_bad}", ["bench_bad/results.csv, line 3: 4 fields where the header has 3"]),
    ("benchmark --report-only --out {bench_bad}", ["bench_bad/results.csv, line 3"]),
    ("benchmark --report-only --out {bench_quote}", ["bench_quote/results.csv, line 2: not CSV"]),
    ("benchmark --report-only --out {plain_file}", ["--out", "not a directory"]),
    # launch: the train options after --, checked before any process starts
    ("launch --num-processes 2 -- train --mode threaded --config {broken3.json}", ["broken3.json, line 3: not JSON"]),
]


def _argv(line: str, files: dict) -> list[str]:
    for name in sorted(files, key=len, reverse=True):
        line = line.replace("{" + name + "}", files[name])
    return shlex.split(line)


@pytest.mark.parametrize("line,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_path_or_file_is_one_line_naming_it(line, needles, files, no_training):
    status, output = run_cli(_argv(line, files))
    assert status == 2, f"status {status}: {output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    lines = [text for text in output.splitlines() if text.strip() and not text.startswith(("tune ", "env preset"))]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    at = 0
    for needle in needles:
        found = lines[0].find(needle, at)
        assert found >= 0, f"{needle!r} not in {lines[0]!r}"
        at = found


def test_every_command_has_a_bad_file_case():
    from ppo_async.cli.dispatch import COMMANDS

    assert {line.split()[0] for line, _ in CASES} == set(COMMANDS)


def test_read_jsonl_names_the_file_and_the_line(files):
    path = os.path.join(files["corrupt"], "metrics.jsonl")
    with pytest.raises(pa.ConfigError, match=r"corrupt/metrics\.jsonl, line 2: not JSON") as info:
        pa.read_jsonl(path)
    assert isinstance(info.value, DataFileError) and "\n" not in str(info.value)
    with pytest.raises(DataFileError, match=r"line 2: a JSON list"):
        pa.read_jsonl(os.path.join(files["not_object"], "metrics.jsonl"))
    with pytest.raises(DataFileError, match=r"line 2: not UTF-8"):
        pa.read_jsonl(os.path.join(files["binary"], "metrics.jsonl"))


def test_read_jsonl_skips_only_a_torn_last_line(files):
    assert pa.read_jsonl(os.path.join(files["torn_only"], "metrics.jsonl")) == []
    assert pa.read_jsonl(os.path.join(files["empty"], "metrics.jsonl")) == []
    assert len(pa.read_jsonl(os.path.join(files["good"], "metrics.jsonl"))) == 2


def test_a_refused_output_directory_leaves_nothing_behind(tmp_path):
    from ppo_async.cli.paths import check_output_dir

    check_output_dir("--out", str(tmp_path / "new" / "deeper"))
    assert not (tmp_path / "new").exists()
    with pytest.raises(pa.ConfigError, match=r"^--out = .* is invalid: it is a file"):
        check_output_dir("--out", _write(tmp_path / "a_file", "x"))


# ------------------------------------------------------------------ run failures: one line too


def test_a_stalled_thread_ends_the_command_with_one_error_line(monkeypatch, tmp_path):
    """A threaded run stopped by the liveness watch (tests/test_liveness.py makes real ones)
    ends `train` with exit status 5 and one `error:` line, like NaN/inf (3), not a traceback."""
    import ppo_async.modes.train as train_module
    from ppo_async.cli.dispatch import STALLED_STATUS

    message = "thread sampler-1 is stuck: no progress for 30.1s in rollout"

    def stalled(*args, **kwargs):
        raise pa.StalledThread(message)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train_module, "RunRecorder", stalled)
    status, output = run_cli(["train", "--mode", "threaded", "--total-env-steps", "2048", "--quiet"])
    assert status == STALLED_STATUS == 5, output
    assert output.strip() == f"error: {message}", output


def test_the_errors_of_a_run_are_public():
    from ppo_async.modes.threaded.liveness import StalledThread
    from ppo_async.run.checkpoint import CheckpointError

    assert pa.StalledThread is StalledThread and issubclass(pa.StalledThread, TimeoutError)
    assert pa.DataFileError is DataFileError and issubclass(pa.DataFileError, pa.ConfigError)
    assert pa.CheckpointError is CheckpointError
    assert {"StalledThread", "DataFileError", "DistributedFailure", "CheckpointError"} <= set(pa.__all__)
    for name in pa.__all__:  # every public name resolves
        assert getattr(pa, name) is not None, name
