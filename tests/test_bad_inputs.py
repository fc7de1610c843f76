"""Every bad input gets one clear error at once (issue 27): a table of bad command lines and
API calls, each of which must fail with exit status 2 (or the exception type), a message
naming the field, and no traceback - before anything is compiled.

The command lines run in-process through `ppo_async.cli.main` with stdout / stderr captured
(what `python -m ppo_async` does, minus the interpreter start); a handful also run as real
subprocesses. Training itself never starts: `stop_before_running` makes the first step of a
run raise `Accepted`, so an input that is wrongly accepted fails its case at once instead of
training (the "silent" class of `classify`). That, not a clock, is what says an answer came
before anything was compiled; the subprocess cases have a generous timeout, a hang guard.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

import ppo_async as pa


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Accepted(Exception):
    """Raised where a run would start: the input was accepted."""


def _accept(*args, **kwargs):
    raise Accepted()


@pytest.fixture(scope="module")
def stop_before_running(tmp_path_factory):
    """Every run stops where it would start recording and compiling (train's `RunRecorder`, the
    sweep's groups), in a scratch working directory (the CLI's default run_dir is under it)."""
    import ppo_async.modes.train as train_module
    import ppo_async.study.sweep as sweep_module

    patch = pytest.MonkeyPatch()
    patch.chdir(tmp_path_factory.mktemp("cwd"))
    patch.setattr(train_module, "RunRecorder", _accept)
    for name in ("_run_group_vmap", "_run_group_loop", "_run_threaded_points"):
        patch.setattr(sweep_module, name, _accept)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Config files, a plain file and a run directory the cases name ({name} in their args)."""
    return make_files(tmp_path_factory.mktemp("bad_inputs"))


def make_files(root) -> dict[str, str]:
    """Writes the files the cases name into the directory `root` (a pathlib.Path); name -> path."""
    texts = {
        "dup.yaml": "rollout.num_envs: 32\nrollout:\n  num_envs: 64\n",
        "dup_same_level.yaml": "ppo:\n  gamma: 0.9\n  gamma: 0.8\n",
        "dup.json": '{"seed": 1, "seed": 2}',
        "typo.yaml": "ppo:\n  gama: 0.9\n",
        "typo_top.json": '{"totl_env_steps": 1000}',
        "bad_value.yaml": "rollout:\n  num_envs: 0\n",
        "rho.yaml": "ppo:\n  rho_bar: 2.0\n",
        "list.json": "[1, 2]",
        "broken.json": '{"seed": ',
        "broken.yaml": "ppo: [1, 2\n",
        "section_scalar.yaml": "ppo: 3\n",
        "plain_file": "not a directory\n",
    }
    for name, text in texts.items():
        (root / name).write_text(text)
    return {name: str(root / name) for name in texts} | {"root": str(root)}


