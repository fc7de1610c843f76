"""Several processes (jax.distributed over 127.0.0.1, CPU, one device per process): the
multi-process learner update against the one-process updates, a 2-process threaded run
through `launch` (identical params on both, the accounting identity, a run directory that
`eval` loads), a killed process ending the other with a clear error, the launcher's exit
statuses and the pure pieces (device order, stats merge, the global row, option parsing)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import resource
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppo_async as pa
from ppo_async.runtime import distributed, launch
from ppo_async.runtime.buffer import ChunkTag
from ppo_async.cli.train import distributed_layout
from ppo_async.config import ConfigError, DistributedConfig
from ppo_async.core.rollout import merge_rollout_stats
from ppo_async.core.types import RolloutStats, RunningMeanStd

from conftest import REPO_ROOT, run_module

TINY = ["--mode", "threaded", "--env", "Pendulum-v1", "--rollout.num-envs", "4", "--rollout.num-steps", "16",
        "--ppo.num-epochs", "1", "--ppo.num-minibatches", "2", "--network.actor-hidden", "16",
        "--network.critic-hidden", "16"]


def dist(process_id: int, port: int, num_processes: int = 2) -> list[str]:
    return ["--distributed.num-processes", str(num_processes), "--distributed.process-id", str(process_id),
            "--distributed.coordinator-address", f"127.0.0.1:{port}"]


# --------------------------------------------------------------------------------------
# config and pure pieces
# --------------------------------------------------------------------------------------


def test_distributed_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"distributed.process_id = None .*must be set \(0 .. 1\)"):
        DistributedConfig(num_processes=2, coordinator_address="127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"distributed.process_id = 2 .*< distributed.num_processes = 2"):
        DistributedConfig(num_processes=2, process_id=2, coordinator_address="127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"distributed.coordinator_address = 'localhost' .*host:port"):
        DistributedConfig(num_processes=2, process_id=0, coordinator_address="localhost")
    with pytest.raises(ConfigError, match=r"distributed.process_id = 0 has no effect"):
        DistributedConfig(process_id=0)
    with pytest.raises(ConfigError, match=r"distributed.heartbeat_timeout_s = 30 has no effect"):
        DistributedConfig(heartbeat_timeout_s=30)
    with pytest.raises(ConfigError, match=r"mode = 'sync' is invalid: must be 'threaded' with distributed.num_processes = 2"):
        pa.Config(distributed=DistributedConfig(num_processes=2, process_id=0, coordinator_address="127.0.0.1:1"))
    config = pa.Config(mode="threaded", rollout=pa.RolloutConfig(num_envs=4, num_steps=16), total_env_steps=1024,
                       distributed=DistributedConfig(num_processes=2, process_id=1, coordinator_address="127.0.0.1:9"))
    assert (config.local_batch_size, config.batch_size, config.num_iterations) == (64, 128, 8)
    with pytest.raises(ConfigError, match=r"distributed.learner_sync = 'batch' has no effect"):
        DistributedConfig(learner_sync="batch")
    with pytest.raises(ConfigError, match=r"distributed.learner_sync = 'all' is invalid"):
        DistributedConfig(num_processes=2, process_id=0, coordinator_address="127.0.0.1:1", learner_sync="all")
    # auto: the batch gathered up to 65,536 samples per iteration (every process's), else gradients all-reduced
    two = lambda envs, sync="auto": pa.Config(  # noqa: E731
        mode="threaded", rollout=pa.RolloutConfig(num_envs=envs, num_steps=64), total_env_steps=10**6,
        distributed=DistributedConfig(num_processes=2, process_id=0, coordinator_address="127.0.0.1:9", learner_sync=sync))
    assert (two(512).batch_size, two(512).learner_sync) == (65_536, "batch")
    assert (two(1024).batch_size, two(1024).learner_sync) == (131_072, "gradients")
    assert two(16, "gradients").learner_sync == "gradients" and two(1024, "batch").learner_sync == "batch"


def test_distributed_section_is_read_from_the_command_line_before_parsing():
    d = distributed_layout(["--env", "CartPole-v1", *dist(1, 1234), "--distributed.heartbeat-timeout-s=7"])
    assert (d.num_processes, d.process_id, d.coordinator_address, d.heartbeat_timeout_s) == (2, 1, "127.0.0.1:1234", 7)
    assert distributed_layout(["--env", "CartPole-v1"]) is None
    file_section = {"distributed": {"num_processes": 2, "process_id": 0, "coordinator_address": "127.0.0.1:9"}}
    assert distributed_layout(["--distributed.process-id", "1"], file_section).process_id == 1  # the flag wins
    with pytest.raises(ConfigError, match="distributed.process_id"):
        distributed_layout(["--distributed.num-processes", "2", "--distributed.coordinator-address", "a:1"])


SLURM = {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "node[003-004],login1", "SLURM_NTASKS": "2", "SLURM_PROCID": "1",
         "SLURM_LOCALID": "0"}


def test_distributed_cluster_is_checked_and_gives_the_layout_of_the_slurm_task(monkeypatch):
    with pytest.raises(ConfigError, match=r"distributed.cluster = 'pbs' is invalid: must be one of \('none', 'slurm'\)"):
        DistributedConfig(cluster="pbs")
    with pytest.raises(ConfigError, match=r"distributed.num_processes = 2 .*must be left unset with distributed.cluster = 'slurm'"):
        DistributedConfig(cluster="slurm", num_processes=2)
    with pytest.raises(ConfigError, match=r"distributed.cluster = 'slurm' is invalid: the layout it gives is not filled in"):
        pa.Config(mode="threaded", distributed=DistributedConfig(cluster="slurm"))
    for name in [*SLURM, "JAX_COORDINATOR_PORT"]:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match=r"distributed.cluster = 'slurm' is invalid here: .*finds no slurm task environment"):
        distributed.resolve_cluster(DistributedConfig(cluster="slurm"))
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    asked = distributed_layout(["--distributed.cluster", "slurm", "--distributed.heartbeat-timeout-s", "5"])
    d = distributed.resolve_cluster(asked)  # JAX's port for the job: 4242 mod 4096 + 61440
    assert (d.num_processes, d.process_id, d.coordinator_address, d.heartbeat_timeout_s) == (2, 1, f"node003:{4242 % 4096 + 61440}", 5)
    assert distributed.resolve_cluster(d) == d and distributed.cluster_flags(d) == [
        "--distributed.num-processes", "2", "--distributed.process-id", "1", "--distributed.coordinator-address", d.coordinator_address]
    with pytest.raises(ConfigError, match=r"gives .*\(2, 1, 'node003:.*but the section sets \(2, 0, "):
        distributed.resolve_cluster(dataclasses.replace(d, process_id=0))
    monkeypatch.setenv("SLURM_NTASKS", "1")
    with pytest.raises(ConfigError, match="the slurm job has 1 task"):
        distributed.resolve_cluster(asked)
    with pytest.raises(ConfigError, match="leave out --distributed.cluster"):
        launch.split_launch_args(["--num-processes", "2", "--", "train", "--distributed.cluster", "slurm"])


def test_two_processes_join_with_their_layout_from_a_slurm_environment():
    """`train --distributed.cluster slurm` in 2 local processes with faked SLURM variables:
    each reads its layout through JAX's detection, both join over 127.0.0.1, and the full
    parse sees 2 processes (it then refuses mode sync for them: status 2 in both, after joining;
    a process that could not join would wait for the other until the test's timeout)."""
    port = str(launch.free_port())
    env = [{**os.environ, **SLURM, "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_PROCID": str(p), "SLURM_LOCALID": str(p),
            "JAX_COORDINATOR_PORT": port} for p in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "ppo_async", "train", "--mode", "sync", "--distributed.cluster", "slurm"],
                              cwd=REPO_ROOT, env=env[p], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for p in range(2)]
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        _end_processes(procs)
    for proc, err in zip(procs, errs):
        assert proc.returncode == 2 and "Traceback" not in err, err[-3000:]
        assert "error: --mode = 'sync' is invalid: must be 'threaded' with distributed.num_processes = 2" in err, err[-3000:]


