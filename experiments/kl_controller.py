"""Does the online KL controller (`threaded.kl_target`) rescue a bad asynchronous setting?

Started from a bad setting, does it hold the iterations under the target and reach a return as
fast as the best fixed setting of a grid, chosen after the fact?

    python experiments/kl_controller.py                          # both tasks, 3 seeds (hours on 2 cores)
    python experiments/kl_controller.py --tasks pendulum         # one task
    python experiments/kl_controller.py --quick --out /tmp/klc   # smoke run: tiny budgets, 1 seed, the grid's corners
    python experiments/kl_controller.py --summarise-only --out DIR   # summary and figures again from DIR, no training
    python experiments/kl_controller.py --out experiments/results/kl_controller   # publish
    python experiments/kl_controller.py --tasks hopper --kl-target 0.02 --out experiments/results/kl_controller/hopper   # ~80 min alone
    python experiments/kl_controller.py --tasks pendulum --controlled-only --kl-target 0.02 --out DIR   # another target
    python experiments/kl_controller.py --tasks pendulum --controlled-only --kl-quantiles 0.5 0.65 --out DIR   # the trade-off

Per task (`TASKS`), a slow-simulator regime: each sampler sleeps `latency_ms` per env step and
the last one `slow_factor` x that (one straggler at every sampler count). Settings, each `num_seeds` threaded
runs of the task's `total_env_steps`:
  controlled        the bad start (`bad_samplers` samplers, a `bad_buffer_chunks`-chunk ring
                    buffer, refresh_lag `bad_refresh_lag`) with the KL controller on at
                    `kl_target` (two actuators: the lag knobs on kl_staleness, the learning
                    rate on kl_update; `ppo_async.core.kl_control`)
  controlled-qQ     the same at `threaded.kl_quantile` Q (`--kl-quantiles`; controlled: the
                    default 0.8): the controller asked to hold fewer iterations, for points
                    between holding the KL and the wall-clock (frontier.png)
  fixed-sN-bM       every point of the fixed grid: N samplers x an M-chunk buffer (refresh_lag 1,
                    no controller), `grid_samplers` x `grid_buffer_chunks` (3 x 3)
  fixed-sN-lagL-lrS the task's `held` settings: max_lag and the learning rate set by hand to hold the KL
Tasks: `pendulum` (Pendulum-v1: the setting of issue 42, 6 samplers, 1 ms per step, a
16,384-transition buffer at the grid's centre), `pendulum_s8` (the same env from another bad
start - 8 samplers, a 2x straggler, a 16-chunk buffer, refresh_lag 2 - for the controller at a
setting its tests do not use) and `hopper` (gymnasium/Hopper-v5, its preset
with the decoupled objective: 8 samplers, +5 ms per env step; published at target 0.02, the
Hopper barrier's own approx_kl being 0.010 at lag 0). A hopper run takes 2-4 minutes at its
600,000 env steps (1,000 is reached at 340k-650k in the runs measured at 1M; 30 runs fit one
session) and ~1.3 of 2 cores (the learner and eight samplers' policy steps): not latency-bound,
so not --jobs.

Per run: wall-clock seconds (and env steps) to the task's `threshold` return, final return
(mean episode return over the last 25% of iterations), the fraction of post-warm-up iterations
(after the first 20%) whose approx_kl is at most 1.25 x the target (and at most the target),
mean approx_kl and its parts, consumer env steps/s; for `controlled`, where the knobs and the
learning-rate scale ended. The summary gives per setting the median seconds to the return (runs
that reached it / all), and mean ± 95% CI of the rest over seeds.

OUT (default runs/experiments/kl_controller, git-ignored) holds per task TASK/runs/SETTING/seedK/
(spec.json: the config it trains and the target it is measured against, written first;
curve.csv.gz: the run's rows, `CURVE_COLUMNS` and whether the iteration measured a KL; row.json:
its measurements, written last: a run with a row.json is finished and is skipped when the script
runs again - if its spec.json is this invocation's, else the invocation is refused before it
trains anything, so rows of another setting or target are never mixed in; one without is run
again from the start, since a wall-clock to return must be one process's), OUT/runs_TASK.csv (a
row per run), OUT/summary.txt (refused where OUT's rows were measured against another target),
kl_per_iteration.png (the controlled runs' approx_kl per iteration, its parts, the target and
the level the controller aims at, target / margin), knobs_over_time.png (the controlled runs'
refresh_lag, max_lag and learning-rate scale, and the fraction of the samples a max_lag wasted),
wall_clock_grid.png (median seconds to the return over the fixed grid, the controlled runs'
beside it), frontier.png (every setting's median seconds to the return against the fraction of
iterations it holds within 1.25x the target; the summary names the settings on the front: none
other is both faster and holds more) and manifest.json (an invocation that adds runs to an OUT
keeps the manifest of the one before under "earlier"; --summarise-only under "derived_from").
"""

from __future__ import annotations

