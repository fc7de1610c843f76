"""Programmatic sweeps over lag and PPO knobs, one compile per group of shape-compatible configs.

    df = ppo_async.study.sweep(
        config,
        grid={"lag.K": [0, 2, 8], "ppo.dual_clip": [None, 3.0], "ppo.clip_eps": [0.2, 0.1]},
        seeds=3,                 # or an explicit list of seeds
        strategy="auto",         # "vmap" | "loop" | "auto" (vmap on an accelerator, loop on CPU)
    )

Every grid key is a dotted config path; the grid is the cartesian product. Runs use the
simulated mode (one sampler, lag 0 is bit-for-bit sync PPO). Fields that do not change
array shapes — every `Hyperparams` field (learning rate, gamma, gae_lambda, clip_eps,
dual_clip incl. None, value/entropy coefficients, grad clip, reward scale, V-trace
truncations, value-update cadence, max_lag, the objective "ppo" / "decoupled", is_clip,
the prox_ewma decay) and every lag-schedule field but the number of samplers — are traced
inputs, so **one compile serves all of them**. So are the epochs and minibatches
(`ppo.num_epochs`, `ppo.num_minibatches`): a group whose configs differ in them compiles one
update that scans the most epochs x minibatches in slots of the largest minibatch and skips
the steps a config does not take (`learner.slotted_epochs`: the same permutations and the
same minibatches, padded with weight-0 samples; a group with one SGD shape keeps the plain
update). Other fields (env, network, num_envs, num_steps, num_samplers,
advantage_estimator, value clipping on/off, prox_ewma on/off, total_env_steps, ...) split
the grid into groups compiled once each. The lag ring of a group is sized for its largest lag.

`vmap` runs all configs x seeds of a group as one batched program; `loop` calls one compiled
(seed-vmapped) program once per config. Returns a tidy DataFrame: one row per
config x seed x learner iteration, with `config_id`, one column per grid key, `seed` and
every metric. `df.attrs` holds `compiles`, `traces`, `compile_seconds`, `run_seconds`,
`strategy`. `save_sweep` / `load_sweep` round-trip it (JSON lines).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ppo_async.config import Config, ConfigError, config_from_dict, config_to_dict, get_path, replace_paths
from ppo_async.config import check_config_type
from ppo_async.config.checks import canonical_path
from ppo_async.config.resources import MAX_SEEDS, check_fits_machine
from ppo_async.core.lag import make_schedule
from ppo_async.core.learner import (
    SGD_SHAPE_FIELDS,
    hyperparams_from_config,
    sgd_slots_of,
    without_traced_fields,
)
from ppo_async.modes.common import over_seeds, run_iterations
from ppo_async.modes.simulated import make_simulated_program, schedule_arrays
from ppo_async.modes.threaded import lag_buckets_of, program_key, resolve_placement, run_threaded
from ppo_async.run.recorder import RunRecorder
from ppo_async.runtime.xla_flags import program_compiler_options

STRATEGIES = ("auto", "vmap", "loop")



# Grid keys a sweep cannot honour: it picks the mode from the base config, runs one seed per
# run (`seeds=`) and writes no run directory (save the DataFrame with `save_sweep`).
UNSWEEPABLE = {
    "mode": "the mode comes from the base config (simulated for sync/simulated, threaded for threaded); run one sweep per mode",
    "num_seeds": "give seeds= to sweep() instead",
    "seed": "give seeds= (a count or an explicit list) to sweep() instead",
    "run_dir": "a sweep writes no run directory; save its DataFrame with save_sweep()",
    "overwrite": "a sweep writes no run directory",
    "checkpoint_every_steps": "a sweep writes no checkpoints",
    "checkpoint_every": "a sweep writes no checkpoints",
    "keep_checkpoints": "a sweep writes no checkpoints",
    "wandb_project": "a sweep does not log to W&B",
}
# What a sweep resets in the base config: it writes no run directory (documented, not silent).
_NO_RUN_DIR = {"run_dir": None, "checkpoint_every_steps": 0, "checkpoint_every": 0, "keep_checkpoints": 3, "overwrite": False,
               "wandb_project": None}


def sweep_mode(config: Config) -> str:
    """The mode a sweep runs its configs in: threaded for a threaded base config, else simulated
    (one emulated sampler at lag 0 is bit for bit the sync mode)."""
    return "threaded" if config.mode == "threaded" else "simulated"


def expand_grid(config: Config, grid: Mapping[str, Sequence[Any]]) -> list[tuple[dict[str, Any], Config]]:
    """The cartesian product of the grid as (grid point, validated Config) pairs, in grid order.

    Raises ConfigError for a grid key a sweep cannot honour (`UNSWEEPABLE`), an unknown key, an
    empty or non-list value list, or a grid point that is not a valid config (every field of a
    point is set at once, so the order of the keys never matters).
    """
    if not isinstance(grid, Mapping):
        raise ConfigError(f"grid must be a mapping of dotted field names to value lists, got {type(grid).__name__}")
    spellings: dict[str, list[str]] = {}  # `ppo.clip-eps` or `ppo.clip_eps`: one field
    for key in grid:
        spellings.setdefault(canonical_path(key), []).append(key)
    for path, keys in spellings.items():
        if len(keys) > 1:
            raise ConfigError(f"grid names {path!r} twice (in two spellings: {keys})")
    grid = {canonical_path(k): v for k, v in grid.items()}
    keys = list(grid)
    if not keys:
        raise ConfigError("grid is empty: give at least one dotted field name with a non-empty list of values")
    for key in keys:
        if key in UNSWEEPABLE:
            raise ConfigError(f"grid key {key!r} cannot be swept: {UNSWEEPABLE[key]}")
        values = grid[key]
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
            raise ConfigError(f"grid[{key!r}] must be a non-empty list of values, got {values!r}")
        get_path(config, key)  # unknown keys fail here, naming the key
    base = config_to_dict(config)
    base.update(_NO_RUN_DIR, mode=sweep_mode(config), num_seeds=1)
    base = config_from_dict(base)
    points = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, values))
        points.append((point, replace_paths(base, point)))
    return points


def static_key(config: Config) -> str:
    """What decides a config's compiled program, as a string: equal keys share one compile.

    The config without its traced fields (`learner.without_traced_fields`: the hyperparameters
    of `learner.TRACED_CONFIG_FIELDS`, keeping only whether a `STATIC_WHEN_SET` field is set),
    the lag schedule (traced as schedule arrays) but the number of samplers, and the seed.
    """
    data = without_traced_fields(config_to_dict(config))
    for path in SGD_SHAPE_FIELDS.values():  # traced within a group (`learner.slotted_epochs`)
        section, _, name = path.partition(".")
        data[section].pop(name)
    data.pop("lag", None)  # the schedule is traced; its samplers are not (one env batch each)
    data["num_samplers"] = config.effective_num_samplers
    data.pop("seed", None)
    return json.dumps(data, sort_keys=True, default=str)


def default_strategy() -> str:
    """vmap on an accelerator (batched configs fill it); loop on CPU (one run saturates it)."""
    return "loop" if jax.default_backend() == "cpu" else "vmap"


def seed_values(config: Config, seeds: int | Sequence[int]) -> list[int]:
    """The seeds of a sweep: `seeds` seeds from config.seed on, or the list given. ConfigError,
    under the rules `Config.seed` / `Config.num_seeds` follow, for a count that is not an integer
    in [1, MAX_SEEDS], a seed that is not an integer >= 0, an empty list or a repeated seed."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if not 1 <= seeds <= MAX_SEEDS:
            raise ConfigError(f"seeds = {seeds!r} is invalid: must be a number of seeds in [1, {MAX_SEEDS}] or a list of seeds")
        return list(range(config.seed, config.seed + seeds))
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Sequence) or not seeds:
        raise ConfigError(f"seeds = {seeds!r} is invalid: must be a number of seeds or a non-empty list of seeds")
    for seed in seeds:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seeds = {list(seeds)!r} is invalid: seed {seed!r} must be an integer >= 0 (as Config.seed)")
    if len(set(seeds)) != len(seeds) or len(seeds) > MAX_SEEDS:
        raise ConfigError(f"seeds = {list(seeds)!r} is invalid: need at most {MAX_SEEDS} seeds, without repeats")
    return list(seeds)


