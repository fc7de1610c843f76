"""The tuning recipe of asynchronous PPO as one call: `ppo_async.study.tune(config)` and
`python -m ppo_async tune`.

The field's fixed order (docs/how-to/tune.md):

  1. samplers and buffer length, nothing else: at the starting sampler count, halve the ring
     buffer (`threaded.buffer_capacity`) from the starting length down to one chunk, longest
     first; **stop** at the first length whose mean KL to the behaviour policy is under the
     target. If none is, halve the samplers and walk the buffers again (down to one sampler).
     Choice: the first setting under the target (else the lowest KL, reported as missed).
  2. the throughput knee: with that buffer, 1, 2, 3, ... samplers (at least up to
     `MIN_KNEE_POINTS`, then **stop** at the first count that fails the rule, or at
     `max_samplers`). Rule: n passes when its consumer throughput gained at least
     `KNEE_GAIN` (half) of the linear gain, T(n) - T(n-1) >= KNEE_GAIN * T(1), and its KL is
     under the target (n = 1 needs only the KL). **The knee is the last n of the unbroken run
     of passing counts from 1**: beyond it throughput flattens or KL climbs.
  3. a bigger batch per sampler, not more samplers: at the knee, `rollout.num_envs` x2 and x4
     and `rollout.num_steps` x2 (the buffer keeps its length in chunks). Choice: the highest
     throughput under the KL target that beats the knee's by at least `BATCH_GAIN` (10%) with
     a final return no worse than the knee's by more than `RETURN_SLACK` (25%) of its size;
     else the knee's batch. Skipped when `throughput_target` is given and the knee reaches it.
  4. clip, epochs, minibatches for return per env step at the fixed budget: one simulated
     sweep that replays the version schedule recorded by the chosen setting's threaded run
     (the same lags, sampler by sampler, bit for bit reproducible), `ppo.clip_eps` x
     `ppo.num_epochs` x `ppo.num_minibatches`. Choice: the highest final return (mean over
     seeds of the last quarter of iterations) among the settings with mean KL under the target,
     checked by a threaded run of it (more epochs or minibatches slow the learner, and a slower
     learner makes larger lags than the replayed ones): the first of the `VERIFY_TRIES` (3)
     best whose threaded mean KL is under the target; else the starting PPO fields. The whole
     grid is one compile (`sweep` traces clip, epochs and minibatches).

Steps 1-3 are real threaded runs of `budget_per_run` env steps (default: the config's
`total_env_steps`, the budget the result is for), measured with
`analysis.run_measurements` (throughput after a 20% warm-up; mean KL after it). Every step
prints its grid, rule and choice as it goes, and after each setting the overall progress,
`tune: step 2/4, run 5 of at most 17, 80s elapsed, ETA at most 150s + step 4's replay sweep (18
settings, timed as it runs)` (`progress_line`; the steps stop early, so J is a bound that shrinks
as they end; the ETA is the runs left times the slowest run measured). Settings that score the
same are told apart by a stated rule, the cheaper first (`tune_rules`), and the choice says
how many tied. The output directory holds `report.md`,
`knee.png`, `kl_vs_buffer.png`, `chosen_config.json` (for `train --config`),
`measurements.jsonl` (one line per run / step-4 setting), `schedules/` (each run's version
schedule) and `tune.json` (the base config and options). Run again on the same directory,
`tune` skips every run already measured (and refuses a directory of another config), by the
benchmark's mechanism (`ppo_async.study.store`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import time
from typing import Any, Mapping, Sequence

from ppo_async.study import tune_plots as plots  # tune's figures: knee.png, kl_vs_buffer.png
from ppo_async.config import presets
from ppo_async.report.analysis import run_measurements, summarize
from ppo_async.config import SAMPLER_ALIASES, Config, ConfigError, config_from_dict, config_to_dict, get_path, replace_paths
from ppo_async.core.lag import write_schedule
from ppo_async.errors import DataFileError
from ppo_async.study import store
from ppo_async.study.sweep import sweep
from ppo_async.study.tune_rules import (  # noqa: F401  (the pure rules, re-exported: tune.knee_of, ...)
    KNEE_GAIN,
    REPLAY_TIE_RULE,
    THREADED_TIE_RULE,
    VERIFY_TRIES,
    best_first,
    best_under_target,
    buffer_lengths,
    knee_of,
    most_runs,
    progress_line,
    replay_cost,
    sampler_counts,
    threaded_cost,
    tie_note,
    tied_with,
)
from ppo_async.modes.train import train

BATCH_GAIN = 0.1
"""Step 3: a bigger batch is kept only when it raises throughput by at least this fraction."""
RETURN_SLACK = 0.25
"""Step 3: ... and only when its final return is within this fraction of |the knee's| (a bigger
batch means fewer updates in the budget: throughput bought with learning is not kept)."""
MIN_KNEE_POINTS = 3
"""Step 2 measures at least 1..3 samplers (the knee plot needs the flattening)."""
WARMUP_FRACTION = 0.2
MEASUREMENTS_FILE = "measurements.jsonl"
BATCH_FACTORS = (("rollout.num_envs", 2), ("rollout.num_envs", 4), ("rollout.num_steps", 2))
CLIP_VALUES = (0.1, 0.2, 0.3)


@dataclasses.dataclass(frozen=True)
class TuneStep:
    """One step of the recipe: what it measured, by which rule it chose, what and why."""

    number: int
    title: str
    rule: str
    rows: list  # one dict per measured setting (its changes and measurements)
    choice: dict  # the dotted config changes this step settled
    why: str


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """What `tune` found: the steps, the chosen config (threaded, trains with `train --config`)."""

    steps: list
    config: Config
    kl_target: float
    out: str | None
    knee: int

    def to_dataframe(self) -> "Any":
        """Every measured setting as one table row (column `step`)."""
        import pandas as pd

        return pd.DataFrame([{"step": s.number, **row} for s in self.steps for row in s.rows])


def _check_base(config: Config, kl_target: float, budget: int, seeds: int, max_samplers: int) -> None:
    if config.mode != "threaded":
        raise ConfigError(f"mode = {config.mode!r} is invalid for tune: the recipe tunes threaded runs (mode='threaded')")
    tcfg = config.threaded
    for name, bad in (("barrier", tcfg.barrier), ("kl_target", tcfg.kl_target is not None),
                      ("chunks_per_batch", config.effective_chunks_per_batch != 1)):
        if bad:
            raise ConfigError(f"threaded.{name} = {getattr(tcfg, name)!r} is invalid for tune: it tunes free-running "
                              "samplers with one chunk per learner batch and no controller (replayable schedules)")
    if config.distributed.num_processes > 1:
        raise ConfigError("distributed.num_processes > 1 is invalid for tune: it runs one process")
    if not (isinstance(kl_target, (int, float)) and math.isfinite(kl_target) and kl_target > 0):
        raise ConfigError(f"kl_target = {kl_target!r} is invalid: must be a finite number > 0")
    if not isinstance(budget, int) or budget < config.batch_size * 5:
        raise ConfigError(f"budget_per_run = {budget!r} is invalid: must be an integer of at least 5 learner batches "
                          f"({5 * config.batch_size} env steps)")
    if not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds = {seeds!r} is invalid: must be an integer >= 1")
    if not isinstance(max_samplers, int) or max_samplers < 1:
        raise ConfigError(f"max_samplers = {max_samplers!r} is invalid: must be an integer >= 1")


class _Tuner:
    """The impure shell: runs (or, resuming, reads back) one measured setting at a time."""

    def __init__(self, base: Config, kl_target: float, budget: int, seeds: int, out: str | None, progress: bool):
        self.base = base.replace(total_env_steps=budget, run_dir=None, checkpoint_every_steps=0, overwrite=False)
        self.kl_target, self.seeds, self.out, self.progress = kl_target, seeds, out, progress
        self.done: dict[str, dict] = {}
        self.steps: list[TuneStep] = []
        self.runs, self.started = 0, time.perf_counter()
        self.step, self.most = 1, 0  # the step under way; the most threaded runs of the whole tune (`plan`)
        self.measured, self.run_seconds = 0, 0.0  # the runs measured here (not read back) and their time
        self.slowest = 0.0  # the longest of those runs (the ETA's time per run)
        self.sweep_settings = 0  # step 4's replay sweep while it is still to run: settings x seeds
        self._plan: tuple | None = None  # (samplers, buffer chunks, max_samplers, batch factors) of `most_runs`
        rollout, threaded = self.base.rollout, self.base.threaded
        self.cost = threaded_cost(self.base.effective_num_samplers, self.base.buffer_capacity_chunks * self.base.chunk_size,
                                  rollout.num_envs, rollout.num_steps)  # a threaded setting's cost, for ties
        if out is not None:
            self.schedule_dir = os.path.join(out, "schedules")
            self._open(base, budget)
        else:
            import tempfile

            self.schedule_dir = tempfile.mkdtemp(prefix="ppo_async-tune-")

    def _open(self, base: Config, budget: int) -> None:
        """Checks (or writes) OUT/tune.json and reads back the settings measured before
        (`store`: a rerun on the same out dir skips them)."""
        os.makedirs(os.path.join(self.out, "schedules"), exist_ok=True)
        meta = {"config": config_to_dict(base), "kl_target": self.kl_target, "budget_per_run": budget, "seeds": self.seeds}
        store.check_spec(os.path.join(self.out, "tune.json"), json.loads(json.dumps(meta)),
                         lambda recorded, now: _refusal(self.out, recorded, now), _write_meta)
        self.done = read_measurements(self.out)

    def say(self, text: str) -> None:
        if self.progress:
            print(text, flush=True)

    def plan(self, max_samplers: int, batch_factors: int, sweep_settings: int = 0) -> None:
        """Sets the most threaded runs the tune can take (`most_runs`) and the size of step 4's
        replay sweep (settings x seeds), for the progress lines."""
        self._plan = (self.base.effective_num_samplers, self.base.buffer_capacity_chunks, max_samplers, batch_factors)
        self.most = most_runs(1, *self._plan, self.seeds)
        self.sweep_settings = sweep_settings

    def progress_line(self) -> str:
        """The overall progress now (`progress_line`)."""
        return progress_line(self.step, self.runs, max(self.most, self.runs), time.perf_counter() - self.started,
                             self.run_seconds, self.measured, self.slowest, self.sweep_settings)

    def step_done(self, step: TuneStep) -> None:
        """After each step: its choice, the overall progress (step i/4, run j of at most J, ETA)
        and, with an out dir, report.md rewritten with the steps so far (so a long tune can be
        read while it runs, not only at the end). J shrinks to the runs so far plus the most
        the later steps can take."""
        self.steps.append(step)
        self.say(f"  -> {_describe(step.choice) or 'no change'}: {step.why}")
        if step.number < 4 and self._plan is not None:
            self.most = self.runs + most_runs(step.number + 1, *self._plan, self.seeds)
        self.say(self.progress_line().replace(f"step {step.number}/4,", f"step {step.number}/4 done,"))
        self.step = step.number + 1
        if self.out is not None and step.number < 4:
            with open(os.path.join(self.out, "report.md"), "w", encoding="utf-8") as f:
                f.write(steps_text(self.steps, self.kl_target) + f"\n_In progress: step {step.number} of 4 done._\n")

    def _record(self, row: dict) -> None:
        self.done[row["key"]] = row
        if self.out is not None:
            store.RowLog(os.path.join(self.out, MEASUREMENTS_FILE)).append([row])

    def measure(self, step: int, changes: Mapping[str, Any]) -> dict:
        """Threaded runs of `base` with `changes` (one per seed), their measurements averaged
        (a setting measured before, in this call or a previous one on the same out dir, is
        read back)."""
        key = json.dumps(dict(changes), sort_keys=True)
        if key in self.done:
            row = self.done[key]
            self.runs += self.seeds
            self.say(f"  {_describe(changes)}: measured before ({_numbers(row)})")
            return row
        config = replace_paths(self.base, with_latency(self.base, changes))
        per_seed, t0 = [], time.perf_counter()
        for seed in range(self.base.seed, self.base.seed + self.seeds):
            self.runs += 1
            t_run = time.perf_counter()
            result = train(config.replace(seed=seed))
            self.measured += 1
            self.run_seconds += time.perf_counter() - t_run
            self.slowest = max(self.slowest, time.perf_counter() - t_run)
            per_seed.append(run_measurements(result.to_dataframe(), WARMUP_FRACTION))
            name = f"{_slug(changes)}-seed{seed}.jsonl"
            write_schedule(os.path.join(self.schedule_dir, name), result.extras["version_schedule"])
        row = {"key": key, "step": step, **changes,
               **{k: float(sum(m[k] for m in per_seed) / len(per_seed)) for k in per_seed[0]}}
        self._record(row)
        self.say(f"  {_describe(changes)}: {_numbers(row)} ({time.perf_counter() - t0:.0f} s)")
        self.say(self.progress_line())
        return row

    def schedule_path(self, changes: Mapping[str, Any]) -> str:
        """The recorded version schedule of the first seed of a measured setting."""
        return os.path.join(self.schedule_dir, f"{_slug(changes)}-seed{self.base.seed}.jsonl")


def _refusal(out: str, recorded: dict, now: dict) -> str | None:
    """Why OUT's tune.json (`recorded`) is another tune than `now`'s: the fields that differ
    (`store.changed_paths`: config fields added to the code since count as their defaults, as
    for the benchmark; one written before the cadences counted env steps in today's spelling,
    `store.as_today`); None when it is the same tune."""
    recorded = {**recorded, "config": store.as_today(recorded.get("config"))} if "config" in recorded else recorded
    paths = store.changed_paths(recorded, now, defaults={"config": config_to_dict(Config())})
    if not paths:
        return None
    return (f"--out {out!r} holds a tune of another config or options (tune.json: {', '.join(paths[:5])}); give "
            "another --out or delete it")


def _write_meta(path: str, meta: dict) -> None:
    """OUT/tune.json: `meta` as indented JSON (no final newline: the format of the tunes published)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)


