"""The config's sections: one frozen dataclass per concern (`rollout`, `ppo`, `network`, `lag`,
`threaded`, `env_options`, `distributed`), each validating its own fields at construction and
raising `ConfigError` naming the field (with its section prefix), the value and what is
allowed. The run-level `Config` that holds them is in `run_config`; the rules of which fields
act under which others in `applicability`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppo_async.config.checks import (
    _check_int,
    _check_non_negative,
    _check_positive,
    _check_unit_interval,
    _fail,
    _inert,
    check_field_types,
)
from ppo_async.config.choices import (
    ActivationName,
    AdvantageEstimatorName,
    ClusterName,
    FullPolicyName,
    LagScheduleName,
    LearnerSync,
    ObjectiveName,
    StatsUpdateName,
    WeightInitName,
)
from ppo_async.config.explicit import record_given


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
    learner iteration, from emulated sampler i mod S, S = the run's num_samplers); a threaded barrier run makes it
    on real samplers, JAX or host-side envs alike (one chunk per sampler thread and learner
    iteration; the default, fixed K = 0, is the classic barrier). Without a barrier a threaded
    run's lag emerges from timing, and the schedule fields are an error there, as in sync mode.

    Schedules (drawn on the host from `seed` by `ppo_async.core.lag`):
      fixed: every chunk is K versions old.
      per_sampler: sampler s (emulated, or threaded sampler s) is `per_sampler[s]` versions old.
      uniform: lag ~ U{low, ..., high}, per chunk.
      geometric: lag ~ Geometric(p) - 1 (P(lag = k) = p (1 - p)^k), truncated to `high`.
      straggler: the first ceil(fraction * S) samplers refresh their params only
        every `slowdown`-th rollout (the others every rollout); lag is counted in learner
        versions (simulated: S versions pass between a sampler's rollouts; barrier: one).
      replay: the lags of a recorded run, read from `replay_path` (the version schedule a
        threaded run writes; format in `ppo_async.core.lag`).
    """

    schedule: LagScheduleName = "fixed"
    """Lag schedule: acts in mode='simulated' and in threaded barrier runs (threaded.barrier = True)."""
    K: int = 0
    """fixed: the lag of every chunk, in learner versions (simulated; threaded with barrier)."""
    per_sampler: tuple[int, ...] = ()
    """per_sampler: one lag per sampler, one per num_samplers (simulated: its length is the samplers when num_samplers is None; threaded with barrier: one per sampler thread)."""
    low: int = 0
    """uniform: smallest lag (simulated; threaded with barrier)."""
    high: int = 4
    """uniform: largest lag; geometric: truncation (simulated; threaded with barrier)."""
    p: float = 0.5
    """geometric: success probability in (0, 1] (simulated; threaded with barrier)."""
    fraction: float = 0.25
    """straggler: fraction of the samplers (num_samplers) that are slow, in (0, 1] (simulated; threaded with barrier)."""
    slowdown: int = 4
    """straggler: slow samplers refresh this many times less often (simulated; threaded with barrier)."""
    replay_path: str | None = None
    """replay: path of a version schedule (JSONL or CSV) recorded by a threaded run. Simulated: one record per learner iteration (its sampler_id and lag); threaded with barrier: one record per iteration (its lag for every sampler) or num_samplers records (one per sampler)."""
    num_samplers: int | None = None
    """Deprecated (goes in the next release): the top-level num_samplers (the simulated mode's emulated samplers were counted here). Setting it sets num_samplers, with a FutureWarning, and it reads None again."""
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
        if self.num_samplers is not None:  # (the deprecated spelling of num_samplers: `Config` reads it)
            _check_int("lag.num_samplers", self.num_samplers, 1)
        _check_int("lag.seed", self.seed, 0)
        if self.max_lag is not None:
            _check_int("lag.max_lag", self.max_lag, 0)
        if self.schedule == "per_sampler":
            if not self.per_sampler:
                _fail("lag.per_sampler", self.per_sampler, "must list one lag per sampler for schedule='per_sampler'")
        if self.schedule == "replay" and not self.replay_path:
            _fail("lag.replay_path", self.replay_path, "must name a schedule file for schedule='replay'")

