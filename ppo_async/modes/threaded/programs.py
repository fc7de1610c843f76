"""A threaded run's compiled programs and its set-up: the program cache (one compile per shape
across runs), the learner update on its placement, and everything built before the clock starts
(`make_threaded_setup`, fresh or from a `resume.ResumePoint`); the checkpoint layout of the mode."""

from __future__ import annotations

import collections
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from ppo_async import envs
from ppo_async.config import Config, ConfigError, config_to_dict
from ppo_async.core import host_rollout, learner
from ppo_async.core.lag import barrier_lags
from ppo_async.core.learner import hyperparams_from_config
from ppo_async.core.rollout import concat_trajectories, rollout
from ppo_async.core.types import TrainState, snapshot_of
from ppo_async.modes.common import clear_jitted_cache, make_contexts, rollout_metrics, sampler_env_key
from ppo_async.modes.threaded.memory import check_buffer_fits, device_memory_report
from ppo_async.modes.threaded.resume import LearnerStart, ResumePoint
from ppo_async.modes.threaded.shared import LagPlan, RunShared, SamplerStats
from ppo_async.runtime import distributed
from ppo_async.runtime.buffer import RingBuffer
from ppo_async.runtime.param_store import ParamStore
from ppo_async.runtime.placement import LEARNER_AXIS, LearnerPlacement, Placement, learner_placement, resolve_placement
from ppo_async.runtime.xla_flags import program_compiler_options


class ThreadedCheckpoint(NamedTuple):
    """What a threaded run checkpoints: the learner's state, with a seed axis of 1 (as other
    modes). The rest of the learner (RNG key, KL controller, sample totals) is in the
    checkpoint's metadata (`resume.mode_state`)."""

    train_state: TrainState  # leaves [1, ...]


def threaded_checkpoint_like(config: Config) -> ThreadedCheckpoint:
    """Abstract (shape/dtype) `ThreadedCheckpoint` of a config, for restoring (nothing is computed)."""
    _, rollout_ctx, learner_ctx = make_contexts(config)
    state = jax.eval_shape(
        lambda k: learner.init_train_state(learner_ctx, k, rollout_ctx.env.obs_shape), jax.random.PRNGKey(0)
    )
    return ThreadedCheckpoint(jax.tree.map(lambda x: jax.ShapeDtypeStruct((1,) + x.shape, x.dtype), state))


def threaded_checkpoint(train_state: TrainState) -> ThreadedCheckpoint:
    """The learner's state on the host with a seed axis of 1, as other modes checkpoint theirs."""
    return ThreadedCheckpoint(jax.tree.map(lambda x: np.asarray(x)[None], jax.device_get(distributed.local_value(train_state))))


def make_learner_update(config: Config, placement: Placement, lag_buckets: int) -> LearnerPlacement:
    """The learner update on its devices (`placement.learner_placement`: one device, several,
    or every process's; with several processes and `learner_sync = "batch"` this process's own,
    on the batch gathered from every process). The update's metrics also hold the consumed rollout's episode metrics
    (`rollout_metrics`), so the learner thread fetches everything in one transfer and runs no
    eager device ops."""
    multi_process = bool(placement.mesh_devices)
    gather_batch = multi_process and config.learner_sync == "batch"  # else gradients all-reduced across processes
    devices = placement.learner_devices if gather_batch else placement.update_devices
    sharded = len(devices) > 1 or (multi_process and not gather_batch)
    _, _, ctx = make_contexts(config, lag_buckets=lag_buckets, axis_name=LEARNER_AXIS if sharded else None)
    built = learner_placement(ctx, devices, multi_process=multi_process and not gather_batch, gather_batch=gather_batch)

    def update(state, trajectory, key, hparams):
        state, metrics = built.update(state, trajectory, key, hparams)
        return state, {**metrics, **rollout_metrics(trajectory.stats)}

    return built._replace(update=jax.jit(update, compiler_options=program_compiler_options()))


