"""Benchmark: the sync mode as a user runs it vs a metric-free roofline of the same maths, and compile cold vs warm.

    python experiments/bench_sync.py                          # both shapes, 3 repeats (several minutes on 2 cores)
    python experiments/bench_sync.py --repeats 1 --default-steps 20480 --peer-steps 65536 --out /tmp/bench_sync  # smoke run
    python experiments/bench_sync.py --shapes peer --repeats 5

Measured side by side in one run of this script, Pendulum-v1, one seed:
  (i)  user: `ppo_async.modes.train(config)` (sync mode, no run_dir, no progress bar); env steps/s =
       num_iterations * batch_size / `result.run_seconds` (compile excluded).
  (ii) roofline: the same pure parts, no metrics and no diagnostics: one jitted, donated step
       per iteration doing `rollout.rollout` (the rollout context of the config), values of
       obs / last obs / final obs with the network (time-limit bootstrap, as the learner does),
       `losses.gae`, then num_epochs x num_minibatches Adam steps
       (`optax.chain(clip_by_global_norm(max_grad_norm), adam(lr, eps=adam_eps))`, the learning
       rate annealed per iteration when the config anneals it) on `losses.ppo_clip_loss` +
       vf_coef * `losses.value_loss` with advantages normalised per minibatch; observation
       normalisation as in the config (statistics merged once per iteration). A python loop
       over the AOT-compiled step, blocking once at the end. Env steps/s over the loop.
  Shapes: "default" = `ppo_async.Config()` (16 envs x 64 steps, 5 epochs x 16 minibatches,
  64x64 nets, 300k env steps); "peer" = the shape of the PureJaxRL comparison in
  ../shared/MEASURED.md (64 envs x 128 steps, 4 epochs x 32 minibatches, 256x256 tanh actor and
  critic, lr 3e-4 constant, gamma 0.99, lambda 0.95, clip 0.2, 1M env steps); every other field
  keeps its `Config` default (reward_scale 0.1, obs normalisation on, vf_coef 0.5, ent_coef 0,
  max_grad_norm 0.5, adam_eps 1e-5). Target (i) / (ii) >= 0.9 per shape.
  Cross-session: (i) at the peer shape against the peer's median of 61.5k env steps/s measured
  in an earlier session (MEASURED.md; not side by side); goal 1.1x.
  (iii) time to the first iteration ("+X.Xs compile" in the summary line) of
  `python -m ppo_async train` with the default config in fresh processes, each pair with its own fresh PPO_ASYNC_COMPILATION_CACHE directory: cold (empty
  cache) then warm (the same directory). Target warm / cold <= 1/3.

Repeats interleave the two sides (alternating which goes first); the tables show medians, the
ratio of the medians (judged against the targets) and the median of the per-repeat ratios.
Writes OUT/<backend>.json, OUT/report.txt and OUT/manifest.json (default OUT: runs/experiments/bench_sync,
git-ignored; publish with --out experiments/results/bench_sync).
"""

from __future__ import annotations

from ppo_async.runtime.xla_flags import apply_cpu_workarounds, enable_compilation_cache

apply_cpu_workarounds()  # entry point: before JAX starts (see ppo_async/xla_flags.py)
enable_compilation_cache()  # compile time is outside every (i)/(ii) figure; (iii) uses its own fresh dirs

import dataclasses
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
import tyro

import ppo_async as pa
from ppo_async import envs
from ppo_async.core import losses, networks
from ppo_async.study.benchmarking import (
    MachineLoad,
    describe_other_cpu,
    fmt_rate,
    interleave,
    verdict,
    write_report,
)
from ppo_async.core.rollout import rollout
from ppo_async.study.manifest import Manifest, default_out
from ppo_async.core.types import PolicySnapshot
from ppo_async.runtime.xla_flags import COMPILATION_CACHE_ENV

from ppo_async.modes.common import make_contexts
from ppo_async.core import normalization

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
ROOFLINE_TARGET = 0.9
PEER_GOAL = 1.1
COMPILE_TARGET = 1.0 / 3.0
PEER_SOURCE = "../shared/MEASURED.md, 'A public peer on the same machine': PureJaxRL ppo_continuous_action, 3 runs 50.0k / 61.5k / 72.4k"
COMPILE_STEPS = 2048  # (iii): two iterations of the default config; the compiled program does not depend on it

