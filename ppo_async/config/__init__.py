"""Layer 2, `config/`: the typed, frozen configuration of a run.

Holds the sections (`sections`: one frozen dataclass per concern, each validating itself at
construction and raising `ConfigError` naming the field, the value and the rule), the shared
field checks (`checks`), dicts and dotted paths (`paths`) and the per-env presets (`presets`).
May import: `ppo_async.errors` and `ppo_async.envs.registry` (to check env names). Nothing
here imports JAX.
"""

from ppo_async.config.checks import check_field_types
from ppo_async.config.paths import (
    config_from_dict,
    config_to_dict,
    get_path,
    parse_assignments,
    replace_path,
    replace_paths,
)
from ppo_async.config.sections import (
    ACTIVATIONS,
    ADVANTAGE_ESTIMATORS,
    DEFAULT_BUFFER_CHUNKS,
    DEFAULT_KL_WINDOW,
    DISTRIBUTED_CLUSTERS,
    FULL_POLICIES,
    HOST_ONLY_FIELDS,
    LAG_FILTER_FIELDS,
    LAG_SCHEDULES,
    MODES,
    OBJECTIVES,
    SCHEDULE_FIELDS,
    ActivationName,
    AdvantageEstimatorName,
    ClusterName,
    Config,
    DistributedConfig,
    EnvOptions,
    FullPolicyName,
    LagConfig,
    LagScheduleName,
    ModeName,
    NetworkConfig,
    ObjectiveName,
    PPOConfig,
    RolloutConfig,
    ThreadedConfig,
    check_env_options,
    check_fields_apply,
)
from ppo_async.errors import ConfigError, DistributedFailure

__all__ = [
    "ACTIVATIONS",
    "ADVANTAGE_ESTIMATORS",
    "ActivationName",
    "AdvantageEstimatorName",
    "ClusterName",
    "Config",
    "ConfigError",
    "DEFAULT_BUFFER_CHUNKS",
    "DEFAULT_KL_WINDOW",
    "DISTRIBUTED_CLUSTERS",
    "DistributedConfig",
    "DistributedFailure",
    "EnvOptions",
    "FULL_POLICIES",
    "FullPolicyName",
    "HOST_ONLY_FIELDS",
    "LAG_FILTER_FIELDS",
    "LAG_SCHEDULES",
    "LagConfig",
    "LagScheduleName",
    "MODES",
    "ModeName",
    "NetworkConfig",
    "OBJECTIVES",
    "ObjectiveName",
    "PPOConfig",
    "RolloutConfig",
    "SCHEDULE_FIELDS",
    "ThreadedConfig",
    "check_env_options",
    "check_field_types",
    "check_fields_apply",
    "config_from_dict",
    "config_to_dict",
    "get_path",
    "parse_assignments",
    "replace_path",
    "replace_paths",
]
