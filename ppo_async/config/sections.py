"""Typed, frozen configuration.

`Config` holds the run-level fields (env name, mode, seed, budget, run dir) plus one
section per concern: `rollout` (envs and trajectory shape), `ppo` (the update), `network`.
Every section validates itself at construction and raises `ConfigError` naming the field
(with its section prefix), the value and what is allowed. Derived sizes are properties.

Serialise with `config_to_dict` / `config_from_dict` (JSON-friendly, nested by section).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, get_args

from ppo_async.config.checks import (
    _changed,
    _check_int,
    _check_non_negative,
    _check_positive,
    _check_unit_interval,
    _fail,
    _inert,
    check_field_types,
    every_failure,
    failure_of,
    stop_if_failed,
)
from ppo_async.config.explicit import apply_env_defaults, as_given, given_fields, preset_fields, record_given
from ppo_async.config.preset_table import env_defaults
from ppo_async.config.resources import budget_blame, check_sizes
from ppo_async.envs.registry import (
    BRAX_BACKENDS,
    HOST_ENV_FAMILIES,
    PLAYGROUND_BACKENDS,
    check_env_name,
    split_env_name,
)


# The allowed values of each choice field, written once: the Literal annotates the field (tyro
# and `check_field_types` read it) and the tuple beside it is derived from it.
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


HOST_ONLY_FIELDS = ("seed", "run_dir", "checkpoint_every", "keep_checkpoints", "wandb_project", "eval_every",
                    "eval_episodes", "log_every", "overwrite")

@record_given
@dataclass(frozen=True)
class RolloutConfig:
    """How samples are produced: the vectorised envs and the trajectory shape."""

    num_envs: int = 16
    """Parallel environments per sampler (the vmap width N)."""
    num_steps: int = 64
    """Steps per environment in one rollout (the trajectory length T)."""
    normalize_obs: bool = True
    """Normalise observations with running mean/std statistics: part of the policy, owned by the learner (trajectories carry raw observations; samplers act with their snapshot's statistics)."""
    obs_clip: float = 10.0
    """Normalised observations are clipped to [-obs_clip, obs_clip]."""
    reward_scale: float = 0.1
    """Rewards are multiplied by this before GAE (returns reported are unscaled); after normalize_reward when that is on."""
    normalize_reward: bool = False
    """Divide rewards by the running std of the discounted return (ppo.gamma), as baselines' VecNormalize, CleanRL and SB3 do; trajectories carry raw rewards and the learner scales each batch with its own statistics."""
    reward_clip: float = 10.0
    """Normalised rewards are clipped to [-reward_clip, reward_clip] (normalize_reward only)."""
    clip_actions: bool = True
    """Clip continuous actions to the env's bounds before stepping (the stored action is unclipped)."""
    stats_update: StatsUpdateName = "after_sgd"
    """When the learner merges a consumed batch's moments into its normalisation statistics: after_sgd (the batch is normalised with the statistics its learner version had, which samplers of that version acted with: at lag 0 the ratio starts at exactly 1; Brax's order) or before_sgd (with statistics that include the batch; Sample Factory's order)."""

    def __post_init__(self) -> None:
        check_field_types(self, "rollout.")
        _check_int("rollout.num_envs", self.num_envs, 1)
        _check_int("rollout.num_steps", self.num_steps, 1)
        _check_positive("rollout.obs_clip", self.obs_clip)
        _check_positive("rollout.reward_scale", self.reward_scale)
        _check_positive("rollout.reward_clip", self.reward_clip)
        if not self.normalize_reward and self.reward_clip != type(self).__dataclass_fields__["reward_clip"].default:
            _inert("rollout.reward_clip", self.reward_clip, "rewards are not normalised (rollout.normalize_reward = False)")
        if not (self.normalize_obs or self.normalize_reward) and self.stats_update != "after_sgd":
            _inert("rollout.stats_update", self.stats_update,
                   "nothing is normalised (rollout.normalize_obs and rollout.normalize_reward are False)")

@record_given
@dataclass(frozen=True)
class PPOConfig:
    """The PPO update: optimisation, advantage estimation and the clipped objectives."""

    num_epochs: int = 5
    """Passes over each consumed batch."""
    num_minibatches: int = 16
    """Minibatches per epoch; the batch (num_envs * num_steps) must divide evenly."""
    learning_rate: float = 1e-3
    """Adam step size."""
    anneal_lr: bool = True
    """Linearly decay the learning rate to 0 over the run."""
    gamma: float = 0.95
    """Discount factor, in (0, 1]."""
    gae_lambda: float = 0.95
    """GAE lambda, in (0, 1]."""
    clip_eps: float = 0.2
    """PPO ratio clip range eps: the ratio is clipped to [1 - eps, 1 + eps]."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 (Ye et al. 2020) bounding the loss for negative advantages; None = plain PPO."""
    value_clip_eps: float | None = None
    """Clip the value update around the pre-update values by this much; None = no value clipping."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.0
    """Weight of the entropy bonus."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    normalize_advantages: bool = True
    """Standardise advantages per minibatch."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    advantage_estimator: AdvantageEstimatorName = "gae"
    """gae: plain GAE on (possibly stale) data; vtrace: advantages with truncated importance weights (Espeholt et al. 2018)."""
    rho_bar: float = 1.0
    """V-trace truncation of the importance weight in the TD error (vtrace only)."""
    c_bar: float = 1.0
    """V-trace truncation of the trace-cutting weights (vtrace only)."""
    value_update_every: int = 1
    """Update the value network only every k-th learner iteration (1 = always)."""
    objective: ObjectiveName = "ppo"
    """ppo: clip the ratio pi / mu to the behaviour policy; decoupled: clip pi / pi_prox to a proximal policy and weight by min(pi_prox / mu, is_clip) (Hilton et al. 2021). Traced: one compile serves both."""
    is_clip: float | None = 2.0
    """decoupled: truncation of the importance weight pi_prox / mu (>= 1; None = untruncated)."""
    prox_ewma: float | None = None
    """decoupled: pi_prox is an exponential moving average of the learner's params with this decay per SGD step, in [0, 1) (Hilton et al.'s PPO-EWMA); None = the learner at the start of the iteration."""

    def __post_init__(self) -> None:
        check_field_types(self, "ppo.")
        _check_int("ppo.num_epochs", self.num_epochs, 1)
        _check_int("ppo.num_minibatches", self.num_minibatches, 1)
        _check_positive("ppo.learning_rate", self.learning_rate)
        _check_unit_interval("ppo.gamma", self.gamma)
        _check_unit_interval("ppo.gae_lambda", self.gae_lambda)
        _check_positive("ppo.clip_eps", self.clip_eps)
        if self.clip_eps >= 1.0:
            _fail("ppo.clip_eps", self.clip_eps, "must lie in (0, 1)")
        if self.dual_clip is not None:
            if (
                not isinstance(self.dual_clip, (int, float))
                or isinstance(self.dual_clip, bool)
                or not math.isfinite(self.dual_clip)
                or not self.dual_clip > 1.0
            ):
                _fail("ppo.dual_clip", self.dual_clip, "must be None or a finite number > 1")
        if self.value_clip_eps is not None:
            _check_positive("ppo.value_clip_eps", self.value_clip_eps)
        _check_non_negative("ppo.vf_coef", self.vf_coef)
        _check_non_negative("ppo.ent_coef", self.ent_coef)
        _check_positive("ppo.max_grad_norm", self.max_grad_norm)
        _check_positive("ppo.adam_eps", self.adam_eps)
        _check_positive("ppo.rho_bar", self.rho_bar)
        _check_positive("ppo.c_bar", self.c_bar)
        _check_int("ppo.value_update_every", self.value_update_every, 1)
        if self.is_clip is not None:
            _check_positive("ppo.is_clip", self.is_clip)
            if not self.is_clip >= 1.0:
                _fail("ppo.is_clip", self.is_clip, "must be None or a number >= 1 (a weight pi_prox / mu truncated below 1 would down-weight on-policy samples)")
        if self.prox_ewma is not None:
            if not (isinstance(self.prox_ewma, (int, float)) and 0.0 <= self.prox_ewma < 1.0):
                _fail("ppo.prox_ewma", self.prox_ewma, "must be None or a decay in [0, 1)")

@record_given
@dataclass(frozen=True)
class NetworkConfig:
    """Actor-critic architecture."""

    actor_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy MLP."""
    critic_hidden: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the value MLP."""
    activation: ActivationName = "tanh"
    """Hidden activation."""
    init: WeightInitName = "orthogonal"
    """Weight init: "orthogonal" (gains sqrt(2) hidden, 0.01 policy head, 1 value head, zero biases; Huang et al. 2022, as CleanRL / SB3) or "lecun" (Flax's default Dense init, LeCun-normal kernels and zero biases everywhere: the ablation's baseline)."""
    shared_torso: bool = False
    """Share the hidden layers between actor and critic (actor_hidden is used)."""
    state_dependent_std: bool = False
    """Gaussian log-std as a network output instead of a learned state-independent vector."""
    init_log_std: float = 0.0
    """Initial Gaussian log standard deviation."""
    bounded_mean: bool = False
    """Continuous actions: the Gaussian mean is tanh-squashed into the env's action bounds, so the deterministic (mean) action is always a valid one; samples and their log-probs stay exact Gaussian ones."""

    def __post_init__(self) -> None:
        check_field_types(self, "network.")
        for name in ("actor_hidden", "critic_hidden"):
            widths = getattr(self, name)
            if not isinstance(widths, (tuple, list)) or not all(
                isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths
            ):
                _fail(f"network.{name}", widths, "must be a sequence of integers >= 1")
            object.__setattr__(self, name, tuple(widths))
        if (
            not isinstance(self.init_log_std, (int, float))
            or isinstance(self.init_log_std, bool)
            or not -20.0 <= self.init_log_std <= 2.0
        ):
            _fail("network.init_log_std", self.init_log_std, "must lie in [-20, 2]")