# (iii): one fresh `python -m ppo_async train` process; its summary line gives the time to the
# first iteration as "(+X.Xs compile)".
COMPILE_PATTERN = re.compile(r"\(\+([0-9.]+)s compile\)")


@dataclasses.dataclass
class Args:
    repeats: int = 3
    """Measurements per side and shape (and cold/warm pairs in (iii)); the tables report medians."""
    shapes: tuple[Literal["default", "peer"], ...] = ("default", "peer")
    """Which shapes to measure in (i)/(ii)."""
    default_steps: int | None = None
    """Env steps of the default shape (None: Config's 300k)."""
    peer_steps: int | None = None
    """Env steps of the peer shape (None: 1M, as in the peer comparison)."""
    peer_env_steps_per_s: float = 61_500.0
    """The peer's median at the peer shape, from an earlier session (see PEER_SOURCE); used only
    without --peer-dir."""
    peer_dir: str | None = None
    """A checkout of PureJaxRL's `purejaxrl/` folder (ppo_continuous_action.py, wrappers.py; not
    part of this repository, needs `distrax`): measures the peer side by side at the peer shape,
    a third side interleaved with (i) and (ii)."""
    skip_compile: bool = False
    """Skip (iii)."""
    out: str | None = None
    """Output folder (default runs/experiments/bench_sync, git-ignored)."""


def shape_config(name: str, args: Args) -> pa.Config:
    """The config of a shape ("default" or "peer")."""
    if name == "default":
        config = pa.Config()
        steps = args.default_steps
    elif name == "peer":
        config = pa.Config(
            total_env_steps=1_000_000,
            rollout=pa.RolloutConfig(num_envs=64, num_steps=128),
            ppo=pa.PPOConfig(
                num_epochs=4, num_minibatches=32, learning_rate=3e-4, anneal_lr=False,
                gamma=0.99, gae_lambda=0.95, clip_eps=0.2,
            ),
            network=pa.NetworkConfig(actor_hidden=(256, 256), critic_hidden=(256, 256), activation="tanh"),
        )
        steps = args.peer_steps
    else:
        raise ValueError(f"unknown shape {name!r}")
    return config if steps is None else config.replace(total_env_steps=steps)


# ----------------------------------------------------------------------------------------
# (i) the sync mode as a user runs it
# ----------------------------------------------------------------------------------------


def user_run(config: pa.Config) -> dict[str, float]:
    result = pa.train(config)
    steps = config.num_iterations * config.batch_size
    return {
        "env_steps_per_s": steps / result.run_seconds,
        "run_seconds": result.run_seconds,
        "compile_seconds": result.compile_seconds,
        "final_return": float(result.final_returns()[0]),
    }


# ----------------------------------------------------------------------------------------
# (ii) the roofline: the same pure parts in one jitted step, no metrics
# ----------------------------------------------------------------------------------------


class RooflineState(NamedTuple):
    params: Any
    opt_state: Any
    obs_stats: Any
    env_state: Any
    key: jax.Array
    version: jax.Array  # [] int32, the snapshot's version (iterations done)
    return_sum: jax.Array  # finished-episode returns / counts over the last 10% of iterations (sanity check)
    episode_count: jax.Array


class Minibatch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    behavior_log_prob: jax.Array
    old_value: jax.Array
    advantage: jax.Array
    target: jax.Array


@dataclasses.dataclass
class Roofline:
    config: pa.Config
    init: Callable[[], RooflineState]
    compiled: Any  # the AOT-compiled, donated step


