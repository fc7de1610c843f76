"""Provenance of an experiment's results: OUT/manifest.json, written at the end of every run.

Side effects at the edge: it runs `git` in a subprocess, reads the clock, the load average and
the files under OUT. Standard library only: the versions come from the installed packages'
metadata, not from importing them.

    out = args.out or default_out("lag_sweep", REPO)   # REPO/runs/experiments/lag_sweep (git-ignored)
    with Manifest(out):                                # the start: commit, command, versions, load
        ...                                            # the run writes its files under out
    # at the end: out/manifest.json, with the load at the end, wall seconds and the files written

Publishing is explicit: `--out experiments/results/<script>/...`. The fields (`SCHEMA`):
  script, command, cwd            the script (relative to the repository when inside it), the
                                  exact command line (interpreter first, shell-quoted), where it ran
  git                             {commit, dirty, changes}: `git rev-parse HEAD` and the lines of
                                  `git status --porcelain` of the checkout that holds the code
                                  (null outside a checkout)
  versions                        python and `PACKAGES`: ppo_async and its fast-moving
                                  dependencies (null where one is not installed)
  machine                         cpu_count, platform, arch, loadavg_start, loadavg_end (1/5/15 min),
                                  other_cpu_cores (see `benchmarking.MachineLoad`)
  started_at, finished_at, wall_s UTC ISO times and the seconds in between
  completed                       false when the run ended with an exception (then `error`)
  files_written, files_kept       paths under OUT (relative) that the run created or changed, and
                                  those that were there before and left as they were (a reused
                                  tune, say); a nested directory with its own manifest.json is
                                  another result and is left out
  reconstructed                   false here; true in manifests written after the fact
                                  (experiments/reconstruct_manifests.py)
plus whatever the script adds (`extra`, e.g. `derived_from`).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from types import TracebackType
from typing import Any, Sequence

from ppo_async.study.benchmarking import MachineLoad

MANIFEST_FILE = "manifest.json"
SCHEMA = 1
PACKAGES = (
    "ppo_async", "jax", "jaxlib", "numpy", "flax", "optax", "chex", "orbax-checkpoint", "gymnax", "tyro",
    "mujoco", "brax", "playground", "gymnasium", "envpool",
)  # the fast-moving ones whose ranges pyproject.toml bounds; .ci/run prints them (`python -m ppo_async.study.manifest`)
# the checkout that holds this package (when the package runs from one: an editable install)
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_CHANGES = 200  # lines of `git status --porcelain` kept in the manifest


def default_out(name: str, root: str = ".") -> str:
    """The default output folder of an experiment script: ROOT/runs/experiments/NAME.

    `runs/` is git-ignored, so a run never rewrites published results; publishing to
    experiments/results/ takes an explicit `--out`. Scripts pass their repository as `root`.
    """
    return os.path.join(root, "runs", "experiments", name)


def _git(args: Sequence[str], cwd: str) -> str | None:
    """stdout of `git ARGS` run in `cwd`, or None when git is missing, fails or `cwd` is no checkout."""
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_ignored(out: str, paths: Sequence[str]) -> set[str]:
    """Of `paths` (relative to `out`), those git ignores there (`git check-ignore`): files a
    manifest does not list, since a checkout never holds them. Empty outside a git work tree."""
    if not paths:
        return set()
    try:
        done = subprocess.run(["git", "check-ignore", "--stdin", "-z"], cwd=out, input="\0".join(paths) + "\0",
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return set()
    return {p for p in done.stdout.split("\0") if p} if done.returncode in (0, 1) else set()


def git_state(path: str = PACKAGE_ROOT) -> dict[str, Any]:
    """{commit, dirty, changes} of the git checkout holding `path` (all None outside one).

    commit: `git rev-parse HEAD`; dirty: whether `git status --porcelain` lists anything
    (untracked files included, ignored ones not); changes: those lines (at most MAX_CHANGES).
    """
    head = _git(["rev-parse", "HEAD"], path)
    status = _git(["status", "--porcelain"], path) if head is not None else None
    if head is None or status is None:
        return {"commit": None, "dirty": None, "changes": None}
    lines = status.splitlines()
    return {"commit": head.strip(), "dirty": bool(lines), "changes": lines[:MAX_CHANGES]}


def command_line(argv: Sequence[str] | None = None, executable: str | None = None) -> str:
    """The exact command, shell-quoted: the interpreter, then `argv` (default `sys.argv`)."""
    argv = sys.argv if argv is None else argv
    return shlex.join([executable or sys.executable, *argv])


def package_versions(packages: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions of `packages` (None when one is not installed) and of python."""
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = platform.python_version()
    return versions


def script_path(argv0: str, root: str = PACKAGE_ROOT) -> str:
    """`argv0` relative to `root` when it lies inside it (experiments/x.py), else as given."""
    path = os.path.abspath(argv0)
    inside = os.path.commonpath([path, os.path.abspath(root)]) == os.path.abspath(root)
    return os.path.relpath(path, root) if inside else argv0


