"""Command line: `python -m ppo_async train [--env NAME] [--mode sync] [--seed N] ...`.

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
  train    train PPO (python -m ppo_async train --help lists every option)
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
    """The `train` command."""
    import numpy as np

    from ppo_async.train import train

    parsed = parse_train_args(argv)
    config = parsed.cfg
    if config.run_dir is None:
        config = config.replace(run_dir=default_run_dir(config.env, config.mode))
    if not parsed.quiet:
        print(
            f"ppo_async: {config.env}, mode={config.mode}, {config.num_seeds} seed(s) x "
            f"{config.num_iterations * config.batch_size} env steps -> {config.run_dir}",
            flush=True,
        )
    result = train(config, progress=not parsed.quiet)
    if not parsed.quiet:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m ppo_async`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    from ppo_async.config import ConfigError
    from ppo_async.metrics import NonFiniteError

    commands = {"train": run_train}
    if command not in commands:
        print(f"error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[command](rest)
    except ConfigError as exc:
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
