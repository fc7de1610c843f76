"""The benchmark's files in OUT: benchmark.json (the plan, checked against a second call:
`check_spec`), results.csv (one row per evaluation, `COLUMNS`), each run's done marker and wall
log (benchmark_wall.jsonl), and the rows of a run rebuilt from its run directory. The spec
check and the log of finished runs are `ppo_async.study.store`'s, shared with tune.
Side effects: file reads and writes only.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.config import Config, config_to_dict
from ppo_async.report.metrics import read_jsonl
from ppo_async.run import rundir
from ppo_async.study import store
from ppo_async.study.benchmark.relabel import old_labels
from ppo_async.study.benchmark.suites import Plan
from ppo_async.study.manifest import write_json

RESULTS_FILE = "results.csv"
SPEC_FILE = "benchmark.json"
DONE_FILE = "benchmark_done.json"
WALL_FILE = "benchmark_wall.jsonl"
TRAIN_TAIL = 0.1  # train_return at the end: the last 10% of iterations (CleanRL's way of reporting)
COLUMNS = ("env", "mode", "seed", "checkpoint", "iteration", "env_steps", "eval_return", "train_return", "episodes",
           "wall_s", "train_wall_s", "approx_kl", "lag_mean", "final")
"""results.csv: one row per env x mode x seed x evaluation. checkpoint: the nominal env steps
(k * eval_every_steps; the budget for the final evaluation); env_steps: the steps actually taken;
eval_return: mean deterministic return over the evaluation episodes; train_return: the
episode-weighted mean training return since the previous checkpoint (the final row: over the
last 10% of iterations); episodes: training episodes behind it; wall_s: seconds since the run's
`train()` call (compile and evaluations included; a resumed run adds the wall time up to its
checkpoint); train_wall_s: the run's own `wall_time` (its iteration loop); approx_kl, lag_mean:
means since the previous checkpoint; final: 1 for the last evaluation of a run."""


def run_dir_of(out: str, env: str, mode: str, seed: int, runs_dir: str | None = None) -> str:
    """RUNS/<env, '/' as '_'>/<mode>/seed<k>, RUNS = `runs_dir` or OUT/runs."""
    return os.path.join(runs_dir or os.path.join(out, "runs"), env.replace("/", "_"), mode, f"seed{seed}")


def _grows(first: Mapping[str, Any], spec: Mapping[str, Any], name: str) -> bool:
    """Whether argument `name` of `spec` extends the recorded one: more seeds, or envs / modes
    holding every recorded one and more."""
    was, now = first.get(name), spec.get(name)
    if name == "seeds":
        return isinstance(was, int) and isinstance(now, int) and now > was
    if name in ("envs", "modes"):
        return isinstance(was, list) and isinstance(now, list) and set(was) < set(now)
    return False


NOT_IN_RESULTS = ("checkpoint_every_steps", "keep_checkpoints", "plots")
"""Config fields no result row depends on (how often a run saves, how many saves it keeps, whether it draws its PNGs): a
benchmark recorded with other values takes today's (e.g. threaded runs that resume since)."""


def _refusal(out: str, first: dict, spec: dict) -> str | None:
    """Why OUT's recorded benchmark (`first`) cannot take today's `spec`: other arguments (more
    seeds, envs or modes excepted) or other configs of its runs; None when it can."""
    if old_labels(first):
        return (f"out = {out!r} holds a benchmark recorded under the mode labels before 2026-12-05 (async-ppo is "
                "today's async, async today's async-decoupled): relabel it once with `python -m ppo_async benchmark "
                f"--out {out} --relabel-modes` (and --runs-dir where its runs are), then run again")
    grown = [k for k in ("seeds", "envs", "modes") if _grows(first, spec, k)]
    # `changes` only matter through the configs they make: where both record configs, other
    # changes giving the same configs (a field pinned at the value it had) are the same plan.
    same_by_configs = {"changes"} if "configs" in first and "configs" in spec else set()
    args = [k for k in Plan._fields if first.get(k) != spec.get(k) and k not in grown and k not in same_by_configs]
    if args:
        said = ", ".join(f"{k}={first.get(k)!r} (now {spec.get(k)!r})" for k in args)
        return (f"out = {out!r} holds a benchmark with other arguments: {said}; use another out, the same "
                "arguments, or more seeds / envs / modes")
    # both sides in today's spelling (`store.as_today`): a config recorded with `eval_every: 49`
    # (learner iterations) is one with `eval_every_steps: 49 * batch_size`
    recorded = {key: store.as_today(config) for key, config in first.get("configs", {}).items()}
    default = config_to_dict(Config())
    fields = store.changed_paths(recorded, {k: store.as_today(v) for k, v in spec.get("configs", {}).items() if k in recorded},
                                 defaults={k: default for k in recorded})
    fields = [f for f in fields if f.rpartition(".")[2] not in NOT_IN_RESULTS]
    if fields:
        return (f"out = {out!r} holds a benchmark whose configs differ from today's (presets changed?): "
                f"{', '.join(fields[:5])}; use another out")
    return None


