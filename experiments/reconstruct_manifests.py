"""manifest.json, after the fact, for the published result directories that were written before
scripts recorded one (issue 25 item 8). Run once; kept as the record of how those manifests were made.

    python experiments/reconstruct_manifests.py           # writes the missing manifests under experiments/results
    python experiments/reconstruct_manifests.py --dry-run # prints them instead

A result directory is a folder under experiments/results/ with tracked files other than PNGs
(`tune/` and `schedules/` belong to the folder above them). A directory that already holds a
manifest.json is left alone: a real one is never replaced by a reconstruction.

What a reconstructed manifest says, and how it knows it (nothing is guessed):
  git.commit          the commit that last wrote most of the directory's files (per file
                      `git log -1 -- FILE`; a later commit that touched one file, e.g. a hand edit
                      or a transcript committed after, does not move it); `added_in` the commit
                      that added the first of them (`git log --diff-filter=A`), and
                      `file_commits` the last commit of every file. The code that produced the
                      files ran before they were committed, on a tree that may have had changes:
                      git.dirty is null (unknown).
  command             from the result files where they record it (sync_vs_async's summary.json
                      meta.command; the last line of a summary.txt as the script wrote it, read
                      at the commit that added it; bench_memory's output.txt), else as README
                      quotes it for these results (`COMMANDS`); `command_source` says which.
  machine, wall_s     copied where the result files recorded them (the benchmarks' `machine`
                      field, sync_vs_async's meta, a summary line's seconds); else null.
  versions            ppo_async from pyproject.toml at git.commit; jax where a result file
                      recorded it; else null.
  reconstructed       true, with `note`: machine and load were not recorded at the time unless
                      `recorded_fields` names where they come from.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import subprocess
import tomllib
from typing import Any

import tyro

from ppo_async.study.manifest import MANIFEST_FILE, SCHEMA, write_json

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join("experiments", "results")
BELONG_TO_PARENT = ("tune", "schedules")

# README's command for results whose files do not record one (README.md at the commit of this script).
_LC = "python experiments/learning_curves.py"
COMMANDS = {
    "bench_distributed": "python experiments/bench_distributed.py",
    "bench_envs": "python experiments/bench_envs.py",
    "bench_sweep": "python experiments/bench_sweep.py",
    "bench_sync": "python experiments/bench_sync.py --peer-dir /tmp/purejaxrl/purejaxrl",
    "bench_threaded": "python experiments/bench_threaded.py",
    "lag_sweep/Pendulum-v1": "python experiments/lag_sweep.py",
    "lag_sweep/Pendulum-v1/decoupled_vtrace": None,  # README: "--variants decoupled_vtrace"; its --out is not quoted
    "lag_sweep/brax/inverted_pendulum": "python experiments/lag_sweep.py --env brax/inverted_pendulum --total-env-steps 200000 --threshold 900",
    "kl_controller/brax/inverted_pendulum": "python experiments/kl_controller.py --env brax/inverted_pendulum --threshold 900 "
                                            "--out experiments/results/kl_controller/brax/inverted_pendulum",
    "learning_curves/CartPole-v1/default": f"{_LC} --env CartPole-v1 --num-seeds 5",
    "learning_curves/CartPole-v1/heldout-seeds": f"{_LC} --env CartPole-v1 --num-seeds 5 --seed 100 --tag heldout-seeds",
    "learning_curves/Pendulum-v1/default": f"{_LC} --env Pendulum-v1 --num-seeds 5",
    "learning_curves/Pendulum-v1/heldout-seeds": f"{_LC} --env Pendulum-v1 --num-seeds 5 --seed 100 --tag heldout-seeds",
    **{f"learning_curves/{env}/{tag}": "README quotes the pattern `python experiments/learning_curves.py --env ENV "
       "--num-seeds 5 [--seed 100 --tag heldout-seeds]`; the command is that pattern for this env and tag, "
       "which matches summary.json (env, seeds, tag, 299,008 env steps per seed)."
       for env in ("CartPole-v1", "Pendulum-v1") for tag in ("default", "heldout-seeds")},
    "learning_curves/Pendulum-v1/peer-shape": f"{_LC} --env Pendulum-v1 --num-seeds 3 --total-env-steps 1000000 "
                                              "--set rollout.num_envs=64 --set rollout.num_steps=128 --set ppo.num_epochs=4 "
                                              "--set ppo.num_minibatches=32 --tag peer-shape",
    "learning_curves/brax/inverted_pendulum/default": f"{_LC} --env brax/inverted_pendulum --num-seeds 3 --total-env-steps 2000000",
    "learning_curves/playground/CartpoleBalance/default": f"{_LC} --env playground/CartpoleBalance --num-seeds 3 --total-env-steps 2000000",
    "learning_curves/playground/CheetahRun/default": f"{_LC} --env playground/CheetahRun --num-seeds 3 --total-env-steps 1500000",
}
# what is known about a result beyond its files, with the source (shown in the manifest's `notes`)
NOTES = {
    "bench_sync": "README quotes `python experiments/bench_sync.py`; cpu.json's args record peer_dir "
                  "/tmp/purejaxrl/purejaxrl (the peer measured side by side), so the command had --peer-dir.",
    "lag_sweep/Pendulum-v1/decoupled_vtrace": "README: the variant is run with `--variants decoupled_vtrace`; the "
                                              "other arguments (e.g. --out) are not recorded.",
    "kl_controller/brax/inverted_pendulum": "The script of commit added_in wrote '(533 s; python experiments/kl_controller.py)' "
                                            "(no arguments); the command is README's. Commit 8906676 filled the arguments into "
                                            "summary.txt by hand; summary.txt is regenerated from runs.csv (see its manifest).",
    **{f"learning_curves/{env}/{tag}": "README quotes the pattern `python experiments/learning_curves.py --env ENV "
       "--num-seeds 5 [--seed 100 --tag heldout-seeds]`; the command is that pattern for this env and tag, "
       "which matches summary.json (env, seeds, tag, 299,008 env steps per seed)."
       for env in ("CartPole-v1", "Pendulum-v1") for tag in ("default", "heldout-seeds")},
    "learning_curves/Pendulum-v1/peer-shape": "summary.json records overrides ['ppo.num_minibatches=32'] and a config of "
                                              "16 envs x 64 steps, 5 epochs x 32 minibatches: with tyro a repeated --set keeps "
                                              "only the last, so of README's four --set only the last took effect.",
    "bench_memory": "output.txt is a transcript assembled by hand (a header line on the machine's load, the table the "
                    "script printed, and tables of further runs whose JSON is not committed); bench_memory.json is the "
                    "script's output.",
}
SUMMARY_LINE = re.compile(r"^\((\d+) s; (python experiments/\S+\.py.*)\)$")
LOADAVG = re.compile(r"load average: ([0-9.]+), ([0-9.]+), ([0-9.]+)")


def git(*args: str) -> str:
    """stdout of `git ARGS` in the repository."""
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def result_dirs() -> dict[str, list[str]]:
    """{result dir (relative to experiments/results): its tracked files, relative to it}."""
    owned = [(_owner_dir(os.path.relpath(os.path.dirname(p), RESULTS)), p) for p in git("ls-files", RESULTS).splitlines()]
    dirs = sorted({d for d, p in owned if not p.endswith(".png")})
    out: dict[str, list[str]] = {d: [] for d in dirs}
    for d, path in owned:
        if d in out:
            out[d].append(os.path.relpath(path, os.path.join(RESULTS, d)))
    return out


def _owner_dir(rel: str) -> str:
    """The result dir a folder belongs to: itself, or the folder above its tune/ or schedules/."""
    parts = rel.split(os.sep)
    for i, part in enumerate(parts):
        if part in BELONG_TO_PARENT:
            return os.sep.join(parts[:i])
    return rel


def commits_of(directory: str, files: list[str]) -> dict[str, Any]:
    """The commit facts of a result dir: last writer, first adder, per-file last commits."""
    paths = [os.path.join(RESULTS, directory, f) for f in files]
    added = git("log", "--diff-filter=A", "--format=%H", "--", *paths).split()
    per_file = {f: git("log", "-1", "--format=%H", "--", p).strip() for f, p in zip(files, paths)}
    counts = collections.Counter(per_file.values())
    last = max(counts, key=lambda c: (counts[c], int(git("log", "-1", "--format=%ct", c))))  # most files; then the latest
    return {"commit": last, "added_in": added[-1], "file_commits": per_file,
            "committed_at": git("log", "-1", "--format=%cI", last).strip(),
            "subject": git("log", "-1", "--format=%s", last).strip()}


def show(commit: str, path: str) -> str:
    """A file's text at a commit."""
    return git("show", f"{commit}:{path}")


