"""Why did ppo_async learn below the reference PPOs on MuJoCo? One factor at a time (issue 26 item 2).

    python experiments/ablation.py                                   # every variant, HalfCheetah + Hopper, 3 seeds, 1M
    python experiments/ablation.py --variants old old+reward_norm    # some of them (each resumes where it stopped)
    python experiments/ablation.py --summarise-only --out DIR        # the table again from DIR/*/results.csv
    python experiments/ablation.py --out experiments/results/ablation   # publish

Every variant is a `pa.benchmark` run (suite mujoco; the deterministic policy evaluated every
100k env steps over 10 episodes) of the env's preset with the variant's fields set over it, into
OUT/<variant>/ (results.csv, report.md, manifest.json; resumable: finished runs are not run
again). Three families of variants, the first two in barrier mode (one sampler, so lag plays no
part), the third in async-decoupled mode (the benchmark's `async` before 2026-12-05):

- `old` is the gymnasium preset before issue 26 (4 epochs x 8 minibatches of a 16 x 64 batch,
  rewards scaled by 0.1, no value clipping); `old+<factor>` adds one factor of today's preset
  to it: one factor at a time from the preset the issue measured.
- `preset` is the gymnasium preset as this ablation measured it (`ppo_async.config.presets`,
  the reference implementations' setting, with the initial log-std of 0 it had then:
  `ABLATED_PRESET` sets it under every variant); `preset-<factor>` / `preset+<factor>` removes
  one of its factors or adds one it does not have (bounded mean, wider networks, Flax's default
  LeCun init instead of orthogonal, another log-std init, no annealing, other gamma / lambda).
- `async` is the benchmark's async mode as it was (4 samplers sharing the preset's 16 envs, 4
  chunks per batch, decoupled PPO: lag ~1; `ABLATED_ASYNC_LAYOUT` keeps that layout);
  `async+<factor>` changes one thing of it: PPO's objective instead of decoupled PPO (the clip around the behaviour policy), a barrier
  (`threaded.barrier`: the same samplers and chunks at lag 0), to tell lag from the rest, or
  the barrier family's best factor (initial log-std -0.5) under lag; `async+log_std_-0.5+<factor>`
  changes one thing of today's async mode (the preset with that log-std); `+learner_norm` is
  that config on the code with learner-owned normalisation (issue 39; the factor is the code,
  so its manifest's commit is part of the row) and `+learner_norm+stats_before_sgd` merges the
  learner's statistics before its SGD steps instead of after.

The summary (OUT/summary.txt, OUT/table.csv) gives per variant and env the mean final training
return (stochastic policy, episode-weighted over the last 10% of iterations, as CleanRL reports)
and final deterministic evaluation, the seeds' spread and worst seed, and the ratio to CleanRL's
published figure (`ppo_async/study/references.json`).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pandas as pd
import tyro

import ppo_async as pa
from ppo_async.study.benchmark import load_references
from ppo_async.study.manifest import Manifest, default_out, write_summary

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

OLD = {"ppo.num_epochs": 4, "ppo.num_minibatches": 8, "rollout.num_steps": 64, "rollout.normalize_reward": False,
       "rollout.reward_scale": 0.1, "ppo.value_clip_eps": None}
"""The gymnasium preset before issue 26, as fields over today's (gamma 0.99, lr 3e-4 and 16 envs are in both)."""