@record_given
@dataclass(frozen=True)
class LagConfig:
    """Policy lag: the lag schedule (simulated mode, and threaded runs with threaded.barrier = True)
    and the stale-sample filter (every mode).

    A schedule gives each consumed rollout chunk a lag K: it is made with the params and
    normalisation statistics of version v - K (v the learner's version when it is consumed,
    never below version 0). The simulated mode emulates it in one jitted program (one chunk per
    learner iteration, from emulated sampler i mod num_samplers); a threaded barrier run makes it
    on real samplers, JAX or host-side envs alike (one chunk per sampler thread and learner
    iteration; the default, fixed K = 0, is the classic barrier). Without a barrier a threaded
    run's lag emerges from timing, and the schedule fields are an error there, as in sync mode.

    Schedules (drawn on the host from `seed` by `ppo_async.core.lag`):
      fixed: every chunk is K versions old.
      per_sampler: sampler s (emulated, or threaded sampler s) is `per_sampler[s]` versions old.
      uniform: lag ~ U{low, ..., high}, per chunk.
      geometric: lag ~ Geometric(p) - 1 (P(lag = k) = p (1 - p)^k), truncated to `high`.
      straggler: the first ceil(fraction * num_samplers) samplers refresh their params only
        every `slowdown`-th rollout (the others every rollout); lag is counted in learner
        versions (simulated: num_samplers versions pass between a sampler's rollouts; barrier: one).
      replay: the lags of a recorded run, read from `replay_path` (the version schedule a
        threaded run writes; format in `ppo_async.core.lag`).
    """

    schedule: LagScheduleName = "fixed"
    """Lag schedule: acts in mode='simulated' and in threaded barrier runs (threaded.barrier = True)."""
    K: int = 0
    """fixed: the lag of every chunk, in learner versions (simulated; threaded with barrier)."""
    per_sampler: tuple[int, ...] = ()
    """per_sampler: one lag per sampler (simulated: its length sets num_samplers; threaded with barrier: one per threaded.num_samplers)."""
    low: int = 0
    """uniform: smallest lag (simulated; threaded with barrier)."""
    high: int = 4
    """uniform: largest lag; geometric: truncation (simulated; threaded with barrier)."""
    p: float = 0.5
    """geometric: success probability in (0, 1] (simulated; threaded with barrier)."""
    fraction: float = 0.25
    """straggler: fraction of samplers that are slow, in (0, 1] (simulated: of num_samplers; threaded with barrier: of threaded.num_samplers)."""
    slowdown: int = 4
    """straggler: slow samplers refresh this many times less often (simulated; threaded with barrier)."""
    replay_path: str | None = None
    """replay: path of a version schedule (JSONL or CSV) recorded by a threaded run. Simulated: one record per learner iteration (its sampler_id and lag); threaded with barrier: one record per iteration (its lag for every sampler) or threaded.num_samplers records (one per sampler)."""
    num_samplers: int | None = None
    """Simulated mode only: emulated samplers, each with its own envs and env seeds; batches are
    consumed round-robin. None: 1, or with schedule='replay' the samplers the replayed file names
    (its largest sampler_id + 1); see `ppo_async.core.lag.num_samplers_of`. A threaded run's
    samplers are threaded.num_samplers."""
    max_lag: int | None = None
    """Stale filter (every mode): samples whose lag exceeds this are dropped at consumption (and counted); None keeps all. A threaded barrier run refuses one below its schedule's largest lag."""
    seed: int = 0
    """Seed of the random schedules (uniform, geometric; simulated and threaded with barrier)."""

    def __post_init__(self) -> None:
        check_field_types(self, "lag.")
        _check_int("lag.K", self.K, 0)
        if not isinstance(self.per_sampler, (tuple, list)) or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in self.per_sampler
        ):
            _fail("lag.per_sampler", self.per_sampler, "must be a sequence of integers >= 0")
        object.__setattr__(self, "per_sampler", tuple(self.per_sampler))
        _check_int("lag.low", self.low, 0)
        _check_int("lag.high", self.high, 0)
        if self.high < self.low:
            _fail("lag.high", self.high, f"must be >= lag.low = {self.low}")
        _check_unit_interval("lag.p", self.p)
        _check_unit_interval("lag.fraction", self.fraction)
        _check_int("lag.slowdown", self.slowdown, 1)
        if self.num_samplers is not None:
            _check_int("lag.num_samplers", self.num_samplers, 1)
        _check_int("lag.seed", self.seed, 0)
        if self.max_lag is not None:
            _check_int("lag.max_lag", self.max_lag, 0)
        if self.schedule == "per_sampler":
            if not self.per_sampler:
                _fail("lag.per_sampler", self.per_sampler, "must list one lag per sampler for schedule='per_sampler'")
            if self.num_samplers not in (None, 1, len(self.per_sampler)):
                _fail(
                    "lag.num_samplers",
                    self.num_samplers,
                    f"must equal len(lag.per_sampler) = {len(self.per_sampler)} (or be left unset)",
                )
        if self.schedule == "replay" and not self.replay_path:
            _fail("lag.replay_path", self.replay_path, "must name a schedule file for schedule='replay'")

