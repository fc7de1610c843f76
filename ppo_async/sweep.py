"""Programmatic sweeps over lag and PPO knobs, one compile per group of shape-compatible configs.

    df = ppo_async.sweep(
        config,
        grid={"lag.K": [0, 2, 8], "ppo.dual_clip": [None, 3.0], "ppo.clip_eps": [0.2, 0.1]},
        seeds=3,                 # or an explicit list of seeds
        strategy="auto",         # "vmap" | "loop" | "auto" (vmap on an accelerator, loop on CPU)
    )

Every grid key is a dotted config path; the grid is the cartesian product. Runs use the
simulated mode (one sampler, lag 0 is bit-for-bit sync PPO). Fields that do not change
array shapes — every `Hyperparams` field (learning rate, gamma, gae_lambda, clip_eps,
dual_clip incl. None, value/entropy coefficients, grad clip, reward scale, V-trace
truncations, value-update cadence, max_lag) and every lag-schedule field but the number of
samplers — are traced inputs, so **one compile serves all of them**. Other fields (env,
network, num_envs, num_steps, epochs, minibatches, num_samplers, advantage_estimator,
value clipping on/off, total_env_steps, ...) split the grid into groups compiled once each.
The lag ring of a group is sized for its largest lag.

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

from ppo_async.config import Config, ConfigError, LagConfig, get_path, replace_path
from ppo_async.lag import make_schedule
from ppo_async.learner import TRACED_CONFIG_FIELDS, hyperparams_from_config
from ppo_async.modes.common import over_seeds, run_iterations
from ppo_async.modes.simulated import make_simulated_program, schedule_arrays
from ppo_async.recorder import RunRecorder

STRATEGIES = ("auto", "vmap", "loop")



def expand_grid(config: Config, grid: Mapping[str, Sequence[Any]]) -> list[tuple[dict[str, Any], Config]]:
    """The cartesian product of the grid as (grid point, validated Config) pairs, in grid order."""
    if not isinstance(grid, Mapping):
        raise ConfigError(f"grid must be a mapping of dotted field names to value lists, got {type(grid).__name__}")
    keys = list(grid)
    if not keys:
        raise ConfigError("grid is empty: give at least one dotted field name with a non-empty list of values")
    for key in keys:
        values = grid[key]
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or len(values) == 0:
            raise ConfigError(f"grid[{key!r}] must be a non-empty list of values, got {values!r}")
    points = []
    for values in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, values))
        cfg = config.replace(mode="simulated", run_dir=None, num_seeds=1)
        for key, value in point.items():
            cfg = replace_path(cfg, key, value)
        points.append((point, cfg))
    return points


def static_key(config: Config) -> Config:
    """The config with every traced field (`learner.TRACED_CONFIG_FIELDS`, the lag schedule)
    set to its default: equal keys share one compile."""
    default = Config()
    key = config
    for path in TRACED_CONFIG_FIELDS.values():
        key = _replace_field(key, path, get_path(default, path))
    if config.ppo.value_clip_eps is not None:  # on/off is static, the value is traced
        key = _replace_field(key, "ppo.value_clip_eps", 0.2)
    # Every schedule field is traced (schedule arrays) but the number of samplers.
    return dataclasses.replace(key, lag=LagConfig(num_samplers=config.lag.effective_num_samplers), seed=0)


def _replace_field(config: Config, path: str, value: Any) -> Config:
    """dataclasses.replace along a dotted path (no re-validation of unrelated sections needed)."""
    section, _, name = path.rpartition(".")
    if not section:
        return dataclasses.replace(config, **{name: value})
    return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section), **{name: value})})


def default_strategy() -> str:
    """vmap on an accelerator (batched configs fill it); loop on CPU (one run saturates it)."""
    return "loop" if jax.default_backend() == "cpu" else "vmap"


def sweep(
    config: Config,
    grid: Mapping[str, Sequence[Any]],
    seeds: int | Sequence[int] = 1,
    strategy: str = "auto",
    progress: bool = False,
) -> "Any":
    """Runs every grid point for every seed; returns a tidy pandas DataFrame (see module doc).

    Args:
      config: the base config (its mode is taken as "simulated").
      grid: dotted field name -> list of values.
      seeds: a number of seeds (config.seed, config.seed + 1, ...) or an explicit list.
      strategy: "vmap", "loop" or "auto".
      progress: a progress bar per compiled group / config.
    """
    import pandas as pd

    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy = {strategy!r} is invalid: must be one of {STRATEGIES}")
    if strategy == "auto":
        strategy = default_strategy()
    seed_list = list(range(config.seed, config.seed + seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list or len(set(seed_list)) != len(seed_list):
        raise ConfigError(f"seeds = {seeds!r} is invalid: need at least one seed, without repeats")
    points = expand_grid(config, grid)
    groups: dict[Config, list[int]] = {}
    for index, (_, cfg) in enumerate(points):
        groups.setdefault(static_key(cfg), []).append(index)

    totals = SweepTotals()
    run_group = _run_group_vmap if strategy == "vmap" else _run_group_loop
    for members in groups.values():
        run_group(points, members, seed_list, totals, progress)

    df = pd.DataFrame(totals.rows)
    df = df.sort_values(["config_id", "seed", "iteration"], kind="stable").reset_index(drop=True)
    df.attrs.update(
        strategy=strategy,
        compiles=len(groups),
        traces=totals.traces,
        compile_seconds=totals.compile_seconds,
        run_seconds=totals.run_seconds,
        grid={k: list(v) for k, v in grid.items()},
        seeds=seed_list,
    )
    return df


@dataclasses.dataclass
class SweepTotals:
    """What a sweep accumulates over its compile groups."""

    rows: list = dataclasses.field(default_factory=list)
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
    schedules = [make_schedule(c.lag, c.num_iterations) for c in cfgs]
    program = make_simulated_program(cfgs[0], max(s.ring_size for s in schedules))

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
    return [{"config_id": member, **_point_labels(points[member][0]), "seed": s} for s in seed_list]


def _run(config: Config, labels: list, compiled: Any, states: Any, args: tuple, totals: SweepTotals, progress: bool,
         leading_axes: int = 1) -> None:
    """Runs one compiled program through a file-less recorder (checks, accounting, rows)."""
    t0 = time.perf_counter()
    with RunRecorder(config, labels, progress=progress) as recorder:
        run_iterations(config, recorder, compiled, states, args, leading_axes=leading_axes)
    totals.run_seconds += time.perf_counter() - t0
    totals.rows.extend(recorder.rows)


def _run_group_vmap(points: list, members: list[int], seed_list: list[int], totals: SweepTotals, progress: bool) -> None:
    """All configs x seeds of a group as one batched program."""
    t0 = time.perf_counter()
    group = _group_program(points, members, len(seed_list), totals)
    stack = lambda xs: jax.tree.map(lambda *a: jnp.stack(a), *xs)  # noqa: E731
    args = (stack(group.hparams), stack(group.schedules))
    states = group.init(jnp.stack([jax.random.PRNGKey(s) for s in seed_list]))
    states = jax.tree.map(lambda x: jnp.broadcast_to(x, (len(members),) + x.shape), states)
    step = jax.jit(jax.vmap(group.seed_step, in_axes=(0, 0, 0)), donate_argnums=(0,))
    compiled = step.lower(states, *args).compile()
    totals.compile_seconds += time.perf_counter() - t0
    labels = [label for m in members for label in _labels(points, m, seed_list)]
    _run(group.configs[0], labels, compiled, states, args, totals, progress, leading_axes=2)


def _run_group_loop(points: list, members: list[int], seed_list: list[int], totals: SweepTotals, progress: bool) -> None:
    """One compiled (seed-vmapped) program, called once per config of the group."""
    t0 = time.perf_counter()
    group = _group_program(points, members, len(seed_list), totals)
    keys = jnp.stack([jax.random.PRNGKey(s) for s in seed_list])
    step = jax.jit(group.seed_step, donate_argnums=(0,))
    compiled = step.lower(group.init(keys), group.hparams[0], group.schedules[0]).compile()
    totals.compile_seconds += time.perf_counter() - t0
    for c, cfg in enumerate(group.configs):
        args = (group.hparams[c], group.schedules[c])
        _run(cfg, _labels(points, members[c], seed_list), compiled, group.init(keys), args, totals, progress)


def _point_labels(point: Mapping[str, Any]) -> dict[str, Any]:
    """Grid values as row columns (tuples become lists, None stays None)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in point.items()}


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
    """Writes a sweep DataFrame as JSON lines plus a `.attrs.json` sidecar.

    Written with the standard `json` module, not `DataFrame.to_json`, whose fixed number of
    decimal places (10 by default) would round small metrics such as a KL of 1e-6.
    """
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for record in df.to_dict(orient="records"):
            f.write(json.dumps({str(k): _json_value(v) for k, v in record.items()}, allow_nan=False) + "\n")
    with open(path + ".attrs.json", "w", encoding="utf-8") as f:
        json.dump(df.attrs, f, indent=2, default=str)


def load_sweep(path: str | os.PathLike) -> "Any":
    """Reads a DataFrame written by `save_sweep` (attrs restored when the sidecar exists)."""
    import pandas as pd

    path = os.fspath(path)
    df = pd.read_json(path, orient="records", lines=True, precise_float=True)
    sidecar = path + ".attrs.json"
    if os.path.isfile(sidecar):
        with open(sidecar, encoding="utf-8") as f:
            df.attrs.update(json.load(f))
    return df
