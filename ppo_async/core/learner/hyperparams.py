"""Hyperparameters that travel as arrays (one compiled update serves a sweep) and the SGD
shape of a sweep group (`SgdSlots`)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Sequence

import chex
import jax.numpy as jnp

from ppo_async.config import Config, get_path


class Hyperparams(NamedTuple):
    """Shape-preserving hyperparameters as float32 scalars (traced inside jit; sweepable).

    `dual_clip = inf` is plain PPO: max(obj, inf * A) = obj for A < 0, bit for bit, so one
    compiled update serves `dual_clip=None` and numeric values alike. `max_lag = inf` keeps
    every sample.
    """

    learning_rate: chex.Array
    gamma: chex.Array
    gae_lambda: chex.Array
    clip_eps: chex.Array
    dual_clip: chex.Array  # inf = off
    value_clip_eps: chex.Array  # ignored unless LearnerContext.use_value_clip
    vf_coef: chex.Array
    ent_coef: chex.Array
    max_grad_norm: chex.Array
    reward_scale: chex.Array
    rho_bar: chex.Array  # V-trace truncations (used when advantage_estimator == "vtrace")
    c_bar: chex.Array
    value_update_every: chex.Array  # the critic is updated when version % k == 0
    max_lag: chex.Array  # stale filter: samples with lag > max_lag get weight 0 (inf = off)
    decoupled: chex.Array  # 1.0: decoupled objective (clip to pi_prox), 0.0: PPO (clip to mu)
    is_clip: chex.Array  # truncation of pi_prox / mu (inf = off)
    prox_ewma: chex.Array  # EWMA decay of the proximal params (used when LearnerContext.use_prox_ewma)
    # The SGD shape, read only when LearnerContext.sgd_slots is set (a sweep group whose configs
    # differ in it); otherwise the static LearnerContext.num_epochs / num_minibatches rule.
    num_epochs: chex.Array
    num_minibatches: chex.Array

# The one list of traced hyperparameters: each `Hyperparams` field and the config field it
# comes from. `sweep` derives its compile groups from it (fields here never split a group).
TRACED_CONFIG_FIELDS: dict[str, str] = {
    "learning_rate": "ppo.learning_rate",
    "gamma": "ppo.gamma",
    "gae_lambda": "ppo.gae_lambda",
    "clip_eps": "ppo.clip_eps",
    "dual_clip": "ppo.dual_clip",
    "value_clip_eps": "ppo.value_clip_eps",
    "vf_coef": "ppo.vf_coef",
    "ent_coef": "ppo.ent_coef",
    "max_grad_norm": "ppo.max_grad_norm",
    "reward_scale": "rollout.reward_scale",
    "rho_bar": "ppo.rho_bar",
    "c_bar": "ppo.c_bar",
    "value_update_every": "ppo.value_update_every",
    "max_lag": "lag.max_lag",
    "decoupled": "ppo.objective",
    "is_clip": "ppo.is_clip",
    "prox_ewma": "ppo.prox_ewma",
}

# What a None config value stands for, as a traced number.
_NONE_AS = {"dual_clip": math.inf, "value_clip_eps": 0.2, "max_lag": math.inf, "is_clip": math.inf, "prox_ewma": 0.0}

# Traced fields whose config value is not a number: how it becomes one.
_AS_NUMBER = {"decoupled": lambda objective: float(objective == "decoupled")}

# Traced fields whose None / not-None is static (it switches a code path) while the value is traced.
STATIC_WHEN_SET = ("ppo.value_clip_eps", "ppo.prox_ewma")

# Traced fields that a program also reads statically while another (boolean) field is on: the
# rollout discounts the returns that normalise rewards by ppo.gamma, a Python number there.
STATIC_WHILE_ON = {"ppo.gamma": "rollout.normalize_reward"}

# The SGD shape as traced numbers: `Hyperparams` fields a program reads only when it was built
# with `LearnerContext.sgd_slots` (`sweep` does so for a group whose configs differ in them, e.g.
# `tune`'s step 4); every other program takes them from the static context, and they stay in
# the compile key (`without_traced_fields` keeps them).
SGD_SHAPE_FIELDS: dict[str, str] = {"num_epochs": "ppo.num_epochs", "num_minibatches": "ppo.num_minibatches"}

def hyperparams_from_config(config: Config) -> Hyperparams:
    """The traced hyperparameters of a config (`TRACED_CONFIG_FIELDS`, `SGD_SHAPE_FIELDS`), float32 scalars."""
    values = {}
    for name, path in TRACED_CONFIG_FIELDS.items():
        value = get_path(config, path)
        value = _NONE_AS[name] if value is None else _AS_NUMBER.get(name, float)(value)
        values[name] = jnp.asarray(value, jnp.float32)
    for name, path in SGD_SHAPE_FIELDS.items():
        values[name] = jnp.asarray(float(get_path(config, path)), jnp.float32)
    return Hyperparams(**values)

def without_traced_fields(data: dict[str, Any]) -> dict[str, Any]:
    """A config as a dict (`config_to_dict`) without the traced hyperparameters: what decides
    the compiled program (for a `STATIC_WHEN_SET` field, only whether it is set is kept; a
    `STATIC_WHILE_ON` field stays while its switch is on)."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for path in TRACED_CONFIG_FIELDS.values():
        section, _, name = path.partition(".")
        switch_section, _, switch = STATIC_WHILE_ON.get(path, ".").partition(".")
        if data.get(switch_section, {}).get(switch):
            continue
        if section in data and name in data[section]:
            value = data[section].pop(name)
            if path in STATIC_WHEN_SET:
                data[section][f"{name}_is_set"] = value is not None
    return data

class SgdSlots(NamedTuple):
    """Static bounds of an SGD shape traced in `Hyperparams` (`num_epochs`, `num_minibatches`):
    the update scans `max_epochs x max_minibatches` step slots of `batch / min_minibatches`
    samples each and skips (`lax.cond`) the slots past the traced shape; a minibatch smaller
    than its slot is padded with weight-0 samples. Built by `sgd_slots_of` for a sweep group."""

    max_epochs: int
    min_minibatches: int
    max_minibatches: int

def sgd_slots_of(configs: Sequence[Config]) -> SgdSlots | None:
    """The slots that hold every config's SGD shape, or None when they all share one (the
    static update, bit for bit today's)."""
    shapes = {(c.ppo.num_epochs, c.ppo.num_minibatches) for c in configs}
    if len(shapes) <= 1:
        return None
    epochs, minibatches = zip(*shapes)
    return SgdSlots(max(epochs), min(minibatches), max(minibatches))
