"""Tests for `ppo_async.config`: every validation rule (ConfigError naming the dotted field and
the bad value), frozenness, derived sizes, dict round trip, unknown keys, `replace_path`."""

from __future__ import annotations

import dataclasses
import json
import math
import typing

import pytest

import ppo_async as pa
from ppo_async.config import Config, ConfigError, NetworkConfig, PPOConfig, RolloutConfig


def small(**kw) -> Config:
    """A valid config with batch 4 * 8 = 32."""
    kw.setdefault("rollout", RolloutConfig(num_envs=4, num_steps=8))
    kw.setdefault("ppo", PPOConfig(num_epochs=3, num_minibatches=4))
    kw.setdefault("total_env_steps", 100)
    return Config(**kw)


def assert_config_error(build, field: str, value) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build()
    message = str(info.value)
    assert field in message, message
    assert repr(value) in message, message
    return info.value


def test_config_error_is_exported_and_a_value_error():
    assert pa.ConfigError is ConfigError
    assert issubclass(ConfigError, ValueError)


def test_defaults_are_valid():
    config = Config()
    assert config.env == "Pendulum-v1"
    assert config.batch_size == 16 * 64


# (section class, field, bad value, dotted name in the message)
BAD_SECTION_VALUES = [
    (PPOConfig, "learning_rate", -1e-3, "ppo.learning_rate"),
    (PPOConfig, "learning_rate", 0.0, "ppo.learning_rate"),
    (PPOConfig, "learning_rate", math.inf, "ppo.learning_rate"),
    (PPOConfig, "learning_rate", math.nan, "ppo.learning_rate"),
    (PPOConfig, "learning_rate", "0.1", "ppo.learning_rate"),
    (PPOConfig, "clip_eps", 0.0, "ppo.clip_eps"),
    (PPOConfig, "clip_eps", -0.2, "ppo.clip_eps"),
    (PPOConfig, "clip_eps", 1.0, "ppo.clip_eps"),
    (PPOConfig, "clip_eps", 1.5, "ppo.clip_eps"),
    (PPOConfig, "dual_clip", 1.0, "ppo.dual_clip"),
    (PPOConfig, "dual_clip", 0.5, "ppo.dual_clip"),
    (PPOConfig, "dual_clip", math.inf, "ppo.dual_clip"),
    (PPOConfig, "dual_clip", True, "ppo.dual_clip"),
    (PPOConfig, "gamma", 0.0, "ppo.gamma"),
    (PPOConfig, "gamma", 1.01, "ppo.gamma"),
    (PPOConfig, "gamma", -0.5, "ppo.gamma"),
    (PPOConfig, "gae_lambda", 0.0, "ppo.gae_lambda"),
    (PPOConfig, "gae_lambda", 1.5, "ppo.gae_lambda"),
    (PPOConfig, "num_epochs", 0, "ppo.num_epochs"),
    (PPOConfig, "num_epochs", 2.0, "ppo.num_epochs"),
    (PPOConfig, "num_minibatches", 0, "ppo.num_minibatches"),
    (PPOConfig, "value_clip_eps", 0.0, "ppo.value_clip_eps"),
    (PPOConfig, "vf_coef", -0.5, "ppo.vf_coef"),
    (PPOConfig, "ent_coef", -0.01, "ppo.ent_coef"),
    (PPOConfig, "max_grad_norm", 0.0, "ppo.max_grad_norm"),
    (PPOConfig, "adam_eps", 0.0, "ppo.adam_eps"),
    (PPOConfig, "anneal_lr", "false", "ppo.anneal_lr"),
    (PPOConfig, "normalize_advantages", 1, "ppo.normalize_advantages"),
    (RolloutConfig, "num_envs", 0, "rollout.num_envs"),
    (RolloutConfig, "num_envs", -2, "rollout.num_envs"),
    (RolloutConfig, "num_envs", True, "rollout.num_envs"),
    (RolloutConfig, "num_steps", 0, "rollout.num_steps"),
    (RolloutConfig, "obs_clip", 0.0, "rollout.obs_clip"),
    (RolloutConfig, "reward_scale", -1.0, "rollout.reward_scale"),
    (RolloutConfig, "normalize_obs", "no", "rollout.normalize_obs"),
    (RolloutConfig, "clip_actions", None, "rollout.clip_actions"),
    (NetworkConfig, "actor_hidden", (0,), "network.actor_hidden"),
    (NetworkConfig, "actor_hidden", (64, -1), "network.actor_hidden"),
    (NetworkConfig, "actor_hidden", (64.0,), "network.actor_hidden"),
    (NetworkConfig, "actor_hidden", (True,), "network.actor_hidden"),
    (NetworkConfig, "actor_hidden", "64", "network.actor_hidden"),
    (NetworkConfig, "critic_hidden", (32, 0), "network.critic_hidden"),
    (NetworkConfig, "activation", "sigmoid", "network.activation"),
    (NetworkConfig, "activation", "Tanh", "network.activation"),
    (NetworkConfig, "init_log_std", 3.0, "network.init_log_std"),
    (NetworkConfig, "init_log_std", -21.0, "network.init_log_std"),
    (NetworkConfig, "init_log_std", math.nan, "network.init_log_std"),
    (NetworkConfig, "init_log_std", "0.0", "network.init_log_std"),
    (NetworkConfig, "shared_torso", "yes", "network.shared_torso"),
    (NetworkConfig, "state_dependent_std", 0, "network.state_dependent_std"),
]