VARIANTS: dict[str, dict] = {
    "preset": {},
    "old": OLD,
    "old+reward_norm": {**OLD, "rollout.normalize_reward": True, "rollout.reward_scale": 1.0},
    "old+batch_2048": {**OLD, "rollout.num_steps": 128},
    "old+epochs_10x32": {**OLD, "ppo.num_epochs": 10, "ppo.num_minibatches": 32},
    "old+value_clip": {**OLD, "ppo.value_clip_eps": 0.2},
    "preset-reward_norm": {"rollout.normalize_reward": False, "rollout.reward_scale": 0.1},
    "preset-value_clip": {"ppo.value_clip_eps": None},
    "preset-anneal_lr": {"ppo.anneal_lr": False},
    "preset+bounded_mean": {"network.bounded_mean": True},
    "preset+log_std_-0.5": {"network.init_log_std": -0.5},
    "preset+width_256": {"network.actor_hidden": [256, 256], "network.critic_hidden": [256, 256]},
    "preset+init_lecun": {"network.init": "lecun"},
    "preset+gamma_0.995": {"ppo.gamma": 0.995},
    "preset+lambda_0.9": {"ppo.gae_lambda": 0.9},
    "async": {},
    "async+ppo_objective": {"ppo.objective": "ppo"},
    "async+lag_0": {"threaded.barrier": True},
    "async+log_std_-0.5": {"network.init_log_std": -0.5},
    # One factor from today's async (the preset with log-std -0.5): off-policy corrected advantages
    # (V-trace, rho_bar = c_bar = 1) instead of GAE, half the learning rate (less drift per version),
    # or an entropy bonus.
    "async+log_std_-0.5+vtrace": {"network.init_log_std": -0.5, "ppo.advantage_estimator": "vtrace"},
    "async+log_std_-0.5+lr_1.5e-4": {"network.init_log_std": -0.5, "ppo.learning_rate": 1.5e-4},
    # Under lag the entropy falls per iteration as in barrier while the return rises more slowly
    # (Hopper, iteration 120: entropy ~0.9 in both, return 363-1,065 async vs 1,029-2,627 barrier):
    # does an entropy bonus (Brax's tuned envs use 1e-2) that keeps the std up let async catch up?
    # (Measured: no; the entropy stays up and the early return is as slow.)
    "async+log_std_-0.5+ent_0.01": {"network.init_log_std": -0.5, "ppo.ent_coef": 0.01},
    # Learner-owned normalisation (issue 39): the same config as async+log_std_-0.5, run on the code
    # from f4cd885 on, where trajectories carry raw observations and rewards and the learner
    # normalises each batch with its own statistics (the factor is the code, not a field: its
    # manifest's commit says which). Its runs are the pending benchmark's async Hopper runs.
    "async+log_std_-0.5+learner_norm": {"network.init_log_std": -0.5},
    # ... and its statistics merged before the SGD steps instead of after (Sample Factory's order).
    "async+log_std_-0.5+learner_norm+stats_before_sgd": {"network.init_log_std": -0.5, "rollout.stats_update": "before_sgd"},
}
"""Variant name -> dotted config fields set over the env's preset and its mode (`mode_of`)."""

ABLATED_PRESET = {"network.init_log_std": 0.0, "rollout.stats_update": "after_sgd"}
"""Set under every variant: the gymnasium preset as the ablation measured it. The preset took
log-std -0.5 (`preset+log_std_-0.5`) and statistics merged before SGD
(`async+log_std_-0.5+learner_norm+stats_before_sgd`) from this ablation afterwards; pinning the
old values keeps each variant one factor from the preset it was measured against, and the
committed runs resumable."""


ABLATED_ASYNC_LAYOUT = {"num_samplers": 4, "threaded.chunks_per_batch": 4}
"""Set under every `async...` variant: the benchmark's async layout as the ablation measured it (4
samplers sharing the preset's envs, a batch of one chunk from each). The benchmark's async modes
took one sampler of all the envs afterwards (issue 39: the same lag ~1, faster per env step);
pinning the old layout keeps the async family comparable within itself and its runs resumable."""


def variant_changes(variant: str) -> dict:
    """The dotted config fields `variant` sets over today's preset: `ABLATED_PRESET` (and
    `ABLATED_ASYNC_LAYOUT` for the async family), then its own."""
    layout = ABLATED_ASYNC_LAYOUT if mode_of(variant) == ASYNC_FAMILY_MODE else {}
    return {**ABLATED_PRESET, **layout, **VARIANTS[variant]}


ASYNC_PREFIX = "async"
"""Variants named `async...` run in the benchmark's async-decoupled mode (with
`ABLATED_ASYNC_LAYOUT`: 4 samplers sharing the preset's envs, decoupled PPO; the benchmark's
`async` mode before 2026-12-05, when its labels changed); the others in barrier mode."""
ASYNC_FAMILY_MODE = "async-decoupled"


def mode_of(variant: str) -> str:
    """The benchmark mode of `variant`: "async-decoupled" for the `async...` family, else "barrier"."""
    return ASYNC_FAMILY_MODE if variant.split("+")[0].split("-")[0] == ASYNC_PREFIX else "barrier"


@dataclasses.dataclass
class Args:
    variants: tuple[str, ...] = tuple(VARIANTS)
    """Variants to run, in this order (names of VARIANTS)."""
    envs: tuple[str, ...] = ("gymnasium/HalfCheetah-v5", "gymnasium/Hopper-v5")
    """Envs (of the mujoco suite)."""
    seeds: int = 3
    """Seeds per variant and env."""
    total_env_steps: int = 1_000_000
    """Env steps per run."""
    out: str | None = None
    """Output folder (default runs/experiments/ablation; publish with --out experiments/results/ablation)."""
    summarise_only: bool = False
    """Only write summary.txt and table.csv again from OUT/*/results.csv."""


