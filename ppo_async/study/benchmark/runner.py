"""Running a benchmark: every env x mode x seed of the plan brought to "done" (trained, resumed,
completed or skipped, its rows in results.csv), then the report (`benchmark`).

Runs side by side (`jobs` > 1, `run_side_by_side`), for runs bound by simulated latency rather
than by the cores: this process keeps the results store - it decides which runs need training
(`without_training`), hands each to a worker process (spawned: a fresh interpreter and JAX of its
own, this process's environment, XLA flags and compilation cache included) that only trains it
(`train_in_worker`), and records each run's rows as it finishes (`record_run`), one writer for
results.csv and timings.csv. A run that fails stops the benchmark once the runs in flight have
ended; every run that finished is recorded, and the same command resumes the rest.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
import os
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from ppo_async.config import Config, ConfigError, config_from_dict, config_to_dict
from ppo_async.modes.registry import get_mode
from ppo_async.modes.train import train
from ppo_async.report.metrics import read_jsonl
from ppo_async.run import rundir
from ppo_async.run.checkpoint import Checkpointer
from ppo_async.study.benchmark.reporting import report
from ppo_async.study.benchmark.store import (DONE_FILE, WALL_FILE, WallLog, check_spec, finished_keys, results_frame,
                                             rows_of_run, run_dir_of, write_results)
from ppo_async.study.benchmark.suites import Plan, plan_spec, resolve_plan, run_config
from ppo_async.study.benchmark.timings import read_timings, timing_row, write_timing
from ppo_async.study.manifest import Manifest, write_json


def require_rliable() -> None:
    """ConfigError unless `rliable` (the report's aggregate statistics) is installed."""
    try:
        import rliable.metrics  # noqa: F401
    except ImportError:
        raise ConfigError("the benchmark report needs the rliable package: pip install rliable "
                          '(or pip install -e ".[benchmark]")') from None


def trained_to_end(run_dir: str, config: Config) -> bool:
    """Whether the run directory's metrics reach the last iteration with its final evaluation."""
    path = os.path.join(run_dir, rundir.METRICS_FILE)
    if not os.path.isfile(path):
        return False
    rows = read_jsonl(path, columns=("iteration", "eval_return"))
    return bool(rows) and int(rows[-1]["iteration"]) == config.num_iterations and rows[-1].get("eval_return") is not None


def has_checkpoint(run_dir: str, keep: int) -> bool:
    """Whether RUN_DIR/checkpoints holds a complete checkpoint."""
    ckpt_dir = rundir.checkpoint_dir(run_dir)
    if not os.path.isdir(ckpt_dir):
        return False
    with Checkpointer(ckpt_dir, max_to_keep=keep) as ckpt:
        return ckpt.latest_step() is not None


def train_run(config: Config, progress: bool) -> str:
    """Trains one benchmark run into `config.run_dir`: resumes it from its latest checkpoint when
    its mode can, else starts it fresh (a run already there is replaced). Returns "resumed" or
    "fresh"."""
    run_dir = config.run_dir
    holds_run = os.path.isfile(os.path.join(run_dir, rundir.CONFIG_FILE))
    resume = holds_run and get_mode(config.mode).can_resume and has_checkpoint(run_dir, config.keep_checkpoints)
    if not resume and os.path.exists(os.path.join(run_dir, WALL_FILE)):
        os.remove(os.path.join(run_dir, WALL_FILE))
    log = WallLog(run_dir, time.perf_counter())
    try:
        train(config.replace(overwrite=holds_run and not resume), progress=progress, on_iteration=log, resume=resume)
    finally:
        log.close()
    return "resumed" if resume else "fresh"


def finish_run(out: str, plan: Plan, env: str, mode: str, seed: int, done: set, progress: bool,
               runs_dir: str | None = None) -> str:
    """One run of the benchmark, brought to "done" (rows in results.csv, done marker written).
    Returns what it took: "skipped", "rows rebuilt", "fresh", "resumed" or "completed"."""
    config = run_config(plan, env, mode, seed, run_dir_of(out, env, mode, seed, runs_dir))
    how = without_training(config, env, mode, seed, done)
    if how == "skipped":
        return how
    return record_run(out, plan, config, env, mode, seed, done, how or train_run(config, progress))


def without_training(config: Config, env: str, mode: str, seed: int, done: set) -> str | None:
    """What a run needs short of training: "skipped" (done: its done marker written where it
    was lost), "rows rebuilt" / "completed" (trained to its end, its rows lost from results.csv
    or never written), or None: it must be trained."""
    marker = os.path.join(config.run_dir, DONE_FILE)
    if (env, mode, seed) in done:
        if not os.path.isfile(marker):
            write_json(marker, {"env": env, "mode": mode, "seed": seed})
        return "skipped"
    if trained_to_end(config.run_dir, config):  # rows lost from results.csv, or killed before they were written
        return "rows rebuilt" if os.path.isfile(marker) else "completed"
    return None


def record_run(out: str, plan: Plan, config: Config, env: str, mode: str, seed: int, done: set, how: str) -> str:
    """A run trained to its end brought to "done": its rows in results.csv and timings.csv, its
    done marker; returns `how`."""
    rows = rows_of_run(config.run_dir, config, plan.eval_every_steps, env, mode)
    if not rows or not rows[-1]["final"]:
        raise RuntimeError(f"run {config.run_dir!r} ended without its final evaluation row")
    write_results(out, rows)
    record_timing(out, config.run_dir, config, env, mode, seed)
    write_json(os.path.join(config.run_dir, DONE_FILE), {"env": env, "mode": mode, "seed": seed, "rows": len(rows)})
    done.add((env, mode, seed))
    return how


def record_timing(out: str, run_dir: str, config: Config, env: str, mode: str, seed: int) -> bool:
    """The run's row of OUT/timings.csv (`timings.timing_row`) from its metrics.jsonl, where it is
    a threaded run whose directory is here; returns whether a row was written."""
    path = os.path.join(run_dir, rundir.METRICS_FILE)
    if config.mode != "threaded" or not os.path.isfile(path):
        return False
    row = timing_row(read_jsonl(path), env, mode, seed, config.effective_chunks_per_batch, config.effective_num_samplers)
    if row is not None:
        write_timing(out, row)
    return row is not None


def backfill_timings(out: str, plan: Plan, runs_dir: str | None) -> int:
    """Rows of OUT/timings.csv for finished runs that lack one (finished before timings.csv
    existed) or whose row lacks a column added since (the KL parts, the final entropy), where the run directory is
    still here; returns how many rows were written."""
    have = {(r.env, r.mode, int(r.seed)) for r in read_timings(out).itertuples() if not pd.isna(r.entropy_end)}
    added = 0
    for env, mode, seed in sorted(finished_keys(out) - have):
        if env in plan.envs and mode in plan.modes and seed < plan.seeds:
            run_dir = run_dir_of(out, env, mode, seed, runs_dir)
            added += record_timing(out, run_dir, run_config(plan, env, mode, seed, run_dir), env, mode, seed)
    return added


def train_in_worker(config: dict[str, Any]) -> str:
    """A worker's whole job: trains one run (`train_run`, no progress bar); returns how
    ("fresh" or "resumed")."""
    return train_run(config_from_dict(config), progress=False)


def run_side_by_side(out: str, plan: Plan, keys: Sequence[tuple[str, str, int]], done: set, runs_dir: str | None,
                     jobs: int, progress: bool, on_done: Callable[[str, str, int, str], None]) -> None:
    """Brings every run of `keys` (env, mode, seed) to done with up to `jobs` training at once,
    started in `keys`' order; `on_done(env, mode, seed, how)` as each is recorded (runs that need
    no training first). Raises the first failure (a worker's exception, or a RuntimeError naming
    the run whose worker died) after the runs in flight have ended and been recorded."""
    pending = []
    for env, mode, seed in keys:
        config = run_config(plan, env, mode, seed, run_dir_of(out, env, mode, seed, runs_dir))
        how = without_training(config, env, mode, seed, done)
        if how is None:
            pending.append((env, mode, seed, config))
        else:
            on_done(env, mode, seed, how if how == "skipped" else record_run(out, plan, config, env, mode, seed, done, how))
    if not pending:
        return
    failure: BaseException | None = None
    context = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=min(jobs, len(pending)), mp_context=context) as pool:
        running = {}
        for env, mode, seed, config in pending:
            running[pool.submit(train_in_worker, config_to_dict(config))] = (env, mode, seed, config)
            if progress:
                print(f"benchmark {env} {mode} seed {seed}: queued ({jobs} at once)", flush=True)
        try:
            for future in futures.as_completed(running):
                env, mode, seed, config = running[future]
                try:
                    how = future.result()
                except BrokenProcessPool:
                    failure = failure or RuntimeError(
                        f"the worker process training {env} {mode} seed {seed} died (killed, or out of memory); "
                        "finished runs are recorded: run the same command again to resume the rest")
                    continue
                except Exception as exc:  # noqa: BLE001 - re-raised below, once the runs in flight are recorded
                    if failure is None:
                        failure = exc
                        pool.shutdown(wait=False, cancel_futures=True)
                    continue
                on_done(env, mode, seed, record_run(out, plan, config, env, mode, seed, done, how))
                if progress:
                    print(f"benchmark {env} {mode} seed {seed}: {how}, done", flush=True)
        except KeyboardInterrupt:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    if failure is not None:
        raise failure


