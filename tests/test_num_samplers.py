"""The one sampler count, `Config.num_samplers`: what it resolves to in each mode
(`Config.effective_num_samplers`), the rules that count samplers (each naming num_samplers),
real runs with that many samplers, and its deprecated spellings `threaded.num_samplers` and
`lag.num_samplers`: set (Python, `replace`, `--set`, sweep grids, flags, config files) they
set num_samplers with a FutureWarning, beside a num_samplers of another value they are refused,
and a stored config (config.json, a checkpoint's, the committed benchmarks') converts silently
and compares equal to today's spelling."""

from __future__ import annotations

import glob
import json
import os
import threading
import warnings

import pytest

import ppo_async as pa
from ppo_async.config import (Config, ConfigError, LagConfig, NetworkConfig, PPOConfig, RolloutConfig, ThreadedConfig,
                              config_from_dict, config_to_dict, convert_deprecated_fields, replace_paths)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 8 * 16
TINY = dict(rollout=RolloutConfig(num_envs=8, num_steps=16), ppo=PPOConfig(num_epochs=1, num_minibatches=2),
            network=NetworkConfig(actor_hidden=(16,), critic_hidden=(16,)))
DEPRECATED = "is deprecated and goes in the next release"


def test_each_mode_resolves_its_samplers():
    """sync: one; threaded: None is 2 threads; simulated: None is 1 or what the schedule names;
    a barrier batch holds one chunk per sampler."""
    assert (Config().effective_num_samplers, Config(mode="simulated").effective_num_samplers) == (1, 1)
    threaded = Config(mode="threaded")
    assert (threaded.num_samplers, threaded.effective_num_samplers) == (None, 2)
    assert Config(mode="threaded", num_samplers=3).effective_num_samplers == 3
    per_sampler = Config(mode="simulated", lag=LagConfig(schedule="per_sampler", per_sampler=(0, 1, 4)))
    assert (per_sampler.num_samplers, per_sampler.effective_num_samplers) == (None, 3)
    assert Config(mode="simulated", num_samplers=5).effective_num_samplers == 5
    barrier = Config(mode="threaded", num_samplers=3, threaded=ThreadedConfig(barrier=True), **TINY)
    assert (barrier.effective_chunks_per_batch, barrier.batch_size) == (3, 3 * BATCH)
    free = Config(mode="threaded", num_samplers=3, **TINY)
    assert (free.effective_chunks_per_batch, free.batch_size) == (1, BATCH)
    assert Config(mode="threaded", threaded=ThreadedConfig(barrier=True), **TINY).batch_size == 2 * BATCH  # None: 2


@pytest.mark.parametrize("value", [1, 2])
def test_sync_mode_has_one_sampler_and_refuses_a_count(value):
    with pytest.raises(ConfigError, match=rf"^num_samplers = {value} has no effect: mode='sync' runs one sampler"):
        Config(num_samplers=value)
    with pytest.raises(ConfigError, match=r"^num_samplers = 0 is invalid: must be an integer >= 1$"):
        Config(mode="threaded", num_samplers=0)


RULES = [
    (lambda: Config(mode="threaded", threaded=ThreadedConfig(barrier=True),
                    lag=LagConfig(schedule="per_sampler", per_sampler=(0, 1, 2))),
     "lag.per_sampler = (0, 1, 2) is invalid: must list one lag per sampler (num_samplers = 2, the sampler threads)"),
    (lambda: Config(mode="simulated", num_samplers=2, lag=LagConfig(schedule="per_sampler", per_sampler=(0, 1, 2))),
     "lag.per_sampler = (0, 1, 2) is invalid: must list one lag per sampler (num_samplers = 2)"),
    (lambda: Config(mode="threaded", num_samplers=3, threaded=ThreadedConfig(sampler_step_latency_ms=(1.0, 1.0))),
     "threaded.sampler_step_latency_ms = (1.0, 1.0) is invalid: must list one latency per sampler (num_samplers = 3) "
     "or be empty"),
    (lambda: Config(mode="threaded", num_samplers=3, threaded=ThreadedConfig(barrier=True, chunks_per_batch=2)),
     "threaded.chunks_per_batch = 2 is invalid: must equal num_samplers = 3 with barrier=True (one rollout per sampler), "
     "or be None"),
    (lambda: Config(mode="threaded", num_samplers=4, threaded=ThreadedConfig(
        barrier=True, buffer_capacity=2 * BATCH, full_policy="overwrite_oldest"), **TINY),
     "threaded.buffer_capacity = 256 is invalid: must hold >= num_samplers = 4 chunks (512 transitions)"),
]


