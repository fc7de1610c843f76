"""`Config`: one training run - which env, which execution mode, how long - and every section
(`sections`). It fills the env's defaults into the fields its caller did not set
(`explicit`), validates every field (all failures reported at once, the env first) and the
rules between them (`applicability`), and derives the sizes (batch, chunk, iterations).

Serialise with `config_to_dict` / `config_from_dict` (JSON-friendly, nested by section).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

from ppo_async.config.applicability import check_fields_apply
from ppo_async.config.checks import canonical_path, did_you_mean, field_paths, _check_int, _fail, check_field_types, every_failure, failure_of, stop_if_failed
from ppo_async.config.choices import BATCH_SYNC_MAX_SAMPLES, ModeName
from ppo_async.config.explicit import apply_env_defaults, as_given, given_fields, preset_fields, record_given, with_fields
from ppo_async.config.preset_table import env_defaults
from ppo_async.config.resources import budget_blame, check_sizes
from ppo_async.config.samplers import SAMPLER_ALIASES, alias_warning, default_num_samplers, read_aliases
from ppo_async.config.sections import (
    DEFAULT_BUFFER_CHUNKS,
    DistributedConfig,
    EnvOptions,
    LagConfig,
    NetworkConfig,
    PPOConfig,
    RolloutConfig,
    ThreadedConfig,
)
from ppo_async.envs.registry import HOST_ENV_FAMILIES, check_env_name, split_env_name
from ppo_async.errors import ConfigError


# Top-level fields that shape no compiled program: the seed enters as an argument, the rest is
# what the host writes and when (used by the kept-program caches of the modes).
_ENV_CHECK_DEFERRED: contextvars.ContextVar[bool] = contextvars.ContextVar("env_check_deferred", default=False)


@contextlib.contextmanager
def env_check_deferred() -> Iterator[None]:
    """Within it, `Config` leaves out the one check that reads an env family's own registry
    (`check_env_name`: gymnax's starts JAX), so a command line can be parsed, its `--help`
    printed and its other errors reported without JAX. Whoever uses it validates the final
    `Config` again outside it (the CLI's `TrainCommand.resolved` does)."""
    token = _ENV_CHECK_DEFERRED.set(True)
    try:
        yield
    finally:
        _ENV_CHECK_DEFERRED.reset(token)


HOST_ONLY_FIELDS = ("seed", "run_dir", "checkpoint_every_steps", "keep_checkpoints", "wandb_project", "eval_every_steps",
                    "eval_episodes", "log_every", "overwrite", "plots", "checkpoint_every", "eval_every")

DEPRECATED_CADENCES = {"eval_every": "eval_every_steps", "checkpoint_every": "checkpoint_every_steps"}
"""The cadences once counted in learner iterations (deprecated for one release) -> the fields
that count them in env steps. Setting one converts it (`Config._convert_iteration_cadences`),
with a FutureWarning; a stored config holding one is converted silently (`stored_config`)."""
_CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))
_STORED: contextvars.ContextVar[str | None] = contextvars.ContextVar("stored_config", default=None)


@contextlib.contextmanager
def stored_config(warn: bool = False) -> Iterator[None]:
    """Within it, a `Config` is one read back from a file (config.json, a benchmark's configs,
    a checkpoint's metadata; with `warn`, a `--config FILE` handed to a command): it converts a
    deprecated iteration cadence, and the sampler count's deprecated spellings as such a file
    holds them (each mode read one; `samplers.held_where_inert`), without the FutureWarning,
    since its reader typed nothing, unless `warn` (`paths.config_from_dict` builds in it)."""
    token = _STORED.set("warn" if warn else "silent")
    try:
        yield
    finally:
        _STORED.reset(token)


def cadence_iterations(steps: int, batch_size: int) -> int:
    """Learner iterations between the events of a cadence given in env steps: `steps /
    batch_size` rounded to the nearest whole iteration, at least 1; 0 (off) for 0 steps."""
    return 0 if steps == 0 else max(1, int(round(steps / batch_size)))


