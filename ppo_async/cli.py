"""Command line: `python -m ppo_async train|plot|eval ...`.

`train [--env NAME] [--mode sync] [--seed N] ...` trains (`train --resume RUN_DIR` continues
a run from its latest checkpoint); `plot RUN_DIR...` (re)writes the PNG plots; `eval RUN_DIR`
plays episodes with the checkpoint's deterministic policy.

Every `Config` field is a flag (`--ppo.clip-eps 0.1`, `--rollout.num-envs 32`), with help
text from the field docstrings (tyro). `--config FILE` (JSON or YAML) sets a base config that
command-line flags override. User errors (bad values, unknown env names, unreadable files)
print one line naming the problem and exit with status 2, without a traceback.

Environment variables for XLA are set here, at the entry point, never at library import.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from typing import Annotated, Sequence

USAGE = """usage: python -m ppo_async COMMAND [OPTIONS]

commands:
  train    train PPO (python -m ppo_async train --help lists every option);
           train --resume RUN_DIR continues a run from its latest checkpoint
  plot     plot RUN_DIR [RUN_DIR ...] [--out DIR]: (re)write the PNG plots of runs; with
           several runs also a combined learning curve (into --out, default the first RUN_DIR)
  eval     eval RUN_DIR [--episodes 20] [--seed-index 0] [--seed 0] [--stochastic]: play
           episodes with the latest checkpoint's policy (deterministic unless --stochastic)
"""


@dataclasses.dataclass(frozen=True)
class TrainArgs:
    """Train PPO on a gymnax environment. `--config FILE` (JSON/YAML) sets the base config;
    flags override it. Writes RUN_DIR/config.json and RUN_DIR/metrics.jsonl."""

    cfg: "Config"
    quiet: bool = False
    """No progress bar or summary (for scripts)."""
    config: str | None = None
    """JSON or YAML file with a (partial, nested) config; command-line flags override it."""


def _load_config_file(path: str) -> dict:
    from ppo_async.config import ConfigError

    if not os.path.isfile(path):
        raise ConfigError(f"--config {path!r}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is a user error
        raise ConfigError(f"--config {path!r}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path!r}: expected a mapping of config fields")
    return data


def _pop_option(args: list[str], name: str) -> str | None:
    """Removes `--name VALUE` / `--name=VALUE` from args and returns VALUE."""
    for i, arg in enumerate(args):
        if arg == name:
            if i + 1 >= len(args):
                from ppo_async.config import ConfigError

                raise ConfigError(f"{name} needs a value")
            value = args[i + 1]
            del args[i : i + 2]
            return value
        if arg.startswith(name + "="):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def default_run_dir(env: str, mode: str) -> str:
    """runs/<env>-<mode>-<timestamp>."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{env}-{mode}-{stamp}")


def parse_train_args(argv: Sequence[str]) -> TrainArgs:
    """Parses `train` options into a validated Config (raises ConfigError on bad values)."""
    import tyro

    from ppo_async.config import Config, config_from_dict

    args = list(argv)
    config_path = _pop_option(args, "--config")
    base = config_from_dict(_load_config_file(config_path)) if config_path else Config()
    spec = Annotated[Config, tyro.conf.arg(name="")]
    wrapper = dataclasses.make_dataclass(
        "TrainArgs",
        [
            ("cfg", spec),
            ("quiet", bool, dataclasses.field(default=False)),
            ("config", str | None, dataclasses.field(default=config_path)),
        ],
        frozen=True,
    )
    wrapper.__doc__ = TrainArgs.__doc__
    parsed = tyro.cli(
        wrapper,
        default=wrapper(cfg=base, quiet=False, config=config_path),
        args=args,
        prog="python -m ppo_async train",
        description=TrainArgs.__doc__,
    )
    return TrainArgs(cfg=parsed.cfg, quiet=parsed.quiet, config=config_path)