class FakeDevice:
    def __init__(self, id: int, process_index: int):
        self.id, self.process_index = id, process_index

    def __repr__(self):
        return f"d{self.id}@p{self.process_index}"


def test_global_learner_devices_take_the_same_local_positions_in_process_order():
    devices = [FakeDevice(i, i // 4) for i in range(8)]  # 2 processes x 4 devices
    mine = [devices[6], devices[7]]  # this process (1) learns on its last two devices
    assert [d.id for d in distributed.global_learner_devices(mine, devices)] == [2, 3, 6, 7]
    assert [d.id for d in distributed.global_learner_devices([devices[0]], devices)] == [0, 4]


def test_merged_stats_of_two_shares_equal_the_stats_of_the_whole():
    x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (10, 3)) * 2.0 + 1.0)

    def stats(rows):
        return RolloutStats(jnp.float32(rows.sum()), jnp.float32(2 * len(rows)), jnp.float32(len(rows)),
                            RunningMeanStd(jnp.asarray(rows.mean(0)), jnp.asarray(rows.var(0)), jnp.float32(len(rows))),
                            RunningMeanStd(jnp.asarray(rows[:, 0].mean()), jnp.asarray(rows[:, 0].var()), jnp.float32(len(rows))),
                            jnp.int32(0))

    merged = merge_rollout_stats([stats(x[:4]), stats(x[4:])])
    whole = stats(x)
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(whole)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_global_row_sums_the_processes_and_lists_every_sampler():
    def local(produced, consumed, resident, sid, version, fill):
        return {"samples_produced": produced, "samples_consumed": consumed, "samples_dropped": produced - consumed - resident,
                "samples_resident": resident, "dropped_forced_refresh": 0, "dropped_overwritten": produced - consumed - resident,
                "dropped_stale_total": 0, "sampler_id": sid, "behavior_version": version, "buffer_fill": fill,
                "lag_mean_local": 1.0, **{name: [1.0, 2.0] for name in distributed.SAMPLER_COLUMNS}}

    own = {"iteration": 3, "lag_histogram": [64, 64], "approx_kl": 0.01, **local(256, 192, 64, 1, 2, 0.5)}
    summaries = [distributed.process_summary(own, [{"iteration": 3, "sampler_id": 1, "policy_version": 2}]),
                 distributed.process_summary(local(320, 192, 64, 0, 1, 0.25), [{"iteration": 3, "sampler_id": 0, "policy_version": 1}])]
    row, records = distributed.global_row(own, summaries, num_samplers=2, batch_size=128)
    assert row["samples_produced"] == 576 and row["samples_consumed"] == 384 and row["samples_resident"] == 128
    assert row["samples_produced"] == row["samples_consumed"] + row["samples_dropped"] + row["samples_resident"]
    assert row["process_samples_produced"] == [256, 320] and row["env_steps"] == 384
    assert row["sampler_id"] == [1, 2] and row["behavior_version"] == [2, 1]  # global ids p * 2 + s
    assert row["sampler_steps_per_second"] == [1.0, 2.0, 1.0, 2.0] and row["approx_kl"] == 0.01
    assert [(r["process_id"], r["sampler_id"]) for r in records] == [(0, 1), (1, 2)]


