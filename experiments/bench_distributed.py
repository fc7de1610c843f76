"""Benchmark: one threaded run as N processes x 1 device vs 1 process x N devices (N = 2 and 4),
where the learner's time goes in each, and the cost of the cross-process all-reduce per SGD step.

    python experiments/bench_distributed.py              # full run, about 8 min on a 2-core CPU
    python experiments/bench_distributed.py --quick      # smoke run (tiny budgets)

Measured side by side in one run of this script (Pendulum-v1, 16 envs x 32 steps per chunk,
2 epochs x 4 minibatches, 64x64 networks), repeats interleaved (alternating which goes first):
  (a) the same global run both ways - N processes (`python -m ppo_async launch
      --num-processes N`, 4 / N samplers each, one chunk per process per batch, the learner mesh
      over every process's device) vs one process with N fake CPU devices (4 samplers over
      them, N chunks per batch, the learner data-parallel over the N devices). Same global
      batch, same samplers, same SGD steps. Learner iterations/s (iterations over the run's
      wall time), consumer env steps/s (env_steps / wall_time of the last row), and the
      learner's time per iteration by phase (median over iterations of the rows'
      `learner_*_s` fields; process 0's learner with several processes) and process 0's
      `exchange_wait_s`. At N = 4 the four processes (or devices) share the 2 cores.
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
    total_env_steps: int = 200_000
    """Global env steps per threaded run (about 200 learner iterations)."""
    repeats: int = 2
    """Interleaved repeats of each side."""
    processes: tuple[int, ...] = (2, 4)
    """Process counts N compared with one process over N devices."""
    allreduce_calls: int = 300
    """Timed all-reduce calls per side."""
    quick: bool = False
    """Smoke run: 8k env steps, 1 repeat, 50 calls."""
    out: str | None = None
    """Output directory (default runs/experiments/bench_distributed, git-ignored)."""


COMMON = ["--mode", "threaded", "--env", "Pendulum-v1", "--rollout.num-envs", "16", "--rollout.num-steps", "32",
          "--ppo.num-epochs", "2", "--ppo.num-minibatches", "4", "--network.actor-hidden", "64", "64",
          "--network.critic-hidden", "64", "64", "--quiet"]


def devices_env(count: int) -> dict:
    return dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}").strip())


PHASES = ("learner_wait_s", "learner_handover_s", "learner_place_s", "learner_update_s", "learner_fetch_s",
          "learner_publish_s", "exchange_wait_s")
"""The row fields of the learner's time per iteration (`modes.threaded.learner.LEARNER_PHASES`) and process 0's wait."""
WARMUP_ITERATIONS = 5  # rows left out of the phase medians (first calls, compile of the rest)


def summarize_run(run_dir: str) -> dict:
    rows = read_jsonl(os.path.join(run_dir, "metrics.jsonl"))
    last = rows[-1]
    steady = rows[WARMUP_ITERATIONS:] or rows
    phases = {name: 1e3 * statistics.median(r.get(name, 0.0) for r in steady) for name in PHASES}
    return {"iterations": len(rows), "wall_s": last["wall_time"], "env_steps": last["env_steps"],
            "iterations_per_s": len(rows) / last["wall_time"], "env_steps_per_s": last["env_steps"] / last["wall_time"],
            "phases_ms": phases, "iteration_ms": 1e3 * statistics.median(b["wall_time"] - a["wall_time"] for a, b in zip(steady, steady[1:]))}


GRADIENTS = ", gradients"  # a side with distributed.learner_sync = "gradients" (the default, auto, gathers these batches)


def side_names(n: int) -> tuple[str, ...]:
    """The sides compared at N: N processes (the default learner_sync, which gathers these small
    batches), one process over N devices, and at N = 2 the processes with gradients all-reduced."""
    sides = (f"{n} processes x 1 device", f"1 process x {n} devices")
    return sides + ((sides[0] + GRADIENTS,) if n == 2 else ())


def run_side(name: str, total: int) -> dict:
    n = int(name.split()[0]) if "processes" in name else int(name.split()[3])
    run_dir = tempfile.mkdtemp(prefix="bench_distributed_" + name.replace(" ", "")[:10] + "_")
    args = [*COMMON, "--total-env-steps", str(total), "--run-dir", os.path.join(run_dir, "run")]
    if "processes" in name:
        cmd = ["launch", "--num-processes", str(n), "--", "train", *args, "--num-samplers", str(4 // n)]
        cmd += ["--distributed.learner-sync", "gradients"] if name.endswith(GRADIENTS) else []
        env = dict(os.environ)
    else:
        devices = [str(d) for d in range(n)]
        cmd = ["train", *args, "--num-samplers", "4", "--threaded.chunks-per-batch", str(n),
               "--threaded.sampler-devices", *devices, "--threaded.learner-devices", *devices]
        env = devices_env(n)
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
        done = subprocess.run([sys.executable, "-c", ALLREDUCE, "0", "1", "0", str(calls)], cwd=REPO, env=devices_env(2),
                              capture_output=True, text=True, timeout=600)
        outs, codes = [done.stdout + done.stderr], [done.returncode]
    if any(codes):
        raise SystemExit(f"all-reduce ({name}) failed: {codes}\n{outs[0][-3000:]}")
    results = [json.loads([l for l in out.splitlines() if l.startswith("RESULT ")][-1][7:]) for out in outs]
    return {"floats": results[0]["floats"], "median_ms": max(r["median_ms"] for r in results)}  # the slower process


SIDES = side_names(2)[:2]  # the all-reduce's two sides


def run_lines(results: dict, n: int) -> list[str]:
    """Part (a) for N processes: every run, the medians and ratios, the learner's phases."""
    runs, sides = results["runs"], side_names(n)
    lines = [f"(a) threaded run, same global batch, N = {n}" + (" (4 processes or devices on 2 cores)" if n > 2 else ""),
             f"{'side':<36}{'learner it/s':>14}{'env steps/s':>14}{'iterations':>12}"]
    for side in sides:
        for r in runs[side]:
            lines.append(f"{side:<36}{r['iterations_per_s']:>14.2f}{fmt_rate(r['env_steps_per_s']):>14}{r['iterations']:>12}")
    med = {side: {k: statistics.median(r[k] for r in runs[side]) for k in ("iterations_per_s", "env_steps_per_s")} for side in sides}
    lines.append("medians: " + "; ".join(f"{side} {med[side]['iterations_per_s']:.2f} it/s, "
                                         f"{fmt_rate(med[side]['env_steps_per_s'])} steps/s" for side in sides))
    for side in sides[:1] + sides[2:]:
        ratio = {k: med[side][k] / med[sides[1]][k] for k in ("iterations_per_s", "env_steps_per_s")}
        results["ratios"][side] = ratio
        lines.append(f"{side} / {sides[1]}: learner iterations/s {ratio['iterations_per_s']:.3f}x, "
                     f"consumer env steps/s {ratio['env_steps_per_s']:.3f}x")
    lines += [
              f"learner time per iteration, ms (median over iterations {WARMUP_ITERATIONS + 1}+, median over repeats):",
              f"{'side':<36}{'iteration':>10}" + "".join(f"{p.replace('learner_', '').replace('_wait_s', '').replace('_s', ''):>10}" for p in PHASES)]
    for side in sides:
        iteration = statistics.median(r["iteration_ms"] for r in runs[side])
        phases = [statistics.median(r["phases_ms"][p] for r in runs[side]) for p in PHASES]
        lines.append(f"{side:<36}{iteration:>10.1f}" + "".join(f"{v:>10.1f}" for v in phases))
    steady = {side: statistics.median(r["iteration_ms"] for r in runs[side]) for side in sides}
    for side in sides[:1] + sides[2:]:
        results["ratios"][side]["steady_iterations_per_s"] = steady[sides[1]] / steady[side]
        lines.append(f"steady state (median iteration time): {side} / {sides[1]} learner iterations/s "
                     f"{steady[sides[1]] / steady[side]:.3f}x")
    return lines + [""]


