"""The benchmark's numbers from results.csv: per env, mode and checkpoint the mean over seeds with
its bootstrap interval (`checkpoint_table`); the reference figures and the normalised scores
(`load_references`, `normalise`, `score_matrices`); across envs the aggregate metrics of
Agarwal et al. 2021 (`aggregate`: IQM and probability of improvement with stratified-bootstrap
intervals). Every statistic comes from `ppo_async.report.stats`.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report import stats
from ppo_async.study.benchmark.suites import ASYNC_MODES, MODE_DEFS, MODES

REFERENCES_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "references.json")
"""The published reference figures (ppo_async/study/references.json)."""
BOOTSTRAP_REPS = stats.BOOTSTRAP_REPS
CI_SEED = 0  # the seed of every bootstrap interval of the report (the same results give the same report)


def checkpoint_table(df: pd.DataFrame, column: str = "eval_return") -> pd.DataFrame:
    """Per env, mode and checkpoint: seeds, mean, ci_low, ci_high (the 95% percentile-bootstrap
    interval of the mean over seeds, `stats.bootstrap_mean_ci`), worst (the lowest seed), and the
    means of train_return, env_steps and wall_s."""
    rows = []
    for (env, mode, checkpoint), group in df.groupby(["env", "mode", "checkpoint"], sort=True):
        values = pd.to_numeric(group[column], errors="coerce").to_numpy(np.float64)
        low, high = stats.bootstrap_mean_ci(values, BOOTSTRAP_REPS, CI_SEED)
        rows.append({"env": env, "mode": mode, "checkpoint": int(checkpoint), "seeds": int(np.isfinite(values).sum()),
                     "mean": float(np.nanmean(values)) if np.isfinite(values).any() else math.nan,
                     "ci_low": low, "ci_high": high, "worst": float(np.nanmin(values)) if np.isfinite(values).any() else math.nan,
                     "train_return": float(pd.to_numeric(group["train_return"], errors="coerce").mean()),
                     "env_steps": float(group["env_steps"].mean()), "wall_s": float(group["wall_s"].mean())})
    return pd.DataFrame(rows, columns=["env", "mode", "checkpoint", "seeds", "mean", "ci_low", "ci_high", "worst",
                                       "train_return", "env_steps", "wall_s"])


def reach_ratio(barrier: pd.DataFrame, asynchronous: pd.DataFrame, fraction: float = 1.0) -> float:
    """Wall-clock async needs to reach barrier's final mean return, over barrier's: the mean
    wall_s of async's first checkpoint whose mean return is at least barrier's final one, divided
    by barrier's final mean wall_s (each a `checkpoint_table` part of one env, by checkpoint);
    NaN when async never reaches it. With `fraction` < 1 the line is that fraction of the way
    there: final - (1 - fraction) x |final| (0.95: 95% of a positive return; for a negative
    one, 5% of its size below it)."""
    final, wall = barrier.iloc[-1]["mean"], barrier.iloc[-1]["wall_s"]
    target = final - (1.0 - fraction) * abs(final)
    reached = asynchronous[asynchronous["mean"] >= target]
    return float(reached.iloc[0]["wall_s"] / wall) if len(reached) and wall > 0 else math.nan


def returns_at_equal_wall(barrier: pd.DataFrame, asynchronous: pd.DataFrame) -> tuple[float, float, float]:
    """`(T, barrier's return, async's return)` at equal wall-clock: T is the earlier of the two
    modes' final mean wall_s, and each mode's return is the mean return of its last checkpoint
    reached by T (mean wall_s <= T: what the run had shown by then; NaN if none). Both parts are
    `checkpoint_table` rows of one env, sorted by checkpoint. The mode that finishes first is
    compared at its end against where the other stood at that moment."""
    wall = min(float(barrier.iloc[-1]["wall_s"]), float(asynchronous.iloc[-1]["wall_s"]))

    def at(part: pd.DataFrame) -> float:
        reached = part[part["wall_s"] <= wall]
        return float(reached.iloc[-1]["mean"]) if len(reached) else math.nan

    return wall, at(barrier), at(asynchronous)


SAME_TASK_FAMILIES = {"envpool": "gymnasium"}
"""Env families that build another family's tasks (EnvPool's C++ builds of Gymnasium's MuJoCo
tasks, the same models and rewards): a `envpool/<id>` is scored against `gymnasium/<id>`'s references."""


def load_references(path: str = REFERENCES_PATH) -> list[dict[str, Any]]:
    """The reference figures (references.json): dicts with env, value, std, source, implementation,
    version, env_id, env_version, env_steps, seeds, url, std_of, verified, normalise; and for each
    `SAME_TASK_FAMILIES` family a copy of the other family's figures under its own env name
    (`same_task_as` names the one it copies)."""
    with open(path, encoding="utf-8") as f:
        references = list(json.load(f)["references"])
    copies = []
    for family, source in SAME_TASK_FAMILIES.items():
        for reference in references:
            if reference["env"].startswith(source + "/"):
                copies.append({**reference, "env": family + reference["env"][len(source):], "same_task_as": reference["env"]})
    return references + copies