class SlowKeyValueStore:
    """The coordination service's key-value calls with `delay_s` added to each (a store far
    slower than an iteration); thread-safe, blocking gets wake when the key is written."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.values, self.calls, self.callers = delay_s, {}, 0, {}
        self.changed = threading.Condition()

    def _call(self) -> None:
        time.sleep(self.delay_s)
        with self.changed:
            self.calls += 1
            name = threading.current_thread().name
            self.callers[name] = self.callers.get(name, 0) + 1

    def key_value_set(self, key: str, value: str) -> None:
        self._call()
        with self.changed:
            self.values[key] = value
            self.changed.notify_all()

    def key_value_delete(self, key: str) -> None:
        self._call()
        with self.changed:
            self.values.pop(key, None)

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        self._call()
        with self.changed:
            return [(k, v) for k, v in self.values.items() if k.startswith(prefix)]

    def blocking_key_value_get(self, key: str, timeout_ms: int) -> str:
        self._call()
        with self.changed:
            if self.changed.wait_for(lambda: key in self.values, timeout_ms / 1000):
                return self.values[key]
        raise RuntimeError(f"DEADLINE_EXCEEDED: {key}")


def test_a_slow_key_value_store_is_on_no_process_iteration_path():
    """Issue 29: 40 iterations 10 ms apart over a store that takes 0.2 s per call (one call per
    iteration would take 8 s). Process 1 hands each summary over without waiting for the store;
    process 0 reads a batch of iterations per call and builds every global row, in order,
    with the accounting identity, about as fast as the iterations come."""
    store, iterations, period, delay = SlowKeyValueStore(0.2), 40, 0.01, 0.2
    cfg = lambda pid: pa.Config(mode="threaded", num_samplers=1, threaded=pa.ThreadedConfig(timeout_s=30.0),  # noqa: E731
                                distributed=DistributedConfig(num_processes=2, process_id=pid, coordinator_address="127.0.0.1:1"))
    exchanges = [distributed.Exchange(cfg(p), client=store) for p in (0, 1)]

    def row(pid, i):
        return {"iteration": i, "lag_histogram": [cfg(0).batch_size], "samples_produced": 1024 * i + 64 * pid, "samples_consumed": 512 * i,
                "samples_dropped": 0, "samples_resident": 512 * i + 64 * pid, "dropped_forced_refresh": 0,
                "dropped_overwritten": 0, "dropped_stale_total": 0, "sampler_id": 0, "behavior_version": i - 1,
                "buffer_fill": 0.5, "lag_mean_local": 1.0, **{name: [1.0] for name in distributed.SAMPLER_COLUMNS}}

    def process_1():
        for i in range(1, iterations + 1):
            exchanges[1].iteration_rows(row(1, i), [], cfg(1), should_stop=lambda: False)
            time.sleep(period)
        exchanges[1].mark_done()

    sender = threading.Thread(target=process_1, name="process-1-iterations")
    sender.start()
    merged = [exchanges[0].iteration_rows(row(0, i), [], cfg(0), should_stop=lambda: False) for i in range(1, iterations + 1)]
    sender.join(60)
    # events, not durations: process 1's iteration thread called the store once, to mark itself
    # done after its last iteration (its summaries go through a thread of their own), and
    # process 0 read them in batches
    assert store.callers["process-1-iterations"] == 1, store.callers
    assert store.calls < iterations, store.calls  # batched: not one 0.2 s call per iteration
    for i, (global_row, _) in enumerate(merged, start=1):
        assert global_row["iteration"] == i and global_row["process_samples_produced"] == [1024 * i, 1024 * i + 64]
        assert global_row["samples_produced"] == (global_row["samples_consumed"] + global_row["samples_dropped"]
                                                  + global_row["samples_resident"])
        assert global_row["exchange_wait_s"] >= 0.0
    assert not [k for k in store.values if "/summary/" in k]  # read and deleted


def test_local_take_drops_whole_chunks_beyond_max_lag():
    tags = [ChunkTag(0, 0.0, 5), ChunkTag(1, 0.0, 2)]
    assert distributed.local_take(tags, 6, max_lag=2, chunk_size=64) == (64, 64, 2.5)
    assert distributed.local_take(tags, 6, max_lag=None, chunk_size=64) == (128, 0, 2.5)


def test_launch_parsing_and_exit_statuses():
    assert launch.split_launch_args(["--num-processes", "2", "--", "train", "--env", "CartPole-v1"]) == (
        ["--num-processes", "2"], ["--env", "CartPole-v1"])
    assert launch.split_launch_args(["--help"]) is None
    with pytest.raises(ConfigError, match="-- train"):
        launch.split_launch_args(["--num-processes", "2"])
    with pytest.raises(ConfigError, match="leave out --distributed.process-id"):
        launch.split_launch_args(["--num-processes", "2", "--", "train", "--distributed.process-id", "1"])
    assert launch.process_args(["--env", "X"], 2, 1, "127.0.0.1:5") == [
        "train", "--env", "X", "--distributed.num-processes", "2", "--distributed.process-id", "1",
        "--distributed.coordinator-address", "127.0.0.1:5"]
    assert launch.exit_status(-9) == 137 and launch.exit_status(2) == 2
    assert launch.first_failure([(1.0, 0, 0), (3.0, 1, -6), (2.0, 2, 1)]) == (2, 1)
    assert launch.first_failure([(1.0, 0, 0)]) is None
    # process 1 stopped because process 0 failed (status 4) and left first: process 0 is the failure
    assert launch.first_failure([(2.5, 0, 2), (1.0, 1, 4)]) == (0, 2)
    assert launch.first_failure([(2.5, 0, 4), (1.0, 1, 4)]) == (1, 4)


def test_launch_refuses_bad_train_options_before_starting_anything(cli_main):
    done = cli_main(["launch", "--num-processes", "2", "--", "train", "--mode", "sync"])
    assert done.returncode == 2 and "must be 'threaded' with distributed.num_processes = 2" in done.stderr
    assert "[0]" not in done.stdout  # no process started


class FakeKeyValueStore:
    """The coordination service's key-value calls `distributed` makes (one dict, thread-safe enough for a test)."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.sets: list[str] = []

    def key_value_set(self, key: str, value: str) -> None:
        self.values[key] = value
        self.sets.append(key)

    def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
        return [(k, v) for k, v in list(self.values.items()) if k.startswith(prefix)]