def make_roofline(config: pa.Config) -> Roofline:
    """Builds and compiles the metric-free iteration of `config` (sync maths, see the module docstring)."""
    env, rollout_ctx, _ = make_contexts(config)
    network = rollout_ctx.network
    ppo, rc = config.ppo, config.rollout
    sgd_per_iteration = ppo.num_epochs * ppo.num_minibatches
    num_iterations = config.num_iterations
    if ppo.anneal_lr:  # linear to 0 over the run, constant within an iteration (as the learner)
        lr: Any = lambda count: ppo.learning_rate * (  # noqa: E731
            1.0 - jnp.minimum(count // sgd_per_iteration, num_iterations).astype(jnp.float32) / num_iterations
        )
    else:
        lr = ppo.learning_rate
    tx = optax.chain(optax.clip_by_global_norm(ppo.max_grad_norm), optax.adam(lr, eps=ppo.adam_eps))
    sanity_from = int(num_iterations - max(1, int(num_iterations * 0.1)))

    def init() -> RooflineState:
        # The key split of the sync mode (seed key -> params / env / run), so both start alike.
        param_key, env_key, run_key = jax.random.split(jax.random.PRNGKey(config.seed), 3)
        params = network.init(param_key)
        env_state = envs.reset_envs(env, jax.random.fold_in(env_key, 0), rc.num_envs)
        zero = jnp.zeros((), jnp.float32)
        return RooflineState(
            params, tx.init(params), normalization.init_obs_stats(env.obs_shape), env_state, run_key,
            jnp.zeros((), jnp.int32), zero, zero,
        )

    def loss_fn(params: Any, mb: Minibatch) -> jax.Array:
        dist, values = network.apply(params, mb.obs)
        log_prob = networks.log_prob(dist, mb.action)
        advantages = losses.normalize_advantages(mb.advantage) if ppo.normalize_advantages else mb.advantage
        if ppo.dual_clip is None:
            policy_loss = losses.ppo_clip_loss(log_prob, mb.behavior_log_prob, advantages, ppo.clip_eps)
        else:
            policy_loss = losses.dual_clip_ppo_loss(log_prob, mb.behavior_log_prob, advantages, ppo.clip_eps, ppo.dual_clip)
        value_loss = losses.value_loss(values, mb.target, mb.old_value, ppo.value_clip_eps)
        loss = policy_loss + ppo.vf_coef * value_loss
        if ppo.ent_coef:
            loss = loss - ppo.ent_coef * jnp.mean(networks.entropy(dist))
        return loss

    def sgd_step(carry: tuple[Any, Any], mb: Minibatch) -> tuple[tuple[Any, Any], None]:
        params, opt_state = carry
        grads = jax.grad(loss_fn)(params, mb)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), None

    def iteration(state: RooflineState) -> RooflineState:
        key, rollout_key, update_key = jax.random.split(state.key, 3)
        snapshot = PolicySnapshot(state.params, state.obs_stats, state.version, normalization.init_reward_stats())  # the roofline never normalises rewards
        env_state, trajectory = rollout(rollout_ctx, snapshot, state.env_state, rollout_key)
        tr = trajectory.transitions
        _, values = network.apply(state.params, tr.obs)
        _, last_value = network.apply(state.params, trajectory.last_obs)
        _, final_values = network.apply(state.params, tr.final_obs)
        truncated = tr.truncated.astype(jnp.float32)
        rewards = tr.reward * rc.reward_scale + ppo.gamma * truncated * final_values
        dones = jnp.logical_or(tr.terminated, tr.truncated).astype(jnp.float32)
        advantages, targets = losses.gae(rewards, values, dones, last_value, ppo.gamma, ppo.gae_lambda)
        flat = lambda x: x.reshape((-1,) + x.shape[2:])  # noqa: E731
        batch = jax.lax.stop_gradient(
            Minibatch(flat(tr.obs), flat(tr.action), flat(tr.behavior_log_prob), flat(values), flat(advantages), flat(targets))
        )
        batch_size = batch.advantage.shape[0]

        def epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, batch_size)
            shuffled = jax.tree.map(lambda x: x[perm].reshape((ppo.num_minibatches, -1) + x.shape[1:]), batch)
            return jax.lax.scan(sgd_step, carry, shuffled)

        (params, opt_state), _ = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(update_key, ppo.num_epochs)
        )
        obs_stats = normalization.merge_moments(state.obs_stats, trajectory.stats.obs_moments) if rc.normalize_obs else state.obs_stats
        late = (state.version >= sanity_from).astype(jnp.float32)
        return RooflineState(
            params, opt_state, obs_stats, env_state, key, state.version + 1,
            state.return_sum + late * trajectory.stats.episode_return_sum,
            state.episode_count + late * trajectory.stats.episode_count,
        )

    step = jax.jit(iteration, donate_argnums=(0,))
    init_jit = jax.jit(init)
    compiled = step.lower(init_jit()).compile()
    return Roofline(config=config, init=init_jit, compiled=compiled)


