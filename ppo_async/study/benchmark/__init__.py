"""The benchmark: suites of envs x modes x seeds, evaluated at fixed env-step checkpoints, with a
report against published reference figures (`pa.benchmark`, `python -m ppo_async benchmark`).

    pa.benchmark("mujoco", seeds=5, out="runs/bench")      # 4 envs x (barrier, async) x 5 seeds at 1M
    pa.benchmark("classic", seeds=2, out="runs/b", envs=["CartPole-v1"], total_env_steps=20_000)
    report("runs/bench")                                     # report.md + plots again, from results.csv

Every run's config is `config_for_env(env)` (the preset `train --env` uses) plus the mode's fields
(`MODES`, data in `MODE_DEFS`: each mode is its parent plus the fields it changes) and the suite's
fields for that mode (`Suite.mode_fields`), the samplers of a threaded mode sharing the preset's
envs (`share_envs`), the seed, the budget, the evaluation cadence and its run directory - nothing else. A
run evaluates the learner's deterministic policy every `eval_every_steps` env steps (in whole
learner iterations: `Config.eval_every_iterations`) and after its last iteration, over
`eval_episodes` episodes, and appends one row per evaluation to OUT/results.csv (`COLUMNS`).

OUT holds (`store`): benchmark.json (the arguments and each env x mode's config: a second call with other
ones is refused, one with more seeds, envs or modes extends it), results.csv, manifest.json (`study.manifest`), report.md and the plots, and
runs/<env with / as _>/<mode>/seed<k>/, each a normal run directory plus benchmark_wall.jsonl
(wall seconds per iteration) and, once its rows are in results.csv, benchmark_done.json.

Resume: run again with the same arguments, a killed benchmark skips every finished run (its done
marker, or its final row in results.csv; rows lost from results.csv are rebuilt from the run
directory, not re-run), finishes a run that had trained to its end and resumes an unfinished
run from its latest checkpoint (checkpoints are written at every evaluation; a threaded run
restores its learner and statistics and starts fresh samplers, so its lag history after the
checkpoint is new - its rows say `resumed_at_iteration`).

Report: per env, mode and checkpoint the mean deterministic return over seeds, its 95%
percentile-bootstrap CI and the worst seed; learning curves with the reference figures
(references.json, in ppo_async/study/) as marks at their budget; return vs wall-clock for
barrier vs async, with async's final return against barrier's CI and its wall-clock to reach
barrier's final return (`reach_ratio`); and across envs the IQM and the probability of improvement of async over
barrier (Agarwal et al. 2021, "Deep RL at the Edge of the Statistical Precipice", point estimates by
`rliable.metrics`) with stratified-bootstrap 95% CIs (rliable's method, seeded), on scores normalised
per env by its reference: 1 + (score - ref) / |ref|. Every statistic comes from
`ppo_async.report.stats`.

The package, one concern a module: `suites` (suites and modes as data, the plan, each run's
config), `store` (the files in OUT), `runner` (`benchmark`), `scores` (the tables and aggregate
metrics), `plots` (the figures) and `reporting` (report.md, `report`). Every name other code
uses is re-exported here: `from ppo_async.study import benchmark as bm; bm.resolve_plan(...)`.
"""

from ppo_async.report.stats import bootstrap_mean_ci
from ppo_async.study.benchmark.plots import plot_aggregate, plot_learning_curves, plot_wall_clock
from ppo_async.study.benchmark.reporting import (
    REPORT_FILE, aggregate_section, barrier_async_section, checkpoints_section, final_section, report)
from ppo_async.study.benchmark.runner import (
    benchmark, finish_run, has_checkpoint, require_rliable, train_run, trained_to_end)
from ppo_async.study.benchmark.scores import (
    BOOTSTRAP_REPS, REFERENCES_PATH, aggregate, checkpoint_table, load_references, normalise, normalising_references,
    reach_ratio, returns_at_equal_wall, score_matrices)
from ppo_async.study.benchmark.store import (  # _key: a results row's (env, mode, seed), which the tests read
    COLUMNS, DONE_FILE, RESULTS_FILE, SPEC_FILE, TRAIN_TAIL, WALL_FILE, WallLog, _key, check_spec, checkpoint_of,
    episode_weighted, finished_keys, read_results, read_walls, results_frame, results_rows, rows_of_run, run_dir_of,
    write_results)
from ppo_async.study.benchmark.suites import (
    ASYNC_MODES, DEFAULT_ASYNC_MODE, DEFAULT_ASYNC_MODE_WHY, JAX_ONLY_MODES, MODE_DEFS, MODES, MUJOCO_ENVS, SLOW_SAMPLERS, SLOW_SIMULATORS, SLOW_STEP_MS,
    SLOW_STRAGGLER, SUITES, BenchmarkMode, Plan, Suite, mode_fields, modes_for_env, plan_spec,
    resolve_plan, run_config, share_envs)

__all__ = [
    "ASYNC_MODES", "BOOTSTRAP_REPS", "COLUMNS", "DEFAULT_ASYNC_MODE", "DEFAULT_ASYNC_MODE_WHY", "DONE_FILE", "JAX_ONLY_MODES", "MODE_DEFS", "MODES", "MUJOCO_ENVS",
    "REFERENCES_PATH", "REPORT_FILE", "RESULTS_FILE", "SLOW_SAMPLERS", "SLOW_SIMULATORS", "SLOW_STEP_MS",
    "SLOW_STRAGGLER", "SPEC_FILE", "SUITES", "TRAIN_TAIL", "WALL_FILE", "BenchmarkMode", "Plan", "Suite", "WallLog",
    "aggregate", "aggregate_section", "barrier_async_section", "benchmark", "bootstrap_mean_ci", "check_spec",
    "checkpoint_of", "checkpoint_table", "checkpoints_section", "episode_weighted",
    "final_section", "finish_run", "finished_keys", "has_checkpoint", "load_references", "mode_fields",
    "modes_for_env", "normalise", "normalising_references", "plan_spec", "plot_aggregate", "plot_learning_curves",
    "plot_wall_clock", "reach_ratio", "read_results", "read_walls", "report", "require_rliable", "resolve_plan",
    "results_frame", "results_rows", "returns_at_equal_wall", "rows_of_run", "run_config", "run_dir_of", "score_matrices", "share_envs",
    "train_run", "trained_to_end", "write_results",
]
