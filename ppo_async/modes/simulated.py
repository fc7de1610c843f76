"""Simulated mode: exact, reproducible policy lag inside one jitted program.

`Config.effective_num_samplers` emulated samplers each own N envs (with their own env seeds). Learner
iteration i consumes one rollout of sampler `schedule.sampler_id[i]`, produced with the
params of version `v - schedule.lag[i]` (v = current learner version, floored at 0 during
warm-up), read from a device-side ring of the last `ring_size` param snapshots. Behaviour
log-probs and distributions therefore come from the stale params and importance ratios are
real. The schedule arrays and every `Hyperparams` field are traced inputs: one compile
serves every lag value / clip / dual-clip setting with the same ring size.

With one sampler and lag 0 this computes exactly what `sync` computes (tested bit for bit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import functools

import chex
import jax
import jax.numpy as jnp

from ppo_async import envs
from ppo_async.core import learner
from ppo_async.config import Config
from ppo_async.core.lag import LagSchedule, make_schedule
from ppo_async.core.learner import Hyperparams, LearnerContext, SgdSlots, hyperparams_from_config
from ppo_async.modes.common import (
    JittedProgram,
    jitted_checkpoint_like,
    make_contexts,
    over_seeds,
    rollout_and_update,
    run_jitted,
    sampler_env_key,
)
from ppo_async.modes.registry import Mode, register_mode
from ppo_async.core.rollout import RolloutContext
from ppo_async.core.types import EnvState, PolicySnapshot, TrainState, snapshot_of


class SimState(NamedTuple):
    """State of a simulated run (per seed)."""

    train_state: TrainState
    env_states: EnvState  # leaves [S, N, ...]: one env batch per emulated sampler
    ring: PolicySnapshot  # leaves [R, ...]: slot u % R holds version u for u in (v - R, v]
    key: chex.PRNGKey
    iteration: chex.Array  # [] int32 schedule position (learner iterations done)


class ScheduleArrays(NamedTuple):
    """Traced schedule inputs, `[I]` int32 each."""

    sampler_id: chex.Array
    lag: chex.Array


def schedule_arrays(schedule: LagSchedule) -> ScheduleArrays:
    return ScheduleArrays(jnp.asarray(schedule.sampler_id, jnp.int32), jnp.asarray(schedule.lag, jnp.int32))


def init_sim_state(
    config: Config,
    rollout_ctx: RolloutContext,
    learner_ctx: LearnerContext,
    key: chex.PRNGKey,
    *,
    num_samplers: int,
    ring_size: int,
) -> SimState:
    """Fresh train state, `num_samplers` env batches with distinct seeds, a ring filled with version 0."""
    param_key, env_key, run_key = jax.random.split(key, 3)
    train_state = learner.init_train_state(learner_ctx, param_key, rollout_ctx.env.obs_shape)
    per_sampler = [
        envs.reset_envs(rollout_ctx.env, sampler_env_key(env_key, s), config.rollout.num_envs)
        for s in range(num_samplers)
    ]
    env_states = jax.tree.map(lambda *xs: jnp.stack(xs), *per_sampler)
    ring = jax.tree.map(lambda x: jnp.broadcast_to(x, (ring_size,) + x.shape), snapshot_of(train_state))
    return SimState(train_state, env_states, ring, run_key, jnp.zeros((), jnp.int32))


def read_ring(ring: PolicySnapshot, version: chex.Array) -> PolicySnapshot:
    """The snapshot of `version` (must lie within the last ring_size versions)."""
    ring_size = ring.version.shape[0]
    return jax.tree.map(lambda r: r[version % ring_size], ring)


def write_ring(ring: PolicySnapshot, snapshot: PolicySnapshot) -> PolicySnapshot:
    """Stores a snapshot in the slot of its version."""
    ring_size = ring.version.shape[0]
    return jax.tree.map(lambda r, x: r.at[snapshot.version % ring_size].set(x), ring, snapshot)


def simulated_iteration(
    rollout_ctx: RolloutContext,
    learner_ctx: LearnerContext,
    state: SimState,
    hparams: Hyperparams,
    schedule: ScheduleArrays,
) -> tuple[SimState, dict[str, chex.Array]]:
    """One learner iteration consuming a batch produced `lag` versions ago by one sampler."""
    sampler = schedule.sampler_id[state.iteration]
    requested_lag = schedule.lag[state.iteration]
    version = state.train_state.version
    # Behaviour params: `requested_lag` versions behind, never before version 0 (warm-up).
    behavior_version = jnp.maximum(version - requested_lag, 0)
    snapshot = read_ring(state.ring, behavior_version)
    env_state = jax.tree.map(lambda e: e[sampler], state.env_states)
    train_state, env_state, key, metrics = rollout_and_update(
        rollout_ctx, learner_ctx, state.train_state, snapshot, env_state, state.key, hparams
    )
    env_states = jax.tree.map(lambda all_, new: all_.at[sampler].set(new), state.env_states, env_state)
    ring = write_ring(state.ring, snapshot_of(train_state))
    metrics["sampler_id"] = sampler
    metrics["behavior_version"] = behavior_version
    iteration = state.iteration + 1
    return SimState(train_state, env_states, ring, key, iteration), metrics


@dataclass(frozen=True)
class SimulatedProgram:
    """Pure functions of one simulated run (vmap them over seeds and configs)."""

    rollout_ctx: RolloutContext
    learner_ctx: LearnerContext
    num_samplers: int
    ring_size: int
    init: Callable[[chex.PRNGKey], SimState]
    iteration: Callable[[SimState, Hyperparams, ScheduleArrays], tuple[SimState, dict[str, Any]]]


def make_simulated_program(
    config: Config, ring_size: int, lag_buckets: int | None = None, sgd_slots: SgdSlots | None = None
) -> SimulatedProgram:
    """The pure init / iteration functions of a simulated run with a ring of `ring_size` versions.

    `lag_buckets` (default ring_size) is the length of the lag histogram / per-lag breakdown;
    `sgd_slots` traces the SGD shape (a sweep group's configs that differ in it).
    """
    num_samplers = config.effective_num_samplers
    _, rollout_ctx, learner_ctx = make_contexts(config, lag_buckets=lag_buckets or ring_size, sgd_slots=sgd_slots)
    return SimulatedProgram(
        rollout_ctx=rollout_ctx,
        learner_ctx=learner_ctx,
        num_samplers=num_samplers,
        ring_size=ring_size,
        # plain functions (not partials), so chex.assert_max_traces can wrap them
        init=lambda key: init_sim_state(config, rollout_ctx, learner_ctx, key, num_samplers=num_samplers, ring_size=ring_size),
        iteration=lambda state, hparams, sched: simulated_iteration(rollout_ctx, learner_ctx, state, hparams, sched),
    )


def simulated_setup(config: Config) -> tuple[SimulatedProgram, LagSchedule]:
    """Program and schedule of a simulated config."""
    schedule = make_schedule(config.lag, config.num_iterations, config.effective_num_samplers)
    return make_simulated_program(config, schedule.ring_size), schedule


def schedule_records(schedule: LagSchedule) -> list[dict[str, int]]:
    """The (iteration, sampler_id, lag) records of a schedule, as RUN_DIR/lag_schedule.jsonl holds them."""
    return [
        {"iteration": i + 1, "sampler_id": int(s), "lag": int(k)}
        for i, (s, k) in enumerate(zip(schedule.sampler_id, schedule.lag))
    ]


def build_simulated(config: Config) -> JittedProgram:
    """The seed-vmapped simulated program of a config, with its schedule."""
    program, schedule = simulated_setup(config)
    return JittedProgram(
        init=over_seeds(program.init, config.num_seeds),
        step=over_seeds(program.iteration, config.num_seeds, in_axes=(0, None, None)),
        args=(hyperparams_from_config(config), schedule_arrays(schedule)),
        schedule_records=schedule_records(schedule),
    )


MODE = register_mode(
    Mode(
        name="simulated",
        run=functools.partial(run_jitted, build_simulated),
        checkpoint_like=jitted_checkpoint_like(build_simulated),
    )
)