def check_spec(out: str, spec: Mapping[str, Any]) -> None:
    """Writes OUT/benchmark.json, or checks the one there (`store.check_spec`): other arguments
    or configs on the same OUT are a ConfigError naming what differs (results are never
    silently mixed). More seeds, or envs / modes added to the recorded ones, extend the
    benchmark: its finished runs are kept when the configs they were run with are today's, and
    benchmark.json is rewritten."""
    grows = lambda first, now: any(_grows(first, now, k) for k in ("seeds", "envs", "modes"))  # noqa: E731
    store.check_spec(os.path.join(out, SPEC_FILE), spec, lambda first, now: _refusal(out, first, now), write_json,
                     rewrite=grows)


# ---------------------------------------------------------------------------- results rows


def as_number(value: Any) -> float:
    """float(value), NaN for None / non-numbers."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def episode_weighted(rows: Sequence[Mapping[str, Any]]) -> tuple[float, int]:
    """(mean training-episode return, episodes) of metrics rows: each row's `episode_return`
    weighted by its `episodes_finished` (rows with none left out); (NaN, 0) without episodes."""
    weights = np.array([as_number(r.get("episodes_finished")) for r in rows])
    values = np.array([as_number(r.get("episode_return")) for r in rows])
    keep = np.isfinite(weights) & np.isfinite(values) & (weights > 0)
    if not keep.any():
        return math.nan, 0
    return float(np.average(values[keep], weights=weights[keep])), int(weights[keep].sum())


def _window_mean(rows: Sequence[Mapping[str, Any]], name: str) -> float:
    values = np.array([as_number(r.get(name)) for r in rows])
    return float(np.mean(values[np.isfinite(values)])) if np.isfinite(values).any() else math.nan


def checkpoint_of(iteration: int, every: int, num_iterations: int, eval_every_steps: int, total: int) -> int:
    """The nominal env steps of the evaluation after `iteration`: k * eval_every_steps for the
    k-th periodic one, the budget `total` for the final one."""
    return total if iteration == num_iterations else (iteration // every) * eval_every_steps


def results_rows(metrics: Sequence[Mapping[str, Any]], walls: Mapping[int, float], config: Config,
                 eval_every_steps: int, env: str, mode: str) -> list[dict[str, Any]]:
    """The results.csv rows (`COLUMNS`) of one run from its metrics rows (iteration order, one
    seed) and its wall seconds per iteration: one row per row carrying an `eval_return`."""
    out: list[dict[str, Any]] = []
    n, previous = config.num_iterations, 0
    tail_start = n - max(1, int(n * TRAIN_TAIL))
    for index, row in enumerate(metrics):
        if row.get("eval_return") is None:
            continue
        iteration = int(row["iteration"])
        window = [r for r in metrics[: index + 1] if int(r["iteration"]) > previous]
        if iteration == n:
            train_return, episodes = episode_weighted([r for r in metrics if int(r["iteration"]) > tail_start])
        else:
            train_return, episodes = episode_weighted(window)
        out.append({
            "env": env, "mode": mode, "seed": config.seed,
            "checkpoint": checkpoint_of(iteration, config.eval_every_iterations, n, eval_every_steps, config.total_env_steps),
            "iteration": iteration, "env_steps": int(row["env_steps"]), "eval_return": as_number(row["eval_return"]),
            "train_return": train_return, "episodes": episodes, "wall_s": walls.get(iteration, math.nan),
            "train_wall_s": as_number(row.get("wall_time")), "approx_kl": _window_mean(window, "approx_kl"),
            "lag_mean": _window_mean(window, "lag_mean"), "final": int(iteration == n),
        })
        previous = iteration
    return out


def read_walls(run_dir: str) -> dict[int, float]:
    """{iteration: wall seconds} from RUN_DIR/benchmark_wall.jsonl (empty when missing)."""
    path = os.path.join(run_dir, WALL_FILE)
    return {int(r["iteration"]): float(r["wall_s"]) for r in read_jsonl(path)} if os.path.isfile(path) else {}


def rows_of_run(run_dir: str, config: Config, eval_every_steps: int, env: str, mode: str) -> list[dict[str, Any]]:
    """`results_rows` of a run directory (its metrics.jsonl and benchmark_wall.jsonl)."""
    metrics = read_jsonl(os.path.join(run_dir, rundir.METRICS_FILE),
                         columns=("iteration", "env_steps", "eval_return", "episode_return", "episodes_finished",
                                  "wall_time", "approx_kl", "lag_mean"))
    return results_rows(metrics, read_walls(run_dir), config, eval_every_steps, env, mode)


def results_log(out: str) -> store.RowLog:
    """OUT/results.csv as the benchmark's log of finished runs (`COLUMNS`)."""
    return store.RowLog(os.path.join(out, RESULTS_FILE), COLUMNS)