def sweep(
    config: Config,
    grid: Mapping[str, Sequence[Any]],
    seeds: int | Sequence[int] = 1,
    strategy: str = "auto",
    progress: bool = True,
) -> "Any":
    """Runs every grid point for every seed; returns a tidy pandas DataFrame (see module doc).

    Args:
      config: the base config (its mode is taken as "simulated").
      grid: dotted field name -> list of values.
      seeds: a number of seeds (config.seed, config.seed + 1, ...) or an explicit list.
      strategy: "vmap", "loop" or "auto".
      progress: one line per finished config (per vmapped group with strategy "vmap") with
        `configs k/K` and an ETA (`GridProgress`; a line per run in threaded sweeps); on by
        default, `progress=False` for silence.
    """
    import pandas as pd

    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy = {strategy!r} is invalid: must be one of {STRATEGIES}")
    if strategy == "auto":
        strategy = default_strategy()
    check_config_type(config)
    seed_list = seed_values(config, seeds)
    points = expand_grid(config, grid)
    for _, cfg in points:  # a vmapped group stacks its points x seeds in one program
        check_fits_machine(cfg, stacked_seeds=len(points) * len(seed_list) if strategy == "vmap" else len(seed_list))
    totals = SweepTotals()
    if sweep_mode(config) == "threaded":
        strategy = "threaded"
        num_compiles = _run_threaded_points(points, seed_list, totals, progress)
    else:
        groups: dict[Config, list[int]] = {}
        for index, (_, cfg) in enumerate(points):
            groups.setdefault(static_key(cfg), []).append(index)
        run_group = _run_group_vmap if strategy == "vmap" else _run_group_loop
        tracker = GridProgress(len(points), len(groups), enabled=progress)
        for members in groups.values():
            run_group(points, members, seed_list, totals, tracker)
        num_compiles = len(groups)

    df = pd.DataFrame(totals.rows)
    df = df.sort_values(["config_id", "seed", "iteration"], kind="stable").reset_index(drop=True)
    df.attrs.update(
        strategy=strategy,
        compiles=num_compiles,
        traces=totals.traces,
        compile_seconds=totals.compile_seconds,
        run_seconds=totals.run_seconds,
        grid={k: list(v) for k, v in grid.items()},
        none_as_inf=none_as_inf_columns([p for p, _ in points]),
        seeds=seed_list,
    )
    return df