def roofline_run(roofline: Roofline) -> dict[str, float]:
    """Env steps/s of num_iterations calls of the compiled step (blocking once, at the end)."""
    config = roofline.config
    state = jax.block_until_ready(roofline.init())
    t0 = time.perf_counter()
    for _ in range(config.num_iterations):
        state = roofline.compiled(state)
    jax.block_until_ready(state)
    seconds = time.perf_counter() - t0
    count = float(state.episode_count)
    return {
        "env_steps_per_s": config.num_iterations * config.batch_size / seconds,
        "run_seconds": seconds,
        "final_return": float(state.return_sum) / count if count > 0 else float("nan"),
    }


# ----------------------------------------------------------------------------------------
# (iv) the public peer, side by side (only with --peer-dir)
# ----------------------------------------------------------------------------------------


class GymnaxForPeer:
    """A gymnax env in the shape PureJaxRL's continuous PPO expects of `BraxGymnaxWrapper(name)`:
    `reset(key, params)` / `step(key, state, action, params)` with params ignored (the env's
    defaults), and gymnax 1.0's (terminated, truncated) pair folded into one `done`."""

    def __init__(self, name: str) -> None:
        import gymnax

        self.env, self.params = gymnax.make(name)

    def reset(self, key: jax.Array, params: Any = None) -> Any:
        return self.env.reset(key, self.params)

    def step(self, key: jax.Array, state: Any, action: jax.Array, params: Any = None) -> Any:
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action, self.params)
        return obs, state, reward, jnp.logical_or(terminated, truncated), info

    def observation_space(self, params: Any = None) -> Any:
        return self.env.observation_space(self.params)

    def action_space(self, params: Any = None) -> Any:
        return self.env.action_space(self.params)


@dataclasses.dataclass
class Peer:
    env_steps: int
    compiled: Any  # the AOT-compiled train(rng) of the peer
    compile_seconds: float


def make_peer(peer_dir: str, config: pa.Config) -> Peer:
    """PureJaxRL's `ppo_continuous_action.make_train` at the shape of `config` (the peer shape),
    on gymnax Pendulum-v1 through `GymnaxForPeer`, jitted and compiled ahead of time. Its own
    defaults elsewhere: observation and reward normalisation on, max_grad_norm 0.5, vf_coef 0.5."""
    sys.path.insert(0, os.path.abspath(peer_dir))
    try:
        import ppo_continuous_action as peer_module
    except ImportError as exc:
        raise SystemExit(f"--peer-dir {peer_dir!r}: cannot import PureJaxRL's ppo_continuous_action ({exc}); "
                         "it needs distrax (pip install distrax)") from exc
    peer_module.BraxGymnaxWrapper = GymnaxForPeer  # the env is the only change; its code runs as published
    ppo, rc = config.ppo, config.rollout
    peer_config = {
        "LR": ppo.learning_rate, "NUM_ENVS": rc.num_envs, "NUM_STEPS": rc.num_steps,
        "TOTAL_TIMESTEPS": config.total_env_steps, "UPDATE_EPOCHS": ppo.num_epochs,
        "NUM_MINIBATCHES": ppo.num_minibatches, "GAMMA": ppo.gamma, "GAE_LAMBDA": ppo.gae_lambda,
        "CLIP_EPS": ppo.clip_eps, "ENT_COEF": ppo.ent_coef, "VF_COEF": ppo.vf_coef,
        "MAX_GRAD_NORM": ppo.max_grad_norm, "ACTIVATION": config.network.activation, "ENV_NAME": config.env,
        "ANNEAL_LR": ppo.anneal_lr, "NORMALIZE_ENV": True, "DEBUG": False,
    }
    if config.network.actor_hidden != (256, 256) or config.network.critic_hidden != (256, 256):
        raise SystemExit("the peer's networks are 256x256: --peer-dir applies to the peer shape only")
    train = jax.jit(peer_module.make_train(peer_config))
    t0 = time.perf_counter()
    compiled = train.lower(jax.random.PRNGKey(config.seed)).compile()
    num_updates = int(config.total_env_steps) // rc.num_steps // rc.num_envs
    return Peer(env_steps=num_updates * rc.num_steps * rc.num_envs, compiled=compiled,
                compile_seconds=time.perf_counter() - t0)