def _stacklevel_outside_config() -> int:
    """The `stacklevel` that points a warning raised by this module's caller at the first frame
    outside the config package, `dataclasses` and generated code (a dataclass's `__init__`):
    the line that built or replaced the config, whichever way it went."""
    frame, level = sys._getframe(1), 1  # level 1: the caller's line
    while frame is not None and (frame.f_code.co_filename.startswith((_CONFIG_DIR, "<"))
                                 or frame.f_code.co_filename == dataclasses.__file__):
        frame, level = frame.f_back, level + 1
    return level


@record_given
@dataclass(frozen=True)
class Config:
    """One training run: which env, which execution mode, how long, and every section."""

    env: str = "Pendulum-v1"
    """Environment: a gymnax name (Pendulum-v1, CartPole-v1), brax/<name> (brax/inverted_pendulum, needs the [brax] extra), playground/<name> (playground/CartpoleBalance, [playground]), gymnasium/<id> (gymnasium/HalfCheetah-v5, [gymnasium]; threaded mode only) or envpool/<id> (the same MuJoCo tasks on EnvPool's C++ thread pool: envpool/HalfCheetah-v5, [envpool]; threaded mode only)."""
    mode: ModeName = "sync"
    """Execution mode: sync (strict on-policy), simulated (emulated samplers with a controlled lag schedule) or threaded (real sampler threads; the lag emerges from timing)."""
    seed: int = 0
    """Base random seed; seed i of a multi-seed run uses seed + i."""
    num_seeds: int = 1
    """Independent seeds trained together in one compile (vmap)."""
    total_env_steps: int = 300_000
    """Environment steps per seed; rounded down to whole iterations of num_envs * num_steps."""
    num_samplers: int | None = None
    """Samplers, each with its own envs, env seeds and parameter snapshot: threads in threaded mode (None = 2), emulated samplers in simulated mode (None = 1, or what the lag schedule names: len(lag.per_sampler), the replayed file's samplers); sync mode has one (leave it None). The run's count is `Config.effective_num_samplers`."""
    run_dir: str | None = None
    """Directory for config.json, metrics.jsonl, checkpoints/, tb/ (and the PNG plots with plots = True); None writes nothing."""
    checkpoint_every_steps: int = 0
    """Save a checkpoint into RUN_DIR/checkpoints every this many env steps, rounded to whole learner iterations (and after the last); 0 = only the final one."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk (the oldest are deleted)."""
    wandb_project: str | None = None
    """Also log every metric row to this Weights & Biases project (needs `pip install wandb`; never required); None = off."""
    eval_every_steps: int = 0
    """Evaluate the learner's current params every this many env steps, rounded to whole learner iterations (and after the last), logged as eval_return; 0 = off."""
    eval_episodes: int = 10
    """Episodes per evaluation (deterministic actions: the Gaussian mean / the argmax)."""
    log_every: int = 1
    """Learner iterations per metrics row: a row aggregates the iterations since the previous one (means, maxima, summed histograms and counts, the last counters; `ppo_async.report.aggregate`), in metrics.jsonl, TensorBoard, W&B and TrainResult.metrics alike. The non-finite checks, the sample accounting and the warnings still run every iteration."""
    overwrite: bool = False
    """Replace a run already in run_dir (its metrics, checkpoints, schedules and plots); without it a run_dir holding a run is refused (resume it instead)."""
    plots: bool = False
    """Also write the run's PNG plots into run_dir when it ends (learning curve, KL over time, throughput, and the lag figures where the metrics have them). Off by default: drawing them imports matplotlib and renders each figure, about 1.3 s on 2 CPU cores, more than a short run trains; `python -m ppo_async plot RUN_DIR` (or `ppo_async.plot_run(run_dir)`) draws the same figures from metrics.jsonl at any time, also while the run goes on."""
    checkpoint_every: int = 0
    """Deprecated (goes in the next release): checkpoint_every_steps in learner iterations. Setting it sets checkpoint_every_steps = it x the learner batch, with a FutureWarning, and it reads 0 again."""
    eval_every: int = 0
    """Deprecated (goes in the next release): eval_every_steps in learner iterations. Setting it sets eval_every_steps = it x the learner batch, with a FutureWarning, and it reads 0 again."""
    env_options: EnvOptions = field(default_factory=EnvOptions)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    lag: LagConfig = field(default_factory=LagConfig)
    threaded: ThreadedConfig = field(default_factory=ThreadedConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def __post_init__(self) -> None:
        with every_failure():  # one ConfigError naming every failed field, the env first
            self._check_fields()

    def _check_fields(self) -> None:
        if isinstance(self.env, str):  # (a wrong type is check_field_types' to report)
            apply_env_defaults(self, env_defaults(self.env))  # the env's preset under what the caller set
        check_field_types(self)
        _check_int("seed", self.seed, 0)
        _check_int("num_seeds", self.num_seeds, 1)
        _check_int("total_env_steps", self.total_env_steps, 1)
        if self.num_samplers is not None:
            _check_int("num_samplers", self.num_samplers, 1)
        _check_int("checkpoint_every_steps", self.checkpoint_every_steps, 0)
        _check_int("keep_checkpoints", self.keep_checkpoints, 1)
        _check_int("eval_every_steps", self.eval_every_steps, 0)
        _check_int("checkpoint_every", self.checkpoint_every, 0)
        _check_int("eval_every", self.eval_every, 0)
        _check_int("eval_episodes", self.eval_episodes, 1)
        _check_int("log_every", self.log_every, 1)
        for name, cls in (("env_options", EnvOptions), ("rollout", RolloutConfig), ("ppo", PPOConfig), ("network", NetworkConfig), ("lag", LagConfig), ("threaded", ThreadedConfig), ("distributed", DistributedConfig)):
            if not isinstance(getattr(self, name), cls):
                _fail(name, getattr(self, name), f"must be a {cls.__name__}")
        stop_if_failed(then=self._check_env_name)  # the rules below compare fields with each other
        self._convert_sampler_aliases()  # (needs the mode: after the env's preset)
        check_sizes(self)  # int32 and sane bounds, before any rule that multiplies them
        self._convert_iteration_cadences()  # (needs the batch size)
        self._check_env_name()  # after the env-free checks: a gymnax name imports gymnax (and JAX)
        # after the name check: an unknown name is reported as such, not as the wrong mode for it
        if split_env_name(self.env)[0] in HOST_ENV_FAMILIES and self.mode != "threaded":
            _fail("mode", self.mode,
                  f"must be 'threaded' for the host-side env {self.env!r} (its simulator steps on each sampler "
                  "thread's host, outside jit; sync and simulated modes need a JAX env: gymnax, brax/* or playground/*)")
        if self.run_dir is not None and self.checkpoint_every_iterations % self.log_every != 0:
            _fail("checkpoint_every_steps", self.checkpoint_every_steps,
                  f"gives every {self.checkpoint_every_iterations} learner iterations (batch_size {self.batch_size}), which must be "
                  f"a multiple of log_every = {self.log_every} (a checkpoint closes a metrics row, so a resumed run continues its rows exactly)")
        if self.wandb_project is not None and (not isinstance(self.wandb_project, str) or not self.wandb_project.strip()):
            _fail("wandb_project", self.wandb_project, "must be a non-empty project name or None")
        if self.batch_size % self.ppo.num_minibatches != 0:
            _fail(
                "ppo.num_minibatches",
                self.ppo.num_minibatches,
                f"must divide the learner batch ({self._batch_formula()} = {self.batch_size})",
            )
        if self.distributed.cluster != "none" and self.distributed.process_id is None:
            _fail("distributed.cluster", self.distributed.cluster, "the layout it gives is not filled in yet: join first with "
                  "ppo_async.runtime.distributed.initialize(DistributedConfig(cluster=...)), which returns the section with "
                  "num_processes, process_id and coordinator_address, and build the Config with that "
                  "(`python -m ppo_async train` does this)")
        if self.distributed.num_processes > 1 and self.mode != "threaded":
            _fail("mode", self.mode, f"must be 'threaded' with distributed.num_processes = {self.distributed.num_processes} "
                  "(several processes run threaded samplers and one data-parallel learner)")
        if self.mode == "threaded":
            self._check_threaded_samplers()
            self._check_buffer_capacity()
        if self.threaded.kl_target is not None and self.distributed.num_processes > 1:
            _fail("threaded.kl_target", self.threaded.kl_target,
                  "must be None with distributed.num_processes > 1 (the KL controller runs in one process for now)")
        if self.total_env_steps < self.batch_size:
            blame = budget_blame(self)
            if blame != "total_env_steps":
                _fail(blame, getattr(self.rollout, blame.partition(".")[2]),
                      f"the learner batch ({self._batch_formula()} = {self.batch_size:,}) must fit in "
                      f"total_env_steps = {self.total_env_steps:,}")
            else:
                _fail("total_env_steps", self.total_env_steps,
                      f"must be at least one learner batch ({self._batch_formula()} = {self.batch_size})")
        check_fields_apply(self)

    def _convert_iteration_cadences(self) -> None:
        """Each deprecated cadence set (`DEPRECATED_CADENCES`: `eval_every = k` learner iterations)
        as its env-step field (`eval_every_steps = k * batch_size`), said by a FutureWarning (not
        for a config read back from a file: `stored_config`); the old field reads 0 again, so
        config.json, equality and resume see one spelling. Both set is a failure naming both."""
        for old, new in DEPRECATED_CADENCES.items():
            iterations, steps = getattr(self, old), getattr(self, new)
            if iterations == 0:
                continue
            if steps != 0:
                _fail(old, iterations, f"{new} = {steps!r} is set too: set {new} (env steps) alone ({old} is its deprecated "
                      "spelling in learner iterations)")
                continue
            steps = iterations * self.batch_size
            if _STORED.get() != "silent":
                warnings.warn(f"{old} = {iterations} (learner iterations) is deprecated and goes in the next release: use "
                              f"{new} = {steps} (env steps: {iterations} x batch_size {self.batch_size}), which this config "
                              f"now holds ({old} reads 0)", FutureWarning, stacklevel=_stacklevel_outside_config())
            object.__setattr__(self, new, steps)
            object.__setattr__(self, old, 0)
            given = getattr(self, "_given_fields", None)
            if given is not None and old in given:
                object.__setattr__(self, "_given_fields", given - {old} | {new})

    def _convert_sampler_aliases(self) -> None:
        """The sampler count's deprecated spellings (`SAMPLER_ALIASES`: `threaded.num_samplers`,
        `lag.num_samplers`) read as num_samplers (`samplers.read_aliases`), each that sets it
        said by a FutureWarning (not for a config read back from a file: `stored_config`); the
        aliases read None again, so config.json, equality and resume see one spelling. An alias
        beside a num_samplers or another alias of another value is a failure naming both; one
        beside a num_samplers the env's preset filled wins (the caller set it)."""
        aliases = {path: getattr(getattr(self, path.partition(".")[0]), "num_samplers") for path in SAMPLER_ALIASES}
        if all(value is None for value in aliases.values()):
            return
        preset = "num_samplers" in preset_fields(self)
        reading = read_aliases(None if preset else self.num_samplers, aliases, self.mode, self.lag.schedule,
                               stored=_STORED.get() is not None)
        if reading.failure is not None:
            _fail(*reading.failure)
            return
        for path, value in reading.set_it:
            if _STORED.get() != "silent":
                warnings.warn(alias_warning(path, value), FutureWarning, stacklevel=_stacklevel_outside_config())
        for name in ("threaded", "lag"):
            if getattr(self, name).num_samplers is not None:
                object.__setattr__(self, name, with_fields(getattr(self, name), {"num_samplers": None}))
        if reading.set_it:
            object.__setattr__(self, "num_samplers", reading.value)
            object.__setattr__(self, "_given_fields", given_fields(self) | {"num_samplers"})
            object.__setattr__(self, "_preset_fields", tuple(p for p in preset_fields(self) if p != "num_samplers"))

    def _check_threaded_samplers(self) -> None:
        """The threaded fields that count samplers against the run's (`effective_num_samplers`):
        one latency per sampler, and with a barrier one chunk per sampler in each batch."""
        tcfg, samplers = self.threaded, self.effective_num_samplers
        if tcfg.sampler_step_latency_ms and len(tcfg.sampler_step_latency_ms) != samplers:
            _fail("threaded.sampler_step_latency_ms", tcfg.sampler_step_latency_ms,
                  f"must list one latency per sampler (num_samplers = {samplers}) or be empty")
        if tcfg.barrier and tcfg.chunks_per_batch is not None and tcfg.chunks_per_batch != samplers:
            _fail("threaded.chunks_per_batch", tcfg.chunks_per_batch,
                  f"must equal num_samplers = {samplers} with barrier=True (one rollout per sampler), or be None")

    def _check_env_name(self) -> None:
        if not _ENV_CHECK_DEFERRED.get():
            with failure_of("env"):
                check_env_name(self.env)

    def _check_buffer_capacity(self) -> None:
        tcfg = self.threaded
        if tcfg.buffer_capacity is not None and tcfg.buffer_capacity % self.chunk_size != 0:
            _fail(
                "threaded.buffer_capacity", tcfg.buffer_capacity,
                f"must be a whole number of rollout chunks (rollout.num_envs * rollout.num_steps = {self.chunk_size} transitions each)",
            )
        samplers = self.effective_num_samplers
        if tcfg.barrier and tcfg.full_policy == "overwrite_oldest" and self.buffer_capacity_chunks < samplers:
            _fail(
                "threaded.buffer_capacity", tcfg.buffer_capacity or self.buffer_capacity_chunks * self.chunk_size,
                f"must hold >= num_samplers = {samplers} chunks ({samplers * self.chunk_size} "
                "transitions) with barrier=True and full_policy='overwrite_oldest' (an overwritten rollout would never be replaced)",
            )

    @property
    def buffer_capacity_chunks(self) -> int:
        """Ring-buffer slots: threaded.buffer_capacity / (num_envs * num_steps), 4 by default."""
        if self.threaded.buffer_capacity is None:
            return DEFAULT_BUFFER_CHUNKS
        return self.threaded.buffer_capacity // self.chunk_size

    def _batch_formula(self) -> str:
        formula = "rollout.num_envs * rollout.num_steps"
        if self.effective_chunks_per_batch > 1:
            formula += " * threaded.chunks_per_batch"
        if self.distributed.num_processes > 1:
            formula += " * distributed.num_processes"
        return formula

    @property
    def effective_num_samplers(self) -> int:
        """The run's samplers, each with its own envs, env seeds and parameter snapshot:
        num_samplers, or what None stands for in its mode (`samplers.default_num_samplers`): 2
        threads (threaded), 1 (sync), and in simulated mode len(lag.per_sampler)
        (schedule='per_sampler'), the replayed file's samplers (schedule='replay': read from
        lag.replay_path, ConfigError naming it when it cannot be) or 1."""
        if self.num_samplers is not None:
            return self.num_samplers
        return default_num_samplers(self.mode, self.lag)

    @property
    def effective_chunks_per_batch(self) -> int:
        """Rollout chunks per learner batch of one process: threaded.chunks_per_batch, else one
        per sampler with threaded.barrier (`effective_num_samplers`), else 1 (1 outside threaded mode)."""
        if self.mode != "threaded":
            return 1
        if self.threaded.chunks_per_batch is not None:
            return self.threaded.chunks_per_batch
        return self.effective_num_samplers if self.threaded.barrier else 1

    @property
    def chunk_size(self) -> int:
        """Transitions in one rollout chunk (num_envs * num_steps)."""
        return self.rollout.num_envs * self.rollout.num_steps

    @property
    def local_batch_size(self) -> int:
        """Transitions one process's learner takes per iteration: `effective_chunks_per_batch`
        chunks (one outside threaded mode)."""
        return self.chunk_size * self.effective_chunks_per_batch

    @property
    def batch_size(self) -> int:
        """Transitions per learner iteration, over every process (`local_batch_size * distributed.num_processes`)."""
        return self.local_batch_size * self.distributed.num_processes

    @property
    def learner_sync(self) -> str:
        """`distributed.learner_sync` with auto resolved: "batch" when the learner batch
        (`batch_size`, every process's) has at most `BATCH_SYNC_MAX_SAMPLES`, else "gradients"."""
        sync = self.distributed.learner_sync
        if sync != "auto":
            return sync
        return "batch" if self.batch_size <= BATCH_SYNC_MAX_SAMPLES else "gradients"

    @property
    def minibatch_size(self) -> int:
        """Transitions per SGD step."""
        return self.batch_size // self.ppo.num_minibatches

    @property
    def num_iterations(self) -> int:
        """Learner iterations per seed (whole batches within total_env_steps)."""
        return self.total_env_steps // self.batch_size

    @property
    def eval_every_iterations(self) -> int:
        """Learner iterations between evaluations: `eval_every_steps` in whole iterations
        (`cadence_iterations`: rounded, at least 1); 0 when evaluation is off."""
        return cadence_iterations(self.eval_every_steps, self.batch_size)

    @property
    def checkpoint_every_iterations(self) -> int:
        """Learner iterations between checkpoints: `checkpoint_every_steps` in whole iterations
        (`cadence_iterations`: rounded, at least 1); 0 when only the final one is written."""
        return cadence_iterations(self.checkpoint_every_steps, self.batch_size)

    @property
    def sgd_steps_per_iteration(self) -> int:
        """Gradient steps per learner iteration (num_epochs * num_minibatches)."""
        return self.ppo.num_epochs * self.ppo.num_minibatches

    @property
    def preset_fields(self) -> tuple[str, ...]:
        """The dotted fields the env's preset filled because this config's caller did not set
        them (`ppo_async.config.explicit`); () when every field was given."""
        return preset_fields(self)

    def replace(self, changes: Mapping[str, Any] | None = None, /, **fields: Any) -> "Config":
        """A copy with fields replaced (validated again): top-level fields by keyword
        (`replace(seed=3)`), section fields by dotted path in either spelling
        (`replace({"ppo.clip_eps": 0.1})`, `replace(**{"ppo.clip-eps": 0.1})`), or both; a dotted
        field keeps the rest of its section. Replacing `env` rebuilds the config from what its
        caller set, so the new env's preset fills the rest (not the old env's values)."""
        merged = {canonical_path(k): v for k, v in {**dict(changes or {}), **fields}.items()}
        top = {k: v for k, v in merged.items() if "." not in str(k)}
        dotted = {k: v for k, v in merged.items() if "." in str(k)}
        whole = set(top)  # top-level fields and whole sections, as given
        rebuild = "env" in top and top["env"] != self.env and bool(self.preset_fields)
        given = as_given(self) if rebuild else {}
        for path, value in dotted.items():  # each section once, with its caller's fields and these
            section_name, _dot, name = path.partition(".")
            section = top.get(section_name, given.get(section_name, getattr(self, section_name, None)))
            if rebuild and section_name not in top and section_name not in given and dataclasses.is_dataclass(section):
                section = type(section)()  # not set by the caller: the new env's defaults, not the old env's preset
            if not dataclasses.is_dataclass(section) or name not in {f.name for f in dataclasses.fields(section)}:
                raise ConfigError(f"unknown config field {path!r}{did_you_mean(path, field_paths(Config))}")
            top[section_name] = with_fields(section, {name: value})
        if "num_samplers" not in top and any(getattr(top.get(path.partition(".")[0]), "num_samplers", None) is not None
                                             for path in SAMPLER_ALIASES):
            top["num_samplers"] = None  # a deprecated spelling sets it, over the value this config had
            whole.add("num_samplers")
        if rebuild:
            return Config(**{**given, **top})
        new = dataclasses.replace(self, **top)
        set_by_caller = frozenset(DEPRECATED_CADENCES.get(k, k) for k in top)  # an alias sets its new field
        object.__setattr__(new, "_given_fields", given_fields(self) | set_by_caller)
        kept = (p for p in self.preset_fields if p.partition(".")[0] not in whole and p not in dotted)
        object.__setattr__(new, "_preset_fields", tuple(kept))  # still the preset's: what was not replaced
        return new


def check_config_type(config: object, name: str = "config") -> None:
    """TypeError naming the argument when `config` is not a `Config` (e.g. a string or a dict)."""
    if not isinstance(config, Config):
        hint = " (build one with ppo_async.config_from_dict)" if isinstance(config, dict) else ""
        raise TypeError(f"{name} = {config!r:.60} is invalid: must be a ppo_async.Config, not {type(config).__name__}{hint}")