def barrier_lags_of(config: Config) -> np.ndarray | None:
    """The lag of each sampler's chunk in each learner iteration of a barrier config
    (`core.lag.barrier_lags`: lag.* drawn as the simulated mode draws it), int32 `[I, S]`;
    None without a barrier (the lag emerges from timing).

    Raises:
      ConfigError: a bad replay file (lag.replay_path), or lag.max_lag below a lag the schedule
        asks for (the stale filter would drop chunks made that old on purpose, and a batch
        dropped whole moves no version, which the schedule counts on).
    """
    if not config.threaded.barrier:
        return None
    lags = barrier_lags(config.lag, config.num_iterations, config.effective_num_samplers)
    largest = int(lags.max(initial=0))
    if config.lag.max_lag is not None and largest > config.lag.max_lag:
        raise ConfigError(f"lag.max_lag = {config.lag.max_lag} is invalid for this barrier run: its lag schedule asks for "
                          f"lag {largest}, whose chunks the stale filter would drop; set lag.max_lag >= {largest} or None")
    return lags


def lag_buckets_of(config: Config) -> int:
    """Length of the lag histogram: max_lag + 2 (the last counts the dropped), else 16 (the last a catch-all)."""
    return (config.lag.max_lag + 2) if config.lag.max_lag is not None else 16


# Fields of a threaded config that shape no compiled program: runs that differ only in them
# (a sweep over samplers without a barrier, buffer length, refresh lag, latency, seeds, traced
# hyperparameters) reuse one set of compiled functions. (The top-level num_samplers is left out
# with the other top-level fields; "num_samplers" here is its deprecated spelling, None.)
_PROGRAM_FREE_THREADED = ("num_samplers", "refresh_lag", "min_refresh_interval_s", "buffer_capacity", "full_policy",
                          "sampler_step_latency_ms", "latency_jitter", "timeout_s", "kl_target", "kl_window", "kl_quantile")
_PROGRAM_TOP = ("env", "env_options", "mode", "num_seeds", "total_env_steps", "rollout", "ppo", "network", "threaded")
_PROGRAMS_KEPT = 8


def program_key(config: Config, sampler_devices: tuple, learner_devices: tuple, lag_buckets: int) -> str:
    """A string equal for two threaded configs exactly when their compiled programs are the same:
    env, rollout shape, network, static PPO fields, batch chunks, devices and lag buckets
    (traced hyperparameters, seeds and the sampler / buffer knobs are left out)."""
    data = {name: value for name, value in config_to_dict(config).items() if name in _PROGRAM_TOP}
    for name in _PROGRAM_FREE_THREADED:
        data["threaded"].pop(name)
    data["chunks_per_batch"] = config.effective_chunks_per_batch  # (a barrier's: one per sampler)
    data = learner.without_traced_fields(data)
    data["devices"] = [sorted({d.id for d in sampler_devices}), [d.id for d in learner_devices], lag_buckets]
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class ThreadedPrograms:
    """The jitted functions of a threaded run (compiled on first call, kept across runs)."""

    init: Callable  # jit(key -> TrainState)
    rollout_fn: Callable
    reset: Callable
    learner: LearnerPlacement
    merge: Callable


_PROGRAMS: "collections.OrderedDict[str, ThreadedPrograms]" = collections.OrderedDict()


def clear_program_cache() -> None:
    """Forgets every kept compiled program, of threaded and of jitted modes (e.g. after
    patching a function they traced)."""
    _PROGRAMS.clear()
    clear_jitted_cache()


