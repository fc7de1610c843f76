"""The benchmark's suites and modes as data, and the plan of one call: which envs, modes, seeds,
budget and cadence (`resolve_plan`), and the config of each run (`run_config`).

A run's config is `config_for_env(env)` (the preset `train --env` uses) plus the mode's fields
(`MODES`, data in `MODE_DEFS`: each mode is its parent plus the fields it changes) and the
suite's fields for that mode (`Suite.mode_fields`), the samplers of a threaded mode sharing the
preset's envs (`share_envs`), the plan's changes, the seed, the budget, the evaluation cadence
and its run directory - nothing else.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, NamedTuple, Sequence

from ppo_async.config import Config, ConfigError, cadence_iterations, config_to_dict, get_path, replace_paths
from ppo_async.config.presets import config_for_env
from ppo_async.envs.registry import HOST_ENV_FAMILIES, split_env_name
from ppo_async.modes.registry import get_mode


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
ENVPOOL_MUJOCO_ENVS = tuple("envpool/" + env.split("/", 1)[1] for env in MUJOCO_ENVS)
"""The same four tasks in EnvPool's C++ builds (bench_envs: 1.6x Gymnasium's SyncVectorEnv at one
sampler of 16 HalfCheetah envs); their reference figures are Gymnasium's (`scores.load_references`)."""

SLOW_SAMPLERS = 8
SLOW_STEP_MS = 5.0
SLOW_STRAGGLER = 4.0
SLOW_SIMULATORS = {"num_samplers": SLOW_SAMPLERS,
                   "threaded.sampler_step_latency_ms": [SLOW_STEP_MS] * (SLOW_SAMPLERS - 1) + [SLOW_STEP_MS * SLOW_STRAGGLER]}
"""The article's regime (its section 4.1: 8 CPU samplers, ~5 ms per env step, a simulator slower
than the learner; section 1.2: heterogeneous workers): 8 samplers, each vector step +5 ms, the
last sampler 4x slower (+20 ms)."""

SUITES: dict[str, Suite] = {
    "mujoco": Suite(MUJOCO_ENVS, 1_000_000, 100_000,
                    "Gymnasium MuJoCo at CleanRL's budget (host-side envs: threaded modes only)"),
    "mujoco-envpool": Suite(ENVPOOL_MUJOCO_ENVS, 1_000_000, 100_000,
                            "the mujoco suite's tasks stepped by EnvPool (C++ vector envs; the sampler's env "
                            "steps are its bottleneck on 2 cores, bench_envs)"),
    "mujoco-slow": Suite(
        MUJOCO_ENVS, 1_000_000, 100_000,
        f"the mujoco suite in the article's slow-simulator regime: {SLOW_SAMPLERS} samplers share the preset's envs, "
        f"each env step +{SLOW_STEP_MS:g} ms, one sampler {SLOW_STRAGGLER:g}x slower; barrier waits for all "
        f"{SLOW_SAMPLERS} every batch, async takes a batch of {SLOW_SAMPLERS} chunks from whoever delivers",
        mode_fields={"barrier": SLOW_SIMULATORS,
                     "async": {**SLOW_SIMULATORS, "threaded.chunks_per_batch": SLOW_SAMPLERS},
                     "async-decoupled": {**SLOW_SIMULATORS, "threaded.chunks_per_batch": SLOW_SAMPLERS}},
    ),
    "dmc": Suite(("playground/CartpoleBalance", "playground/CartpoleSwingup", "playground/CheetahRun"),
                 1_000_000, 100_000, "DM Control tasks on MuJoCo Playground (JAX physics); CartpoleBalance and "
                 "CheetahRun are measured to learn on a 2-core CPU (docs/results/learning_curves.md), "
                 "CartpoleSwingup is the same model"),
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
    "barrier": BenchmarkMode(None, {"mode": "threaded", "threaded.barrier": True, "num_samplers": 1},
                             "threaded, lag 0: the learner waits for every sampler's chunk of each batch"),
    # Barrier without the barrier, one field: the same sampler (all the preset's envs) steps the
    # next chunk while the learner trains on the last, so every batch is exactly one version old
    # (the sampler is slower than the learner) and sampling overlaps learning. (Until issue 39 it
    # also split the envs over 4 samplers taking 4-chunk batches - the ablation's `async` layout,
    # which learns as this does at lag ~1 (ablation async+lag_0: the 4 samplers behind a barrier
    # learn as barrier) but steps a 4-env sampler ~8x slower per env step than one of 16 envs on
    # 2 cores (timings.csv: 0.58 s per 512-step chunk against 0.28 s per 2,048). A suite with
    # heterogeneous samplers sets its own (`Suite.mode_fields`, mujoco-slow).
    "async": BenchmarkMode("barrier", {"threaded.barrier": False},
                           "barrier's sampler without the barrier: lag 1 from overlapping sampling with learning, "
                           "PPO's clip around the behaviour policy; the default async mode"),
    # Decoupled PPO (Hilton et al. 2021) clips against the learner's own recent policy, not the
    # stale behaviour one.
    "async-decoupled": BenchmarkMode("async", {"ppo.objective": "decoupled"},
                                     "async with the decoupled objective (the clip around the proximal policy)"),
}
"""The benchmark modes (data): name -> parent and the fields it changes. `async` against `barrier`
is the cost of lag alone, `async-decoupled` against `async` what the correction buys. (Until
2026-12-05 today's `async` was labelled `async-ppo` and `async-decoupled` was `async`:
`OLD_MODE_LABELS`, `ppo_async.study.benchmark.relabel`.)"""

