"""Where a threaded run's parts live, and the one builder of the learner's placement.

`resolve_placement` decides the devices: one per sampler, the learner's, the buffer's.
`learner_placement` builds the learner update and the two functions that put a train state and
a batch where it runs, for the three learners: one device (plain `jit`), several devices of
this process (the data-parallel SGD of Goyal et al. 2017: `jit(shard_map)`, gradients
all-reduced, replicas equal) and the learner devices of every process of a multi-process run
(the same update over a global mesh; host values become global arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppo_async.config import Config, ConfigError
from ppo_async.core.learner import LearnerContext, ppo_update
from ppo_async.core.rollout import merge_rollout_stats
from ppo_async.core.types import RolloutStats, Trajectory
from ppo_async.runtime import distributed


LEARNER_AXIS = "learner"


@dataclass(frozen=True)
class Placement:
    """Where each part runs: one device per sampler, the learner's devices, the buffer's device."""

    sampler_devices: tuple[Any, ...]
    learner_devices: tuple[Any, ...]  # this process's
    mesh_devices: tuple[Any, ...] = ()  # several processes: every process's learner devices (the update's mesh)

    @property
    def buffer_device(self) -> Any:
        return self.learner_devices[0]

    @property
    def update_devices(self) -> tuple[Any, ...]:
        """The devices of the learner update: this process's, or every process's."""
        return self.mesh_devices or self.learner_devices


def _learner_device_count_ok(config: Config, count: int) -> bool:
    """This process's learner batch splits evenly: envs over its devices, each shard into whole minibatches."""
    envs_per_batch = config.rollout.num_envs * config.effective_chunks_per_batch
    return envs_per_batch % count == 0 and (config.local_batch_size // count) % config.ppo.num_minibatches == 0


def _check_device_indices(config: Config, devices: Sequence[Any]) -> None:
    """ConfigError naming `threaded.sampler_devices` / `learner_devices` for an index out of range."""
    tcfg = config.threaded
    for name in ("sampler_devices", "learner_devices"):
        bad = [i for i in getattr(tcfg, name) if i >= len(devices)]
        if bad:
            raise ConfigError(
                f"threaded.{name} = {getattr(tcfg, name)} is invalid: device index {bad[0]} is out of range "
                f"(this machine has {len(devices)} JAX device(s): {list(devices)})"
            )


def _learner_devices(config: Config, devices: Sequence[Any]) -> list[Any]:
    """The learner's devices: explicit indices (checked to split the batch), one device, or the
    largest count <= D // 2 that splits the batch evenly, taken from the end."""
    tcfg = config.threaded
    if tcfg.learner_devices:
        chosen = [devices[i] for i in tcfg.learner_devices]
        if not _learner_device_count_ok(config, len(chosen)):
            raise ConfigError(
                f"threaded.learner_devices = {tcfg.learner_devices} is invalid: {len(chosen)} devices must "
                f"divide the batch's envs (rollout.num_envs * chunks = "
                f"{config.rollout.num_envs * config.effective_chunks_per_batch}) and leave whole minibatches "
                f"(batch {config.local_batch_size} / devices divisible by ppo.num_minibatches = {config.ppo.num_minibatches})"
            )
        return chosen
    if len(devices) == 1:
        return list(devices[:1])
    count = max(c for c in range(1, len(devices) // 2 + 1) if _learner_device_count_ok(config, c))
    return list(devices[len(devices) - count:])


def resolve_placement(config: Config, devices: Sequence[Any] | None = None) -> Placement:
    """Sampler and learner devices of a threaded run (pure given `devices`, default `jax.devices()`).

    Explicit `threaded.sampler_devices` / `learner_devices` are indices into `devices`. Auto
    (empty): one device runs everything; with several, the learner gets the last half (the
    largest count <= D // 2 that splits the batch evenly) and the samplers the first half,
    round-robin. Raises ConfigError naming the field for an index out of range or a learner
    device count that does not split the batch. With several processes the indices are into
    this process's devices, and `mesh_devices` lists every process's learner devices.
    """
    multi = devices is None and distributed.is_multi_process(config)
    devices = list(jax.local_devices() if devices is None else devices)
    _check_device_indices(config, devices)
    learner_devices = _learner_devices(config, devices)
    tcfg = config.threaded
    if tcfg.sampler_devices:
        pool = [devices[i] for i in tcfg.sampler_devices]
    elif len(devices) == 1:
        pool = devices[:1]
    else:
        pool = devices[: len(devices) - len(devices) // 2]
    samplers = tuple(pool[s % len(pool)] for s in range(config.effective_num_samplers))
    mesh = distributed.global_learner_devices(learner_devices) if multi else ()
    return Placement(sampler_devices=samplers, learner_devices=tuple(learner_devices), mesh_devices=mesh)


# ----------------------------------------------------------------------------------------
# The learner's placement
# ----------------------------------------------------------------------------------------


def learner_mesh(devices: Sequence[Any]) -> Mesh:
    """A 1-D mesh over the learner's devices, axis `LEARNER_AXIS`."""
    return Mesh(np.asarray(list(devices)), (LEARNER_AXIS,))


def trajectory_partition(trajectory: Trajectory) -> Trajectory:
    """PartitionSpecs of a data-parallel trajectory: envs split over the learner axis.

    Transitions `[T, N, ...]` and `last_obs [N, ...]` are split along N; the rollout
    statistics (reduced over the whole rollout) are replicated.
    """
    return Trajectory(
        transitions=jax.tree.map(lambda _: PartitionSpec(None, LEARNER_AXIS), trajectory.transitions),
        last_obs=PartitionSpec(LEARNER_AXIS),
        stats=jax.tree.map(lambda _: PartitionSpec(), trajectory.stats),
    )


def replicate(tree: Any, mesh: Mesh) -> Any:
    """A pytree of values equal on every process as global arrays replicated over `mesh`."""
    sharding = NamedSharding(mesh, PartitionSpec())

    def one(x: Any) -> jax.Array:
        value = np.asarray(x)
        return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])

    return jax.tree.map(one, tree)


def global_trajectory(local: Trajectory, mesh: Mesh, specs: Trajectory, stats: RolloutStats) -> Trajectory:
    """This process's share of a learner batch as the global batch: transitions `[T, N_local]`
    and `last_obs [N_local]` become the process's block of `[T, P * N_local]` / `[P * N_local]`
    (split over the mesh as `specs` say); `stats` (already merged over processes) replicated."""
    def place(x: Any, spec: PartitionSpec) -> jax.Array:
        return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), x)

    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    transitions = jax.tree.map(lambda spec, x: place(x, spec), specs.transitions, local.transitions, is_leaf=is_spec)
    return Trajectory(transitions=transitions, last_obs=place(local.last_obs, specs.last_obs), stats=replicate(stats, mesh))