class CountingKeyValueStore(FakeKeyValueStore):
    """FakeKeyValueStore with the heartbeat's counter call."""

    def key_value_increment(self, key: str, amount: int) -> int:
        value = int(self.values.get(key, "0")) + amount
        self.values[key] = str(value)
        return value


def test_a_peer_killed_before_its_heartbeat_thread_beats_is_named_dead():
    """A process can pass the start barrier and die within its heartbeat thread's first period
    (tiny iterations): the first beat is written before `start_heartbeat` returns, so its
    counter exists and stands still, and its peer names it after half the heartbeat timeout
    (measured before: 5 of 16 such kills ended the survivor with JAX's SIGABRT instead)."""
    store = CountingKeyValueStore()
    cfg = lambda pid: pa.Config(mode="threaded", distributed=DistributedConfig(  # noqa: E731
        num_processes=2, process_id=pid, coordinator_address="127.0.0.1:1", heartbeat_timeout_s=1))
    peer = distributed.Exchange(cfg(1), client=store)
    peer.start_heartbeat(every_s=60.0)  # its thread would beat only after a minute: "killed" before that
    assert store.values[distributed.KEY_PREFIX + "run/alive/1"] == "1"
    peer.stop_heartbeat()
    told: list[str] = []
    survivor = distributed.Exchange(cfg(0), client=store)
    start = time.monotonic()
    survivor.start_heartbeat(told.append, every_s=0.02)
    try:
        deadline = start + 5.0
        while not told and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        survivor.stop_heartbeat()
    assert told and told[0].startswith("process 1 died (no heartbeat for 0.5s"), told
    assert told[0].endswith("; process 0 stopped with it"), told  # the line the survivor ends with, whichever path
    assert 0.5 <= time.monotonic() - start < 3.0


