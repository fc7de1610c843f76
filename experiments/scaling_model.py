"""A scaling model of several processes, checked against this machine (issue 29 item 5).

    python experiments/scaling_model.py --out experiments/results/scaling_model

What one learner iteration of P processes (hosts) costs, per `distributed.learner_sync`, from
per-call costs (Sebulba / Cleanba's layout: every host samples into its own buffer, the
learners stay identical):

    gradients: t_iter = t_local(b) + (S + 3) * allreduce(P, 4 g)   (S = epochs x minibatches SGD steps;
               + 3: the advantage moments' all-gather, the diagnostics' pmax and psum)
    batch:     t_iter = share(P) * t_local(P b) + allgather(P, bytes(b))
    t_local(n) = t_fixed + n * t_sample                 (one host's iteration on n samples)
    allreduce(P, m) = 2 log2(P) alpha + 2 (P - 1) m / (P beta)   (m bytes)
    allgather(P, m) = log2(P) alpha + (P - 1) m / beta           (m bytes per process)
    (recursive doubling's latency and the ring's bandwidth terms, the bounds MPICH's algorithms
    reach: Thakur, Rabenseifner & Gropp 2005)

b samples per host, g gradient floats, alpha the per-message latency of a collective step,
beta the link bandwidth; share(P) = max(1, P / cores) only where P processes share one
machine's cores (the check here), 1 across hosts. Learner throughput is P b / t_iter env steps
per second; samplers on every host add up, so the run is learner-bound once P b / t_iter is
below P times one host's sampling rate. Sampler-bound, the lag of a consumed sample is about
one host's rollout time over t_iter (the learner moves on while it is made); learner-bound,
the samplers fill their buffers and the lag is set by `threaded.buffer_capacity` and
`full_policy` ("buffer" in the tables).

Inputs measured here (experiments/results/bench_distributed/cpu.json): t_fixed and t_sample
fitted to the one-process iterations at 1,024 and 2,048 samples (1 x 2 and 1 x 4 devices),
alpha from the isolated 2-process all-reduce (half the call: 2 log2(2) = 2 latency steps);
the seed's setting per host from experiments/results/bench_sync (the default's sync rate).
The check compares the model with the measured 2- and 4-process iterations. Assumed for the
predictions (not measured here): the interconnects below (nominal figures of their
standards) and a GPU learner's t_local, stated as such.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from typing import NamedTuple

import tyro

from ppo_async.study.benchmarking import write_report
from ppo_async.study.manifest import Manifest, default_out

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BENCH = os.path.join(REPO, "experiments", "results", "bench_distributed", "cpu.json")  # inputs, read only
SYNC_BENCH = os.path.join(REPO, "experiments", "results", "bench_sync", "cpu.json")


class Link(NamedTuple):
    """An interconnect: per-message latency alpha (s) and bandwidth beta (bytes/s), with where the figures come from."""

    name: str
    alpha_s: float
    beta_bytes_per_s: float
    source: str


class Setting(NamedTuple):
    """A learner setting: samples per host per iteration, SGD steps, gradient floats, bytes per
    sample, a host's iteration time (t_fixed + n t_sample) and its sampling rate."""

    name: str
    samples_per_host: int
    sgd_steps: int
    grad_floats: int
    bytes_per_sample: int
    t_fixed_s: float
    t_sample_s: float
    host_sampling_per_s: float
    source: str


def allreduce_s(p: int, nbytes: float, link: Link) -> float:
    """All-reduce of `nbytes` over `p` processes: 2 log2(p) latency steps, 2 (p - 1) / p of the bytes moved."""
    return 0.0 if p == 1 else 2 * math.log2(p) * link.alpha_s + 2 * (p - 1) * nbytes / (p * link.beta_bytes_per_s)


def allgather_s(p: int, nbytes: float, link: Link) -> float:
    """All-gather of `nbytes` per process over `p` processes: log2(p) latency steps, (p - 1) shares received."""
    return 0.0 if p == 1 else math.log2(p) * link.alpha_s + (p - 1) * nbytes / link.beta_bytes_per_s


def iteration_s(setting: Setting, p: int, sync: str, link: Link, cores: int | None = None) -> float:
    """One learner iteration of `p` processes (the module docstring's model; `cores`: the
    processes share one machine's cores, as in the check)."""
    share = max(1.0, p / cores) if cores else 1.0
    local = lambda n: setting.t_fixed_s + n * setting.t_sample_s  # noqa: E731
    b = setting.samples_per_host
    if sync == "gradients":
        return share * local(b) + (setting.sgd_steps + 3) * allreduce_s(p, 4 * setting.grad_floats, link)
    return share * local(p * b) + allgather_s(p, b * setting.bytes_per_sample, link)