@pytest.mark.parametrize(
    "cls,field,value,dotted", BAD_SECTION_VALUES, ids=[f"{d}={v!r}" for _, _, v, d in BAD_SECTION_VALUES]
)
def test_section_validation_names_field_and_value(cls, field, value, dotted):
    err = assert_config_error(lambda: cls(**{field: value}), dotted, value)
    # the message is "<dotted> = <value> is invalid: <rule>"
    assert str(err).startswith(f"{dotted} = ")


def test_weight_init_error_lists_the_allowed_ones():
    err = assert_config_error(lambda: NetworkConfig(init="xavier"), "network.init", "xavier")
    assert "orthogonal" in str(err) and "lecun" in str(err)


def test_activation_error_lists_the_allowed_ones():
    err = assert_config_error(lambda: NetworkConfig(activation="sigmoid"), "network.activation", "sigmoid")
    for name in ("tanh", "relu", "gelu", "silu"):
        assert name in str(err)


# Every choice field: its annotation is the Literal its allowed-values tuple is derived from.
CHOICE_FIELDS = [
    (Config, "mode", "MODES"),
    (PPOConfig, "advantage_estimator", "ADVANTAGE_ESTIMATORS"),
    (PPOConfig, "objective", "OBJECTIVES"),
    (NetworkConfig, "activation", "ACTIVATIONS"),
    (NetworkConfig, "init", "WEIGHT_INITS"),
    (pa.LagConfig, "schedule", "LAG_SCHEDULES"),
    (pa.ThreadedConfig, "full_policy", "FULL_POLICIES"),
    (RolloutConfig, "stats_update", "STATS_UPDATES"),
    (pa.config.DistributedConfig, "cluster", "DISTRIBUTED_CLUSTERS"),
    (pa.config.DistributedConfig, "learner_sync", "LEARNER_SYNCS"),
]


@pytest.mark.parametrize("cls,field,constant", CHOICE_FIELDS, ids=[c for _, _, c in CHOICE_FIELDS])
def test_allowed_values_are_the_literal_of_the_annotation(cls, field, constant):
    hint = typing.get_type_hints(cls)[field]
    assert typing.get_origin(hint) is typing.Literal
    assert getattr(pa.config, constant) == typing.get_args(hint)
    default = getattr(cls(), field)
    assert default in typing.get_args(hint)


def test_every_literal_field_has_its_tuple():
    """No choice field is left without a derived tuple (a new Literal field joins CHOICE_FIELDS)."""
    sections = [Config, *(t for t in typing.get_type_hints(Config).values() if dataclasses.is_dataclass(t))]
    hints = [(cls, name, hint) for cls in sections for name, hint in typing.get_type_hints(cls).items()]
    literal_fields = {(cls, name) for cls, name, hint in hints if typing.get_origin(hint) is typing.Literal}
    assert literal_fields == {(cls, field) for cls, field, _ in CHOICE_FIELDS}


@pytest.mark.parametrize("cls,field,constant", CHOICE_FIELDS, ids=[c for _, _, c in CHOICE_FIELDS])
@pytest.mark.parametrize("bad", ["nope", 3, None, True])
def test_a_value_outside_the_literal_is_refused_listing_the_choices(cls, field, constant, bad):
    prefix = {Config: "", PPOConfig: "ppo.", NetworkConfig: "network.", pa.LagConfig: "lag.",
              pa.ThreadedConfig: "threaded.", pa.config.DistributedConfig: "distributed.", RolloutConfig: "rollout."}[cls]
    with pytest.raises(ConfigError) as info:
        cls(**{field: bad})
    assert str(info.value) == f"{prefix}{field} = {bad!r} is invalid: must be one of {getattr(pa.config, constant)}"


