"""What does a policy lag of K versions do to PPO, and which fix keeps it healthy?

    python experiments/lag_sweep.py                       # Pendulum-v1, 3 seeds, 300k steps
    python experiments/lag_sweep.py --num-seeds 5 --total-env-steps 200000

Simulated mode with a fixed lag K in {0, 1, 2, 4, 8, 16}, crossed with four variants:
  clip0.2   PPO, clip_eps 0.2 (the default)
  clip0.1   PPO, clip_eps 0.1
  dual3     dual-clip PPO, c = 3 (clip_eps 0.2)
  vtrace    advantages with truncated importance weights (V-trace, rho_bar = c_bar = 1)
Each variant is one `ppo_async.sweep` over K (one compile per variant group: the first three
share a compile, V-trace is a different program). Writes OUT/lag_sweep.csv (one row per
K x variant), OUT/runs.jsonl (every iteration), and PNGs: return vs K, KL vs K, KL per lag
bucket; prints the table quoted in README.
"""

from __future__ import annotations

from ppo_async.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)

import dataclasses
import os

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async import analysis

HERE = os.path.dirname(os.path.abspath(__file__))

VARIANTS = {
    "clip0.2": {"ppo.clip_eps": 0.2, "ppo.dual_clip": None, "ppo.advantage_estimator": "gae"},
    "clip0.1": {"ppo.clip_eps": 0.1, "ppo.dual_clip": None, "ppo.advantage_estimator": "gae"},
    "dual3": {"ppo.clip_eps": 0.2, "ppo.dual_clip": 3.0, "ppo.advantage_estimator": "gae"},
    "vtrace": {"ppo.clip_eps": 0.2, "ppo.dual_clip": None, "ppo.advantage_estimator": "vtrace"},
}


@dataclasses.dataclass
class Args:
    env: str = "Pendulum-v1"
    lags: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
    num_seeds: int = 3
    seed: int = 0
    total_env_steps: int = 300_000
    threshold: float = -300.0
    """Return threshold for 'env steps to threshold'."""
    out: str | None = None


def summarise(df: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """One row per (variant, K): final return, steps to threshold, KL, clip fractions."""
    out = []
    for (variant, lag), group in df.groupby(["variant", "lag.K"], sort=False):
        finals = analysis.final_returns(group, 0.1).tolist()  # per seed
        steps = analysis.steps_to_threshold(group, threshold).tolist()
        reached = [s for s in steps if np.isfinite(s)]
        out.append(
            {
                "variant": variant,
                "K": int(lag),
                "final_return_mean": float(np.mean(finals)),
                "final_return_std": float(np.std(finals)),
                "seeds_reaching": len(reached),
                "seeds": len(finals),
                "median_steps_to_threshold": float(np.median(reached)) if reached else float("nan"),
                "approx_kl_mean": float(group.approx_kl.mean()),
                "approx_kl_max": float(group.approx_kl_max.max()),
                "clip_fraction": float(group.clip_fraction.mean()),
                "dual_clip_fraction": float(group.dual_clip_fraction.mean()),
                "policy_loss_std": float(group.policy_loss.std()),
            }
        )
    return pd.DataFrame(out)


def plot(summary: pd.DataFrame, df: pd.DataFrame, out: str, threshold: float) -> None:
    from matplotlib.figure import Figure

    for column, ylabel, name, guides in (
        ("final_return_mean", "final return (mean of last 10% iterations)", "return_vs_K.png", ()),
        ("approx_kl_mean", "mean approx KL to behaviour", "kl_vs_K.png", (0.01, 0.03)),
    ):
        fig = Figure(figsize=(6.5, 4))
        ax = fig.subplots()
        for variant, rows in summary.groupby("variant", sort=False):
            x = rows.K.to_numpy()
            ax.plot(np.maximum(x, 0.5), rows[column], marker="o", label=variant)
            if column == "final_return_mean":
                ax.fill_between(np.maximum(x, 0.5), rows[column] - rows.final_return_std,
                                rows[column] + rows.final_return_std, alpha=0.12)
        for g, label in zip(guides, ("watch", "lag hurting")):
            ax.axhline(g, color="grey", ls="--", lw=0.8)
            ax.text(0.55, g, label, fontsize=7, va="bottom", color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xticks([max(k, 0.5) for k in sorted(summary.K.unique())])
        ax.set_xticklabels([str(k) for k in sorted(summary.K.unique())])
        ax.set_xlabel("policy lag K (learner versions)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)

    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    base = df[df.variant == "clip0.2"]
    for lag, rows in base.groupby("lag.K"):
        per_lag = np.array([[np.nan if v is None else v for v in r] for r in rows.kl_per_lag])
        means = np.nanmean(np.where(np.isfinite(per_lag), per_lag, np.nan), axis=0)
        ax.plot(np.arange(len(means)), means, marker="o", label=f"K={lag}")
    ax.axhline(0.01, color="grey", ls="--", lw=0.8)
    ax.axhline(0.03, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("lag of the consumed samples (bucket)")
    ax.set_ylabel("approx KL to behaviour (clip 0.2)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "kl_per_lag_bucket.png"), dpi=110)


def main(args: Args) -> pd.DataFrame:
    out = args.out or os.path.join(HERE, "results", "lag_sweep", args.env)
    os.makedirs(out, exist_ok=True)
    base = pa.Config(env=args.env, mode="simulated", seed=args.seed, total_env_steps=args.total_env_steps)
    frames = []
    for name, fields in VARIANTS.items():
        grid = {"lag.K": list(args.lags), **{k: [v] for k, v in fields.items()}}
        df = pa.sweep(base, grid, seeds=args.num_seeds, progress=False)
        df["variant"] = name
        print(f"{name}: {len(df)} rows, compile {df.attrs['compile_seconds']:.1f}s, run {df.attrs['run_seconds']:.1f}s", flush=True)
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    pa.save_sweep(df, os.path.join(out, "runs.jsonl"))
    summary = summarise(df, args.threshold)
    summary.to_csv(os.path.join(out, "lag_sweep.csv"), index=False)
    plot(summary, df, out, args.threshold)

    table = summary.pivot(index="K", columns="variant", values="final_return_mean")[list(VARIANTS)]
    steps = summary.pivot(index="K", columns="variant", values="median_steps_to_threshold")[list(VARIANTS)]
    kl = summary.pivot(index="K", columns="variant", values="approx_kl_mean")[list(VARIANTS)]
    print(f"\n{args.env}, {args.num_seeds} seeds x {base.num_iterations * base.batch_size:,} env steps; "
          f"final return (mean over seeds) | median env steps to {args.threshold:g} | mean approx KL")
    header = "| K | " + " | ".join(f"{v}: return / steps / KL" for v in VARIANTS) + " |"
    print(header)
    print("|" + "---|" * (len(VARIANTS) + 1))
    for k in table.index:
        cells = []
        for v in VARIANTS:
            s = steps.loc[k, v]
            cells.append(f"{table.loc[k, v]:.0f} / {'-' if not np.isfinite(s) else f'{s / 1000:.0f}k'} / {kl.loc[k, v]:.4f}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    print(f"\nwrote {out}")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
