"""Lag schedules (simulated mode and threaded barrier runs), the version-schedule file format,
and refresh rules.

A **lag schedule** says, for each learner iteration i, which sampler's batch is consumed
(`sampler_id[i]`) and how many versions old its params are (`lag[i]`). Schedules are drawn
on the host with numpy from `LagConfig.seed` and enter the jitted program as int32 arrays,
so changing lag values never recompiles; only the ring of past params has a static size
(`ring_size = max(lag) + 1`).

The same draws drive a threaded barrier run (`barrier_lags`), whose learner iteration takes one
chunk from each of its S samplers: the schedule is then drawn for I * S consumed chunks (S per
iteration, sampler j mod S round-robin, as `make_schedule` draws for S emulated samplers) and
read as an `[I, S]` table; sampler s acts for iteration t with version
`scheduled_version(t, lags[t, s])`. One meaning of `lag.*` in both modes: the lag of a consumed
chunk, in learner versions, drawn by the same code.

**Version-schedule file** (written by threaded runs, read by `schedule="replay"`): JSON lines
(or CSV with a header) with one record per consumed batch and the columns
`SCHEDULE_COLUMNS`: `iteration` (1-based consumption order), `sampler_id`,
`policy_version` (version of the params that produced the batch), `learner_version`
(learner version when it was consumed), `lag` (= learner_version - policy_version),
`produced_time` and `consumed_time` (seconds since the run started; may be null).
Replay uses `sampler_id` and `lag`, one record per learner iteration. A multi-process run's
records also carry `process_id` (global `sampler_id`s), several per iteration: replay refuses
such a file and says what to do (`several_chunks_per_iteration`).
"""

from __future__ import annotations

import collections
import csv
import functools
import json
import math
import os
import warnings
from typing import Any, Iterable, Mapping, NamedTuple

import numpy as np

from ppo_async.config import ConfigError, LagConfig
from ppo_async.config.samplers import default_num_samplers
from ppo_async.config.schedule_file import file_key, read_rows

SCHEDULE_COLUMNS = (
    "iteration",
    "sampler_id",
    "policy_version",
    "learner_version",
    "lag",
    "produced_time",
    "consumed_time",
)


class LagSchedule(NamedTuple):
    """Per learner iteration: the sampler consumed and the lag of its params (int32 `[I]` each)."""

    sampler_id: np.ndarray
    lag: np.ndarray

    @property
    def ring_size(self) -> int:
        """Past param versions the emulation must keep: max(lag) + 1."""
        return int(self.lag.max(initial=0)) + 1


def round_robin(num_iterations: int, num_samplers: int) -> np.ndarray:
    """Sampler consumed at iteration i: i mod S (int32 `[I]`)."""
    return (np.arange(num_iterations) % num_samplers).astype(np.int32)


def straggler_lags(num_iterations: int, num_samplers: int, fraction: float, slowdown: int,
                   versions_per_rollout: int | None = None) -> np.ndarray:
    """Lags when the first ceil(fraction * S) samplers refresh only every `slowdown`-th rollout.

    Samplers are consumed round-robin, one batch per entry, so sampler s produces entries s,
    s + S, s + 2S, ... A fast sampler refreshes before every rollout (lag 0); a straggler
    refreshes at its rollouts 0, slowdown, 2 slowdown, ... and keeps those params, so its lag
    cycles through 0, D, 2D, ..., (slowdown - 1) D learner versions, D = `versions_per_rollout`
    the versions between two of a sampler's rollouts: S when one entry is one learner iteration
    (simulated mode, the default), 1 in a barrier run (S entries per iteration).

    Returns: int32 `[num_iterations]` (one lag per entry).
    """
    step = num_samplers if versions_per_rollout is None else versions_per_rollout
    num_slow = min(num_samplers, math.ceil(fraction * num_samplers))
    lags = np.zeros(num_iterations, np.int32)
    for i in range(num_iterations):
        sampler, rollout_index = i % num_samplers, i // num_samplers
        if sampler < num_slow:
            lags[i] = (rollout_index % slowdown) * step
    return lags


@functools.lru_cache(maxsize=8)
def _read_schedule_cached(path: str | None, _mtime: float, _size: int) -> LagSchedule:
    return read_schedule(path)