def read_measurements(out: str) -> dict[str, dict]:
    """{key: row} of the settings OUT/measurements.jsonl holds (`store.finished`: each row is a
    finished setting). DataFileError for a corrupt line or a row without a key."""
    log = store.RowLog(os.path.join(out, MEASUREMENTS_FILE))
    rows = log.read()
    for number, row in enumerate(rows, start=1):
        if "key" not in row:
            raise DataFileError(f"{log.path}: row {number} has no 'key' (not a tune's measurements)")
    rows = [_today_row(row) for row in rows]
    return {key: kept[-1] for key, kept in store.finished(log, lambda r: r["key"], lambda r: True, rows).items()}


def _today_row(row: dict) -> dict:
    """A measured row in today's spelling: a sampler count recorded before the one num_samplers
    (`threaded.num_samplers`, `SAMPLER_ALIASES`) as `num_samplers`, in the row and in its key."""
    if not any(path in row for path in SAMPLER_ALIASES):
        return row
    today = lambda data: {"num_samplers" if k in SAMPLER_ALIASES else k: v for k, v in data.items()}  # noqa: E731
    return {**today(row), "key": json.dumps(today(json.loads(row["key"])), sort_keys=True)}


def with_latency(base: Config, changes: Mapping[str, Any]) -> dict[str, Any]:
    """`changes` plus `threaded.sampler_step_latency_ms` for their sampler count when the base
    simulates env latency: the base's per-sampler latencies repeated cyclically (sampler i gets
    entry i mod len; so a straggler pattern (1, 1, 1, 4) stays one slow sampler in four)."""
    latency = base.threaded.sampler_step_latency_ms
    samplers = changes.get("num_samplers", base.effective_num_samplers)
    if not latency or samplers == len(latency):
        return dict(changes)
    return {**changes, "threaded.sampler_step_latency_ms": tuple(latency[i % len(latency)] for i in range(samplers))}


