"""Liveness of a threaded run: a slow sampler that steps is alive, a stuck or dead one fails the run.

The rule by hand (`liveness.find_stall` at chosen instants), then real runs: a host simulator
and a JAX env's simulated latency, both far slower than `threaded.timeout_s`, finish; a sampler
hung inside its env, a sampler that ended, and threads that wait for each other each stop the
run with one line naming what is stuck. The tests assert events; each run is under a generous
hang guard only (`finish_within`), so they hold on a loaded machine.
"""

from __future__ import annotations

import threading
import time

import pytest

import ppo_async as pa
from ppo_async.config import ThreadedConfig
from ppo_async.envs.gymnasium import HostVectorEnv
from ppo_async.modes import threaded as threaded_module
from ppo_async.modes.threaded.liveness import (
    DEVICE,
    WAIT,
    WORK,
    BeatingEnv,
    Heartbeat,
    Phase,
    StalledThread,
    WatchClock,
    find_stall,
)
from ppo_async.runtime.buffer import RingBuffer

HANG_GUARD_S = 300.0  # only against a test that would otherwise hang: never reached when the code works

SMALL = dict(
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)),
)


def beating(kind: str, phase: str = "rollout", since: float = 0.0, last: float = 0.0) -> Heartbeat:
    """A heartbeat in `phase` (of `kind`) since `since`, last beaten at `last`."""
    return Heartbeat(current=Phase(phase, kind, since), last_beat=last)


# --------------------------------------------------------------------------------------
# the rule, by hand
# --------------------------------------------------------------------------------------


def test_a_working_thread_silent_past_the_timeout_is_stuck_and_named():
    beats = {"sampler-0": beating(WORK, "rollout", since=0.0, last=1.0), "learner": beating(WAIT, "data", last=9.0)}
    assert find_stall(beats, now=5.0, timeout_s=5.0) is None  # 4 s silent: within the limit
    thread, message = find_stall(beats, now=6.5, timeout_s=5.0)
    assert thread == "sampler-0"
    assert "sampler-0 is stuck" in message and "5.5s in rollout" in message and "threaded.timeout_s = 5" in message
    assert "\n" not in message


def test_a_new_phase_restarts_the_silence():
    """A sampler that waited long for room (no beat) and just began a rollout is not stuck."""
    beats = {"sampler-0": beating(WORK, "rollout", since=99.0, last=0.0)}
    assert find_stall(beats, now=100.0, timeout_s=5.0) is None


def test_waiting_and_computing_threads_are_not_judged_while_another_moves():
    beats = {"sampler-0": beating(DEVICE, "rollout", since=0.0, last=0.0),  # a long compiled rollout
             "sampler-1": beating(WAIT, "put", since=0.0, last=0.0),
             "learner": beating(WAIT, "data", since=0.0, last=0.0)}
    assert find_stall(beats, now=1000.0, timeout_s=5.0) is None


def test_threads_all_waiting_without_progress_wait_for_each_other():
    beats = {"sampler-0": beating(WAIT, "put", since=1.0, last=1.0), "learner": beating(WAIT, "data", since=2.0, last=0.5),
             "logger": beating(WAIT, "rows", since=0.0, last=3.0)}
    assert find_stall(beats, now=7.0, timeout_s=5.0) is None  # the logger's beat at 3.0 is 4 s old
    thread, message = find_stall(beats, now=9.0, timeout_s=5.0)
    assert thread == "run" and "wait for each other" in message and "no thread made progress for 6.0s" in message
    assert "sampler-0 waiting in put" in message and "learner waiting in data" in message and "\n" not in message


def test_a_dead_thread_is_named_and_the_watching_thread_is_not_judged():
    beats = {"sampler-0": beating(WAIT, "put", last=0.0), "logger": beating(WORK, "rows", since=0.0, last=0.0)}
    assert find_stall(beats, now=100.0, timeout_s=5.0, judged=("sampler-0",)) is None
    assert find_stall(beats, now=0.0, timeout_s=5.0, dead=("sampler-1",))[0] == "sampler-1"


def test_a_span_the_watch_did_not_see_is_forgiven_and_a_stuck_thread_is_still_named_after_it():
    """The process was suspended from t = 1 to t = 100: nobody watched, so the silence restarts at
    100; a thread that stays silent is named timeout_s after that, by looks every 0.1 s."""
    beats = {"sampler-0": beating(WORK, "rollout", since=0.0, last=1.0), "learner": beating(WAIT, "data", last=1.0)}
    clock = WatchClock(timeout_s=5.0)
    assert clock.look(beats, now=1.0) is False and clock.look(beats, now=3.4) is False  # 2.4 s <= 2.5 s: watched
    assert clock.look(beats, now=100.0) is True and clock.unwatched_s == pytest.approx(96.6)
    assert beats["sampler-0"].silent_for(100.0) == 0.0 and beats["sampler-0"].current.name == "rollout"
    assert find_stall(beats, now=100.0, timeout_s=5.0) is None  # without the clock: "stuck" after 99 s
    now = 100.0
    while find_stall(beats, now=now, timeout_s=5.0) is None:
        now = round(now + 0.1, 1)
        assert clock.look(beats, now) is False
    assert now == pytest.approx(105.1) and find_stall(beats, now, 5.0)[0] == "sampler-0"


def test_a_host_env_beats_at_every_step_and_is_otherwise_itself():
    class Env:
        discounted_return = 0.0

        def step(self, action):
            return action + 1

    env, heartbeat = Env(), Heartbeat()
    wrapped = BeatingEnv(env, heartbeat)
    assert wrapped.step(1) == 2 and wrapped.step(2) == 3 and heartbeat.beats == 2
    wrapped.discounted_return = 5.0  # the rollout advances the env's running return through the wrapper
    assert env.discounted_return == 5.0 == wrapped.discounted_return
    with pytest.raises(ValueError, match="kind"):
        heartbeat.enter("rollout", "busy")