def test_silence_watch_names_counters_that_stood_still_too_long():
    watch = distributed.SilenceWatch(silence_s=1.0)
    assert watch.update({1: "1", 2: "1"}, now=0.0) == set()
    assert watch.update({1: "2", 2: "1"}, now=0.9) == set()  # 2 still for 0.9 s: not yet
    assert watch.update({1: "3", 2: "1"}, now=1.5) == {2}  # 2 still since 0.0
    assert watch.update({1: "3", 2: "2"}, now=2.2) == set()  # 1 still since 1.5 (0.7 s), 2 moved again
    assert watch.update({1: "3", 2: "3"}, now=2.6) == {1}


def test_process_0_leaves_after_a_failure_only_once_the_others_have_ended_or_gone_silent(time_bound):
    """Process 0 hosts the coordination service the others learn of a failure through: it
    waits for them (ended, done, or a heartbeat that stood still), the others do not."""
    run = distributed.KEY_PREFIX + "run/"
    layout = lambda pid: DistributedConfig(num_processes=3, process_id=pid, coordinator_address="127.0.0.1:1",
                                           heartbeat_timeout_s=1, initialization_timeout_s=5)
    store = FakeKeyValueStore()
    t0 = time.monotonic()
    distributed.leave_after_failure("ValueError: boom", client=store, joined=layout(1))  # a peer: no wait
    assert time.monotonic() - t0 < time_bound(distributed.LEAVE_GRACE_S)  # not even process 0's grace
    assert store.values[run + "failed/1"] == "ValueError: boom" and store.values[run + "ended/1"] == "1"

    store = FakeKeyValueStore()
    store.values[run + "failed/0"] = "RuntimeError: learner"  # reported earlier (Exchange.blame): kept
    store.values[run + "alive/2"] = "7"  # process 2's heartbeat, standing still from now on
    threading.Timer(0.8, store.key_value_set, (run + "ended/1", "1")).start()
    t0 = time.monotonic()
    distributed.leave_after_failure("exit status 1", client=store, joined=layout(0))
    waited = time.monotonic() - t0
    assert store.values[run + "failed/0"] == "RuntimeError: learner" and store.values[run + "ended/0"] == "1"
    # process 1 ended at 0.8 s, process 2 went silent at 0.5 s (half the heartbeat timeout); then the grace
    assert 0.8 + distributed.LEAVE_GRACE_S <= waited < 0.8 + distributed.LEAVE_GRACE_S + time_bound(1.0), waited

    store = FakeKeyValueStore()  # a peer the heartbeat watchdog declared dead is not waited for
    store.values[run + "dead/1"] = store.values[run + "dead/2"] = "1"
    t0 = time.monotonic()
    distributed.leave_after_failure("process 1 died", report=False, client=store, joined=layout(0))
    assert time.monotonic() - t0 < distributed.LEAVE_GRACE_S + time_bound(0.3) and run + "failed/0" not in store.values

    store = FakeKeyValueStore()  # an inherited failure is not reported as this process's own
    distributed.leave_after_failure("process 0 failed: x", report=False, client=store, joined=layout(2))
    assert run + "failed/2" not in store.values and store.values[run + "ended/2"] == "1"
    distributed.leave_after_failure("x", client=store, joined=DistributedConfig())  # one process: nothing
    assert store.sets == [run + "ended/2"]


def test_launch_returns_the_failure_and_every_process_says_why(tmp_path):
    """A run that fails in every process once they have joined (threaded mode takes one seed,
    checked when the run starts): each process ends with one clear line, none is aborted by
    JAX, and `launch` exits with the failure's status."""
    done = run_module(["launch", "--num-processes", "2", "--", "train", *TINY, "--num-seeds", "2", "--total-env-steps", "1280",
                       "--run-dir", str(tmp_path / "run"), "--quiet"], timeout=180)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-4000:]
    for p in range(2):
        assert f"[{p}] error: --num-seeds = 2 is invalid for mode='threaded': must be 1" in out, out[-4000:]
    assert "Traceback" not in out and "Check failure" not in out and "exit statuses [2, 2]" in out, out[-4000:]


# --------------------------------------------------------------------------------------
# subprocesses: the update, a run, a killed process
# --------------------------------------------------------------------------------------