@dataclasses.dataclass
class SweepTotals:
    """What a sweep accumulates over its compile groups."""

    rows: list = dataclasses.field(default_factory=list)
    runs_done: list = dataclasses.field(default_factory=list)
    traces: int = 0
    compile_seconds: float = 0.0
    run_seconds: float = 0.0


@dataclasses.dataclass(frozen=True)
class GroupProgram:
    """One compile group: its configs, the seed-vmapped step (trace-counted), init, per-config inputs."""

    configs: list
    seed_step: Any
    init: Any
    hparams: list
    schedules: list


def _group_program(points: list, members: list[int], num_seeds: int, totals: SweepTotals) -> GroupProgram:
    cfgs = [points[i][1] for i in members]
    schedules = [make_schedule(c.lag, c.num_iterations, c.effective_num_samplers) for c in cfgs]
    program = make_simulated_program(cfgs[0], max(s.ring_size for s in schedules), sgd_slots=sgd_slots_of(cfgs))

    def counted_iteration(state, hparams, sched):
        totals.traces += 1  # runs once per trace, never at execution
        return program.iteration(state, hparams, sched)

    return GroupProgram(
        configs=cfgs,
        seed_step=over_seeds(counted_iteration, num_seeds, in_axes=(0, None, None)),
        init=jax.jit(over_seeds(program.init, num_seeds)),
        hparams=[hyperparams_from_config(c) for c in cfgs],
        schedules=[schedule_arrays(s) for s in schedules],
    )


def _labels(points: list, member: int, seed_list: list[int]) -> list[dict[str, Any]]:
    encoded = grid_labels([p for p, _ in points])[member]
    return [{"config_id": member, **encoded, "seed": s} for s in seed_list]