def normalising_references(references: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """{env: value} of the references marked `normalise` (one per env)."""
    return {r["env"]: float(r["value"]) for r in references if r.get("normalise")}


def normalise(score: Any, reference: float) -> Any:
    """1 + (score - reference) / |reference|: 1 at the reference, +0.1 per 10% of |reference|
    above it (score / reference for a positive reference; order-preserving for a negative one)."""
    return 1.0 + (np.asarray(score, np.float64) - reference) / abs(reference)


def score_matrices(final: pd.DataFrame, references: Mapping[str, float],
                   modes: Sequence[str]) -> tuple[list[str], dict[str, np.ndarray]]:
    """(tasks, {mode: normalised final scores [runs, tasks]}) for the aggregate metrics: the envs
    that have a reference and results in every mode; runs = the seeds present for every such env
    and mode."""
    tasks = sorted(e for e in final["env"].unique() if e in references
                   and all(((final["env"] == e) & (final["mode"] == m)).any() for m in modes))
    seeds = None
    for mode in modes:
        for env in tasks:
            have = set(final.loc[(final["env"] == env) & (final["mode"] == mode), "seed"].astype(int))
            seeds = have if seeds is None else seeds & have
    seeds = sorted(seeds or ())
    matrices = {}
    for mode in modes:
        part = final[final["mode"] == mode].set_index(["env", "seed"])["eval_return"]
        matrices[mode] = np.array([[normalise(float(part[(e, s)]), references[e]) for e in tasks] for s in seeds],
                                  np.float64).reshape(len(seeds), len(tasks))
    return tasks, matrices


def estimate(statistic: Any, matrices: Sequence[np.ndarray], reps: int = BOOTSTRAP_REPS) -> tuple[float, float, float]:
    """(statistic(*matrices), 95% low, high): the point estimate and its stratified-bootstrap
    interval (`stats.stratified_bootstrap_ci`, seed `CI_SEED`)."""
    return (float(statistic(*matrices)), *stats.stratified_bootstrap_ci(statistic, matrices, reps, CI_SEED))


def aggregate(final: pd.DataFrame, references: Mapping[str, float], reps: int = BOOTSTRAP_REPS) -> dict[str, Any]:
    """Aggregate scores across envs of the final evaluations (Agarwal et al. 2021, point estimates
    by `rliable.metrics` through `stats`): per mode the IQM of normalised scores [runs, tasks] (the
    mean of the middle 50%, `stats.iqm`) with its 95% CI; and for each async mode that ran beside
    barrier P(mode > barrier) (`stats.probability_of_improvement`: per env the Mann-Whitney
    probability that its seed beats a barrier seed, averaged over envs) with its CI; every CI by
    the stratified bootstrap (`estimate`). Returns {"tasks", "runs", "iqm": {mode: (value, low,
    high)}, "improvement": (value, low, high) of `async` or None, "improvements": {mode: (value,
    low, high)}, "corrections": {mode: (parent, (value, low, high))} - P(mode > its parent) for an
    async mode whose parent is another async mode that ran (`async-decoupled` over `async`: what
    the correction buys), "ci_method"}."""
    modes = [m for m in MODES if m in set(final["mode"])]
    tasks, matrices = score_matrices(final, references, modes)
    result: dict[str, Any] = {"tasks": tasks, "runs": 0, "iqm": {}, "improvement": None, "improvements": {},
                              "corrections": {}, "ci_method": ""}
    if not tasks or not len(next(iter(matrices.values()))):
        return result
    result["runs"] = int(next(iter(matrices.values())).shape[0])
    result["ci_method"] = stats.STRATIFIED_METHOD
    for mode, matrix in matrices.items():
        result["iqm"][mode] = estimate(stats.iqm, [matrix], reps)
    for mode in (m for m in ASYNC_MODES if m in matrices and "barrier" in matrices):
        pair = [matrices[mode], matrices["barrier"]]
        result["improvements"][mode] = estimate(stats.probability_of_improvement, pair, reps)
    for mode in (m for m in ASYNC_MODES if m in matrices and MODE_DEFS[m].parent in ASYNC_MODES):
        parent = MODE_DEFS[mode].parent
        if parent in matrices:
            pair = [matrices[mode], matrices[parent]]
            result["corrections"][mode] = (parent, estimate(stats.probability_of_improvement, pair, reps))
    result["improvement"] = result["improvements"].get("async")
    return result