UPDATE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from ppo_async.runtime.xla_flags import apply_cpu_workarounds
    apply_cpu_workarounds()
    import jax, numpy as np
    process_id, num_processes, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id)
    import ppo_async as pa
    from ppo_async.runtime import distributed, placement
    from ppo_async import envs
    from ppo_async.core import learner
    from ppo_async.modes.common import make_contexts
    from ppo_async.core.rollout import concat_trajectories, rollout
    from ppo_async.core.types import snapshot_of

    cfg = pa.Config(rollout=pa.RolloutConfig(num_envs=8, num_steps=16), ppo=pa.PPOConfig(num_epochs=3, num_minibatches=1))
    half = pa.Config(rollout=pa.RolloutConfig(num_envs=4, num_steps=16), ppo=pa.PPOConfig(num_epochs=3, num_minibatches=1))
    _, rctx, ctx = make_contexts(half)
    _, _, dp_ctx = make_contexts(cfg, axis_name=placement.LEARNER_AXIS)
    hp = learner.hyperparams_from_config(cfg)
    key = jax.random.PRNGKey(3)
    with jax.default_device(jax.local_devices()[0]):  # both halves, the same on every process
        state = learner.init_train_state(ctx, jax.random.PRNGKey(0), rctx.env.obs_shape)
        halves = [rollout(rctx, snapshot_of(state), envs.reset_envs(rctx.env, jax.random.PRNGKey(10 + p), 4),
                          jax.random.PRNGKey(20 + p))[1] for p in range(2)]
        whole = concat_trajectories(halves)
        ref, ref_m = jax.jit(lambda s, t, k, h: learner.ppo_update(ctx, s, t, k, h))(state, whole, key, hp)
    # 2 processes x 1 device: each gives its half
    update, place_state, place_traj = placement.learner_placement(dp_ctx, jax.devices(), multi_process=True)
    out, m = update(place_state(state), place_traj(halves[process_id]), place_state(key), place_state(hp))
    out = distributed.local_value(out)
    # learner_sync = "batch": the batch gathered from both processes, the single-device update on it
    b_update, b_place_state, b_place_traj = placement.learner_placement(ctx, jax.local_devices()[:1], gather_batch=True)
    batch_out, batch_m = b_update(b_place_state(state), b_place_traj(halves[process_id]), b_place_state(key), b_place_state(hp))
    diff = lambda a, b: max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    print("RESULT " + json.dumps({
        "devices": len(jax.devices()), "param_diff": diff(ref.params, out.params), "moved": diff(ref.params, state.params),
        "obs_stats_diff": diff(ref.obs_stats, out.obs_stats), "digest": distributed.params_digest(out.params),
        "kl": [float(ref_m["approx_kl"]), float(jax.device_get(distributed.local_value(m["approx_kl"])))],
        "consumed": int(jax.device_get(distributed.local_value(m["consumed"]))),
        "batch_param_diff": diff(ref.params, batch_out.params), "batch_obs_stats_diff": diff(ref.obs_stats, batch_out.obs_stats),
        "batch_digest": distributed.params_digest(batch_out.params), "batch_consumed": int(batch_m["consumed"]),
    }))
    """
)


def _result(proc: subprocess.Popen | subprocess.CompletedProcess, out: str) -> dict:
    assert proc.returncode == 0, out[-4000:]
    return json.loads([line for line in out.splitlines() if line.startswith("RESULT ")][-1][len("RESULT "):])


def test_update_over_two_processes_equals_one_device():
    """Each of two processes (one device each) runs the multi-process update (gradients all-reduced,
    and the batch gathered) and compares it with the single-device update of the whole batch
    computed in itself. (One process over several
    devices, `placement.learner_placement`, is checked against one device in test_data_parallel.)"""
    port = launch.free_port()
    procs = [subprocess.Popen([sys.executable, "-c", UPDATE_SCRIPT, str(p), "2", str(port)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in range(2)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    results = [_result(p, out) for p, out in zip(procs, outs)]
    assert [r["devices"] for r in results] == [2, 2]
    assert results[0]["moved"] > 1e-4  # the update moved the params: the comparison is not vacuous
    for r in results:  # equal to the single-device update of the whole batch
        assert r["param_diff"] < 1e-5 and r["obs_stats_diff"] < 1e-5
        assert r["kl"][1] == pytest.approx(r["kl"][0], rel=1e-3, abs=1e-7) and r["consumed"] == 8 * 16
    assert results[0]["digest"] == results[1]["digest"]  # bit-identical replicas
    for r in results:  # learner_sync = "batch": the very update of one device on the whole batch
        assert r["batch_param_diff"] == 0.0 and r["batch_obs_stats_diff"] < 1e-6 and r["batch_consumed"] == 8 * 16
    assert results[0]["batch_digest"] == results[1]["batch_digest"]


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dist") / "run"
    # barrier mode (the killed run below is asynchronous): every batch holds one fresh rollout of
    # 64 from each of the 2 x 2 samplers
    done = run_module(["launch", "--num-processes", "2", "--", "train", *TINY, "--threaded.barrier",
                       "--total-env-steps", str(256 * 12), "--checkpoint-every-steps", str(256 * 4), "--run-dir", str(run_dir), "--quiet"],
                      timeout=300)
    return run_dir, done


def test_two_process_run_keeps_identical_params_and_the_accounting(two_process_run):
    run_dir, done = two_process_run
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "[0] final return" in done.stdout and "[1] final return" not in done.stdout  # process 0 speaks for the run
    assert "launch: 2 processes connected (Gloo)" in done.stdout and "[Gloo]" not in done.stdout
    assert "launch: 2 processes done (exit status 0, 0); process 1: " in done.stdout  # process 1's end line, folded
    rows = pa.read_jsonl(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(1, 13))
    for r in rows:
        assert r["samples_produced"] == r["samples_consumed"] + r["samples_dropped"] + r["samples_resident"]
        assert r["samples_produced"] == sum(r["process_samples_produced"]) and len(r["process_samples_produced"]) == 2
        assert sum(r["lag_histogram"]) == 256 and r["env_steps"] == 256 * r["iteration"] and r["lag_max"] == 0
        assert r["process_samples_consumed"] == [128 * r["iteration"]] * 2
        assert len(r["sampler_steps_per_second"]) == 4 and sorted(r["sampler_id"]) == [0, 1, 2, 3]
    schedule = pa.read_jsonl(run_dir / "version_schedule.jsonl")
    assert {s["process_id"] for s in schedule} == {0, 1} and len(schedule) == 12 * 4
    digests = []
    for p in range(2):
        log = (run_dir / "logs" / f"process_{p}.log").read_text()
        assert "iteration 12:" in log
        digests.append(re.search(r"final params sha256 (\w+) at iteration 12", log).group(1))
    assert digests[0] == digests[1]
    policy = pa.load(run_dir)  # process 0's checkpoint holds the same params
    assert distributed.params_digest(policy.params) == digests[0]


def test_a_multi_process_run_directory_evaluates(two_process_run, cli_main):
    run_dir, done = two_process_run
    assert done.returncode == 0
    out = cli_main(["eval", str(run_dir), "--episodes", "2"])
    assert out.returncode == 0 and "mean return" in out.stdout and "iteration 12" in out.stdout


def test_a_process_whose_peers_never_join_says_so_and_exits_before_jax_aborts(tmp_path, time_bound):
    """Process 0 of 2 alone (its peer never starts) and process 1 of 2 alone (no coordinator at
    the address): each ends with exit 2 and one line naming `initialization_timeout_s` and what
    it waited for, soon after that limit - not JAX's SIGABRT and C++ stack dump (measured:
    `jax.distributed.initialize` aborts both roles at its limit)."""
    timeout_s = 2
    procs, started = [], time.time()
    for pid in range(2):
        args = [*TINY, "--run-dir", str(tmp_path / f"run{pid}"), "--distributed.initialization-timeout-s", str(timeout_s),
                *dist(pid, launch.free_port())]
        procs.append(subprocess.Popen([sys.executable, "-m", "ppo_async", "train", *args], cwd=REPO_ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        _end_processes(procs)
    took = time.time() - started
    for pid, (p, (_, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == distributed.JOIN_TIMEOUT_EXIT, (p.returncode, err[-3000:])
        assert f"distributed.initialization_timeout_s = {timeout_s}: process {pid} of 2 waited" in err, err[-3000:]
        assert "Check failure" not in err and "Traceback" not in err, err[-3000:]
    assert "the other processes" in outputs[0][1] and "process 0's coordinator" in outputs[1][1]
    assert took < timeout_s + distributed.JOIN_GRACE_S + time_bound(15)  # interpreter start + imports, then the limit


def _start_processes(args: list[str], port: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-m", "ppo_async", "train", *args, *dist(p, port)], cwd=REPO_ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in range(2)]


def _end_processes(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def _wait_for_rows(procs: list[subprocess.Popen], metrics, count: int, timeout: float = 180) -> int:
    """Waits until metrics.jsonl holds `count` whole rows; fails if a process ended before.
    Returns the rows written by then."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        rows = metrics.read_text().count("\n") if metrics.is_file() else 0
        if rows >= count:
            return rows
        ended = [p for p in procs if p.poll() is not None]
        assert not ended, ended[0].stderr.read()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"{metrics} did not reach {count} rows in {timeout:.0f}s")