DEFAULT_BUFFER_CHUNKS = 4

DEFAULT_KL_WINDOW = 8  # learner iterations per KL-controller decision (threaded.kl_window = None)
DEFAULT_KL_QUANTILE = 0.8  # fraction of iterations the KL controller holds under its target (threaded.kl_quantile = None)

@record_given
@dataclass(frozen=True)
class ThreadedConfig:
    """Threaded mode: real sampler threads, a device ring buffer and a learner (lag emerges from timing)."""

    num_samplers: int = 2
    """Sampler threads, each with its own jitted vmapped rollout, params snapshot, envs and RNG."""
    refresh_lag: int = 1
    """A sampler pulls new params only when at least this many versions behind."""
    min_refresh_interval_s: float = 0.0
    """... and no more often than this (seconds)."""
    buffer_capacity: int | None = None
    """Ring-buffer capacity in transitions, a whole number of rollout chunks (num_envs * num_steps each); None = 4 chunks."""
    full_policy: FullPolicyName = "block"
    """What a full buffer does to a producer: overwrite the oldest chunk (counted) or block (wait for space). Either way a put waits for the buffer lock while other samplers write theirs (see sampler_wait_buffer_s)."""
    sampler_step_latency_ms: tuple[float, ...] = ()
    """Simulated env-step latency per sampler (ms per env step, slept outside the GIL after each rollout); () = none."""
    latency_jitter: float = 0.0
    """Relative jitter of the latency, uniform in [1 - j, 1 + j]."""
    timeout_s: float = 30.0
    """Seconds a thread may make no progress in its own work, or all threads may wait on each other, before the run fails with `StalledThread` (one line naming the thread; exit status 5 from the CLI). A slow thread that keeps stepping never fails the run, however long its rollouts take."""
    barrier: bool = False
    """Barrier baseline (synchronous distributed PPO): each learner batch holds one rollout from every sampler, all made with the latest params (lag 0); samplers wait for each new version. With a lag.* schedule the samplers act with version v - K instead (exact scheduled lag, JAX or host-side envs; see LagConfig)."""
    chunks_per_batch: int | None = None
    """Rollout chunks (num_envs * num_steps each) per learner batch; None = 1, or num_samplers with barrier."""
    sampler_devices: tuple[int, ...] = ()
    """Indices into jax.devices() the samplers run on (sampler i uses entry i mod len); () = auto (device 0, or the first half of several devices)."""
    learner_devices: tuple[int, ...] = ()
    """Indices into jax.devices() of the data-parallel learner (shard_map over them; one = plain jit); () = auto (device 0, or the second half)."""
    kl_target: float | None = None
    """Online KL controller (off: None): holds each iteration's approx_kl at or under this target (kl_quantile of the iterations) with two actuators: the number of active samplers, refresh_lag and lag.max_lag for its staleness part (kl_staleness), the learning rate's scale for its update part (kl_update) (`ppo_async.core.kl_control`; state in the controller_* metrics)."""
    kl_window: int | None = None
    """Learner iterations of kl_staleness the controller averages per lag-knob decision (and waits after each change); None = 8. Needs kl_target."""
    kl_quantile: float | None = None
    """Fraction of iterations the KL controller holds at or under kl_target, in (0, 1): it aims below the target by the margin it measures between this quantile of approx_kl and the mean of its parts; None = 0.8. Needs kl_target."""

    def __post_init__(self) -> None:
        check_field_types(self, "threaded.")
        _check_int("threaded.num_samplers", self.num_samplers, 1)
        _check_int("threaded.refresh_lag", self.refresh_lag, 1)
        _check_non_negative("threaded.min_refresh_interval_s", self.min_refresh_interval_s)
        if self.buffer_capacity is not None:
            _check_int("threaded.buffer_capacity", self.buffer_capacity, 1)
        lat = self.sampler_step_latency_ms
        if not isinstance(lat, (tuple, list)) or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in lat
        ):
            _fail("threaded.sampler_step_latency_ms", lat, "must be a sequence of numbers >= 0")
        else:
            object.__setattr__(self, "sampler_step_latency_ms", tuple(float(x) for x in lat))
        if lat and len(lat) != self.num_samplers:
            _fail(
                "threaded.sampler_step_latency_ms", lat,
                f"must list one latency per sampler (threaded.num_samplers = {self.num_samplers}) or be empty",
            )
        if not 0.0 <= self.latency_jitter < 1.0:
            _fail("threaded.latency_jitter", self.latency_jitter, "must lie in [0, 1)")
        _check_positive("threaded.timeout_s", self.timeout_s)
        if self.chunks_per_batch is not None:
            _check_int("threaded.chunks_per_batch", self.chunks_per_batch, 1)
            if self.barrier and self.chunks_per_batch != self.num_samplers:
                _fail(
                    "threaded.chunks_per_batch", self.chunks_per_batch,
                    f"must equal threaded.num_samplers = {self.num_samplers} with barrier=True (one rollout per sampler), or be None",
                )
        if self.kl_target is not None:
            _check_positive("threaded.kl_target", self.kl_target)
            if self.barrier:
                _fail("threaded.kl_target", self.kl_target,
                      "must be None with barrier=True (a barrier run has lag 0: there is no lag to control)")
        if self.kl_window is not None:
            _check_int("threaded.kl_window", self.kl_window, 1)
            if self.kl_target is None:
                _fail("threaded.kl_window", self.kl_window, "needs threaded.kl_target (the controller is off)")
        if self.kl_quantile is not None:
            if not 0.0 < self.kl_quantile < 1.0:
                _fail("threaded.kl_quantile", self.kl_quantile, "must lie in (0, 1) (a fraction of iterations)")
            if self.kl_target is None:
                _fail("threaded.kl_quantile", self.kl_quantile, "needs threaded.kl_target (the controller is off)")
        for name in ("sampler_devices", "learner_devices"):
            devices = getattr(self, name)
            if not isinstance(devices, (tuple, list)) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices
            ):
                _fail(f"threaded.{name}", devices, "must be a sequence of device indices >= 0 (into jax.devices())")
            elif len(set(devices)) != len(devices):
                _fail(f"threaded.{name}", devices, "must not repeat a device")
            object.__setattr__(self, name, tuple(devices))

    @property
    def effective_kl_window(self) -> int:
        """Iterations per controller decision: kl_window, else 8."""
        return DEFAULT_KL_WINDOW if self.kl_window is None else self.kl_window

    @property
    def effective_kl_quantile(self) -> float:
        """Fraction of iterations the controller holds under its target: kl_quantile, else 0.8."""
        return DEFAULT_KL_QUANTILE if self.kl_quantile is None else float(self.kl_quantile)

    @property
    def effective_chunks_per_batch(self) -> int:
        """Chunks per learner batch: chunks_per_batch, else num_samplers (barrier) or 1."""
        if self.chunks_per_batch is not None:
            return self.chunks_per_batch
        return self.num_samplers if self.barrier else 1

