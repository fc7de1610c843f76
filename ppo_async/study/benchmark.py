"""The benchmark: suites of envs x modes x seeds, evaluated at fixed env-step checkpoints, with a
report against published reference figures (`pa.benchmark`, `python -m ppo_async benchmark`).

    pa.benchmark("mujoco", seeds=5, out="runs/bench")      # 4 envs x (barrier, async) x 5 seeds at 1M
    pa.benchmark("classic", seeds=2, out="runs/b", envs=["CartPole-v1"], total_env_steps=20_000)
    report("runs/bench")                                     # report.md + plots again, from results.csv

Every run's config is `config_for_env(env)` (the preset `train --env` uses) plus the mode's fields
(`MODES`, data in `MODE_DEFS`: each mode is its parent plus the fields it changes) and the suite's
fields for that mode (`Suite.mode_fields`), the samplers of a threaded mode sharing the preset's
envs (`share_envs`), the seed, the budget, the evaluation cadence and its run directory - nothing else. A
run evaluates the learner's deterministic policy every `eval_every_steps` env steps (converted
to whole learner iterations: `Config.eval_every`) and after its last iteration, over
`eval_episodes` episodes, and appends one row per evaluation to OUT/results.csv (`COLUMNS`).

OUT holds: benchmark.json (the arguments and each env x mode's config: a second call with other
ones is refused, one with more seeds, envs or modes extends it), results.csv, manifest.json (`study.manifest`), report.md and the plots, and
runs/<env with / as _>/<mode>/seed<k>/, each a normal run directory plus benchmark_wall.jsonl
(wall seconds per iteration) and, once its rows are in results.csv, benchmark_done.json.

Resume: run again with the same arguments, a killed benchmark skips every finished run (its done
marker, or its final row in results.csv; rows lost from results.csv are rebuilt from the run
directory, not re-run), finishes a run that had trained to its end, resumes an unfinished run
of a resumable mode (sync) from its latest checkpoint (checkpoints are written at every
evaluation) and restarts the others cleanly (threaded runs cannot resume: their lag depends on
timing).

Report: per env, mode and checkpoint the mean deterministic return over seeds, its 95%
percentile-bootstrap CI and the worst seed; learning curves with the reference figures
(references.json, next to this module) as marks at their budget; return vs wall-clock for
barrier vs async, with async's final return against barrier's CI and its wall-clock to reach
barrier's final return (`reach_ratio`); and across envs the IQM and the probability of improvement of async over
barrier (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice", computed with
`rliable.metrics`) with stratified-bootstrap 95% CIs, on scores normalised per env by its
reference: 1 + (score - ref) / |ref|.
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np
import pandas as pd

from ppo_async.config import Config, ConfigError, config_to_dict, get_path, replace_paths
from ppo_async.config.presets import config_for_env
from ppo_async.envs.registry import HOST_ENV_FAMILIES, split_env_name
from ppo_async.modes.registry import get_mode
from ppo_async.modes.train import train
from ppo_async.report.metrics import read_jsonl
from ppo_async.run import rundir
from ppo_async.run.checkpoint import Checkpointer
from ppo_async.study.manifest import Manifest, write_json


class Suite(NamedTuple):
    """A benchmark suite: its envs, budget (env steps per run) and evaluation cadence, and the
    dotted fields it sets over a mode's own (`mode_fields`: mode name -> fields, e.g. the
    samplers and their simulated latency of a slow-simulator suite)."""

    envs: tuple[str, ...]
    total_env_steps: int
    eval_every_steps: int
    note: str
    mode_fields: Mapping[str, Mapping[str, Any]] = {}


MUJOCO_ENVS = ("gymnasium/HalfCheetah-v5", "gymnasium/Hopper-v5", "gymnasium/Walker2d-v5", "gymnasium/Ant-v5")

SLOW_SAMPLERS = 8
SLOW_STEP_MS = 5.0
SLOW_STRAGGLER = 4.0
SLOW_SIMULATORS = {"threaded.num_samplers": SLOW_SAMPLERS,
                   "threaded.sampler_step_latency_ms": [SLOW_STEP_MS] * (SLOW_SAMPLERS - 1) + [SLOW_STEP_MS * SLOW_STRAGGLER]}
"""The article's regime (its section 4.1: 8 CPU samplers, ~5 ms per env step, a simulator slower
than the learner; section 1.2: heterogeneous workers): 8 samplers, each vector step +5 ms, the
last sampler 4x slower (+20 ms)."""

SUITES: dict[str, Suite] = {
    "mujoco": Suite(MUJOCO_ENVS, 1_000_000, 100_000,
                    "Gymnasium MuJoCo at CleanRL's budget (host-side envs: threaded modes only)"),
    "mujoco-slow": Suite(
        MUJOCO_ENVS, 1_000_000, 100_000,
        f"the mujoco suite in the article's slow-simulator regime: {SLOW_SAMPLERS} samplers share the preset's envs, "
        f"each env step +{SLOW_STEP_MS:g} ms, one sampler {SLOW_STRAGGLER:g}x slower; barrier waits for all "
        f"{SLOW_SAMPLERS} every batch, async takes a batch of {SLOW_SAMPLERS} chunks from whoever delivers",
        mode_fields={"barrier": SLOW_SIMULATORS,
                     "async-ppo": {**SLOW_SIMULATORS, "threaded.chunks_per_batch": SLOW_SAMPLERS},
                     "async": {**SLOW_SIMULATORS, "threaded.chunks_per_batch": SLOW_SAMPLERS}},
    ),
    "dmc": Suite(("playground/CartpoleBalance", "playground/CartpoleSwingup", "playground/CheetahRun"),
                 1_000_000, 100_000, "DM Control tasks on MuJoCo Playground (JAX physics); CartpoleBalance and "
                 "CheetahRun are measured to learn on a 2-core CPU (README), CartpoleSwingup is the same model"),
    "classic": Suite(("Pendulum-v1", "CartPole-v1", "Acrobot-v1"), 300_000, 30_000,
                     "gymnax classic control: small budgets, every mode"),
}
"""The suites (data): name -> envs, env steps per run, default evaluation cadence, per-mode fields."""


class BenchmarkMode(NamedTuple):
    """A benchmark mode as data: its parent mode (None for a root) and the dotted config fields
    it changes over the parent's, with why. A mode's fields are its parent's updated by its own
    (`mode_fields`), so each mode differs from its parent by what `changes` names."""

    parent: str | None
    changes: Mapping[str, Any]
    why: str


MODE_DEFS: dict[str, BenchmarkMode] = {
    "sync": BenchmarkMode(None, {"mode": "sync"}, "one jitted program, strictly on-policy (JAX envs only)"),
    "barrier": BenchmarkMode(None, {"mode": "threaded", "threaded.barrier": True, "threaded.num_samplers": 1},
                             "threaded, lag 0: the learner waits for every sampler's chunk of each batch"),
    # Four samplers share the preset's envs (each steps num_envs / 4) and a learner batch takes one
    # chunk from each, so a batch holds barrier's env steps at a lag of ~1 version instead of ~4.
    # The same samplers behind a barrier learn as barrier does (ablation async+lag_0, Hopper 2,811
    # against 2,503): what this mode changes is the lag.
    "async-ppo": BenchmarkMode("barrier", {"threaded.barrier": False, "threaded.num_samplers": 4,
                                           "threaded.chunks_per_batch": 4},
                               "barrier's samplers without the barrier: lag ~1, PPO's clip around the behaviour policy"),
    # Decoupled PPO (Hilton et al. 2021) clips against the learner's own recent policy, not the
    # stale behaviour one.
    "async": BenchmarkMode("async-ppo", {"ppo.objective": "decoupled"},
                           "async-ppo with the decoupled objective (the clip around the proximal policy); the "
                           "default async mode: the label of every committed async run (benchmark, ablation)"),
}
"""The benchmark modes (data): name -> parent and the fields it changes. `async` keeps the meaning
every committed result gives it (decoupled PPO at lag ~1); `async-ppo` is the same samplers with
PPO's own clip, so the two async modes separate the cost of lag from its correction."""