DEFAULT_ASYNC_MODE = "async"
DEFAULT_ASYNC_MODE_WHY = (
    "on the mujoco suite at 1M env steps x 5 seeds PPO's own clip at lag 1 learned at least as well as the "
    "decoupled objective (IQM and probability of improvement in the mujoco benchmark's report), with no proximal "
    "policy to keep")
"""The async mode the project recommends (`ppo.objective`'s default, "ppo", without a barrier),
and why; the report prints both beside its own comparison of the async modes."""

OLD_MODE_LABELS = {"async-ppo": "async", "async": "async-decoupled"}
"""The benchmark's mode labels before 2026-12-05 -> today's (the same fields)."""
MODE_LABELS_VERSION = 2
"""benchmark.json's `mode_labels`: 2 = today's labels (absent: recorded before 2026-12-05)."""


def mode_fields(name: str) -> dict[str, Any]:
    """The dotted config fields of benchmark mode `name`: its parent's, updated by its own."""
    mode = MODE_DEFS[name]
    return {**(mode_fields(mode.parent) if mode.parent else {}), **mode.changes}


MODES: dict[str, dict[str, Any]] = {name: mode_fields(name) for name in MODE_DEFS}
"""The benchmark modes' fields over the env's preset (`mode_fields` of each `MODE_DEFS` entry)."""

ASYNC_MODES = tuple(name for name, fields in MODES.items() if fields.get("threaded.barrier") is False)
"""The modes compared with barrier in the report (threaded, no barrier)."""

JAX_ONLY_MODES = ("sync",)  # one jitted program: the env must step inside jit (not gymnasium/*)


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


def run_config(plan: Plan, env: str, mode: str, seed: int, run_dir: str | None) -> Config:
    """The config of one run: the env's preset, the mode's fields (with the suite's for that
    mode), the plan's changes, seed, budget, run_dir; the preset's envs shared among the
    samplers of a threaded mode (`share_envs`); then
    evaluation every `eval_every_steps` and a checkpoint at each evaluation for the modes that
    can resume, both in whole learner iterations (`cadence_iterations`) and recorded as such:
    `eval_every_steps = every * batch_size`."""
    changes = {**MODES[mode], **SUITES[plan.suite].mode_fields.get(mode, {}), **dict(plan.changes), "seed": seed,
               "total_env_steps": plan.total_env_steps, "run_dir": run_dir}
    config = config_for_env(env, changes)
    if config.mode == "threaded":
        config = share_envs(config)
    every = cadence_iterations(plan.eval_every_steps, config.batch_size) * config.batch_size
    checkpoint_every = every if run_dir is not None and get_mode(config.mode).can_resume else 0
    return config.replace(eval_every_steps=every, eval_episodes=plan.eval_episodes, checkpoint_every_steps=checkpoint_every)


def share_envs(config: Config) -> Config:
    """`config` with its `rollout.num_envs` shared among its samplers (`effective_num_samplers`:
    each steps num_envs / num_samplers envs), so that N samplers step as many envs in all as
    one sampler of the preset (1 sampler: unchanged); a ConfigError when they do not divide."""
    samplers = config.effective_num_samplers
    if config.rollout.num_envs % samplers:
        raise ConfigError(f"rollout.num_envs = {config.rollout.num_envs} is invalid: the benchmark's threaded modes share "
                          f"the envs among its {samplers} samplers, so it must be a multiple of {samplers}")
    return replace_paths(config, {"rollout.num_envs": config.rollout.num_envs // samplers})


def plan_spec(plan: Plan) -> dict[str, Any]:
    """What benchmark.json records: the arguments and each env x mode's config (seed 0, no run_dir)."""
    configs = {f"{env} {mode}": config_to_dict(run_config(plan, env, mode, 0, None))
               for env in plan.envs for mode in plan.modes}
    return json.loads(json.dumps({**plan._asdict(), "configs": configs, "mode_labels": MODE_LABELS_VERSION}))