@record_given
@dataclass(frozen=True)
class EnvOptions:
    """Options of the physics-simulator env families (brax/*, playground/*); for gymnax and
    gymnasium envs they must stay unset (they would do nothing)."""

    backend: str | None = None
    """Physics backend: for brax/* one of generalized, positional, spring, mjx (None = the env's CPU-friendly default, see docs/how-to/environments.md); for playground/* jax or warp (None = jax)."""
    episode_length: int | None = None
    """Time limit in env steps for brax/* and playground/* (a truncation, bootstrapped); None = 1000 for brax, the task's own for playground."""

    def __post_init__(self) -> None:
        check_field_types(self, "env_options.")
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend):
            _fail("env_options.backend", self.backend, "must be a backend name or None")
        if self.episode_length is not None:
            _check_int("env_options.episode_length", self.episode_length, 1)

@record_given
@dataclass(frozen=True)
class DistributedConfig:
    """Several processes (jax.distributed, threaded mode): every process runs the same command with
    its own process_id; each has its own samplers, ring buffer and learner shard, and the learners
    of all processes form one data-parallel update (rollout and threaded sizes are per process:
    the learner batch is num_processes times one process's). `python -m ppo_async launch` fills
    these in for local processes; `cluster` takes them from a cluster's environment."""

    num_processes: int = 1
    """Processes in the run (1 = this process alone; > 1 needs mode='threaded')."""
    process_id: int | None = None
    """This process's index in [0, num_processes); process 0 writes the run directory."""
    coordinator_address: str | None = None
    """host:port of process 0's coordination service (every process passes the same)."""
    heartbeat_timeout_s: int = 10
    """Seconds without a heartbeat after which a process counts as dead: its peers name it and stop after half of this (ppo_async's watch); JAX's coordination service, the backstop, declares it dead 10 s later."""
    initialization_timeout_s: int = 120
    """Seconds every process waits for all the others to join (and process 0's run directory)."""
    cluster: ClusterName = "none"
    """Where num_processes, process_id and coordinator_address come from: none (those fields) or slurm (the SLURM task's environment, read by JAX's own cluster detection: SLURM_NTASKS, SLURM_PROCID, the first node of SLURM_STEP_NODELIST, a port from SLURM_JOB_ID or $JAX_COORDINATOR_PORT); leave the three unset, `ppo_async.runtime.distributed.initialize` fills them in."""

    learner_sync: LearnerSync = "auto"
    """How the processes' learners stay identical: batch (one all-gather of every process's samples per iteration, then each process runs the whole update on the whole batch: no collective per SGD step; replicated compute), gradients (each process updates on its own samples and the gradients are all-reduced in every SGD step: data-parallel compute, one latency-bound collective per step) or auto (batch up to 65,536 samples per learner iteration over all processes, else gradients). Both give the same update (docs/how-to/distributed.md, for what each costs)."""

    def __post_init__(self) -> None:
        check_field_types(self, "distributed.")
        _check_int("distributed.num_processes", self.num_processes, 1)
        _check_int("distributed.heartbeat_timeout_s", self.heartbeat_timeout_s, 1)
        _check_int("distributed.initialization_timeout_s", self.initialization_timeout_s, 1)
        if self.cluster != "none" and self.process_id is None:  # not joined yet: the cluster gives the layout
            given = [n for n in ("num_processes", "coordinator_address") if getattr(self, n) != getattr(DistributedConfig, n)]
            if given:
                _fail(f"distributed.{given[0]}", getattr(self, given[0]), f"must be left unset with distributed.cluster = "
                      f"{self.cluster!r} (the cluster gives num_processes, process_id and coordinator_address)")
            return
        if self.num_processes <= 1:
            for name in ("process_id", "coordinator_address"):
                if getattr(self, name) is not None:
                    _inert(f"distributed.{name}", getattr(self, name), "distributed.num_processes = 1 (one process)")
            for name in ("heartbeat_timeout_s", "initialization_timeout_s", "learner_sync"):
                if getattr(self, name) != getattr(DistributedConfig, name):
                    _inert(f"distributed.{name}", getattr(self, name), "distributed.num_processes = 1 (one process)")
            return
        if self.process_id is None:
            _fail("distributed.process_id", None, f"must be set (0 .. {self.num_processes - 1}) with num_processes = {self.num_processes}")
        else:
            _check_int("distributed.process_id", self.process_id, 0)
        if self.process_id is not None and self.process_id >= self.num_processes:
            _fail("distributed.process_id", self.process_id, f"must be < distributed.num_processes = {self.num_processes}")
        address = self.coordinator_address
        host, _, port = (address or "").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            _fail("distributed.coordinator_address", address,
                  f"must be 'host:port' (e.g. '127.0.0.1:12355') with num_processes = {self.num_processes}")

