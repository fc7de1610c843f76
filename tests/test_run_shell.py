"""The run shell: import graph, mode registry, RunRecorder, the pure parts of the host loops,
the optax optimiser chain and the checkpoint format."""

from __future__ import annotations

import ast
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import ppo_async as pa
from ppo_async.core import learner
from ppo_async.run import rundir
from ppo_async.run.checkpoint import Checkpointer, CheckpointError
from ppo_async.modes.common import metric_rows, over_seeds
from ppo_async.modes.threaded import IterationTimes, SamplerStats, learner_row, threaded_accounting
from ppo_async.runtime.buffer import ChunkTag
from ppo_async.run.recorder import RunRecorder

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ppo_async")
TINY = dict(
    total_env_steps=3 * 64,
    rollout=pa.RolloutConfig(num_envs=4, num_steps=16),
    ppo=pa.PPOConfig(num_epochs=1, num_minibatches=2),
    network=pa.NetworkConfig(actor_hidden=(8,), critic_hidden=(8,)),
)


# --------------------------------------------------------------------------------------
# import graph
# --------------------------------------------------------------------------------------


def import_graph(package_dir: str) -> dict[str, set[str]]:
    """Module -> the package modules it imports (at any depth, functions included), from the source.

    The package face (`ppo_async/__init__.py` re-exports) is not a dependency of the others.
    """
    root = os.path.basename(package_dir)
    modules = {}
    for folder, _, files in os.walk(package_dir):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, os.path.dirname(package_dir))[:-3].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in modules}
    for module, path in modules.items():
        is_package = path.endswith("__init__.py")
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = module if is_package else module.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        parent = parent.rpartition(".")[0]
                    base = f"{parent}.{node.module}" if node.module else parent
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == root:
                    found = resolve(target)
                    if found and found not in (module, root):
                        graph[module].add(found)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_a_planted_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# The layers, bottom first: a module may import its own layer and the layers below it, never
# one above (ppo_async/<layer>/__init__.py says what each holds). The package face
# (ppo_async/__init__.py) and `python -m ppo_async` (__main__) sit above them all.
LAYERS = ("errors", "envs", "config", "core", "runtime", "report", "run", "modes", "study", "cli")