DEFAULT_BUFFER_CHUNKS = 4

DEFAULT_KL_WINDOW = 8  # learner iterations per KL-controller decision (threaded.kl_window = None)
DEFAULT_KL_QUANTILE = 0.8  # fraction of iterations the KL controller holds under its target (threaded.kl_quantile = None)

@record_given
@dataclass(frozen=True)
class ThreadedConfig:
    """Threaded mode: real sampler threads, a device ring buffer and a learner (lag emerges from timing)."""

    num_samplers: int | None = None
    """Deprecated (goes in the next release): the top-level num_samplers (the sampler threads were counted here). Setting it sets num_samplers, with a FutureWarning, and it reads None again."""
    refresh_lag: int = 1
    """A sampler pulls new params only when at least this many versions behind."""
    min_refresh_interval_s: float = 0.0
    """... and no more often than this (seconds)."""
    buffer_capacity: int | None = None
    """Ring-buffer capacity in transitions, a whole number of rollout chunks (num_envs * num_steps each); None = 4 chunks."""
    full_policy: FullPolicyName = "block"
    """What a full buffer does to a producer: overwrite the oldest chunk (counted) or block (wait for space). Either way a put waits for the buffer lock while other samplers write theirs (see sampler_wait_buffer_s)."""
    sampler_step_latency_ms: tuple[float, ...] = ()
    """Simulated env-step latency per sampler, one per num_samplers (ms per env step, slept outside the GIL after each rollout); () = none."""
    latency_jitter: float = 0.0
    """Relative jitter of the latency, uniform in [1 - j, 1 + j]."""
    timeout_s: float = 30.0
    """Seconds a thread may make no progress in its own work, or all threads may wait on each other, before the run fails with `StalledThread` (one line naming the thread; exit status 5 from the CLI). A slow thread that keeps stepping never fails the run, however long its rollouts take."""
    barrier: bool = False
    """Barrier baseline (synchronous distributed PPO): each learner batch holds one rollout from every sampler, all made with the latest params (lag 0); samplers wait for each new version. With a lag.* schedule the samplers act with version v - K instead (exact scheduled lag, JAX or host-side envs; see LagConfig)."""
    chunks_per_batch: int | None = None
    """Rollout chunks (num_envs * num_steps each) per learner batch; None = 1, or one per sampler (num_samplers) with barrier."""
    sampler_devices: tuple[int, ...] = ()
    """Indices into jax.devices() the samplers run on (sampler i uses entry i mod len); () = auto (device 0, or the first half of several devices)."""
    learner_devices: tuple[int, ...] = ()
    """Indices into jax.devices() of the data-parallel learner (shard_map over them; one = plain jit); () = auto (device 0, or the second half)."""
    kl_target: float | None = None
    """Online KL controller (off: None): holds each iteration's approx_kl at or under this target (kl_quantile of the iterations) with two actuators: refresh_lag and lag.max_lag for its staleness part (kl_staleness; a max_lag that wastes over 10% of the samples is loosened), the learning rate's scale for its update part (kl_update, and the staleness where the knobs are at their floor and a smaller step lowers it) (`ppo_async.core.kl_control`; state in the controller_* metrics)."""
    kl_window: int | None = None
    """Learner iterations of kl_staleness the controller averages per lag-knob decision (and waits after each change); None = 8. Needs kl_target."""
    kl_quantile: float | None = None
    """Fraction of iterations the KL controller holds at or under kl_target, in (0, 1): it aims below the target by the margin it measures between this quantile of approx_kl and the mean of its parts; None = 0.8. Needs kl_target."""

    def __post_init__(self) -> None:
        check_field_types(self, "threaded.")
        if self.num_samplers is not None:  # (the deprecated spelling of num_samplers: `Config` reads it)
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
        if not 0.0 <= self.latency_jitter < 1.0:
            _fail("threaded.latency_jitter", self.latency_jitter, "must lie in [0, 1)")
        _check_positive("threaded.timeout_s", self.timeout_s)
        if self.chunks_per_batch is not None:
            _check_int("threaded.chunks_per_batch", self.chunks_per_batch, 1)  # (one per sampler with barrier: `Config`)
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
