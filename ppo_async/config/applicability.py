"""Every knob acts, or says why not: the rules of which config fields act under which others
(`check_fields_apply`: a field set away from its default where it would do nothing is a
`ConfigError`; `check_given_apply`: the same for a field set explicitly; `check_env_options`:
options an env family does not read). `config` arguments are `run_config.Config`s.
"""

from __future__ import annotations

from typing import Any

from ppo_async.config.checks import _changed, _fail, _inert
from ppo_async.config.sections import EnvOptions, LagConfig, PPOConfig, ThreadedConfig
from ppo_async.envs.registry import BRAX_BACKENDS, PLAYGROUND_BACKENDS, split_env_name


def check_env_options(config: Any) -> None:
    """ConfigError for an env option the env's family does not read, or a backend it lacks."""
    family, _ = split_env_name(config.env)
    opts = config.env_options
    if family not in ("brax", "playground"):
        for name in _changed(opts, EnvOptions()):
            _inert(f"env_options.{name}", getattr(opts, name),
                   f"env options act only on brax/* and playground/* envs, not on {family} env {config.env!r}")
        return
    allowed = BRAX_BACKENDS if family == "brax" else PLAYGROUND_BACKENDS
    if opts.backend is not None and opts.backend not in allowed:
        _fail("env_options.backend", opts.backend, f"must be one of {allowed} for {family} envs (or None)")


# Lag-schedule fields (all of LagConfig but the stale filter) act only in simulated mode and in
# threaded barrier runs; within them, each schedule reads only its own fields. (lag.num_samplers,
# the deprecated spelling of num_samplers, reads None by the time these rules run.)
LAG_FILTER_FIELDS = ("max_lag",)

SCHEDULE_FIELDS = {
    "fixed": ("K",),
    "per_sampler": ("per_sampler",),
    "uniform": ("low", "high", "seed"),
    "geometric": ("p", "high", "seed"),
    "straggler": ("fraction", "slowdown"),
    "replay": ("replay_path",),
}

def check_fields_apply(config: Any) -> None:
    """Raises ConfigError for a field set away from its default where it would do nothing.

    A knob that silently does nothing is a wrong experiment: `lag.K = 8` in sync mode runs at
    lag 0. The rules: num_samplers needs mode='simulated' or 'threaded' (sync mode has one
    sampler), and where lag.per_sampler acts it lists one lag per sampler; lag-schedule fields
    need mode='simulated' or a threaded barrier run (`lag.max_lag`, the stale filter, acts in
    every mode) and, within it, the schedule that reads them (`_lag_inert_reason`); `threaded.*`
    fields need mode='threaded' (`threaded.latency_jitter` also needs a latency);
    `ppo.rho_bar` / `ppo.c_bar` need advantage_estimator='vtrace'; `ppo.is_clip` /
    `ppo.prox_ewma` need objective='decoupled'; eval_episodes needs evaluation
    (eval_every_steps > 0); checkpoint_every_steps, keep_checkpoints, overwrite and plots need a run_dir.
    """
    check_env_options(config)
    for name in _changed(config.lag, LagConfig()):
        why = _lag_inert_reason(config, name)
        if why is not None:
            _inert(f"lag.{name}", getattr(config.lag, name), why)
    if config.mode == "sync" and config.num_samplers is not None:
        _inert("num_samplers", config.num_samplers, "mode='sync' runs one sampler (num_samplers counts the sampler threads "
               "of mode='threaded' and the emulated samplers of mode='simulated')")
    schedule_acts = config.mode == "simulated" or (config.mode == "threaded" and config.threaded.barrier)
    if schedule_acts and config.lag.schedule == "per_sampler" and len(config.lag.per_sampler) != config.effective_num_samplers:
        _fail("lag.per_sampler", config.lag.per_sampler, f"must list one lag per sampler (num_samplers = "
              f"{config.effective_num_samplers}{', the sampler threads' if config.mode == 'threaded' else ''})")
    if config.mode != "threaded":
        for name in _changed(config.threaded, ThreadedConfig()):
            _inert(f"threaded.{name}", getattr(config.threaded, name),
                   f"threaded.* fields act only in mode='threaded', this run has mode={config.mode!r}")
    elif config.threaded.latency_jitter and not config.threaded.sampler_step_latency_ms:
        _inert("threaded.latency_jitter", config.threaded.latency_jitter,
               "it jitters threaded.sampler_step_latency_ms, which is empty (no simulated latency)")
    for name in _changed(config.ppo, PPOConfig()):
        why = _ppo_inert_reason(config.ppo, name)
        if why is not None:
            _inert(f"ppo.{name}", getattr(config.ppo, name), why)
    if config.eval_every_steps == 0 and config.eval_episodes != type(config).__dataclass_fields__["eval_episodes"].default:
        _inert("eval_episodes", config.eval_episodes, "evaluation is off (eval_every_steps = 0)")
    if config.run_dir is None:  # (the deprecated checkpoint_every is checkpoint_every_steps by now)
        for name in ("checkpoint_every_steps", "keep_checkpoints", "overwrite"):
            if getattr(config, name) != type(config).__dataclass_fields__[name].default:
                _inert(name, getattr(config, name), "there is no run_dir to write checkpoints into")
        if config.plots:
            _inert("plots", config.plots, "there is no run_dir to write the plots into")