def threaded_programs(config: Config, placement: Placement, lag_buckets: int) -> ThreadedPrograms:
    """The jitted functions of `config`, shared by every run with the same `program_key`
    (the last `_PROGRAMS_KEPT` keys are kept), so a sweep of threaded runs compiles once per shape."""
    key = program_key(config, placement.sampler_devices, placement.update_devices, lag_buckets)
    if key in _PROGRAMS:
        _PROGRAMS.move_to_end(key)
        return _PROGRAMS[key]
    _, rollout_ctx, learner_ctx = make_contexts(config, lag_buckets=lag_buckets)
    num_envs, env = config.rollout.num_envs, rollout_ctx.env
    if env.host_side:  # Gymnasium, EnvPool: each sampler steps its own vector env on the host
        rollout_fn: Callable = host_rollout.HostRollout(rollout_ctx)
        reset: Callable = lambda k, num_samplers: rollout_fn.make_env(host_rollout.seed_of(k), num_samplers)  # noqa: E731
    else:
        rollout_fn = jax.jit(lambda snap, es, k: rollout(rollout_ctx, snap, es, k))
        reset = jax.jit(lambda k: envs.reset_envs(env, k, num_envs))
    programs = ThreadedPrograms(
        init=jax.jit(lambda k: learner.init_train_state(learner_ctx, k, env.obs_shape)),
        rollout_fn=rollout_fn,
        reset=reset,
        learner=make_learner_update(config, placement, lag_buckets),
        merge=jax.jit(concat_trajectories),
    )
    _PROGRAMS[key] = programs
    while len(_PROGRAMS) > _PROGRAMS_KEPT:
        _PROGRAMS.popitem(last=False)
    return programs


@dataclass
class ThreadedSetup:
    """Everything a threaded run builds (and compiles) before its clock starts.

    The rollout is compiled once per sampler device, the merge and the update once; the
    buffer's donated write is warmed up. `bench_threaded.py` times the thread bodies on it.
    """

    config: Config
    placement: Placement
    rollout_fn: Callable  # jit((snapshot, env_state, key) -> (env_state, Trajectory))
    update: Callable  # jit((train_state, trajectory, key, hparams) -> (train_state, metrics)) on the learner devices
    place_trajectory: Callable
    merge: Callable  # jit(list of chunks -> one trajectory)
    train_state: TrainState  # on the learner devices
    learner_key: jax.Array
    start: LearnerStart  # where the learner starts: a fresh run's zeros, or a resumed run's checkpoint
    hparams: Any
    env_states: list  # one per sampler: on its device, or a host_rollout.HostEnv (Gymnasium, EnvPool)
    sampler_keys: list
    example: Any  # one rollout chunk on the buffer device
    compile_seconds: float
    memory: dict[str, Any] = field(default_factory=dict)  # device_memory_report: buffer / snapshot bytes
    lags: np.ndarray | None = None  # a barrier run's [I, S] lag schedule (`barrier_lags_of`); None: from timing

    def batch(self) -> Any:
        """`chunks_per_batch` copies of the example chunk, merged and placed as the learner takes them."""
        chunks = [self.example] * self.config.effective_chunks_per_batch
        return self.place_trajectory(self.merge(chunks) if len(chunks) > 1 else chunks[0])

    def shared(self, buffer: RingBuffer | None = None) -> RunShared:
        """A fresh `RunShared` (new param store at the initial state; a new buffer unless given)."""
        config = self.config
        if buffer is None:
            buffer = RingBuffer(self.example, config.buffer_capacity_chunks, config.threaded.full_policy,
                                device=self.placement.buffer_device)
            buffer.warm_up(self.example)
        stats = [SamplerStats() for _ in range(config.effective_num_samplers)]
        plan = self.plan()
        store = ParamStore(distributed.local_value(snapshot_of(self.train_state)),
                           history=1 if plan is None else plan.ring_size)
        return RunShared(config, store, buffer, threading.Event(), [], stats, self.placement.buffer_device, plan=plan)

    def plan(self) -> LagPlan | None:
        """A fresh `LagPlan` of a barrier run from where its learner starts (None without a
        barrier): samplers work ahead of the learner by at most what the buffer holds."""
        if self.lags is None:
            return None
        version = int(jax.device_get(distributed.local_value(self.train_state.version)))
        run_ahead = self.config.buffer_capacity_chunks // self.config.effective_num_samplers - 1
        return LagPlan(self.lags, self.start.iteration, version, run_ahead)