def benchmark(
    suite: str = "mujoco",
    seeds: int = 5,
    out: str | os.PathLike = "runs/benchmark",
    envs: Sequence[str] | None = None,
    total_env_steps: int | None = None,
    modes: Sequence[str] | None = None,
    eval_every_steps: int | None = None,
    eval_episodes: int = 10,
    progress: bool = True,
    on_run: Callable[[str, str, int, str], None] | None = None,
    argv: Sequence[str] | None = None,
    changes: Mapping[str, Any] | None = None,
    runs_dir: str | os.PathLike | None = None,
    jobs: int = 1,
) -> pd.DataFrame:
    """Runs (or resumes) a benchmark suite into `out` and writes its report; returns results.csv
    as a DataFrame.

    Args:
      suite: a `SUITES` name ("mujoco", "dmc", "classic").
      seeds: runs per env x mode, seeds 0 .. seeds - 1.
      out: the output directory (module docstring); run again with the same arguments to resume.
      envs: a subset of the suite's envs (default: all).
      total_env_steps: env steps per run (default: the suite's budget).
      modes: among `MODES` ("sync", "barrier", "async") that every env's family can run
        (default: all those; mujoco: barrier, async).
      eval_every_steps: env steps between evaluations (default: the suite's, 100k for mujoco).
      eval_episodes: episodes per evaluation (deterministic policy).
      progress: print a line per run and show each run's progress bar.
      on_run: called as `on_run(env, mode, seed, how)` after each run is done (how: "skipped",
        "rows rebuilt", "completed", "fresh", "resumed"); an exception there stops the benchmark.
      argv: the command line recorded in manifest.json (default `sys.argv`).
      runs_dir: where the run directories go (default OUT/runs); elsewhere (e.g. a git-ignored
        folder) OUT holds only the results, report and manifest, ready to publish.
      changes: dotted config fields set over every run's preset and mode (an ablation, e.g.
        `{"rollout.normalize_reward": False}`); recorded in benchmark.json.
      jobs: runs trained at once, each in its own process (`run_side_by_side`); 1 = one
        after another in this process. Only for runs bound by simulated latency, not by the cores
        (mujoco-slow's barrier runs): a run's wall-clock is a timing only where it ran alone or
        was checked unchanged beside the others. Recorded in manifest.json.

    Raises:
      ConfigError: bad arguments (`resolve_plan`), or an out directory of other arguments/configs.
    """
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ConfigError(f"jobs = {jobs!r} is invalid: must be an integer >= 1 (runs trained at once)")
    plan = resolve_plan(suite, envs, modes, seeds, total_env_steps, eval_every_steps, eval_episodes, changes)
    require_rliable()  # before hours of runs, not at the report
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    check_spec(out, plan_spec(plan))
    with Manifest(out, argv=argv, extra={"benchmark": plan._asdict()}) as manifest:
        done = finished_keys(out)
        counts: dict[str, int] = {}

        def count(env: str, mode: str, seed: int, how: str) -> None:
            counts[how] = counts.get(how, 0) + 1
            if on_run is not None:
                on_run(env, mode, seed, how)

        keys = [(env, mode, seed) for seed in range(plan.seeds) for env in plan.envs for mode in plan.modes]
        runs_dir = None if runs_dir is None else os.fspath(runs_dir)
        if jobs > 1:
            run_side_by_side(out, plan, keys, done, runs_dir, jobs, progress, count)
        else:
            for env, mode, seed in keys:
                if progress:
                    print(f"benchmark {env} {mode} seed {seed}", flush=True)
                count(env, mode, seed, finish_run(out, plan, env, mode, seed, done, progress, runs_dir))
        manifest.extra["runs"] = counts
        manifest.extra["jobs"] = jobs
        backfill_timings(out, plan, None if runs_dir is None else os.fspath(runs_dir))
        report(out)
    return results_frame(out)

