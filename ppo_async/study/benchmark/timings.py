"""Where a threaded benchmark run's time goes, and the async speedup barrier's own timings allow.

OUT/timings.csv holds one row per finished threaded run (`TIMING_COLUMNS`), read from its
metrics.jsonl when the run is done (`timing_row`), so the report needs no run directory. Per
learner iteration: `sample_s`, the busiest sampler's time to make its chunk (rollout plus any
simulated latency; a barrier iteration waits for it); `learn_s`, the learner's own work (the
update, placing the batch, fetching metrics, publishing parameters); `wait_s`, the learner's
wait for a batch. With those of barrier, the **overlap roofline** - the best wall-clock speedup
an asynchronous run of the same samplers and learner can reach, when sampling and learning
overlap perfectly on cores they do not share - is

    (T_sample + T_learn) / max(T_sample, T_learn)

(a sampler-bound run: at most 1 + T_learn / T_sample). On 2 cores the samplers and the learner
also share the cores, so the measured speedup can fall short of it.
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

TIMINGS_FILE = "timings.csv"
TIMING_COLUMNS = ("env", "mode", "seed", "iterations", "sample_s", "learn_s", "wait_s", "wall_s", "approx_kl",
                  "lag_mean", "lag_histogram", "kl_staleness", "kl_update", "entropy_end")
"""timings.csv: per threaded run, means per learner iteration (seconds) of the busiest sampler's
chunk time (`sample_s`), the learner's work (`learn_s`) and wait for data (`wait_s`); the run's
wall seconds (its iteration loop); the mean approx KL to the behaviour policy and lag; the
summed lag histogram (JSON list: samples at lag 0, 1, ...); the means of approx KL's two parts
(`ppo_async.core.learner.diagnostics.kl_parts`): `kl_staleness`, KL(behaviour || the learner's
policy when the iteration began), and `kl_update`, KL(that policy || the policy of each SGD step);
`entropy_end`, the policy's mean entropy over the last 10% of iterations (how far the
exploration noise has collapsed). NaN in a file written before a column was recorded, until
`backfill_timings` rewrites the row."""
LEARNER_WORK = ("learner_update_s", "learner_place_s", "learner_fetch_s", "learner_publish_s", "learner_handover_s")


def _mean(rows: Sequence[Mapping[str, Any]], name: str) -> float:
    values = [float(r[name]) for r in rows if isinstance(r.get(name), (int, float)) and math.isfinite(float(r[name]))]
    return float(np.mean(values)) if values else math.nan


def _per_iteration(rows: Sequence[Mapping[str, Any]], names: Sequence[str], iterations: int) -> float:
    """Seconds per learner iteration of fields a metrics row sums over the iterations it covers
    (`report.aggregate.FIELD_RULES`: the learner's timings), whatever `log_every`."""
    total = sum(float(r.get(k) or 0.0) for r in rows for k in names)
    return total / iterations if iterations > 0 else math.nan


def sampler_chunk_s(last_row: Mapping[str, Any], chunks_per_sampler: float) -> float:
    """The busiest sampler's seconds per chunk: its cumulative rollout plus simulated latency
    seconds (`sampler_rollout_s`, `sampler_latency_s`: one entry per sampler) over the chunks
    each sampler made (`chunks_per_sampler`); NaN without those columns."""
    rollout, latency = last_row.get("sampler_rollout_s"), last_row.get("sampler_latency_s")
    if not isinstance(rollout, list) or not rollout or chunks_per_sampler <= 0:
        return math.nan
    latency = latency if isinstance(latency, list) and len(latency) == len(rollout) else [0.0] * len(rollout)
    return max(float(r) + float(l) for r, l in zip(rollout, latency)) / chunks_per_sampler


def timing_row(metrics: Sequence[Mapping[str, Any]], env: str, mode: str, seed: int,
               chunks_per_iteration: int, num_samplers: int) -> dict[str, Any] | None:
    """A `TIMING_COLUMNS` row of a threaded run from its metrics rows (one per learner
    iteration); None for a run without learner timings (sync mode). A batch of
    `chunks_per_iteration` chunks from `num_samplers` samplers means each sampler made about
    `iterations * chunks_per_iteration / num_samplers` chunks."""
    rows = [r for r in metrics if "iteration" in r]
    if not rows or "learner_update_s" not in rows[-1]:
        return None
    iterations = int(rows[-1]["iteration"])
    histogram = np.zeros(0)
    for r in rows:
        h = np.asarray(r.get("lag_histogram") or [], np.float64)
        histogram = np.pad(histogram, (0, max(0, len(h) - len(histogram)))) + np.pad(h, (0, max(0, len(histogram) - len(h))))
    return {
        "env": env, "mode": mode, "seed": seed, "iterations": iterations,
        "sample_s": sampler_chunk_s(rows[-1], iterations * chunks_per_iteration / max(num_samplers, 1)),
        "learn_s": _per_iteration(rows, LEARNER_WORK, iterations), "wait_s": _per_iteration(rows, ["learner_wait_s"], iterations),
        "wall_s": float(rows[-1].get("wall_time", math.nan)), "approx_kl": _mean(rows, "approx_kl"),
        "lag_mean": _mean(rows, "lag_mean"), "lag_histogram": json.dumps([int(x) for x in histogram]),
        "kl_staleness": _mean(rows, "kl_staleness"), "kl_update": _mean(rows, "kl_update"),
        "entropy_end": _mean(rows[len(rows) - max(1, len(rows) // 10):], "entropy"),
    }


def roofline(sample_s: float, learn_s: float) -> float:
    """(T_sample + T_learn) / max(T_sample, T_learn): the wall-clock speedup of overlapping
    sampling and learning perfectly (module docstring); NaN when either is unknown."""
    if not (math.isfinite(sample_s) and math.isfinite(learn_s)) or max(sample_s, learn_s) <= 0:
        return math.nan
    return (sample_s + learn_s) / max(sample_s, learn_s)


def read_timings(out: str) -> pd.DataFrame:
    """OUT/timings.csv as a DataFrame (empty, with the columns, when there is none)."""
    path = os.path.join(out, TIMINGS_FILE)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return pd.DataFrame(columns=list(TIMING_COLUMNS))
    return pd.read_csv(path).reindex(columns=list(TIMING_COLUMNS))  # (columns added since: NaN)


def write_timing(out: str, row: Mapping[str, Any]) -> None:
    """Appends (or replaces) the run's row in OUT/timings.csv."""
    df = read_timings(out)
    key = (df["env"] == row["env"]) & (df["mode"] == row["mode"]) & (df["seed"] == row["seed"])
    df = pd.concat([df[~key], pd.DataFrame([row], columns=list(TIMING_COLUMNS))], ignore_index=True)
    df.to_csv(os.path.join(out, TIMINGS_FILE), index=False, quoting=csv.QUOTE_MINIMAL)


def lag_fractions(histograms: Sequence[str], buckets: int = 4) -> list[float]:
    """The share of samples at lag 0 .. buckets - 2 and at >= buckets - 1, over runs' summed
    histograms (JSON lists); [] without samples."""
    total = np.zeros(buckets)
    for text in histograms:
        h = np.asarray(json.loads(text) if isinstance(text, str) else [], np.float64)
        total[:min(len(h), buckets - 1)] += h[:buckets - 1]
        total[buckets - 1] += h[buckets - 1:].sum()
    return (total / total.sum()).tolist() if total.sum() > 0 else []


def speedups(timings: pd.DataFrame, async_modes: Sequence[str]) -> list[dict[str, Any]]:
    """Per env: barrier's median sample_s / learn_s / wait_s over seeds, its roofline, and per
    async mode the median wall-clock speedup over barrier (barrier's median wall / the mode's)
    and that speedup's share of the roofline."""
    out = []
    for env in sorted(timings["env"].unique()):
        part = timings[timings["env"] == env]
        barrier = part[part["mode"] == "barrier"]
        if barrier.empty:
            continue
        med = {k: float(barrier[k].median()) for k in ("sample_s", "learn_s", "wait_s", "wall_s")}
        limit = roofline(med["sample_s"], med["learn_s"])
        for mode in async_modes:
            other = part[part["mode"] == mode]
            speedup = med["wall_s"] / float(other["wall_s"].median()) if len(other) else math.nan
            out.append({"env": env, "mode": mode, **med, "roofline": limit, "speedup": speedup,
                        "share": speedup / limit if math.isfinite(speedup) and limit > 0 else math.nan})
    return out
