"""Several runs side by side (`python -m ppo_async compare`): their learning curves against env
steps and wall time, KL over time and lag histograms overlaid, one PNG each.
"""

from __future__ import annotations

import os
from typing import Mapping

import pandas as pd

from ppo_async.report.curves import kl_over_time_runs, learning_curve
from ppo_async.report.figures import has_values, runs_mapping
from ppo_async.report.lag_plots import lag_histograms

COMPARE_FILES = ("return_vs_env_steps.png", "return_vs_wall_time.png", "kl_over_time.png", "lag_histogram.png")


def compare_runs(runs: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike) -> list[str]:
    """Overlaid figures of several labelled runs, written into `out_dir` (created):
    return_vs_env_steps.png and return_vs_wall_time.png (`learning_curve`: per run the median
    over seeds and a 25-75% band), kl_over_time.png (`kl_over_time_runs`) and
    lag_histogram.png (`lag_histograms`). A figure for which no run has a finite value is
    skipped. Returns the paths written, in that order."""
    runs = runs_mapping(runs, "compare_runs")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    written: list[str] = []

    def out(index: int) -> str:
        written.append(os.path.join(out_dir, COMPARE_FILES[index]))
        return written[-1]

    def having(*columns: str) -> dict[str, pd.DataFrame]:
        return {k: d for k, d in runs.items() if all(c in d.columns for c in columns[1:]) and has_values(d, columns[0])}

    for index, x in ((0, "env_steps"), (1, "wall_time")):
        with_returns = having("episode_return", x)
        if with_returns:
            learning_curve(with_returns, x=x, path=out(index))
    with_kl = having("approx_kl", "env_steps")
    if with_kl:
        kl_over_time_runs(with_kl, path=out(2))
    if any(has_values(d, "lag_histogram", lists=True) for d in runs.values()):
        lag_histograms(runs, path=out(3))
    return written
