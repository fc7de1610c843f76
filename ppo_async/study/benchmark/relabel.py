"""A benchmark recorded under the mode labels before 2026-12-05, brought to today's.

Until then the benchmark's plain-PPO async mode was labelled `async-ppo` and the decoupled one
`async`; today they are `async` and `async-decoupled` (`suites.OLD_MODE_LABELS`; the fields of
each mode are unchanged). An OUT recorded before carries the old labels in benchmark.json (its
`modes` and the keys of its `configs`), in results.csv and timings.csv (their `mode` column), and
in the run directories' paths (RUNS/<env>/<mode>/seed<k>) and done markers. `relabel_modes`
rewrites all of them once; benchmark.json then records `mode_labels: 2`, and `old_labels` tells
a file in need of it (the benchmark refuses such an OUT with the command that fixes it).
Side effects: file rewrites and directory renames under OUT and RUNS.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Mapping

from ppo_async.study.benchmark.suites import MODE_LABELS_VERSION, OLD_MODE_LABELS
from ppo_async.study.manifest import write_json

TABLES = ("results.csv", "timings.csv")
SPEC = "benchmark.json"
DONE = "benchmark_done.json"
JOURNAL = "relabel_journal.json"


def old_labels(spec: Mapping[str, Any]) -> bool:
    """Whether a recorded benchmark.json names modes in the labels before 2026-12-05: no
    `mode_labels` and a mode among the old async labels (a barrier- or sync-only benchmark reads
    the same under both)."""
    return spec.get("mode_labels") != MODE_LABELS_VERSION and any(m in OLD_MODE_LABELS for m in spec.get("modes", []))


def relabel_spec(spec: Mapping[str, Any], mapping: Mapping[str, str] = OLD_MODE_LABELS) -> dict[str, Any]:
    """benchmark.json's contents with `mapping` applied to its modes and config keys ("<env> <mode>"),
    marked `mode_labels: 2` (pure)."""
    out = dict(spec)
    out["modes"] = [mapping.get(m, m) for m in spec.get("modes", [])]
    configs = {}
    for key, config in spec.get("configs", {}).items():
        env, _, mode = key.rpartition(" ")
        configs[f"{env} {mapping.get(mode, mode)}"] = config
    if "configs" in spec:
        out["configs"] = configs
    out["mode_labels"] = MODE_LABELS_VERSION
    return out


def _relabel_table(path: str, mapping: Mapping[str, str]) -> int:
    """Rewrites the `mode` column of CSV `path` through `mapping`; returns the rows changed."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
        fields = list(rows[0].keys()) if rows else None
    if not rows or "mode" not in fields:
        return 0
    changed = 0
    for row in rows:
        new = mapping.get(row["mode"], row["mode"])
        changed += new != row["mode"]
        row["mode"] = new
    tmp = path + ".tmp"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(tmp, path)
    return changed


def _mode_dirs(runs: str, names: Any) -> list[tuple[str, str]]:
    """(env directory, name) of every RUNS/<env>/<name> directory among `names`."""
    if not os.path.isdir(runs):
        return []
    envs = [os.path.join(runs, e) for e in sorted(os.listdir(runs)) if os.path.isdir(os.path.join(runs, e))]
    return [(env, name) for env in envs for name in names if os.path.isdir(os.path.join(env, name))]


def _hide_run_dirs(runs: str, mapping: Mapping[str, str]) -> None:
    """Phase 1 of the renames: RUNS/<env>/<old> -> RUNS/<env>/.relabel-<old> for every old label
    (a new label can be another's old one: async -> async-decoupled while async-ppo -> async)."""
    for env, mode in _mode_dirs(runs, list(mapping)):
        os.rename(os.path.join(env, mode), os.path.join(env, f".relabel-{mode}"))


def _reveal_run_dirs(runs: str, mapping: Mapping[str, str]) -> int:
    """Phase 2: RUNS/<env>/.relabel-<old> -> RUNS/<env>/<new>, then every done marker under a new
    label's directory says that label (also after a cut between a rename and its markers);
    returns the mode directories renamed."""
    hidden = _mode_dirs(runs, [f".relabel-{m}" for m in mapping])
    for env, name in hidden:
        target = os.path.join(env, mapping[name[len(".relabel-"):]])
        if os.path.exists(target):
            raise FileExistsError(f"cannot relabel {os.path.join(env, name)!r}: {target!r} exists")
        os.rename(os.path.join(env, name), target)
    for env, mode in _mode_dirs(runs, sorted(set(mapping.values()))):
        for seed in sorted(os.listdir(os.path.join(env, mode))):
            marker = os.path.join(env, mode, seed, DONE)
            if os.path.isfile(marker):
                with open(marker, encoding="utf-8") as f:
                    done = json.load(f)
                if done.get("mode") != mode:
                    write_json(marker, {**done, "mode": mode})
    return len(hidden)


def relabel_modes(out: str, runs_dir: str | None = None, mapping: Mapping[str, str] = OLD_MODE_LABELS) -> dict[str, int]:
    """Brings OUT (and its run directories: `runs_dir`, default OUT/runs) to today's mode labels.
    Does nothing to an OUT whose benchmark.json already records them. Each step is written to
    OUT/relabel_journal.json when done, so a relabel cut short resumes without applying a step
    twice (a label applied twice would turn async-ppo into async-decoupled); benchmark.json goes
    last. Returns what it changed: {"results.csv": rows, "timings.csv": rows, "run_dirs": mode
    directories, "spec": 0 or 1}."""
    spec_path, journal_path = os.path.join(out, SPEC), os.path.join(out, JOURNAL)
    if not os.path.isfile(spec_path):
        raise FileNotFoundError(f"{spec_path!r} is missing: {out!r} holds no benchmark to relabel")
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    changed = {"spec": 0, **dict.fromkeys(TABLES, 0), "run_dirs": 0}
    if spec.get("mode_labels") == MODE_LABELS_VERSION:
        return changed
    done: list[str] = []
    if os.path.isfile(journal_path):
        with open(journal_path, encoding="utf-8") as f:
            done = list(json.load(f)["done"])

    def step(name: str) -> None:
        done.append(name)
        write_json(journal_path, {"done": done})

    runs = runs_dir or os.path.join(out, "runs")
    for table in TABLES:
        if table not in done and os.path.isfile(os.path.join(out, table)):
            changed[table] = _relabel_table(os.path.join(out, table), mapping)
        if table not in done:
            step(table)
    if "hide" not in done:
        _hide_run_dirs(runs, mapping)
        step("hide")
    changed["run_dirs"] = _reveal_run_dirs(runs, mapping)
    write_json(spec_path, relabel_spec(spec, mapping))
    os.remove(journal_path)
    changed["spec"] = 1
    return changed