def drawn_lags(lag: LagConfig, num_chunks: int, num_samplers: int, versions_per_rollout: int | None = None) -> np.ndarray:
    """The lags of `num_chunks` consumed chunks under a drawn schedule (every one but replay),
    sampler `j mod num_samplers` making chunk j (round-robin); the one schedule generator of
    both modes.

    Args:
      lag: the `LagConfig` (its schedule and that schedule's fields; `seed` for the random ones).
      num_chunks: chunks consumed over the run (simulated: one per learner iteration).
      num_samplers: S, the samplers the chunks come from round-robin.
      versions_per_rollout: learner versions between two rollouts of one sampler (straggler
        only; None = S, the simulated mode's one chunk per iteration).

    Returns: int32 `[num_chunks]`.
    """
    rng = np.random.default_rng(lag.seed)
    if lag.schedule == "fixed":
        return np.full(num_chunks, lag.K, np.int32)
    if lag.schedule == "per_sampler":
        return np.asarray(lag.per_sampler, np.int32)[round_robin(num_chunks, num_samplers)]
    if lag.schedule == "uniform":
        return rng.integers(lag.low, lag.high + 1, size=num_chunks).astype(np.int32)
    if lag.schedule == "geometric":
        return np.minimum(rng.geometric(lag.p, size=num_chunks) - 1, lag.high).astype(np.int32)
    if lag.schedule == "straggler":
        return straggler_lags(num_chunks, num_samplers, lag.fraction, lag.slowdown, versions_per_rollout)
    raise ConfigError(f"lag.schedule = {lag.schedule!r} is not supported")  # LagConfig validates the name


def make_schedule(lag: LagConfig, num_iterations: int, num_samplers: int | None = None) -> LagSchedule:
    """The lag schedule of a simulated run for `num_iterations` learner iterations.

    Args:
      lag: the `LagConfig` (its schedule and that schedule's fields).
      num_iterations: I, the learner iterations (one consumed chunk each).
      num_samplers: S, the emulated samplers (`Config.effective_num_samplers`); None: what a
        simulated run with `num_samplers` unset emulates (`config.samplers.default_num_samplers`:
        len(lag.per_sampler), the samplers a replayed file names, or 1), or `lag.num_samplers`,
        its deprecated spelling, with a FutureWarning.

    Raises:
      ConfigError: a replay file that is missing, malformed, too short for the run, or names
        more samplers than `num_samplers`.
    """
    if num_samplers is None and lag.num_samplers is not None:  # (a LagConfig of its own: no Config converted it)
        num_samplers = lag.num_samplers
        warnings.warn(f"lag.num_samplers = {num_samplers} is deprecated and goes in the next release: pass "
                      f"num_samplers={num_samplers} to make_schedule (in a Config: num_samplers = {num_samplers})",
                      FutureWarning, stacklevel=2)
    if num_samplers is None:
        num_samplers = default_num_samplers("simulated", lag)
    if lag.schedule != "replay":
        return LagSchedule(round_robin(num_iterations, num_samplers), drawn_lags(lag, num_iterations, num_samplers))
    replayed = _read_schedule_cached(*file_key(lag.replay_path))
    _check_long_enough(lag.replay_path, len(replayed.lag), num_iterations)
    if int(replayed.sampler_id.max(initial=0)) >= num_samplers:
        raise ConfigError(
            f"num_samplers = {num_samplers} is invalid: the replayed schedule (lag.replay_path) names sampler "
            f"{int(replayed.sampler_id.max())}; set num_samplers >= {int(replayed.sampler_id.max()) + 1} (or None)"
        )
    return LagSchedule(replayed.sampler_id[:num_iterations].copy(), replayed.lag[:num_iterations].copy())


def _check_long_enough(path: str | None, recorded: int, num_iterations: int) -> None:
    """ConfigError when a replayed file holds fewer learner iterations than the run needs."""
    if recorded < num_iterations:
        raise ConfigError(
            f"lag.replay_path = {path!r} holds {recorded} consumed batches but the run "
            f"needs {num_iterations} learner iterations; lower total_env_steps to at most "
            f"{recorded} batches"
        )