def check_env_options(config: "Config") -> None:
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
    run_dir: str | None = None
    """Directory for config.json, metrics.jsonl, checkpoints/, tb/ and plots; None writes nothing."""
    checkpoint_every: int = 0
    """Save a checkpoint into RUN_DIR/checkpoints every this many learner iterations (0 = only the final one)."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk (the oldest are deleted)."""
    wandb_project: str | None = None
    """Also log every metric row to this Weights & Biases project (needs `pip install wandb`; never required); None = off."""
    eval_every: int = 0
    """Evaluate the learner's current params every this many learner iterations (and after the last), logged as eval_return; 0 = off."""
    eval_episodes: int = 10
    """Episodes per evaluation (deterministic actions: the Gaussian mean / the argmax)."""
    log_every: int = 1
    """Learner iterations per metrics row: a row aggregates the iterations since the previous one (means, maxima, summed histograms and counts, the last counters; `ppo_async.report.aggregate`), in metrics.jsonl, TensorBoard, W&B and TrainResult.metrics alike. The non-finite checks, the sample accounting and the warnings still run every iteration."""
    overwrite: bool = False
    """Replace a run already in run_dir (its metrics, checkpoints, schedules and plots); without it a run_dir holding a run is refused (resume it instead)."""
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
        _check_int("checkpoint_every", self.checkpoint_every, 0)
        _check_int("keep_checkpoints", self.keep_checkpoints, 1)
        _check_int("eval_every", self.eval_every, 0)
        _check_int("eval_episodes", self.eval_episodes, 1)
        _check_int("log_every", self.log_every, 1)
        for name, cls in (("env_options", EnvOptions), ("rollout", RolloutConfig), ("ppo", PPOConfig), ("network", NetworkConfig), ("lag", LagConfig), ("threaded", ThreadedConfig), ("distributed", DistributedConfig)):
            if not isinstance(getattr(self, name), cls):
                _fail(name, getattr(self, name), f"must be a {cls.__name__}")
        stop_if_failed(then=self._check_env_name)  # the rules below compare fields with each other
        check_sizes(self)  # int32 and sane bounds, before any rule that multiplies them
        self._check_env_name()  # after the env-free checks: a gymnax name imports gymnax (and JAX)
        # after the name check: an unknown name is reported as such, not as the wrong mode for it
        if split_env_name(self.env)[0] in HOST_ENV_FAMILIES and self.mode != "threaded":
            _fail("mode", self.mode,
                  f"must be 'threaded' for the host-side env {self.env!r} (its simulator steps on each sampler "
                  "thread's host, outside jit; sync and simulated modes need a JAX env: gymnax, brax/* or playground/*)")
        if self.run_dir is not None and self.checkpoint_every % self.log_every != 0:
            _fail("checkpoint_every", self.checkpoint_every,
                  f"must be a multiple of log_every = {self.log_every} (a checkpoint closes a metrics row, so a resumed run continues its rows exactly)")
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
        if tcfg.barrier and tcfg.full_policy == "overwrite_oldest" and self.buffer_capacity_chunks < tcfg.num_samplers:
            _fail(
                "threaded.buffer_capacity", tcfg.buffer_capacity or self.buffer_capacity_chunks * self.chunk_size,
                f"must hold >= threaded.num_samplers = {tcfg.num_samplers} chunks ({tcfg.num_samplers * self.chunk_size} "
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
        if self.mode == "threaded" and self.threaded.effective_chunks_per_batch > 1:
            formula += " * threaded.chunks_per_batch"
        if self.distributed.num_processes > 1:
            formula += " * distributed.num_processes"
        return formula

    @property
    def chunk_size(self) -> int:
        """Transitions in one rollout chunk (num_envs * num_steps)."""
        return self.rollout.num_envs * self.rollout.num_steps

    @property
    def local_batch_size(self) -> int:
        """Transitions one process's learner takes per iteration: one chunk, or
        threaded.chunks_per_batch chunks in threaded mode."""
        if self.mode == "threaded":
            return self.chunk_size * self.threaded.effective_chunks_per_batch
        return self.chunk_size

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
    def sgd_steps_per_iteration(self) -> int:
        """Gradient steps per learner iteration (num_epochs * num_minibatches)."""
        return self.ppo.num_epochs * self.ppo.num_minibatches

    @property
    def preset_fields(self) -> tuple[str, ...]:
        """The dotted fields the env's preset filled because this config's caller did not set
        them (`ppo_async.config.explicit`); () when every field was given."""
        return preset_fields(self)

    def replace(self, **changes: Any) -> "Config":
        """A copy with top-level fields replaced (validated again). Replacing `env` rebuilds the
        config from what its caller set, so the new env's preset fills the rest (not the old
        env's values)."""
        if "env" in changes and changes["env"] != self.env and self.preset_fields:
            return Config(**{**as_given(self), **changes})
        new = dataclasses.replace(self, **changes)
        object.__setattr__(new, "_given_fields", given_fields(self) | frozenset(changes))
        object.__setattr__(new, "_preset_fields", tuple(p for p in self.preset_fields if p.partition(".")[0] not in changes))
        return new

# Lag-schedule fields (all of LagConfig but the stale filter) act only in simulated mode and in
# threaded barrier runs; within them, each schedule reads only its own fields. lag.num_samplers
# acts in every schedule of the simulated mode.
LAG_FILTER_FIELDS = ("max_lag",)

SCHEDULE_FIELDS = {
    "fixed": ("K",),
    "per_sampler": ("per_sampler",),
    "uniform": ("low", "high", "seed"),
    "geometric": ("p", "high", "seed"),
    "straggler": ("fraction", "slowdown"),
    "replay": ("replay_path",),
}

def check_fields_apply(config: "Config") -> None:
    """Raises ConfigError for a field set away from its default where it would do nothing.

    A knob that silently does nothing is a wrong experiment: `lag.K = 8` in sync mode runs at
    lag 0. The rules: lag-schedule fields need mode='simulated' or a threaded barrier run
    (`lag.max_lag`, the stale filter, acts in every mode) and, within it, the schedule that
    reads them (`_lag_inert_reason`); `threaded.*`
    fields need mode='threaded' (`threaded.latency_jitter` also needs a latency);
    `ppo.rho_bar` / `ppo.c_bar` need advantage_estimator='vtrace'; `ppo.is_clip` /
    `ppo.prox_ewma` need objective='decoupled'; checkpoint_every,
    keep_checkpoints and overwrite need a run_dir.
    """
    check_env_options(config)
    for name in _changed(config.lag, LagConfig()):
        why = _lag_inert_reason(config, name)
        if why is not None:
            _inert(f"lag.{name}", getattr(config.lag, name), why)
    barrier = config.mode == "threaded" and config.threaded.barrier
    if barrier and config.lag.schedule == "per_sampler" and len(config.lag.per_sampler) != config.threaded.num_samplers:
        _fail("lag.per_sampler", config.lag.per_sampler,
              f"must list one lag per sampler thread (threaded.num_samplers = {config.threaded.num_samplers})")
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
    if config.eval_every == 0 and config.eval_episodes != type(config).__dataclass_fields__["eval_episodes"].default:
        _inert("eval_episodes", config.eval_episodes, "evaluation is off (eval_every = 0)")
    if config.run_dir is None:
        for name in ("checkpoint_every", "keep_checkpoints", "overwrite"):
            if getattr(config, name) != type(config).__dataclass_fields__[name].default:
                _inert(name, getattr(config, name), "there is no run_dir to write checkpoints into")


def _lag_inert_reason(config: "Config", name: str) -> str | None:
    """Why the lag field `name` (set away from its default) does nothing in `config`; None when
    it acts. The stale filter acts everywhere; the schedule fields in mode='simulated' and in a
    threaded barrier run (the run that makes the schedule's lags on real samplers), each read by
    its schedule; lag.num_samplers counts the simulated mode's emulated samplers only."""
    lag, barrier = config.lag, config.mode == "threaded" and config.threaded.barrier
    if name in LAG_FILTER_FIELDS:
        return None
    if name == "num_samplers" and barrier and lag.num_samplers != config.threaded.num_samplers:
        return ("a threaded barrier run's schedule has one lag per sampler thread: set threaded.num_samplers "
                "(lag.num_samplers counts the simulated mode's emulated samplers)")
    if name == "num_samplers" and (barrier or config.mode == "simulated" or lag.num_samplers == 1):
        return None  # (1: the default's meaning)
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

def check_given_apply(config: Config, paths: Any) -> None:
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

def check_config_type(config: object, name: str = "config") -> None:
    """TypeError naming the argument when `config` is not a `Config` (e.g. a string or a dict)."""
    if not isinstance(config, Config):
        hint = " (build one with ppo_async.config_from_dict)" if isinstance(config, dict) else ""
        raise TypeError(f"{name} = {config!r:.60} is invalid: must be a ppo_async.Config, not {type(config).__name__}{hint}")