def mode_fields(name: str) -> dict[str, Any]:
    """The dotted config fields of benchmark mode `name`: its parent's, updated by its own."""
    mode = MODE_DEFS[name]
    return {**(mode_fields(mode.parent) if mode.parent else {}), **mode.changes}


MODES: dict[str, dict[str, Any]] = {name: mode_fields(name) for name in MODE_DEFS}
"""The benchmark modes' fields over the env's preset (`mode_fields` of each `MODE_DEFS` entry)."""

ASYNC_MODES = tuple(name for name, fields in MODES.items() if fields.get("threaded.barrier") is False)
"""The modes compared with barrier in the report (threaded, no barrier)."""

JAX_ONLY_MODES = ("sync",)  # one jitted program: the env must step inside jit (not gymnasium/*)
RESULTS_FILE = "results.csv"
SPEC_FILE = "benchmark.json"
DONE_FILE = "benchmark_done.json"
WALL_FILE = "benchmark_wall.jsonl"
REPORT_FILE = "report.md"
REFERENCES_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "references.json")
TRAIN_TAIL = 0.1  # train_return at the end: the last 10% of iterations (CleanRL's way of reporting)
BOOTSTRAP_REPS = 2000
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


class Plan(NamedTuple):
    """The resolved arguments of a benchmark call (what benchmark.json records)."""

    suite: str
    envs: tuple[str, ...]
    modes: tuple[str, ...]
    seeds: int
    total_env_steps: int
    eval_every_steps: int
    eval_episodes: int
    changes: tuple[tuple[str, Any], ...] = ()  # dotted config fields set over every run's preset (an ablation)


# ---------------------------------------------------------------------------- plan


def modes_for_env(env: str) -> tuple[str, ...]:
    """The benchmark modes `env`'s family can run: every mode for JAX envs (gymnax, brax/*,
    playground/*), the threaded ones for host-side envs (gymnasium/*)."""
    host = split_env_name(env)[0] in HOST_ENV_FAMILIES
    return tuple(m for m in MODES if not (host and m in JAX_ONLY_MODES))