import concurrent.futures as futures
import dataclasses
import json
import math
import multiprocessing
import os
import shutil
import time
from typing import Any

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.config import config_from_dict, config_to_dict, replace_paths
from ppo_async.config.sections import DEFAULT_KL_QUANTILE
from ppo_async.report import analysis, figures, stats
from ppo_async.study import store
from ppo_async.study.manifest import Manifest, default_out, read_manifest, write_summary

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WARMUP_FRACTION = 0.2  # iterations left out of the KL fractions (the controller's warm-up and first moves)
CURVE_COLUMNS = ("iteration", "env_steps", "wall_time", "episode_return", "approx_kl", "kl_staleness", "kl_update",
                 "kl_cross", "learning_rate", "lag_mean", "controller_active_samplers", "controller_refresh_lag",
                 "controller_max_lag", "controller_lr_scale", "controller_margin", "controller_staleness_aim",
                 "controller_update_aim", "controller_action", "controller_lr_action", "controller_waste",
                 "controller_max_lag_floor", "controller_reason", "samples_produced", "dropped_forced_refresh",
                 "dropped_stale_total")


@dataclasses.dataclass(frozen=True)
class Task:
    """One environment's regime, bad start, fixed grid and budget."""

    env: str
    threshold: float  # the return whose wall-clock is measured
    total_env_steps: int
    latency_ms: float  # per env step, every sampler but the last (which takes slow_factor x)
    bad_samplers: int
    bad_buffer_chunks: int
    bad_refresh_lag: int
    grid_samplers: tuple[int, ...]
    grid_buffer_chunks: tuple[int, ...]
    slow_factor: float = 4.0
    fields: tuple[tuple[str, Any], ...] = ()  # dotted config fields of every setting, over the env's preset
    held: tuple[tuple[int, int | None, float], ...] = ()  # (samplers, max_lag, lr scale): fixed settings set by hand to hold the KL


TASKS = {
    # issue 42's setting: 6 samplers, one 4x straggler, a 16,384-transition buffer (16 chunks of 16 x 64)
    "pendulum": Task("Pendulum-v1", threshold=-400.0, total_env_steps=300_000, latency_ms=1.0, bad_samplers=6,
                     bad_buffer_chunks=64, bad_refresh_lag=4, grid_samplers=(2, 4, 6), grid_buffer_chunks=(4, 16, 64),
                     # the KL held by hand: no grid setting holds it at target 0.008 (47-57% of the iterations); a
                     # smaller learning rate or max_lag 1 do (measured: 2 samplers at 0.5x 79-84%, 6 at max_lag 1 and
                     # 0.5x 86%, 2 in barrier mode at 1x 95% in 8.2 s to -400 against 2.8 s)
                     held=((2, None, 0.5), (6, 1, 0.5), (6, 1, 1.0))),
    # issue 42 asks for settings the tests do not use: another sampler count, straggler, buffer and refresh_lag
    "pendulum_s8": Task("Pendulum-v1", threshold=-400.0, total_env_steps=300_000, latency_ms=1.0, bad_samplers=8,
                        bad_buffer_chunks=16, bad_refresh_lag=2, grid_samplers=(2, 4, 8), grid_buffer_chunks=(4, 16, 64),
                        slow_factor=2.0),
    # the slow-simulator regime: 8 samplers, +5 ms per env step, one sampler 4x slower; the
    # decoupled objective in every setting (docs/how-to/tune.md: under plain PPO's clip around
    # the behaviour policy kl_staleness measures the learner's oscillation, not the lag - 0.11 at
    # lag 1 on Hopper-v5 - and the knobs cannot move it; measured here at target 0.008, the
    # controller then held the knobs at their floor and the learning rate at 0.1-0.3x, and one
    # seed ended at 574 against 1,868 for the grid's 2-sampler setting)
    "hopper": Task("gymnasium/Hopper-v5", threshold=1000.0, total_env_steps=600_000, latency_ms=5.0, bad_samplers=8,
                   bad_buffer_chunks=64, bad_refresh_lag=4, grid_samplers=(2, 4, 8), grid_buffer_chunks=(4, 16, 64),
                   fields=(("ppo.objective", "decoupled"),), held=((4, 1, 1.0), (8, 2, 1.0))),
}


@dataclasses.dataclass(frozen=True)
class Args:
    tasks: tuple[str, ...] = ("pendulum", "hopper")
    """Tasks to run (`TASKS`)."""
    num_seeds: int = 3
    kl_target: float = 0.008
    """The controller's target (rl_games' threshold) and the KL fractions' reference."""
    out: str | None = None
    """Output folder (default runs/experiments/kl_controller, git-ignored)."""
    quick: bool = False
    """Smoke run: 1 seed, 12 learner iterations a run, 0.2 ms per env step, the grid's corners (written to runs/experiments/kl_controller/quick unless --out)."""
    summarise_only: bool = False
    """Write summary.txt and the figures again from OUT's finished runs: no training."""
    controlled_only: bool = False
    """Only the controlled runs, no fixed grid (the controller at another --kl-target, into its own --out)."""
    kl_quantiles: tuple[float, ...] = ()
    """The controller also at these threaded.kl_quantile values, in (0, 1) and not the default 0.8 (settings controlled-qQ)."""
    jobs: int = 1
    """Runs trained at once, each in its own (spawned) process; 1 = one after another in this process.
    Only for runs bound by the simulated latency, not by the cores (the hopper task): a run's
    wall-clock is a timing only where it was checked unchanged beside the others."""


def quick_task(task: Task) -> Task:
    """`task` at a smoke budget: 12 learner iterations of its batch, 0.2 ms per env step, the
    fixed grid's four corners and the first held setting."""
    batch = pa.config_for_env(task.env, {"mode": "threaded"}).batch_size
    corners = lambda values: (values[0], values[-1])  # noqa: E731
    return dataclasses.replace(task, total_env_steps=12 * batch, latency_ms=0.2, grid_samplers=corners(task.grid_samplers),
                               grid_buffer_chunks=corners(task.grid_buffer_chunks), held=task.held[:1])


