"""Plots of metrics DataFrames (rows as in docs/reference/metrics.md; side effect: optional PNG files):
the one place to import them from (`from ppo_async.report import plots; plots.learning_curve(...)`).

Every function takes a pandas DataFrame of metrics rows (one row per seed x learner
iteration, as `TrainResult.metrics` / `metrics.jsonl`), returns the matplotlib `Figure` and,
when `path` is given, also writes it as a PNG. Figures are built on the Agg canvas inside each
function (`matplotlib.figure.Figure` + `FigureCanvasAgg`): nothing is selected or registered
globally (no pyplot state), so this works headless, in threads and in notebooks alike.

`None` / NaN values (e.g. `episode_return` of an iteration where no episode finished, or a
`kl_per_lag` bucket with no sample) are skipped, never plotted as zero. Legends sit outside
the axes, to the right (`fig.legends[0]`), so they never cover data, and the figure grows by
their width instead of the axes shrinking (`figures.legend_outside`).

The figures live by concern: `figures` (the shared helpers), `curves` (learning curve, KL over
time, throughput), `lag_plots` (lag histograms, KL per lag), `sampler_plots` (the samplers'
time split, throughput and KL vs a swept knob), `run_readers` (reading a run directory),
`run_plots` (`plot_run`: every figure of one run) and `compare` (`compare_runs`: several runs
overlaid, `python -m ppo_async compare`). Tune's figures are in `ppo_async.study.tune_plots`.
"""

from __future__ import annotations

from ppo_async.report.compare import COMPARE_FILES, compare_runs
from ppo_async.report.curves import (THROUGHPUT_WINDOW, kl_over_time, kl_over_time_runs, learning_curve, rolling_mean,
                                     seed_quantiles, throughput)
from ppo_async.report.figures import KL_HURTING, KL_WATCH
from ppo_async.report.lag_plots import kl_per_lag, lag_histogram, lag_histograms, mean_kl_per_lag, summed_lag_histogram
from ppo_async.report.run_plots import plot_run
from ppo_async.report.run_readers import (MAX_CURVE_POINTS, PLOT_RUN_COLUMNS, PLOT_RUN_CURVE_COLUMNS,
                                          PLOT_RUN_LIST_COLUMNS, read_run_metrics, run_frames)
from ppo_async.report.sampler_plots import SAMPLER_TIME_COLUMNS, sampler_time_split, sweep_throughput_kl

__all__ = [
    "learning_curve",
    "lag_histogram",
    "kl_over_time",
    "kl_per_lag",
    "throughput",
    "rolling_mean",
    "THROUGHPUT_WINDOW",
    "kl_over_time_runs",
    "lag_histograms",
    "compare_runs",
    "sweep_throughput_kl",
    "sampler_time_split",
    "SAMPLER_TIME_COLUMNS",
    "plot_run",
    "run_frames",
    "read_run_metrics",
    "MAX_CURVE_POINTS",
    "PLOT_RUN_COLUMNS",
    "PLOT_RUN_CURVE_COLUMNS",
    "PLOT_RUN_LIST_COLUMNS",
    "COMPARE_FILES",
    "seed_quantiles",
    "summed_lag_histogram",
    "mean_kl_per_lag",
    "KL_WATCH",
    "KL_HURTING",
]