FAULT_ARGS = [*TINY, "--total-env-steps", str(128 * 5000), "--quiet", "--distributed.heartbeat-timeout-s", "5"]
ABORTED = ("Traceback", "Check failure", "Fatal Python error", "Terminating process", "SIGABRT")


def _assert_survivor_said_why(proc: subprocess.Popen, err: str, took: float, failed: str, margin_s: float) -> None:
    """The survivor of a failed process: exit status 4 within the heartbeat timeout (5 s) +
    `margin_s` (10 s on idle cores, `time_bound`), one line naming the failed process, no
    traceback and no abort by JAX."""
    print(f"the survivor exited with status {proc.returncode} {took:.1f}s after the failure")
    assert proc.returncode == 4 and took < 5 + margin_s, (proc.returncode, took, err[-3000:])
    assert f"error: {failed}" in err, err[-3000:]
    assert not [word for word in ABORTED if word in err], err[-3000:]


def _assert_finalised(run_dir, last: int | None = None) -> list[dict]:
    """config.json and every metrics row whole, in order (up to `last`)."""
    assert (run_dir / "config.json").is_file()
    rows = pa.read_jsonl(run_dir / "metrics.jsonl")
    assert len(rows) >= 3 and [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert last is None or rows[-1]["iteration"] == last
    return rows


def test_a_killed_process_ends_the_other_with_an_error_naming_it(tmp_path, time_bound):
    run_dir = tmp_path / "run"
    procs = _start_processes([*FAULT_ARGS, "--run-dir", str(run_dir)], launch.free_port())
    try:
        _wait_for_rows(procs, run_dir / "metrics.jsonl", 3)
        os.kill(procs[1].pid, signal.SIGKILL)
        killed_at = time.time()
        _, err = procs[0].communicate(timeout=5 + time_bound(15))  # the heartbeat timeout + 10 s (+ margin)
        took = time.time() - killed_at
    finally:
        _end_processes(procs)
    _assert_survivor_said_why(procs[0], err, took, "process 1 died", time_bound(10))
    assert "process 0 stopped with it" in err, err[-3000:]
    _assert_finalised(run_dir)  # the run directory was finalised: every row whole


def test_process_0_raising_mid_run_ends_the_other_with_an_error_naming_it(tmp_path, time_bound):
    """Process 0 alone writes checkpoints: a plain file where its next checkpoint step
    directory goes makes its save raise (CheckpointError) in the middle of the run. Process 0
    exits with that error (status 2) once process 1 has ended, and process 1 names it."""
    run_dir, every = tmp_path / "run", 8
    metrics = run_dir / "metrics.jsonl"
    procs = _start_processes([*FAULT_ARGS, "--run-dir", str(run_dir), "--checkpoint-every-steps", str(every * 128)],
                              launch.free_port())  # batch: 64 x 2 processes
    try:
        seen = _wait_for_rows(procs, metrics, 1)
        step = -(-(seen + 6) // every) * every  # a checkpoint step 6 or more iterations ahead
        (run_dir / "checkpoints").mkdir(exist_ok=True)  # (made at the first save, which may come later)
        (run_dir / "checkpoints" / str(step)).write_text("not a checkpoint\n")
        _wait_for_rows(procs[1:], metrics, step)  # process 0 writes the row, then fails to checkpoint it
        failed_at = time.time()
        _, err1 = procs[1].communicate(timeout=5 + time_bound(15))
        took = time.time() - failed_at
        _, err0 = procs[0].communicate(timeout=30)
    finally:
        _end_processes(procs)
    assert procs[0].returncode == 2 and "is not a complete checkpoint" in err0, err0[-3000:]
    _assert_survivor_said_why(procs[1], err1, took, "process 0 failed: CheckpointError", time_bound(10))
    _assert_finalised(run_dir, last=step)


def test_process_1_raising_mid_run_ends_the_other_with_an_error_naming_it(tmp_path, time_bound):
    """Process 1 writes one file, its log: with its file-size limit lowered to that log's size
    (a full disk quota, say), its next log line raises OSError (EFBIG; Python ignores SIGXFSZ)
    in the middle of the run. Process 0 names it and finalises the run directory. (Gradients
    all-reduced across processes here: the other fault tests gather the batch, the default.)"""
    run_dir = tmp_path / "run"
    procs = _start_processes([*FAULT_ARGS, "--distributed.learner-sync", "gradients", "--run-dir", str(run_dir)],
                             launch.free_port())
    try:
        _wait_for_rows(procs, run_dir / "metrics.jsonl", 3)
        size = (run_dir / "logs" / "process_1.log").stat().st_size
        resource.prlimit(procs[1].pid, resource.RLIMIT_FSIZE, (size, size))
        failed_at = time.time()
        _, err0 = procs[0].communicate(timeout=5 + time_bound(15))
        took = time.time() - failed_at
        _, err1 = procs[1].communicate(timeout=30)
    finally:
        _end_processes(procs)
    assert procs[1].returncode == 1 and "File too large" in err1, err1[-3000:]
    _assert_survivor_said_why(procs[0], err0, took, "process 1 failed: OSError: [Errno 27] File too large", time_bound(10))
    _assert_finalised(run_dir)
