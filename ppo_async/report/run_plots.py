"""The figures of one run directory (`plot_run`, what a run writes at its end and `python -m
ppo_async plot` writes again): every applicable PNG from its metrics.jsonl.
"""

from __future__ import annotations

import os

import pandas as pd

from ppo_async.report import analysis
from ppo_async.report.curves import kl_over_time, learning_curve, throughput
from ppo_async.report.figures import has_values
from ppo_async.report.lag_plots import kl_per_lag, lag_histogram
from ppo_async.report.run_readers import run_frames, run_mode
from ppo_async.report.sampler_plots import SAMPLER_TIME_COLUMNS, sampler_time_split


def _has_lag(lists: pd.DataFrame) -> bool:
    """Whether a run's summed lag histogram has any sample at lag >= 1."""
    if not has_values(lists, "lag_histogram", lists=True):
        return False
    counts = analysis.lag_histogram_of(lists)
    return bool(counts[1:].sum() > 0)


def plot_run(run_dir: str | os.PathLike, label: str | None = None, out_dir: str | os.PathLike | None = None) -> list[str]:
    """Reads `run_dir/metrics.jsonl` and writes every applicable PNG into `out_dir` (default `run_dir`):
    learning_curve.png, kl_over_time.png, throughput.png, and lag_histogram.png /
    kl_per_lag.png / sampler_time.png (threaded) when those columns exist. A plot whose columns have no finite value yet
    (e.g. no episode finished) is skipped. `label` names the run in the learning curve's
    legend (default: the directory's name). Returns the paths written.

    The file is read once, line by line (`run_frames`): the list-valued columns are reduced as
    they are read, and beyond `MAX_CURVE_POINTS` rows the curves are binned (each point the
    consecutive rows of a seed folded by the metric rules, `aggregate.RowFold`, as a
    `log_every` row; the figures' titles then say how many), so the memory
    the plots at the end of a run need does not grow with its length."""
    run_dir = os.fspath(run_dir)
    curves, lists = run_frames(run_dir, "plot_run")
    name = label or os.path.basename(os.path.normpath(os.path.abspath(run_dir))) or "run"
    written: list[str] = []

    target = run_dir if out_dir is None else os.fspath(out_dir)
    os.makedirs(target, exist_ok=True)

    def out(stem: str) -> str:
        p = os.path.join(target, f"{stem}.png")
        written.append(p)
        return p

    # Each figure is cleared once written: its artists are freed at once (the figure itself sits
    # in a reference cycle until a garbage collection), so the next figure reuses their memory.
    if has_values(curves, "episode_return") and "env_steps" in curves.columns:
        learning_curve({name: curves}, x="env_steps", path=out("learning_curve")).clear()
    lagged = _has_lag(lists)
    open_ended = run_mode(run_dir) in ("threaded", None)  # a threaded histogram's last bucket is a catch-all
    if has_values(curves, "approx_kl") and "env_steps" in curves.columns:
        kl_over_time(curves, path=out("kl_over_time"), lagged=lagged).clear()
    if has_values(curves, "steps_per_second") and "wall_time" in curves.columns:
        throughput(curves, path=out("throughput")).clear()
    if lagged:  # a run at lag 0 throughout (sync) gets no lag figures: they would show one bar at 0
        lag_histogram(lists, path=out("lag_histogram"), open_ended=open_ended).clear()
        if has_values(lists, "kl_per_lag", lists=True):
            kl_per_lag(lists, path=out("kl_per_lag"), open_ended=open_ended).clear()
    if all(c in lists.columns for c, _ in SAMPLER_TIME_COLUMNS):
        sampler_time_split(lists, path=out("sampler_time")).clear()
    return written