def latencies(task: Task, samplers: int) -> tuple[float, ...]:
    """Per-sampler env-step latency: `latency_ms` each, the last sampler `slow_factor` x that."""
    return (task.latency_ms,) * (samplers - 1) + (task.latency_ms * task.slow_factor,)


def setting_config(task: Task, samplers: int, buffer_chunks: int, refresh_lag: int, kl_target: float | None,
                   max_lag: int | None = None, lr_scale: float = 1.0, kl_quantile: float | None = None) -> pa.Config:
    """The task's preset in threaded mode with these knobs (and the controller at `kl_target`, None = off,
    holding `kl_quantile` of the iterations, None = its default; `lag.max_lag` = `max_lag`, None = unlimited;
    the preset's learning rate x `lr_scale`)."""
    base = pa.config_for_env(task.env, {"mode": "threaded", "total_env_steps": task.total_env_steps, **dict(task.fields)})
    return replace_paths(base, {"num_samplers": samplers, "threaded.sampler_step_latency_ms": latencies(task, samplers),
                                "ppo.learning_rate": base.ppo.learning_rate * lr_scale,
                                "threaded.buffer_capacity": buffer_chunks * base.chunk_size,
                                "threaded.refresh_lag": refresh_lag, "threaded.kl_target": kl_target,
                                "threaded.kl_quantile": kl_quantile, "lag.max_lag": max_lag})


def settings(task: Task, kl_target: float, kl_quantiles: tuple[float, ...] = ()) -> dict[str, pa.Config]:
    """`controlled` (the bad start with the controller), `controlled-qQ` (the same at each
    `kl_quantiles` value), every fixed grid point and the held settings, by name."""
    if DEFAULT_KL_QUANTILE in kl_quantiles or len(set(kl_quantiles)) < len(kl_quantiles):
        raise SystemExit(f"--kl-quantiles {' '.join(f'{q:g}' for q in kl_quantiles)}: each value once, and not "
                         f"{DEFAULT_KL_QUANTILE:g} (the default quantile: the 'controlled' setting runs it)")
    configs = {controlled_name(q): setting_config(task, task.bad_samplers, task.bad_buffer_chunks, task.bad_refresh_lag,
                                                  kl_target, kl_quantile=q) for q in (None, *kl_quantiles)}
    for samplers in task.grid_samplers:
        for chunks in task.grid_buffer_chunks:
            configs[f"fixed-s{samplers}-b{chunks}"] = setting_config(task, samplers, chunks, 1, None)
    for samplers, max_lag, lr_scale in task.held:  # by hand: samplers hold back under max_lag, a smaller step
        configs[held_name(samplers, max_lag, lr_scale)] = setting_config(task, samplers, task.bad_buffer_chunks, 1, None,
                                                                         max_lag, lr_scale)
    return configs


def controlled_name(kl_quantile: float | None) -> str:
    """A controlled setting's name: 'controlled' at the default quantile (None), 'controlled-q0.5'."""
    return "controlled" if kl_quantile is None else f"controlled-q{kl_quantile:g}"


def is_controlled(setting: str) -> bool:
    """Whether `setting` runs the controller ('controlled', 'controlled-qQ')."""
    return setting == "controlled" or setting.startswith("controlled-q")


def held_name(samplers: int, max_lag: int | None, lr_scale: float) -> str:
    """A held setting's name: 'fixed-s4-lag1', 'fixed-s2-lr0.5', 'fixed-s6-lag1-lr0.5'."""
    return (f"fixed-s{samplers}" + ("" if max_lag is None else f"-lag{max_lag}")
            + ("" if lr_scale == 1.0 else f"-lr{lr_scale:g}"))


def kl_fractions(df: pd.DataFrame, target: float) -> tuple[float, float]:
    """Fractions of the post-warm-up iterations whose approx_kl is at most 1.25 x target and at
    most target (of those that measured a KL: an iteration whose samples were all stale does not count)."""
    kl = analysis.measured_kl(df)[int(len(df) * WARMUP_FRACTION):]
    kl = kl[np.isfinite(kl)]
    if not len(kl):
        return math.nan, math.nan
    return float(np.mean(kl <= 1.25 * target)), float(np.mean(kl <= target))


def measure(df: pd.DataFrame, task: Task, name: str, seed: int, config: pa.Config, target: float) -> dict[str, Any]:
    """One run's row of runs_<task>.csv from its metrics rows."""
    m = analysis.run_measurements(df, warmup_fraction=WARMUP_FRACTION)
    steps, seconds = analysis.first_reach(df, task.threshold)
    within, under = kl_fractions(df, target)
    tail = df.iloc[int(len(df) * WARMUP_FRACTION):]
    row = {"setting": name, "seed": seed, "samplers": config.num_samplers,
           "buffer_chunks": config.buffer_capacity_chunks, "max_lag": config.lag.max_lag,
           "controlled": config.threaded.kl_target is not None, "kl_target": target,
           "kl_quantile": config.threaded.effective_kl_quantile if config.threaded.kl_target is not None else None,
           "seconds_to_return": seconds, "steps_to_return": steps, "final_return": m["final_return"],
           "within_1_25_target": within, "under_target": under, "approx_kl_mean": m["approx_kl_mean"],
           "consumer_steps_per_s": m["consumer_steps_per_s"], "wall_time": float(df.wall_time.iloc[-1]),
           "wasted_fraction": wasted_fraction(df)}
    for part in ("kl_staleness", "kl_update"):
        row[f"{part}_mean"] = float(pd.to_numeric(tail[part], errors="coerce").mean()) if part in df.columns else math.nan
    if row["controlled"]:
        last = df.iloc[-1]
        row.update(final_active_samplers=int(last.controller_active_samplers), final_refresh_lag=int(last.controller_refresh_lag),
                   final_max_lag=None if pd.isna(last.controller_max_lag) else int(last.controller_max_lag),
                   final_lr_scale=float(last.controller_lr_scale), adjustments=int(last.controller_adjustments),
                   lr_adjustments=int(last.controller_lr_adjustments))
    return row


