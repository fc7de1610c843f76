"""Where the samplers' time and throughput go: the per-sampler time split of a threaded run, and
throughput and KL against a swept knob (e.g. the number of samplers).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from ppo_async.report.figures import figure, finish, kl_guides, legend_outside, numeric, require, save

SAMPLER_TIME_COLUMNS = (
    ("sampler_rollout_s", "rollout"),
    ("sampler_wait_params_s", "waiting for params"),
    ("sampler_wait_buffer_s", "buffer put (space, lock, write)"),
    ("sampler_latency_s", "simulated env latency"),
)


def sampler_time_split(df: pd.DataFrame, path: str | os.PathLike | None = None) -> Any:
    """Per sampler, where its time went (threaded runs): stacked horizontal bars of the
    cumulative seconds in the last row's `sampler_rollout_s`, `sampler_wait_params_s`,
    `sampler_wait_buffer_s` and `sampler_latency_s` (one bar per sampler, in that order
    of segments: `fig.axes[0].containers[k]` is segment k)."""
    columns = [c for c, _ in SAMPLER_TIME_COLUMNS]
    require(df, columns, "sampler_time_split")
    last = df.iloc[-1]
    seconds = np.array([[np.nan if v is None else v for v in last[c]] for c in columns], dtype=np.float64)
    fig, ax = figure(figsize=(8.5, 0.6 * seconds.shape[1] + 1.8))
    samplers = np.arange(seconds.shape[1])
    left = np.zeros(seconds.shape[1])
    for k, (_, label) in enumerate(SAMPLER_TIME_COLUMNS):
        ax.barh(samplers, seconds[k], left=left, color=f"C{k}", label=label)
        left = left + np.nan_to_num(seconds[k])
    ax.set_yticks(samplers)
    ax.set_yticklabels([f"sampler {j}" for j in samplers])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (cumulative)")
    ax.set_title("Sampler time split")
    return finish(fig, ax, path, grid_axis="x")


def sweep_throughput_kl(df: pd.DataFrame, x: str, path: str | os.PathLike | None = None) -> Any:
    """For a sweep DataFrame with a column `x` (e.g. "num_samplers"): mean `steps_per_second`
    (left axis, `fig.axes[0].lines[0]`) and mean `approx_kl` (right axis,
    `fig.axes[1].lines[0]`, with the 0.01 / 0.03 guides) per value of `x`.

    Numeric `x` is plotted in order (log2 axis when it spans a factor of 8 or more);
    other values are categories in order of first appearance.
    """
    require(df, [x, "steps_per_second", "approx_kl"], "sweep_throughput_kl")
    frame = pd.DataFrame({"x": df[x].to_numpy(), "sps": numeric(df["steps_per_second"]), "kl": numeric(df["approx_kl"])})
    is_numeric = pd.api.types.is_numeric_dtype(frame["x"]) and not pd.api.types.is_bool_dtype(frame["x"])
    agg = frame.groupby("x", sort=is_numeric).mean()
    if is_numeric:
        xs = agg.index.to_numpy(dtype=np.float64)
        ticks, ticklabels = xs, [f"{v:g}" for v in xs]
    else:
        xs = np.arange(len(agg), dtype=np.float64)
        ticks, ticklabels = xs, [str(v) for v in agg.index]
    fig, ax = figure()
    ax.plot(xs, agg["sps"].to_numpy(), color="C0", marker="o", linewidth=1.8, label="env steps / s")
    ax.set_ylabel("env steps / s (mean)", color="C0")
    ax.tick_params(axis="y", colors="C0")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(xs, agg["kl"].to_numpy(), color="C3", marker="s", linewidth=1.8, label="approx_kl")
    kl_guides(ax2)
    ax2.set_ylabel("approx_kl (mean)", color="C3")
    ax2.tick_params(axis="y", colors="C3")
    if is_numeric and len(xs) and xs.min() > 0 and xs.max() / xs.min() >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels(ticklabels)
    ax.set_xlabel(x)
    ax.set_title(f"Throughput and KL vs {x}")
    legend_outside(fig, ax, ax2)
    ax.grid(alpha=0.3)
    save(fig, path)
    return fig