def read_results(out: str) -> list[dict[str, str]]:
    """The rows of OUT/results.csv as strings (a torn last line is dropped); [] when missing."""
    return [r for r in results_log(out).read() if all(r.get(c) not in (None, "") for c in ("env", "mode", "seed", "final"))]


def write_results(out: str, rows: Sequence[Mapping[str, Any]], append: bool = True) -> None:
    """Appends `rows` to OUT/results.csv (header first when new), in one write, flushed."""
    results_log(out).append(rows, fresh=not append)


def _key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    return str(row["env"]), str(row["mode"]), int(row["seed"])


def finished_keys(out: str) -> set[tuple[str, str, int]]:
    """Runs with their final row in results.csv (`store.finished`); rows of runs without one (a
    write cut short) are removed from the file."""
    return set(store.finished(results_log(out), _key, lambda r: r["final"] == "1", read_results(out)))


class WallLog:
    """`train(on_iteration=...)`: appends {iteration, wall_s} per learner iteration to
    RUN_DIR/benchmark_wall.jsonl, wall_s counted from `start` (`time.perf_counter()` before
    `train()`) plus, for a resumed run, the wall_s recorded at its checkpoint (entries after the
    checkpoint are dropped at the first call)."""

    def __init__(self, run_dir: str, start: float) -> None:
        self.path, self.start = os.path.join(run_dir, WALL_FILE), start
        self.offset = 0.0
        self.handle: Any = None

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        iteration = int(rows[0]["iteration"])
        if self.handle is None:
            earlier = {i: w for i, w in read_walls(os.path.dirname(self.path)).items() if i < iteration}
            self.offset = earlier[max(earlier)] if earlier else 0.0
            with open(self.path, "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"iteration": i, "wall_s": w}) + "\n" for i, w in sorted(earlier.items()))
            self.handle = open(self.path, "a", encoding="utf-8")
        wall = round(self.offset + time.perf_counter() - self.start, 3)
        self.handle.write(json.dumps({"iteration": iteration, "wall_s": wall}) + "\n")
        self.handle.flush()

    def close(self) -> None:
        """Closes the file (idempotent)."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def results_frame(out: str) -> pd.DataFrame:
    """OUT/results.csv as a DataFrame (numbers parsed); empty with `COLUMNS` when missing."""
    path = os.path.join(out, RESULTS_FILE)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.read_csv(path)