def final_rows(out: str) -> pd.DataFrame:
    """The final rows of every finished variant's results.csv under `out`, with a `variant`
    column (finished: its benchmark call completed and wrote OUT/<variant>/manifest.json; a
    variant still running is left out, so the table only quotes published result files)."""
    frames = []
    for name in VARIANTS:
        path = os.path.join(out, name, "results.csv")
        if os.path.isfile(path) and os.path.isfile(os.path.join(out, name, "manifest.json")):
            df = pd.read_csv(path)
            frames.append(df[df["final"] == 1].assign(variant=name))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def variant_table(finals: pd.DataFrame, references: dict[str, float]) -> pd.DataFrame:
    """Per variant x env: seeds, mean / std / worst of the final training return, mean final
    evaluation, and the mean training return over the reference (pure)."""
    rows = []
    for (variant, env), group in finals.groupby(["variant", "env"], sort=False):
        train, evals = group["train_return"].to_numpy(float), group["eval_return"].to_numpy(float)
        reference = references.get(env, np.nan)
        rows.append({"variant": variant, "env": env, "seeds": len(group), "train_mean": train.mean(),
                     "train_std": train.std(ddof=1) if len(train) > 1 else np.nan, "train_worst": train.min(),
                     "eval_mean": evals.mean(), "eval_worst": evals.min(), "vs_cleanrl": train.mean() / reference})
    return pd.DataFrame(rows)


def cleanrl_references() -> dict[str, float]:
    """CleanRL's published ppo_continuous_action means at 1M steps, keyed by our env names."""
    out = {}
    for ref in load_references():
        if ref["implementation"].lower().startswith("cleanrl") and ref.get("env_steps") == 1_000_000:
            out.setdefault(ref["env"], float(ref["value"]))
    return out


def summary_lines(table: pd.DataFrame, args: Args) -> list[str]:
    lines = ["ablation (issue 26 item 2): final rows of each run (mode: barrier, or async for async*); train = mean "
             "training return over the",
             "last 10% of iterations (stochastic policy), eval = deterministic policy over 10 episodes; vs_cleanrl =",
             "train_mean / CleanRL's published mean at 1M steps (MuJoCo v4 there, v5 here)", ""]
    if table.empty:
        return lines + ["(no finished runs yet)"]
    fmt = table.copy()
    for column in ("train_mean", "train_std", "train_worst", "eval_mean", "eval_worst"):
        fmt[column] = fmt[column].map(lambda v: "-" if np.isnan(v) else f"{v:,.0f}")
    fmt["vs_cleanrl"] = fmt["vs_cleanrl"].map(lambda v: "-" if np.isnan(v) else f"{v:.2f}x")
    lines.append(fmt.to_string(index=False))
    lines += ["", f"variants (fields over the preset with {ABLATED_PRESET}, the preset they were measured "
              f"against): {', '.join(f'{k} = {v}' for k, v in VARIANTS.items() if k in set(table['variant']))}",
              "command: python experiments/ablation.py --out experiments/results/ablation (every variant; it resumes, "
              "skipping finished runs)", f"(this summary written by: python experiments/ablation.py {' '.join(sys.argv[1:])})",
              f"finished variants: {len(set(table['variant']))} of {len(VARIANTS)}"]
    return lines


def summarise(out: str, args: Args) -> pd.DataFrame:
    table = variant_table(final_rows(out), cleanrl_references())
    table.to_csv(os.path.join(out, "table.csv"), index=False)
    write_summary(out, summary_lines(table, args))
    return table


def main(args: Args) -> None:
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"error: --variants: {unknown[0]!r} is not a variant ({', '.join(VARIANTS)})")
    out = args.out or default_out("ablation", REPO)
    with Manifest(out):
        if not args.summarise_only:
            for name in args.variants:
                print(f"== ablation variant {name} ({mode_of(name)}): {variant_changes(name)} over the preset",
                      flush=True)
                pa.benchmark("mujoco", seeds=args.seeds, out=os.path.join(out, name), envs=args.envs,
                             total_env_steps=args.total_env_steps, modes=[mode_of(name)],
                             changes=variant_changes(name))
                summarise(out, args)
        summarise(out, args)


if __name__ == "__main__":
    main(tyro.cli(Args))
