"""The lag-robustness table: what does a policy lag of K versions do to PPO, and which fix keeps it healthy?

    python experiments/lag_sweep.py                       # Pendulum-v1, 5 seeds, 300k steps, K up to 32
    python experiments/lag_sweep.py --num-seeds 3 --lags 0 4 16 --variants clip0.2 decoupled
    python experiments/lag_sweep.py --env brax/inverted_pendulum --total-env-steps 200000 --threshold 900

Simulated mode with a fixed lag K in {0, 1, 2, 4, 8, 16, 32}, crossed with six variants:
  clip0.2         PPO, clip_eps 0.2 (the default)
  clip0.1         PPO, clip_eps 0.1
  dual3           dual-clip PPO, c = 3 (clip_eps 0.2)
  vtrace          advantages with truncated importance weights (V-trace, rho_bar = c_bar = 1)
  decoupled       decoupled PPO (Hilton et al. 2021): clip to the learner at the start of the
                  iteration, weight by min(pi_prox / mu, 2)
  (decoupled_vtrace, on request: decoupled PPO on V-trace advantages)
  decoupled_ewma  the same with pi_prox an EWMA of the learner's params, decay 0.975 per SGD
                  step (centre of mass ~39 steps: the age of PPO's pi_old at 80 steps per
                  iteration, Hilton et al.'s matching rule)
Each variant is one `ppo_async.study.sweep` over K (the first five share one compile: the objective
and its scalars are traced; V-trace and the EWMA are other programs). Per cell, over seeds:
final return (mean of each seed's last 10% of iterations, 95% CI), area under the curve (mean
return over the whole run = AUC / env steps, 95% CI), median env steps to the threshold (and
seeds reaching it), mean approx KL to the behaviour policy, mean ESS fraction of the importance
weights. A variant "breaks" at the smallest K whose mean final return is below the threshold.

Writes OUT/manifest.json, OUT/lag_sweep.csv (one row per K x variant), OUT/runs.jsonl (every iteration and
metric; git-ignored), OUT/curves.csv.gz (return, KL and ESS per iteration), PNGs
(return vs K with CI bands, AUC vs K, KL vs K, ESS vs K, KL per lag bucket) and prints the
tables quoted in README. OUT defaults to runs/experiments/lag_sweep/ENV (git-ignored): publish with
--out experiments/results/lag_sweep/ENV.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)

import dataclasses
import os
import time

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.report import analysis, stats
from ppo_async.study.manifest import Manifest, default_out

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

_PPO = {"ppo.objective": "ppo", "ppo.advantage_estimator": "gae", "ppo.dual_clip": None}
VARIANTS = {
    "clip0.2": {**_PPO, "ppo.clip_eps": 0.2},
    "clip0.1": {**_PPO, "ppo.clip_eps": 0.1},
    "dual3": {**_PPO, "ppo.clip_eps": 0.2, "ppo.dual_clip": 3.0},
    "vtrace": {**_PPO, "ppo.clip_eps": 0.2, "ppo.advantage_estimator": "vtrace"},
    "decoupled": {**_PPO, "ppo.clip_eps": 0.2, "ppo.objective": "decoupled", "ppo.is_clip": 2.0},
    "decoupled_ewma": {**_PPO, "ppo.clip_eps": 0.2, "ppo.objective": "decoupled", "ppo.is_clip": 2.0,
                       "ppo.prox_ewma": 0.975},
    # not in the default table: decoupled PPO on V-trace advantages (run with --variants decoupled_vtrace)
    "decoupled_vtrace": {**_PPO, "ppo.clip_eps": 0.2, "ppo.objective": "decoupled", "ppo.is_clip": 2.0,
                         "ppo.advantage_estimator": "vtrace"},
}
DEFAULT_VARIANTS = ("clip0.2", "clip0.1", "dual3", "vtrace", "decoupled", "decoupled_ewma")


@dataclasses.dataclass
class Args:
    env: str = "Pendulum-v1"
    lags: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32)
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    num_seeds: int = 5
    seed: int = 0
    total_env_steps: int = 300_000
    threshold: float = -300.0
    """Return threshold for 'env steps to threshold' and for 'breaks'."""
    out: str | None = None
    """Output folder (default runs/experiments/lag_sweep/ENV, git-ignored)."""


def cell_table(df: pd.DataFrame, variant: str, threshold: float) -> pd.DataFrame:
    """One row per K of one variant's sweep: `pa.summarize` plus 95% CIs over seeds of the
    final return and of the AUC (`analysis.final_returns` over all iterations)."""
    summary = pa.summarize(df, threshold=threshold)
    per_seed = pa.summarize(df, threshold=threshold, by_seed=True)
    auc = analysis.final_returns(df, last_fraction=1.0, by=("config_id", "seed")).rename("auc").reset_index()
    rows = []
    for _, row in summary.iterrows():
        finals = per_seed.loc[per_seed.config_id == row.config_id, "final_return_mean"]
        aucs = auc.loc[auc.config_id == row.config_id, "auc"]
        final_mean, final_ci = stats.mean_ci95(finals)
        auc_mean, auc_ci = stats.mean_ci95(aucs)
        rows.append({
            "variant": variant, "K": int(row["lag.K"]), "seeds": int(row.num_seeds),
            "final_return_mean": final_mean, "final_return_ci95": final_ci,
            "auc_mean": auc_mean, "auc_ci95": auc_ci,
            "steps_to_threshold_median": row.steps_to_threshold_median, "reached": row.reached,
            "approx_kl_mean": row.approx_kl_mean, "ess_fraction_mean": row.ess_fraction_mean,
        })
    return pd.DataFrame(rows)


def breaks_at(table: pd.DataFrame, threshold: float) -> dict[str, int | None]:
    """Per variant: the smallest K whose mean final return is below `threshold` (None: none is)."""
    out = {}
    for variant, rows in table.groupby("variant", sort=False):
        below = rows[rows.final_return_mean < threshold].K
        out[variant] = int(below.min()) if len(below) else None
    return out


def plot(table: pd.DataFrame, df: pd.DataFrame, out: str) -> None:
    from matplotlib.figure import Figure

    lags = sorted(table.K.unique())
    for column, ci, ylabel, name, guides in (
        ("final_return_mean", "final_return_ci95", "final return (last 10% of iterations; 95% CI)", "return_vs_K.png", ()),
        ("auc_mean", "auc_ci95", "mean return over the run (AUC / steps; 95% CI)", "auc_vs_K.png", ()),
        ("approx_kl_mean", None, "mean approx KL to behaviour", "kl_vs_K.png", (0.01, 0.03)),
        ("ess_fraction_mean", None, "ESS / n of pi_learner / mu", "ess_vs_K.png", ()),
    ):
        fig = Figure(figsize=(7.5, 4))
        ax = fig.subplots()
        for variant, rows in table.groupby("variant", sort=False):
            x = np.maximum(rows.K.to_numpy(), 0.5)
            ax.plot(x, rows[column], marker="o", label=variant)
            if ci is not None:
                ax.fill_between(x, rows[column] - rows[ci].fillna(0), rows[column] + rows[ci].fillna(0), alpha=0.12)
        for g, label in zip(guides, ("watch", "lag hurting")):
            ax.axhline(g, color="grey", ls="--", lw=0.8)
            ax.text(0.55, g, label, fontsize=7, va="bottom", color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xticks([max(k, 0.5) for k in lags])
        ax.set_xticklabels([str(k) for k in lags])
        ax.set_xlabel("policy lag K (learner versions)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)

    base = df[df.variant == table.variant.iloc[0]]
    fig = Figure(figsize=(7.5, 4))
    ax = fig.subplots()
    for lag, rows in base.groupby("lag.K"):
        per_lag = analysis.stack_padded(analysis.list_rows(rows.kl_per_lag))
        ax.plot(np.arange(per_lag.shape[1]), np.nanmean(per_lag, axis=0), marker="o", label=f"K={lag}")
    ax.axhline(0.01, color="grey", ls="--", lw=0.8)
    ax.axhline(0.03, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("lag of the consumed samples (bucket)")
    ax.set_ylabel(f"approx KL to behaviour ({table.variant.iloc[0]})")
    ax.legend(fontsize=7, ncol=1, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "kl_per_lag_bucket.png"), dpi=110)


def print_tables(table: pd.DataFrame, args: Args, env_steps: int) -> None:
    variants = list(dict.fromkeys(table.variant))
    cell = {(r.variant, r.K): r for r in table.itertuples()}

    def grid(title: str, fmt) -> None:
        print(f"\n{title}\n")
        print("| K | " + " | ".join(variants) + " |")
        print("|" + "---|" * (len(variants) + 1))
        for k in sorted(table.K.unique()):
            print(f"| {k} | " + " | ".join(fmt(cell[(v, k)]) for v in variants) + " |")

    pm = lambda m, h: f"{m:.0f} ± {h:.0f}" if np.isfinite(h) else f"{m:.0f}"  # noqa: E731
    print(f"\n{args.env}, {args.num_seeds} seeds x {env_steps:,} env steps per cell")
    grid("final return (mean over seeds of the last 10% of iterations ± 95% CI)", lambda r: pm(r.final_return_mean, r.final_return_ci95))
    grid("mean return over the run (AUC / env steps ± 95% CI)", lambda r: pm(r.auc_mean, r.auc_ci95))
    grid(f"median env steps to {args.threshold:g} (seeds reaching it)",
         lambda r: f"{'-' if not np.isfinite(r.steps_to_threshold_median) else f'{r.steps_to_threshold_median / 1000:.0f}k'} ({r.reached})")
    grid("mean approx KL to the behaviour policy / mean ESS fraction", lambda r: f"{r.approx_kl_mean:.4f} / {r.ess_fraction_mean:.3f}")
    print(f"\nbreaks (smallest K with mean final return < {args.threshold:g}):",
          ", ".join(f"{v}: {'none' if k is None else f'K={k}'}" for v, k in breaks_at(table, args.threshold).items()))


def main(args: Args) -> pd.DataFrame:
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants {unknown} unknown: choose from {list(VARIANTS)}")
    out = args.out or default_out(os.path.join("lag_sweep", args.env), REPO)
    with Manifest(out):
        return run(args, out)


def run(args: Args, out: str) -> pd.DataFrame:
    """One sweep per variant; writes the CSVs, runs.jsonl and the plots into `out`, prints the tables."""
    os.makedirs(out, exist_ok=True)
    # the env's preset (README "Per-env presets") under the sweep's own fields; none for Pendulum-v1
    base = pa.config_for_env(args.env, {"mode": "simulated", "seed": args.seed, "total_env_steps": args.total_env_steps})
    frames, tables = [], []
    for name in args.variants:
        grid = {"lag.K": list(args.lags), **{k: [v] for k, v in VARIANTS[name].items()}}
        t0 = time.perf_counter()
        df = pa.sweep(base, grid, seeds=args.num_seeds, progress=False)
        print(f"{name}: {len(df)} rows, compile {df.attrs['compile_seconds']:.1f}s, "
              f"run {df.attrs['run_seconds']:.1f}s, wall {time.perf_counter() - t0:.0f}s", flush=True)
        tables.append(cell_table(df, name, args.threshold))
        frames.append(df.assign(variant=name))
    df = pd.concat(frames, ignore_index=True)
    table = pd.concat(tables, ignore_index=True)
    pa.save_sweep(df, os.path.join(out, "runs.jsonl"))  # every row (~125 MB at the defaults: git-ignored)
    curve_columns = ["variant", "lag.K", "seed", "iteration", "env_steps", "episode_return", "approx_kl", "ess_fraction"]
    df[curve_columns].to_csv(os.path.join(out, "curves.csv.gz"), index=False)  # the learning curves, small enough to commit
    table.to_csv(os.path.join(out, "lag_sweep.csv"), index=False)
    plot(table, df, out)
    print_tables(table, args, base.num_iterations * base.batch_size)
    print(f"\nwrote {out}")
    return table


if __name__ == "__main__":
    main(tyro.cli(Args))
