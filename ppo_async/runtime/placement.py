"""Where the learner's state and batches live, and the data-parallel update over a mesh of
devices (the data-parallel SGD of Goyal et al. 2017: gradients all-reduced, replicas equal)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ppo_async.core.learner import LearnerContext, ppo_update
from ppo_async.core.types import Trajectory


LEARNER_AXIS = "learner"

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

def data_parallel_update(ctx: LearnerContext, devices: Sequence[Any]) -> tuple[Callable, Callable, Callable]:
    """`ppo_update` data-parallel over `devices` with `jit(shard_map)`.

    Each device runs the update on its `[T, N / D]` slice of the trajectory; `ctx.axis_name`
    must be `LEARNER_AXIS` so gradients, advantage statistics and metrics are reduced over
    devices and every replica stays identical (train state and outputs are replicated).

    Returns:
      `(update, place_state, place_trajectory)`: the jitted update
      `(state, trajectory, key, hparams) -> (state, metrics)` and two functions that put a
      train state (replicated) or a trajectory (split along N) onto the mesh.
    """
    if ctx.axis_name != LEARNER_AXIS:
        raise ValueError(f"ctx.axis_name = {ctx.axis_name!r} is invalid: must be {LEARNER_AXIS!r}")
    mesh = learner_mesh(devices)
    replicated = NamedSharding(mesh, PartitionSpec())

    def run(state, trajectory, key, hparams):
        specs = trajectory_partition(trajectory)
        mapped = jax.shard_map(
            lambda st, tr, k, hp: ppo_update(ctx, st, tr, k, hp),
            mesh=mesh,
            in_specs=(PartitionSpec(), specs, PartitionSpec(), PartitionSpec()),
            out_specs=(PartitionSpec(), PartitionSpec()),
            check_vma=False,  # replicas agree by construction: every update is all-reduced
        )
        return mapped(state, trajectory, key, hparams)

    def place_state(tree: Any) -> Any:
        return jax.device_put(tree, replicated)

    def place_trajectory(trajectory: Trajectory) -> Trajectory:
        specs = trajectory_partition(trajectory)
        shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
        return jax.device_put(trajectory, shardings)

    return jax.jit(run), place_state, place_trajectory
