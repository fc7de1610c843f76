"""`python -m ppo_async benchmark`: suites of envs x modes x seeds against reference figures
(`ppo_async.study.benchmark`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Literal

import tyro

from ppo_async.cli.paths import check_csv, check_output_dir
from ppo_async.config import parse_assignments
from ppo_async.errors import ConfigError

ModeChoice = Literal["sync", "barrier", "async", "async-decoupled"]  # study.benchmark.MODES (a test keeps them equal)


@dataclasses.dataclass(frozen=True)
class BenchmarkCommand:
    """Run a benchmark suite: every env x mode x seed with the env's preset, the learner's
    deterministic policy evaluated every --eval-every-steps env steps; writes results.csv,
    report.md (mean, 95% bootstrap CI and worst seed per checkpoint; IQM and probability of
    improvement across envs with rliable), plots and manifest.json into --out. Run again with
    the same options to resume: finished runs are skipped."""

    suite: Annotated[str, tyro.conf.arg(metavar="NAME")] = "mujoco"
    """The suite: mujoco (gymnasium HalfCheetah, Hopper, Walker2d, Ant; 1M steps), mujoco-envpool (the same tasks stepped by EnvPool), mujoco-slow (the same in the article's slow-simulator regime: 8 samplers, +5 ms per env step, one 4x slower), dmc (playground), classic (gymnax)."""
    seeds: Annotated[int, tyro.conf.arg(metavar="N")] = 5
    """Runs per env x mode (seeds 0 .. N-1)."""
    out: Annotated[str, tyro.conf.arg(metavar="DIR")] = "runs/benchmark"
    """Output directory (results.csv, report.md, plots, manifest.json, runs/)."""
    envs: Annotated[tuple[str, ...] | None, tyro.conf.arg(metavar="NAME", help_behavior_hint="(default: the suite's)")] = None
    """A subset of the suite's envs."""
    total_env_steps: Annotated[int | None, tyro.conf.arg(metavar="N", help_behavior_hint="(default: the suite's budget)")] = None
    """Env steps per run."""
    modes: Annotated[tuple[ModeChoice, ...] | None, tyro.conf.arg(metavar="MODE", help_behavior_hint="(default: those every env can run)")] = None
    """Modes: sync (JAX envs only), barrier (threaded, lag 0), async (barrier without the barrier: lag 1 from overlap, PPO's clip; the default async mode), async-decoupled (async with decoupled PPO)."""
    eval_every_steps: Annotated[int | None, tyro.conf.arg(metavar="N", help_behavior_hint="(default: the suite's, 100k for mujoco)")] = None
    """Env steps between evaluations of the deterministic policy."""
    eval_episodes: Annotated[int, tyro.conf.arg(metavar="N")] = 10
    """Episodes per evaluation."""
    set: Annotated[tuple[str, ...], tyro.conf.arg(metavar="FIELD=VALUE")] = ()
    """Config fields set over every run's preset, as dotted.field=value (JSON values; ppo.clip_eps or ppo.clip-eps, the flag's spelling), all after one --set (an ablation)."""
    runs_dir: Annotated[str | None, tyro.conf.arg(metavar="DIR", help_behavior_hint="(default: OUT/runs)")] = None
    """Where the run directories go; outside --out, the out directory holds only results, report and manifest."""
    report_only: bool = False
    """Only write report.md and the plots again from DIR/results.csv."""
    relabel_modes: bool = False
    """Only bring a benchmark recorded before 2026-12-05 to today's mode labels (async-ppo -> async, async -> async-decoupled) in DIR's files and its run directories (--runs-dir), then write its report again."""
    jobs: Annotated[int, tyro.conf.arg(metavar="N")] = 1
    """Runs trained at once, each in its own process (results recorded by this one). Only for runs bound by simulated latency, not by the cores (mujoco-slow's barrier runs): a run's wall-clock is a timing only where it ran alone or was checked unchanged beside the others. Recorded in manifest.json."""
    quiet: bool = False
    """No per-run lines or progress bars."""

    def run(self) -> int:
        from ppo_async.study.benchmark import benchmark, report  # here: `--help` and parse errors need no JAX

        self.check_paths()
        if self.jobs != 1 and (self.relabel_modes or self.report_only):
            raise ConfigError(f"--jobs = {self.jobs} has no effect with --{'relabel-modes' if self.relabel_modes else 'report-only'}: "
                              "nothing is trained")
        if self.relabel_modes:
            return self.relabel()
        if self.report_only:
            path = report(self.out)
            print(f"wrote {path}", flush=True)
            return 0
        benchmark(self.suite, seeds=self.seeds, out=self.out, envs=self.envs, total_env_steps=self.total_env_steps,
                  modes=self.modes, eval_every_steps=self.eval_every_steps, eval_episodes=self.eval_episodes,
                  progress=not self.quiet, changes=parse_assignments(self.set), runs_dir=self.runs_dir, jobs=self.jobs)
        print(f"benchmark done: {os.path.join(self.out, 'report.md')}", flush=True)
        return 0

    def relabel(self) -> int:
        """`--relabel-modes`: `relabel.relabel_modes` on --out (and --runs-dir), then the report."""
        from ppo_async.study.benchmark import report
        from ppo_async.study.benchmark.relabel import relabel_modes

        try:
            changed = relabel_modes(self.out, self.runs_dir)
        except (FileNotFoundError, FileExistsError) as exc:
            raise ConfigError(f"--relabel-modes: {exc}") from None
        if not changed["spec"]:
            print(f"{self.out}: already in today's mode labels; nothing to do", flush=True)
            return 0
        print(f"{self.out}: relabelled {changed['results.csv']} results rows, {changed['timings.csv']} timings rows, "
              f"{changed['run_dirs']} run directories", flush=True)
        if os.path.isfile(os.path.join(self.out, "results.csv")) and os.path.getsize(os.path.join(self.out, "results.csv")):
            print(f"wrote {report(self.out)}", flush=True)
        return 0

    def check_paths(self) -> None:
        """ConfigError for an --out or --runs-dir that is a file or cannot be written, and
        DataFileError (file and line) for a corrupt OUT/results.csv, before anything runs."""
        results = os.path.join(self.out, "results.csv")
        if self.report_only or self.relabel_modes:
            if os.path.exists(self.out) and not os.path.isdir(self.out):
                raise ConfigError(f"--out = {self.out!r} is invalid: it is a file, not a directory")
        else:
            check_output_dir("--out", self.out)
            if self.runs_dir is not None:
                check_output_dir("--runs-dir", self.runs_dir)
        if os.path.isfile(results):
            check_csv(results)
