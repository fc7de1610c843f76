"""Benchmark runs side by side: several runs trained at once, each in its own process, for runs
bound by simulated latency rather than by the cores (`benchmark(..., jobs=N)`, `--jobs N`).

The parent keeps the results store: it decides which runs need training (`runner.without_training`),
hands each to a worker process (spawned: a fresh interpreter and JAX of its own, the parent's
environment, XLA flags and compilation cache included) that only trains it (`runner.train_run`),
and records each run's rows as it finishes (`runner.record_run`), one writer for results.csv and
timings.csv. A run that fails stops the benchmark once the runs in flight have ended; every run
that finished is recorded, and the same command resumes the rest.
"""

from __future__ import annotations

import concurrent.futures as futures
import multiprocessing
from typing import Any, Callable, Sequence

from ppo_async.config import config_from_dict, config_to_dict
from ppo_async.study.benchmark.store import run_dir_of
from ppo_async.study.benchmark.suites import Plan, run_config


def train_in_worker(config: dict[str, Any]) -> str:
    """A worker's whole job: trains one run (`runner.train_run`, no progress bar); returns how
    ("fresh" or "resumed")."""
    from ppo_async.study.benchmark.runner import train_run

    return train_run(config_from_dict(config), progress=False)


def run_side_by_side(out: str, plan: Plan, keys: Sequence[tuple[str, str, int]], done: set, runs_dir: str | None,
                     jobs: int, progress: bool, on_done: Callable[[str, str, int, str], None]) -> None:
    """Brings every run of `keys` (env, mode, seed) to done with up to `jobs` training at once,
    started in `keys`' order; `on_done(env, mode, seed, how)` as each is recorded (runs that need
    no training first). Raises the first failure (a worker's exception, or a RuntimeError naming
    the run whose worker died) after the runs in flight have ended and been recorded."""
    from ppo_async.study.benchmark.runner import record_run, without_training

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
                except futures.process.BrokenProcessPool:
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