def report(results: dict) -> str:
    m = results["machine"]
    lines = [f"bench_distributed ({results['backend']}, {m['cpu_count']} CPUs; other processes took "
             f"{describe_other_cpu(m['other_cpu_cores'])}), {results['args']['total_env_steps']:,} global env steps per run", ""]
    results["ratios"] = {}
    for n in results["args"]["processes"]:
        lines += run_lines(results, n)
    lines.append("(b) one all-reduce of the flattened gradient (median ms per call)")
    ar = results["allreduce"]
    for side in SIDES:
        lines.append(f"{side:<26}" + "  ".join(f"{r['median_ms']:.3f}" for r in ar[side]) + f"  ({ar[side][0]['floats']:,} floats)")
    ar_med = {side: statistics.median(r["median_ms"] for r in ar[side]) for side in SIDES}
    results["ratios"]["allreduce_ms"] = ar_med[SIDES[0]] / ar_med[SIDES[1]]
    sgd = results["args"]["sgd_steps_per_iteration"]
    calls = sgd + 3  # the gradient's per SGD step; the advantage moments' all-gather, the diagnostics' pmax and psum
    lines += [f"2 processes / 1 process: {results['ratios']['allreduce_ms']:.2f}x ({ar_med[SIDES[0]]:.3f} vs {ar_med[SIDES[1]]:.3f} ms); "
              f"x {calls} collectives per iteration ({sgd} SGD steps + 3) = {calls * ar_med[SIDES[0]]:.1f} vs "
              f"{calls * ar_med[SIDES[1]]:.1f} ms per learner iteration"]
    return "\n".join(lines)


def main(args: Args) -> dict:
    if args.quick:
        args = dataclasses.replace(args, total_env_steps=8192, repeats=1, allreduce_calls=50, processes=(2,))
    out = args.out or default_out("bench_distributed", REPO)
    with Manifest(out):
        return measure(args, out)


def measure(args: Args, out: str) -> dict:
    """Both parts, interleaved; writes the report files into `out` and returns the results."""
    load = MachineLoad(include_children=True)
    results = {"backend": "cpu", "args": {**dataclasses.asdict(args), "sgd_steps_per_iteration": 2 * 4},
               "machine": load.start()}
    progress = lambda name, r: print(f"  {name}: {r}", flush=True)  # noqa: E731
    sides = [side for n in args.processes for side in side_names(n)]
    results["runs"] = interleave(args.repeats, [(s, lambda s=s: run_side(s, args.total_env_steps)) for s in sides], progress)
    results["allreduce"] = interleave(args.repeats, [(s, lambda s=s: allreduce_side(s, args.allreduce_calls)) for s in SIDES], progress)
    results["machine"].update(load.stop())
    text = report(results)
    print(text)
    write_report(out, "cpu-quick.json" if args.quick else "cpu.json", results, "report-quick.txt" if args.quick else "report.txt", text)
    return results


if __name__ == "__main__":
    main(tyro.cli(Args))