# Wrong types: the exact messages (unchanged since the checker parsed annotation strings).
WRONG_TYPES = [
    (lambda: PPOConfig(dual_clip="3"), "ppo.dual_clip = '3' is invalid: must be a number or None, not str"),
    (lambda: PPOConfig(num_epochs=True), "ppo.num_epochs = True is invalid: must be an integer, not bool"),
    (lambda: PPOConfig(learning_rate=None), "ppo.learning_rate = None is invalid: must be a number, not NoneType"),
    (lambda: RolloutConfig(normalize_obs=1), "rollout.normalize_obs = 1 is invalid: must be True or False, not int"),
    (lambda: pa.LagConfig(K=8.0), "lag.K = 8.0 is invalid: must be an integer, not float"),
    (lambda: pa.LagConfig(per_sampler=3), "lag.per_sampler = 3 is invalid: must be a sequence, not int"),
    (lambda: pa.LagConfig(replay_path=5), "lag.replay_path = 5 is invalid: must be a string or None, not int"),
    (lambda: pa.ThreadedConfig(kl_window=2.5), "threaded.kl_window = 2.5 is invalid: must be an integer or None, not float"),
    (lambda: pa.ThreadedConfig(sampler_devices="0"), "threaded.sampler_devices = '0' is invalid: must be a sequence, not str"),
    (lambda: pa.EnvOptions(backend=1), "env_options.backend = 1 is invalid: must be a string or None, not int"),
    (lambda: Config(run_dir=3), "run_dir = 3 is invalid: must be a string or None, not int"),
    (lambda: Config(env=None), "env = None is invalid: must be a string, not NoneType"),
]


@pytest.mark.parametrize("build,message", WRONG_TYPES, ids=[str(i) for i in range(len(WRONG_TYPES))])
def test_wrong_type_message(build, message):
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value) == message


def test_ints_are_numbers_and_none_only_where_allowed():
    assert PPOConfig(learning_rate=1, dual_clip=None).learning_rate == 1
    assert pa.LagConfig(per_sampler=[1, 2]).per_sampler == (1, 2)  # a list is a sequence, stored as a tuple


def test_field_rules_come_from_resolved_annotations_and_skip_sections():
    from ppo_async.config.checks import field_rules

    rules = dict(field_rules(Config))
    assert "ppo" not in rules and "env_options" not in rules  # nested sections validate themselves
    assert rules["run_dir"].optional and rules["run_dir"].types == (str,)
    assert rules["mode"].choices == pa.config.MODES
    assert dict(field_rules(PPOConfig))["dual_clip"].types == (int, float)
    assert field_rules(Config) is field_rules(Config)  # cached per class


def test_unit_interval_bounds_are_inclusive_at_one():
    ppo = PPOConfig(gamma=1.0, gae_lambda=1.0, clip_eps=0.999, dual_clip=1.0001)
    assert (ppo.gamma, ppo.gae_lambda) == (1.0, 1.0)


def test_network_widths_list_is_stored_as_tuple():
    net = NetworkConfig(actor_hidden=[8, 4], critic_hidden=[3])
    assert net.actor_hidden == (8, 4) and net.critic_hidden == (3,)


BAD_TOP_LEVEL = [
    ("seed", -1, "seed"),
    ("num_seeds", 0, "num_seeds"),
    ("total_env_steps", 0, "total_env_steps"),
    ("mode", "async", "mode"),
]


@pytest.mark.parametrize("field,value,dotted", BAD_TOP_LEVEL, ids=[f for f, _, _ in BAD_TOP_LEVEL])
def test_top_level_validation(field, value, dotted):
    assert_config_error(lambda: small(**{field: value}), dotted, value)


def test_batch_must_divide_into_minibatches():
    err = assert_config_error(
        lambda: Config(
            rollout=RolloutConfig(num_envs=3, num_steps=5),
            ppo=PPOConfig(num_minibatches=4),
            total_env_steps=1000,
        ),
        "ppo.num_minibatches",
        4,
    )
    assert "15" in str(err)  # the batch size 3 * 5
    # 3 * 5 = 15 divides into 5 minibatches of 3
    assert Config(rollout=RolloutConfig(num_envs=3, num_steps=5), ppo=PPOConfig(num_minibatches=5),
                  total_env_steps=1000).minibatch_size == 3