# (command line, what the error line must name). {x} is a path of `files`.
CLI_CASES: list[tuple[str, str]] = [
    # ppo.*
    ("train --ppo.clip-eps 2.0", "--ppo.clip-eps"),
    ("train --ppo.clip-eps 0", "--ppo.clip-eps"),
    ("train --ppo.clip-eps -0.1", "--ppo.clip-eps"),
    ("train --ppo.clip-eps abc", "--ppo.clip-eps"),
    ("train --ppo.clip-eps nan", "--ppo.clip-eps"),
    ("train --ppo.gamma 0", "--ppo.gamma"),
    ("train --ppo.gamma 1.5", "--ppo.gamma"),
    ("train --ppo.gamma x", "--ppo.gamma"),
    ("train --ppo.gae-lambda 0", "--ppo.gae-lambda"),
    ("train --ppo.gae-lambda 2", "--ppo.gae-lambda"),
    ("train --ppo.learning-rate 0", "--ppo.learning-rate"),
    ("train --ppo.learning-rate -1e-3", "--ppo.learning-rate"),
    ("train --ppo.learning-rate inf", "--ppo.learning-rate"),
    ("train --ppo.num-epochs 0", "--ppo.num-epochs"),
    ("train --ppo.num-epochs -1", "--ppo.num-epochs"),
    ("train --ppo.num-epochs 1.5", "--ppo.num-epochs"),
    ("train --ppo.num-epochs 1000000000", "--ppo.num-epochs"),
    ("train --ppo.num-minibatches 0", "--ppo.num-minibatches"),
    ("train --ppo.num-minibatches 3", "--ppo.num-minibatches"),
    ("train --ppo.num-minibatches 7", "--ppo.num-minibatches"),
    ("train --ppo.num-minibatches 1000000000", "--ppo.num-minibatches"),
    ("train --ppo.max-grad-norm 0", "--ppo.max-grad-norm"),
    ("train --ppo.adam-eps 0", "--ppo.adam-eps"),
    ("train --ppo.vf-coef -1", "--ppo.vf-coef"),
    ("train --ppo.ent-coef -0.1", "--ppo.ent-coef"),
    ("train --ppo.dual-clip 0.5", "--ppo.dual-clip"),
    ("train --ppo.value-clip-eps 0", "--ppo.value-clip-eps"),
    ("train --ppo.advantage-estimator foo", "--ppo.advantage-estimator"),
    ("train --ppo.objective foo", "--ppo.objective"),
    ("train --ppo.rho-bar 1.0", "--ppo.rho-bar"),
    ("train --ppo.rho-bar 2.0", "--ppo.rho-bar"),
    ("train --ppo.c-bar 1.0", "--ppo.c-bar"),
    ("train --ppo.c-bar 0.5", "--ppo.c-bar"),
    ("train --ppo.advantage-estimator vtrace --ppo.rho-bar 0", "--ppo.rho-bar"),
    ("train --ppo.is-clip 2.0", "--ppo.is-clip"),
    ("train --ppo.prox-ewma 0.5", "--ppo.prox-ewma"),
    ("train --ppo.objective decoupled --ppo.is-clip 0.5", "--ppo.is-clip"),
    ("train --ppo.objective decoupled --ppo.prox-ewma 1.5", "--ppo.prox-ewma"),
    ("train --ppo.value-update-every 0", "--ppo.value-update-every"),
    ("train --ppo.normalize-advantages maybe", "--ppo.normalize-advantages"),
    # rollout.*
    ("train --rollout.num-envs 0", "--rollout.num-envs"),
    ("train --rollout.num-envs -4", "--rollout.num-envs"),
    ("train --rollout.num-envs abc", "--rollout.num-envs"),
    ("train --rollout.num-envs 2.5", "--rollout.num-envs"),
    ("train --rollout.num-envs 100000000", "--rollout.num-envs"),
    ("train --rollout.num-envs 20000000 --rollout.num-steps 64 --total-env-steps 2560000000", "--rollout.num-envs"),
    ("train --rollout.num-steps 0", "--rollout.num-steps"),
    ("train --rollout.num-steps 100000000", "--rollout.num-steps"),
    ("train --rollout.obs-clip 0", "--rollout.obs-clip"),
    ("train --rollout.reward-scale 0", "--rollout.reward-scale"),
    ("train --rollout.reward-clip 5", "--rollout.reward-clip"),
    ("train --rollout.normalize-reward --rollout.reward-clip -1", "--rollout.reward-clip"),
    # network.*
    ("train --network.actor-hidden 0 64", "--network.actor-hidden"),
    ("train --network.actor-hidden 100000 100000", "--network.actor-hidden"),
    ("train --network.actor-hidden abc", "--network.actor-hidden"),
    ("train --network.critic-hidden -1", "--network.critic-hidden"),
    ("train --network.critic-hidden 100000 100000", "--network.critic-hidden"),
    ("train --network.activation foo", "--network.activation"),
    ("train --network.init-log-std 5", "--network.init-log-std"),
    ("train --network.init-log-std -100", "--network.init-log-std"),
    # run-level fields
    ("train --total-env-steps 0", "--total-env-steps"),
    ("train --total-env-steps -5", "--total-env-steps"),
    ("train --total-env-steps 100", "--total-env-steps"),
    ("train --total-env-steps 1000000000000000", "--total-env-steps"),
    ("train --total-env-steps 1e6", "--total-env-steps"),
    ("train --num-seeds 0", "--num-seeds"),
    ("train --num-seeds 100000 --quiet", "--num-seeds"),
    ("train --seed -1", "--seed"),
    ("train --seed x", "--seed"),
    ("train --mode foo", "--mode"),
    ("train --checkpoint-every-steps -1", "--checkpoint-every-steps"),
    ("train --checkpoint-every -1", "--checkpoint-every"),  # the deprecated spelling, checked as it was
    ("train --keep-checkpoints 0", "--keep-checkpoints"),
    ("train --eval-every-steps -1", "--eval-every-steps"),
    ("train --eval-episodes 0", "--eval-episodes"),
    ("train --eval-episodes 5", "--eval-episodes"),
    ("train --log-every 0", "--log-every"),
    ("train --log-every 2 --checkpoint-every-steps 3072", "--checkpoint-every-steps"),  # 3 iterations of 1,024
    ("train --wandb-project ' '", "--wandb-project"),
    ("train --env NoSuchEnv-v0", "--env"),
    ("train --env brax/no_such_task", "--env"),
    ("train --env gymnasium/HalfCheetah-v5 --mode sync", "--mode"),
    # lag.*
    ("train --lag.K 3", "--lag.K"),
    ("train --mode simulated --lag.K -1", "--lag.K"),
    ("train --mode simulated --lag.schedule uniform --lag.low 3 --lag.high 1", "--lag.high"),
    ("train --mode simulated --lag.schedule geometric --lag.p 0", "--lag.p"),
    ("train --mode simulated --lag.schedule geometric --lag.p 1.5", "--lag.p"),
    ("train --mode simulated --lag.schedule replay", "--lag.replay-path"),
    ("train --mode simulated --lag.schedule per_sampler", "--lag.per-sampler"),
    ("train --mode simulated --lag.schedule straggler --lag.fraction 0", "--lag.fraction"),
    ("train --mode simulated --lag.schedule straggler --lag.slowdown 0", "--lag.slowdown"),
    ("train --mode simulated --lag.schedule fixed --lag.low 2", "--lag.low"),
    ("train --mode simulated --lag.schedule nope", "--lag.schedule"),
    ("train --lag.max-lag -1", "--lag.max-lag"),
    ("train --mode simulated --lag.num-samplers 0", "--lag.num-samplers"),
    # threaded.*
    ("train --mode threaded --threaded.num-samplers 0", "--threaded.num-samplers"),
    ("train --num-samplers 4", "--num-samplers"),
    ("train --mode threaded --num-samplers 0", "--num-samplers"),
    ("train --mode threaded --threaded.buffer-capacity 100", "--threaded.buffer-capacity"),
    ("train --mode threaded --threaded.refresh-lag 0", "--threaded.refresh-lag"),
    ("train --mode threaded --threaded.full-policy drop", "--threaded.full-policy"),
    ("train --mode threaded --threaded.min-refresh-interval-s -1", "--threaded.min-refresh-interval-s"),
    # distributed.*, env_options.*
    ("train --distributed.num-processes 0", "--distributed.num-processes"),
    ("train --distributed.heartbeat-timeout-s 0", "--distributed.heartbeat-timeout-s"),
    ("train --env-options.backend mjx", "--env-options.backend"),
    ("train --env-options.episode-length 0", "--env-options.episode-length"),
    # run directories
    ("train --run-dir /proc/ppo_async_x", "--run-dir"),
    ("train --run-dir /proc/self/x/y", "--run-dir"),
    ("train --run-dir {plain_file}", "--run-dir"),
    ("train --run-dir {plain_file}/sub", "--run-dir"),
    ("train --run-dir {root}", "--run-dir"),
    # unknown options and commands
    ("train --ppo.gama 0.9", "--ppo.gamma"),
    ("train --rollout.num-env 3", "--rollout.num-envs"),
    ("train --totl-env-steps 5", "--total-env-steps"),
    ("train --ppo.clip-eps", "--ppo.clip-eps"),
    ("trian", "trian"),
    # --config FILE
    ("train --config {root}/missing.yaml", "--config"),
    ("train --config {dup.yaml}", "rollout.num_envs"),
    ("train --config {dup_same_level.yaml}", "gamma"),
    ("train --config {dup.json}", "seed"),
    ("train --config {typo.yaml}", "ppo.gamma"),
    ("train --config {typo_top.json}", "total_env_steps"),
    ("train --config {bad_value.yaml}", "rollout.num"),
    ("train --config {rho.yaml}", "ppo.rho"),
    ("train --config {list.json}", "list.json: expected a mapping"),
    ("train --config {broken.json}", "broken.json, line 1: not JSON"),
    ("train --config {broken.yaml}", "broken.yaml, line 2: not YAML"),
    ("train --config {section_scalar.yaml}", "ppo"),
    # --resume
    ("train --resume {root}/no_run", "no_run"),
    ("train --resume {root} --seed 3", "--seed"),
    # other commands
    ("tune --kl-target -1", "--kl-target"),
    ("tune --seeds 0", "--seeds"),
    ("tune --env NoSuchEnv-v0", "env"),
    ("tune --max-samplers x", "--max-samplers"),
    ("benchmark --suite nosuch", "suite"),
    ("benchmark --seeds x", "--seeds"),
    ("benchmark --modes fast", "--modes"),
    ("benchmark --jobs 0", "jobs = 0"),
    ("benchmark --jobs 2 --report-only --out {root}", "--jobs = 2 has no effect with --report-only"),
    ("launch --num-processes 1 -- train", "--num-processes"),
    ("launch --num-processes x -- train", "--num-processes"),
    ("launch --num-processes 2 --port 0 -- train", "--port"),
    ("eval {root}/no_run", "no_run"),
    ("plot {root}/no_run", "no_run"),
]


