"""Learning curves of N seeds on one env: raw curves (CSV), a PNG and a summary line.

    python experiments/learning_curves.py --env Pendulum-v1 --num-seeds 5
    python experiments/learning_curves.py --env CartPole-v1 --num-seeds 5
    # physics envs with their presets (README "Environments"), 3 seeds x 2M steps:
    python experiments/learning_curves.py --env playground/CartpoleBalance --num-seeds 3 --total-env-steps 2000000
    python experiments/learning_curves.py --env brax/inverted_pendulum --num-seeds 3 --total-env-steps 2000000
    python experiments/learning_curves.py --env playground/CheetahRun --num-seeds 3 --total-env-steps 1000000
    # the peer's shape (64 envs x 128 steps, 4 epochs x 32 minibatches), 3 seeds x 1M steps
    # (one --set with every override: a repeated --set keeps only its last value):
    python experiments/learning_curves.py --env Pendulum-v1 --num-seeds 3 --total-env-steps 1000000 \
        --set rollout.num_envs=64 rollout.num_steps=128 ppo.num_epochs=4 ppo.num_minibatches=32 --tag peer-shape

All seeds train in one compile (vmap). The env's preset (`ppo_async.config.presets`) fills every
field `--set` does not. "Steps to threshold" is the env-step count of the
first learner iteration whose mean return over the episodes finished in it reaches the
threshold. Writes OUT/curves.csv, OUT/return_vs_steps.png, OUT/summary.json, OUT/manifest.json;
OUT defaults to runs/experiments/learning_curves/ENV/TAG (git-ignored): publish with
--out experiments/results/learning_curves/ENV/TAG.
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)

import dataclasses
import json
import os
import sys

import numpy as np
import tyro

import ppo_async as pa
from ppo_async.config import parse_assignments
from ppo_async.report import analysis
from ppo_async.study.manifest import Manifest, default_out

DEFAULT_THRESHOLDS = {"Pendulum-v1": -200.0, "CartPole-v1": 475.0, "Acrobot-v1": -100.0,
                      "playground/CartpoleBalance": 800.0, "brax/inverted_pendulum": 900.0,
                      "playground/CheetahRun": 300.0}
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@dataclasses.dataclass
class Args:
    env: str = "Pendulum-v1"
    """Environment (gymnax name, brax/*, playground/*)."""
    num_seeds: int = 5
    """Seeds (trained together with vmap)."""
    seed: int = 0
    """First seed."""
    total_env_steps: int = 300_000
    """Env steps per seed."""
    threshold: float | None = None
    """Return threshold; default per env (Pendulum -200, CartPole 475)."""
    set: tuple[str, ...] = ()
    """Config overrides as dotted.key=value (values parsed as JSON when possible), all after one --set
    (a repeated --set keeps only its last values)."""
    tag: str = "default"
    """Name of the results folder under runs/experiments/learning_curves/ENV/."""
    out: str | None = None
    """Output folder (overrides the tag-based default)."""


def steps_to_threshold(df, threshold: float) -> dict[int, int | None]:
    """Per seed: env steps of the first iteration whose mean finished-episode return >= threshold."""
    steps = analysis.steps_to_threshold(df, threshold)
    return {int(seed): None if np.isnan(s) else int(s) for seed, s in steps.items()}


def plot_curves(df, threshold: float, title: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    grid = np.sort(df.env_steps.unique())
    interpolated = []
    for seed, group in df.groupby("seed", sort=True):
        g = group.dropna(subset=["episode_return"])
        ax.plot(g.env_steps, g.episode_return, lw=0.8, alpha=0.45, label=f"seed {seed}")
        interpolated.append(np.interp(grid, g.env_steps, g.episode_return.astype(float)))
    stack = np.stack(interpolated)
    ax.plot(grid, np.median(stack, 0), color="k", lw=2, label="median")
    ax.fill_between(grid, np.percentile(stack, 25, 0), np.percentile(stack, 75, 0), color="k", alpha=0.12, label="25-75%")
    ax.axhline(threshold, color="tab:red", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_xlabel("env steps (per seed)")
    ax.set_ylabel("mean return of episodes finished")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(args: Args) -> dict:
    changes = {"num_seeds": args.num_seeds, "seed": args.seed, "total_env_steps": args.total_env_steps}
    changes.update(parse_assignments(args.set))
    config = pa.config_for_env(args.env, changes)
    threshold = args.threshold if args.threshold is not None else DEFAULT_THRESHOLDS.get(args.env)
    if threshold is None:
        raise SystemExit(f"--threshold is required for {args.env}")
    out = args.out or default_out(os.path.join("learning_curves", args.env, args.tag), REPO)
    with Manifest(out):
        return run(args, config, threshold, out)


def run(args: Args, config: pa.Config, threshold: float, out: str) -> dict:
    """Trains every seed; writes curves.csv, summary.json and the PNG into `out`; returns the summary."""
    os.makedirs(out, exist_ok=True)
    result = pa.train(config, progress=True)
    df = result.to_dataframe()
    df[["seed", "iteration", "env_steps", "wall_time", "steps_per_second", "episode_return", "approx_kl", "clip_fraction"]].to_csv(
        os.path.join(out, "curves.csv"), index=False
    )
    table = pa.summarize(df, threshold=threshold).iloc[0]
    per_seed = pa.summarize(df, threshold=threshold, by_seed=True)
    hits = steps_to_threshold(df, threshold)
    reached = [s for s in hits.values() if s is not None]
    steps_per_seed = config.num_iterations * config.batch_size
    median = table.steps_to_threshold_median
    summary = {
        "env": args.env,
        "tag": args.tag,
        "overrides": list(args.set),
        "num_seeds": args.num_seeds,
        "seeds": list(range(args.seed, args.seed + args.num_seeds)),
        "env_steps_per_seed": steps_per_seed,
        "threshold": threshold,
        "steps_to_threshold": hits,
        "seeds_reaching_threshold": len(reached),
        "median_steps_to_threshold": None if not np.isfinite(median) else float(median),
        "final_return_per_seed": [round(float(x), 1) for x in per_seed.final_return_mean],
        "final_return_mean": float(table.final_return_mean),
        "final_return_std": float(table.final_return_std),
        "approx_kl_mean": float(table.approx_kl_mean),
        "compile_seconds": round(result.compile_seconds, 2),
        "run_seconds": round(result.run_seconds, 2),
        "env_steps_per_second_all_seeds": round(steps_per_seed * args.num_seeds / result.run_seconds),
        "env_steps_per_second_per_seed": round(steps_per_seed / result.run_seconds),
        "config": pa.config_to_dict(config),
    }
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    title = f"{args.env} [{args.tag}]: {args.num_seeds} seeds, {len(reached)}/{args.num_seeds} reach {threshold:g}"
    plot_curves(df, threshold, title, os.path.join(out, "return_vs_steps.png"))
    median = summary["median_steps_to_threshold"]
    final_mean, final_std = summary["final_return_mean"], summary["final_return_std"]
    print(
        f"SUMMARY {args.env} [{args.tag}] seeds={args.num_seeds} steps/seed={steps_per_seed} | "
        f"reach {threshold:g}: {len(reached)}/{args.num_seeds}, median steps "
        f"{'-' if median is None else f'{median:,.0f}'} | final return {final_mean:.1f} +- {final_std:.1f} | "
        f"{summary['env_steps_per_second_all_seeds']:,} env steps/s all seeds "
        f"({summary['env_steps_per_second_per_seed']:,}/seed), run {result.run_seconds:.1f}s + compile {result.compile_seconds:.1f}s"
    )
    print(f"wrote {out}")
    return summary


if __name__ == "__main__":
    main(tyro.cli(Args))
    sys.exit(0)