def test_more_minibatches_than_samples_is_rejected():
    assert_config_error(
        lambda: small(rollout=RolloutConfig(num_envs=1, num_steps=2), ppo=PPOConfig(num_minibatches=4)),
        "ppo.num_minibatches",
        4,
    )


def test_total_env_steps_must_cover_one_batch():
    err = assert_config_error(lambda: small(total_env_steps=31), "total_env_steps", 31)
    assert "32" in str(err)
    assert small(total_env_steps=32).num_iterations == 1


def test_unknown_env_lists_known_names():
    err = assert_config_error(lambda: small(env="NoSuchEnv-v9"), "env", "NoSuchEnv-v9")
    message = str(err)
    assert "CartPole-v1" in message and "Pendulum-v1" in message


def test_wrong_section_type_is_rejected():
    assert_config_error(lambda: small(ppo={"clip_eps": 0.1}), "ppo", {"clip_eps": 0.1})


def test_frozen():
    config = small()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seed = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.ppo.clip_eps = 0.3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.rollout.num_envs = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.network.activation = "relu"  # type: ignore[misc]


def test_derived_sizes_hand_checked():
    config = small()  # 4 envs x 8 steps, 3 epochs x 4 minibatches, 100 env steps
    assert config.batch_size == 32
    assert config.minibatch_size == 8
    assert config.num_iterations == 3  # floor(100 / 32)
    assert config.sgd_steps_per_iteration == 12
    other = Config(
        rollout=RolloutConfig(num_envs=16, num_steps=64),
        ppo=PPOConfig(num_epochs=5, num_minibatches=16),
        total_env_steps=300_000,
    )
    assert other.batch_size == 1024
    assert other.minibatch_size == 64
    assert other.num_iterations == 292  # 300000 // 1024 = 292 (292 * 1024 = 299008)
    assert other.sgd_steps_per_iteration == 80


def batch_1024(**kw) -> Config:
    """A valid config with batch 8 * 128 = 1,024 and 10 iterations."""
    return Config(rollout=RolloutConfig(num_envs=8, num_steps=128), total_env_steps=10 * 1024, **kw)


def test_cadences_count_env_steps_rounded_to_whole_iterations():
    """eval_every_steps / checkpoint_every_steps in learner iterations of batch 1,024: 3,000 /
    1,024 = 2.93 -> 3; 2,500 / 1,024 = 2.44 -> 2; 100 -> at least 1; 0 stays off."""
    from ppo_async.config import cadence_iterations

    assert [batch_1024(eval_every_steps=n).eval_every_iterations for n in (3000, 2500, 100, 0)] == [3, 2, 1, 0]
    assert [batch_1024(run_dir="r", checkpoint_every_steps=n).checkpoint_every_iterations for n in (3000, 2500, 100, 0)] == [3, 2, 1, 0]
    assert (cadence_iterations(100_000, 2048), cadence_iterations(0, 2048)) == (49, 0)  # the mujoco benchmark's cadence
    assert batch_1024(eval_every_steps=3000).replace(rollout=RolloutConfig(num_envs=4, num_steps=128)).eval_every_iterations == 6


@pytest.mark.parametrize("old, new, extra", [("eval_every", "eval_every_steps", {}),
                                             ("checkpoint_every", "checkpoint_every_steps", {"run_dir": "r"})])
def test_a_deprecated_iteration_cadence_warns_and_is_stored_as_env_steps(old, new, extra):
    """`eval_every = 3` (learner iterations, deprecated for one release) is `eval_every_steps =
    3 * 1,024`, said by a FutureWarning naming the new field and its value; the old field reads
    0 again, so config.json, equality and resume see one spelling. Both at once are refused."""
    message = rf"{old} = 3 \(learner iterations\) is deprecated .*use {new} = 3072 \(env steps: 3 x batch_size 1024\)"
    with pytest.warns(FutureWarning, match=message):
        config = batch_1024(**{old: 3}, **extra)
    assert (getattr(config, old), getattr(config, new)) == (0, 3072)
    assert config == batch_1024(**{new: 3072}, **extra)
    assert (pa.config_to_dict(config)[old], pa.config_to_dict(config)[new]) == (0, 3072)
    with pytest.warns(FutureWarning, match=rf"{old} = 2 .*use {new} = 2048"):
        assert getattr(batch_1024(**extra).replace(**{old: 2}), new) == 2048  # replace() too
    with pytest.raises(ConfigError, match=rf"{old} = 3 is invalid: {new} = 3000 is set too: set {new} \(env steps\) alone"):
        batch_1024(**{old: 3, new: 3000}, **extra)


