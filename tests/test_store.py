"""Resume by skipping (`ppo_async.study.store`), the mechanism the benchmark and tune share: the
spec check, the log of finished rows, and the published results under experiments/results,
which resume with their files byte-identical and every finished item skipped."""

from __future__ import annotations

import glob
import json
import os
import shutil

import pytest

from ppo_async.config import ConfigError, config_from_dict
from ppo_async.errors import DataFileError
from ppo_async.study import store

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PUBLISHED = os.path.join(REPO_ROOT, "experiments", "results")


def test_a_csv_log_appends_one_header_and_reads_back_whole_rows(tmp_path):
    log = store.RowLog(str(tmp_path / "rows.csv"), ("item", "n", "final"))
    log.append([{"item": "a", "n": 1, "final": 0}])
    log.append([{"item": "a", "n": 2, "final": 1}, {"item": "b", "n": 1, "final": 0}])
    assert log.read() == [{"item": "a", "n": "1", "final": "0"}, {"item": "a", "n": "2", "final": "1"},
                          {"item": "b", "n": "1", "final": "0"}]
    with open(log.path, "a", encoding="utf-8") as f:
        f.write("b,2")  # a write cut short
    assert len(log.read()) == 3 and log.data_lines() == 4


def test_finished_keeps_finished_items_and_removes_the_rest_from_the_file(tmp_path):
    log = store.RowLog(str(tmp_path / "rows.csv"), ("item", "n", "final"))
    log.append([{"item": "a", "n": 1, "final": 0}, {"item": "a", "n": 2, "final": 1}, {"item": "b", "n": 1, "final": 0}])
    with open(log.path, "a", encoding="utf-8") as f:
        f.write("b,2")
    done = store.finished(log, lambda r: r["item"], lambda r: r["final"] == "1")
    assert list(done) == ["a"] and [r["n"] for r in done["a"]] == ["1", "2"]
    assert log.read() == done["a"] and log.data_lines() == 2
    before = open(log.path, "rb").read()
    assert store.finished(log, lambda r: r["item"], lambda r: r["final"] == "1") == done
    assert open(log.path, "rb").read() == before  # nothing to remove: the file is not rewritten


def test_a_json_lines_log_drops_a_torn_last_line_and_refuses_a_corrupt_one(tmp_path):
    log = store.RowLog(str(tmp_path / "rows.jsonl"))
    log.append([{"key": "a", "x": 1.5}, {"key": "b", "x": 2}])
    with open(log.path, "a", encoding="utf-8") as f:
        f.write('{"key": "c", "x"')  # killed mid-write
    done = store.finished(log, lambda r: r["key"], lambda r: True)
    assert {k: rows[-1]["x"] for k, rows in done.items()} == {"a": 1.5, "b": 2}
    assert open(log.path, encoding="utf-8").read() == '{"key": "a", "x": 1.5}\n{"key": "b", "x": 2}\n'
    with open(log.path, "w", encoding="utf-8") as f:
        f.write('{"key": "a"}\n{oops\n{"key": "b"}\n')
    with pytest.raises(DataFileError, match="line 2: not JSON"):
        log.read()


def test_check_spec_writes_once_refuses_what_differs_and_rewrites_only_an_extension(tmp_path):
    path, writes = str(tmp_path / "spec.json"), []

    def write(p, spec):
        writes.append(spec)
        with open(p, "w", encoding="utf-8") as f:
            json.dump(spec, f)

    def refusal(recorded, now):
        return None if recorded["a"] == now["a"] else f"a = {now['a']} differs"

    def grows(recorded, now):
        return now["n"] > recorded["n"]

    store.check_spec(path, {"a": 1, "n": 1}, refusal, write, grows)
    store.check_spec(path, {"a": 1, "n": 1}, refusal, write, grows)
    assert writes == [{"a": 1, "n": 1}]
    with pytest.raises(ConfigError, match="a = 2 differs"):
        store.check_spec(path, {"a": 2, "n": 1}, refusal, write, grows)
    store.check_spec(path, {"a": 1, "n": 3}, refusal, write, grows)
    assert writes[-1] == {"a": 1, "n": 3} and store.read_spec(path) == {"a": 1, "n": 3}
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"a":\n')
    with pytest.raises(DataFileError, match="spec.json, line 2: not JSON"):
        store.read_spec(path)