def _argv(line: str, files: dict) -> list[str]:
    """The case's argv, each `{name}` replaced by the path of `files[name]`."""
    import shlex

    for name, path in files.items():
        line = line.replace("{" + name + "}", path)
    return shlex.split(line)


def run_cli(argv: list[str]) -> tuple[int | str, str]:
    """`ppo_async.cli.main(argv)` in this process: (exit status, or "accepted" when a run would
    start; stdout + stderr)."""
    from ppo_async.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status: int | str = main(argv)
        except Accepted:
            status = "accepted"
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001 - a traceback is what the table looks for
            import traceback

            traceback.print_exc()
            status = 1
    return status, out.getvalue()


def classify(status: int | str, output: str, field: str) -> str:
    """clear (status 2, one `error:` line naming `field`), unclear (status 2, but not one line
    or not naming the field), traceback, or silent (accepted)."""
    if status == "accepted":
        return "silent"
    if "Traceback" in output:
        return "traceback"
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if status == 2 and len(errors) == 1 and field in errors[0]:
        return "clear"
    return "unclear"


@pytest.mark.parametrize("line,field", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_line(line, field, files, stop_before_running):
    status, output = run_cli(_argv(line, files))
    assert classify(status, output, field) == "clear", f"status {status}: {output[-2000:]}"


# (id, call, exception type, what the message must name)
def _config(**kw):
    return pa.Config(**kw)


API_CASES = [
    ("Config(seed=-1)", lambda: _config(seed=-1), pa.ConfigError, "seed"),
    ("Config(seed=1.5)", lambda: _config(seed=1.5), pa.ConfigError, "seed"),
    ("Config(num_seeds=0)", lambda: _config(num_seeds=0), pa.ConfigError, "num_seeds"),
    ("Config(num_seeds=10**5)", lambda: _config(num_seeds=10**5), pa.ConfigError, "num_seeds"),
    ("Config(total_env_steps=10**15)", lambda: _config(total_env_steps=10**15), pa.ConfigError, "total_env_steps"),
    ("Config(total_env_steps=10**18)", lambda: _config(total_env_steps=10**18), pa.ConfigError, "total_env_steps"),
    ("Config(total_env_steps='1M')", lambda: _config(total_env_steps="1M"), pa.ConfigError, "total_env_steps"),
    ("Config(env=3)", lambda: _config(env=3), pa.ConfigError, "env"),
    ("Config(env='Nope-v0')", lambda: _config(env="Nope-v0"), pa.ConfigError, "env"),
    ("Config(mode='fast')", lambda: _config(mode="fast"), pa.ConfigError, "mode"),
    ("Config(ppo={})", lambda: _config(ppo={}), pa.ConfigError, "ppo"),
    ("Config(rollout=None)", lambda: _config(rollout=None), pa.ConfigError, "rollout"),
    ("PPOConfig(clip_eps=2)", lambda: pa.PPOConfig(clip_eps=2.0), pa.ConfigError, "ppo.clip_eps"),
    ("PPOConfig(gamma=0)", lambda: pa.PPOConfig(gamma=0.0), pa.ConfigError, "ppo.gamma"),
    ("PPOConfig(num_epochs=True)", lambda: pa.PPOConfig(num_epochs=True), pa.ConfigError, "ppo.num_epochs"),
    ("PPOConfig(learning_rate='fast')", lambda: pa.PPOConfig(learning_rate="fast"), pa.ConfigError, "ppo.learning_rate"),
    ("PPOConfig(objective='x')", lambda: pa.PPOConfig(objective="x"), pa.ConfigError, "ppo.objective"),
    ("PPOConfig(num_epochs=10**9)", lambda: _config(ppo=pa.PPOConfig(num_epochs=10**9)), pa.ConfigError, "ppo.num_epochs"),
    ("RolloutConfig(num_envs=True)", lambda: pa.RolloutConfig(num_envs=True), pa.ConfigError, "rollout.num_envs"),
    ("RolloutConfig(num_envs=10**8)", lambda: _config(rollout=pa.RolloutConfig(num_envs=10**8)), pa.ConfigError, "rollout.num_envs"),
    ("RolloutConfig(num_steps=10**8)", lambda: _config(rollout=pa.RolloutConfig(num_steps=10**8)), pa.ConfigError, "rollout.num_steps"),
    ("NetworkConfig(actor_hidden=(0,))", lambda: pa.NetworkConfig(actor_hidden=(0,)), pa.ConfigError, "network.actor_hidden"),
    ("NetworkConfig(actor_hidden='64')", lambda: pa.NetworkConfig(actor_hidden="64"), pa.ConfigError, "network.actor_hidden"),
    ("NetworkConfig(actor_hidden=(10**5,)*2)", lambda: _config(network=pa.NetworkConfig(actor_hidden=(100_000, 100_000))),
     pa.ConfigError, "network.actor_hidden"),
    ("LagConfig(K=-1)", lambda: pa.LagConfig(K=-1), pa.ConfigError, "lag.K"),
    ("LagConfig(high<low)", lambda: pa.LagConfig(low=3, high=1), pa.ConfigError, "lag.high"),
    ("ThreadedConfig(num_samplers=0)", lambda: pa.ThreadedConfig(num_samplers=0), pa.ConfigError, "threaded.num_samplers"),
    ("config_from_dict('x')", lambda: pa.config_from_dict("x"), pa.ConfigError, "config"),
    ("config_from_dict(ppo.gama)", lambda: pa.config_from_dict({"ppo": {"gama": 0.9}}), pa.ConfigError, "ppo.gamma"),
    ("config_from_dict(totl_env_steps)", lambda: pa.config_from_dict({"totl_env_steps": 1}), pa.ConfigError, "total_env_steps"),
    ("config_from_dict(ppo=3)", lambda: pa.config_from_dict({"ppo": 3}), pa.ConfigError, "ppo"),
    ("replace_path(ppo.gama)", lambda: pa.replace_path(pa.Config(), "ppo.gama", 0.9), pa.ConfigError, "ppo.gamma"),
    ("replace_path(rollout.num_env)", lambda: pa.replace_path(pa.Config(), "rollout.num_env", 8), pa.ConfigError, "rollout.num_envs"),
    ("replace_path(ppo.rho_bar=1.0, gae)", lambda: pa.replace_path(pa.Config(), "ppo.rho_bar", 1.0), pa.ConfigError, "ppo.rho_bar"),
    ("replace_path(ppo.c_bar=1.0, gae)", lambda: pa.replace_path(pa.Config(), "ppo.c_bar", 1.0), pa.ConfigError, "ppo.c_bar"),
    ("replace_path(ppo.is_clip=2.0, ppo)", lambda: pa.replace_path(pa.Config(), "ppo.is_clip", 2.0), pa.ConfigError, "ppo.is_clip"),
    ("train('not a config')", lambda: pa.train("not a config"), TypeError, "config"),
    ("train({})", lambda: pa.train({}), TypeError, "config"),
    ("train(None)", lambda: pa.train(None), TypeError, "config"),
    ("train(run_dir=/proc/x)", lambda: pa.train(pa.Config(run_dir="/proc/ppo_async_x")), pa.ConfigError, "run_dir"),
    ("train(memory)", lambda: pa.train(pa.Config(rollout=pa.RolloutConfig(num_envs=20_000_000), total_env_steps=2_560_000_000)),
     pa.ConfigError, "rollout.num_envs"),
    ("sweep(seeds=[-1])", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, seeds=[-1]), pa.ConfigError, "seeds"),
    ("sweep(seeds=0)", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, seeds=0), pa.ConfigError, "seeds"),
    ("sweep(seeds=[1, 1])", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, seeds=[1, 1]), pa.ConfigError, "seeds"),
    ("sweep(seeds='3')", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, seeds="3"), pa.ConfigError, "seeds"),
    ("sweep(seeds=[1.5])", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, seeds=[1.5]), pa.ConfigError, "seeds"),
    ("sweep(seeds=10**5)", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, seeds=10**5), pa.ConfigError, "seeds"),
    ("sweep('x')", lambda: pa.sweep("x", {"ppo.clip_eps": [0.1]}), TypeError, "config"),
    ("sweep(grid ppo.gama)", lambda: pa.sweep(pa.Config(), {"ppo.gama": [0.9]}), pa.ConfigError, "ppo.gamma"),
    ("sweep(grid clip_eps=2)", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [2.0]}), pa.ConfigError, "ppo.clip_eps"),
    ("sweep(grid rho_bar, gae)", lambda: pa.sweep(pa.Config(), {"ppo.rho_bar": [1.0]}), pa.ConfigError, "ppo.rho_bar"),
    ("sweep(grid {})", lambda: pa.sweep(pa.Config(), {}), pa.ConfigError, "grid"),
    ("sweep(strategy)", lambda: pa.sweep(pa.Config(), {"ppo.clip_eps": [0.1]}, strategy="fast"), pa.ConfigError, "strategy"),
    ("sweep(memory)", lambda: pa.sweep(pa.Config(rollout=pa.RolloutConfig(num_envs=2_000_000), total_env_steps=128_000_000),
                                       {"ppo.clip_eps": [0.1, 0.2, 0.3]}, seeds=8), pa.ConfigError, "rollout.num_envs"),
    ("config_for_env('Nope-v0')", lambda: pa.config_for_env("Nope-v0"), pa.ConfigError, "env"),
    ("config_for_env(seed=-1)", lambda: pa.config_for_env("Pendulum-v1", {"seed": -1}), pa.ConfigError, "seed"),
    ("config_for_env(ppo.gama)", lambda: pa.config_for_env("Pendulum-v1", {"ppo.gama": 0.9}), pa.ConfigError, "ppo.gamma"),
    ("config_for_env(rho_bar)", lambda: pa.config_for_env("Pendulum-v1", {"ppo.rho_bar": 1.0}), pa.ConfigError, "ppo.rho_bar"),
]


