"""The commands on finished runs: `eval` (play a checkpoint's policy), `plot` (write a run's
PNG plots) and `compare` (overlaid figures and the summary table of several runs)."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from typing import Annotated, Any, Sequence

import tyro

from ppo_async.cli.paths import METRICS_FILE, check_output_dir, check_run_dir
from ppo_async.errors import ConfigError

OUTPUT_ROOT = "runs"
"""Where every command writes by default: train runs/<env>-<mode>-<timestamp>, tune
runs/tune-<env>-<timestamp>, benchmark runs/benchmark, plot runs/plots/<timestamp>, compare
runs/compare/<timestamp>, the experiments runs/experiments/<name>."""
OUTPUT_FOLDERS = ("plots", "compare", "benchmark", "experiments")
"""The folders under `OUTPUT_ROOT` that hold other commands' outputs, not runs (and tune-*)."""

RunDirs = Annotated[tuple[str, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR", help_behavior_hint="(one or more)")]
Labels = Annotated[tuple[str, ...] | None, tyro.conf.arg(metavar="A B ...", help_behavior_hint="(default: the directories' names)")]


def _dir_name(run_dir: str) -> str:
    return os.path.basename(os.path.normpath(os.path.abspath(run_dir)))


def run_labels(run_dirs: Sequence[str], labels: Sequence[str] | None) -> list[str]:
    """One label per run dir: `labels` (ConfigError unless one per dir, all different) or
    the directories' names (a repeated name falls back to the path as given)."""
    if labels is not None:
        if len(labels) != len(run_dirs):
            raise ConfigError(
                f"--labels: got {len(labels)} label(s) {list(labels)} for {len(run_dirs)} run dir(s); give one label per RUN_DIR"
            )
        if len(set(labels)) != len(labels):
            raise ConfigError(f"--labels: {list(labels)} has repeated labels; each run needs its own")
        return list(labels)
    names = [_dir_name(d) for d in run_dirs]
    return [name if names.count(name) == 1 else run_dir for name, run_dir in zip(names, run_dirs)]


def is_output_folder(path: str) -> bool:
    """Whether `path` is a folder of another command's outputs, not a run: it holds no
    metrics.jsonl and is named as one of `OUTPUT_FOLDERS` or tune-* (where plot, compare,
    benchmark, the experiments and tune write by default)."""
    name = os.path.basename(os.path.normpath(os.path.abspath(path)))
    named = name in OUTPUT_FOLDERS or name.startswith("tune-")
    return named and os.path.isdir(path) and not os.path.isfile(os.path.join(path, METRICS_FILE))


def runs_to_read(run_dirs: Sequence[str], labels: Sequence[str] | None, command: str) -> list[str]:
    """The RUN_DIRs `command` reads: with several and no --labels, those that are other
    commands' output folders (`is_output_folder`) are left out, with a note on stderr, so
    `compare runs/*` still names only the runs after a first `compare` wrote runs/compare/.
    Every other RUN_DIR (and any with --labels, which counts them) is kept, to be checked as given."""
    if len(run_dirs) < 2 or labels is not None:
        return list(run_dirs)
    kept = [d for d in run_dirs if not is_output_folder(d)]
    if not kept:
        return list(run_dirs)
    for left_out in (d for d in run_dirs if d not in kept):
        print(f"{command}: left out {left_out} (another command's outputs, not a run)", file=sys.stderr, flush=True)
    return kept


def _check_runs(run_dirs: Sequence[str], labels: Sequence[str] | None) -> None:
    if not run_dirs:
        raise ConfigError("at least one RUN_DIR is required")
    run_labels(run_dirs, labels)


@dataclasses.dataclass(frozen=True)
class EvalCommand:
    """Plays episodes with the policy of a checkpoint of RUN_DIR and prints the mean return."""

    run_dir: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="RUN_DIR")]
    """The run directory (from `train`) whose checkpoint is played."""
    episodes: Annotated[int, tyro.conf.arg(metavar="N")] = 20
    """Episodes to play."""
    step: Annotated[int | None, tyro.conf.arg(metavar="N", help_behavior_hint="(default: the latest)")] = None
    """The checkpoint step (learner iteration) to load; an absent step is an error listing the available ones."""
    seed_index: Annotated[int, tyro.conf.arg(metavar="I")] = 0
    """Which seed of a multi-seed run."""
    seed: Annotated[int, tyro.conf.arg(metavar="S")] = 0
    """Seed of the evaluation episodes."""
    stochastic: bool = False
    """Sample actions instead of the deterministic (mean / argmax) action."""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ConfigError(f"--episodes = {self.episodes} is invalid: must be an integer >= 1")
        if self.step is not None and self.step < 0:
            raise ConfigError(f"--step = {self.step} is invalid: must be a checkpoint step >= 0")

    def run(self) -> int:
        from ppo_async.modes.train import load  # here, not at import: `--help` and parse errors need no JAX
        from ppo_async.run.policy import evaluate

        policy = load(self.run_dir, seed_index=self.seed_index, step=self.step)
        returns = evaluate(policy, self.episodes, seed=self.seed, deterministic=not self.stochastic)["returns"]
        kind = "stochastic" if self.stochastic else "deterministic"
        print(f"mean return {float(returns.mean()):.2f} +- {float(returns.std()):.2f} over {self.episodes} episodes "
              f"({kind} policy, seed index {self.seed_index}, iteration {policy.iteration})", flush=True)
        return 0