def prediction(setting: Setting, p: int, sync: str, link: Link) -> dict:
    """Iteration time, env steps/s, which side bounds the run, and the expected lag (pure)."""
    t = iteration_s(setting, p, sync, link)
    learner_rate = p * setting.samples_per_host / t
    sampler_rate = p * setting.host_sampling_per_s
    rollout_s = setting.samples_per_host / setting.host_sampling_per_s  # one host's batch of samples
    bound = "learner" if learner_rate < sampler_rate else "samplers"
    lag = rollout_s / t if bound == "samplers" else None  # learner-bound: set by the buffer (module docstring)
    return {"hosts": p, "sync": sync, "iteration_ms": 1e3 * t, "env_steps_per_s": min(learner_rate, sampler_rate),
            "bound": bound, "lag_versions": lag}


def measured(bench: dict) -> dict:
    """Median iteration ms of each side of the committed bench_distributed run."""
    return {side: statistics.median(r["iteration_ms"] for r in runs) for side, runs in bench["runs"].items()}


def fitted_machine(bench: dict) -> tuple[Setting, Link]:
    """This machine's setting and loopback link from the bench (bench_distributed's run:
    Pendulum, 16 x 32 per chunk, 2 epochs x 4 minibatches, 64x64 networks)."""
    iters = measured(bench)
    one_2, one_4 = iters["1 process x 2 devices"] / 1e3, iters["1 process x 4 devices"] / 1e3
    t_sample = (one_4 - one_2) / (2048 - 1024)
    t_fixed = one_2 - 1024 * t_sample
    call = statistics.median(r["median_ms"] for r in bench["allreduce"]["2 processes x 1 device"]) / 1e3
    floats = bench["allreduce"]["2 processes x 1 device"][0]["floats"]
    link = Link("loopback (gloo, this machine)", call / 2, 1e10, "alpha: experiments/results/bench_distributed, "
                "half of one 2-process all-reduce call; beta: not limiting at these sizes (set 10 GB/s)")
    setting = Setting("bench_distributed (this machine)", 512, bench["args"]["sgd_steps_per_iteration"], floats,
                      BYTES_PER_SAMPLE_PENDULUM, t_fixed, t_sample, 1e9, "fitted: 1 x 2 and 1 x 4 devices")
    return setting, link


# Bytes of one transition of the bench's Pendulum chunk (obs 3, final obs 3, action 1, reward,
# flags, log-prob, version, ...): float32 / int32 leaves of `Trajectory.transitions`.
BYTES_PER_SAMPLE_PENDULUM = 4 * 13

NETWORK_RTT_S = 50e-6  # a datacenter TCP round trip (assumed)


def links(loopback: Link) -> tuple[Link, ...]:
    """The interconnects of the predictions: CPU hosts on 25 Gb/s Ethernet with gloo (its per-step
    software cost as measured here on loopback, plus a network round trip), GPUs on InfiniBand
    with NCCL."""
    return (
        Link("25 Gb/s Ethernet, gloo over TCP", loopback.alpha_s + NETWORK_RTT_S, 25e9 / 8,
             f"line rate: IEEE 802.3by (25GBASE-R); alpha: gloo's {1e3 * loopback.alpha_s:.2f} ms per step measured "
             f"here on loopback + an assumed {1e6 * NETWORK_RTT_S:.0f} us round trip"),
        Link("200 Gb/s InfiniBand HDR, NCCL", 10e-6, 200e9 / 8,
             "line rate: InfiniBand HDR (IBTA); alpha: assumed 10 us per step (small-message NCCL latency, not "
             "measured here)"),
    )


