"""Parts every mode shares: contexts, env keys, the rollout-then-update body, the jitted host loop.

Sync and simulated are one jitted program per learner iteration, vmapped over seeds; they
differ only in which params snapshot acts (`rollout_and_update`'s `snapshot`). `run_jitted`
is their whole host side (and `run_iterations` that of sweeps): it steps the compiled
program, turns metrics into rows, keeps the sample accounting and hands everything to the
`RunRecorder`. Iteration k's metrics are fetched while iteration k+1 runs (JAX dispatches
asynchronously), except when a checkpoint is due after k (the donated state must be saved
before the next step consumes it).
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np

from ppo_async import envs
from ppo_async.core import learner
from ppo_async.config import HOST_ONLY_FIELDS, Config, config_to_dict
from ppo_async.core.learner import Hyperparams, LearnerContext
from ppo_async.report.metrics import split_seeds
from ppo_async.core.networks import make_actor_critic
from ppo_async.run.recorder import RunRecorder
from ppo_async.run.result import TrainResult
from ppo_async.core.rollout import RolloutContext, rollout
from ppo_async.core.types import EnvState, PolicySnapshot, RolloutStats, TrainState
from ppo_async.runtime.program_cache import cached_jit
from ppo_async.runtime.xla_flags import program_compiler_options


def rollout_metrics(stats: RolloutStats) -> dict[str, chex.Array]:
    """Episode metrics of one rollout: mean return/length of finished episodes (NaN if none)."""
    count = stats.episode_count
    safe = jnp.maximum(count, 1.0)
    return {
        "episode_return": jnp.where(count > 0, stats.episode_return_sum / safe, jnp.nan),
        "episode_length": jnp.where(count > 0, stats.episode_length_sum / safe, jnp.nan),
        "episodes_finished": count,
        "nonfinite_env_values": stats.nonfinite_count,
    }


def make_contexts(
    config: Config, lag_buckets: int = 1, axis_name: str | None = None, sgd_slots: learner.SgdSlots | None = None
) -> tuple[envs.Env, RolloutContext, LearnerContext]:
    """Env, rollout context and learner context of a config (`sgd_slots`: the SGD shape traced
    within these bounds, for a sweep group; see `learner.slotted_epochs`)."""
    env = envs.make_env(config.env, config.env_options)
    network = make_actor_critic(env, config.network)
    rollout_ctx = RolloutContext(env=env, network=network, config=config.rollout, gamma=config.ppo.gamma)
    learner_ctx = learner.make_learner_context(config, network, lag_buckets=lag_buckets, axis_name=axis_name,
                                               sgd_slots=sgd_slots)
    return env, rollout_ctx, learner_ctx


def sampler_env_key(env_key: chex.PRNGKey, sampler: int) -> chex.PRNGKey:
    """Env-reset key of sampler s; sync mode is sampler 0, so it matches a one-sampler emulation."""
    return jax.random.fold_in(env_key, sampler)


def seed_keys(config: Config) -> jax.Array:
    """`[num_seeds]` keys; seed i uses PRNGKey(config.seed + i), so seed s alone reproduces it."""
    return jnp.stack([jax.random.PRNGKey(config.seed + i) for i in range(config.num_seeds)])


def seed_labels(config: Config) -> list[dict[str, Any]]:
    """One row label per seed of a run."""
    return [{"seed": config.seed + i} for i in range(config.num_seeds)]


def over_seeds(fn: Callable, num_seeds: int, in_axes: int | None | tuple = 0) -> Callable:
    """`jax.vmap(fn, in_axes)` over a leading seed axis of size `num_seeds`.

    With one seed the function runs unbatched and the axis is dropped from the inputs and
    added to the outputs (free reshapes under jit): XLA:CPU runs the matmuls of a batch-1
    vmap as batched dots, measured 0.78x the speed of the plain program at the peer shape.
    """
    if num_seeds > 1:
        return jax.vmap(fn, in_axes=in_axes)

    def one_seed(*args: Any) -> Any:
        axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
        args = tuple(a if ax is None else jax.tree.map(lambda x: x[0], a) for a, ax in zip(args, axes))
        return jax.tree.map(lambda x: x[None], fn(*args))

    return one_seed


def rollout_and_update(
    rollout_ctx: RolloutContext,
    learner_ctx: LearnerContext,
    train_state: TrainState,
    snapshot: PolicySnapshot,
    env_state: EnvState,
    key: chex.PRNGKey,
    hparams: Hyperparams,
) -> tuple[TrainState, EnvState, chex.PRNGKey, dict[str, chex.Array]]:
    """One learner iteration: a rollout acting with `snapshot`, then one PPO update on it.

    Sync passes the learner's own snapshot (lag 0); simulated one read from its ring of past
    versions. Returns `(train_state, env_state, next key, metrics)`.
    """
    key, rollout_key, update_key = jax.random.split(key, 3)
    env_state, trajectory = rollout(rollout_ctx, snapshot, env_state, rollout_key)
    train_state, metrics = learner.ppo_update(learner_ctx, train_state, trajectory, update_key, hparams)
    metrics.update(rollout_metrics(trajectory.stats))
    metrics["learner_version"] = train_state.version
    metrics["sgd_steps"] = train_state.sgd_steps
    return train_state, env_state, key, metrics


@dataclass(frozen=True)
class JittedProgram:
    """A jitted mode's program, vmapped over seeds (not yet jitted).

    `init(keys [S]) -> states` and `step(states, *args) -> (states, metrics)`;
    `schedule_records` (simulated mode) are written to RUN_DIR/lag_schedule.jsonl.
    """

    init: Callable[[jax.Array], Any]
    step: Callable[..., tuple[Any, dict[str, Any]]]
    args: tuple
    schedule_records: list[dict[str, Any]] | None = None


def jitted_checkpoint_like(build: Callable[[Config], JittedProgram]) -> Callable[[Config], Any]:
    """`checkpoint_like(config)` of a jitted mode: the abstract shape of its seed-stacked state."""
    return lambda config: jax.eval_shape(build(config).init, seed_keys(config))


# Compiled programs of the jitted modes, kept across runs of one process: a sweep from code, a
# notebook or a test suite re-running one shape pays tracing and lowering (1.6-2.1 s per
# tiny run here, even with the persistent cache warm) once. Keyed by `jitted_program_key`. Across
# processes, `runtime.program_cache` keeps the traced programs themselves (with JAX's cache on).
_JITTED: "collections.OrderedDict[str, tuple[Callable, Any]]" = collections.OrderedDict()
_JITTED_KEPT = 8


def jitted_program_key(build: Callable, config: Config) -> str:
    """A string equal for two configs exactly when `build` makes the same compiled program of
    them: everything but the host-side fields and the traced hyperparameters (which enter as
    arguments; for a `learner.STATIC_WHEN_SET` field only whether it is set)."""
    data = config_to_dict(config)
    for name in HOST_ONLY_FIELDS:
        data.pop(name)
    return json.dumps([build.__module__, build.__qualname__, learner.without_traced_fields(data)], sort_keys=True)


def clear_jitted_cache() -> None:
    """Forgets the kept compiled programs of the jitted modes (e.g. after patching a function they traced)."""
    _JITTED.clear()


def run_jitted(
    build: Callable[[Config], JittedProgram], config: Config, recorder: RunRecorder, resume: bool = False
) -> TrainResult:
    """The host side of a jitted mode: init (or restore), compile, iterate, return the result."""
    t0 = time.perf_counter()
    program = build(config)
    key = jitted_program_key(build, config)
    init, compiled = _JITTED.get(key, (None, None))
    keys = seed_keys(config)
    if init is None:  # from the program cache where a process before this one traced it
        init, _ = cached_jit(program.init, key + "/init", (keys,))
    states = init(keys)
    if resume:
        states = recorder.resume_from(states)
    if compiled is None:
        step, _ = cached_jit(program.step, key + "/step", (states, *program.args), donate_argnums=(0,))
        compiled = step.lower(states, *program.args).compile(compiler_options=program_compiler_options())
        _JITTED[key] = (init, compiled)
        while len(_JITTED) > _JITTED_KEPT:
            _JITTED.popitem(last=False)
    _JITTED.move_to_end(key)
    compile_seconds = time.perf_counter() - t0
    with recorder:
        if program.schedule_records is not None:
            recorder.write_schedule("lag_schedule.jsonl", program.schedule_records)
        states = run_iterations(config, recorder, compiled, states, program.args)
    return recorder.result(states.train_state, compile_seconds)


def metric_rows(
    config: Config,
    metrics: dict[str, Any],
    labels: list[dict[str, Any]],
    iteration: int,
    counters: tuple[np.ndarray, np.ndarray],
    leading_axes: int = 1,
) -> list[dict[str, Any]]:
    """One iteration's device-fetched metrics -> one row per label, with the sample accounting.

    `metrics` leaves are `[L, ...]` (or `[C, S, ...]` with `leading_axes=2`, flattened to L).
    `counters = (consumed, dropped)` per row are updated in place. A jitted mode consumes
    every batch in the step that produces it, so `samples_resident` is 0.
    """
    num_rows = len(labels)
    consumed, dropped = counters
    flat = {k: np.reshape(v, (num_rows,) + np.shape(v)[leading_axes:]) for k, v in metrics.items()}
    rows = split_seeds(flat, num_rows)
    produced = iteration * config.batch_size
    for i, row in enumerate(rows):
        row.update(labels[i])
        consumed[i] += row.pop("consumed")
        dropped[i] += row["dropped_stale"]
        row.update(
            iteration=iteration,
            env_steps=produced,
            samples_produced=produced,
            samples_consumed=int(consumed[i]),
            samples_dropped=int(dropped[i]),
            samples_resident=0,
        )
    return rows


def run_iterations(
    config: Config,
    recorder: RunRecorder,
    compiled_step: Callable,
    states: Any,
    args: tuple,
    leading_axes: int = 1,
) -> Any:
    """Steps `compiled_step(states, *args) -> (states, metrics)` from `recorder.first_iteration`
    to `config.num_iterations`, handing each iteration's rows (and state) to the recorder.

    Returns the final states. Rows carry `wall_time` (since the loop started, plus the time
    before a resumed checkpoint) and `steps_per_second` (transitions of all rows / the time
    between this iteration's metrics arriving and the previous one's).
    """
    labels = recorder.labels
    counters = (recorder.resumed_counter("samples_consumed"), recorder.resumed_counter("samples_dropped"))
    start = last = time.perf_counter()
    rate_scale = config.batch_size * len(labels)

    def flush(iteration: int, metrics: Any, state: Any = None) -> None:
        nonlocal last
        host = jax.device_get(metrics)
        now = time.perf_counter()
        rows = metric_rows(config, host, labels, iteration, counters, leading_axes)
        for row in rows:
            row.update(wall_time=now - start + recorder.wall_offset, steps_per_second=rate_scale / max(now - last, 1e-9))
        last = now
        recorder.record(rows, iteration, state=None if state is None else (lambda: state))

    pending = None
    for iteration in range(recorder.first_iteration, config.num_iterations + 1):
        states, metrics = compiled_step(states, *args)
        if pending is not None:
            flush(*pending)  # iteration - 1's rows, while this one runs
            pending = None
        if recorder.wants_state(iteration):
            flush(iteration, metrics, states)  # checkpointed / evaluated before the next step donates it
        else:
            pending = (iteration, metrics)
    if pending is not None:
        flush(*pending)
    return states
