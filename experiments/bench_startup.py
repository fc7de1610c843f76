"""Benchmark: time to a first result (warm and cold), and the steady state at the peer's shape (issue 40 item 12).

    python experiments/bench_startup.py                                # 3 repeats; needs an idle machine
    python experiments/bench_startup.py --peer-dir ~/src/purejaxrl --peer-python ~/peer_venv/bin/python
                                                                       # with PureJaxRL side by side
    python experiments/bench_startup.py --smoke --repeats 1 --out /tmp/bench_startup   # the plumbing at toy sizes

Measured side by side in one run of this script; every sample is a fresh process, and the sides
of a repeat are interleaved (`benchmarking.interleave`: the order reverses every repeat):
  bare_import  `python -c "import jax"`: the floor of any JAX program's start.
  cold / warm  `python -m ppo_async train` on CartPole-v1 at the shape of PureJaxRL's `ppo.py`
               (4 envs x 128 steps, 4 epochs x 4 minibatches, 64x64 tanh, lr 2.5e-4 annealed,
               ent_coef 0.01, value clip 0.2, no observation normalisation, unscaled rewards),
               8,192 env steps. Cold: a fresh, empty compilation cache
               ($PPO_ASYNC_COMPILATION_CACHE); warm: the same command again on the cache the cold
               process just filled. Each writes RUN_DIR/startup.json: where its seconds before the
               first result went (imports, env, tracing, XLA compile, first iteration).
  peer         PureJaxRL's `ppo.py` as published (`make_train` at the same shape and budget,
               jitted and run once; its own imports, brax and distrax, included), no persistent
               cache: the cold comparison. Only with --peer-dir naming a checkout of PureJaxRL
               (the folder holding `purejaxrl/ppo.py`); this script downloads nothing, and
               without one it says so and skips the comparison.
  peer_steady  PureJaxRL's `ppo_continuous_action.py` at the steady shape below (its env factory,
               Brax-only as published, swapped for gymnax's Pendulum-v1: `GYMNAX_FOR_BRAX`),
               compiled, then run once: env steps / the run's seconds. Only with --peer-dir.
               PureJaxRL needs distrax, whose tensorflow-probability does not import under jax 0.10:
               --peer-python names the interpreter of a venv with a jax it supports (the report
               prints its versions).
  steady       sync mode at PureJaxRL `ppo_continuous_action.py`'s shape (Pendulum-v1, 64 envs x
               128 steps, 4 epochs x 32 minibatches, 256x256 tanh actor and critic, lr 3e-4
               constant): env steps/s between the first and the last row of its metrics.jsonl
               (compile and the first iteration left out).
Ratios: warm process / bare import, warm and cold time to the first result / bare import, and
cold / peer (whole processes, the same budget). Every process gets the same environment (the
XLA flags of `apply_cpu_workarounds` included).
Writes OUT/results.json, OUT/report.txt and OUT/manifest.json (default OUT:
runs/experiments/bench_startup, git-ignored; publish with --out experiments/results/bench_startup).
--smoke shrinks every shape and budget to toy sizes: for testing the script, never for figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import tyro

from ppo_async.runtime.xla_flags import COMPILATION_CACHE_ENV, apply_cpu_workarounds
from ppo_async.study.benchmarking import MachineLoad, describe_other_cpu, fmt_rate, interleave, write_report
from ppo_async.study.manifest import Manifest, default_out

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
TIMEOUT_S = 1800  # one process; a guard against a hang, never reached by a working run
PEER_ENV = "PUREJAXRL_DIR"

# PureJaxRL ppo.py's __main__ config (CartPole-v1), at our budget; DEBUG off (no host printing).
PEER_CONFIG = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 8192, "UPDATE_EPOCHS": 4,
               "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01,
               "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1",
               "ANNEAL_LR": True, "DEBUG": False}
# PureJaxRL ppo_continuous_action.py at STEADY_FLAGS' shape (its NormalizeVec wrappers on, as our
# preset normalises observations and rewards); DEBUG off.
PEER_STEADY_CONFIG = {"LR": 3e-4, "NUM_ENVS": 64, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": 524_288, "UPDATE_EPOCHS": 4,
                      "NUM_MINIBATCHES": 32, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.0,
                      "VF_COEF": 0.5, "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "Pendulum-v1",
                      "ANNEAL_LR": False, "NORMALIZE_ENV": True, "DEBUG": False}
# The same run as `train` flags.
FIRST_RESULT_FLAGS = [
    "--env", "CartPole-v1", "--rollout.num-envs", "4", "--rollout.num-steps", "128", "--ppo.num-epochs", "4",
    "--ppo.num-minibatches", "4", "--ppo.learning-rate", "2.5e-4", "--ppo.anneal-lr", "--ppo.gamma", "0.99",
    "--ppo.gae-lambda", "0.95", "--ppo.clip-eps", "0.2", "--ppo.value-clip-eps", "0.2", "--ppo.vf-coef", "0.5",
    "--ppo.ent-coef", "0.01", "--ppo.max-grad-norm", "0.5", "--network.actor-hidden", "64", "64",
    "--network.critic-hidden", "64", "64", "--network.activation", "tanh", "--rollout.no-normalize-obs",
    "--rollout.reward-scale", "1.0", "--seed", "30",
]
# PureJaxRL ppo_continuous_action.py's shape (../shared/MEASURED.md, "A public peer on the same machine").
STEADY_FLAGS = [
    "--env", "Pendulum-v1", "--rollout.num-envs", "64", "--rollout.num-steps", "128", "--ppo.num-epochs", "4",
    "--ppo.num-minibatches", "32", "--ppo.learning-rate", "3e-4", "--ppo.no-anneal-lr", "--ppo.gamma", "0.99",
    "--ppo.gae-lambda", "0.95", "--ppo.clip-eps", "0.2", "--network.actor-hidden", "256", "256",
    "--network.critic-hidden", "256", "256", "--network.activation", "tanh",
]
SMOKE_FLAGS = ["--rollout.num-envs", "4", "--rollout.num-steps", "16", "--ppo.num-epochs", "1", "--ppo.num-minibatches",
               "2", "--network.actor-hidden", "16", "--network.critic-hidden", "16"]


@dataclasses.dataclass
class Args:
    repeats: int = 3
    """Samples per side (fresh processes); the report gives medians."""
    first_result_steps: int = 8192
    """Env steps of the cold / warm runs (and of the peer's)."""
    steady_steps: int = 524_288
    """Env steps of the steady-state run (64 iterations of 8,192)."""
    peer_dir: str | None = None
    """A checkout of PureJaxRL (the folder holding purejaxrl/ppo.py; needs distrax and brax); default
    $PUREJAXRL_DIR. Without one the comparisons with the peer are skipped (nothing is downloaded)."""
    peer_python: str | None = None
    """The interpreter of the peer's processes (default: this one). PureJaxRL as published imports
    distrax, whose tensorflow-probability (0.25.0, the newest) fails to import under jax 0.10
    (`jax.interpreters.xla.pytype_aval_mappings` is gone): give a venv with a jax it supports."""
    smoke: bool = False
    """Toy shapes and budgets (a test of the script, not a measurement)."""
    out: str | None = None
    """Output folder (default runs/experiments/bench_startup, git-ignored)."""


# ----------------------------------------------------------------------------------------
# One fresh process
# ----------------------------------------------------------------------------------------


def process_env(cache_dir: str | None) -> dict[str, str]:
    """The environment of every measured process: this one's, the XLA workaround flags applied,
    no JAX persistent cache of its own, and ppo_async's cache at `cache_dir` (None: off)."""
    env = dict(os.environ)
    apply_cpu_workarounds(env)
    for name in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        env.pop(name, None)
    env[COMPILATION_CACHE_ENV] = cache_dir if cache_dir is not None else "0"
    return env


def timed_process(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one process, from its start to its exit; RuntimeError (its output's end) if it fails."""
    return timed_output(argv, env)[0]


def timed_output(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """(wall seconds, stdout) of one process; RuntimeError (its output's end) if it fails."""
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return seconds, done.stdout


def train_process(flags: list[str], run_dir: str, cache_dir: str | None) -> dict[str, Any]:
    """One `python -m ppo_async train FLAGS --run-dir RUN_DIR --quiet`: its wall seconds and its startup.json."""
    seconds = timed_process([sys.executable, "-m", "ppo_async", "train", *flags, "--run-dir", run_dir, "--quiet"],
                            process_env(cache_dir))
    with open(os.path.join(run_dir, "startup.json"), encoding="utf-8") as f:
        return {"process_s": seconds, "startup": json.load(f)}


def steady_rate(run_dir: str) -> float:
    """Env steps/s between the first and the last row of RUN_DIR/metrics.jsonl (one seed)."""
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    first, last = rows[0], rows[-1]
    return (last["env_steps"] - first["env_steps"]) / max(last["wall_time"] - first["wall_time"], 1e-9)


def find_peer(peer_dir: str | None) -> tuple[str | None, str]:
    """(the PureJaxRL checkout to use, or None; why not / where from)."""
    peer_dir = peer_dir or os.environ.get(PEER_ENV)
    if not peer_dir:
        return None, f"no checkout given (--peer-dir or ${PEER_ENV}); this script downloads nothing"
    if not os.path.isfile(os.path.join(peer_dir, "purejaxrl", "ppo.py")):
        return None, f"{peer_dir!r} holds no purejaxrl/ppo.py"
    return os.path.abspath(peer_dir), f"PureJaxRL's purejaxrl/ppo.py from {os.path.abspath(peer_dir)}"


PEER_PACKAGES = ("jax", "jaxlib", "flax", "optax", "chex", "distrax", "tensorflow-probability", "gymnax", "brax", "numpy")


def peer_versions(python: str) -> dict[str, str | None]:
    """The versions of `PEER_PACKAGES` in the peer's interpreter (None: not installed)."""
    code = ("import importlib.metadata as m, json\nv = {}\nfor d in %r:\n    try: v[d] = m.version(d)\n"
            "    except m.PackageNotFoundError: v[d] = None\nprint(json.dumps(v))\n" % (PEER_PACKAGES,))
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-500:]}


def peer_code(peer_dir: str, total_env_steps: int, smoke: bool) -> str:
    """The program of one peer process: PureJaxRL's make_train at PEER_CONFIG, jitted and run once."""
    config = {**PEER_CONFIG, "TOTAL_TIMESTEPS": total_env_steps}
    if smoke:
        config.update({"NUM_ENVS": 4, "NUM_STEPS": 16, "UPDATE_EPOCHS": 1, "NUM_MINIBATCHES": 2})
    inner = os.path.join(peer_dir, "purejaxrl")  # ppo.py imports its wrappers as `from wrappers import ...`
    return (f"import sys\nsys.path[:0] = [{peer_dir!r}, {inner!r}]\nimport jax\nfrom purejaxrl import ppo\n"
            f"out = ppo.make_train({config!r})\n"
            "jax.block_until_ready(jax.jit(out)(jax.random.PRNGKey(30)))\n")


# ppo_continuous_action.py as published makes its env with `BraxGymnaxWrapper(ENV_NAME)` (Brax
# tasks only); the steady side swaps in this class of the same interface around gymnax's
# Pendulum-v1, the script's one change (as ../shared/MEASURED.md's side-by-side did).
GYMNAX_FOR_BRAX = """import gymnax
class GymnaxEnv:
    def __init__(self, env_name, backend=None):
        self._env, self._params = gymnax.make(env_name)
    def reset(self, key, params=None):
        return self._env.reset(key, self._params)
    def step(self, key, state, action, params=None):
        return self._env.step(key, state, action, self._params)
    def observation_space(self, params):
        return self._env.observation_space(self._params)
    def action_space(self, params):
        return self._env.action_space(self._params)
"""


def peer_steady_code(peer_dir: str, total_env_steps: int, smoke: bool) -> str:
    """The program of one steady-state peer process: PureJaxRL's ppo_continuous_action.py make_train
    at `PEER_STEADY_CONFIG`, compiled, then run once; prints {"compile_s", "run_s"} as JSON."""
    config = {**PEER_STEADY_CONFIG, "TOTAL_TIMESTEPS": total_env_steps}
    if smoke:
        config.update({"NUM_ENVS": 4, "NUM_STEPS": 16, "UPDATE_EPOCHS": 1, "NUM_MINIBATCHES": 2})
    inner = os.path.join(peer_dir, "purejaxrl")
    return (f"import json, sys, time\nsys.path[:0] = [{peer_dir!r}, {inner!r}]\nimport jax\n"
            "from purejaxrl import ppo_continuous_action as peer\n"
            f"{GYMNAX_FOR_BRAX}peer.BraxGymnaxWrapper = GymnaxEnv\n"
            f"train = jax.jit(peer.make_train({config!r}))\n"
            "t = time.perf_counter(); compiled = train.lower(jax.random.PRNGKey(30)).compile(); c = time.perf_counter() - t\n"
            "t = time.perf_counter(); jax.block_until_ready(compiled(jax.random.PRNGKey(30))); r = time.perf_counter() - t\n"
            "print(json.dumps({'compile_s': c, 'run_s': r}))\n")


# ----------------------------------------------------------------------------------------
# The sides
# ----------------------------------------------------------------------------------------


def make_sides(args: Args, work: str, peer_dir: str | None) -> list[tuple[str, Callable[[], dict[str, Any]]]]:
    """The measured sides (name, one fresh-process sample), each with its own folders under `work`."""
    smoke = SMOKE_FLAGS if args.smoke else []
    first = FIRST_RESULT_FLAGS + smoke + ["--total-env-steps", str(args.first_result_steps)]
    steady = STEADY_FLAGS + smoke + ["--total-env-steps", str(args.steady_steps)]
    count = {"n": 0}

    def fresh(name: str) -> str:
        count["n"] += 1
        return os.path.join(work, f"{count['n']:03d}-{name}")

    def cold_then_warm() -> dict[str, Any]:
        cache = fresh("cache")  # empty: the cold process fills it, the warm one reads it
        cold = train_process(first, fresh("cold"), cache)
        warm = train_process(first, fresh("warm"), cache)
        return {"cold": cold, "warm": warm, "cache_entries": len(os.listdir(cache))}

    def steady_run() -> dict[str, Any]:
        run_dir = fresh("steady")
        sample = train_process(steady, run_dir, os.path.join(work, "steady-cache"))
        return {**sample, "env_steps_per_s": steady_rate(run_dir)}

    sides = [
        ("bare_import", lambda: {"process_s": timed_process([sys.executable, "-c", "import jax"], process_env(None))}),
        ("cold_then_warm", cold_then_warm),
        ("steady", steady_run),
    ]
    if peer_dir is not None:
        python = args.peer_python or sys.executable
        code = peer_code(peer_dir, args.first_result_steps, args.smoke)
        sides.append(("peer", lambda: {"process_s": timed_process([python, "-c", code], process_env(None))}))
        steady_code = peer_steady_code(peer_dir, args.steady_steps, args.smoke)

        def peer_steady() -> dict[str, Any]:
            seconds, stdout = timed_output([python, "-c", steady_code], process_env(None))
            times = json.loads(stdout.strip().splitlines()[-1])
            return {"process_s": seconds, **times, "env_steps_per_s": args.steady_steps / times["run_s"]}

        sides.append(("peer_steady", peer_steady))
    return sides


def median_of(samples: list[dict[str, Any]], *keys: str) -> float | None:
    """The median of `sample[k0][k1]...` over the samples (None where a value is None)."""
    values = []
    for sample in samples:
        for key in keys:
            sample = sample[key]
        values.append(sample)
    return None if any(v is None for v in values) else statistics.median(values)


def summarise(samples: dict[str, list[dict[str, Any]]], peer: dict[str, Any]) -> dict[str, Any]:
    """Medians per side, the startup breakdowns' medians and the ratios."""
    pairs = samples["cold_then_warm"]
    out: dict[str, Any] = {"sides": {"bare_import": samples["bare_import"], "cold": [p["cold"] for p in pairs],
                                     "warm": [p["warm"] for p in pairs], "steady": samples["steady"]}}
    bare = median_of(samples["bare_import"], "process_s")
    for side in ("cold", "warm"):
        runs = out["sides"][side]
        startup = {name: median_of(runs, "startup", name) for name in runs[0]["startup"]}
        out[side] = {"process_s": median_of(runs, "process_s"), "startup": startup,
                     "process_over_bare_import": median_of(runs, "process_s") / bare,
                     "first_result_over_bare_import": None if startup["first_result_s"] is None
                     else startup["first_result_s"] / bare}
    out["bare_import"] = {"process_s": bare}
    out["steady"] = {"env_steps_per_s": median_of(samples["steady"], "env_steps_per_s")}
    out["peer"] = dict(peer)
    if "peer" in samples:
        out["sides"]["peer"] = samples["peer"]
        peer_s = median_of(samples["peer"], "process_s")
        out["peer"].update(process_s=peer_s, cold_over_peer=out["cold"]["process_s"] / peer_s)
    if "peer_steady" in samples:
        out["sides"]["peer_steady"] = samples["peer_steady"]
        peer_rate = median_of(samples["peer_steady"], "env_steps_per_s")
        out["peer"].update(steady_env_steps_per_s=peer_rate,
                           steady_over_peer=out["steady"]["env_steps_per_s"] / peer_rate)
    return out


# ----------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------


def breakdown_lines(name: str, startup: dict[str, Any]) -> list[str]:
    """The median startup breakdown of one side, one line."""
    parts = ["before_train_s", "setup_s", "tracing_s", "lowering_s", "compile_s", "writers_s", "first_iteration_s"]
    cells = ", ".join(f"{p[:-2]} {startup[p]:.2f}" for p in parts if startup.get(p) is not None)
    return [f"  {name:<5} first result after {startup['first_result_s'] or float('nan'):.2f}s: {cells} "
            f"({startup['compiles']:.0f} programs, {startup['cache_hits']:.0f} from the cache; "
            f"{startup.get('program_cache_hits', 0):.0f} traced programs from the program cache)"]


def report(results: dict[str, Any]) -> str:
    m, r = results["machine"], results
    lines = [
        f"bench_startup: medians of {r['args']['repeats']} fresh processes per side{' (SMOKE: toy sizes)' if r['args']['smoke'] else ''}; "
        f"{m['cpu_count']} CPU cores, load average before {m['loadavg_before']}; other processes used "
        f"{describe_other_cpu(m.get('other_cpu_cores'))} during the run",
        "",
        f"time to a first result, CartPole-v1 at PureJaxRL ppo.py's shape, {r['args']['first_result_steps']:,} env steps "
        "(python -m ppo_async train, whole process):",
        f"  bare `python -c \"import jax\"`: {r['bare_import']['process_s']:.2f}s",
    ]
    for side in ("warm", "cold"):
        s = r[side]
        first = "" if s["first_result_over_bare_import"] is None else f", first result {s['first_result_over_bare_import']:.2f}x"
        lines.append(f"  {side:<5} process {s['process_s']:.2f}s = {s['process_over_bare_import']:.2f}x bare import{first}")
    lines += ["where the seconds before the first result go (medians; RUN_DIR/startup.json):",
              *breakdown_lines("warm", r["warm"]["startup"]), *breakdown_lines("cold", r["cold"]["startup"])]
    peer = r["peer"]
    if peer.get("process_s") is not None:
        versions = ", ".join(f"{k} {v}" for k, v in (peer.get("versions") or {}).items() if v)
        lines.append(f"the peer's interpreter: {peer.get('python')} ({versions})")
        lines.append(f"cold against the peer ({peer['reason']}): peer process {peer['process_s']:.2f}s, ours "
                     f"{r['cold']['process_s']:.2f}s -> ours / peer = {peer['cold_over_peer']:.2f}x (same shape and budget)")
    else:
        lines.append(f"PureJaxRL's ppo.py: not available ({peer['reason']}): the cold comparison with the peer is skipped")
    lines += ["", f"steady state, sync mode at PureJaxRL ppo_continuous_action.py's shape (Pendulum-v1, 64x128, 4x32, "
                  f"256x256), {r['args']['steady_steps']:,} env steps: {fmt_rate(r['steady']['env_steps_per_s'])} env steps/s "
                  "(metrics.jsonl, first to last row)"]
    if peer.get("steady_env_steps_per_s") is not None:
        lines.append(f"  the peer (ppo_continuous_action.py, the same shape and budget, its run after its compile): "
                     f"{fmt_rate(peer['steady_env_steps_per_s'])} env steps/s -> ours / peer = {peer['steady_over_peer']:.2f}x")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------


def main(args: Args) -> dict[str, Any]:
    if args.repeats < 1:
        raise SystemExit(f"--repeats = {args.repeats} is invalid: must be >= 1")
    if args.smoke:
        args = dataclasses.replace(args, first_result_steps=min(args.first_result_steps, 128),
                                   steady_steps=min(args.steady_steps, 4 * 64))
    out = args.out or default_out("bench_startup", REPO)
    with Manifest(out):
        return measure(args, out)


def measure(args: Args, out: str) -> dict[str, Any]:
    """Every side, interleaved; writes OUT/results.json and OUT/report.txt, returns the results."""
    peer_dir, reason = find_peer(args.peer_dir)
    print(f"peer: {reason}", flush=True)
    load = MachineLoad(include_children=True)  # the measured processes are this benchmark's own CPU time
    machine = load.start()
    work = tempfile.mkdtemp(prefix="bench_startup_")
    try:
        samples = interleave(args.repeats, make_sides(args, work, peer_dir),
                             on_sample=lambda side, sample: print(f"{side}: {json.dumps(sample)[:300]}", flush=True))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    peer: dict[str, Any] = {"available": peer_dir is not None, "reason": reason}
    if peer_dir is not None:
        peer.update(python=args.peer_python or sys.executable, versions=peer_versions(args.peer_python or sys.executable))
    results = {"args": dataclasses.asdict(args), "machine": {**machine, **load.stop()}, **summarise(samples, peer)}
    text = report(results)
    print(text)
    write_report(out, "results.json", results, "report.txt", text)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