def test_a_stored_config_with_an_iteration_cadence_converts_silently():
    """A config.json or benchmark.json written before the cadences counted env steps (every
    committed result holds `eval_every`) reads with the steps of the batch the rest of the dict
    makes, and no warning: its reader typed nothing."""
    import warnings

    from ppo_async.config import config_from_dict, config_to_dict, convert_deprecated_fields

    data = config_to_dict(Config(rollout=RolloutConfig(num_envs=16, num_steps=128), run_dir="r"))  # batch 2,048
    for key in ("eval_every_steps", "checkpoint_every_steps"):
        del data[key]
    data.update(eval_every=49, checkpoint_every=49)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config = config_from_dict(data)
        converted = convert_deprecated_fields(data)
    assert (config.eval_every_steps, config.checkpoint_every_steps, config.eval_every, config.checkpoint_every) == (
        100_352, 100_352, 0, 0)
    assert converted == config_to_dict(config) and data["eval_every"] == 49  # (the dict given is left as it was)
    with pytest.raises(ConfigError, match="eval_every = 49 is invalid: eval_every_steps = 1000 is set too"):
        config_from_dict({**data, "eval_every_steps": 1000})


def test_replace_revalidates():
    config = small()
    assert config.replace(seed=5).seed == 5
    assert config.replace(seed=5).ppo == config.ppo
    with pytest.raises(ConfigError, match="total_env_steps"):
        config.replace(total_env_steps=1)


def test_dict_round_trip_is_json_and_equal():
    config = small(
        env="CartPole-v1",
        seed=3,
        num_seeds=2,
        run_dir="/tmp/x",
        ppo=PPOConfig(num_minibatches=2, dual_clip=3.0, value_clip_eps=0.1, clip_eps=0.15),
        network=NetworkConfig(actor_hidden=(8, 4), critic_hidden=(5,), activation="relu", shared_torso=True),
    )
    data = pa.config_to_dict(config)
    assert data["ppo"]["dual_clip"] == 3.0 and data["ppo"]["clip_eps"] == 0.15
    assert data["network"]["actor_hidden"] == [8, 4]  # JSON lists
    assert data["rollout"] == {
        "num_envs": 4, "num_steps": 8, "normalize_obs": True, "obs_clip": 10.0,
        "reward_scale": 0.1, "normalize_reward": False, "reward_clip": 10.0, "clip_actions": True, "stats_update": "after_sgd",
    }
    text = json.dumps(data)
    back = pa.config_from_dict(json.loads(text))
    assert back == config
    assert back.network.actor_hidden == (8, 4)
    # None survives the JSON trip
    plain = small()
    assert pa.config_from_dict(json.loads(json.dumps(pa.config_to_dict(plain)))) == plain
    assert pa.config_to_dict(plain)["ppo"]["dual_clip"] is None


def test_from_dict_partial_uses_defaults_and_validates():
    config = pa.config_from_dict({"env": "CartPole-v1", "total_env_steps": 2048, "ppo": {"clip_eps": 0.3}})
    assert config.env == "CartPole-v1" and config.ppo.clip_eps == 0.3
    assert config.ppo.num_epochs == PPOConfig().num_epochs
    with pytest.raises(ConfigError, match="ppo.gamma"):
        pa.config_from_dict({"ppo": {"gamma": 2.0}})


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"bogus": 1}, "bogus"),
        ({"ppo": {"clip": 0.1}}, "clip"),
        ({"network": {"hidden": [4]}}, "hidden"),
        ({"rollout": {"num_env": 4}}, "num_env"),
        ({"ppo": 0.1}, "ppo"),
    ],
)
def test_from_dict_unknown_keys_raise(data, needle):
    with pytest.raises(ConfigError) as info:
        pa.config_from_dict(data)
    assert needle in str(info.value)


def test_from_dict_rejects_non_mapping():
    with pytest.raises(ConfigError):
        pa.config_from_dict([("env", "CartPole-v1")])  # type: ignore[arg-type]


def test_replace_path():
    config = small()
    changed = pa.replace_path(config, "ppo.clip_eps", 0.1)
    assert changed.ppo.clip_eps == 0.1
    assert changed.ppo.num_minibatches == config.ppo.num_minibatches
    assert changed.rollout == config.rollout and changed.network == config.network
    assert config.ppo.clip_eps == 0.2  # the original is untouched
    assert pa.replace_path(config, "seed", 9).seed == 9
    assert pa.replace_path(config, "network.actor_hidden", [7]).network.actor_hidden == (7,)
    assert pa.replace_path(config, "env", "CartPole-v1").env == "CartPole-v1"