def recorded(directory: str, files: list[str], added_in: str) -> dict[str, Any]:
    """What the result files themselves recorded: command, machine, wall_s, versions, args (and where)."""
    base = os.path.join(REPO, RESULTS, directory)
    found: dict[str, Any] = {"machine": {}, "versions": {}, "sources": {}}
    for name in files:
        path = os.path.join(base, name)
        if name.endswith(".json") and os.sep not in name:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict):
                _from_json(data, name, found)
        elif name == "summary.txt":
            _from_summary_line(show(added_in, os.path.join(RESULTS, directory, name)), found)
        elif directory == "bench_memory" and name == "output.txt":
            with open(path, encoding="utf-8") as f:
                first = f.readline().strip()
            found["command"] = first.split("   ")[0]
            found["sources"]["command"] = "output.txt, first line"
            found["load_note"] = first
    return found


def _from_json(data: dict, name: str, found: dict) -> None:
    """Fields of a benchmark's results JSON (`machine`, `args`), sync_vs_async's `meta` or a learning curve's summary."""
    if isinstance(data.get("machine"), dict):
        m = data["machine"]
        found["machine"].update(cpu_count=m.get("cpu_count"), loadavg_start=m.get("loadavg_before"),
                                loadavg_end=m.get("loadavg_after"), other_cpu_cores=m.get("other_cpu_cores"))
        found["measured_wall_s"] = m.get("wall_s")
        found["sources"]["machine"] = f"{name}: machine (over the measured part of the script)"
    if "args" in data:
        found["args"] = data["args"]
    meta = data.get("meta")
    if isinstance(meta, dict):
        start, end = (LOADAVG.search(meta.get(k, "")) for k in ("uptime_start", "uptime_end"))
        found["machine"].update(cpu_count=meta.get("cpus"), platform=meta.get("platform"),
                                loadavg_start=[float(x) for x in start.groups()] if start else None,
                                loadavg_end=[float(x) for x in end.groups()] if end else None)
        found.update(command=meta.get("command"), wall_s=meta.get("script_seconds"))
        found["versions"]["jax"] = meta.get("jax")
        found["sources"].update(machine=f"{name}: meta", command=f"{name}: meta.command", wall_s=f"{name}: meta.script_seconds")
    if "tag" in data and "overrides" in data:
        found["args"] = {k: data[k] for k in ("env", "tag", "overrides", "num_seeds", "seeds", "env_steps_per_seed")}
        found["run_seconds"] = {k: data[k] for k in ("compile_seconds", "run_seconds")}