class GridProgress:
    """The progress of a whole sweep grid: one plain line per finished config (or vmapped group)
    with `configs k/K`, the compiled group, elapsed time and an ETA (elapsed per config x configs
    left), instead of an unlabelled bar per group. Lines, not bars: they read the same in a
    terminal and in a redirected log."""

    def __init__(self, num_configs: int, num_groups: int, enabled: bool = True) -> None:
        self.total, self.num_groups, self.enabled = num_configs, num_groups, enabled
        self.done_configs, self.group = 0, 0
        self.started = time.perf_counter()

    def line(self, finished: int, what: str) -> str:
        """The line after `finished` more configs (`what` says which), and the counts updated."""
        self.done_configs += finished
        elapsed = time.perf_counter() - self.started
        left = self.total - self.done_configs
        eta = elapsed / max(self.done_configs, 1) * left
        return (f"sweep: configs {self.done_configs}/{self.total} done ({what}; group {self.group}/{self.num_groups}), "
                f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s")

    def finished(self, count: int, what: str) -> None:
        """Records `count` finished configs and prints the line (when enabled)."""
        text = self.line(count, what)
        if self.enabled:
            print(text, flush=True)


def _run(config: Config, labels: list, compiled: Any, states: Any, args: tuple, totals: SweepTotals, progress: bool,
         leading_axes: int = 1) -> None:
    """Runs one compiled program through a file-less recorder (checks, accounting, rows)."""
    t0 = time.perf_counter()
    with RunRecorder(config, labels, progress=progress) as recorder:
        run_iterations(config, recorder, compiled, states, args, leading_axes=leading_axes)
    totals.run_seconds += time.perf_counter() - t0
    totals.rows.extend(recorder.rows)


def _run_group_vmap(points: list, members: list[int], seed_list: list[int], totals: SweepTotals,
                    tracker: GridProgress) -> None:
    """All configs x seeds of a group as one batched program."""
    tracker.group += 1
    t0 = time.perf_counter()
    group = _group_program(points, members, len(seed_list), totals)
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs)  # noqa: E731
    args = (stack(group.hparams), stack(group.schedules))
    states = group.init(jnp.stack([jax.random.PRNGKey(s) for s in seed_list]))
    states = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(members),) + x.shape), states)
    step = jax.jit(jax.vmap(group.seed_step, in_axes=(0, 0, 0)), donate_argnums=(0,))
    compiled = step.lower(states, *args).compile(compiler_options=program_compiler_options())
    totals.compile_seconds += time.perf_counter() - t0
    labels = [label for m in members for label in _labels(points, m, seed_list)]
    _run(group.configs[0], labels, compiled, states, args, totals, False, leading_axes=2)
    tracker.finished(len(members), f"configs {', '.join(map(str, members))} in one vmapped program")


def _run_group_loop(points: list, members: list[int], seed_list: list[int], totals: SweepTotals,
                    tracker: GridProgress) -> None:
    """One compiled (seed-vmapped) program, called once per config of the group."""
    tracker.group += 1
    t0 = time.perf_counter()
    group = _group_program(points, members, len(seed_list), totals)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seed_list])
    step = jax.jit(group.seed_step, donate_argnums=(0,))
    compiled = step.lower(group.init(keys), group.hparams[0], group.schedules[0]).compile(
        compiler_options=program_compiler_options())
    totals.compile_seconds += time.perf_counter() - t0
    for c, cfg in enumerate(group.configs):
        args = (group.hparams[c], group.schedules[c])
        _run(cfg, _labels(points, members[c], seed_list), compiled, group.init(keys), args, totals, False)
        where = ", ".join(f"{key}={value!r}" for key, value in points[members[c]][0].items())
        tracker.finished(1, f"config {members[c]}: {where}")


def _run_threaded_points(points: list, seed_list: list[int], totals: SweepTotals, progress: bool) -> int:
    """Every (config, seed) as a real threaded run, one after another; returns the number of
    distinct compiled program sets. Runs whose programs match (`threaded.program_key`: only
    samplers, buffer, refresh, latency, seeds or traced hyperparameters differ) reuse them."""
    keys = set()
    total = len(points) * len(seed_list)
    started = time.perf_counter()
    for index, (point, cfg) in enumerate(points):
        placement = resolve_placement(cfg)
        keys.add(program_key(cfg, placement.sampler_devices, placement.learner_devices, lag_buckets_of(cfg)))
        for seed in seed_list:
            run_cfg = cfg.replace(seed=seed)
            t0 = time.perf_counter()
            recorder = RunRecorder(run_cfg, _labels(points, index, [seed]))
            try:
                result = run_threaded(run_cfg, recorder)
            finally:
                recorder.close()
            seconds = time.perf_counter() - t0
            totals.compile_seconds += result.compile_seconds
            totals.run_seconds += seconds - result.compile_seconds
            totals.rows.extend(recorder.rows)
            if progress:
                k = len(totals.runs_done) + 1
                eta = (time.perf_counter() - started) / k * (total - k)
                print(_threaded_run_line(k, total, index, seed, point, recorder.rows, seconds,
                                         result.compile_seconds) + f"; ETA {eta:.0f}s", flush=True)
            totals.runs_done.append((index, seed))
    return len(keys)


