"""The figures of `tune` (ppo_async.study.tune): step 2's knee (consumer throughput and KL vs
the number of samplers) and step 1's KL vs ring-buffer length.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ppo_async.report.figures import figure, finish, legend_outside, save


def tune_knee(rows: Sequence[Mapping[str, Any]], knee: int, kl_target: float, path: str | os.PathLike | None = None) -> Any:
    """`tune` step 2: consumer env steps/s (left axis, `fig.axes[0].lines[0]`) and mean KL
    (right axis, `fig.axes[1].lines[0]`) vs the number of samplers, with the linear
    extrapolation of one sampler (dotted), the knee (vertical line) and the KL target
    (horizontal line on the KL axis). `rows` hold `num_samplers`, `consumer_steps_per_s` and
    `approx_kl_mean`."""
    if not rows:
        raise ValueError("tune_knee needs at least one measured sampler count")
    xs = np.asarray([r["num_samplers"] for r in rows], np.float64)
    rate = np.asarray([r["consumer_steps_per_s"] for r in rows], np.float64)
    kl = np.asarray([r["approx_kl_mean"] for r in rows], np.float64)
    fig, ax = figure()
    ax.plot(xs, rate, color="C0", marker="o", linewidth=1.8, label="consumer env steps / s")
    ax.plot(xs, rate[0] * xs, color="C0", linestyle=":", linewidth=1.0, label="linear (n x one sampler)")
    ax.axvline(knee, color="k", linestyle="--", linewidth=1.0, label=f"knee: {knee} sampler(s)")
    ax.set_ylim(0, max(float(np.nanmax(rate)) * 1.3, 1.0))
    ax.set_ylabel("consumer env steps / s", color="C0")
    ax.set_xlabel("samplers")
    ax.set_xticks(xs)
    ax2 = ax.twinx()
    ax2.plot(xs, kl, color="C3", marker="s", linewidth=1.8, label="mean approx_kl")
    ax2.axhline(kl_target, color="C3", linestyle="--", linewidth=1.0, label=f"KL target {kl_target:g}")
    ax2.set_ylim(0, max(float(np.nanmax(kl)), kl_target) * 1.3)
    ax2.set_ylabel("mean approx_kl", color="C3")
    ax.set_title("Throughput and KL vs samplers (tune step 2)")
    legend_outside(fig, ax, ax2)
    ax.grid(alpha=0.3)
    save(fig, path)
    return fig


def kl_vs_buffer(rows: Sequence[Mapping[str, Any]], kl_target: float, path: str | os.PathLike | None = None) -> Any:
    """`tune` step 1: mean KL vs ring-buffer length (chunks, log2 axis), one line per sampler
    count (`fig.axes[0].lines[i]`, in order of the counts), with the KL target. `rows` hold
    `num_samplers`, `buffer_chunks` and `approx_kl_mean` (repeated settings are averaged)."""
    if not rows:
        raise ValueError("kl_vs_buffer needs at least one measured buffer length")
    frame = pd.DataFrame({"n": [r["num_samplers"] for r in rows], "chunks": [r["buffer_chunks"] for r in rows],
                          "kl": [r["approx_kl_mean"] for r in rows]}).groupby(["n", "chunks"], as_index=False).mean()
    fig, ax = figure()
    for i, (n, group) in enumerate(frame.groupby("n")):
        group = group.sort_values("chunks")
        ax.plot(group["chunks"], group["kl"], marker="o", color=f"C{i}", linewidth=1.8, label=f"{n} sampler(s)")
    ax.axhline(kl_target, color="k", linestyle="--", linewidth=1.0, label=f"KL target {kl_target:g}")
    chunks = sorted(frame["chunks"].unique())
    if chunks[-1] / chunks[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(chunks)
    ax.set_xticklabels([str(c) for c in chunks])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("ring-buffer length (rollout chunks)")
    ax.set_ylabel("mean approx_kl")
    ax.set_title("KL to the behaviour policy vs buffer length")
    return finish(fig, ax, path)
