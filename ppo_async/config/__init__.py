"""Layer 2, `config/`: the typed, frozen configuration of a run.

Holds the choice fields' allowed values (`choices`), the sections (`sections`: one frozen
dataclass per concern, each validating itself at construction and raising `ConfigError` naming
the field, the value and the rule), the run-level `Config` (`run_config`), the one sampler
count and its deprecated spellings (`samplers`; a replayed schedule file's samplers read by
`schedule_file`), which fields act under which others (`applicability`), the shared field
checks (`checks`), which fields a caller set and the env's defaults for the rest (`explicit`,
`preset_table`), dicts and dotted paths (`paths`) and the per-env presets (`presets`).
May import: `ppo_async.errors` and `ppo_async.envs.registry` (to check env names). Nothing
here imports JAX.
"""

from ppo_async.config.checks import check_field_types
from ppo_async.config.paths import (
    config_from_dict,
    config_to_dict,
    convert_deprecated_fields,
    get_path,
    parse_assignments,
    replace_path,
    replace_paths,
)
from ppo_async.config.applicability import (
    LAG_FILTER_FIELDS,
    SCHEDULE_FIELDS,
    check_env_options,
    check_fields_apply,
    check_given_apply,
)
from ppo_async.config.choices import (
    ACTIVATIONS,
    ADVANTAGE_ESTIMATORS,
    DISTRIBUTED_CLUSTERS,
    FULL_POLICIES,
    LAG_SCHEDULES,
    LEARNER_SYNCS,
    MODES,
    OBJECTIVES,
    STATS_UPDATES,
    WEIGHT_INITS,
    ActivationName,
    AdvantageEstimatorName,
    ClusterName,
    FullPolicyName,
    LagScheduleName,
    ModeName,
    ObjectiveName,
    StatsUpdateName,
    WeightInitName,
)
from ppo_async.config.samplers import DEFAULT_THREADED_SAMPLERS, SAMPLER_ALIASES
from ppo_async.config.run_config import (
    DEPRECATED_CADENCES,
    HOST_ONLY_FIELDS,
    Config,
    cadence_iterations,
    check_config_type,
    env_check_deferred,
)
from ppo_async.config.sections import (
    DEFAULT_BUFFER_CHUNKS,
    DEFAULT_KL_WINDOW,
    DistributedConfig,
    EnvOptions,
    LagConfig,
    NetworkConfig,
    PPOConfig,
    RolloutConfig,
    ThreadedConfig,
)
from ppo_async.errors import ConfigError, DistributedFailure

__all__ = [
    "ACTIVATIONS",
    "WEIGHT_INITS",
    "ADVANTAGE_ESTIMATORS",
    "ActivationName",
    "WeightInitName",
    "AdvantageEstimatorName",
    "ClusterName",
    "Config",
    "ConfigError",
    "DEFAULT_BUFFER_CHUNKS",
    "DEFAULT_KL_WINDOW",
    "DISTRIBUTED_CLUSTERS",
    "LEARNER_SYNCS",
    "DistributedConfig",
    "DistributedFailure",
    "EnvOptions",
    "FULL_POLICIES",
    "STATS_UPDATES",
    "StatsUpdateName",
    "FullPolicyName",
    "DEPRECATED_CADENCES",
    "DEFAULT_THREADED_SAMPLERS",
    "SAMPLER_ALIASES",
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
    "check_config_type",
    "check_given_apply",
    "env_check_deferred",
    "cadence_iterations",
    "config_from_dict",
    "config_to_dict",
    "convert_deprecated_fields",
    "get_path",
    "parse_assignments",
    "replace_path",
    "replace_paths",
]