def test_replace_path_errors():
    config = small()
    with pytest.raises(ConfigError, match="ppo.clip_eps"):
        pa.replace_path(config, "ppo.clip_eps", 1.5)  # validated again
    with pytest.raises(ConfigError, match="ppo.nope"):
        pa.replace_path(config, "ppo.nope", 1)
    with pytest.raises(ConfigError, match="nosection"):
        pa.replace_path(config, "nosection.clip_eps", 1)
    with pytest.raises(ConfigError):
        pa.replace_path(config, "ppo.clip_eps.deeper", 1)


def test_parse_assignments_reads_json_values_and_names_a_bad_item():
    from ppo_async.config import parse_assignments

    assert parse_assignments(["ppo.gamma=0.99", "network.actor_hidden=[8, 4]", "rollout.normalize_reward=true",
                              "env=gymnasium/Hopper-v5", "lag.max_lag=null"]) == {
        "ppo.gamma": 0.99, "network.actor_hidden": [8, 4], "rollout.normalize_reward": True,
        "env": "gymnasium/Hopper-v5", "lag.max_lag": None}
    with pytest.raises(ConfigError, match=r"'ppo.gamma' is not a dotted.field=value assignment"):
        parse_assignments(["ppo.gamma"])


def test_one_override_syntax_everywhere_in_either_spelling():
    """`ppo.clip_eps` and `ppo.clip-eps` (the flag's spelling) name one field in `--set`
    assignments, `replace_path(s)`, sweep grids and `Config.replace`, which takes dotted
    keys beside top-level ones and keeps the rest of the section and of the env's preset."""
    from ppo_async.config import get_path, parse_assignments, replace_paths
    from ppo_async.study.sweep import expand_grid

    assert parse_assignments(["ppo.clip-eps=0.1", "--network.actor-hidden=[8, 8]", "ppo.clip_eps=0.3"]) == {
        "ppo.clip_eps": 0.3, "network.actor_hidden": [8, 8]}
    config = small()
    assert pa.replace_path(config, "ppo.clip-eps", 0.1) == pa.replace_path(config, "ppo.clip_eps", 0.1)
    assert replace_paths(config, {"ppo.num-epochs": 2}).ppo.num_epochs == 2
    assert get_path(config, "rollout.num-envs") == config.rollout.num_envs
    (point, swept), = expand_grid(config, {"ppo.clip-eps": [0.15]})
    assert point == {"ppo.clip_eps": 0.15} and swept.ppo.clip_eps == 0.15
    with pytest.raises(ConfigError, match="grid names 'ppo.clip_eps' twice"):
        expand_grid(config, {"ppo.clip-eps": [0.1], "ppo.clip_eps": [0.2]})

    hopper = pa.Config(env="gymnasium/Hopper-v5")
    changed = hopper.replace({"ppo.clip_eps": 0.1}, seed=3)
    assert (changed.ppo.clip_eps, changed.seed, changed.ppo.num_epochs) == (0.1, 3, 10)  # the preset's epochs kept
    assert changed == replace_paths(hopper, {"ppo.clip_eps": 0.1, "seed": 3})
    assert hopper.replace(**{"ppo.clip-eps": 0.1}, seed=3) == changed
    assert "ppo.num_epochs" in changed.preset_fields and "ppo.clip_eps" not in changed.preset_fields
    moved = changed.replace(env="Pendulum-v1")  # the new env's defaults, what the caller set kept
    at_once = hopper.replace({"ppo.clip_eps": 0.1}, env="Pendulum-v1", seed=3)  # one call: the same config
    assert at_once == moved and at_once.ppo.gamma == PPOConfig().gamma
    assert (moved.mode, moved.ppo.num_epochs, moved.ppo.clip_eps, moved.seed) == ("sync", PPOConfig().num_epochs, 0.1, 3)
    with pytest.raises(ConfigError, match=r"unknown config field 'ppo.clip_ep'; did you mean 'ppo.clip_eps'"):
        hopper.replace({"ppo.clip_ep": 0.1})
    with pytest.raises(ConfigError, match=r"ppo.clip_eps = -1 is invalid"):
        hopper.replace({"ppo.clip_eps": -1})