def test_changed_paths_count_a_field_added_since_as_its_default():
    recorded = {"config": {"ppo": {"clip_eps": 0.2}}, "seeds": 1}
    defaults = {"config": {"ppo": {"clip_eps": 0.2, "new_field": 0}}}
    same = {"config": {"ppo": {"clip_eps": 0.2, "new_field": 0}}, "seeds": 1}
    assert store.changed_paths(recorded, same, defaults=defaults) == []
    other = {"config": {"ppo": {"clip_eps": 0.3, "new_field": 1}}, "seeds": 2}
    assert store.changed_paths(recorded, other, defaults=defaults) == ["config.ppo.clip_eps", "config.ppo.new_field", "seeds"]


def _copy(source: str, target, names: tuple[str, ...]) -> dict[str, bytes]:
    """Copies `names` of `source` into `target`; their bytes."""
    for name in names:
        shutil.copy(os.path.join(source, name), target / name)
    return {name: (target / name).read_bytes() for name in names}


@pytest.mark.parametrize("source", sorted(os.path.dirname(p) for p in glob.glob(
    os.path.join(PUBLISHED, "**", "benchmark.json"), recursive=True)), ids=lambda p: os.path.relpath(p, PUBLISHED))
def test_a_published_benchmark_resumes_skipping_every_run(source, tmp_path, monkeypatch):
    import ppo_async.study.benchmark as bm
    from ppo_async.study.benchmark import runner

    names = ("benchmark.json", "results.csv")
    before = _copy(source, tmp_path, names)
    recorded = store.read_spec(str(tmp_path / "benchmark.json"))
    bm.check_spec(str(tmp_path), recorded)  # the same arguments
    plan = bm.Plan(**{k: tuple(tuple(c) for c in v) if k == "changes" else tuple(v) if isinstance(v, list) else v
                      for k, v in recorded.items() if k in bm.Plan._fields})
    monkeypatch.setattr(runner, "train_run", lambda *a, **k: pytest.fail("a finished run was trained again"))
    done = bm.finished_keys(str(tmp_path))
    for seed in range(plan.seeds):
        for env in plan.envs:
            for mode in plan.modes:
                assert runner.finish_run(str(tmp_path), plan, env, mode, seed, done, False) == "skipped"
    assert {name: (tmp_path / name).read_bytes() for name in names} == before


@pytest.mark.parametrize("source", sorted(os.path.dirname(p) for p in glob.glob(
    os.path.join(PUBLISHED, "**", "tune.json"), recursive=True)), ids=lambda p: os.path.relpath(p, PUBLISHED))
def test_a_published_tune_resumes_skipping_every_measured_setting(source, tmp_path, monkeypatch):
    """A tune.json written before config fields were added resumes: they count as their defaults;
    its settings recorded before the one num_samplers (`threaded.num_samplers` in each row and
    key) are today's settings of `num_samplers`, its files left as they are."""
    from ppo_async.study import tune

    names = ("tune.json", "measurements.jsonl")
    before = _copy(source, tmp_path, names)
    recorded = store.read_spec(str(tmp_path / "tune.json"))
    config = config_from_dict(recorded["config"])
    tuner = tune._Tuner(config, recorded["kl_target"], recorded["budget_per_run"], recorded["seeds"], str(tmp_path), False)
    recorded_rows = [json.loads(line) for line in before["measurements.jsonl"].decode().splitlines() if line.strip()]
    assert any("threaded.num_samplers" in row for row in recorded_rows)  # (written before the one num_samplers)
    today = lambda data: {"num_samplers" if k == "threaded.num_samplers" else k: v for k, v in data.items()}  # noqa: E731
    rows = [{**today(row), "key": json.dumps(today(json.loads(row["key"])), sort_keys=True)} for row in recorded_rows]
    assert set(tuner.done) == {r["key"] for r in rows}
    monkeypatch.setattr(tune, "train", lambda *a, **k: pytest.fail("a measured setting was run again"))
    for row in rows:
        changes = json.loads(row["key"])
        if "replay" not in changes:  # step 4's replayed settings are skipped as a whole (all keys done)
            assert tuner.measure(row["step"], changes) == row
    assert {name: (tmp_path / name).read_bytes() for name in names} == before
    with pytest.raises(ConfigError, match="holds a tune of another config or options .*kl_target"):
        tune._Tuner(config, recorded["kl_target"] * 2, recorded["budget_per_run"], recorded["seeds"], str(tmp_path), False)