# --------------------------------------------------------------------------------------
# real runs
# --------------------------------------------------------------------------------------


def finish_within(seconds: float, fn):
    """`fn()`'s result (or its exception, re-raised) from a daemon thread: a hang guard, not a
    duration assertion (a run that never ends fails the test instead of the suite hanging)."""
    out: dict = {}

    def body():
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=body, name="test-run", daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the run did not end within the {seconds:.0f}s hang guard"
    if "error" in out:
        raise out["error"]
    return out["result"]


def host_config(num_samplers: int, timeout_s: float, iterations: int, num_steps: int = 8) -> pa.Config:
    return pa.Config(env="gymnasium/Pendulum-v1", mode="threaded", total_env_steps=4 * num_steps * iterations,
                     rollout=pa.RolloutConfig(num_envs=4, num_steps=num_steps),
                     num_samplers=num_samplers, threaded=ThreadedConfig(timeout_s=timeout_s), **SMALL)


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ppo_async-sampler")]


def test_a_slow_host_simulator_that_steps_is_alive(monkeypatch):
    """Each rollout takes 16 env steps of >= 0.25 s: >= 2x timeout_s without a chunk for the
    learner (the learner used to give up after timeout_s); every step beats, so the run ends.
    (timeout_s = 2: a step may take up to 1.75 s more than its sleep on a loaded machine - with
    timeout_s = 1, one step of 1.3 s failed it on CI's two busy cores.)"""
    real_step = HostVectorEnv.step

    def slow_step(self, action):
        time.sleep(0.25)
        return real_step(self, action)

    monkeypatch.setattr(HostVectorEnv, "step", slow_step)
    config = host_config(num_samplers=1, timeout_s=2.0, iterations=1, num_steps=16)
    rows = finish_within(HANG_GUARD_S, lambda: pa.train(config)).metrics
    assert [r["iteration"] for r in rows] == [1]
    assert rows[0]["learner_wait_s"] > config.threaded.timeout_s  # the learner starved past it


def test_a_jax_sampler_with_a_long_simulated_latency_is_alive():
    """100 ms per env step x 16 steps after each compiled rollout: >= 1.6 s per chunk against
    timeout_s = 0.3; the latency is slept in beating slices, so the run ends."""
    config = pa.Config(mode="threaded", total_env_steps=2 * 128, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
                       num_samplers=1, threaded=ThreadedConfig(timeout_s=0.3, sampler_step_latency_ms=(100.0,)),
                       **SMALL)
    rows = finish_within(HANG_GUARD_S, lambda: pa.train(config)).metrics
    assert [r["iteration"] for r in rows] == [1, 2]
    assert max(r["learner_wait_s"] for r in rows) > config.threaded.timeout_s


def test_a_sampler_hung_in_its_env_stops_the_run_naming_it(monkeypatch):
    """Sampler 1's env never returns from its third step; sampler 0 keeps the learner fed, so
    the run goes on: only the hung thread's silence can stop it."""
    release, calls = threading.Event(), {"n": 0}
    real_step = HostVectorEnv.step

    def hanging_step(self, action):
        if threading.current_thread().name == "ppo_async-sampler-1":
            calls["n"] += 1
            if calls["n"] >= 3:
                release.wait(HANG_GUARD_S)  # hung (until the test lets it go)
        return real_step(self, action)

    monkeypatch.setattr(HostVectorEnv, "step", hanging_step)
    monkeypatch.setattr(threaded_module.run, "JOIN_TIMEOUT_S", 1.0)  # the hung thread is not waited for long
    config = host_config(num_samplers=2, timeout_s=1.0, iterations=100_000)
    try:
        with pytest.raises(StalledThread) as caught:
            finish_within(HANG_GUARD_S, lambda: pa.train(config))
    finally:
        release.set()
    message = str(caught.value)
    assert "thread sampler-1 is stuck" in message and "in rollout" in message and "\n" not in message
    assert isinstance(caught.value, TimeoutError)
    for thread in sampler_threads():  # released: it sees the stop and ends
        thread.join(HANG_GUARD_S)
    assert sampler_threads() == []


def test_threads_waiting_for_each_other_stop_the_run(monkeypatch):
    """A buffer that never takes a chunk: the sampler waits to put, the learner for data."""

    def never(self, chunk, timeout=1.0, **kwargs):
        time.sleep(0.05)
        return False

    monkeypatch.setattr(RingBuffer, "put", never)
    config = pa.Config(mode="threaded", total_env_steps=1000 * 128, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
                       num_samplers=1, threaded=ThreadedConfig(timeout_s=0.5), **SMALL)
    with pytest.raises(StalledThread, match=r"the threads wait for each other: no thread made progress") as caught:
        finish_within(HANG_GUARD_S, lambda: pa.train(config))
    assert "sampler-0 waiting in put" in str(caught.value) and "learner waiting in data" in str(caught.value)
    assert sampler_threads() == []


def test_a_sampler_thread_that_ended_stops_the_run(monkeypatch):
    monkeypatch.setattr(threaded_module.sampler.Sampler, "run", lambda self: None)  # (a bug: it ends silently)
    config = pa.Config(mode="threaded", total_env_steps=1000 * 128, rollout=pa.RolloutConfig(num_envs=8, num_steps=16),
                       num_samplers=2, threaded=ThreadedConfig(timeout_s=0.5), **SMALL)
    with pytest.raises(StalledThread, match=r"thread sampler-0 ended while the run was going on"):
        finish_within(HANG_GUARD_S, lambda: pa.train(config))