@pytest.mark.parametrize("build, message", RULES, ids=["per_sampler-barrier", "per_sampler-simulated", "latency",
                                                      "barrier-chunks", "buffer"])
def test_every_rule_that_counts_samplers_names_num_samplers(build, message):
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value).startswith(message), str(info.value)


def test_the_memory_estimate_and_the_kl_controller_count_the_runs_samplers():
    from ppo_async.config.resources import check_memory, memory_terms
    from ppo_async.modes.threaded.learner import controller_limits

    many = Config(mode="threaded", num_samplers=100_000, **TINY)
    snapshots = {t.name: t for t in memory_terms(many)}["sampler snapshots"]
    assert snapshots.fields[0] == "num_samplers"
    assert snapshots.bytes == 100_000 * {t.name: t for t in memory_terms(many.replace(num_samplers=1))}["sampler snapshots"].bytes
    with pytest.raises(ConfigError, match=r"^num_samplers = 100000 is invalid: the run needs at least .*sampler snapshots"):
        check_memory(many, limit_bytes=10**6)
    assert {t.name: t for t in memory_terms(Config(mode="threaded", **TINY))}["sampler snapshots"].bytes == (
        2 * snapshots.bytes // 100_000)  # None: 2 threads
    controlled = Config(mode="threaded", num_samplers=3, threaded=ThreadedConfig(kl_target=0.01), **TINY)
    assert controller_limits(controlled).num_samplers == 3


def test_a_threaded_run_with_three_samplers_starts_three_sampler_threads():
    seen: set[str] = set()

    def on_iteration(rows):
        seen.update(t.name for t in threading.enumerate() if t.name.startswith("ppo_async-sampler"))

    result = pa.train(Config(mode="threaded", num_samplers=3, total_env_steps=6 * BATCH, **TINY), on_iteration=on_iteration)
    assert len(seen) == 3, seen
    assert all(len(row["sampler_steps_per_second"]) == 3 for row in result.metrics)
    assert len(result.extras["sampler_stats"]) == 3


def test_a_simulated_run_with_a_per_sampler_schedule_of_three_emulates_three_samplers():
    config = Config(mode="simulated", lag=LagConfig(schedule="per_sampler", per_sampler=(0, 1, 2)),
                    total_env_steps=6 * BATCH, **TINY)
    rows = pa.train(config).metrics
    assert [r["sampler_id"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert [r["lag_max"] for r in rows[3:]] == [0, 1, 2]  # (after the warm-up, each sampler its own lag)


# ---------------------------------------------------------------------------- the deprecated spellings


@pytest.mark.parametrize("section, mode", [("threaded", "threaded"), ("lag", "simulated")])
def test_a_deprecated_spelling_sets_num_samplers_with_a_future_warning(section, mode):
    """`threaded.num_samplers = 3` / `lag.num_samplers = 3` is `num_samplers = 3`, said by a
    FutureWarning naming the new field and its value and pointing at the caller's line; the old
    field reads None again, so config.json, equality and resume see one spelling."""
    sections = {"threaded": ThreadedConfig(num_samplers=3)} if section == "threaded" else {"lag": LagConfig(num_samplers=3)}
    with pytest.warns(FutureWarning, match=rf"^{section}.num_samplers = 3 {DEPRECATED}: use num_samplers = 3 ") as caught:
        config = Config(mode=mode, **sections)
    assert caught[0].filename == __file__
    assert (config.num_samplers, config.effective_num_samplers, getattr(config, section).num_samplers) == (3, 3, None)
    assert config == Config(mode=mode, num_samplers=3)
    data = config_to_dict(config)
    assert (data["num_samplers"], data[section]["num_samplers"]) == (3, None)
    assert "num_samplers" not in config.preset_fields


def test_every_entry_point_takes_a_deprecated_spelling_with_a_warning():
    """`Config.replace`, `replace_paths` (`--set`) and sweep grids: the alias sets num_samplers,
    over the count the config had."""
    from ppo_async.study.sweep import expand_grid

    base = Config(mode="threaded", num_samplers=2, **TINY)
    with pytest.warns(FutureWarning, match=rf"^threaded.num_samplers = 4 {DEPRECATED}"):
        assert base.replace({"threaded.num_samplers": 4}).num_samplers == 4
    with pytest.warns(FutureWarning, match=rf"^threaded.num_samplers = 5 {DEPRECATED}"):
        assert replace_paths(base, {"threaded.num-samplers": 5}).num_samplers == 5
    with pytest.warns(FutureWarning, match=rf"^lag.num_samplers = 3 {DEPRECATED}"):
        (point, swept), = expand_grid(Config(mode="simulated", **TINY), {"lag.num_samplers": [3]})
    assert point == {"lag.num_samplers": 3} and swept.num_samplers == 3
    hopper = Config(env="gymnasium/Hopper-v5")  # a host env's preset: mode threaded
    with pytest.warns(FutureWarning, match=rf"^threaded.num_samplers = 3 {DEPRECATED}"):
        assert Config(env="gymnasium/Hopper-v5", threaded=ThreadedConfig(num_samplers=3)) == hopper.replace(num_samplers=3)


def test_both_spellings_at_once_are_refused_naming_both():
    with pytest.raises(ConfigError, match=r"^threaded.num_samplers = 3 is invalid: num_samplers = 2 is set too: set "
                                          r"num_samplers alone \(threaded.num_samplers is its deprecated spelling\)$"):
        Config(mode="threaded", num_samplers=2, threaded=ThreadedConfig(num_samplers=3))
    with pytest.raises(ConfigError, match=r"^lag.num_samplers = 4 is invalid: threaded.num_samplers = 3 is set too"):
        Config(mode="threaded", threaded=ThreadedConfig(num_samplers=3, barrier=True), lag=LagConfig(num_samplers=4))
    with pytest.warns(FutureWarning):  # one count in two spellings is that count
        assert Config(mode="threaded", num_samplers=3, threaded=ThreadedConfig(num_samplers=3)).num_samplers == 3
    with warnings.catch_warnings(), pytest.raises(ConfigError, match=r"^num_samplers = 2 has no effect: mode='sync'"):
        warnings.simplefilter("ignore", FutureWarning)
        Config(threaded=ThreadedConfig(num_samplers=2))  # set in sync mode: the one field's rule


def old_spelling(config: Config) -> dict:
    """`config` as a config.json written before the one num_samplers: no top-level field, the
    count in the section its mode read, `threaded.num_samplers` at its old default (2) elsewhere."""
    data = config_to_dict(config)
    count = data.pop("num_samplers")
    data["threaded"]["num_samplers"] = (2 if count is None else count) if config.mode == "threaded" else 2
    data["lag"]["num_samplers"] = count if config.mode == "simulated" else None
    return data


STORED = {
    "sync": Config(**TINY),
    "simulated": Config(mode="simulated", num_samplers=4, **TINY),
    "simulated-unset": Config(mode="simulated", **TINY),
    "threaded": Config(mode="threaded", num_samplers=8, threaded=ThreadedConfig(sampler_step_latency_ms=(5.0,) * 8), **TINY),
    "barrier": Config(mode="threaded", num_samplers=3, threaded=ThreadedConfig(barrier=True), **TINY),
    "threaded-default": Config(mode="threaded", num_samplers=2, **TINY),
}


@pytest.mark.parametrize("name", list(STORED))
def test_a_stored_config_converts_silently_and_equals_todays_spelling(name):
    today = STORED[name]
    data = old_spelling(today)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read = config_from_dict(data)
        converted = convert_deprecated_fields(data)
    assert read == today and converted == config_to_dict(today)
    assert data["threaded"]["num_samplers"] is not None  # (the dict given is left as it was)


def test_a_stored_config_drops_what_older_configs_held_where_a_field_did_nothing():
    """`lag.num_samplers = 1` was accepted in every mode and beside a per_sampler list of any
    length, `threaded.num_samplers = 2` was every non-threaded config's default: a stored config
    holding them reads as the mode read it (a threaded run's threads, a per_sampler run's list)."""
    barrier = old_spelling(STORED["barrier"])
    barrier["lag"]["num_samplers"] = 1  # (a barrier run of 3 threads recorded with lag.num_samplers = 1)
    per_sampler = old_spelling(Config(mode="simulated", lag=LagConfig(schedule="per_sampler", per_sampler=(0, 2, 5))))
    per_sampler["lag"]["num_samplers"] = 1
    sync = old_spelling(STORED["sync"])
    sync["lag"]["num_samplers"] = 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config_from_dict(barrier) == STORED["barrier"]
        assert config_from_dict(per_sampler).effective_num_samplers == 3
        assert config_from_dict(sync) == STORED["sync"]
    with pytest.raises(ConfigError, match=r"lag.num_samplers = 4 is invalid: threaded.num_samplers = 3 is set too"):
        config_from_dict({**barrier, "lag": {**barrier["lag"], "num_samplers": 4}})


def test_the_committed_benchmarks_read_their_samplers_in_todays_spelling():
    """Every committed benchmark.json recorded before num_samplers left threaded.* holds its
    samplers as `threaded.num_samplers` (one recorded since: as `num_samplers`): read back
    (silently) it holds them in `num_samplers`, and where today's plan runs the same layout
    (results/benchmark: one sampler; pending/benchmark_slow, mujoco-slow: 8 with their latencies and 8-chunk
    batches) no sampler field differs from today's config (`store.as_today`, the comparison that
    decides what a benchmark reruns)."""
    import ppo_async.study.benchmark as bm
    from ppo_async.study import store

    paths = sorted(glob.glob(os.path.join(REPO_ROOT, "experiments", "**", "benchmark.json"), recursive=True))
    assert len(paths) >= 3
    for path in paths:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
        for key, recorded in spec["configs"].items():
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                read = config_from_dict(recorded)
                today = store.as_today(recorded)
            spelled = recorded.get("num_samplers")
            spelled = recorded["threaded"]["num_samplers"] if spelled is None else spelled
            assert spelled is not None and read.num_samplers == spelled == today["num_samplers"], (path, key)
            assert today["threaded"]["num_samplers"] is None and today["lag"]["num_samplers"] is None
    from ppo_async.study.benchmark.relabel import old_labels, relabel_spec

    for name, samplers in (("results/benchmark", 1), ("pending/benchmark_slow", 8)):
        with open(os.path.join(REPO_ROOT, "experiments", name, "benchmark.json"), encoding="utf-8") as f:
            spec = json.load(f)
        spec = relabel_spec(spec) if old_labels(spec) else spec  # (the mode labels of today: a relabel's rewrite)
        plan = bm.resolve_plan(spec["suite"], spec["envs"], spec["modes"], spec["seeds"], spec["total_env_steps"],
                               spec["eval_every_steps"], spec["eval_episodes"])
        for key, config in bm.plan_spec(plan)["configs"].items():
            assert config["num_samplers"] == samplers
            differ = store.changed_paths(store.as_today(spec["configs"][key]), config)
            assert not [p for p in differ if p.rpartition(".")[2] in ("num_samplers", "chunks_per_batch", "num_envs",
                                                                     "sampler_step_latency_ms")], (name, key, differ)


# ---------------------------------------------------------------------------- command line and files


def test_the_flag_is_num_samplers_and_the_old_flags_warn(tmp_path):
    from ppo_async.cli import parse_train_args

    run = ["--env", "Pendulum-v1", "--mode", "threaded"]
    assert parse_train_args([*run, "--num-samplers", "3"]).cfg.effective_num_samplers == 3
    with pytest.warns(FutureWarning, match=rf"^threaded.num_samplers = 3 {DEPRECATED}: use num_samplers = 3"):
        config = parse_train_args([*run, "--threaded.num-samplers", "3"]).cfg
    assert (config.num_samplers, config.threaded.num_samplers) == (3, None)
    with pytest.raises(ConfigError, match=r"threaded.num_samplers = 3 is invalid: num_samplers = 2 is set too"):
        parse_train_args([*run, "--threaded.num-samplers", "3", "--num-samplers", "2"])
    with pytest.raises(ConfigError, match=r"num_samplers = 2 has no effect: mode='sync'"):
        parse_train_args(["--env", "Pendulum-v1", "--num-samplers", "2"])


def test_a_config_file_may_use_a_deprecated_spelling_with_a_warning(tmp_path):
    """A YAML file a person wrote warns; a saved config.json of the old spelling (both aliases,
    every field) handed to `--config` reads as its mode read it."""
    from ppo_async.cli import parse_train_args

    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("mode: simulated\nlag:\n  num_samplers: 3\n")
    with pytest.warns(FutureWarning, match=rf"^lag.num_samplers = 3 {DEPRECATED}: use num_samplers = 3"):
        assert parse_train_args(["--config", str(yaml_file)]).cfg.effective_num_samplers == 3
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(old_spelling(STORED["simulated"])))  # threaded.num_samplers 2, lag.num_samplers 4
    with pytest.warns(FutureWarning, match=r"^lag.num_samplers = 4 ") as caught:
        assert parse_train_args(["--config", str(saved)]).cfg.num_samplers == 4
    assert [str(w.message).split(" =")[0] for w in caught if w.category is FutureWarning] == ["lag.num_samplers"]


def test_a_run_recorded_with_threaded_num_samplers_resumes_without_a_warning(tmp_path, cli_main):
    """`train --resume` on a run whose config.json holds `threaded.num_samplers` (every threaded
    run written before the one num_samplers) continues it with its samplers, and says nothing."""
    from ppo_async.run.recorder import RESUME_FREE_FIELDS
    from ppo_async.run.rundir import check_config_matches, read_run_config

    class Stop(Exception):
        pass

    def stop_at_2(rows):
        if rows[0]["iteration"] == 2:
            raise Stop

    run_dir = tmp_path / "r"
    config = Config(mode="threaded", num_samplers=3, total_env_steps=4 * BATCH, run_dir=str(run_dir),
                    checkpoint_every_steps=BATCH, **TINY)
    with pytest.raises(Stop):
        pa.train(config, on_iteration=stop_at_2)
    old = old_spelling(config)
    assert (old["threaded"]["num_samplers"], "num_samplers" in old) == (3, False)
    (run_dir / "config.json").write_text(json.dumps(old))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_config_matches(read_run_config(str(run_dir)), {"config": old}, RESUME_FREE_FIELDS)  # an old checkpoint's
        done = cli_main(["train", "--resume", str(run_dir), "--quiet"])
    assert done.returncode == 0, done.stderr
    assert not [w for w in caught if issubclass(w.category, FutureWarning)], [str(w.message) for w in caught]
    assert DEPRECATED not in done.stderr
    rows = pa.read_jsonl(run_dir / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4] and len(rows[-1]["sampler_steps_per_second"]) == 3
    assert read_run_config(str(run_dir)).num_samplers == 3


def test_an_env_preset_may_set_the_sampler_count(monkeypatch):
    """A preset's `num_samplers` fills it where the caller did not set it, at every entry point;
    the caller's count wins, in either spelling."""
    from ppo_async.config import preset_table

    monkeypatch.setitem(preset_table.ENV_PRESETS, "gymnasium/", {**preset_table.ENV_PRESETS["gymnasium/"], "num_samplers": 4})
    hopper = Config(env="gymnasium/Hopper-v5")
    assert (hopper.mode, hopper.num_samplers, "num_samplers" in hopper.preset_fields) == ("threaded", 4, True)
    assert pa.config_for_env("gymnasium/Hopper-v5").num_samplers == 4
    assert Config(env="gymnasium/Hopper-v5", num_samplers=2).num_samplers == 2
    with pytest.warns(FutureWarning, match=rf"^threaded.num_samplers = 3 {DEPRECATED}"):
        aliased = Config(env="gymnasium/Hopper-v5", threaded=ThreadedConfig(num_samplers=3))
    assert (aliased.num_samplers, "num_samplers" in aliased.preset_fields) == (3, False)
    with pytest.warns(FutureWarning, match=rf"^threaded.num_samplers = 3 {DEPRECATED}"):
        assert hopper.replace({"threaded.num_samplers": 3}) == aliased
