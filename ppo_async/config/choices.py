"""The allowed values of every choice field of the config, written once: the `Literal` annotates
the field (tyro and `check_field_types` read it) and the tuple beside it is derived from it."""

from __future__ import annotations

from typing import Literal, get_args

ModeName = Literal["sync", "simulated", "threaded"]
MODES: tuple[str, ...] = get_args(ModeName)

LagScheduleName = Literal["fixed", "per_sampler", "uniform", "geometric", "straggler", "replay"]
LAG_SCHEDULES: tuple[str, ...] = get_args(LagScheduleName)

ObjectiveName = Literal["ppo", "decoupled"]
OBJECTIVES: tuple[str, ...] = get_args(ObjectiveName)

AdvantageEstimatorName = Literal["gae", "vtrace"]
ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimatorName)

ActivationName = Literal["tanh", "relu", "gelu", "silu"]
ACTIVATIONS: tuple[str, ...] = get_args(ActivationName)

WeightInitName = Literal["orthogonal", "lecun"]
WEIGHT_INITS: tuple[str, ...] = get_args(WeightInitName)

StatsUpdateName = Literal["after_sgd", "before_sgd"]
STATS_UPDATES: tuple[str, ...] = get_args(StatsUpdateName)

FullPolicyName = Literal["overwrite_oldest", "block"]
FULL_POLICIES: tuple[str, ...] = get_args(FullPolicyName)

# distributed.cluster: names of JAX's cluster detection (jax._src.clusters)
ClusterName = Literal["none", "slurm"]
LearnerSync = Literal["auto", "batch", "gradients"]
LEARNER_SYNCS: tuple[str, ...] = get_args(LearnerSync)
BATCH_SYNC_MAX_SAMPLES = 65_536
"""`distributed.learner_sync = "auto"` gathers the batch up to this many samples per learner
iteration (over every process), else all-reduces gradients."""
DISTRIBUTED_CLUSTERS: tuple[str, ...] = get_args(ClusterName)