def _from_summary_line(text: str, found: dict) -> None:
    """"(N s; COMMAND)", the last line a summary.txt had as its script wrote it."""
    match = SUMMARY_LINE.match(text.rstrip().splitlines()[-1])
    if match:
        found["wall_s"] = float(match.group(1))
        found["command"] = match.group(2)
        found["sources"].update(wall_s="summary.txt's last line (as added)", command="summary.txt's last line (as added)")


def reconstruct(directory: str, files: list[str]) -> dict[str, Any]:
    """The manifest of one published result dir, from git and its files (see the module docstring)."""
    commits = commits_of(directory, files)
    found = recorded(directory, files, commits["added_in"])
    command, source = found.get("command"), found["sources"].get("command")
    if directory in COMMANDS:
        command = COMMANDS[directory]
        source = None if command is None else "README.md" + (" (see notes)" if directory in NOTES else "")
    if found.get("command") not in (None, command):
        found["command_recorded"] = found["command"]  # what the files say, where README says more
    machine = {k: found["machine"].get(k) for k in ("cpu_count", "platform", "loadavg_start", "loadavg_end", "other_cpu_cores")}
    pyproject = tomllib.loads(show(commits["commit"], "pyproject.toml"))
    manifest = {
        "schema": SCHEMA,
        "reconstructed": True,
        "note": "Written after the fact by experiments/reconstruct_manifests.py. "
                + ("Machine and load were not recorded at the time." if not found["sources"].get("machine")
                   else f"Machine and load copied from {found['sources']['machine']}; what is null was not recorded."),
        "script": f"experiments/{directory.split(os.sep)[0]}.py",
        "command": command,
        "command_source": source,
        "git": {"commit": commits["commit"], "dirty": None, "changes": None},
        "added_in": commits["added_in"],
        "committed_at": commits["committed_at"],
        "commit_subject": commits["subject"],
        "versions": {"ppo_async": pyproject["project"]["version"], "jax": found["versions"].get("jax"),
                     "jaxlib": None, "numpy": None, "python": None},
        "machine": machine,
        "wall_s": found.get("wall_s"),
        "files_written": sorted(files),
        "file_commits": commits["file_commits"],
        "recorded_fields": found["sources"],
    }
    for key in ("command_recorded", "measured_wall_s", "args", "run_seconds", "load_note"):
        if key in found:
            manifest[key] = found[key]
    if directory in NOTES:
        manifest["notes"] = NOTES[directory]
    return manifest


@dataclasses.dataclass
class Args:
    dry_run: bool = False
    """Print the manifests instead of writing them."""


def main(args: Args) -> None:
    for directory, files in result_dirs().items():
        path = os.path.join(REPO, RESULTS, directory, MANIFEST_FILE)
        if MANIFEST_FILE in files or os.path.exists(path):
            print(f"{directory}: has a manifest, left alone")
            continue
        manifest = reconstruct(directory, files)
        if args.dry_run:
            print(directory, json.dumps(manifest, indent=2))
        else:
            write_json(path, manifest)
            print(f"{directory}: wrote {MANIFEST_FILE} (command from {manifest['command_source'] or 'nowhere: unknown'})")


if __name__ == "__main__":
    main(tyro.cli(Args))