def _check_count(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{name} = {value!r} is invalid: must be an integer >= {low}")
    return value


def _pick_envs(suite: str, envs: Sequence[str] | None) -> tuple[str, ...]:
    if envs is None:
        return SUITES[suite].envs
    envs = tuple(envs)
    unknown = [e for e in envs if e not in SUITES[suite].envs]
    if unknown or not envs or len(set(envs)) != len(envs):
        what = f"{unknown[0]!r} is not in" if unknown else "must name distinct envs of"
        raise ConfigError(f"envs: {what} suite {suite!r} ({', '.join(SUITES[suite].envs)})")
    return envs


def _pick_modes(envs: Sequence[str], modes: Sequence[str] | None) -> tuple[str, ...]:
    if modes is None:
        return tuple(m for m in MODES if all(m in modes_for_env(e) for e in envs))
    modes = tuple(modes)
    for mode in modes:
        if mode not in MODES:
            raise ConfigError(f"modes: {mode!r} is not a benchmark mode ({', '.join(MODES)})")
        for env in envs:
            if mode not in modes_for_env(env):
                raise ConfigError(f"mode {mode!r} cannot run env {env!r}: {split_env_name(env)[0]} envs step on the "
                                  f"host, outside jit, so they run only in {', '.join(modes_for_env(env))}")
    if not modes or len(set(modes)) != len(modes):
        raise ConfigError(f"modes = {list(modes)} is invalid: must name distinct modes among {', '.join(MODES)}")
    return modes


def resolve_plan(suite: str, envs: Sequence[str] | None = None, modes: Sequence[str] | None = None, seeds: int = 5,
                 total_env_steps: int | None = None, eval_every_steps: int | None = None,
                 eval_episodes: int = 10, changes: Mapping[str, Any] | None = None) -> Plan:
    """The checked arguments of `benchmark` with the suite's defaults filled in; ConfigError (one
    line) for an unknown suite, env or mode, a mode outside an env family's limits, bad numbers."""
    if suite not in SUITES:
        raise ConfigError(f"suite = {suite!r} is not a benchmark suite ({', '.join(SUITES)})")
    picked = _pick_envs(suite, envs)
    total = SUITES[suite].total_env_steps if total_env_steps is None else total_env_steps
    every = SUITES[suite].eval_every_steps if eval_every_steps is None else eval_every_steps
    return Plan(suite, picked, _pick_modes(picked, modes), _check_count("seeds", seeds, 1),
                _check_count("total_env_steps", total, 1), _check_count("eval_every_steps", every, 1),
                _check_count("eval_episodes", eval_episodes, 1), _check_changes(changes))


_RUN_FIELDS = ("env", "mode", "seed", "total_env_steps", "run_dir", "num_seeds")


def _check_changes(changes: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """The dotted fields an ablation sets over the presets, sorted; ConfigError for one the
    benchmark sets itself (env, mode, seed, budget, run directory) or a field that does not exist."""
    changes = dict(changes or {})
    taken = sorted(set(changes) & set(_RUN_FIELDS))
    if taken:
        raise ConfigError(f"changes = {changes!r} is invalid: {', '.join(taken)} is set by the benchmark itself")
    for path in changes:
        get_path(Config(), path)
    return tuple(sorted(changes.items()))


def eval_iterations(eval_every_steps: int, batch_size: int) -> int:
    """Learner iterations between evaluations: `eval_every_steps / batch_size` rounded, at least 1."""
    return max(1, int(round(eval_every_steps / batch_size)))


def run_dir_of(out: str, env: str, mode: str, seed: int, runs_dir: str | None = None) -> str:
    """RUNS/<env, '/' as '_'>/<mode>/seed<k>, RUNS = `runs_dir` or OUT/runs."""
    return os.path.join(runs_dir or os.path.join(out, "runs"), env.replace("/", "_"), mode, f"seed{seed}")


def run_config(plan: Plan, env: str, mode: str, seed: int, run_dir: str | None) -> Config:
    """The config of one run: the env's preset, the mode's fields (with the suite's for that
    mode), the plan's changes, seed, budget, run_dir; the preset's envs shared among the
    samplers of a threaded mode (`share_envs`); then
    evaluation every `eval_every_steps` (whole iterations) and a checkpoint at each evaluation
    for the modes that can resume."""
    changes = {**MODES[mode], **SUITES[plan.suite].mode_fields.get(mode, {}), **dict(plan.changes), "seed": seed,
               "total_env_steps": plan.total_env_steps, "run_dir": run_dir}
    config = config_for_env(env, changes)
    if config.mode == "threaded":
        config = share_envs(config)
    every = eval_iterations(plan.eval_every_steps, config.batch_size)
    checkpoint_every = every if run_dir is not None and get_mode(config.mode).resumable else 0
    return config.replace(eval_every=every, eval_episodes=plan.eval_episodes, checkpoint_every=checkpoint_every)


def share_envs(config: Config) -> Config:
    """`config` with its `rollout.num_envs` shared among its `threaded.num_samplers` samplers
    (each steps num_envs / num_samplers envs), so that N samplers step as many envs in all as
    one sampler of the preset (1 sampler: unchanged); a ConfigError when they do not divide."""
    samplers = config.threaded.num_samplers
    if config.rollout.num_envs % samplers:
        raise ConfigError(f"rollout.num_envs = {config.rollout.num_envs} is invalid: the benchmark's threaded modes share "
                          f"the envs among its {samplers} samplers, so it must be a multiple of {samplers}")
    return replace_paths(config, {"rollout.num_envs": config.rollout.num_envs // samplers})


def plan_spec(plan: Plan) -> dict[str, Any]:
    """What benchmark.json records: the arguments and each env x mode's config (seed 0, no run_dir)."""
    configs = {f"{env} {mode}": config_to_dict(run_config(plan, env, mode, 0, None))
               for env in plan.envs for mode in plan.modes}
    return json.loads(json.dumps({**plan._asdict(), "configs": configs}))


_MISSING = object()


def _diff_paths(a: Any, b: Any, prefix: str = "", defaults: Any = _MISSING) -> list[str]:
    """Dotted paths where nested dicts `a` (recorded) and `b` (today's) differ. A key `a` lacks
    (a config field added to the code since) does not differ when `b` holds its default there
    (`defaults`: the same nesting): the recorded runs ran with that default."""
    if isinstance(a, dict) and isinstance(b, dict):
        sub = lambda k: defaults.get(k, _MISSING) if isinstance(defaults, dict) else _MISSING  # noqa: E731
        return [p for k in sorted(set(a) | set(b))
                if not (k not in a and sub(k) is not _MISSING and b.get(k) == sub(k))
                for p in _diff_paths(a.get(k), b.get(k), f"{prefix}{k}.", sub(k))]
    return [] if a == b else [prefix.rstrip(".")]


def _grows(first: Mapping[str, Any], spec: Mapping[str, Any], name: str) -> bool:
    """Whether argument `name` of `spec` extends the recorded one: more seeds, or envs / modes
    holding every recorded one and more."""
    was, now = first.get(name), spec.get(name)
    if name == "seeds":
        return isinstance(was, int) and isinstance(now, int) and now > was
    if name in ("envs", "modes"):
        return isinstance(was, list) and isinstance(now, list) and set(was) < set(now)
    return False


def check_spec(out: str, spec: Mapping[str, Any]) -> None:
    """Writes OUT/benchmark.json, or checks the one there: other arguments or configs on the same
    OUT are a ConfigError naming what differs (results are never silently mixed). More seeds, or
    envs / modes added to the recorded ones, extend the benchmark: its finished runs are kept
    when the configs they were run with are today's, and benchmark.json is rewritten."""
    path = os.path.join(out, SPEC_FILE)
    if not os.path.isfile(path):
        write_json(path, dict(spec))
        return
    with open(path, encoding="utf-8") as f:
        first = json.load(f)
    grown = [k for k in ("seeds", "envs", "modes") if _grows(first, spec, k)]
    args = [k for k in Plan._fields if first.get(k) != spec.get(k) and k not in grown]
    if args:
        said = ", ".join(f"{k}={first.get(k)!r} (now {spec.get(k)!r})" for k in args)
        raise ConfigError(f"out = {out!r} holds a benchmark with other arguments: {said}; use another out, the same "
                          "arguments, or more seeds / envs / modes")
    recorded = first.get("configs", {})
    default = config_to_dict(Config())
    fields = _diff_paths(recorded, {k: v for k, v in spec.get("configs", {}).items() if k in recorded},
                         defaults={k: default for k in recorded})
    if fields:
        raise ConfigError(f"out = {out!r} holds a benchmark whose configs differ from today's (presets changed?): "
                          f"{', '.join(fields[:5])}; use another out")
    if grown:
        write_json(path, dict(spec))


# ---------------------------------------------------------------------------- results rows


def _number(value: Any) -> float:
    """float(value), NaN for None / non-numbers."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def episode_weighted(rows: Sequence[Mapping[str, Any]]) -> tuple[float, int]:
    """(mean training-episode return, episodes) of metrics rows: each row's `episode_return`
    weighted by its `episodes_finished` (rows with none left out); (NaN, 0) without episodes."""
    weights = np.array([_number(r.get("episodes_finished")) for r in rows])
    values = np.array([_number(r.get("episode_return")) for r in rows])
    keep = np.isfinite(weights) & np.isfinite(values) & (weights > 0)
    if not keep.any():
        return math.nan, 0
    return float(np.average(values[keep], weights=weights[keep])), int(weights[keep].sum())


def _window_mean(rows: Sequence[Mapping[str, Any]], name: str) -> float:
    values = np.array([_number(r.get(name)) for r in rows])
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
            "checkpoint": checkpoint_of(iteration, config.eval_every, n, eval_every_steps, config.total_env_steps),
            "iteration": iteration, "env_steps": int(row["env_steps"]), "eval_return": _number(row["eval_return"]),
            "train_return": train_return, "episodes": episodes, "wall_s": walls.get(iteration, math.nan),
            "train_wall_s": _number(row.get("wall_time")), "approx_kl": _window_mean(window, "approx_kl"),
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


def read_results(out: str) -> list[dict[str, str]]:
    """The rows of OUT/results.csv as strings (a torn last line is dropped); [] when missing."""
    path = os.path.join(out, RESULTS_FILE)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if None not in r and all(r.get(c) not in (None, "") for c in ("env", "mode", "seed", "final"))]


def write_results(out: str, rows: Sequence[Mapping[str, Any]], append: bool = True) -> None:
    """Appends `rows` to OUT/results.csv (header first when new), in one write, flushed."""
    path = os.path.join(out, RESULTS_FILE)
    new = not append or not os.path.isfile(path) or os.path.getsize(path) == 0
    with open(path, "w" if not append else "a", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)
        f.flush()


def _key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    return str(row["env"]), str(row["mode"]), int(row["seed"])


def finished_keys(out: str) -> set[tuple[str, str, int]]:
    """Runs with their final row in results.csv; rows of runs without one (a write cut short) are
    removed from the file."""
    path = os.path.join(out, RESULTS_FILE)
    rows = read_results(out)
    done = {_key(r) for r in rows if r["final"] == "1"}
    kept = [r for r in rows if _key(r) in done]
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            lines = sum(1 for line in f if line.strip())
        if len(kept) != max(lines - 1, 0):
            write_results(out, kept, append=False)
    return done


# ---------------------------------------------------------------------------- running


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
    resume = holds_run and get_mode(config.mode).resumable and has_checkpoint(run_dir, config.keep_checkpoints)
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
    run_dir = run_dir_of(out, env, mode, seed, runs_dir)
    config = run_config(plan, env, mode, seed, run_dir)
    marker = os.path.join(run_dir, DONE_FILE)
    if (env, mode, seed) in done:
        if not os.path.isfile(marker):
            write_json(marker, {"env": env, "mode": mode, "seed": seed})
        return "skipped"
    if trained_to_end(run_dir, config):  # rows lost from results.csv, or killed before they were written
        how = "rows rebuilt" if os.path.isfile(marker) else "completed"
    else:
        how = train_run(config, progress)
    rows = rows_of_run(run_dir, config, plan.eval_every_steps, env, mode)
    if not rows or not rows[-1]["final"]:
        raise RuntimeError(f"run {run_dir!r} ended without its final evaluation row")
    write_results(out, rows)
    write_json(marker, {"env": env, "mode": mode, "seed": seed, "rows": len(rows)})
    done.add((env, mode, seed))
    return how


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

    Raises:
      ConfigError: bad arguments (`resolve_plan`), or an out directory of other arguments/configs.
    """
    plan = resolve_plan(suite, envs, modes, seeds, total_env_steps, eval_every_steps, eval_episodes, changes)
    require_rliable()  # before hours of runs, not at the report
    out = os.fspath(out)
    os.makedirs(out, exist_ok=True)
    check_spec(out, plan_spec(plan))
    with Manifest(out, argv=argv, extra={"benchmark": plan._asdict()}) as manifest:
        done = finished_keys(out)
        counts: dict[str, int] = {}
        for seed in range(plan.seeds):
            for env in plan.envs:
                for mode in plan.modes:
                    if progress:
                        print(f"benchmark {env} {mode} seed {seed}", flush=True)
                    how = finish_run(out, plan, env, mode, seed, done, progress,
                                     None if runs_dir is None else os.fspath(runs_dir))
                    counts[how] = counts.get(how, 0) + 1
                    if on_run is not None:
                        on_run(env, mode, seed, how)
        manifest.extra["runs"] = counts
        report(out)
    return results_frame(out)


# ---------------------------------------------------------------------------- statistics


def require_rliable() -> None:
    """ConfigError unless `rliable` (the report's aggregate statistics) is installed."""
    try:
        import rliable.metrics  # noqa: F401
    except ImportError:
        raise ConfigError("the benchmark report needs the rliable package: pip install rliable "
                          '(or pip install -e ".[benchmark]")') from None


def results_frame(out: str) -> pd.DataFrame:
    """OUT/results.csv as a DataFrame (numbers parsed); empty with `COLUMNS` when missing."""
    path = os.path.join(out, RESULTS_FILE)
    if not os.path.isfile(path) or os.path.getsize(path) == 0:
        return pd.DataFrame(columns=list(COLUMNS))
    return pd.read_csv(path)


def bootstrap_mean_ci(values: Sequence[float], reps: int = BOOTSTRAP_REPS, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the mean of `values` (e.g. one per seed): resample them
    with replacement `reps` times; (NaN, NaN) for fewer than 2 finite values."""
    x = np.asarray([v for v in np.asarray(values, np.float64) if np.isfinite(v)])
    if len(x) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(reps, len(x)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def checkpoint_table(df: pd.DataFrame, column: str = "eval_return") -> pd.DataFrame:
    """Per env, mode and checkpoint: seeds, mean, ci_low, ci_high (95% bootstrap over seeds),
    worst (the lowest seed), and the means of train_return, env_steps and wall_s."""
    rows = []
    for (env, mode, checkpoint), group in df.groupby(["env", "mode", "checkpoint"], sort=True):
        values = pd.to_numeric(group[column], errors="coerce").to_numpy(np.float64)
        low, high = bootstrap_mean_ci(values)
        rows.append({"env": env, "mode": mode, "checkpoint": int(checkpoint), "seeds": int(np.isfinite(values).sum()),
                     "mean": float(np.nanmean(values)) if np.isfinite(values).any() else math.nan,
                     "ci_low": low, "ci_high": high, "worst": float(np.nanmin(values)) if np.isfinite(values).any() else math.nan,
                     "train_return": float(pd.to_numeric(group["train_return"], errors="coerce").mean()),
                     "env_steps": float(group["env_steps"].mean()), "wall_s": float(group["wall_s"].mean())})
    return pd.DataFrame(rows, columns=["env", "mode", "checkpoint", "seeds", "mean", "ci_low", "ci_high", "worst",
                                       "train_return", "env_steps", "wall_s"])


def load_references(path: str = REFERENCES_PATH) -> list[dict[str, Any]]:
    """The reference figures (references.json): dicts with env, value, std, source, implementation,
    version, env_id, env_version, env_steps, seeds, url, std_of, verified, normalise."""
    with open(path, encoding="utf-8") as f:
        return list(json.load(f)["references"])


def normalising_references(references: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """{env: value} of the references marked `normalise` (one per env)."""
    return {r["env"]: float(r["value"]) for r in references if r.get("normalise")}


def normalise(score: Any, reference: float) -> Any:
    """1 + (score - reference) / |reference|: 1 at the reference, +0.1 per 10% of |reference|
    above it (score / reference for a positive reference; order-preserving for a negative one)."""
    return 1.0 + (np.asarray(score, np.float64) - reference) / abs(reference)


def score_matrices(final: pd.DataFrame, references: Mapping[str, float],
                   modes: Sequence[str]) -> tuple[list[str], dict[str, np.ndarray]]:
    """(tasks, {mode: normalised final scores [runs, tasks]}) for rliable: the envs that have a
    reference and results in every mode; runs = the seeds present for every such env and mode."""
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


def _stratified_ci(func: Callable[..., float], matrices: Sequence[np.ndarray], reps: int, seed: int) -> tuple[float, float]:
    """95% percentile CI of `func(*matrices)` by the stratified bootstrap of rliable
    (`StratifiedBootstrap`: runs resampled with replacement within each task, each matrix on its
    own), in numpy."""
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(reps):
        resampled = [np.take_along_axis(m, rng.integers(0, m.shape[0], size=m.shape), axis=0) for m in matrices]
        stats.append(func(*resampled))
    low, high = np.percentile(np.asarray(stats, np.float64), [2.5, 97.5])
    return float(low), float(high)


def interval(func: Callable[..., float], matrices: Sequence[np.ndarray], reps: int = BOOTSTRAP_REPS,
             seed: int = 0) -> tuple[tuple[float, float], str]:
    """(95% CI of `func(*matrices)`, how it was computed): `rliable.library.get_interval_estimates`
    (percentile method) when it imports, else `_stratified_ci` (the same bootstrap in numpy;
    rliable.library needs `arch`, which does not import under pandas 3)."""
    try:
        from rliable import library
    except Exception as exc:  # noqa: BLE001 - arch raises TypeError at import under pandas 3
        return _stratified_ci(func, matrices, reps, seed), f"numpy stratified bootstrap (rliable.library: {type(exc).__name__})"
    data = matrices[0] if len(matrices) == 1 else list(matrices)
    _, estimates = library.get_interval_estimates({"x": data}, lambda *m: np.array([func(*m)]), reps=reps,
                                                  random_state=np.random.RandomState(seed))
    return (float(estimates["x"][0][0]), float(estimates["x"][1][0])), "rliable.library.get_interval_estimates"


def aggregate(final: pd.DataFrame, references: Mapping[str, float], reps: int = BOOTSTRAP_REPS) -> dict[str, Any]:
    """Aggregate scores across envs of the final evaluations (Agarwal et al. 2021, via
    `rliable.metrics`): per mode the IQM of normalised scores [runs, tasks] (the mean of the
    middle 50%, `aggregate_iqm`) with its 95% CI; and for each async mode that ran beside barrier
    P(mode > barrier) (`probability_of_improvement`: per env the Mann-Whitney probability that
    its seed beats a barrier seed, averaged over envs) with its CI. Returns {"tasks", "runs",
    "iqm": {mode: (value, low, high)}, "improvement": (value, low, high) of `async` or None,
    "improvements": {mode: (value, low, high)}, "ci_method"}."""
    from rliable import metrics

    modes = [m for m in MODES if m in set(final["mode"])]
    tasks, matrices = score_matrices(final, references, modes)
    result: dict[str, Any] = {"tasks": tasks, "runs": 0, "iqm": {}, "improvement": None, "improvements": {},
                              "ci_method": ""}
    if not tasks or not len(next(iter(matrices.values()))):
        return result
    result["runs"] = int(next(iter(matrices.values())).shape[0])
    for mode, matrix in matrices.items():
        ci, result["ci_method"] = interval(metrics.aggregate_iqm, [matrix], reps)
        result["iqm"][mode] = (float(metrics.aggregate_iqm(matrix)), *ci)
    for mode in (m for m in ASYNC_MODES if m in matrices and "barrier" in matrices):
        pair = [matrices[mode], matrices["barrier"]]
        ci, _ = interval(metrics.probability_of_improvement, pair, reps)
        result["improvements"][mode] = (float(metrics.probability_of_improvement(*pair)), *ci)
    result["improvement"] = result["improvements"].get("async")
    return result


# ---------------------------------------------------------------------------- plots


def _figure(count: int, width: float = 5.0, height: float = 3.6) -> tuple[Any, list[Any]]:
    """A Figure on an Agg canvas (no pyplot state) with `count` axes in rows of at most 2."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(max(count, 1), 2)
    rows = math.ceil(max(count, 1) / cols)
    fig = Figure(figsize=(width * cols, height * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols)).reshape(-1)
    for ax in axes[count:]:
        ax.set_visible(False)
    return fig, list(axes)


def plot_learning_curves(table: pd.DataFrame, references: Sequence[Mapping[str, Any]], path: str) -> str:
    """learning_curves.png: per env, mean deterministic return vs env steps per mode with its 95%
    bootstrap CI band; each reference figure as a mark (± its std) at its env-step budget."""
    envs = sorted(table["env"].unique())
    fig, axes = _figure(len(envs))
    for ax, env in zip(axes, envs):
        for mode in [m for m in MODES if m in set(table["mode"])]:
            part = table[(table["env"] == env) & (table["mode"] == mode)].sort_values("checkpoint")
            if part.empty:
                continue
            ax.plot(part["checkpoint"], part["mean"], marker="o", ms=3, label=mode)
            ax.fill_between(part["checkpoint"], part["ci_low"], part["ci_high"], alpha=0.2)
        for i, ref in enumerate(r for r in references if r["env"] == env):
            ax.errorbar([ref["env_steps"]], [ref["value"]], yerr=[ref.get("std") or 0], fmt="*k" if i == 0 else "Dk",
                        ms=9 if i == 0 else 5, capsize=3, label=f"{ref['source']} ({ref['env_id']})")
        ax.set(title=env, xlabel="env steps", ylabel="eval return (deterministic)")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path


def plot_wall_clock(table: pd.DataFrame, path: str) -> str | None:
    """return_vs_wall_clock.png: per env, mean return vs mean wall seconds at each checkpoint for
    barrier and each async mode (the band: 95% bootstrap CI over seeds); None when none ran."""
    compared = ("barrier", *ASYNC_MODES)
    part = table[table["mode"].isin(compared)]
    if part.empty:
        return None
    envs = sorted(part["env"].unique())
    fig, axes = _figure(len(envs))
    for ax, env in zip(axes, envs):
        for mode in compared:
            curve = part[(part["env"] == env) & (part["mode"] == mode)].sort_values("checkpoint")
            if not curve.empty:
                ax.plot(curve["wall_s"], curve["mean"], marker="o", ms=3, label=mode)
                ax.fill_between(curve["wall_s"], curve["ci_low"], curve["ci_high"], alpha=0.2)
        ax.set(title=env, xlabel="wall-clock seconds since the run started", ylabel="eval return")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path


def plot_aggregate(agg: Mapping[str, Any], path: str) -> str | None:
    """aggregate.png: the IQM of normalised scores per mode with its 95% CI; None without scores."""
    if not agg["iqm"]:
        return None
    fig, (ax,) = _figure(1, 5.0, 2.8)
    names = list(agg["iqm"])
    values = np.array([agg["iqm"][m] for m in names])
    ax.errorbar(values[:, 0], range(len(names)), xerr=[values[:, 0] - values[:, 1], values[:, 2] - values[:, 0]],
                fmt="o", capsize=4)
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.set(yticks=range(len(names)), yticklabels=names, xlabel="IQM of normalised score (1 = reference)",
           title=f"{len(agg['tasks'])} envs x {agg['runs']} seeds")
    fig.savefig(path, dpi=100)
    return path


# ---------------------------------------------------------------------------- report


def _fmt(value: Any) -> str:
    """A number for the report: thousands separators above 1000, 3 significant digits below."""
    value = _number(value)
    if not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _cell(row: Mapping[str, Any]) -> str:
    """"mean [ci_low, ci_high] (worst w)" of a `checkpoint_table` row."""
    return f"{_fmt(row['mean'])} [{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}] (worst {_fmt(row['worst'])})"


def _markdown(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def final_section(table: pd.DataFrame, references: Sequence[Mapping[str, Any]]) -> list[str]:
    """report.md: the final evaluation per env x mode, with train return, wall-clock and references."""
    final = table.loc[table.groupby(["env", "mode"])["checkpoint"].idxmax()]
    final = final.assign(order=final["mode"].map(list(MODES).index)).sort_values(["env", "order"])
    rows = []
    for _, row in final.iterrows():
        refs = "; ".join(f"{r['source']}: {_fmt(r['value'])}" + (f" ± {_fmt(r['std'])}" if r.get("std") else "")
                         for r in references if r["env"] == row["env"])
        rows.append([row["env"], row["mode"], row["seeds"], _fmt(row["checkpoint"]), _cell(row), _fmt(row["train_return"]),
                     _fmt(row["wall_s"]), refs or "-"])
    return ["## Final evaluation", "",
            "eval: mean deterministic return over seeds [95% bootstrap CI] (worst seed); train: mean training-episode "
            "return over the last 10% of iterations (stochastic policy), mean over seeds; wall: mean seconds per run.", "",
            *_markdown(["env", "mode", "seeds", "env steps", "eval", "train", "wall s", "references"], rows), ""]


def checkpoints_section(table: pd.DataFrame) -> list[str]:
    """report.md: per env, each checkpoint's mean [CI] (worst seed) per mode."""
    lines = ["## Every checkpoint", ""]
    for env in sorted(table["env"].unique()):
        part = table[table["env"] == env]
        modes = [m for m in MODES if m in set(part["mode"])]
        rows = []
        for checkpoint in sorted(part["checkpoint"].unique()):
            cells = [part[(part["mode"] == m) & (part["checkpoint"] == checkpoint)] for m in modes]
            rows.append([_fmt(checkpoint)] + [_cell(c.iloc[0]) if len(c) else "-" for c in cells])
        lines += [f"### {env}", "", *_markdown(["env steps", *modes], rows), ""]
    return lines


def reach_ratio(barrier: pd.DataFrame, asynchronous: pd.DataFrame) -> float:
    """Wall-clock async needs to reach barrier's final mean return, over barrier's: the mean
    wall_s of async's first checkpoint whose mean return is at least barrier's final one, divided
    by barrier's final mean wall_s (each a `checkpoint_table` part of one env, by checkpoint);
    NaN when async never reaches it."""
    target, wall = barrier.iloc[-1]["mean"], barrier.iloc[-1]["wall_s"]
    reached = asynchronous[asynchronous["mean"] >= target]
    return float(reached.iloc[0]["wall_s"] / wall) if len(reached) and wall > 0 else math.nan


def barrier_async_section(table: pd.DataFrame) -> list[str]:
    """report.md: per env and async mode, its final return against barrier's 95% CI (the same
    env steps), and the wall-clock ratio of reaching barrier's final return (`reach_ratio`);
    then what each async mode changes over its parent (`MODE_DEFS`)."""
    rows = []
    for env in sorted(table["env"].unique()):
        part = table[table["env"] == env].sort_values("checkpoint")
        barrier = part[part["mode"] == "barrier"]
        for mode in ASYNC_MODES:
            asynchronous = part[part["mode"] == mode]
            if barrier.empty or asynchronous.empty:
                continue
            b, a = barrier.iloc[-1], asynchronous.iloc[-1]
            inside = "-" if not math.isfinite(b["ci_low"]) else ("yes" if b["ci_low"] <= a["mean"] <= b["ci_high"] else
                                                                  ("above" if a["mean"] > b["ci_high"] else "below"))
            ratio = reach_ratio(barrier, asynchronous)
            rows.append([env, mode, _cell(b), _cell(a), inside, _fmt(ratio) if math.isfinite(ratio) else "not reached"])
    if not rows:
        return []
    ran = [m for m in ASYNC_MODES if m in set(table["mode"])]
    defined = [f"`{m}` = `{MODE_DEFS[m].parent}` + {', '.join(f'{k} = {v}' for k, v in MODE_DEFS[m].changes.items())}: "
               f"{MODE_DEFS[m].why}" for m in ran]
    return ["## Barrier vs async", "",
            "Final evaluations; 'in barrier's CI': the async mode's mean against barrier's 95% bootstrap CI at the same "
            "env steps; 'wall to barrier's final': its mean wall-clock to its first checkpoint at or above barrier's "
            "final mean return, over barrier's mean wall-clock (return_vs_wall_clock.png).", "",
            *_markdown(["env", "async mode", "barrier", "async", "async in barrier's CI", "wall to barrier's final"], rows),
            "", *[f"- {line}" for line in defined], ""]


def aggregate_section(agg: Mapping[str, Any], references: Mapping[str, float]) -> list[str]:
    """report.md: IQM per mode and P(mode > barrier) for each async mode, with how they were computed."""
    import importlib.metadata

    try:
        version = importlib.metadata.version("rliable")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - rliable is a dependency
        version = "?"
    lines = ["## Aggregate across envs (rliable)", "",
             f"Scores normalised per env by its reference (references.json, `normalise`): 1 + (score - ref) / |ref| "
             f"(1 = the reference). Final evaluations of {len(agg['tasks'])} envs ({', '.join(agg['tasks']) or 'none'}) "
             f"x {agg['runs']} seeds; envs without a reference are left out "
             f"(references: {', '.join(f'{e} {_fmt(v)}' for e, v in sorted(references.items()) if e in agg['tasks'])}). "
             f"rliable {version}: `metrics.aggregate_iqm`, `metrics.probability_of_improvement`; 95% CIs: "
             f"{agg['ci_method'] or '-'}, {BOOTSTRAP_REPS} resamples.", ""]
    rows = [[m, _fmt(v[0]), f"[{_fmt(v[1])}, {_fmt(v[2])}]"] for m, v in agg["iqm"].items()]
    lines += _markdown(["mode", "IQM", "95% CI"], rows) + [""]
    for mode, (p, low, high) in agg.get("improvements", {}).items():
        lines += [f"P({mode} > barrier) = {p:.3f} [{low:.3f}, {high:.3f}]", ""]
    return lines


def report(out: str | os.PathLike, references_path: str = REFERENCES_PATH) -> str:
    """Writes OUT/report.md, learning_curves.png, return_vs_wall_clock.png and aggregate.png from
    OUT/results.csv alone (and the reference figures); returns report.md's path."""
    out = os.fspath(out)
    df = results_frame(out)
    if df.empty:
        raise ConfigError(f"{out!r} has no results ({RESULTS_FILE} is missing or empty): nothing to report")
    refs = load_references(references_path)
    table = checkpoint_table(df)
    norm = normalising_references(refs)
    agg = aggregate(df[df["final"] == 1], norm)
    plots = [plot_learning_curves(table, refs, os.path.join(out, "learning_curves.png")),
             plot_wall_clock(table, os.path.join(out, "return_vs_wall_clock.png")),
             plot_aggregate(agg, os.path.join(out, "aggregate.png"))]
    envs, modes = sorted(df["env"].unique()), [m for m in MODES if m in set(df["mode"])]
    lines = ["# Benchmark report", "",
             f"{len(envs)} envs ({', '.join(envs)}) x modes {', '.join(modes)} x {df['seed'].nunique()} seeds; "
             f"{len(df)} evaluations of the deterministic policy in {RESULTS_FILE} (`ppo_async.study.benchmark`).", "",
             *final_section(table, refs), *barrier_async_section(table), *aggregate_section(agg, norm), *checkpoints_section(table),
             "## Plots", "", *[f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots if p], "",
             "## References", "", *[f"- {r['env']}: {_fmt(r['value'])} ({r['source']}, {r['implementation']}, "
                                    f"{r['version']}, {r['env_id']}, {_fmt(r['env_steps'])} steps, {r['seeds']} seed(s), "
                                    f"± over {r['std_of']}) {r['url']}" for r in refs if r["env"] in envs], ""]
    path = os.path.join(out, REPORT_FILE)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    return path