def barrier_lags(lag: LagConfig, num_iterations: int, num_samplers: int) -> np.ndarray:
    """The lag of each sampler's chunk in each learner iteration of a threaded barrier run.

    Drawn schedules: `drawn_lags` for I * S chunks consumed S per iteration (chunk j = t S + s
    from sampler s), so fixed, uniform and geometric draw as the simulated mode does (S = 1:
    the same values), per_sampler gives sampler s its `per_sampler[s]`, and a straggler's lag
    counts the one version between its rollouts. Replay: a file with one record per learner
    iteration gives that iteration's lag to every sampler; one with S records per iteration
    (a barrier run's, or threaded.chunks_per_batch = S) gives the c-th record's lag to sampler c.

    Returns: int32 `[num_iterations, num_samplers]`.

    Raises:
      ConfigError: a replay file that is missing, malformed, too short, or holds a number of
        records per iteration other than 1 or S.
    """
    if lag.schedule == "replay":
        table = read_chunk_lags(lag.replay_path, num_samplers)
        _check_long_enough(lag.replay_path, table.shape[0], num_iterations)
        return np.ascontiguousarray(table[:num_iterations])
    chunks = drawn_lags(lag, num_iterations * num_samplers, num_samplers, versions_per_rollout=1)
    return chunks.reshape(num_iterations, num_samplers)


def scheduled_version(iteration: int, lag: int, first_iteration: int = 0, first_version: int = 0) -> int:
    """The params version a barrier sampler acts with for learner iteration `iteration` (0-based).

    The learner's version when it consumes that iteration's batch is `first_version +
    iteration - first_iteration` (one version per iteration from where the run, or its resumed
    segment, began); the chunk is `lag` versions behind it, never before `first_version`
    (warm-up: no older params exist; after a resume the history before it is not kept).
    """
    return first_version + max(iteration - first_iteration - lag, 0)


# --------------------------------------------------------------------------------------
# Version-schedule files
# --------------------------------------------------------------------------------------


def schedule_record(
    iteration: int,
    sampler_id: int,
    policy_version: int,
    learner_version: int,
    produced_time: float | None = None,
    consumed_time: float | None = None,
) -> dict[str, Any]:
    """One consumed batch as a version-schedule record (lag derived here, where it is made)."""
    return {
        "iteration": int(iteration),
        "sampler_id": int(sampler_id),
        "policy_version": int(policy_version),
        "learner_version": int(learner_version),
        # lag = learner version at consumption - version of the params that produced the batch
        "lag": int(learner_version) - int(policy_version),
        "produced_time": produced_time,
        "consumed_time": consumed_time,
    }


def write_schedule(path: str | os.PathLike, records: Iterable[Mapping[str, Any]]) -> None:
    """Writes records as JSON lines (`.jsonl`) or CSV (`.csv`)."""
    path = os.fspath(path)
    records = list(records)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if path.endswith(".csv"):
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=SCHEDULE_COLUMNS)
            writer.writeheader()
            for record in records:
                writer.writerow({k: record.get(k) for k in SCHEDULE_COLUMNS})
    else:
        with open(path, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps({k: record.get(k) for k in SCHEDULE_COLUMNS}) + "\n")


def several_chunks_per_iteration(path: str, rows: list[Mapping[str, Any]], iterations: list[int]) -> str:
    """Why a schedule with several records per learner iteration cannot be replayed, naming
    what recorded it (pure); "" when every iteration has one record.

    A multi-process threaded run (records carry `process_id`) consumes at least one chunk per
    process each iteration; a one-process run does so with `threaded.chunks_per_batch > 1`
    (or a barrier). Replay emulates one chunk per learner iteration.
    """
    per_iteration = max(collections.Counter(iterations).values())
    if per_iteration == 1:
        return ""
    where = f"lag.replay_path = {path!r}: {per_iteration} records share a learner iteration"
    processes = sorted({int(r["process_id"]) for r in rows if r.get("process_id") not in (None, "")})
    if len(processes) > 1:
        return (
            f"{where}: the schedule was recorded by {len(processes)} processes (process_id {processes}), whose "
            "one learner consumes a chunk of every process in each iteration; replay needs one chunk per "
            "learner iteration. Replay a one-process threaded run's schedule (threaded.chunks_per_batch = 1), or "
            "keep the records of one process_id (one per iteration when each process gave one chunk) to replay "
            "the lags that process's samplers saw"
        )
    return (
        f"{where} (recorded with threaded.chunks_per_batch > 1 or threaded.barrier); replay needs one chunk per "
        "learner iteration: record the schedule with threaded.chunks_per_batch = 1, or replay it in a threaded "
        f"barrier run with num_samplers = {per_iteration} (one record per sampler)"
    )