def settings(machine: Setting, sync_default_env_steps_per_s: float) -> tuple[Setting, ...]:
    """The seed's setting on CPU hosts (one host as measured here) and a GPU learner (assumed)."""
    t_host = 1024 / sync_default_env_steps_per_s  # one sync iteration of the default: rollout + update
    seed = Setting("seed default (16 x 64 per host, 5 x 16 SGD steps, 64x64), CPU hosts", 1024, 80, machine.grad_floats,
                   BYTES_PER_SAMPLE_PENDULUM, 0.0, t_host / 1024, sync_default_env_steps_per_s,
                   f"t_local(n) = n x {1e6 * t_host / 1024:.2f} us: the default's sync rate here (rollout included: an "
                   f"upper bound), experiments/results/bench_sync ({sync_default_env_steps_per_s:,.0f} env steps/s); "
                   "sampling per host at least that rate")
    gpu = Setting("GPU learner (2,048 envs x 32 steps per host, 4 x 32 SGD steps, 256x256)", 65_536, 128, 200_000,
                  4 * 100, 20e-3, 0.3e-6, 500_000.0,
                  "assumed, not measured here: 20 ms + 0.3 us per sample per iteration on one GPU; 500k env steps/s "
                  "of GPU simulation per host; 100 floats per sample")
    return seed, gpu


@dataclasses.dataclass(frozen=True)
class Args:
    out: str | None = None
    """Output directory (default runs/experiments/scaling_model; publish with --out experiments/results/scaling_model)."""
    hosts: tuple[int, ...] = (8, 32, 128)
    """Host counts to predict."""


def check_lines(bench: dict) -> tuple[list[str], list[dict]]:
    setting, link = fitted_machine(bench)
    iters = measured(bench)
    lines = [f"fitted on this machine: t_local(n) = {1e3 * setting.t_fixed_s:.1f} ms + n x {1e6 * setting.t_sample_s:.2f} us; "
             f"alpha = {1e3 * link.alpha_s:.3f} ms per all-reduce step (loopback gloo)", "",
             "check against the measured iterations (2 cores shared by the processes):",
             f"{'side':<36}{'measured ms':>12}{'model ms':>10}{'model/measured':>16}"]
    rows = []
    for side, p, sync in (("2 processes x 1 device", 2, "batch"), ("2 processes x 1 device, gradients", 2, "gradients"),
                          ("4 processes x 1 device", 4, "batch")):
        model = 1e3 * iteration_s(setting._replace(samples_per_host=512), p, sync, link, cores=bench["machine"]["cpu_count"])
        rows.append({"side": side, "measured_ms": iters[side], "model_ms": model})
        lines.append(f"{side:<36}{iters[side]:>12.1f}{model:>10.1f}{model / iters[side]:>15.2f}x")
    return lines, rows


def predict_lines(bench: dict, sync_bench: dict, hosts: tuple[int, ...]) -> tuple[list[str], list[dict]]:
    machine, loopback = fitted_machine(bench)
    lines, rows = [], []
    for setting in settings(machine, sync_bench["shapes"]["default"]["user"]):
        lines += ["", f"{setting.name}", f"  ({setting.source})"]
        for link in links(loopback):
            lines.append(f"  {link.name} (alpha {1e6 * link.alpha_s:.0f} us, {8 * link.beta_bytes_per_s / 1e9:.0f} Gb/s: {link.source})")
            lines.append(f"    {'hosts':>6}{'sync':>11}{'iteration ms':>14}{'env steps/s':>14}{'bound':>10}{'lag':>7}")
            for p in (1, *hosts):
                for sync in ("batch", "gradients"):
                    r = prediction(setting, p, sync, link)
                    rows.append({"setting": setting.name, "link": link.name, **r})
                    lag = "buffer" if r["lag_versions"] is None else f"{r['lag_versions']:.1f}"
                    lines.append(f"    {p:>6}{sync:>11}{r['iteration_ms']:>14.1f}{r['env_steps_per_s']:>14,.0f}"
                                 f"{r['bound']:>10}{lag:>7}")
    return lines, rows


def main(args: Args) -> None:
    out = args.out or default_out("scaling_model", REPO)
    with open(BENCH, encoding="utf-8") as f:
        bench = json.load(f)
    with open(SYNC_BENCH, encoding="utf-8") as f:
        sync_bench = json.load(f)
    with Manifest(out):
        check, check_rows = check_lines(bench)
        predicted, predicted_rows = predict_lines(bench, sync_bench, args.hosts)
        text = "\n".join(["scaling model (issue 29 item 5); inputs: experiments/results/bench_distributed/cpu.json, "
                          "experiments/results/bench_sync/cpu.json", "",
                          *check, "", "predictions (per learner iteration; lag in policy versions):", *predicted])
        print(text)
        write_report(out, "model.json", {"check": check_rows, "predictions": predicted_rows}, "report.txt", text)


if __name__ == "__main__":
    main(tyro.cli(Args))