def _slug(changes: Mapping[str, Any]) -> str:
    return "-".join(f"{k.rpartition('.')[2]}{changes[k]}" for k in sorted(changes)) or "base"


def _describe(changes: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in changes.items())


def _numbers(row: Mapping[str, Any]) -> str:
    return (f"{row['consumer_steps_per_s']:,.0f} env steps/s, KL {row['approx_kl_mean']:.4f}, lag {row['lag_mean']:.1f}, "
            f"return {row['final_return']:.1f}")


def _buffer_changes(tuner: _Tuner, samplers: int, chunks: int) -> dict:
    return {"num_samplers": samplers, "threaded.buffer_capacity": chunks * tuner.base.chunk_size}


def step_buffer(tuner: _Tuner) -> TuneStep:
    """Step 1: samplers and buffer length until the mean KL is under the target."""
    base = tuner.base
    rule = (f"halve the buffer from {base.buffer_capacity_chunks} chunks, longest first, at "
            f"{base.effective_num_samplers} samplers; stop at the first with mean KL < {tuner.kl_target}; "
            f"if none, halve the samplers and repeat; none under it: the lowest KL, {THREADED_TIE_RULE}")
    tuner.say(f"step 1 (samplers and buffer length): {rule}")
    rows: list = []
    samplers = base.effective_num_samplers
    while True:
        for chunks in buffer_lengths(base.buffer_capacity_chunks):
            row = tuner.measure(1, _buffer_changes(tuner, samplers, chunks))
            rows.append({**row, "num_samplers": samplers, "buffer_chunks": chunks})
            if row["approx_kl_mean"] < tuner.kl_target:
                why = f"the first setting with mean KL {row['approx_kl_mean']:.4f} < {tuner.kl_target}"
                return TuneStep(1, "samplers and buffer length", rule, rows, _buffer_changes(tuner, samplers, chunks), why)
        if samplers == 1:
            break
        samplers = max(1, samplers // 2)
    order = best_first(rows, range(len(rows)), "approx_kl_mean", tuner.cost, lowest=True)
    best = rows[order[0]]
    why = (f"no setting reached mean KL < {tuner.kl_target} (missed): kept the lowest KL, "
           f"{best['approx_kl_mean']:.4f}" + tie_note(len(tied_with(rows, order, "approx_kl_mean")), "mean KL",
                                                    best["approx_kl_mean"], THREADED_TIE_RULE))
    return TuneStep(1, "samplers and buffer length", rule, rows,
                    _buffer_changes(tuner, best["num_samplers"], best["buffer_chunks"]), why)


def step_knee(tuner: _Tuner, buffer_chunks: int, max_samplers: int) -> tuple[TuneStep, int]:
    """Step 2: samplers 1, 2, ... at the chosen buffer length; the knee (`knee_of`)."""
    rule = (f"n passes when T(n) - T(n-1) >= {KNEE_GAIN} * T(1) and mean KL < {tuner.kl_target}; measure n = 1.."
            f"{min(MIN_KNEE_POINTS, max_samplers)} at least, then stop at the first failing n (at most {max_samplers}); "
            "the knee is the last n of the unbroken run of passes from 1")
    tuner.say(f"step 2 (the throughput knee, buffer {buffer_chunks} chunks): {rule}")
    rows: list = []
    for n in range(1, max_samplers + 1):
        row = tuner.measure(2, _buffer_changes(tuner, n, buffer_chunks))
        rows.append({**row, "num_samplers": n, "buffer_chunks": buffer_chunks})
        knee, passes = knee_of(rows, tuner.kl_target)
        if n >= MIN_KNEE_POINTS and not passes[-1]:
            break
    knee, passes = knee_of(rows, tuner.kl_target)
    for row, ok in zip(rows, passes):
        row["passes"] = ok
    at = rows[knee - 1]
    why = (f"knee at {knee} sampler(s): {at['consumer_steps_per_s']:,.0f} env steps/s, mean KL {at['approx_kl_mean']:.4f}"
           + ("" if knee == len(rows) else f"; {knee + 1} failed the rule"))
    return TuneStep(2, "the throughput knee", rule, rows, _buffer_changes(tuner, knee, buffer_chunks), why), knee


def step_batch(tuner: _Tuner, chosen: dict, knee_row: Mapping[str, Any], throughput_target: float | None,
               batch_factors: Sequence[tuple[str, int]] = BATCH_FACTORS) -> TuneStep:
    """Step 3: a bigger batch per sampler (envs, steps) at the knee."""
    rule = (f"at the knee, try {', '.join(f'{p} x{f}' for p, f in batch_factors)} (same buffer length in chunks); keep "
            f"the highest throughput with mean KL < {tuner.kl_target} that beats the knee's by >= {BATCH_GAIN:.0%} "
            f"with a final return within {RETURN_SLACK:.0%} of the knee's; {THREADED_TIE_RULE}")
    knee_rate = knee_row["consumer_steps_per_s"]
    if throughput_target is not None and knee_rate >= throughput_target:
        why = f"skipped: the knee's {knee_rate:,.0f} env steps/s reaches throughput_target = {throughput_target:,.0f}"
        tuner.say(f"step 3 (bigger batches per sampler): {why}")
        return TuneStep(3, "bigger batches per sampler", rule, [], {}, why)
    tuner.say(f"step 3 (bigger batches per sampler): {rule}")
    chunks = chosen["threaded.buffer_capacity"] // tuner.base.chunk_size
    rows = [{**knee_row, "batch": "knee"}]
    for path, factor in batch_factors:
        changes = {**chosen, path: get_path(tuner.base, path) * factor}
        sized = replace_paths(tuner.base, {path: changes[path]})
        changes["threaded.buffer_capacity"] = chunks * sized.chunk_size
        try:
            replace_paths(tuner.base, with_latency(tuner.base, changes))
        except ConfigError as exc:  # e.g. minibatches no longer divide: report, do not stop
            tuner.say(f"  {path} x{factor}: not a valid config ({exc})")
            continue
        rows.append({**tuner.measure(3, changes), "batch": f"{path} x{factor}"})
    floor = knee_row["final_return"] - RETURN_SLACK * abs(knee_row["final_return"])
    eligible = [r for r in rows[1:] if r["consumer_steps_per_s"] >= (1 + BATCH_GAIN) * knee_rate
                and not r["final_return"] < floor]  # (a NaN return, no episode finished, is not held against it)
    i, ok = best_under_target(eligible, tuner.kl_target, "consumer_steps_per_s", tuner.cost) if eligible else (0, False)
    if eligible and ok:
        pick = eligible[i]
        choice = {p: pick[p] for p in ("rollout.num_envs", "rollout.num_steps", "threaded.buffer_capacity") if p in pick}
        under = [k for k, r in enumerate(eligible) if r["approx_kl_mean"] < tuner.kl_target]
        ties = tied_with(eligible, best_first(eligible, under, "consumer_steps_per_s"), "consumer_steps_per_s")
        why = (f"{pick['batch']}: {pick['consumer_steps_per_s']:,.0f} env steps/s "
               f"({pick['consumer_steps_per_s'] / knee_rate:.2f}x the knee), mean KL {pick['approx_kl_mean']:.4f}"
               + tie_note(len(ties), "throughput", pick["consumer_steps_per_s"], THREADED_TIE_RULE))
        return TuneStep(3, "bigger batches per sampler", rule, rows, choice, why)
    why = (f"kept the knee's batch: no bigger batch gained >= {BATCH_GAIN:.0%} throughput with mean KL < "
           f"{tuner.kl_target} and a final return >= {floor:.1f}")
    return TuneStep(3, "bigger batches per sampler", rule, rows, {}, why)


def _replay_grid(config: Config) -> dict[str, list]:
    """Step 4's grid: clip 0.1 / 0.2 / 0.3, half / the / twice the epochs, half / the minibatches."""
    epochs, minibatches = config.ppo.num_epochs, config.ppo.num_minibatches
    return {
        "ppo.clip_eps": list(CLIP_VALUES),
        "ppo.num_epochs": sorted({max(1, epochs // 2), epochs, 2 * epochs}),
        "ppo.num_minibatches": sorted({minibatches // 2, minibatches} - {0}) if minibatches % 2 == 0 else [minibatches],
    }


def replay_config(threaded_config: Config, schedule_path: str) -> Config:
    """The simulated config that replays a threaded run's version schedule: the same env,
    rollout, PPO and budget; `lag.schedule = 'replay'` (one emulated sampler per recorded one:
    num_samplers None, the file's)."""
    data = config_to_dict(threaded_config)
    data.update(mode="simulated", threaded=config_to_dict(Config())["threaded"], num_samplers=None)
    data["lag"] = {**data["lag"], "schedule": "replay", "replay_path": schedule_path}
    return config_from_dict(data)


def step_replay(tuner: _Tuner, chosen: Mapping[str, Any], seeds: int,
                grid: Mapping[str, Sequence[Any]] | None = None) -> TuneStep:
    """Step 4: clip x epochs x minibatches (or `grid`) on the simulated mode replaying the chosen setting's schedule."""
    threaded_config = replace_paths(tuner.base, with_latency(tuner.base, chosen))
    grid = _replay_grid(threaded_config) if grid is None else {k: list(v) for k, v in grid.items()}
    rule = (f"replay the chosen setting's version schedule in the simulated mode, {seeds} seed(s); grid "
            f"{_describe(grid)}; keep the highest final return (last quarter) with mean KL < {tuner.kl_target}, "
            f"{REPLAY_TIE_RULE}")
    tuner.say(f"step 4 (clip, epochs, minibatches on the replayed schedule): {rule}")
    points = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]  # the sweep's order
    keys = [json.dumps({"replay": _slug(chosen), **point}, sort_keys=True) for point in points]
    if all(k in tuner.done for k in keys):
        rows = [tuner.done[k] for k in keys]
        tuner.say("  measured before")
    else:
        t0 = time.perf_counter()
        df = sweep(replay_config(threaded_config, tuner.schedule_path(chosen)), grid, seeds=seeds,
                   progress=tuner.progress)  # its 'sweep: configs k/K ..., ETA' lines
        table = summarize(df, last_fraction=0.25)
        rows = []
        for key, (_, r) in zip(keys, table.iterrows()):
            row = {"key": key, "step": 4, **{k: type(grid[k][0])(_plain(r[k])) for k in grid},
                   **{k: float(r[k]) for k in ("final_return_mean", "final_return_std", "approx_kl_mean", "lag_mean_mean")}}
            tuner._record(row)
            rows.append(row)
        tuner.say(f"  {len(rows)} settings x {seeds} seed(s), {df.attrs['compiles']} compiles, "
                  f"{time.perf_counter() - t0:.0f} s")
    tuner.sweep_settings = 0  # done: the ETA's time is the threaded checks'
    for row in rows:
        tuner.say(f"  {_describe({k: row[k] for k in grid})}: return {row['final_return_mean']:.1f}, "
                  f"KL {row['approx_kl_mean']:.4f}")
    choice, why = _verified_choice(tuner, chosen, rows, grid)
    return TuneStep(4, "clip, epochs and minibatches", rule + f"; check the choice with a threaded run (up to "
                    f"{VERIFY_TRIES} candidates)", rows, choice, why)


def _verified_choice(tuner: _Tuner, chosen: Mapping[str, Any], rows: list, grid: Mapping[str, Any]) -> tuple[dict, str]:
    """Step 4's choice, checked on the real thing: the replay keeps the recorded lags, but more
    epochs or minibatches slow the learner, and a slower learner makes larger lags. The
    candidates under the target, best replayed return first, each get a threaded run; the
    first whose measured mean KL is under the target wins (at most VERIFY_TRIES; none: the
    starting PPO fields stay). Adds `threaded_kl` / `threaded_return` to the checked rows."""
    ppo = tuner.base.ppo
    under = [i for i, r in enumerate(rows) if r["approx_kl_mean"] < tuner.kl_target]
    order = best_first(rows, under, "final_return_mean", replay_cost(ppo.clip_eps, ppo.num_epochs, ppo.num_minibatches))
    ties = tied_with(rows, order, "final_return_mean")
    for i in order[:VERIFY_TRIES]:
        candidate = {k: rows[i][k] for k in grid}
        unchanged = all(get_path(tuner.base, k) == v for k, v in candidate.items())
        measured = tuner.measure(4, {**chosen, **candidate}) if not unchanged else tuner.measure(2, dict(chosen))
        rows[i]["threaded_kl"], rows[i]["threaded_return"] = measured["approx_kl_mean"], measured["final_return"]
        if measured["approx_kl_mean"] < tuner.kl_target:
            tied = tie_note(len(ties), "replayed final return", rows[i]["final_return_mean"], REPLAY_TIE_RULE)
            return candidate, (f"replayed final return {rows[i]['final_return_mean']:.1f} at mean KL "
                               f"{rows[i]['approx_kl_mean']:.4f}; its threaded run: mean KL {measured['approx_kl_mean']:.4f}, "
                               f"final return {measured['final_return']:.1f}" + (tied if i in ties else ""))
    if not order:
        return {}, f"no replayed setting had mean KL < {tuner.kl_target} (missed): the starting PPO fields stay"
    return {}, (f"the {min(len(order), VERIFY_TRIES)} best replayed settings all ran over the KL target in threaded "
                "runs (missed): the starting PPO fields stay")


def _plain(value: Any) -> Any:
    """A numpy scalar as a Python number (JSON)."""
    return value.item() if hasattr(value, "item") else value


def tune(
    config: Config,
    kl_target: float = 0.02,
    budget_per_run: int | None = None,
    out: str | os.PathLike | None = None,
    seeds: int = 1,
    max_samplers: int = 6,
    throughput_target: float | None = None,
    replay_seeds: int = 2,
    batch_factors: Sequence[tuple[str, int]] = BATCH_FACTORS,
    replay_grid: Mapping[str, Sequence[Any]] | None = None,
    progress: bool = True,
) -> TuneResult:
    """Runs the four steps of the recipe (module docstring) from `config` (mode='threaded').

    Args:
      config: the starting config: its samplers and buffer length start step 1; the rest
        stays fixed until step 4.
      kl_target: the mean KL to the behaviour policy every step keeps under.
      budget_per_run: env steps of each threaded run and of each replay (None: the config's
        `total_env_steps`).
      out: directory for report.md, the plots, chosen_config.json, measurements.jsonl
        (resumable); None writes nothing (the schedules go to a temporary directory).
      seeds: threaded runs per setting (their measurements are averaged).
      max_samplers: the most samplers step 2 tries.
      throughput_target: env steps/s that make step 3 unnecessary (None: always try it).
      replay_seeds: seeds of step 4's simulated sweep.
      batch_factors: step 3's candidates, (dotted rollout field, factor) pairs.
      replay_grid: step 4's grid (dotted fields of traced or PPO-loop hyperparameters to
        lists); None: clip 0.1 / 0.2 / 0.3 x half / the / twice the epochs x half / the
        minibatches.
      progress: print each step's grid, rule, measurements and choice.

    Returns:
      A `TuneResult`: the steps and `config`, the chosen config (the starting one with every
      step's choice, its own total_env_steps, no run_dir).

    Raises:
      ConfigError: a config the recipe cannot tune (not threaded, barrier, a KL controller,
        several chunks per batch or processes), bad options, or an out dir of another tune.
    """
    budget = config.total_env_steps if budget_per_run is None else budget_per_run
    _check_base(config, kl_target, budget, seeds, max_samplers)
    if throughput_target is not None and not (isinstance(throughput_target, (int, float)) and throughput_target > 0):
        raise ConfigError(f"throughput_target = {throughput_target!r} is invalid: must be a number > 0 or None")
    if not isinstance(replay_seeds, int) or replay_seeds < 1:
        raise ConfigError(f"replay_seeds = {replay_seeds!r} is invalid: must be an integer >= 1")
    out = None if out is None else os.fspath(out)
    tuner = _Tuner(config, float(kl_target), budget, seeds, out, progress)
    grid = replay_grid if replay_grid is not None else _replay_grid(config)
    tuner.plan(max_samplers, len(batch_factors), math.prod(len(v) for v in grid.values()) * replay_seeds)
    first = step_buffer(tuner)
    tuner.step_done(first)
    chunks = first.choice["threaded.buffer_capacity"] // tuner.base.chunk_size
    second, knee = step_knee(tuner, chunks, max_samplers)
    tuner.step_done(second)
    third = step_batch(tuner, second.choice, second.rows[knee - 1], throughput_target, batch_factors)
    tuner.step_done(third)
    chosen = {**second.choice, **third.choice}
    fourth = step_replay(tuner, chosen, replay_seeds, replay_grid)
    tuner.step_done(fourth)
    final = replace_paths(config, with_latency(config, {**chosen, **fourth.choice})).replace(run_dir=None)
    result = TuneResult([first, second, third, fourth], final, float(kl_target), out, knee)
    if out is not None:
        write_outputs(result, out)
        tuner.say(f"wrote {out}/report.md, knee.png, kl_vs_buffer.png, chosen_config.json, {MEASUREMENTS_FILE}")
    return result


def write_outputs(result: TuneResult, out: str) -> None:
    """report.md, knee.png, kl_vs_buffer.png and chosen_config.json into `out`."""
    with open(os.path.join(out, "chosen_config.json"), "w", encoding="utf-8") as f:
        json.dump(config_to_dict(result.config), f, indent=2)
    first, second = result.steps[0], result.steps[1]
    plots.tune_knee(second.rows, result.knee, result.kl_target, os.path.join(out, "knee.png"))
    plots.kl_vs_buffer(first.rows + second.rows, result.kl_target, os.path.join(out, "kl_vs_buffer.png"))
    with open(os.path.join(out, "report.md"), "w", encoding="utf-8") as f:
        f.write(report_text(result))


_STEP_COLUMNS = {
    1: ("num_samplers", "buffer_chunks", "consumer_steps_per_s", "approx_kl_mean", "lag_mean", "dropped_fraction", "final_return"),
    2: ("num_samplers", "consumer_steps_per_s", "approx_kl_mean", "lag_mean", "passes", "final_return"),
    3: ("batch", "consumer_steps_per_s", "approx_kl_mean", "lag_mean", "final_return"),
    4: ("ppo.clip_eps", "ppo.num_epochs", "ppo.num_minibatches", "final_return_mean", "final_return_std", "approx_kl_mean",
        "threaded_kl", "threaded_return"),
}


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A GitHub markdown table of `rows` (floats: 4 significant digits, large ones with separators)."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def report_text(result: TuneResult) -> str:
    """report.md: one section per step (rule, table, choice and why), then the chosen config."""
    parts = [steps_text(result.steps, result.kl_target)]
    changed = {k: v for s in result.steps for k, v in s.choice.items()}
    parts += ["## Chosen config", "", f"`chosen_config.json` (train it with `python -m ppo_async train --config "
              f"chosen_config.json`): the starting config with {_describe(changed)}.", ""]
    return "\n".join(parts)


def steps_text(steps: Sequence[TuneStep], kl_target: float) -> str:
    """The title and one section per step done (rule, table, choice and why): report.md so far."""
    parts = [f"# Tuning report (KL target {kl_target})", "",
             "Consumer throughput = env steps the learner took per second after a 20% warm-up; KL = mean approx_kl "
             "(to the behaviour policy) after it; final return = mean episode return over the last quarter.", ""]
    for step in steps:
        parts += [f"## Step {step.number}: {step.title}", "", f"Rule: {step.rule}.", ""]
        if step.rows:
            grid = [k for k in step.rows[0] if "." in k]  # step 4: its grid's dotted fields
            columns = _STEP_COLUMNS[step.number] if step.number != 4 else (*grid, *_STEP_COLUMNS[4][3:])
            parts += [markdown_table(step.rows, columns), ""]
        parts += [f"Choice: {_describe(step.choice) or 'no change'}. Why: {step.why}.", ""]
    return "\n".join(parts)


START_SAMPLERS = 4
START_BUFFER_CHUNKS = 16
"""The CLI's starting point where the config file sets neither: the throughput-first setting
the recipe then cuts back (4 samplers, a 16-chunk buffer)."""


def start_config(data: Mapping[str, Any], env: str | None = None) -> tuple[Config, dict[str, Any]]:
    """The config `python -m ppo_async tune` starts from, and the fields it filled in: a
    (nested) config file's contents, `env` over its env, mode='threaded', the env's preset and
    `START_SAMPLERS` / `START_BUFFER_CHUNKS` for the fields the file does not set.

    Raises ConfigError for a file whose mode is not 'threaded' or an invalid config."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    if data.get("mode", "threaded") != "threaded":
        raise ConfigError(f"mode = {data['mode']!r} is invalid for tune: it tunes threaded runs (leave mode out or "
                          "set 'threaded')")
    if env is not None:
        data["env"] = env
    data["mode"] = "threaded"
    config = config_from_dict(data, source="file")
    samplers_given = config.num_samplers is not None  # by the file, in either spelling
    filled = presets.preset_changes(config.env, data)
    config = replace_paths(config, filled)
    given = data.get("threaded", {})
    start = {}
    if not samplers_given:
        start["num_samplers"] = START_SAMPLERS
    if "buffer_capacity" not in given:
        start["threaded.buffer_capacity"] = START_BUFFER_CHUNKS * config.chunk_size
    return replace_paths(config, start), {**filled, **start}