def wasted_fraction(df: pd.DataFrame) -> float:
    """The fraction of what the samplers made that a max_lag threw away over the run (forced
    refreshes and stale drops over samples produced; NaN for a run without the counters)."""
    if not {"samples_produced", "dropped_forced_refresh", "dropped_stale_total"} <= set(df.columns):
        return math.nan
    last = df.iloc[-1]
    produced = float(last.samples_produced)
    return (float(last.dropped_forced_refresh) + float(last.dropped_stale_total)) / produced if produced > 0 else math.nan


def run_dir_of(out: str, task_name: str, setting: str, seed: int) -> str:
    return os.path.join(out, task_name, "runs", setting, f"seed{seed}")


def run_spec(config: pa.Config, seed: int, target: float) -> dict[str, Any]:
    """What a run directory's spec.json records: the config it trains and the target its KL fractions are measured against."""
    return {"kl_target": target, "config": config_to_dict(config.replace(seed=seed))}


def spec_refusal(where: str, spec: dict[str, Any]) -> str | None:
    """Why the finished run in `where` is not the run `spec` asks for (the fields of its spec.json
    that differ, `store.changed_paths`: config fields added to the code since count as their
    defaults), None where it is, or where it finished before runs kept a spec."""
    recorded = store.read_spec(os.path.join(where, "spec.json"))
    if recorded is None or not os.path.isfile(os.path.join(where, "row.json")):
        return None
    recorded = {**recorded, "config": store.as_today(recorded.get("config"))}
    paths = store.changed_paths(recorded, spec, defaults={"config": config_to_dict(pa.Config())})
    return (f"{where} holds a finished run of another setting or target (spec.json: {', '.join(paths[:5])}): its row "
            "would be mixed into this one's; give another --out or delete it") if paths else None


