"""Tests of ppo_async.study.manifest: the provenance (manifest.json) every experiment run writes,
and the git-ignored default output folder of the scripts in experiments/."""

from __future__ import annotations

import glob
import json
import os
import shutil
import shlex
import subprocess
import sys
import time

import pytest

from ppo_async.study import manifest
from ppo_async.study.manifest import (
    MANIFEST_FILE,
    PACKAGES,
    Manifest,
    command_line,
    default_out,
    file_stamps,
    git_state,
    package_versions,
    read_manifest,
    versions_line,
    written_and_kept,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(REPO, "experiments", "*.py")))
HAVE_GIT = subprocess.run(["git", "--version"], capture_output=True).returncode == 0
IN_CHECKOUT = HAVE_GIT and subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True).returncode == 0
needs_checkout = pytest.mark.skipif(not IN_CHECKOUT, reason="the tests run outside a git checkout")


def git(args: list[str], cwd: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def make_repo(path) -> str:
    """A temporary git repository with one commit; returns its HEAD."""
    git(["init", "-q"], str(path))
    (path / "a.txt").write_text("a\n")
    git(["add", "a.txt"], str(path))
    git(["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one"], str(path))
    return git(["rev-parse", "HEAD"], str(path)).strip()


# ----------------------------------------------------------------------------------------
# the pieces
# ----------------------------------------------------------------------------------------


@needs_checkout
def test_git_state_of_this_repository():
    state = git_state(REPO)
    assert state["commit"] == git(["rev-parse", "HEAD"], REPO).strip()
    assert state["dirty"] == bool(git(["status", "--porcelain"], REPO).strip())


@pytest.mark.skipif(not HAVE_GIT, reason="no git")
def test_git_state_clean_then_dirty_with_an_untracked_file(tmp_path):
    head = make_repo(tmp_path)
    assert git_state(str(tmp_path)) == {"commit": head, "dirty": False, "changes": []}
    (tmp_path / "new.txt").write_text("x\n")
    state = git_state(str(tmp_path))
    assert state["commit"] == head and state["dirty"] is True
    assert state["changes"] == ["?? new.txt"]


def test_git_state_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_state(str(tmp_path)) == {"commit": None, "dirty": None, "changes": None}


def test_git_state_without_git(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git executable to be found
    assert git_state(REPO) == {"commit": None, "dirty": None, "changes": None}


def test_command_line_quotes_each_argument():
    line = command_line(["experiments/x.py", "--out", "a b", "--set", "k='v'"], executable="/usr/bin/python3")
    assert shlex.split(line) == ["/usr/bin/python3", "experiments/x.py", "--out", "a b", "--set", "k='v'"]
    assert command_line().startswith(shlex.quote(sys.executable))


def test_the_resolved_versions_line_names_every_bounded_package():
    """What .ci/run prints after a fresh install: every package pyproject.toml bounds, in order."""
    assert versions_line({"jax": "0.10.2", "brax": None, "python": "3.11.7"}) == "jax 0.10.2  brax -  python 3.11.7"
    done = subprocess.run([sys.executable, "-m", "ppo_async.study.manifest"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("resolved versions: ppo_async ")
    import jax
    assert f"jax {jax.__version__}" in line and all(f"{name} " in line for name in PACKAGES)
    assert f"pytest {pytest.__version__}" in line and "pytest-xdist " in line  # the test runner CI resolved


def test_package_versions_are_the_installed_ones():
    import jax
    import numpy

    import ppo_async

    versions = package_versions()
    assert versions["jax"] == jax.__version__ and versions["numpy"] == numpy.__version__
    assert versions["ppo_async"] == getattr(ppo_async, "__version__", versions["ppo_async"]) and versions["ppo_async"]
    assert versions["jaxlib"] and versions["python"] == ".".join(map(str, sys.version_info[:3]))
    assert package_versions(["surely-not-installed-xyz"])["surely-not-installed-xyz"] is None


def test_file_stamps_skip_the_manifest_and_nested_results(tmp_path):
    (tmp_path / "a.csv").write_text("1\n")
    (tmp_path / MANIFEST_FILE).write_text("{}")
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "t.json").write_text("{}")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / MANIFEST_FILE).write_text("{}")
    (tmp_path / "other" / "b.csv").write_text("2\n")
    assert sorted(file_stamps(str(tmp_path))) == ["a.csv", os.path.join("tune", "t.json")]
    assert file_stamps(str(tmp_path / "missing")) == {}


def test_written_and_kept():
    before = {"a": (1, 1), "b": (1, 1), "c": (1, 1)}
    after = {"a": (1, 1), "b": (2, 1), "c": (1, 2), "d": (3, 3)}
    assert written_and_kept(before, after) == (["b", "c", "d"], ["a"])


def test_default_out():
    assert default_out("lag_sweep") == os.path.join(".", "runs", "experiments", "lag_sweep")
    assert default_out("x", "/r") == "/r/runs/experiments/x"


# ----------------------------------------------------------------------------------------
# the manifest of a run
# ----------------------------------------------------------------------------------------


@needs_checkout
def test_manifest_fields_have_real_values(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "out").mkdir()
    (out / "old.txt").write_text("from before\n")
    argv = [os.path.join(REPO, "experiments", "lag_sweep.py"), "--num-seeds", "1"]
    with Manifest(str(out), argv=argv, extra={"note": "test"}) as m:
        time.sleep(0.05)
        (out / "result.csv").write_text("1,2\n")
        (out / "sub").mkdir()
        (out / "sub" / "x.png").write_bytes(b"png")
        m.extra["derived_from"] = {"commit": "abc"}
    data = json.loads((out / MANIFEST_FILE).read_text())
    assert data == read_manifest(str(out))
    assert data["git"]["commit"] == git(["rev-parse", "HEAD"], REPO).strip()
    assert isinstance(data["git"]["dirty"], bool)
    assert data["script"] == os.path.join("experiments", "lag_sweep.py")
    assert shlex.split(data["command"]) == [sys.executable, *argv]
    assert data["cwd"] == os.getcwd()
    assert set(data["versions"]) == {*PACKAGES, "python"}
    assert all(isinstance(data["versions"][k], str) and data["versions"][k] for k in ("ppo_async", "jax", "jaxlib", "numpy", "python"))
    machine = data["machine"]
    assert machine["cpu_count"] == os.cpu_count() and machine["arch"] and machine["platform"]
    for key in ("loadavg_start", "loadavg_end"):
        assert len(machine[key]) == 3 and all(isinstance(x, float) for x in machine[key])
    assert machine["other_cpu_cores"] is None or machine["other_cpu_cores"] >= 0
    assert data["wall_s"] >= 0.05
    assert data["started_at"] <= data["finished_at"] and data["finished_at"].endswith("Z")
    assert data["completed"] is True and "error" not in data and data["reconstructed"] is False
    assert data["files_written"] == ["result.csv", os.path.join("sub", "x.png")]
    assert data["files_kept"] == ["old.txt"]
    assert data["note"] == "test" and data["derived_from"] == {"commit": "abc"}


def test_manifest_of_a_run_that_raised(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="boom"):
        with Manifest(str(out), argv=["x.py"]):
            (out / "partial.txt").write_text("p\n")
            raise ValueError("boom")
    data = read_manifest(str(out))
    assert data["completed"] is False and data["error"] == "ValueError: boom"
    assert data["files_written"] == ["partial.txt"] and data["wall_s"] > 0


def test_manifest_rerun_lists_rewritten_and_kept_files(tmp_path):
    out = tmp_path / "out"
    with Manifest(str(out), argv=["x.py"]):
        (out / "a.txt").write_text("1\n")
        (out / "b.txt").write_text("1\n")
    with Manifest(str(out), argv=["x.py", "--resume"]):
        (out / "b.txt").write_text("22\n")
    data = read_manifest(str(out))
    assert data["files_written"] == ["b.txt"] and data["files_kept"] == ["a.txt"]
    assert data["command"].endswith("x.py --resume")


def test_manifest_finish_before_start(tmp_path):
    with pytest.raises(RuntimeError, match="before start"):
        Manifest(str(tmp_path)).finish()


def test_manifest_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "code").mkdir()
    with Manifest(str(tmp_path / "out"), argv=["x.py"], repo=str(tmp_path / "code")):
        pass
    assert read_manifest(str(tmp_path / "out"))["git"] == {"commit": None, "dirty": None, "changes": None}
    assert read_manifest(str(tmp_path / "nothing")) is None


# ----------------------------------------------------------------------------------------
# the scripts: untracked default output, a manifest per run
# ----------------------------------------------------------------------------------------


def test_every_script_defaults_to_runs_and_writes_a_manifest():
    assert len(SCRIPTS) >= 11
    for path in SCRIPTS:
        if os.path.basename(path) == "reconstruct_manifests.py":
            continue
        with open(path, encoding="utf-8") as f:
            source = f.read()
        assert "default_out(" in source, path
        assert "Manifest(" in source, path
        assert 'os.path.join(HERE, "results"' not in source, path


@needs_checkout
@pytest.mark.parametrize("name", [os.path.splitext(os.path.basename(p))[0] for p in SCRIPTS])
def test_a_scripts_default_out_is_untracked(name):
    target = os.path.join(default_out(name, REPO), "Pendulum-v1", "summary.txt")
    done = subprocess.run(["git", "check-ignore", "-q", os.path.relpath(target, REPO)], cwd=REPO)
    assert done.returncode == 0, f"{target} is not git-ignored"


def published_result_files() -> list[str]:
    """The files under experiments/results that the repository holds (`git ls-files`: not the
    git-ignored run directories of a benchmark in progress); every file there outside git."""
    results = os.path.join(REPO, "experiments", "results")
    listed = subprocess.run(["git", "ls-files", "-z", "--", "experiments/results"], cwd=REPO, capture_output=True, text=True)
    if listed.returncode != 0:  # not a git checkout (an unpacked sdist): what is there
        return glob.glob(os.path.join(results, "**", "*.*"), recursive=True)
    return [os.path.join(REPO, p) for p in listed.stdout.split("\0") if p]


def test_every_published_result_directory_has_a_manifest():
    data_dirs = {os.path.dirname(p) for p in published_result_files()
                 if not p.endswith(".png") and os.path.basename(os.path.dirname(p)) not in ("tune", "schedules")}
    missing = [d for d in sorted(data_dirs) if not os.path.isfile(os.path.join(d, MANIFEST_FILE))]
    assert not missing, missing
    for d in sorted(data_dirs):
        data = read_manifest(d)
        assert len(data["git"]["commit"]) == 40, d
        assert all(os.path.isfile(os.path.join(d, f)) for f in data["files_written"]), d
        if data["reconstructed"]:  # written after the fact: says so, and claims no dirty flag it cannot know
            assert data["note"].startswith("Written after the fact") and data["git"]["dirty"] is None, d
        else:  # a run of a script (e.g. kl_controller --summarise-only): the manifest it derives from is kept
            assert data["completed"] is True and data["command"], d
            assert data.get("derived_from") is None or a_kept_source(data["derived_from"]), d


def a_kept_source(data: dict) -> bool:
    """A manifest a summary was derived from: a reconstruction, or a completed run whose own
    source (if it was derived too) is one."""
    if data.get("reconstructed") is True:
        return True
    return data.get("completed") is True and (data.get("derived_from") is None or a_kept_source(data["derived_from"]))


def test_module_constants():
    assert manifest.MANIFEST_FILE == "manifest.json" and manifest.SCHEMA == 1


def test_write_summary_writes_the_lines_it_prints(tmp_path, capsys):
    path = manifest.write_summary(str(tmp_path / "out"), ["a  1", "", "b  2"])
    assert path == str(tmp_path / "out" / "summary.txt")
    assert open(path, encoding="utf-8").read() == "a  1\n\nb  2\n" == capsys.readouterr().out


@needs_checkout
def test_a_manifest_lists_no_file_git_ignores(tmp_path):
    """A benchmark's run directories (`runs/`, git-ignored) sit beside its results: the manifest
    of OUT lists what a checkout can hold and counts the rest."""
    out = os.path.join(REPO, "runs", "test_manifest_ignored")  # under the repository's ignored runs/
    shutil.rmtree(out, ignore_errors=True)
    try:
        with manifest.Manifest(out, argv=["x.py"]):
            os.makedirs(os.path.join(out, "runs", "seed0"))
            for name in ("results.csv", os.path.join("runs", "seed0", "metrics.jsonl")):
                with open(os.path.join(out, name), "w") as f:
                    f.write("1\n")
        data = read_manifest(out)
        # everything under the repository's runs/ is ignored, OUT included: nothing listed, both counted
        assert data["files_written"] == [] and data["files_ignored_by_git"] == 2
        assert manifest.git_ignored(os.path.join(REPO, "experiments", "results"), ["ablation/old/runs/x/y.json",
                                                                                   "ablation/summary.txt"]) == {
            "ablation/old/runs/x/y.json"}
    finally:
        shutil.rmtree(out, ignore_errors=True)