def run_train(argv: Sequence[str]) -> int:
    """The `train` command (`train --resume RUN_DIR [--quiet]` continues a run)."""
    import numpy as np

    from ppo_async.config import ConfigError
    from ppo_async.rundir import read_run_config
    from ppo_async.train import train

    args = list(argv)
    resume_dir = _pop_option(args, "--resume")
    if resume_dir is not None:
        quiet = "--quiet" in args
        extra = [a for a in args if a != "--quiet"]
        if extra:
            raise ConfigError(
                f"train --resume takes the config from RUN_DIR/config.json; unexpected arguments {extra} "
                "(only --quiet is allowed)"
            )
        config = read_run_config(resume_dir)
    else:
        parsed = parse_train_args(args)
        quiet = parsed.quiet
        config = parsed.cfg
        if config.run_dir is None:
            config = config.replace(run_dir=default_run_dir(config.env, config.mode))
    if not quiet:
        print(
            f"ppo_async: {config.env}, mode={config.mode}, {config.num_seeds} seed(s) x "
            f"{config.num_iterations * config.batch_size} env steps -> {config.run_dir}"
            + (" (resuming)" if resume_dir is not None else ""),
            flush=True,
        )
    result = train(config, progress=not quiet, resume=resume_dir is not None)
    parsed_quiet = quiet
    if not parsed_quiet:
        final = result.final_returns()
        steps = config.num_iterations * config.batch_size
        sps = steps * config.num_seeds / max(result.run_seconds, 1e-9)
        print(
            f"done: {steps} env steps per seed in {result.run_seconds:.1f}s "
            f"(+{result.compile_seconds:.1f}s compile), {sps:,.0f} env steps/s; "
            f"final return (mean of last 10% of iterations): "
            + ", ".join(f"{r:.1f}" for r in final)
            + (f" (mean {np.nanmean(final):.1f})" if len(final) > 1 else ""),
            flush=True,
        )
        print(f"metrics: {os.path.join(config.run_dir, 'metrics.jsonl')}", flush=True)
    return 0


def _check_run_dir(run_dir: str) -> None:
    from ppo_async.config import ConfigError

    if not os.path.isdir(run_dir):
        raise ConfigError(f"run directory {run_dir!r} does not exist")
    if not os.path.isfile(os.path.join(run_dir, "metrics.jsonl")):
        raise ConfigError(f"{run_dir!r} is not a run directory: no metrics.jsonl in it")


def run_plot(argv: Sequence[str]) -> int:
    """The `plot` command: `plot RUN_DIR [RUN_DIR ...] [--out DIR]`."""
    from ppo_async.config import ConfigError

    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    out = _pop_option(args, "--out")
    unknown = [a for a in args if a.startswith("--")]
    if unknown:
        raise ConfigError(f"plot: unknown option(s) {unknown}")
    if not args:
        raise ConfigError("plot needs at least one RUN_DIR")
    for run_dir in args:
        _check_run_dir(run_dir)
    written = write_plots(args, out)
    for path in written:
        print(path)
    return 0


def write_plots(run_dirs: Sequence[str], out: str | None = None) -> list[str]:
    """`plots.plot_run` of every run; with several runs also `learning_curve_combined.png`
    (median and 25-75% band per run, labelled by directory name) in `out` (default: the first)."""
    import pandas as pd

    from ppo_async import plots
    from ppo_async.metrics import read_jsonl

    written: list[str] = []
    for run_dir in run_dirs:
        written.extend(plots.plot_run(run_dir))
    if len(run_dirs) > 1:
        runs = {}
        for run_dir in run_dirs:
            name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
            if name in runs:
                name = run_dir
            runs[name] = pd.DataFrame(read_jsonl(os.path.join(run_dir, "metrics.jsonl")))
        path = os.path.join(out or run_dirs[0], "learning_curve_combined.png")
        plots.learning_curve(runs, x="env_steps", path=path)
        written.append(path)
    return written


def run_eval(argv: Sequence[str]) -> int:
    """The `eval` command: `eval RUN_DIR [--episodes 20] [--seed-index 0] [--seed 0] [--stochastic]`."""
    from ppo_async.config import ConfigError
    from ppo_async.policy import evaluate
    from ppo_async.train import load

    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0

    def int_option(name: str, default: int) -> int:
        value = _pop_option(args, name)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ConfigError(f"{name} = {value!r} is invalid: must be an integer") from None

    episodes = int_option("--episodes", 20)
    seed_index = int_option("--seed-index", 0)
    seed = int_option("--seed", 0)
    stochastic = "--stochastic" in args
    args = [a for a in args if a != "--stochastic"]
    unknown = [a for a in args if a.startswith("--")]
    if unknown:
        raise ConfigError(f"eval: unknown option(s) {unknown}")
    if len(args) != 1:
        raise ConfigError(f"eval needs exactly one RUN_DIR, got {args}")
    if episodes < 1:
        raise ConfigError(f"--episodes = {episodes} is invalid: must be an integer >= 1")
    policy = load(args[0], seed_index=seed_index)
    result = evaluate(policy, episodes, seed=seed, deterministic=not stochastic)
    returns = result["returns"]
    print(
        f"mean return {float(returns.mean()):.2f} +- {float(returns.std()):.2f} over {episodes} episodes "
        f"({'stochastic' if stochastic else 'deterministic'} policy, seed index {seed_index}, iteration {policy.iteration})",
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m ppo_async`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    from ppo_async.checkpoint import CheckpointError
    from ppo_async.config import ConfigError
    from ppo_async.metrics import NonFiniteError
    from ppo_async.xla_flags import enable_compilation_cache

    commands = {"train": run_train, "plot": run_plot, "eval": run_eval}
    if command not in commands:
        print(f"error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)
    try:
        return commands[command](rest)
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NonFiniteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
