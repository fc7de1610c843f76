"""Our PPO beside Brax's own trainer (`brax.training.agents.ppo.train`) on the JAX physics envs,
at the same env-step budget and the same hyperparameters (issue 26 item 3).

    python experiments/brax_side_by_side.py                       # 3 brax + 3 playground envs x 5 seeds, 1M steps
    python experiments/brax_side_by_side.py --envs brax/inverted_pendulum --seeds 2 --total-env-steps 100000

Each run is its own process (a fresh JAX, one compile), and the two sides alternate run by run
(env x seed x side, side order flipped every other seed), so a drift in the machine's load
falls on both. Ours: `sync` mode with the env's preset (`pa.config_for_env`, what `train --env`
uses). Brax's: its PPO trainer on the same simulator (Brax's env with our backend; Playground's
env with `impl='jax'` and Playground's own Brax wrapper) with our preset translated field by
field (`brax_kwargs`); both configs are printed and recorded in OUT/configs.json. What Brax's
trainer has no field for is listed there too (`UNMATCHED`): Brax anneals no learning rate,
clips no value loss and, through `wrap_env`, runs its own episode wrapper.

Both sides report the deterministic return of the final policy over `--eval-episodes` episodes
(Brax's `deterministic_eval`, our `eval_every_steps` after the last iteration). Rows go to
OUT/results.csv as each run ends; a stopped script run again with the same arguments skips the
finished runs. OUT/summary.txt: per env, each side's mean, 95% bootstrap CI and worst seed, and
ours - Brax's mean (with the ratio where both are positive). OUT defaults to
runs/experiments/brax_side_by_side (git-ignored): publish with --out
experiments/results/brax_side_by_side.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SIDES = ("ppo_async", "brax")
COLUMNS = ("env", "side", "seed", "env_steps", "eval_return", "wall_s")
RESULT_PREFIX = "SIDE_BY_SIDE_RESULT "
UNMATCHED = {
    "ppo.anneal_lr": "Brax's PPO has no linear learning-rate annealing (learning_rate_schedule: NONE or ADAPTIVE_KL)",
    "ppo.value_clip_eps": "Brax's PPO has clipping_epsilon_value; set only when ours clips the value loss",
    "ppo.adam_eps": "Brax uses optax.adam's default eps (1e-8)",
    "rollout.obs_clip": "Brax's running normalisation clips nothing",
    "rollout.clip_actions": "Brax's envs clip actions themselves where the model requires it",
    "truncation": "ours bootstraps V(final observation) at a time limit; Brax's trainer does (bootstrap_on_timeout) "
                  "only where the env reports info['time_out'] (brax/inverted_pendulum), elsewhere it zeroes the "
                  "advantage of the truncated step and cuts GAE's trace there",
    "network.init": "Brax's MLPs start from LeCun-uniform kernels (its make_ppo_networks default); ours from "
                    "orthogonal ones with the PPO gains (network.init = orthogonal)",
}


@dataclasses.dataclass
class Args:
    envs: tuple[str, ...] = ("brax/inverted_pendulum", "brax/inverted_double_pendulum", "brax/reacher",
                             "playground/CartpoleBalance", "playground/CartpoleSwingup", "playground/CheetahRun")
    """brax/* and playground/* envs."""
    seeds: int = 5
    """Seeds per env and side (0 .. seeds - 1)."""
    total_env_steps: int = 1_000_000
    """Env steps per run (rounded down to whole learner batches, the same on both sides)."""
    eval_episodes: int = 10
    """Episodes of the final deterministic evaluation."""
    out: str | None = None
    """Output folder; default runs/experiments/brax_side_by_side."""
    one: str | None = None
    """Internal: run one SIDE:ENV:SEED in this process and print its result line."""


def ours_config(env: str, seed: int, total_env_steps: int, eval_episodes: int):
    """Our run: the env's preset in sync mode, evaluated once after its last iteration."""
    import ppo_async as pa

    config = pa.config_for_env(env, {"mode": "sync", "seed": seed, "total_env_steps": total_env_steps})
    return config.replace(eval_every_steps=config.num_iterations * config.batch_size, eval_episodes=eval_episodes)


def brax_kwargs(config, episode_length: int, bootstrap_on_timeout: bool) -> dict[str, Any]:
    """Brax `ppo.train` keyword arguments for our `config` (the network factory aside).

    Brax's learner batch is batch_size * num_minibatches unrolls of unroll_length steps from
    num_envs envs; ours is num_envs x num_steps in num_minibatches minibatches, so batch_size =
    num_envs / num_minibatches gives the same 2,048 env steps per update and the same number of
    steps per minibatch (Brax shuffles whole unrolls, we shuffle steps). `bootstrap_on_timeout`:
    `env_sets_time_out` (Brax's trainer can bootstrap a time limit only where the env reports it)."""
    r, p = config.rollout, config.ppo
    if r.num_envs % p.num_minibatches:
        raise SystemExit(f"error: rollout.num_envs = {r.num_envs} is invalid: Brax's batch needs it to be a multiple of "
                         f"ppo.num_minibatches = {p.num_minibatches}")
    return dict(
        num_timesteps=config.num_iterations * config.batch_size, num_envs=r.num_envs, unroll_length=r.num_steps,
        batch_size=r.num_envs // p.num_minibatches, num_minibatches=p.num_minibatches, num_updates_per_batch=p.num_epochs,
        learning_rate=p.learning_rate, discounting=p.gamma, gae_lambda=p.gae_lambda, clipping_epsilon=p.clip_eps,
        clipping_epsilon_value=p.value_clip_eps, entropy_cost=p.ent_coef, vf_loss_coefficient=p.vf_coef,
        max_grad_norm=p.max_grad_norm, normalize_advantage=p.normalize_advantages,
        normalize_observations=r.normalize_obs, reward_scaling=r.reward_scale, episode_length=episode_length,
        action_repeat=1, bootstrap_on_timeout=bootstrap_on_timeout, deterministic_eval=True, num_eval_envs=config.eval_episodes,
        num_evals=2, seed=config.seed, max_devices_per_host=1,
    )


def network_kwargs(config) -> dict[str, Any]:
    """Brax `make_ppo_networks` arguments for our network: the same widths and activation, a
    Gaussian (not tanh-squashed) policy with a state-independent log-std at our initial value."""
    n = config.network
    return dict(policy_hidden_layer_sizes=tuple(n.actor_hidden), value_hidden_layer_sizes=tuple(n.critic_hidden),
                activation=n.activation, distribution_type="normal", noise_std_type="log",
                init_noise_std=float(math.exp(n.init_log_std)), state_dependent_std=n.state_dependent_std)


def check_translatable(config) -> None:
    """Our fields the translation cannot carry are refused, not silently dropped."""
    n, r, p = config.network, config.rollout, config.ppo
    problems = [name for name, bad in (("network.shared_torso", n.shared_torso), ("network.bounded_mean", n.bounded_mean),
                                       ("rollout.normalize_reward", r.normalize_reward), ("ppo.dual_clip", p.dual_clip is not None),
                                       ("ppo.objective", p.objective != "ppo"), ("ppo.advantage_estimator", p.advantage_estimator != "gae"))
                if bad]
    if problems:
        raise SystemExit(f"error: {', '.join(problems)}: no counterpart in Brax's PPO trainer; use a preset without them")


def episode_length_of(env: str) -> int:
    """The time limit our env runs with (the same one goes to Brax's wrapper)."""
    from ppo_async.envs.base import make_env

    return int(make_env(env).params.max_steps_in_episode)


def brax_env(env: str, config):
    """Brax's own env object for `env` and the wrapper its trainer needs (None: Brax's default)."""
    family, _, task = env.partition("/")
    if family == "brax":
        from brax import envs as brax_envs

        from ppo_async.envs.physics import BRAX_DEFAULT_BACKEND

        backend = config.env_options.backend or BRAX_DEFAULT_BACKEND.get(task, "generalized")
        return brax_envs.get_environment(task, backend=backend), None
    from mujoco_playground import registry, wrapper

    return registry.load(task, config_overrides={"impl": config.env_options.backend or "jax"}), wrapper.wrap_for_brax_training


def env_sets_time_out(environment) -> bool:
    """Whether Brax's env reports `info["time_out"]`, which Brax's `bootstrap_on_timeout` reads
    (adding gamma * V(s) to the reward of a timed-out step, as our truncation bootstrap does).
    brax/inverted_pendulum does; the other envs do not, and Brax's trainer then handles the time
    limit its own way: its EpisodeWrapper marks the step `truncation` and its GAE zeroes that
    step's advantage and cuts the trace there (`brax.training.agents.ppo.losses.compute_gae`)."""
    import jax

    return "time_out" in environment.reset(jax.random.PRNGKey(0)).info


def run_ours(env: str, seed: int, total_env_steps: int, eval_episodes: int) -> dict[str, Any]:
    """Trains our side; its final deterministic eval return, env steps and wall seconds."""
    import ppo_async as pa

    config = ours_config(env, seed, total_env_steps, eval_episodes)
    start = time.perf_counter()
    result = pa.train(config, progress=False)
    frame = result.to_dataframe()
    evals = frame["eval_return"].dropna()
    return {"env_steps": int(frame["env_steps"].max()), "eval_return": float(evals.iloc[-1]),
            "wall_s": round(time.perf_counter() - start, 2)}


def restore_device_put_replicated() -> None:
    """Brax 0.14.2's trainer calls `jax.device_put_replicated`, which JAX 0.10 removed: put back
    its meaning (x with a leading axis of len(devices), slice i on devices[i]) with `jax.device_put`
    and a sharding, for the peer's code only (this process runs nothing else)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    def device_put_replicated(x, devices):
        sharding = NamedSharding(Mesh(np.array(devices), ("replica",)), PartitionSpec("replica"))
        return jax.tree.map(lambda a: jax.device_put(np.stack([np.asarray(a)] * len(devices)), sharding), x)

    if "device_put_replicated" not in vars(jax):
        jax.device_put_replicated = device_put_replicated


def run_brax(env: str, seed: int, total_env_steps: int, eval_episodes: int) -> dict[str, Any]:
    """Trains Brax's side with our preset translated; its final deterministic eval return."""
    import functools

    import jax
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo_train

    restore_device_put_replicated()
    config = ours_config(env, seed, total_env_steps, eval_episodes)
    check_translatable(config)
    environment, wrap = brax_env(env, config)
    kwargs = brax_kwargs(config, episode_length_of(env), env_sets_time_out(environment))
    nets = network_kwargs(config)
    nets["activation"] = getattr(jax.nn, nets["activation"])
    evals: list[tuple[int, float]] = []
    start = time.perf_counter()
    ppo_train.train(environment=environment, wrap_env_fn=wrap,
                    network_factory=functools.partial(ppo_networks.make_ppo_networks, **nets),
                    progress_fn=lambda step, m: evals.append((int(step), float(m["eval/episode_reward"]))),
                    **kwargs)
    return {"env_steps": evals[-1][0], "eval_return": evals[-1][1], "wall_s": round(time.perf_counter() - start, 2)}


def run_one(spec: str, args: Args) -> None:
    """The child process: one side x env x seed, its result as one JSON line on stdout."""
    side, env, seed = spec.split(":")
    run = run_ours if side == "ppo_async" else run_brax
    row = run(env, int(seed), args.total_env_steps, args.eval_episodes)
    print(RESULT_PREFIX + json.dumps({"env": env, "side": side, "seed": int(seed), **row}), flush=True)


def plan(args: Args) -> list[tuple[str, str, int]]:
    """(env, side, seed) in the order they run: env by env, seed by seed, sides alternating
    which goes first so that neither always runs on a warmer (or busier) machine."""
    order = []
    for env in args.envs:
        for seed in range(args.seeds):
            sides = SIDES if seed % 2 == 0 else SIDES[::-1]
            order += [(env, side, seed) for side in sides]
    return order


def read_rows(path: str) -> list[dict[str, str]]:
    if not os.path.isfile(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def append_row(path: str, row: dict[str, Any]) -> None:
    new = not os.path.isfile(path)
    with open(path, "a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow(row)


def describe_configs(args: Args) -> dict[str, Any]:
    """Both sides' configs per env (seed 0), as printed and recorded in configs.json."""
    import ppo_async as pa

    configs = {}
    for env in args.envs:
        config = ours_config(env, 0, args.total_env_steps, args.eval_episodes)
        time_out = env_sets_time_out(brax_env(env, config)[0])
        configs[env] = {"ppo_async": pa.config_to_dict(config),
                        "brax": {**brax_kwargs(config, episode_length_of(env), time_out), "network": network_kwargs(config)},
                        "unmatched": UNMATCHED}
    return configs


def summary_lines(rows: list[dict[str, str]], envs: tuple[str, ...]) -> list[str]:
    """Per env: each side's mean eval return, 95% CI, worst seed and seed count; ours - Brax's mean
    (higher is better on every env here) and, where both means are positive, their ratio. The CI:
    `ppo_async.report.stats.bootstrap_mean_ci` (percentile bootstrap over seeds; NaN for one seed)."""
    from ppo_async.report.stats import bootstrap_mean_ci

    lines = [f"{'env':32s} {'side':10s} {'seeds':>5s} {'mean':>9s} {'95% CI':>21s} {'worst':>9s} {'wall_s':>8s}"]
    for env in envs:
        means = {}
        for side in SIDES:
            got = [r for r in rows if r["env"] == env and r["side"] == side]
            if not got:
                continue
            values = [float(r["eval_return"]) for r in got]
            low, high = bootstrap_mean_ci(values)
            means[side] = sum(values) / len(values)
            wall = sorted(float(r["wall_s"]) for r in got)[len(got) // 2]
            lines.append(f"{env:32s} {side:10s} {len(got):5d} {means[side]:9.1f} [{low:9.1f}, {high:9.1f}] "
                         f"{min(values):9.1f} {wall:8.1f}")
        if len(means) == 2:
            ours, brax = means["ppo_async"], means["brax"]
            ratio = f", ours / Brax's: {ours / brax:.2f}x" if ours > 0 and brax > 0 else " (a ratio of returns below 0 means nothing)"
            lines.append(f"{env:32s} ours - Brax's mean: {ours - brax:+.1f}{ratio}")
    return lines


def main(args: Args) -> None:
    from ppo_async.study.manifest import Manifest, default_out, write_json

    out = args.out or default_out("brax_side_by_side", REPO)
    os.makedirs(out, exist_ok=True)
    with Manifest(out):
        configs = describe_configs(args)
        print(json.dumps(configs, indent=1))
        write_json(os.path.join(out, "configs.json"), configs)
        path = os.path.join(out, "results.csv")
        done = {(r["env"], r["side"], int(r["seed"])) for r in read_rows(path)}
        for env, side, seed in plan(args):
            if (env, side, seed) in done:
                continue
            command = [sys.executable, os.path.abspath(__file__), "--one", f"{side}:{env}:{seed}",
                       "--total-env-steps", str(args.total_env_steps), "--eval-episodes", str(args.eval_episodes)]
            proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
            result = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
            if proc.returncode != 0 or not result:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise SystemExit(f"error: {side} on {env} seed {seed} failed (exit {proc.returncode}): {tail[0]}")
            row = json.loads(result[0][len(RESULT_PREFIX):])
            append_row(path, row)
            print(f"{env} {side} seed {seed}: eval {row['eval_return']:.1f} after {row['env_steps']} steps, "
                  f"{row['wall_s']:.0f} s", flush=True)
        lines = summary_lines(read_rows(path), args.envs)
        with open(os.path.join(out, "summary.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    from ppo_async.runtime.xla_flags import apply_cpu_workarounds

    apply_cpu_workarounds()  # entry point: before JAX starts
    import tyro

    from ppo_async.cli.noise import quiet_library_noise

    quiet_library_noise()  # Brax's maintenance notice and deprecations

    parsed = tyro.cli(Args)
    if parsed.one is not None:
        run_one(parsed.one, parsed)
    else:
        main(parsed)