def layer_of(module: str) -> int:
    """Index in LAYERS of a module `ppo_async.<layer>[.…]`; the face and __main__ are on top."""
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def wrong_way_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(module, target) pairs where a module imports a layer above its own."""
    return sorted((m, t) for m, targets in graph.items() for t in targets if layer_of(t) > layer_of(m))


def test_wrong_way_imports_finds_a_planted_upward_import():
    graph = {"ppo_async.core.losses": {"ppo_async.config.sections", "ppo_async.runtime.buffer"},
             "ppo_async.report.plots": {"ppo_async.report.metrics"}, "ppo_async": {"ppo_async.cli.commands"}}
    assert wrong_way_imports(graph) == [("ppo_async.core.losses", "ppo_async.runtime.buffer")]


def test_the_package_has_no_import_circle_and_imports_only_point_down_the_layers():
    graph = import_graph(PACKAGE)
    assert "ppo_async.run.recorder" in graph and "ppo_async.modes.threaded" in graph
    assert graph["ppo_async.modes.train"] >= {"ppo_async.modes.registry", "ppo_async.run.recorder"}
    assert find_cycle(graph) is None, find_cycle(graph)
    assert wrong_way_imports(graph) == []
    # every module lives in a layer: the top level holds only the face, __main__ and errors
    assert {m for m in graph if layer_of(m) == len(LAYERS)} == {"ppo_async", "ppo_async.__main__"}
    for layer in LAYERS[1:]:
        init = os.path.join(PACKAGE, layer, "__init__.py")
        doc = ast.get_docstring(ast.parse(open(init, encoding="utf-8").read()))
        assert doc and "May import" in doc, layer  # each layer says what it holds and may import
    # the run shell's leaves stay leaves: nothing in them imports a mode or the dispatcher
    for leaf in ("ppo_async.run.result", "ppo_async.run.rundir", "ppo_async.modes.registry", "ppo_async.run.policy"):
        assert not {m for m in graph[leaf] if m.startswith("ppo_async.modes.") and m != "ppo_async.modes.registry"}, leaf


def test_mode_files_write_nothing_themselves():
    """Host loops say when; only the recorder opens files, writers and checkpoints."""
    writers = re.compile(r"JsonlWriter|SummaryWriter|Checkpointer|write_schedule\(|\bopen\(|wandb|plot_run|make_tb_writer")
    modes_dir = os.path.join(PACKAGE, "modes")
    for folder, _, files in os.walk(modes_dir):
        for name in files:
            if name.endswith(".py") and name != "train.py":  # train.py is the dispatcher, not a host loop
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                hits = [line for line in text.splitlines() if writers.search(line) and "recorder" not in line]
                assert not hits, (name, hits)


# --------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------


def test_every_mode_is_registered_and_unknown_names_are_clear():
    assert set(pa.modes.registry.mode_names()) >= {"sync", "simulated", "threaded"}
    assert pa.get_mode("sync").resumable and not pa.get_mode("threaded").resumable  # (exactly)
    assert all(pa.get_mode(name).can_resume for name in ("sync", "simulated", "threaded"))
    with pytest.raises(pa.ConfigError, match=r"mode = 'nope' is not available; registered modes: \['simulated', 'sync', 'threaded'"):
        pa.get_mode("nope")
    # a mode that cannot resume is refused, with its reason (none of the built-in ones now)
    pa.register_mode(pa.Mode(name="frozen", run=None, checkpoint_like=None, resumable=False, why_not_resumable="why"))
    try:
        config = pa.Config(run_dir="unused", **TINY)
        object.__setattr__(config, "mode", "frozen")  # Config validates the built-in names; the registry is open
        with pytest.raises(pa.ConfigError, match=r"resume is not supported for mode='frozen' \(why\)"):
            pa.train(config, resume=True)
    finally:
        pa.modes.registry._MODES.pop("frozen")


def test_a_registered_mode_is_found_by_train(tmp_path):
    """A new mode is one register_mode call; train() runs it with a recorder it owns."""
    seen = {}

    def run(config, recorder, resume):
        seen["recorder"] = recorder
        with recorder:
            row = {"seed": config.seed, "iteration": 1, "env_steps": 64, "wall_time": 0.5, "policy_loss": 0.1,
                   "samples_produced": 64, "samples_consumed": 60, "samples_dropped": 4, "samples_resident": 0}
            recorder.record([row], 1)
        return recorder.result(train_state=None, compile_seconds=0.0)

    pa.register_mode(pa.Mode(name="echo", run=run, checkpoint_like=lambda c: None))
    try:
        config = pa.Config(**TINY).replace(run_dir=str(tmp_path / "r"))
        object.__setattr__(config, "mode", "echo")  # Config validates the built-in names; the registry is open
        result = pa.train(config)
    finally:
        pa.modes.registry._MODES.pop("echo")
    assert result.metrics[0]["samples_dropped"] == 4 and seen["recorder"].config is config
    assert pa.read_jsonl(tmp_path / "r" / "metrics.jsonl") == result.metrics
    assert json.load(open(tmp_path / "r" / "config.json"))["env"] == "Pendulum-v1"


# --------------------------------------------------------------------------------------
# RunRecorder
# --------------------------------------------------------------------------------------


def row(iteration: int, **kw) -> dict:
    base = {"seed": 0, "iteration": iteration, "env_steps": 64 * iteration, "wall_time": float(iteration),
            "policy_loss": 0.0, "value_loss": 1.0, "entropy": 0.5, "approx_kl": 0.01,
            "samples_produced": 64 * iteration, "samples_consumed": 64 * iteration, "samples_dropped": 0,
            "samples_resident": 0}
    return base | kw


def test_recorder_checks_accounting_and_non_finite_values():
    with RunRecorder(pa.Config(**TINY), [{"seed": 0}]) as recorder:
        recorder.record([row(1)], 1)
        with pytest.raises(AssertionError, match=r"accounting broken at iteration 2 \(seed 0\): produced 128 != consumed 100 \+ dropped 0 \+ resident 0"):
            recorder.record([row(2, samples_consumed=100)], 2)
        with pytest.raises(pa.NonFiniteError, match=r"env 'Pendulum-v1' produced 3 NaN/inf observations or rewards in iteration 2"):
            recorder.record([row(2, nonfinite_env_values=3)], 2)
        with pytest.raises(pa.NonFiniteError, match="value_loss became NaN or infinite at iteration 2"):
            recorder.record([row(2, value_loss=None)], 2)
    assert [r["iteration"] for r in recorder.rows] == [1]


def test_recorder_refuses_a_foreign_directory_and_resets_a_run_directory(tmp_path):
    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    with pytest.raises(pa.ConfigError, match=r"not empty and is not a ppo_async run directory"):
        RunRecorder(pa.Config(**TINY, run_dir=str(foreign)), [{"seed": 0}]).open()
    assert (foreign / "thesis.tex").read_text() == "precious"

    run_dir = tmp_path / "run"
    config = pa.Config(**TINY, run_dir=str(run_dir), checkpoint_every_steps=2 * 64)
    with RunRecorder(config, [{"seed": 0}]) as recorder:
        for i in (1, 2, 3):
            recorder.record([row(i)], i, state=lambda: {"x": jnp.arange(3)})
        recorder.write_schedule("version_schedule.jsonl", [{"iteration": 1, "sampler_id": 0, "lag": 0}])
    assert [r["iteration"] for r in pa.read_jsonl(run_dir / "metrics.jsonl")] == [1, 2, 3]
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [2, 3]  # every 2nd iteration and the last
        meta = ckpt.metadata()
    assert meta["format"] == rundir.CHECKPOINT_FORMAT and meta["samples_consumed"] == [192] and meta["iteration"] == 3
    (run_dir / "old.png").write_bytes(b"png")
    with RunRecorder(config, [{"seed": 0}]) as recorder:  # a fresh run in the same directory starts over
        recorder.record([row(1)], 1)
    # the old checkpoints are gone; checkpoints/ comes back with the first checkpoint (none is due yet)
    assert sorted(os.listdir(run_dir)) == ["config.json", "metrics.jsonl", "tb"]
    assert len(pa.read_jsonl(run_dir / "metrics.jsonl")) == 1
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        assert ckpt.all_steps() == []


def test_final_checkpoint_saves_a_run_stopped_early(tmp_path):
    config = pa.Config(**TINY, run_dir=str(tmp_path / "r"), checkpoint_every_steps=10 * 64)
    with RunRecorder(config, [{"seed": 0}]) as recorder:
        assert [recorder.checkpoint_due(i) for i in (1, 2, 3)] == [False, False, True]
        recorder.record([row(1)], 1, state=lambda: {"x": jnp.zeros(2)})
        recorder.final_checkpoint(lambda: {"x": jnp.ones(2)})
        recorder.final_checkpoint(lambda: {"x": jnp.ones(2)})  # nothing new: no second save
    with Checkpointer(tmp_path / "r" / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [1]
        state, _ = ckpt.restore({"x": jnp.zeros(2)})
    np.testing.assert_array_equal(state["x"], [1.0, 1.0])
    assert not RunRecorder(pa.Config(**TINY), [{"seed": 0}]).checkpoint_due(3)  # no run dir, no checkpoint


def test_a_checkpoint_of_the_older_format_fails_with_a_clear_message(tmp_path):
    run_dir = tmp_path / "old"
    config = pa.Config(**TINY, run_dir=str(run_dir))
    pa.train(config)
    like = pa.get_mode("sync").checkpoint_like(config)
    old_state = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), like)
    with Checkpointer(run_dir / "checkpoints") as ckpt:  # as the version before the optax chain wrote it
        ckpt.save(4, old_state, {"config": pa.config_to_dict(config), "iteration": 4})
    with pytest.raises(CheckpointError, match=r"format 1, written by an older version of ppo_async; this version reads format 3"):
        pa.load(run_dir)
    with pytest.raises(CheckpointError, match="format 1"):
        pa.resume(str(run_dir))


# --------------------------------------------------------------------------------------
# pure parts of the host loops
# --------------------------------------------------------------------------------------


def test_metric_rows_label_and_account_every_row():
    config = pa.Config(**TINY, num_seeds=2)
    consumed, dropped = np.array([64, 64]), np.array([0, 0])
    metrics = {"consumed": np.array([60, 64]), "dropped_stale": np.array([4, 0]), "approx_kl": np.array([0.5, np.nan])}
    rows = metric_rows(config, metrics, [{"seed": 0}, {"seed": 1}], 2, (consumed, dropped))
    assert rows[0] == {"dropped_stale": 4, "approx_kl": 0.5, "seed": 0, "iteration": 2, "env_steps": 128,
                       "samples_produced": 128, "samples_consumed": 124, "samples_dropped": 4, "samples_resident": 0}
    assert rows[1]["approx_kl"] is None and rows[1]["samples_consumed"] == 128
    assert consumed.tolist() == [124, 128] and dropped.tolist() == [4, 0]


def test_threaded_accounting_by_hand():
    counters = {"added": 10, "overwritten": 2, "size": 3}
    acc = threaded_accounting(counters, chunk_size=64, discarded=128, consumed=288, dropped_stale=32)
    # produced 10 * 64 + 128 = 768 = consumed 288 + dropped (128 + 2 * 64 + 32) + resident 3 * 64
    assert acc == {"samples_produced": 768, "samples_consumed": 288, "samples_dropped": 288, "samples_resident": 192,
                   "dropped_forced_refresh": 128, "dropped_overwritten": 128, "dropped_stale_total": 32}
    assert acc["samples_produced"] == acc["samples_consumed"] + acc["samples_dropped"] + acc["samples_resident"]


def test_learner_row_by_hand():
    config = pa.Config(mode="threaded", seed=7, **TINY)
    stats = [SamplerStats(produced=640, rollout_s=1.0), SamplerStats(produced=320, forced_refreshes=2)]
    acc = threaded_accounting({"added": 4, "overwritten": 0, "size": 1}, 64, 0, 192, 0)
    r = learner_row(config, {"approx_kl": np.float32(0.25), "kl_per_lag": np.array([0.1, np.nan])}, iteration=3,
                    tags=[ChunkTag(1, 0.5, 2)], learner_version=3, sgd_steps=6, accounting=acc, buffer_fill=0.25,
                    times=IterationTimes(start=10.0, tick=11.0, got=11.5, done=12.0), sampler_stats=stats)
    assert r["approx_kl"] == 0.25 and r["kl_per_lag"] == [pytest.approx(0.1), None]
    assert (r["seed"], r["iteration"], r["sampler_id"], r["behavior_version"], r["env_steps"]) == (7, 3, 1, 2, 192)
    assert r["wall_time"] == 2.0 and r["steps_per_second"] == 64.0 and r["learner_busy_fraction"] == 0.5
    assert r["learner_wait_s"] == 0.5 and r["sampler_steps_per_second"] == [320.0, 160.0]
    assert r["sampler_forced_refreshes"] == [0, 2] and r["samples_resident"] == 64
    two = learner_row(config, {}, iteration=1, tags=[ChunkTag(0, 0.1, 0), ChunkTag(1, 0.2, 1)], learner_version=1, sgd_steps=2,
                      accounting=acc, buffer_fill=0.0, times=IterationTimes(0.0, 0.0, 0.0, 1.0), sampler_stats=stats)
    assert two["sampler_id"] == [0, 1] and two["behavior_version"] == [0, 1]


def test_over_seeds_with_one_seed_equals_vmap():
    fn = lambda x, w: (jnp.tanh(x @ w), {"s": jnp.sum(x)})  # noqa: E731
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 5, 4))
    w = jax.random.normal(jax.random.PRNGKey(1), (4, 3))
    one = jax.jit(over_seeds(fn, 1, in_axes=(0, None)))(x, w)
    many = jax.vmap(fn, in_axes=(0, None))(x, w)
    assert jax.tree.map(jnp.shape, one) == jax.tree.map(jnp.shape, many)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(many)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert over_seeds(fn, 2) is not fn


# --------------------------------------------------------------------------------------
# the optimiser and the traced hyperparameters
# --------------------------------------------------------------------------------------


def test_traced_hyperparameters_are_listed_once():
    assert set(learner.TRACED_CONFIG_FIELDS) | set(learner.SGD_SHAPE_FIELDS) == set(learner.Hyperparams._fields)
    assert not set(learner.TRACED_CONFIG_FIELDS) & set(learner.SGD_SHAPE_FIELDS)
    config = pa.Config(ppo=pa.PPOConfig(clip_eps=0.3, dual_clip=None), lag=pa.LagConfig(max_lag=5))
    hp = learner.hyperparams_from_config(config)
    assert float(hp.clip_eps) == pytest.approx(0.3) and math.isinf(float(hp.dual_clip)) and float(hp.max_lag) == 5.0
    for path in learner.TRACED_CONFIG_FIELDS.values():
        pa.config.get_path(config, path)  # every path names a real field
    # sweep groups by everything else: configs differing only in traced fields share a key
    from ppo_async.study.sweep import static_key

    a = pa.Config(ppo=pa.PPOConfig(learning_rate=1e-4, clip_eps=0.1), rollout=pa.RolloutConfig(reward_scale=2.0))
    assert static_key(a) == static_key(pa.Config())
    # the SGD shape is traced within a sweep group (learner.slotted_epochs) but stays in the key of
    # every other compiled program (train's program caches build the plain update from it)
    assert static_key(pa.Config(ppo=pa.PPOConfig(num_epochs=2, num_minibatches=8))) == static_key(pa.Config())
    assert static_key(pa.Config(rollout=pa.RolloutConfig(num_envs=8))) != static_key(pa.Config())
    plain = lambda c: learner.without_traced_fields(pa.config_to_dict(c))  # noqa: E731
    assert plain(pa.Config(ppo=pa.PPOConfig(num_epochs=2))) != plain(pa.Config())


def test_optimizer_chain_clips_steps_and_freezes_the_critic():
    params = {"actor": {"w": jnp.array([1.0, 2.0])}, "critic_0": {"w": jnp.array([3.0])}}
    grads = {"actor": {"w": jnp.array([3.0, 4.0])}, "critic_0": {"w": jnp.array([0.0])}}  # global norm 5
    tx = learner.make_optimizer(1e-8)
    state = tx.init(params)
    state = learner.with_step_hyperparams(state, learning_rate=0.1, max_grad_norm=1.0, value_flag=0.0)
    updates, state = tx.update(grads, state, params)
    # clipped to norm 1: g = (0.6, 0.8); first Adam step: m_hat / sqrt(v_hat) = sign(g) -> update -lr
    np.testing.assert_allclose(updates["actor"]["w"], [-0.1, -0.1], rtol=1e-5)
    np.testing.assert_array_equal(updates["critic_0"]["w"], [0.0])
    adam = learner.adam_state(state)
    np.testing.assert_allclose(adam.mu["actor"]["w"], [0.06, 0.08], rtol=1e-5)  # (1 - b1) * g
    np.testing.assert_array_equal(adam.mu["critic_0"]["w"], [0.0])  # frozen: moments untouched
    # unfrozen, the same chain is plain clip -> Adam -> step size
    state = learner.with_step_hyperparams(state, learning_rate=0.1, max_grad_norm=1.0, value_flag=1.0)
    grads2 = {"actor": {"w": jnp.array([0.3, 0.4])}, "critic_0": {"w": jnp.array([0.5])}}
    updates, _ = tx.update(grads2, state, params)
    ref_tx = optax.chain(optax.clip_by_global_norm(1.0), optax.scale_by_adam(eps=1e-8), optax.scale(-0.1))
    ref_state = ref_tx.init(params)
    _, ref_state = ref_tx.update(jax.tree.map(lambda g: g / 5.0, grads), ref_state, params)
    ref_updates, _ = ref_tx.update(grads2, ref_state, params)
    np.testing.assert_allclose(updates["actor"]["w"], ref_updates["actor"]["w"], rtol=1e-5)
    assert float(updates["critic_0"]["w"][0]) != 0.0