def run_api(call) -> tuple[BaseException | str | None, str]:
    """(the exception `call` raised, or "accepted" / None; its message)."""
    try:
        call()
    except Accepted:
        return "accepted", ""
    except Exception as exc:  # noqa: BLE001
        return exc, str(exc)
    return None, ""


@pytest.mark.parametrize("name,call,kind,field", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_api_call(name, call, kind, field, stop_before_running, monkeypatch):
    from ppo_async.config import resources

    monkeypatch.setattr(resources, "host_memory_bytes", lambda: 64 * 2**30)  # the same limit on every machine
    exc, message = run_api(call)
    assert isinstance(exc, kind), f"{name}: got {exc!r}"
    assert field in message and "\n" not in message, message


def test_table_size():
    """The issue asks for at least 150 distinct bad inputs."""
    assert len(set(c[0] for c in CLI_CASES)) + len(set(c[0] for c in API_CASES)) >= 150


def test_memory_estimate_names_the_driver():
    """The estimate grows with what drives it, and the error names that field and both sizes."""
    from ppo_async.config import resources

    big = pa.Config(rollout=pa.RolloutConfig(num_envs=20_000_000), total_env_steps=2_560_000_000)
    assert resources.estimate_bytes(big) > 100 * 2**30
    assert resources.estimate_bytes(pa.Config()) < 2**20
    with pytest.raises(pa.ConfigError, match=r"rollout.num_envs = 20000000 is invalid: .*GiB.* host memory is 16.0 GiB"):
        resources.check_memory(big, 16 * 2**30)
    seeds = pa.Config(num_seeds=5000, total_env_steps=5_000_000)
    with pytest.raises(pa.ConfigError, match="^num_seeds = 5000"):
        resources.check_memory(seeds, 2**30)
    resources.check_memory(big, None)  # an unknown limit checks nothing


SUBPROCESS_CASES = [  # (argv, the flag named, whether JAX may start: the run directory is checked as the run starts)
    (["train", "--ppo.clip-eps", "2.0"], "--ppo.clip-eps", False),
    (["train", "--total-env-steps", "1000000000000000"], "--total-env-steps", False),
    (["train", "--run-dir", "/proc/ppo_async_x"], "--run-dir", True),
]


@pytest.mark.parametrize("argv,field,jax", SUBPROCESS_CASES, ids=[" ".join(a) for a, _, _ in SUBPROCESS_CASES])
def test_bad_command_line_in_a_subprocess(argv, field, jax):
    """`python -m ppo_async` itself: status 2, one line on stderr, and (for a config error) no JAX."""
    # the entry point runs the atexit handlers, then ends the process (`dispatch.exit_process`)
    code = ("import atexit, runpy, sys; sys.argv = ['ppo_async', *sys.argv[1:]]\n"
            "atexit.register(lambda: sys.stdout.write('jax' if 'jax' in sys.modules else 'no-jax'))\n"
            "runpy.run_module('ppo_async', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith(f"error: {field} = "), done.stderr
    assert done.stdout.endswith("jax" if jax else "no-jax")


def test_help_and_config_errors_import_no_jax():
    """`--help` of every command and a bad config, parsed and validated, import no JAX."""
    code = (
        "import contextlib, io, json, sys\n"
        "from ppo_async.cli import main\n"
        "from ppo_async.cli.dispatch import COMMANDS\n"
        "out = {}\n"
        "for argv in [['--help'], *[[c, '--help'] for c in COMMANDS], ['train', '--ppo.clip-eps', '2'],\n"
        "             ['train', '--rollout.num-envs', '100000000'], ['train', '--ppo.gama', '1']]:\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
        "        out[' '.join(argv)] = main(argv)\n"
        "import ppo_async as pa\n"
        "try:\n    pa.Config(ppo=pa.PPOConfig(num_epochs=10**9))\n"
        "except pa.ConfigError:\n    pass\n"
        "print(json.dumps({'status': out, 'jax': [m for m in ('jax', 'gymnax', 'brax') if m in sys.modules]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["jax"] == []
    assert all(status == (0 if "--help" in argv else 2) for argv, status in result["status"].items()), result