def _threaded_run_line(k: int, total: int, config_id: int, seed: int, point: Mapping[str, Any], rows: list,
                       seconds: float, compile_seconds: float) -> str:
    """One progress line per threaded sweep run: which run, its grid point, return, KL, drops, time."""
    returns = [r["episode_return"] for r in rows if r.get("episode_return") is not None]
    tail = returns[-max(1, len(returns) // 10):] if returns else []
    kl = [r["approx_kl"] for r in rows if r.get("approx_kl") is not None]
    dropped = rows[-1]["samples_dropped"] if rows else 0
    consumed = rows[-1]["samples_consumed"] if rows else 0
    where = ", ".join(f"{key}={value!r}" for key, value in point.items())
    final = f"{sum(tail) / len(tail):.1f}" if tail else "n/a"
    mean_kl = f"{sum(kl) / len(kl):.4f}" if kl else "n/a"
    frac = dropped / max(consumed + dropped, 1)
    return (f"sweep run {k}/{total}: config {config_id} ({where}) seed {seed}: {len(rows)} iterations, "
            f"final return {final}, mean approx_kl {mean_kl}, {frac:.0%} dropped, {seconds:.1f}s "
            f"(compile {compile_seconds:.1f}s)")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and not isinstance(value, bool)


def none_as_inf_columns(points: Sequence[Mapping[str, Any]]) -> list[str]:
    """Grid keys whose values are numbers or None, with a None among them: their None is
    written as `inf` (in every such field None means "no bound": dual_clip = inf is plain PPO,
    max_lag = inf keeps every sample, value_clip_eps = inf clips nothing)."""
    keys = list(points[0]) if points else []
    return [k for k in keys if any(p[k] is None for p in points) and all(p[k] is None or _is_number(p[k]) for p in points)]


def grid_labels(points: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The grid columns of each point, made groupable by a plain `df.groupby(grid_keys)`:
    None becomes inf in numeric columns (`none_as_inf_columns`) and the string "None" in others
    (pandas drops NaN / None keys from groups), sequences become tuples (hashable)."""
    as_inf = set(none_as_inf_columns(points))
    out = []
    for point in points:
        labels = {}
        for key, value in point.items():
            if value is None:
                value = math.inf if key in as_inf else "None"
            elif isinstance(value, (list, tuple)):
                value = tuple(value)
            labels[key] = value
        out.append(labels)
    return out


def _json_value(value: Any) -> Any:
    """A cell as exact JSON: floats keep every digit (repr), NaN/inf become null, lists recurse."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_json_value(v) for v in value]
    return value


def save_sweep(df: "Any", path: str | os.PathLike) -> None:
    """Writes a sweep DataFrame as JSON lines (or CSV when `path` ends in .csv) plus a
    `.attrs.json` sidecar; `load_sweep` reads either back.

    JSON lines are written with the standard `json` module, not `DataFrame.to_json`, whose
    fixed number of decimal places (10 by default) would round small metrics such as a KL of
    1e-6. In CSV, list-valued cells (lag histograms, per-lag KL, tuple grid values) are JSON
    text, decoded again by `load_sweep`.
    """
    import pandas as pd

    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if path.endswith(".csv"):
        out = df.copy()
        for column in out.columns:
            if not pd.api.types.is_numeric_dtype(out[column]):
                out[column] = [json.dumps(_json_value(v)) if isinstance(v, (list, tuple, np.ndarray)) else v
                               for v in out[column]]
        out.to_csv(path, index=False, float_format="%.17g")
    else:
        with open(path, "w", encoding="utf-8") as f:
            for record in df.to_dict(orient="records"):
                f.write(json.dumps({str(k): _json_value(v) for k, v in record.items()}, allow_nan=False) + "\n")
    with open(path + ".attrs.json", "w", encoding="utf-8") as f:
        json.dump(df.attrs, f, indent=2, default=str)


def load_sweep(path: str | os.PathLike) -> "Any":
    """Reads a DataFrame written by `save_sweep` (attrs restored when the sidecar exists):
    list cells come back as lists, grid columns as the sweep wrote them (tuples for sequence
    values, inf for the None of `attrs["none_as_inf"]`)."""
    import pandas as pd

    path = os.fspath(path)
    if path.endswith(".csv"):
        df = pd.read_csv(path, keep_default_na=False, na_values=[""])
        for column in df.columns:
            if not pd.api.types.is_numeric_dtype(df[column]):
                df[column] = [json.loads(v) if isinstance(v, str) and v.startswith("[") else v for v in df[column]]
    else:
        df = pd.read_json(path, orient="records", lines=True, precise_float=True)
    sidecar = path + ".attrs.json"
    if os.path.isfile(sidecar):
        with open(sidecar, encoding="utf-8") as f:
            df.attrs.update(json.load(f))
    for column in df.attrs.get("none_as_inf", []):
        df[column] = df[column].astype(float).fillna(math.inf)
    for column in df.attrs.get("grid", {}):
        if column in df.columns and not pd.api.types.is_numeric_dtype(df[column]):
            df[column] = [tuple(v) if isinstance(v, list) else v for v in df[column]]
    return df