def run_one(out: str, task_name: str, task: Task, name: str, config: pa.Config, seed: int, target: float) -> dict[str, Any]:
    """One run, or its row when it finished before (row.json, of the same config and target:
    `spec_refusal`); an unfinished one starts again."""
    where = run_dir_of(out, task_name, name, seed)
    row_path = os.path.join(where, "row.json")
    spec = run_spec(config, seed, target)
    if os.path.isfile(row_path):
        refusal = spec_refusal(where, spec)
        if refusal:
            raise SystemExit(refusal)
        with open(row_path, encoding="utf-8") as f:
            return json.load(f)
    shutil.rmtree(where, ignore_errors=True)  # an unfinished run: its wall-clock would not be one process's
    os.makedirs(where)
    with open(os.path.join(where, "spec.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=1)
    df = pa.train(config.replace(seed=seed), progress=False).to_dataframe()
    curve = df[[c for c in CURVE_COLUMNS if c in df.columns]].assign(kl_measured=np.isfinite(analysis.measured_kl(df)))
    curve.to_csv(os.path.join(where, "curve.csv.gz"), index=False)
    row = measure(df, task, name, seed, config, target)
    with open(row_path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(row, f, indent=1)
    os.replace(row_path + ".tmp", row_path)  # the run counts as finished from here
    print(f"  {task_name} {name} seed {seed}: KL <= 1.25 x target {within_text(row)}, return {row['final_return']:.1f}, "
          f"{row['seconds_to_return']:.0f} s to {task.threshold:g}", flush=True)
    return row


def within_text(row: dict[str, Any]) -> str:
    value = row["within_1_25_target"]
    return "-" if value is None or not np.isfinite(value) else f"{value:.0%}"


def finished_rows(out: str, task_name: str) -> pd.DataFrame:
    """The rows of every finished run of a task under OUT (row.json files)."""
    rows = []
    base = os.path.join(out, task_name, "runs")
    for setting in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        for seed_dir in sorted(os.listdir(os.path.join(base, setting))):
            path = os.path.join(base, setting, seed_dir, "row.json")
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as f:
                    rows.append(json.load(f))
    return pd.DataFrame(rows)


def curves_of(out: str, task_name: str, setting: str) -> list[pd.DataFrame]:
    """The per-iteration rows of a setting's finished runs, one frame per seed."""
    base = os.path.join(out, task_name, "runs", setting)
    frames = []
    for seed_dir in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        if os.path.isfile(os.path.join(base, seed_dir, "row.json")):
            frames.append(pd.read_csv(os.path.join(base, seed_dir, "curve.csv.gz")).assign(seed=seed_dir))
    return frames


# --------------------------------------------------------------------------------------
# summary
# --------------------------------------------------------------------------------------


def pm(values: pd.Series, fmt: str) -> str:
    """`mean ± 95% CI half-width` of the finite values ('-' when none)."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if not len(values):
        return "-"
    mean, half = stats.mean_ci95(values)
    return f"{mean:{fmt}} ± {half:{fmt}}" if np.isfinite(half) else f"{mean:{fmt}}"


def to_return_text(rows: pd.DataFrame) -> str:
    """Median seconds to the return over the runs that reached it, and how many did."""
    seconds = pd.to_numeric(rows.seconds_to_return, errors="coerce")
    reached = np.isfinite(seconds)
    median = f"{seconds[reached].median():.2f}" if reached.any() else "-"
    return f"{median} ({int(reached.sum())}/{len(rows)})"


HOLDS = 0.8
"""A setting holds the KL where its seeds' mean fraction of post-warm-up iterations within 1.25x
the target is at least this (issue 42's target for the controller)."""


def is_held(setting: str) -> bool:
    """Whether `setting` is one of the task's `held` settings (max_lag or the learning rate set by
    hand), not the grid."""
    return setting.startswith("fixed-") and ("-lag" in setting or "-lr" in setting)


def against_the_grid(runs: pd.DataFrame, task: Task) -> list[str]:
    """The controlled runs' median seconds to the return against the best and the median fixed
    setting's of the grid (medians over seeds; a setting whose seeds did not all reach it counts
    as never); then against the fastest fixed setting, grid or held, that holds the KL."""
    seconds = pd.to_numeric(runs.seconds_to_return, errors="coerce").fillna(math.inf)
    medians = seconds.groupby(runs.setting).median()
    lines = against_the_holders(runs, medians)
    fixed = medians.drop([n for n in medians.index if is_controlled(n) or is_held(n)])
    if "controlled" not in medians or fixed.empty or not np.isfinite(fixed.min()):
        return lines
    ours, best = medians["controlled"], fixed.min()
    if not np.isfinite(ours):
        reached = int(np.isfinite(seconds[runs.setting == "controlled"]).sum())
        return ["", f"controlled: its median seed did not reach {task.threshold:g} ({reached} of "
                    f"{int((runs.setting == 'controlled').sum())} seeds did); the best fixed setting ({fixed.idxmin()}) "
                    f"took {best:.2f} s and the median fixed setting {fixed.median():.2f} s (medians over seeds)", *lines]
    return ["", f"controlled: {ours:.2f} s to {task.threshold:g} (median over seeds) = {ours / best:.2f}x the best fixed "
                f"setting's ({fixed.idxmin()}, {best:.2f} s) and {ours / fixed.median():.2f}x the median fixed "
                f"setting's ({fixed.median():.2f} s)", *lines]


def against_the_holders(runs: pd.DataFrame, medians: pd.Series) -> list[str]:
    """The fixed settings (grid and held) that hold the KL (`HOLDS`), the fastest of them against
    the controlled runs (median seconds to the return); or, where none does, the closest."""
    if "within_1_25_target" not in runs.columns:
        return []
    within = pd.to_numeric(runs.within_1_25_target, errors="coerce").groupby(runs.setting).mean()
    fixed = within.drop([n for n in within.index if is_controlled(n)])
    if fixed.empty or "controlled" not in medians:
        return []
    holders = fixed[fixed >= HOLDS].index
    if not len(holders):
        return [f"no fixed setting holds the KL ({HOLDS:.0%} of iterations within 1.25x the target): the closest, "
                f"{fixed.idxmax()}, holds {fixed.max():.0%}"]
    said = ", ".join(f"{n} ({fixed[n]:.0%}, {medians[n]:.2f} s)" for n in sorted(holders, key=lambda n: medians[n]))
    fastest, ours = min(holders, key=lambda n: medians[n]), medians["controlled"]
    ratio = f"{ours / medians[fastest]:.2f}x the fastest of them" if np.isfinite(ours) and np.isfinite(medians[fastest]) \
        else "not comparable (a median seed that did not reach the return)"
    return [f"fixed settings that hold the KL ({HOLDS:.0%} of iterations within 1.25x the target): {said}; "
            f"controlled ({within['controlled']:.0%}) = {ratio}"]


def setting_points(runs: pd.DataFrame) -> pd.DataFrame:
    """Per setting, its median seconds to the return over seeds (inf where the median seed did not
    reach it) and its seeds' mean fraction of iterations within 1.25x the target."""
    seconds = pd.to_numeric(runs.seconds_to_return, errors="coerce").fillna(math.inf)
    within = pd.to_numeric(runs.within_1_25_target, errors="coerce")
    return pd.DataFrame({"seconds": seconds.groupby(runs.setting).median(), "within": within.groupby(runs.setting).mean()})


def pareto_front(points: pd.DataFrame) -> list[str]:
    """The settings of `points` (`setting_points`) that no other setting beats in both, fewer
    seconds to the return and more iterations within 1.25x the target (one at least as good in
    both and better in one puts a setting off the front), fastest first. A setting whose median
    seed never reached the return is on it only where it holds the most."""
    front = []
    for name, p in points.iterrows():
        beaten = (points.seconds <= p.seconds) & (points.within >= p.within) & (
            (points.seconds < p.seconds) | (points.within > p.within))
        if not beaten.any() and np.isfinite(p.within):
            front.append(name)
    return sorted(front, key=lambda n: (points.seconds[n], -points.within[n]))


def front_lines(runs: pd.DataFrame) -> list[str]:
    """The summary's line on the trade-off between holding the KL and the wall-clock: the
    settings on the front (`pareto_front`), and the fixed ones each controlled setting beats in both."""
    if "within_1_25_target" not in runs.columns or not runs.setting.map(is_controlled).any():
        return []
    points = setting_points(runs)
    said = lambda n: (f"{n} ({points.seconds[n]:.2f} s" if np.isfinite(points.seconds[n])  # noqa: E731
                      else f"{n} (median seed not reached") + f", {points.within[n]:.0%})"
    fixed = [n for n in points.index if not is_controlled(n)]
    lines = ["front (no other setting both faster to the return and holding more iterations within 1.25x the target): "
             + ", ".join(said(n) for n in pareto_front(points))]
    for name in sorted(n for n in points.index if is_controlled(n)):
        beaten = [n for n in fixed if points.seconds[name] <= points.seconds[n] and points.within[name] >= points.within[n]]
        lines.append(f"{said(name)} is both faster and holds more than {len(beaten)} of {len(fixed)} fixed settings")
    return lines


def task_heading(task_name: str, task: Task, target: float) -> str:
    """A task's heading: env, budget, regime, target, threshold and the fields every setting has."""
    return (f"## {task_name}: {task.env}, {task.total_env_steps:,} env steps, {task.latency_ms:g} ms per env step "
            f"(the last sampler {task.slow_factor:g}x), KL target {target:g}, return threshold {task.threshold:g}"
            + "".join(f", {name} = {value}" for name, value in task.fields))


def task_lines(task_name: str, task: Task, runs: pd.DataFrame, target: float) -> list[str]:
    """One task's table (a row per setting, controlled first) and where the controller ended."""
    lines = [task_heading(task_name, task, target), "",
             f"controlled starts from {task.bad_samplers} samplers, a {task.bad_buffer_chunks}-chunk buffer, refresh_lag "
             f"{task.bad_refresh_lag}; the fixed grid has refresh_lag 1", "",
             f"| setting | seconds to {task.threshold:g} (reached) | final return | KL <= 1.25 x target | KL <= target "
             "| mean KL | staleness | update | env steps/s | wasted |", "|---|---|---|---|---|---|---|---|---|---|"]
    grid = runs.drop_duplicates("setting").assign(held=lambda d: d.setting.map(is_held)).sort_values(
        ["controlled", "held", "samplers", "buffer_chunks", "setting"], ascending=[False, True, True, True, True])
    for name in grid.setting:
        rows = runs[runs.setting == name]
        lines.append(f"| {name} | {to_return_text(rows)} | {pm(rows.final_return, '.0f')} | "
                     f"{pm(rows.within_1_25_target * 100, '.0f')}% | {pm(rows.under_target * 100, '.0f')}% | "
                     f"{pm(rows.approx_kl_mean, '.4f')} | {pm(rows.kl_staleness_mean, '.4f')} | "
                     f"{pm(rows.kl_update_mean, '.4f')} | {pm(rows.consumer_steps_per_s, ',.0f')} | "
                     f"{pm(rows.get('wasted_fraction', pd.Series(dtype=float)) * 100, '.0f')}% |")
    controlled = runs[runs.setting == "controlled"]
    lines += against_the_grid(runs, task) + front_lines(runs)
    if len(controlled) and "final_active_samplers" in controlled.columns:
        lines.append("\ncontrolled, at the end (per seed): " + "; ".join(
            f"{int(r.final_active_samplers)} samplers, refresh_lag {int(r.final_refresh_lag)}, max_lag "
            f"{'none' if pd.isna(r.final_max_lag) else int(r.final_max_lag)}, lr x {r.final_lr_scale:.3g}, "
            f"{int(r.adjustments)} knob and {int(r.lr_adjustments)} lr changes" for r in controlled.itertuples()))
    return lines + [""]


# --------------------------------------------------------------------------------------
# figures
# --------------------------------------------------------------------------------------


def measured_only(df: pd.DataFrame) -> pd.DataFrame:
    """A curve with the KL columns NaN in the iterations that measured none (every sample stale:
    the update reports 0 there; `kl_measured`, from `analysis.measured_kl` when the run was saved)."""
    unmeasured = ~df.kl_measured.astype(bool)
    return df.assign(**{c: df[c].mask(unmeasured) for c in ("approx_kl", "kl_staleness", "kl_update") if c in df.columns})


def plot_kl(out: str, tasks: dict[str, Task], target: float) -> None:
    """Per task, the controlled runs' approx_kl per iteration (each seed), its parts (seed
    mean), the target, 1.25 x target and the level the controller aims at (target / margin)."""
    fig, axes = figures.grid_figure(len(tasks), width=6.0, height=3.8)
    for ax, (task_name, task) in zip(axes, tasks.items()):
        frames = [measured_only(df) for df in curves_of(out, task_name, "controlled")]
        for i, df in enumerate(frames):
            ax.plot(df.iteration, df.approx_kl, color="C0", alpha=0.5, linewidth=0.8, label="approx_kl" if i == 0 else None)
        if frames:
            mean = pd.concat(frames).groupby("iteration").mean(numeric_only=True)
            ax.plot(mean.index, mean.kl_staleness, color="C1", linewidth=1.0, label="kl_staleness (seed mean)")
            ax.plot(mean.index, mean.kl_update, color="C2", linewidth=1.0, label="kl_update (seed mean)")
            ax.plot(mean.index, target / mean.controller_margin, color="k", linestyle=":", label="target / margin (aim)")
        ax.axhline(target, color="C3", linestyle="--", linewidth=1.0, label=f"target {target:g}")
        ax.axhline(1.25 * target, color="C3", linestyle=":", linewidth=1.0, label="1.25 x target")
        ax.set(yscale="log", xlabel="learner iteration", ylabel="KL", title=f"{task_name}: controlled")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figures.save(fig, os.path.join(out, "kl_per_iteration.png"))


KNOBS = (("controller_waste", "wasted since the last knob change", "linear"), ("controller_refresh_lag", "refresh_lag", "linear"),
         ("controller_max_lag", "max_lag (gap: unlimited)", "linear"), ("controller_lr_scale", "learning-rate scale", "log"))
"""The controlled runs' knobs over time, and the fraction of the samples a max_lag wasted (the controller
pauses no sampler: the active samplers are the configured ones throughout)."""


def plot_knobs(out: str, tasks: dict[str, Task]) -> None:
    """Per task and knob, the controlled runs' value per iteration (each seed)."""
    fig, axes = figures.grid_figure(len(tasks) * len(KNOBS), width=4.5, height=3.0)
    for t, task_name in enumerate(tasks):
        frames = curves_of(out, task_name, "controlled")
        for k, (column, label, scale) in enumerate(KNOBS):
            ax = axes[t * len(KNOBS) + k]
            for df in frames:
                if column not in df.columns:  # a run from before the column existed
                    continue
                ax.step(df.iteration, pd.to_numeric(df[column], errors="coerce"), where="post", linewidth=0.9,
                        label=str(df.seed.iloc[0]))
            ax.set(yscale=scale, xlabel="learner iteration", title=f"{task_name}: {label}")
            ax.grid(alpha=0.3)
        axes[t * len(KNOBS)].legend(fontsize=7)
    figures.save(fig, os.path.join(out, "knobs_over_time.png"))


def plot_grid(out: str, tasks: dict[str, Task], runs: dict[str, pd.DataFrame]) -> None:
    """Per task, the median seconds to the return of each fixed grid point (samplers x buffer
    chunks; '-' where no seed reached it), the controlled runs' median in the title."""
    fig, axes = figures.grid_figure(len(tasks), width=5.0, height=4.0)
    for ax, (task_name, task) in zip(axes, tasks.items()):
        df = runs.get(task_name, pd.DataFrame())
        cells = np.full((len(task.grid_samplers), len(task.grid_buffer_chunks)), np.nan)
        for i, samplers in enumerate(task.grid_samplers):
            for j, chunks in enumerate(task.grid_buffer_chunks):
                rows = df[df.setting == f"fixed-s{samplers}-b{chunks}"] if len(df) else df
                seconds = pd.to_numeric(rows.seconds_to_return, errors="coerce") if len(rows) else pd.Series([], dtype=float)
                if np.isfinite(seconds).any():
                    cells[i, j] = float(seconds[np.isfinite(seconds)].median())
        ax.imshow(cells, cmap="viridis_r", aspect="auto")
        for (i, j), value in np.ndenumerate(cells):
            ax.text(j, i, "not reached" if np.isnan(value) else f"{value:.0f} s", ha="center", va="center",
                    color="0.3" if np.isnan(value) else "w")
        ax.set(xticks=range(len(task.grid_buffer_chunks)), xticklabels=task.grid_buffer_chunks, xlabel="buffer (chunks)",
               yticks=range(len(task.grid_samplers)), yticklabels=task.grid_samplers, ylabel="samplers")
        controlled = df[df.setting == "controlled"] if len(df) else df
        ax.set_title(f"{task_name}: seconds to {task.threshold:g}\ncontrolled: "
                     f"{to_return_text(controlled) if len(controlled) else '-'}", fontsize=9)
    figures.save(fig, os.path.join(out, "wall_clock_grid.png"))


def plot_front(out: str, tasks: dict[str, Task], runs: dict[str, pd.DataFrame]) -> None:
    """Per task, every setting's median seconds to the return against its seeds' mean fraction of
    iterations within 1.25x the target (`setting_points`): the grid, the held settings and the
    controlled ones, the front (`pareto_front`) joined, the 80% the controller is asked for dashed.
    Settings whose median seed never reached the return are left out (named in the title)."""
    fig, axes = figures.grid_figure(len(tasks), width=6.0, height=4.2)
    for ax, (task_name, task) in zip(axes, tasks.items()):
        df = runs.get(task_name, pd.DataFrame())
        points = setting_points(df) if len(df) and "within_1_25_target" in df.columns else pd.DataFrame(columns=["seconds", "within"])
        shown = points[np.isfinite(points.seconds.astype(float))]
        for name, p in shown.iterrows():
            kind = "controlled" if is_controlled(name) else "held" if is_held(name) else "grid"
            style = {"controlled": ("*", "C3", 140), "held": ("s", "C1", 40), "grid": ("o", "C0", 40)}[kind]
            ax.scatter(p.seconds, 100 * p.within, marker=style[0], color=style[1], s=style[2], zorder=3)
            ax.annotate(name.replace("fixed-", ""), (p.seconds, 100 * p.within), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
        front = [n for n in pareto_front(points) if n in shown.index] if len(points) else []
        if front:
            ax.plot(shown.seconds[front], 100 * shown.within[front], color="0.5", linewidth=0.8, zorder=2, label="front")
        ax.axhline(100 * HOLDS, color="C3", linestyle="--", linewidth=0.8, label=f"{HOLDS:.0%} (asked)")
        missing = sorted(set(points.index) - set(shown.index))
        ax.set(xlabel=f"seconds to {task.threshold:g} (median over seeds)",
               ylabel="% of iterations within 1.25x the target")
        ax.set_title(f"{task_name}: wall-clock against the KL held" + (f"\nnot reached: {', '.join(missing)}" if missing else ""),
                     fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    figures.save(fig, os.path.join(out, "frontier.png"))


# --------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------


def tasks_of(args: Args) -> dict[str, Task]:
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"unknown task(s) {unknown}: choose from {sorted(TASKS)}")
    return {name: quick_task(TASKS[name]) if args.quick else TASKS[name] for name in args.tasks}


def summarise(out: str, tasks: dict[str, Task], target: float, note: str) -> None:
    """runs_<task>.csv, summary.txt and the three figures from OUT's finished runs (the run
    directories under OUT/<task>/runs are git-ignored: what is published sits in OUT itself,
    beside its manifest)."""
    runs, lines = {}, [f"# KL controller against a fixed grid (target {target:g})", ""]
    for task_name, task in tasks.items():
        runs[task_name] = finished_rows(out, task_name)
        others = sorted(set(runs[task_name].get("kl_target", pd.Series(dtype=float)).dropna()) - {target})
        if others:  # (rows from before they recorded their target carry none)
            raise SystemExit(f"{out}: runs of {task_name} measured against kl_target {', '.join(f'{t:g}' for t in others)}, "
                             f"not {target:g}: summarise them with that --kl-target, or use another --out")
        if len(runs[task_name]):
            runs[task_name].to_csv(os.path.join(out, f"runs_{task_name}.csv"), index=False)
            lines += task_lines(task_name, task, runs[task_name], target)
    write_summary(out, lines + [note])
    plot_kl(out, tasks, target)
    plot_knobs(out, tasks)
    plot_grid(out, tasks, runs)
    plot_front(out, tasks, runs)


def run_in_worker(out: str, task_name: str, task: Task, name: str, config: dict[str, Any], seed: int,
                  target: float) -> dict[str, Any]:
    """`run_one` in a worker process of `--jobs` (a fresh interpreter: the compilation cache set
    up again, the config passed as plain data)."""
    from ppo_async.runtime.xla_flags import enable_compilation_cache

    enable_compilation_cache()
    return run_one(out, task_name, task, name, config_from_dict(config), seed, target)


def run(args: Args, out: str, tasks: dict[str, Task]) -> None:
    """Every task, seed and setting not finished yet (seeds outermost: machine-load drift spreads
    over the settings; with `jobs` > 1 that many at once, started in that order), then the
    summary and figures. A failed run stops the invocation once the runs in flight have ended."""
    if args.jobs < 1:
        raise SystemExit(f"--jobs {args.jobs}: must be >= 1")
    t0 = time.perf_counter()
    todo = [(task_name, task, name, config, seed) for task_name, task in tasks.items()
            for seed in range(args.num_seeds) for name, config in settings(task, args.kl_target, args.kl_quantiles).items()
            if is_controlled(name) or not args.controlled_only]
    for task_name, _, name, config, seed in todo:  # before any training: a run of another setting or target refused
        refusal = spec_refusal(run_dir_of(out, task_name, name, seed), run_spec(config, seed, args.kl_target))
        if refusal:
            raise SystemExit(refusal)
    if args.jobs == 1:
        for task_name, task, name, config, seed in todo:
            run_one(out, task_name, task, name, config, seed, args.kl_target)
    else:
        with futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            running = [pool.submit(run_in_worker, out, task_name, task, name, config_to_dict(config), seed, args.kl_target)
                       for task_name, task, name, config, seed in todo]
            failure = None
            for future in futures.as_completed(running):
                if not future.cancelled() and future.exception() is not None and failure is None:
                    failure = future.exception()
                    pool.shutdown(wait=True, cancel_futures=True)  # the runs in flight end; no new one starts
        if failure is not None:
            raise failure
    summarise(out, tasks, args.kl_target, f"({time.perf_counter() - t0:.0f} s this invocation; finished runs skipped)")
    print(f"wrote {out}")


def main(args: Args) -> None:
    if args.quick:
        args = dataclasses.replace(args, num_seeds=1, out=args.out or default_out(os.path.join("kl_controller", "quick"), REPO))
    out = args.out or default_out("kl_controller", REPO)
    tasks = tasks_of(args)
    if args.summarise_only:
        with Manifest(out, extra={"derived_from": read_manifest(out)}):
            summarise(out, tasks, args.kl_target, "(summarised from the finished runs, no training)")
        return
    from ppo_async.runtime.xla_flags import enable_compilation_cache

    enable_compilation_cache()
    earlier = read_manifest(out)  # the invocation before this one: its runs are kept, so is its provenance
    with Manifest(out, extra={} if earlier is None else {"earlier": earlier}):
        run(args, out, tasks)


if __name__ == "__main__":
    main(tyro.cli(Args))
