"""The benchmark's figures (written beside report.md): learning curves with the reference
figures, return vs wall-clock of barrier and the async modes, and the aggregate IQM. Built on the
Agg canvas (`report.figures.grid_figure`: no pyplot state); side effect: the PNG files.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report.figures import grid_figure
from ppo_async.study.benchmark.suites import ASYNC_MODES, MODES


def plot_learning_curves(table: pd.DataFrame, references: Sequence[Mapping[str, Any]], path: str) -> str:
    """learning_curves.png: per env, mean deterministic return vs env steps per mode with its 95%
    percentile-bootstrap CI band over seeds; each reference figure as a mark (± its std) at its
    env-step budget."""
    envs = sorted(table["env"].unique())
    fig, axes = grid_figure(len(envs))
    for ax, env in zip(axes, envs):
        for mode in [m for m in MODES if m in set(table["mode"])]:
            part = table[(table["env"] == env) & (table["mode"] == mode)].sort_values("checkpoint")
            if part.empty:
                continue
            ax.plot(part["checkpoint"], part["mean"], marker="o", ms=3, label=mode)
            ax.fill_between(part["checkpoint"], part["ci_low"], part["ci_high"], alpha=0.2)
        for i, ref in enumerate(r for r in references if r["env"] == env):
            ax.errorbar([ref["env_steps"]], [ref["value"]], yerr=[ref.get("std") or 0], fmt="*k" if i == 0 else "Dk",
                        ms=9 if i == 0 else 5, capsize=3, label=f"{ref['source']} ({ref['env_id']})")
        ax.set(title=env, xlabel="env steps", ylabel="eval return (deterministic)")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path


def plot_wall_clock(table: pd.DataFrame, path: str) -> str | None:
    """return_vs_wall_clock.png: per env, mean return vs mean wall seconds at each checkpoint for
    barrier and each async mode (the band: 95% percentile-bootstrap CI over seeds); None when none ran."""
    compared = ("barrier", *ASYNC_MODES)
    part = table[table["mode"].isin(compared)]
    if part.empty:
        return None
    envs = sorted(part["env"].unique())
    fig, axes = grid_figure(len(envs))
    for ax, env in zip(axes, envs):
        for mode in compared:
            curve = part[(part["env"] == env) & (part["mode"] == mode)].sort_values("checkpoint")
            if not curve.empty:
                ax.plot(curve["wall_s"], curve["mean"], marker="o", ms=3, label=mode)
                ax.fill_between(curve["wall_s"], curve["ci_low"], curve["ci_high"], alpha=0.2)
        ax.set(title=env, xlabel="wall-clock seconds since the run started", ylabel="eval return")
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=100)
    return path


def plot_aggregate(agg: Mapping[str, Any], path: str) -> str | None:
    """aggregate.png: the IQM of normalised scores per mode with its 95% stratified-bootstrap CI; None
    without scores."""
    if not agg["iqm"]:
        return None
    fig, (ax,) = grid_figure(1, 5.0, 2.8)
    names = list(agg["iqm"])
    values = np.array([agg["iqm"][m] for m in names])
    ax.errorbar(values[:, 0], range(len(names)), xerr=[values[:, 0] - values[:, 1], values[:, 2] - values[:, 0]],
                fmt="o", capsize=4)
    ax.axvline(1.0, color="grey", ls="--", lw=1)
    ax.set(yticks=range(len(names)), yticklabels=names, xlabel="IQM of normalised score (1 = reference)",
           title=f"{len(agg['tasks'])} envs x {agg['runs']} seeds")
    fig.savefig(path, dpi=100)
    return path