def file_stamps(out: str) -> dict[str, tuple[int, int]]:
    """{relative path: (mtime_ns, size)} of the files under `out`, skipping manifest.json and every
    sub-directory that holds its own manifest.json (another result). Empty when `out` is missing."""
    stamps: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(out):
        if top != out and MANIFEST_FILE in files:
            dirs[:] = []
            continue
        dirs.sort()
        for name in files:
            if top == out and name == MANIFEST_FILE:
                continue
            path = os.path.join(top, name)
            st = os.stat(path)
            stamps[os.path.relpath(path, out)] = (st.st_mtime_ns, st.st_size)
    return stamps


def written_and_kept(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> tuple[list[str], list[str]]:
    """(files new or changed between two `file_stamps`, files unchanged), each sorted."""
    written = sorted(p for p, stamp in after.items() if before.get(p) != stamp)
    kept = sorted(p for p, stamp in after.items() if before.get(p) == stamp)
    return written, kept


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second ("2026-12-02T21:05:09Z")."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_json(path: str, data: dict) -> None:
    """`data` as indented JSON at `path` (its folder made if missing), a trailing newline."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")


def write_summary(out: str, lines: Sequence[str], name: str = "summary.txt") -> str:
    """Writes `lines` joined by newlines (and a final one) to OUT/NAME and prints them: the
    text summary an experiment publishes. Returns the file's path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    text = "\n".join(lines) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return path


def read_manifest(out: str) -> dict | None:
    """OUT/manifest.json, or None when there is none."""
    path = os.path.join(out, MANIFEST_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Manifest:
    """Records a run's provenance at the start and writes OUT/manifest.json at the end.

    As a context manager: `__enter__` calls `start()`, `__exit__` calls `finish()` (also when the
    run raised: then `completed` is false and `error` names the exception, which propagates).
    `extra` (a dict, updated by the script while it runs) is merged into the manifest.

    Args:
      out: the run's output folder (made at the start if missing).
      argv: the command's arguments (default `sys.argv`); the interpreter is put first.
      repo: a path inside the git checkout of the code (default: the one holding ppo_async).
      extra: more fields for the manifest.
    """

    def __init__(self, out: str, argv: Sequence[str] | None = None, repo: str = PACKAGE_ROOT,
                 extra: dict[str, Any] | None = None) -> None:
        self.out = out
        self.argv = list(sys.argv if argv is None else argv)
        self.repo = repo
        self.extra: dict[str, Any] = dict(extra or {})
        self.data: dict[str, Any] | None = None
        self._load = MachineLoad(include_children=True)  # subprocesses a script starts are its own
        self._before: dict[str, tuple[int, int]] = {}

    def start(self) -> dict[str, Any]:
        """Records the fields known at the start (see the module docstring) and returns them."""
        os.makedirs(self.out, exist_ok=True)
        self._before = file_stamps(self.out)
        machine = self._load.start()
        self.data = {
            "schema": SCHEMA,
            "script": script_path(self.argv[0], self.repo) if self.argv else None,
            "command": command_line(self.argv),
            "cwd": os.getcwd(),
            "git": git_state(self.repo),
            "versions": package_versions(),
            "machine": {"cpu_count": machine["cpu_count"], "platform": platform.platform(),
                        "arch": platform.machine(), "loadavg_start": machine["loadavg_before"]},
            "started_at": utc_now(),
            "reconstructed": False,
        }
        return dict(self.data)

    def finish(self, error: BaseException | None = None) -> dict[str, Any]:
        """Adds the end (load, wall seconds, files written / kept, `extra`), writes OUT/manifest.json
        and returns the manifest."""
        if self.data is None:
            raise RuntimeError("Manifest.finish() called before start()")
        end = self._load.stop()
        written, kept = written_and_kept(self._before, file_stamps(self.out))
        ignored = git_ignored(self.out, written + kept)  # run data beside the results (a benchmark's runs/)
        written, kept = [f for f in written if f not in ignored], [f for f in kept if f not in ignored]
        data = dict(self.data)
        data["machine"] = {**data["machine"], "loadavg_end": end["loadavg_after"], "other_cpu_cores": end["other_cpu_cores"]}
        data.update(finished_at=utc_now(), wall_s=round(end["wall_s"], 6), completed=error is None,
                    files_written=written, files_kept=kept, files_ignored_by_git=len(ignored))
        if error is not None:
            data["error"] = f"{type(error).__name__}: {error}"
        data.update(self.extra)
        write_json(os.path.join(self.out, MANIFEST_FILE), data)
        return data

    def __enter__(self) -> "Manifest":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.finish(exc)


def versions_line(versions: dict[str, str | None]) -> str:
    """`name version` pairs on one line, in `PACKAGES` order (`-` for one not installed)."""
    return "  ".join(f"{name} {version or '-'}" for name, version in versions.items())


TEST_PACKAGES = ("pytest", "pytest-xdist")  # the test runner CI resolved too (its scheduling depends on both)

if __name__ == "__main__":  # what a fresh install resolved (.ci/run prints it before the tests)
    print("resolved versions:", versions_line(package_versions(PACKAGES + TEST_PACKAGES)))