def gathered_stats(local: RolloutStats) -> RolloutStats:
    """The rollout statistics of the global batch: every process's (`process_shares`: one
    all-gather), merged by `rollout.merge_rollout_stats`; equal on every process."""
    return merge_rollout_stats(process_shares(local))


def process_shares(local: Any) -> list[Any]:
    """Every process's value of a pytree with the same structure, shapes and dtypes everywhere,
    in process order, on the host: one all-gather of the leaves' bytes (any dtype)."""
    leaves, treedef = jax.tree.flatten(jax.device_get(local))
    arrays = [np.asarray(x, order="C") for x in leaves]  # (not ascontiguousarray: it makes 0-d arrays 1-d)
    stacked = multihost_utils.process_allgather(np.concatenate([a.reshape(-1).view(np.uint8) for a in arrays]))

    def share(row: np.ndarray) -> Any:
        out, start = [], 0
        for a in arrays:
            out.append(row[start:start + a.nbytes].view(a.dtype).reshape(a.shape))
            start += a.nbytes
        return jax.tree.unflatten(treedef, out)

    return [share(np.asarray(row)) for row in np.asarray(stacked)]


def gathered_trajectory(local: Trajectory) -> Trajectory:
    """Every process's share of a learner batch as the whole batch, on the host, equal on every
    process: transitions `[T, P * N_local]` and `last_obs [P * N_local]` in process order (the
    global batch `global_trajectory` splits over the mesh), rollout statistics merged
    (`merge_rollout_stats`). One all-gather (`process_shares`)."""
    shares = process_shares(local)
    return Trajectory(
        transitions=jax.tree.map(lambda *xs: np.concatenate(xs, axis=1), *[s.transitions for s in shares]),
        last_obs=np.concatenate([s.last_obs for s in shares], axis=0),
        stats=merge_rollout_stats([s.stats for s in shares]),
    )