def _lag_inert_reason(config: Any, name: str) -> str | None:
    """Why the lag field `name` (set away from its default) does nothing in `config`; None when
    it acts. The stale filter acts everywhere; the schedule fields in mode='simulated' and in a
    threaded barrier run (the run that makes the schedule's lags on real samplers), each read by
    its schedule. lag.num_samplers, the deprecated spelling of num_samplers, is `Config`'s to read."""
    lag, barrier = config.lag, config.mode == "threaded" and config.threaded.barrier
    if name in LAG_FILTER_FIELDS or name == "num_samplers":
        return None
    if config.mode == "threaded" and not barrier:
        return ("this run has mode='threaded' without a barrier, whose lag emerges from timing; a lag schedule acts "
                "with threaded.barrier = True (and in mode='simulated'); lag.max_lag is the one lag field every mode uses")
    if config.mode not in ("simulated", "threaded"):
        return (f"lag-schedule fields act only in mode='simulated' and in threaded runs with threaded.barrier = True, "
                f"this run has mode={config.mode!r} (lag.max_lag is the one lag field every mode uses)")
    if name != "schedule" and name not in SCHEDULE_FIELDS[lag.schedule]:
        users = sorted(k for k, v in SCHEDULE_FIELDS.items() if name in v)
        return f"lag.schedule = {lag.schedule!r} does not read it (it is read by {', '.join(map(repr, users))})"
    return None


def _ppo_inert_reason(ppo: PPOConfig, name: str) -> str | None:
    """Why the PPO field `name` does nothing under `ppo`'s estimator and objective; None when it acts."""
    if name in ("rho_bar", "c_bar") and ppo.advantage_estimator != "vtrace":
        return f"V-trace truncations act only with ppo.advantage_estimator = 'vtrace' (not {ppo.advantage_estimator!r})"
    if name in ("is_clip", "prox_ewma") and ppo.objective != "decoupled":
        return f"the proximal policy acts only with ppo.objective = 'decoupled' (not {ppo.objective!r})"
    return None

def check_given_apply(config: Any, paths: Any) -> None:
    """ConfigError for a dotted field the user set explicitly (a flag, a config-file key, a
    `replace_paths` / sweep-grid key) that `config` never reads, whatever its value:
    `ppo.rho_bar = 1.0` with advantage_estimator='gae' is as inert as 2.0 (`check_fields_apply`
    sees only values away from the default)."""
    for path in paths:
        section, _dot, name = str(path).partition(".")
        if section == "ppo" and name:
            why = _ppo_inert_reason(config.ppo, name)
            if why is not None:
                _inert(path, getattr(config.ppo, name), why)