def _in_order(path: str, rows: list[dict[str, Any]], iterations: list[int]) -> LagSchedule:
    """The rows in consumption order (by iteration, file order within one) as a `LagSchedule`.

    Raises ConfigError naming the file: a lag inconsistent with its versions, negative lags or ids.
    """
    order = np.argsort(iterations, kind="stable")
    rows = [rows[i] for i in order]
    sampler_id = np.asarray([int(r["sampler_id"]) for r in rows], np.int32)
    lag = np.asarray([int(r["lag"]) for r in rows], np.int32)
    for i, r in enumerate(rows):
        if r.get("policy_version") not in (None, "") and r.get("learner_version") not in (None, ""):
            if int(r["learner_version"]) - int(r["policy_version"]) != int(r["lag"]):
                raise ConfigError(
                    f"lag.replay_path = {path!r}: record {i + 1} has lag {r['lag']} but learner_version - "
                    f"policy_version = {int(r['learner_version']) - int(r['policy_version'])}"
                )
    if (sampler_id < 0).any() or (lag < 0).any():
        raise ConfigError(f"lag.replay_path = {path!r}: sampler ids and lags must be >= 0")
    return LagSchedule(sampler_id, lag)


def read_schedule(path: str | os.PathLike | None) -> LagSchedule:
    """Reads a version-schedule file (JSONL or CSV) into a `LagSchedule`, in consumption order.

    Raises ConfigError naming the file and the problem (missing, empty, missing columns,
    several records per learner iteration, negative lags or sampler ids, lag inconsistent with
    the versions).
    """
    path, rows, iterations = read_rows(path)
    shared = several_chunks_per_iteration(path, rows, iterations)
    if shared:
        raise ConfigError(shared)
    return _in_order(path, rows, iterations)


def read_chunk_lags(path: str | os.PathLike | None, num_samplers: int) -> np.ndarray:
    """A version-schedule file as a threaded barrier run of `num_samplers` samplers replays it.

    Each learner iteration must hold one record (its lag goes to every sampler) or
    `num_samplers` records (the c-th, in file order, goes to sampler c).

    Returns: int32 `[iterations, num_samplers]`, in iteration order.

    Raises ConfigError naming the file (as `read_schedule`, and iterations holding another
    number of records).
    """
    path, rows, iterations = read_rows(path)
    counts = collections.Counter(iterations)
    per_iteration = set(counts.values())
    if len(per_iteration) != 1 or not per_iteration <= {1, num_samplers}:
        found = ", ".join(str(n) for n in sorted(per_iteration))
        raise ConfigError(
            f"lag.replay_path = {path!r}: its learner iterations hold {found} records each; a threaded barrier run "
            f"with num_samplers = {num_samplers} replays 1 record per iteration (given to every sampler) "
            f"or {num_samplers} (one per sampler)"
        )
    lags = _in_order(path, rows, iterations).lag
    if per_iteration == {1}:
        return np.repeat(lags[:, None], num_samplers, axis=1)
    return lags.reshape(len(counts), num_samplers)


# --------------------------------------------------------------------------------------
# Refresh rules (used by samplers in the threaded mode; pure)
# --------------------------------------------------------------------------------------


def is_stale(lag: Any, max_lag: Any) -> Any:
    """The staleness rule, the one place it is written: a sample (or chunk, or sampler) more
    than `max_lag` learner versions behind is stale, lag > max_lag.

    Python ints (`max_lag` None = no bound: never stale) or arrays elementwise (`max_lag`
    a number; inf = no bound). Used by the forced refresh, the buffer's admission check, the
    learner's stale filter and a process's own accounting of a multi-process update.
    """
    return max_lag is not None and lag > max_lag


def should_refresh(
    sampler_version: int, latest_version: int, refresh_lag: int, since_refresh_s: float, min_refresh_interval_s: float
) -> bool:
    """Pull new params when at least `refresh_lag` versions behind and not refreshed too recently."""
    return latest_version - sampler_version >= refresh_lag and since_refresh_s >= min_refresh_interval_s


def must_force_refresh(sampler_version: int, latest_version: int, max_lag: int | None) -> bool:
    """Forced refresh: the sampler is more than `max_lag` versions behind (its rollout is discarded)."""
    return is_stale(latest_version - sampler_version, max_lag)