@dataclasses.dataclass(frozen=True)
class PlotCommand:
    """(Re)writes the PNG plots of each run into its RUN_DIR and prints the paths written:
    learning_curve.png, kl_over_time.png, throughput.png, and lag_histogram.png, kl_per_lag.png,
    sampler_time.png where the metrics have those columns; with several runs also a combined
    learning curve."""

    run_dirs: RunDirs
    """The run directories (each holds metrics.jsonl)."""
    labels: Labels = None
    """One label per RUN_DIR, in order, for the legends; takes every value up to the next option."""
    out: Annotated[str | None, tyro.conf.arg(metavar="DIR", help_behavior_hint="(default: runs/plots/<timestamp>)")] = None
    """Where the combined learning curve of several runs, learning_curve_combined.png, goes; with --labels also each run's relabelled plots (OUT/<label>/), so the PNGs inside the run directories are left as the run wrote them."""

    def __post_init__(self) -> None:
        _check_runs(self.run_dirs, self.labels)

    def run(self) -> int:
        run_dirs = runs_to_read(self.run_dirs, self.labels, "plot")
        for run_dir in run_dirs:
            check_run_dir(run_dir)
        combined_or_relabelled = len(run_dirs) > 1 or self.labels is not None
        out = (self.out or default_output_dir("plots")) if combined_or_relabelled else self.out
        if out is not None:
            check_output_dir("--out", out)
        if not self.labels:  # each run's own plots go into its directory
            for run_dir in run_dirs:
                check_output_dir("RUN_DIR", run_dir)
        for path in write_plots(run_dirs, out, self.labels):
            print(path)
        return 0


def write_plots(run_dirs: Sequence[str], out: str | None = None, labels: Sequence[str] | None = None) -> list[str]:
    """`plots.plot_run` of every run, into the run dir or, when `labels` are given, into
    `out/<label>/` (a relabelled figure never replaces the run's own); with several runs also
    `learning_curve_combined.png` (median and 25-75% band per run, labelled by `labels`,
    default the directory names) in `out` (default: the first run dir)."""
    from ppo_async.report import plots

    relabelled = labels is not None
    labels = run_labels(run_dirs, labels)
    written: list[str] = []
    for run_dir, label in zip(run_dirs, labels):
        target = os.path.join(out or run_dirs[0], label) if relabelled else None
        written.extend(plots.plot_run(run_dir, label=label, out_dir=target))
    if len(run_dirs) > 1:
        runs = {label: plots.read_run_metrics(d, "plot") for d, label in zip(run_dirs, labels)}
        path = os.path.join(out or run_dirs[0], "learning_curve_combined.png")
        plots.learning_curve(runs, x="env_steps", path=path)
        written.append(path)
    return written


def default_output_dir(command: str) -> str:
    """`compare`'s and `plot`'s default --out: runs/COMMAND/<timestamp> under the working
    directory, beside the runs (`compare runs/*` leaves runs/COMMAND out: `runs_to_read`)."""
    return os.path.join(OUTPUT_ROOT, command, datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))


def default_compare_dir(run_dirs: Sequence[str]) -> str:
    """`compare`'s default --out (`default_output_dir("compare")`; `run_dirs` are not read)."""
    return default_output_dir("compare")


def summary_text(table: Any) -> str:
    """A summary table (`summarize` rows, indexed by run label) as printed by `compare`:
    floats in `%.6g`, NaN as "nan", one line per run."""
    return table.to_string(float_format=lambda v: f"{v:.6g}", na_rep="nan")


@dataclasses.dataclass(frozen=True)
class CompareCommand:
    """Overlaid figures of several runs and their summary table: writes
    return_vs_env_steps.png and return_vs_wall_time.png (median over seeds, 25-75% band),
    kl_over_time.png, lag_histogram.png (the fraction of samples per lag) and summary.csv into
    the output directory, and prints the summary table (ppo_async.summarize), one row per run."""

    run_dirs: RunDirs
    """The run directories (each holds metrics.jsonl)."""
    labels: Labels = None
    """One label per RUN_DIR, in order; takes every value up to the next option."""
    out: Annotated[str | None, tyro.conf.arg(metavar="DIR", help_behavior_hint="(default: runs/compare/<timestamp>)")] = None
    """Output directory."""
    threshold: Annotated[float | None, tyro.conf.arg(metavar="X", help_behavior_hint="(default: none)")] = None
    """Also report the median env steps to reach return X and how many seeds reach it ("k/n")."""

    def __post_init__(self) -> None:
        _check_runs(self.run_dirs, self.labels)

    def run(self) -> int:
        import pandas as pd

        from ppo_async.report import plots
        from ppo_async.report.analysis import summarize

        run_dirs = runs_to_read(self.run_dirs, self.labels, "compare")
        for run_dir in run_dirs:
            check_run_dir(run_dir)
        out = self.out or default_compare_dir(run_dirs)
        check_output_dir("--out", out)
        runs = {}
        for run_dir, label in zip(run_dirs, run_labels(run_dirs, self.labels)):
            runs[label] = plots.read_run_metrics(run_dir, "compare")  # a corrupt line: DataFileError
        written = plots.compare_runs(runs, out)
        table = pd.concat([summarize(df, threshold=self.threshold) for df in runs.values()], ignore_index=True)
        table.index = pd.Index(list(runs), name="run")
        table.to_csv(os.path.join(out, "summary.csv"))
        written.append(os.path.join(out, "summary.csv"))
        print(f"compare: {len(runs)} runs -> {out}")
        for path in written:
            print(path)
        print(summary_text(table), flush=True)
        return 0