def peer_run(peer: Peer, seed: int = 0) -> dict[str, float]:
    """Env steps/s of one call of the peer's compiled train; its final return as ours is
    defined: the finished episodes of the last 10% of updates."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(peer.compiled(jax.random.PRNGKey(seed)))
    seconds = time.perf_counter() - t0
    metric = out["metrics"]
    returned, returns = metric["returned_episode"], metric["returned_episode_returns"]  # [updates, T, N]
    late = slice(returned.shape[0] - max(1, returned.shape[0] // 10), None)
    count = float(returned[late].sum())
    return {
        "env_steps_per_s": peer.env_steps / seconds,
        "run_seconds": seconds,
        "final_return": float((returns[late] * returned[late]).sum()) / count if count > 0 else float("nan"),
    }


# ----------------------------------------------------------------------------------------
# (iii) time to the first iteration, cold vs warm cache, fresh processes
# ----------------------------------------------------------------------------------------


def first_iteration_process(cache_dir: str, run_dir: str) -> dict[str, float]:
    """Time to the first iteration (and whole wall time) of one `python -m ppo_async train` process."""
    env = dict(os.environ)
    env[COMPILATION_CACHE_ENV] = cache_dir
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "ppo_async", "train", "--total-env-steps", str(COMPILE_STEPS), "--run-dir", run_dir],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    wall = time.perf_counter() - t0
    found = COMPILE_PATTERN.search(proc.stdout)
    if proc.returncode != 0 or found is None:
        raise RuntimeError(f"compile probe failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return {"compile_seconds": float(found.group(1)), "process_seconds": wall}


def measure_compile(pairs: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for pair in range(pairs):
        with tempfile.TemporaryDirectory(prefix="bench_sync_cache_") as cache_dir, \
                tempfile.TemporaryDirectory(prefix="bench_sync_runs_") as runs_dir:
            cold = first_iteration_process(cache_dir, os.path.join(runs_dir, "cold"))
            entries = len(os.listdir(cache_dir))
            warm = first_iteration_process(cache_dir, os.path.join(runs_dir, "warm"))
        runs.append({"cold": cold, "warm": warm, "cache_entries": entries})
        print(f"(iii) pair {pair + 1}: cold {cold['compile_seconds']:.2f}s, warm {warm['compile_seconds']:.2f}s", flush=True)
    med = lambda side, key: statistics.median(r[side][key] for r in runs)  # noqa: E731
    result = {side: {key: med(side, key) for key in ("compile_seconds", "process_seconds")} for side in ("cold", "warm")}
    return {
        "runs": runs,
        **result,
        "ratio": result["warm"]["compile_seconds"] / result["cold"]["compile_seconds"],
        "paired_ratio": statistics.median(r["warm"]["compile_seconds"] / r["cold"]["compile_seconds"] for r in runs),
        "env_steps": COMPILE_STEPS,
    }


# ----------------------------------------------------------------------------------------
# Repeats, report, files
# ----------------------------------------------------------------------------------------


def measure_shape(name: str, config: pa.Config, repeats: int, peer_dir: str | None = None) -> dict[str, Any]:
    roofline = make_roofline(config)
    sides = [("user", lambda: user_run(config)), ("roofline", lambda: roofline_run(roofline))]
    if peer_dir is not None:
        peer = make_peer(peer_dir, config)
        sides.append(("peer", lambda: peer_run(peer, config.seed)))
    samples: dict[str, list[dict[str, float]]] = interleave(
        repeats, sides,
        on_sample=lambda side, sample: print(f"({name}) {side}: {sample['env_steps_per_s']:,.0f} env steps/s", flush=True),
    )
    med = {side: statistics.median(s["env_steps_per_s"] for s in runs) for side, runs in samples.items()}
    paired = statistics.median(u["env_steps_per_s"] / r["env_steps_per_s"] for u, r in zip(samples["user"], samples["roofline"]))
    side_by_side_peer = {}
    if peer_dir is not None:
        side_by_side_peer = {"peer": {
            "peer_env_steps_per_s": med["peer"],
            "source": f"PureJaxRL ppo_continuous_action from {os.path.abspath(peer_dir)}, side by side in this run",
            "user": med["user"],
            "ratio": med["user"] / med["peer"],
            "paired_ratio": statistics.median(u["env_steps_per_s"] / p["env_steps_per_s"] for u, p in zip(samples["user"], samples["peer"])),
            "peer_final_return": statistics.median(s["final_return"] for s in samples["peer"]),
            "peer_compile_seconds": peer.compile_seconds,
            "side_by_side": True,
        }}
    return {
        **side_by_side_peer,
        "config": pa.config_to_dict(config),
        "env_steps": config.num_iterations * config.batch_size,
        "samples": samples,
        "user": med["user"],
        "roofline": med["roofline"],
        "ratio": med["user"] / med["roofline"],
        "paired_ratio": paired,
        "user_compile_seconds": statistics.median(s["compile_seconds"] for s in samples["user"]),
        "user_final_return": statistics.median(s["final_return"] for s in samples["user"]),
        "roofline_final_return": statistics.median(s["final_return"] for s in samples["roofline"]),
    }


def shape_label(config: dict) -> tuple[str, str, str]:
    r, p, n = config["rollout"], config["ppo"], config["network"]
    nets = "x".join(map(str, n["actor_hidden"])) + ("" if n["actor_hidden"] == n["critic_hidden"] else "/" + "x".join(map(str, n["critic_hidden"])))
    return f"{r['num_envs']}x{r['num_steps']}", f"{p['num_epochs']}x{p['num_minibatches']}", nets


def report(results: dict) -> str:
    m = results["machine"]
    other = describe_other_cpu(m.get("other_cpu_cores"))
    lines = [
        f"bench_sync: Pendulum-v1, backend={results['backend']} ({results['device']}), {m['cpu_count']} CPU cores, "
        f"medians of {results['args']['repeats']}",
        f"load average before the run {m['loadavg_before']}; other processes used {other} during the run",
    ]
    if results["shapes"]:
        lines += [
            "",
            "env steps/s: (i) user = ppo_async.modes.train(config), sync mode, run_seconds (compile excluded);",
            "             (ii) roofline = the same rollout / GAE / PPO clip + value loss / Adam in one jitted donated step, no metrics",
            f"{'shape':<9}{'envs':>8}{'ep x mb':>9}{'nets':>9}{'env steps':>11}{'user':>9}{'roofline':>10}{'ratio':>8}"
            f"{'paired':>8}   target >= {ROOFLINE_TARGET}",
        ]
        for name, row in results["shapes"].items():
            envs_, epmb, nets = shape_label(row["config"])
            lines.append(
                f"{name:<9}{envs_:>8}{epmb:>9}{nets:>9}{row['env_steps']:>11,}{fmt_rate(row['user']):>9}"
                f"{fmt_rate(row['roofline']):>10}{row['ratio']:>7.3f}x{row['paired_ratio']:>7.3f}x   "
                f"{verdict(row['ratio'], ROOFLINE_TARGET)}"
            )
        lines.append("ratio: median user / median roofline (the target applies to it); paired: median of the per-repeat ratios")
        lines.append(
            "sanity (same algorithm): final return, mean over the last 10% of iterations, median over repeats: "
            + "; ".join(
                f"{name} user {row['user_final_return']:.1f}, roofline {row['roofline_final_return']:.1f}"
                for name, row in results["shapes"].items()
            )
        )
        lines.append(
            "  (user compile, median: "
            + ", ".join(f"{name} {row['user_compile_seconds']:.1f}s" for name, row in results["shapes"].items())
            + "; this process has the persistent cache on, so these may be warm)"
        )
    peer = results.get("peer")
    if peer and peer.get("side_by_side"):
        lines += [
            "",
            "(iv) the public peer SIDE BY SIDE at the peer shape (interleaved with (i) and (ii) in this run):",
            f"  peer: {fmt_rate(peer['peer_env_steps_per_s'])} env steps/s ({peer['source']}; compile {peer['peer_compile_seconds']:.1f}s, "
            f"final return {peer['peer_final_return']:.1f})",
            f"  (i) user: {fmt_rate(peer['user'])} -> user / peer = {peer['ratio']:.3f}x (paired {peer['paired_ratio']:.3f}x)   "
            f"goal >= {PEER_GOAL}x: {verdict(peer['ratio'], PEER_GOAL)}",
        ]
    elif peer:
        lines += [
            "",
            "CROSS-SESSION comparison (not side by side, different sessions and machine load):",
            f"  peer: {fmt_rate(peer['peer_env_steps_per_s'])} env steps/s at the peer shape ({PEER_SOURCE})",
            f"  (i) user at the peer shape, this run: {fmt_rate(peer['user'])} -> user / peer = {peer['ratio']:.3f}x   "
            f"goal >= {PEER_GOAL}x: {verdict(peer['ratio'], PEER_GOAL)}",
        ]
    c = results.get("compile")
    if c:
        lines += [
            "",
            f"(iii) time to the first iteration ('+X.Xs compile' of python -m ppo_async train) of the default config, fresh processes, "
            f"a fresh {COMPILATION_CACHE_ENV} dir per pair",
            f"{'pair':<6}{'cold s':>8}{'warm s':>8}{'warm/cold':>11}{'process cold s':>16}{'warm s':>8}{'entries':>9}",
        ]
        for i, r in enumerate(c["runs"]):
            lines.append(
                f"{i + 1:<6}{r['cold']['compile_seconds']:>8.2f}{r['warm']['compile_seconds']:>8.2f}"
                f"{r['warm']['compile_seconds'] / r['cold']['compile_seconds']:>10.3f}x"
                f"{r['cold']['process_seconds']:>16.2f}{r['warm']['process_seconds']:>8.2f}{r['cache_entries']:>9}"
            )
        lines += [
            f"{'median':<6}{c['cold']['compile_seconds']:>8.2f}{c['warm']['compile_seconds']:>8.2f}{c['ratio']:>10.3f}x"
            f"{c['cold']['process_seconds']:>16.2f}{c['warm']['process_seconds']:>8.2f}",
            f"warm / cold (medians) {c['ratio']:.3f}x, paired {c['paired_ratio']:.3f}x; target <= {COMPILE_TARGET:.3f}: "
            f"{verdict(c['ratio'], COMPILE_TARGET, at_most=True)}",
            "  process s: the whole subprocess (interpreter start-up, imports, compile, a 2-iteration run).",
        ]
    return "\n".join(lines)


def main(args: Args) -> dict:
    if args.repeats < 1:
        raise SystemExit(f"--repeats = {args.repeats} is invalid: must be >= 1")
    out = args.out or default_out("bench_sync", REPO)
    with Manifest(out):
        return measure(args, out)


def measure(args: Args, out: str) -> dict:
    """(i)/(ii) per shape, the peer, (iii); writes the report files into `out` and returns the results."""
    load = MachineLoad(include_children=True)  # (iii)'s subprocesses count as this benchmark's own CPU time
    machine = load.start()
    results: dict[str, Any] = {
        "env": "Pendulum-v1",
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "args": dataclasses.asdict(args),
        "machine": machine,
        "shapes": {},
    }
    for name in dict.fromkeys(args.shapes):
        results["shapes"][name] = measure_shape(name, shape_config(name, args), args.repeats,
                                                args.peer_dir if name == "peer" else None)
        print(f"({name}) user / roofline = {results['shapes'][name]['ratio']:.3f}x", flush=True)
    if "peer" in results["shapes"] and args.peer_dir is not None:
        results["peer"] = results["shapes"]["peer"].pop("peer")
    elif "peer" in results["shapes"]:
        user = results["shapes"]["peer"]["user"]
        results["peer"] = {
            "peer_env_steps_per_s": args.peer_env_steps_per_s,
            "source": PEER_SOURCE,
            "user": user,
            "ratio": user / args.peer_env_steps_per_s,
            "side_by_side": False,
        }
    if not args.skip_compile:
        results["compile"] = measure_compile(args.repeats)
    results["machine"].update(load.stop())
    text = report(results)
    print(text)
    write_report(out, f"{results['backend']}.json", results, "report.txt", text)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
