"""Benchmark: one threaded run as 2 processes x 1 device vs 1 process x 2 devices, and the
cost of the cross-process all-reduce per SGD step.

    python experiments/bench_distributed.py              # full run, about 3 min on a 2-core CPU
    python experiments/bench_distributed.py --quick      # smoke run (tiny budgets)

Measured side by side in one run of this script (Pendulum-v1, 16 envs x 32 steps per chunk,
2 epochs x 4 minibatches, 64x64 networks), repeats interleaved (alternating which goes first):
  (a) the same global run both ways - 2 processes (`python -m ppo_async launch
      --num-processes 2`, 2 samplers each, one chunk per process per batch, the learner mesh
      over both processes' devices) vs one process with 2 fake CPU devices (4 samplers over
      both devices, 2 chunks per batch, the learner data-parallel over both devices). Same
      global batch, same samplers, same SGD steps. Learner iterations/s (iterations over the
      run's wall time) and consumer env steps/s (env_steps / wall_time of the last row).
  (b) one all-reduce (`psum`) of a flattened gradient of the actor-critic's size under jit,
      over 2 devices of one process vs over 2 processes x 1 device (gloo over loopback):
      median milliseconds per call, after warm-up.
The ratios are 2-process / 1-process. On 2 cores the point is the overhead: the processes
share the same two cores, so no speed-up is possible here (README says what to expect on real
hosts). Writes OUT/<backend>.json, report.txt (--quick: <backend>-quick.json, report-quick.txt) and
manifest.json; OUT defaults to runs/experiments/bench_distributed (git-ignored): publish with
--out experiments/results/bench_distributed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

import tyro

from ppo_async.study.benchmarking import MachineLoad, describe_other_cpu, fmt_rate, interleave, write_report
from ppo_async.study.manifest import Manifest, default_out
from ppo_async.runtime.launch import free_port
from ppo_async.report.metrics import read_jsonl

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


@dataclasses.dataclass(frozen=True)
class Args:
    total_env_steps: int = 50_000
    """Global env steps per threaded run."""
    repeats: int = 2
    """Interleaved repeats of each side."""
    allreduce_calls: int = 300
    """Timed all-reduce calls per side."""
    quick: bool = False
    """Smoke run: 8k env steps, 1 repeat, 50 calls."""
    out: str | None = None
    """Output directory (default runs/experiments/bench_distributed, git-ignored)."""


COMMON = ["--mode", "threaded", "--env", "Pendulum-v1", "--rollout.num-envs", "16", "--rollout.num-steps", "32",
          "--ppo.num-epochs", "2", "--ppo.num-minibatches", "4", "--network.actor-hidden", "64", "64",
          "--network.critic-hidden", "64", "64", "--quiet"]


def two_devices_env() -> dict:
    return dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())


def summarize_run(run_dir: str) -> dict:
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    last = rows[-1]
    return {"iterations": len(rows), "wall_s": last["wall_time"], "env_steps": last["env_steps"],
            "iterations_per_s": len(rows) / last["wall_time"], "env_steps_per_s": last["env_steps"] / last["wall_time"]}


def run_side(name: str, total: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix="bench_distributed_" + name.replace(" ", "")[:10] + "_")
    args = [*COMMON, "--total-env-steps", str(total), "--run-dir", os.path.join(run_dir, "run")]
    if name == "2 processes x 1 device":
        cmd, env = ["launch", "--num-processes", "2", "--", "train", *args, "--threaded.num-samplers", "2"], dict(os.environ)
    else:
        cmd = ["train", *args, "--threaded.num-samplers", "4", "--threaded.chunks-per-batch", "2",
               "--threaded.sampler-devices", "0", "1", "--threaded.learner-devices", "0", "1"]
        env = two_devices_env()
    done = subprocess.run([sys.executable, "-m", "ppo_async", *cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return summarize_run(os.path.join(run_dir, "run"))


ALLREDUCE = textwrap.dedent(
    """
    import json, sys, time
    from ppo_async.runtime.xla_flags import apply_cpu_workarounds
    apply_cpu_workarounds()
    import jax, jax.numpy as jnp, numpy as np
    process_id, num_processes, port, calls = (int(a) for a in sys.argv[1:5])
    if num_processes > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
    import ppo_async as pa
    from jax.flatten_util import ravel_pytree
    from jax.sharding import NamedSharding, PartitionSpec as P
    from ppo_async.runtime import distributed, placement
    from ppo_async.core import learner
    from ppo_async.modes.common import make_contexts
    cfg = pa.Config(network=pa.NetworkConfig(actor_hidden=(64, 64), critic_hidden=(64, 64)))
    _, rctx, ctx = make_contexts(cfg)
    with jax.default_device(jax.local_devices()[0]):
        state = learner.init_train_state(ctx, jax.random.PRNGKey(0), rctx.env.obs_shape)
    flat = np.asarray(ravel_pytree(jax.device_get(state.params))[0])
    mesh = placement.learner_mesh(jax.devices()[:2])
    mine = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)  # this process's rows
    grads = jax.make_array_from_process_local_data(NamedSharding(mesh, P(placement.LEARNER_AXIS)), np.tile(flat, (mine, 1)))
    reduce = jax.jit(jax.shard_map(lambda g: jax.lax.psum(g, placement.LEARNER_AXIS), mesh=mesh,
                                   in_specs=P(placement.LEARNER_AXIS), out_specs=P(placement.LEARNER_AXIS), check_vma=False))
    for _ in range(20):
        reduce(grads).block_until_ready()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        reduce(grads).block_until_ready()
        times.append(time.perf_counter() - t)
    print("RESULT " + json.dumps({"floats": int(flat.size), "median_ms": 1e3 * float(np.median(times))}))
    """
)


def allreduce_side(name: str, calls: int) -> dict:
    if name == "2 processes x 1 device":
        port = free_port()
        procs = [subprocess.Popen([sys.executable, "-c", ALLREDUCE, str(p), "2", str(port), str(calls)], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in range(2)]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        codes = [p.returncode for p in procs]
    else:
        done = subprocess.run([sys.executable, "-c", ALLREDUCE, "0", "1", "0", str(calls)], cwd=REPO, env=two_devices_env(),
                              capture_output=True, text=True, timeout=600)
        outs, codes = [done.stdout + done.stderr], [done.returncode]
    if any(codes):
        raise SystemExit(f"all-reduce ({name}) failed: {codes}\n{outs[0][-3000:]}")
    results = [json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:]) for out in outs]
    return {"floats": results[0]["floats"], "median_ms": max(r["median_ms"] for r in results)}  # the slower process


SIDES = ("2 processes x 1 device", "1 process x 2 devices")


def report(results: dict) -> str:
    m = results["machine"]
    lines = [f"bench_distributed ({results['backend']}, {m['cpu_count']} CPUs; other processes took "
             f"{describe_other_cpu(m['other_cpu_cores'])}), {results['args']['total_env_steps']:,} global env steps per run",
             "", "(a) threaded run, same global batch", f"{'side':<26}{'learner it/s':>14}{'env steps/s':>14}{'iterations':>12}"]
    runs = results["runs"]
    for side in SIDES:
        for r in runs[side]:
            lines.append(f"{side:<26}{r['iterations_per_s']:>14.2f}{fmt_rate(r['env_steps_per_s']):>14}{r['iterations']:>12}")
    med = {side: {k: statistics.median(r[k] for r in runs[side]) for k in ("iterations_per_s", "env_steps_per_s")} for side in SIDES}
    ratio = {k: med[SIDES[0]][k] / med[SIDES[1]][k] for k in ("iterations_per_s", "env_steps_per_s")}
    results["ratios"] = {**ratio}
    lines += [f"medians: 2x1 {med[SIDES[0]]['iterations_per_s']:.2f} it/s, {fmt_rate(med[SIDES[0]]['env_steps_per_s'])} steps/s; "
              f"1x2 {med[SIDES[1]]['iterations_per_s']:.2f} it/s, {fmt_rate(med[SIDES[1]]['env_steps_per_s'])} steps/s",
              f"2 processes / 1 process: learner iterations/s {ratio['iterations_per_s']:.3f}x, "
              f"consumer env steps/s {ratio['env_steps_per_s']:.3f}x", "",
              "(b) one all-reduce of the flattened gradient (median ms per call)"]
    ar = results["allreduce"]
    for side in SIDES:
        lines.append(f"{side:<26}" + "  ".join(f"{r['median_ms']:.3f}" for r in ar[side]) + f"  ({ar[side][0]['floats']:,} floats)")
    ar_med = {side: statistics.median(r["median_ms"] for r in ar[side]) for side in SIDES}
    results["ratios"]["allreduce_ms"] = ar_med[SIDES[0]] / ar_med[SIDES[1]]
    sgd = results["args"]["sgd_steps_per_iteration"]
    lines += [f"2 processes / 1 process: {results['ratios']['allreduce_ms']:.2f}x ({ar_med[SIDES[0]]:.3f} vs {ar_med[SIDES[1]]:.3f} ms); "
              f"x {sgd} SGD steps per iteration = {sgd * ar_med[SIDES[0]]:.1f} vs {sgd * ar_med[SIDES[1]]:.1f} ms per learner iteration"]
    return "\n".join(lines)


def main(args: Args) -> dict:
    if args.quick:
        args = dataclasses.replace(args, total_env_steps=8192, repeats=1, allreduce_calls=50)
    out = args.out or default_out("bench_distributed", REPO)
    with Manifest(out):
        return measure(args, out)


def measure(args: Args, out: str) -> dict:
    """Both parts, interleaved; writes the report files into `out` and returns the results."""
    load = MachineLoad(include_children=True)
    results = {"backend": "cpu", "args": {**dataclasses.asdict(args), "sgd_steps_per_iteration": 2 * 4},
               "machine": load.start()}
    progress = lambda name, r: print(f"  {name}: {r}", flush=True)  # noqa: E731
    results["runs"] = interleave(args.repeats, [(s, lambda s=s: run_side(s, args.total_env_steps)) for s in SIDES], progress)
    results["allreduce"] = interleave(args.repeats, [(s, lambda s=s: allreduce_side(s, args.allreduce_calls)) for s in SIDES], progress)
    results["machine"].update(load.stop())
    text = report(results)
    print(text)
    write_report(out, "cpu-quick.json" if args.quick else "cpu.json", results, "report-quick.txt" if args.quick else "report.txt", text)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
