"""Threaded mode: sampler threads -> device ring buffer -> learner thread; lag emerges from timing.

Each sampler thread (`sampler.Sampler`) owns a jitted, vmapped rollout (N envs x T steps) on its
device (`threaded.sampler_devices`), its params snapshot and version, its RNG and env states. It
refreshes from the `ParamStore` when at least `refresh_lag` versions behind (no more often than
`min_refresh_interval_s`); when a finished rollout is more than `lag.max_lag` versions old it
is discarded (counted) and the sampler pulls the latest params (forced refresh). Rollouts go
into a `RingBuffer` on the first learner device, tagged `ChunkTag(sampler_id, made_at,
policy_version)`. The learner thread (`learner.Learner`) takes `chunks_per_batch` chunks per
iteration, runs the pure PPO update on its placement (`runtime.placement.learner_placement`:
one device, data-parallel over `threaded.learner_devices`, or every process's; stale samples
beyond `lag.max_lag` are dropped and counted) and publishes the new version. With a
`lag.max_lag` and full_policy "block", a sampler starts a rollout only while fewer than
`max(1, max_lag) * chunks_per_batch` chunks are committed - resident, or in the making by
samplers that reserved a place (`RingBuffer.reserve`) - since a chunk made behind more would be
stale when consumed: the freshness bound holds samplers back instead of discarding rollouts.

`threaded.kl_target` turns on the online KL controller (`ppo_async.core.kl_control`): after
each learner iteration it may pause or resume samplers and move `refresh_lag` and `max_lag`.
With `threaded.barrier` the same threads run classic synchronous distributed PPO: every
sampler makes exactly one rollout per learner iteration, and each learner batch holds one
rollout from every sampler, in sampler order (the slowest sampler sets the pace). The lag of
those rollouts is the `lag.*` schedule's, exactly (`shared.LagPlan`): for learner iteration t
sampler s acts with version max(t - K[t, s], 0), K drawn by `core.lag.barrier_lags` with the
simulated mode's code (fixed, per_sampler, uniform, geometric, straggler, replay); the
ParamStore keeps the last max(K) + 1 snapshots (params and statistics under one version). The
default schedule (fixed, K = 0) is the classic barrier: the latest params. This is how a user
asks for scheduled lag on any env, host-side simulators included: `mode="threaded"`,
`threaded.barrier=True` and a lag schedule. It reuses the barrier rather than adding a flag,
because a barrier run is that schedule's K = 0 point: one meaning of `lag.*` (the lag of each
consumed chunk) in the simulated mode and here; without a barrier the lag comes from timing
and the schedule fields are refused (`config.check_fields_apply`).

The calling thread (`run`) only logs and watches: an exception in any thread stops every thread
and is re-raised from `train()`; a thread that is stuck (no progress for `threaded.timeout_s`
in its own work) or dead, or threads that all wait for each other, stop the run with a
`StalledThread` naming them, while a slow thread that keeps stepping is never a failure
(`liveness`); Ctrl-C stops every thread, writes what was done (a final checkpoint) and
re-raises KeyboardInterrupt. Every thread is named and joined; every blocking call has a timeout.

A run resumes from its latest checkpoint (`resume`): the learner's whole state exactly (train
state, RNG key, KL controller, sample totals), the samplers restarted from its params; the lag
history is not replayed (rows after the resume carry `resumed_at_iteration`).

Modules: `shared` (what the threads share), `liveness` (heartbeats and the stall rule),
`sampler`, `learner`, `resume` (what a checkpoint carries beside the train state),
`programs` (compiled programs, set-up, checkpoint layout), `memory` (device sizes), `run` (the
calling thread and the mode's registration). May import: every layer below `modes` and
`modes.common` / `modes.registry`.
"""

from ppo_async.modes.threaded.learner import (
    IterationTimes,
    Learner,
    controller_limits,
    learner_loop,
    learner_row,
    take_batch,
    threaded_accounting,
)
from ppo_async.modes.threaded.liveness import BeatingEnv, Heartbeat, StalledThread, find_stall
from ppo_async.modes.threaded.memory import check_buffer_fits, device_memory_report, tree_bytes
from ppo_async.modes.threaded.programs import (
    ThreadedCheckpoint,
    ThreadedPrograms,
    ThreadedSetup,
    barrier_lags_of,
    clear_program_cache,
    lag_buckets_of,
    make_learner_update,
    make_threaded_setup,
    program_key,
    threaded_checkpoint,
    threaded_checkpoint_like,
    threaded_programs,
)
from ppo_async.modes.threaded.run import (
    JOIN_TIMEOUT_S,
    LOG_QUEUE_SIZE,
    MODE,
    VERSION_SCHEDULE_FILE,
    run_threaded,
    start_threads,
    stop_threads,
)
from ppo_async.modes.threaded.resume import LearnerStart, ResumePoint
from ppo_async.modes.threaded.sampler import FreshnessGate, Sampler, sampler_loop
from ppo_async.modes.threaded.shared import (
    POLL_S,
    LagPlan,
    LearnerOutput,
    LearnerState,
    RunShared,
    SamplerStats,
    ThreadError,
    ThreadFailure,
)
from ppo_async.runtime.placement import Placement, resolve_placement

__all__ = [
    "BeatingEnv", "FreshnessGate", "Heartbeat", "IterationTimes", "JOIN_TIMEOUT_S", "LOG_QUEUE_SIZE", "LagPlan", "Learner",
    "LearnerOutput", "LearnerStart", "LearnerState", "MODE", "POLL_S", "Placement", "ResumePoint", "RunShared",
    "Sampler", "SamplerStats", "StalledThread", "ThreadError", "ThreadFailure", "ThreadedCheckpoint",
    "ThreadedPrograms", "ThreadedSetup", "VERSION_SCHEDULE_FILE", "barrier_lags_of", "check_buffer_fits", "clear_program_cache",
    "controller_limits", "device_memory_report", "find_stall", "lag_buckets_of", "learner_loop", "learner_row",
    "make_learner_update", "make_threaded_setup", "program_key", "resolve_placement", "run_threaded",
    "sampler_loop", "start_threads", "stop_threads", "take_batch", "threaded_accounting", "threaded_checkpoint",
    "threaded_checkpoint_like", "threaded_programs", "tree_bytes",
]