def _run_keys(config: Config, resumed_at: int = 0) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """`(param_key, env_key, run_key, sampler_key)` of a run; with several processes the params
    and learner key are shared and the samplers' and envs' keys are the process's own. A run
    resumed at iteration `resumed_at` > 0 restarts its samplers and envs with keys folded with
    it (not the first segment's again); its learner key comes from the checkpoint."""
    param_key, env_key, run_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
    sampler_key = jax.random.fold_in(run_key, 1)
    if distributed.is_multi_process(config):
        process = 1 + config.distributed.process_id
        sampler_key, env_key = jax.random.fold_in(sampler_key, process), jax.random.fold_in(env_key, process)
    if resumed_at:
        sampler_key, env_key = jax.random.fold_in(sampler_key, resumed_at), jax.random.fold_in(env_key, resumed_at)
    return param_key, env_key, run_key, sampler_key


def _compile_rollouts(programs: ThreadedPrograms, snapshot: Any, devices: tuple, env_states: list | None,
                      sampler_keys: list) -> Any:
    """Compiles the rollout once per sampler device (a host env's policy step and assembly, stepping
    no env); returns one chunk made there (all zeros for host envs)."""
    example = None
    for device in dict.fromkeys(devices):
        s = devices.index(device)
        placed = jax.device_put(snapshot, device)
        if env_states is None:
            example = programs.rollout_fn.warm_up(placed)
        else:
            _, example = programs.rollout_fn(placed, env_states[s], sampler_keys[s])
    return example


def make_threaded_setup(config: Config, resume: ResumePoint | None = None) -> ThreadedSetup:
    """Placement, compiled rollout / merge / update, train state, envs and keys of a threaded
    config; with `resume`, the learner's train state and key are the checkpoint's."""
    t_start = time.perf_counter()
    lags = barrier_lags_of(config)  # a bad schedule fails before anything compiles
    placement = resolve_placement(config)
    programs = threaded_programs(config, placement, lag_buckets_of(config))
    start = LearnerStart() if resume is None else resume.start
    param_key, env_key, run_key, sampler_key = _run_keys(config, start.iteration)
    place_state = programs.learner.place_state
    if resume is not None:
        train_state, run_key = place_state(resume.train_state), jax.numpy.asarray(resume.key)
    else:
        train_state = place_state(programs.init(param_key))
    hparams, run_key = place_state(hyperparams_from_config(config)), place_state(run_key)
    devices, num_samplers = placement.sampler_devices, config.effective_num_samplers
    host_side = isinstance(programs.rollout_fn, host_rollout.HostRollout)
    sampler_keys = [jax.device_put(k, devices[s]) for s, k in enumerate(jax.random.split(sampler_key, num_samplers))]
    snapshot = distributed.local_value(snapshot_of(train_state))
    env_states = None if host_side else [
        jax.device_put(programs.reset(sampler_env_key(env_key, s)), devices[s]) for s in range(num_samplers)]
    chunk_like = (programs.rollout_fn.trajectory_like(snapshot) if host_side
                  else jax.eval_shape(programs.rollout_fn, snapshot, env_states[0], sampler_keys[0])[1])
    memory = device_memory_report(chunk_like, snapshot_of(train_state)[:2], config.buffer_capacity_chunks, placement.buffer_device)
    check_buffer_fits(config, memory)  # before compiling the rollout and the update
    example = _compile_rollouts(programs, snapshot, devices, env_states, sampler_keys)
    if host_side:  # the simulators, last: nothing above can leave them open on an error
        env_states = [programs.reset(sampler_env_key(env_key, s), num_samplers) for s in range(num_samplers)]
    setup = ThreadedSetup(
        config=config, placement=placement, rollout_fn=programs.rollout_fn, update=programs.learner.update,
        place_trajectory=programs.learner.place_trajectory, merge=programs.merge, train_state=train_state,
        learner_key=run_key, start=start, hparams=hparams, env_states=env_states, sampler_keys=sampler_keys,
        example=jax.device_put(example, placement.buffer_device), compile_seconds=0.0, memory=memory, lags=lags,
    )
    setup.update.lower(train_state, setup.batch(), run_key, hparams).compile()
    setup.compile_seconds = time.perf_counter() - t_start
    return setup