class LearnerPlacement(NamedTuple):
    """A learner update and where its inputs go."""

    update: Callable  # jit((state, trajectory, key, hparams) -> (state, metrics)) on the learner devices
    place_state: Callable  # a train state (or any pytree equal for every replica) onto the learner devices
    place_trajectory: Callable  # a learner batch onto the learner devices (split along N when sharded)


def _sharded_update(ctx: LearnerContext, mesh: Mesh) -> Callable:
    """`ppo_update` data-parallel over `mesh` with `jit(shard_map)`: each device runs the update on
    its `[T, N / D]` slice; `ctx.axis_name` reduces gradients, advantage statistics and metrics
    over the devices, so the train state and outputs stay replicated."""
    def run(state, trajectory, key, hparams):
        mapped = jax.shard_map(
            lambda st, tr, k, hp: ppo_update(ctx, st, tr, k, hp),
            mesh=mesh,
            in_specs=(PartitionSpec(), trajectory_partition(trajectory), PartitionSpec(), PartitionSpec()),
            out_specs=(PartitionSpec(), PartitionSpec()),
            check_vma=False,  # replicas agree by construction: every update is all-reduced
        )
        return mapped(state, trajectory, key, hparams)

    return jax.jit(run)


def learner_placement(ctx: LearnerContext, devices: Sequence[Any], multi_process: bool = False,
                      gather_batch: bool = False) -> LearnerPlacement:
    """The learner's update and placement on `devices`, the one builder of every learner:

    - one device (and a `ctx` without an axis name): `jit(ppo_update)`; states and batches are
      put on the device (a batch already there, as the threaded learner's are, is not copied);
    - several devices of this process: `_sharded_update` over them (`ctx.axis_name` must be
      `LEARNER_AXIS`); the state replicated, a batch split along its envs N;
    - `multi_process`: the same update over every process's learner `devices`; a host value
      equal on every process becomes a replicated global array, this process's batch its block
      of the global batch (rollout statistics gathered and merged over processes): gradients
      all-reduced across processes in every SGD step (`distributed.learner_sync = "gradients"`);
    - `gather_batch` (several processes, `learner_sync = "batch"`): this process's own learner
      `devices` as above, each batch first gathered from every process (`gathered_trajectory`):
      every process runs the same update on the same batch, so their states stay identical
      with one collective per iteration and none per SGD step.
    """
    devices = list(devices)
    if gather_batch:
        local = learner_placement(ctx, devices)
        return local._replace(place_trajectory=lambda share: local.place_trajectory(gathered_trajectory(share)))
    if len(devices) == 1 and not multi_process and ctx.axis_name is None:
        device = devices[0]
        put = lambda tree: jax.device_put(tree, device)  # noqa: E731
        return LearnerPlacement(jax.jit(lambda st, tr, k, hp: ppo_update(ctx, st, tr, k, hp)), put, put)
    if ctx.axis_name != LEARNER_AXIS:
        raise ValueError(f"ctx.axis_name = {ctx.axis_name!r} is invalid: must be {LEARNER_AXIS!r} for a sharded learner")
    mesh = learner_mesh(devices)
    update = _sharded_update(ctx, mesh)
    if multi_process:
        def place_global(local: Trajectory) -> Trajectory:
            return global_trajectory(local, mesh, trajectory_partition(local), gathered_stats(local.stats))

        return LearnerPlacement(update, lambda tree: replicate(tree, mesh), place_global)
    replicated = NamedSharding(mesh, PartitionSpec())

    def place_split(trajectory: Trajectory) -> Trajectory:
        specs = trajectory_partition(trajectory)
        shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
        return jax.device_put(trajectory, shardings)

    return LearnerPlacement(update, lambda tree: jax.device_put(tree, replicated), place_split)
