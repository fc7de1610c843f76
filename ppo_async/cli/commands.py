"""Command line: `python -m ppo_async train|plot|compare|eval ...`.

`train [--env NAME] [--mode sync] [--seed N] ...` trains (`train --resume RUN_DIR` continues
a run from its latest checkpoint); `plot RUN_DIR... [--labels ...]` (re)writes the PNG plots;
`compare RUN_DIR... [--labels ...] [--out DIR]` overlays several runs and prints their
`summarize` table; `eval RUN_DIR [--step N]` plays episodes with a checkpoint's policy.

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
import traceback
from typing import Annotated, Any, Sequence

USAGE = """usage: python -m ppo_async COMMAND [OPTIONS]

commands:
  train    train PPO (python -m ppo_async train --help lists every option);
           train --resume RUN_DIR [--quiet] [--total-env-steps N] continues a run from its
           latest checkpoint (a larger N extends it)
  plot     plot RUN_DIR [RUN_DIR ...] [--labels A B ...] [--out DIR]: (re)write the PNG plots
           of runs; with several runs also a combined learning curve (into --out, default the
           first RUN_DIR)
  compare  compare RUN_DIR [RUN_DIR ...] [--labels A B ...] [--out DIR] [--threshold X]:
           overlaid figures of the runs and their summary table (--out default:
           <first RUN_DIR's parent>/compare)
  eval     eval RUN_DIR [--episodes 20] [--step N] [--seed-index 0] [--seed 0] [--stochastic]:
           play episodes with a checkpoint's policy (deterministic unless --stochastic)
  tune     tune [--config FILE] [--env NAME] [--kl-target 0.02] [--budget-per-run N] [--out DIR]:
           the tuning recipe (buffer, samplers' knee, batch, then clip/epochs/minibatches on a
           replayed schedule); writes report.md, plots and chosen_config.json
  launch   launch --num-processes N [--port P] -- train [TRAIN OPTIONS]: one threaded run as N
           local processes (jax.distributed over 127.0.0.1; process 0 writes the run dir)

`python -m ppo_async COMMAND --help` describes each command's options.
"""

PLOT_HELP = """usage: python -m ppo_async plot RUN_DIR [RUN_DIR ...] [--labels A B ...] [--out DIR]

(Re)writes the PNG plots of each run into its RUN_DIR (learning_curve.png, kl_over_time.png,
throughput.png, and lag_histogram.png / kl_per_lag.png / sampler_time.png where the metrics
have those columns) and prints the paths written.

options:
  -h, --help           show this help and exit
  --labels A B ...     one label per RUN_DIR, in order, for the legends (default: the
                       directories' names); takes every value up to the next option
  --out DIR            where the combined learning curve of several runs,
                       learning_curve_combined.png, goes (default: the first RUN_DIR)
"""

COMPARE_HELP = """usage: python -m ppo_async compare RUN_DIR [RUN_DIR ...] [--labels A B ...] [--out DIR] [--threshold X]

Reads each RUN_DIR/metrics.jsonl, writes overlaid figures of the runs into --out
(return_vs_env_steps.png and return_vs_wall_time.png: median over seeds with a 25-75% band;
kl_over_time.png; lag_histogram.png: the fraction of samples per lag) plus summary.csv, and
prints the summary table (ppo_async.summarize), one row per run.

options:
  -h, --help           show this help and exit
  --labels A B ...     one label per RUN_DIR, in order (default: the directories' names);
                       takes every value up to the next option
  --out DIR            output directory (default: the first RUN_DIR's parent / "compare")
  --threshold X        also report the median env steps to reach return X and how many
                       seeds reach it ("k/n")
"""

EVAL_HELP = """usage: python -m ppo_async eval RUN_DIR [--episodes 20] [--step N] [--seed-index 0] [--seed 0] [--stochastic]

Plays episodes with the policy of a checkpoint of RUN_DIR and prints the mean return.

options:
  -h, --help           show this help and exit
  --episodes N         episodes to play (default: 20)
  --step N             the checkpoint step (learner iteration) to load (default: the latest;
                       an absent step is an error listing the available ones)
  --seed-index I       which seed of a multi-seed run (default: 0)
  --seed S             seed of the evaluation episodes (default: 0)
  --stochastic         sample actions instead of the deterministic (mean / argmax) action
"""

TUNE_HELP = """usage: python -m ppo_async tune [--config FILE] [--env NAME] [--kl-target 0.02] [--budget-per-run N]
                              [--out DIR] [--seeds 1] [--max-samplers 6] [--throughput-target X]
                              [--replay-seeds 2] [--quiet]

The tuning recipe of asynchronous PPO on threaded runs (ppo_async.study.tune; README "Tuning"):
(1) samplers and buffer length until the mean KL to the behaviour policy is under the target;
(2) samplers 1, 2, ... to the throughput knee; (3) bigger batches per sampler; (4) clip,
epochs and minibatches on the simulated mode replaying the chosen setting's version schedule.
Prints each step's grid, rule and choice. Writes into --out: report.md, knee.png,
kl_vs_buffer.png, chosen_config.json (python -m ppo_async train --config it),
measurements.jsonl and schedules/. Run again with the same --out, it skips finished runs.

options:
  -h, --help               show this help and exit
  --config FILE            JSON or YAML starting config (mode, if set, must be 'threaded'); the
                           env's preset fills what it leaves out, and so do 4 samplers and a
                           16-chunk buffer (the throughput-first start the recipe cuts back)
  --env NAME               the env (over the file's; default Pendulum-v1)
  --kl-target X            mean KL every step keeps under (default: 0.02)
  --budget-per-run N       env steps of each run (default: the config's total_env_steps)
  --out DIR                output directory (default: runs/tune-<env>-<timestamp>)
  --seeds N                threaded runs per setting, averaged (default: 1)
  --max-samplers N         the most samplers step 2 tries (default: 6)
  --throughput-target X    env steps/s at which step 3 is skipped (default: always try it)
  --replay-seeds N         seeds of step 4's simulated sweep (default: 2)
  --quiet                  print only the chosen setting and where the report is
"""

CLI_RUN_DIR = "runs/<env>-<mode>-<timestamp>"
"""The CLI's default --run-dir (shown by `train --help`); replaced by `default_run_dir`."""

RUN_DIR_HELP = (
    "Directory for config.json, metrics.jsonl, checkpoints/, tb/ and plots. CLI default: a new "
    "runs/<env>-<mode>-<timestamp> (e.g. runs/Pendulum-v1-sync-20250101-120000); None means the same."
)
QUIET_HELP = "No progress bar or start line; still prints the one-line summary (final return, run dir)."
CONFIG_HELP = "JSON or YAML file with a (partial, nested) config; command-line flags override it."
RESUME_HELP = (
    "Continue the run in RUN_DIR from its latest complete checkpoint, with the config in "
    "RUN_DIR/config.json (other flags: only --quiet, and --total-env-steps N to extend it)."
)


@dataclasses.dataclass(frozen=True)
class TrainArgs:
    """Train PPO on an environment (gymnax, brax/*, playground/*, gymnasium/*). `--config FILE`
    (JSON/YAML) sets the base config; flags override it; the env's preset (README) fills the
    fields neither sets. Writes RUN_DIR/config.json and RUN_DIR/metrics.jsonl."""

    cfg: "Config"
    quiet: bool = False
    """No progress bar or start line; the one-line summary is still printed."""
    config: str | None = None
    """JSON or YAML file with a (partial, nested) config; command-line flags override it."""
    preset: dict | None = None
    """The env preset's fields applied (dotted field -> value), those neither the file nor a flag set."""


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
    return nest_dotted_keys(data)


def nest_dotted_keys(data: dict) -> dict:
    """`{"ppo.gamma": 0.9, "ppo": {"clip_eps": 0.1}}` -> `{"ppo": {"gamma": 0.9, "clip_eps": 0.1}}`:
    config files may use dotted keys (as the command line does), nested sections, or both."""
    out: dict = {}
    for key, value in data.items():
        section, dot, name = str(key).partition(".")
        if dot:
            out.setdefault(section, {})
            if not isinstance(out[section], dict):
                from ppo_async.config import ConfigError

                raise ConfigError(f"config key {key!r}: {section!r} is not a section")
            out[section][name.replace("-", "_")] = value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key].update(value)
        else:
            out[key] = value
    return out


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


def _join_processes(args: Sequence[str]) -> list[str]:
    """Several processes (`--distributed.*`, here or in `--config`): joins them before the
    options are parsed, since checking a gymnax env name imports gymnax, which runs JAX.
    Returns the options the full parse needs on top of `args`: with `distributed.cluster`,
    the layout the cluster gave (else none)."""
    from ppo_async.runtime import distributed

    if not any(a.startswith("--distributed.") for a in args) and "--config" not in " ".join(args):
        return []
    config_path = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None)
    config_path = config_path or next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
    section = _load_config_file(config_path).get("distributed", {}) if config_path else {}
    asked = distributed.distributed_from_args(args, section if isinstance(section, dict) else {})
    joined = distributed.initialize(asked)
    return distributed.cluster_flags(joined) if asked.cluster != "none" and asked.process_id is None else []


def default_run_dir(env: str, mode: str) -> str:
    """runs/<env>-<mode>-<timestamp>."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{env}-{mode}-{stamp}")


def _cli_config_type() -> type:
    """Config with the CLI's help for `--run-dir` (its default is CLI_RUN_DIR, not None)."""
    import tyro

    from ppo_async.config import Config

    run_dir = Annotated[str | None, tyro.conf.arg(help=RUN_DIR_HELP)]
    return dataclasses.make_dataclass(
        "Config", [("run_dir", run_dir, dataclasses.field(default=None))], bases=(Config,), frozen=True
    )


def parse_train_args(argv: Sequence[str]) -> TrainArgs:
    """Parses `train` options into a validated Config (raises ConfigError on bad values).

    Without `--run-dir` (here or in `--config`) the run goes to `default_run_dir(env, mode)`.
    `--help` prints every option and raises SystemExit(0) (tyro).
    """
    from ppo_async.config import presets
    from ppo_async.config import Config, config_from_dict, get_path, replace_paths

    args = list(argv)
    config_path = _pop_option(args, "--config")
    file_data = _load_config_file(config_path) if config_path else {}
    base = config_from_dict(file_data) if config_path else Config()
    parsed = _tyro_parse(args, base, config_path)
    # The env's preset fills what neither the file nor a flag set: parsing again on a base
    # with the preset applied keeps every flag (a flag overrides its default either way).
    applied = presets.preset_changes(parsed.cfg.env, file_data)
    if applied:  # the first parse with the preset on top is valid as a base (env and mode as parsed)
        first = Config(**{f.name: getattr(parsed.cfg, f.name) for f in dataclasses.fields(Config)})
        parsed = _tyro_parse(args, replace_paths(first, applied), config_path)
    cfg = parsed.cfg
    applied = {path: get_path(cfg, path) for path in applied if get_path(cfg, path) == applied[path]}
    run_dir = cfg.run_dir if cfg.run_dir not in (None, CLI_RUN_DIR) else default_run_dir(cfg.env, cfg.mode)
    config = Config(**{**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Config)}, "run_dir": run_dir})
    return TrainArgs(cfg=config, quiet=parsed.quiet, config=config_path, preset=applied)


def _tyro_parse(args: list[str], base: "Config", config_path: str | None) -> Any:
    """tyro's parse of the train flags over the defaults of `base`."""
    import tyro

    from ppo_async.config import Config

    cli_type = _cli_config_type()
    values = {f.name: getattr(base, f.name) for f in dataclasses.fields(Config)}
    default_cfg = cli_type(**{**values, "run_dir": base.run_dir or CLI_RUN_DIR})
    wrapper = dataclasses.make_dataclass(
        "TrainArgs",
        [
            ("cfg", Annotated[cli_type, tyro.conf.arg(name="")]),
            ("quiet", Annotated[bool, tyro.conf.arg(help=QUIET_HELP)], dataclasses.field(default=False)),
            ("config", Annotated[str | None, tyro.conf.arg(help=CONFIG_HELP, metavar="FILE")],
             dataclasses.field(default=config_path)),
            ("resume", Annotated[str | None, tyro.conf.arg(help=RESUME_HELP, metavar="RUN_DIR")],
             dataclasses.field(default=None)),
        ],
        frozen=True,
    )
    wrapper.__doc__ = TrainArgs.__doc__
    return tyro.cli(
        wrapper,
        default=wrapper(cfg=default_cfg, quiet=False, config=config_path, resume=None),
        args=args,
        prog="python -m ppo_async train",
        description=TrainArgs.__doc__,
    )


def _resume_config(args: list[str], resume_dir: str) -> tuple["Config", bool]:
    """(config of RUN_DIR, quiet) for `train --resume RUN_DIR [--quiet] [--total-env-steps N]`
    (a larger N extends a run; the rest of the config comes from RUN_DIR/config.json)."""
    from ppo_async.config import ConfigError
    from ppo_async.run.rundir import read_run_config

    args = list(args)
    total = _pop_option(args, "--total-env-steps")
    quiet = "--quiet" in args
    extra = [a for a in args if a != "--quiet"]
    if extra:
        raise ConfigError(
            f"train --resume takes the config from RUN_DIR/config.json; unexpected arguments {extra} "
            "(only --quiet and --total-env-steps N are allowed)"
        )
    config = read_run_config(resume_dir)
    if total is not None:
        try:
            steps = int(total)
        except ValueError:
            raise ConfigError(f"--total-env-steps = {total!r} is invalid: must be an integer") from None
        config = config.replace(total_env_steps=steps)
    return config, quiet


def run_train(argv: Sequence[str]) -> int:
    """The `train` command (`train --resume RUN_DIR [--quiet]` continues a run).

    Prints a start line, the progress bar and a two-line summary; with `--quiet` only one
    line: the final return and the run directory.
    """
    import numpy as np

    from ppo_async.modes.train import train

    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        _pop_option(args, "--resume")
        parse_train_args(args)  # prints the help (with --config FILE's values) and raises SystemExit(0)
    resume_dir = _pop_option(args, "--resume")
    args += _join_processes(args)
    preset: dict = {}
    if resume_dir is not None:
        config, quiet = _resume_config(args, resume_dir)
    else:
        parsed = parse_train_args(args)
        config, quiet, preset = parsed.cfg, parsed.quiet, parsed.preset or {}
    if not quiet:
        print(
            f"ppo_async: {config.env}, mode={config.mode}, {config.num_seeds} seed(s) x "
            f"{config.num_iterations * config.batch_size} env steps -> {config.run_dir}"
            + (" (resuming)" if resume_dir is not None else ""),
            flush=True,
        )
        if preset:
            from ppo_async.config.presets import describe

            print(f"env preset for {config.env} (fields no flag or --config set): {describe(preset)}", flush=True)
    result = train(config, progress=not quiet, resume=resume_dir is not None)
    final = result.final_returns()
    finals = ", ".join("none ended" if np.isnan(r) else f"{r:.1f}" for r in final)
    if len(final) > 1 and not np.all(np.isnan(final)):
        finals += f" (mean {np.nanmean(final):.1f})"
    for message in result.extras.get("warnings", []):  # see ppo_async.report.health: even with --quiet
        print(f"warning: {message}", flush=True)
    if quiet:
        print(f"final return (mean of last 10% of iterations): {finals}; run dir: {config.run_dir}", flush=True)
        return 0
    steps = config.num_iterations * config.batch_size
    sps = steps * config.num_seeds / max(result.run_seconds, 1e-9)
    print(
        f"done: {steps} env steps per seed in {result.run_seconds:.1f}s "
        f"(+{result.compile_seconds:.1f}s compile), {sps:,.0f} env steps/s; "
        f"final return (mean of last 10% of iterations): {finals}",
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


def _pop_list_option(args: list[str], name: str) -> list[str] | None:
    """Removes `--name V1 V2 ...` (every value up to the next `--option`) and returns the
    values; None when `--name` is absent. `--name=V` gives one value."""
    from ppo_async.config import ConfigError

    for i, arg in enumerate(args):
        if arg.startswith(name + "="):
            del args[i]
            return [arg.split("=", 1)[1]]
        if arg == name:
            j = i + 1
            while j < len(args) and not args[j].startswith("--"):
                j += 1
            values = args[i + 1 : j]
            del args[i:j]
            if not values:
                raise ConfigError(f"{name} needs at least one value")
            return values
    return None


def _dir_name(run_dir: str) -> str:
    return os.path.basename(os.path.normpath(os.path.abspath(run_dir)))


def run_labels(run_dirs: Sequence[str], labels: Sequence[str] | None) -> list[str]:
    """One label per run dir: `labels` (ConfigError unless one per dir, all different) or
    the directories' names (a repeated name falls back to the path as given)."""
    from ppo_async.config import ConfigError

    if labels is not None:
        if len(labels) != len(run_dirs):
            raise ConfigError(
                f"--labels: got {len(labels)} label(s) {list(labels)} for {len(run_dirs)} run dir(s); give one label per RUN_DIR"
            )
        if len(set(labels)) != len(labels):
            raise ConfigError(f"--labels: {list(labels)} has repeated labels; each run needs its own")
        return list(labels)
    names = [_dir_name(d) for d in run_dirs]
    return [name if names.count(name) == 1 else run_dir for name, run_dir in zip(names, run_dirs)]


def _parse_run_dirs(argv: Sequence[str], command: str, options: Sequence[str]) -> tuple[list[str], list[str], dict]:
    """(run dirs, labels, {option: value}) of `COMMAND RUN_DIR... [--labels ...] [options]`;
    ConfigError for unknown options, no RUN_DIR, missing dirs or metrics.jsonl, bad labels."""
    from ppo_async.config import ConfigError

    args = list(argv)
    labels = _pop_list_option(args, "--labels")
    values = {name: _pop_option(args, name) for name in options}
    unknown = [a for a in args if a.startswith("-")]
    if unknown:
        raise ConfigError(f"{command}: unknown option(s) {unknown} (see python -m ppo_async {command} --help)")
    if not args:
        raise ConfigError(f"{command} needs at least one RUN_DIR")
    for run_dir in args:
        _check_run_dir(run_dir)
    return args, run_labels(args, labels), values


def run_plot(argv: Sequence[str]) -> int:
    """The `plot` command: `plot RUN_DIR [RUN_DIR ...] [--labels A B ...] [--out DIR]`."""
    if any(a in ("-h", "--help") for a in argv):
        print(PLOT_HELP)
        return 0
    run_dirs, labels, values = _parse_run_dirs(argv, "plot", ["--out"])
    for path in write_plots(run_dirs, values["--out"], labels):
        print(path)
    return 0


def write_plots(run_dirs: Sequence[str], out: str | None = None, labels: Sequence[str] | None = None) -> list[str]:
    """`plots.plot_run` of every run; with several runs also `learning_curve_combined.png`
    (median and 25-75% band per run, labelled by `labels`, default the directory names) in
    `out` (default: the first run dir)."""
    from ppo_async.report import plots

    labels = run_labels(run_dirs, labels)
    written: list[str] = []
    for run_dir, label in zip(run_dirs, labels):
        written.extend(plots.plot_run(run_dir, label=label))
    if len(run_dirs) > 1:
        runs = {label: plots.read_run_metrics(d, "plot") for d, label in zip(run_dirs, labels)}
        path = os.path.join(out or run_dirs[0], "learning_curve_combined.png")
        plots.learning_curve(runs, x="env_steps", path=path)
        written.append(path)
    return written


def default_compare_dir(run_dirs: Sequence[str]) -> str:
    """`compare`'s default --out: the first run dir's parent / "compare"."""
    return os.path.join(os.path.dirname(os.path.normpath(os.path.abspath(run_dirs[0]))), "compare")


def summary_text(table: "Any") -> str:
    """A summary table (`summarize` rows, indexed by run label) as printed by `compare`:
    floats in `%.6g`, NaN as "nan", one line per run."""
    return table.to_string(float_format=lambda v: f"{v:.6g}", na_rep="nan")


def run_compare(argv: Sequence[str]) -> int:
    """The `compare` command: overlaid figures and the summary table of several runs."""
    import pandas as pd

    from ppo_async.report import plots
    from ppo_async.report.analysis import summarize
    from ppo_async.config import ConfigError

    if any(a in ("-h", "--help") for a in argv):
        print(COMPARE_HELP)
        return 0
    run_dirs, labels, values = _parse_run_dirs(argv, "compare", ["--out", "--threshold"])
    threshold = None
    if values["--threshold"] is not None:
        try:
            threshold = float(values["--threshold"])
        except ValueError:
            raise ConfigError(f"--threshold = {values['--threshold']!r} is invalid: must be a number") from None
    runs = {}
    for run_dir, label in zip(run_dirs, labels):
        try:
            runs[label] = plots.read_run_metrics(run_dir, "compare")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    out = values["--out"] or default_compare_dir(run_dirs)
    written = plots.compare_runs(runs, out)
    table = pd.concat([summarize(df, threshold=threshold) for df in runs.values()], ignore_index=True)
    table.index = pd.Index(list(runs), name="run")
    table.to_csv(os.path.join(out, "summary.csv"))
    written.append(os.path.join(out, "summary.csv"))
    print(f"compare: {len(runs)} runs -> {out}")
    for path in written:
        print(path)
    print(summary_text(table), flush=True)
    return 0


def run_eval(argv: Sequence[str]) -> int:
    """The `eval` command: `eval RUN_DIR [--episodes 20] [--step N] [--seed-index 0] [--seed 0] [--stochastic]`."""
    from ppo_async.config import ConfigError
    from ppo_async.run.policy import evaluate
    from ppo_async.modes.train import load

    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(EVAL_HELP)
        return 0

    episodes = _number_option(args, "--episodes", int, 20)
    step = _number_option(args, "--step", int, None)
    seed_index = _number_option(args, "--seed-index", int, 0)
    seed = _number_option(args, "--seed", int, 0)
    stochastic = "--stochastic" in args
    args = [a for a in args if a != "--stochastic"]
    unknown = [a for a in args if a.startswith("--")]
    if unknown:
        raise ConfigError(f"eval: unknown option(s) {unknown} (see python -m ppo_async eval --help)")
    if len(args) != 1:
        raise ConfigError(f"eval needs exactly one RUN_DIR, got {args}")
    if episodes < 1:
        raise ConfigError(f"--episodes = {episodes} is invalid: must be an integer >= 1")
    if step is not None and step < 0:
        raise ConfigError(f"--step = {step} is invalid: must be a checkpoint step >= 0")
    policy = load(args[0], seed_index=seed_index, step=step)
    result = evaluate(policy, episodes, seed=seed, deterministic=not stochastic)
    returns = result["returns"]
    print(
        f"mean return {float(returns.mean()):.2f} +- {float(returns.std()):.2f} over {episodes} episodes "
        f"({'stochastic' if stochastic else 'deterministic'} policy, seed index {seed_index}, iteration {policy.iteration})",
        flush=True,
    )
    return 0


def _number_option(args: list[str], name: str, kind: type, default: Any) -> Any:
    """Pops `name VALUE` from `args` as `kind` (int / float); ConfigError naming it when not one."""
    from ppo_async.config import ConfigError

    value = _pop_option(args, name)
    if value is None:
        return default
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{name} = {value!r} is invalid: must be {'an integer' if kind is int else 'a number'}") from None


def run_tune(argv: Sequence[str]) -> int:
    """The `tune` command (see TUNE_HELP)."""
    from ppo_async.config import ConfigError
    from ppo_async.config.presets import describe
    from ppo_async.study.tune import start_config, tune

    args = list(argv)
    if any(a in ("-h", "--help") for a in args):
        print(TUNE_HELP)
        return 0
    config_path, env, out = (_pop_option(args, name) for name in ("--config", "--env", "--out"))
    kl_target = _number_option(args, "--kl-target", float, 0.02)
    budget = _number_option(args, "--budget-per-run", int, None)
    seeds = _number_option(args, "--seeds", int, 1)
    max_samplers = _number_option(args, "--max-samplers", int, 6)
    throughput_target = _number_option(args, "--throughput-target", float, None)
    replay_seeds = _number_option(args, "--replay-seeds", int, 2)
    quiet = "--quiet" in args
    args = [a for a in args if a != "--quiet"]
    if args:
        raise ConfigError(f"tune: unexpected argument(s) {args} (see python -m ppo_async tune --help)")
    config, filled = start_config(_load_config_file(config_path) if config_path else {}, env)
    out = out or default_run_dir(config.env, "tune").replace(f"{config.env}-tune", f"tune-{config.env}")
    if not quiet:
        print(f"tune {config.env} from {config_path or 'the default config'}; filled in: {describe(filled) or 'nothing'}",
              flush=True)
    result = tune(config, kl_target=kl_target, budget_per_run=budget, out=out, seeds=seeds, max_samplers=max_samplers,
                  throughput_target=throughput_target, replay_seeds=replay_seeds, progress=not quiet)
    changed = {k: v for step in result.steps for k, v in step.choice.items()}
    print(f"chosen: {describe(changed)}; report {out}/report.md; train it: python -m ppo_async train --config "
          f"{out}/chosen_config.json", flush=True)
    return 0


def _is_orbax_coroutine(obj: Any) -> bool:
    """A coroutine of orbax's own code (its array reads, left pending by a failed restore)."""
    code = getattr(obj, "cr_code", None)
    filename = getattr(code, "co_filename", "") or ""
    return f"{os.sep}orbax{os.sep}" in filename


def quiet_library_noise() -> None:
    """Silences what orbax / tensorstore print around a failed checkpoint read (entry point only).

    Reading a corrupted checkpoint makes orbax log ERROR lines through absl ("Failed to json
    parse Metadata file ..."), asyncio log "Task exception was never retrieved" with a
    TensorStore spec per array, and tensorstore's reader threads report dozens of unraisable
    `RuntimeError: Event loop is closed` (callbacks into the asyncio loop orbax has already
    closed). Python also reports every array-read coroutine the failure left pending ("Exception
    ignored in: <coroutine object _read_array_index_and_device_put>", each with a TensorStore
    spec: ~40-90 KB in all). The CheckpointError we raise says what is wrong in one line, so
    here: the "absl", "orbax" and "asyncio" loggers only pass CRITICAL records, and
    `sys.unraisablehook` drops exactly those RuntimeErrors and the unraisable exceptions of
    orbax's coroutines (any other unraisable exception is reported as before).
    Idempotent.
    """
    import logging
    import warnings

    # ... and at exit "RuntimeWarning: coroutine 'Store._get_array_metadatas' was never
    # awaited" for orbax coroutines it never started (ppo_async itself has no coroutines).
    warnings.filterwarnings("ignore", message=r"coroutine .* was never awaited", category=RuntimeWarning)
    for name in ("absl", "orbax", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        import absl.logging

        absl.logging.set_verbosity(absl.logging.FATAL)
    except ImportError:  # pragma: no cover - absl comes with orbax
        pass
    previous = sys.unraisablehook
    if getattr(previous, "_ppo_async_quiet", False):
        return

    def hook(unraisable: "Any") -> None:
        exc = unraisable.exc_value
        if isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed":
            return
        if _is_orbax_coroutine(unraisable.object):
            return
        previous(unraisable)

    hook._ppo_async_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m ppo_async`; returns the exit status (2: user error, one line
    on stderr; 3: NaN/inf in training; 4: another process of a multi-process run failed or
    died; 130: interrupted). `--help` of a command returns 0."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    from ppo_async.run.checkpoint import CheckpointError
    from ppo_async.config import ConfigError, DistributedFailure
    from ppo_async.report.metrics import NonFiniteError
    from ppo_async.runtime.xla_flags import enable_compilation_cache

    commands = {"train": run_train, "plot": run_plot, "compare": run_compare, "eval": run_eval, "launch": run_launch, "tune": run_tune}
    if command not in commands:
        print(f"error: unknown command {command!r}\n{USAGE}", file=sys.stderr)
        return 2
    quiet_library_noise()
    enable_compilation_cache()  # persistent XLA cache ($PPO_ASYNC_COMPILATION_CACHE=0 turns it off)
    try:
        return _finish_processes(commands[command](rest))
    except (ConfigError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _finish_processes(2, str(exc))
    except DistributedFailure as exc:  # another process failed first: its failure, not this one's
        print(f"error: {exc}", file=sys.stderr)
        return _finish_processes(DistributedFailure.exit_status, str(exc), report=False)
    except NonFiniteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return _finish_processes(3, str(exc))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return _finish_processes(130, "interrupted")
    except BaseException as exc:
        if _joined_processes():  # the traceback, then out (see _finish_processes)
            traceback.print_exc()
            _finish_processes(1, f"{type(exc).__name__}: {exc}")
        raise
    except SystemExit as exc:  # tyro: --help (0) and its own usage errors (2, already printed)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)


def _joined_processes() -> bool:
    """Whether this process joined a multi-process run (jax.distributed) - without importing JAX."""
    jax = sys.modules.get("jax")
    return jax is not None and jax.distributed.is_initialized()


def _finish_processes(code: int, failure: str = "", report: bool = True) -> int:
    """The exit status of a command; in a multi-process run, leaves jax.distributed as well:
    after success with its shutdown barrier (every process has finished); after a failure
    with `os._exit` (a barrier with a failed peer would wait for it until aborted), once the
    others can know why (`distributed.leave_after_failure`: process 0 waits for them)."""
    if not _joined_processes():
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        sys.modules["jax"].distributed.shutdown()
        return code
    from ppo_async.runtime import distributed

    distributed.leave_after_failure(failure or f"exit status {code}", report=report)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_launch(argv: Sequence[str]) -> int:
    """The `launch` command (see `ppo_async.runtime.launch`): checks the train options as process 0
    would parse them (a bad value stops here, before any process starts), then runs them."""
    from ppo_async.runtime import launch

    split = launch.split_launch_args(argv)
    if split is None:
        print(launch.LAUNCH_HELP)
        return 0
    own, train_args = split
    num_processes, port = launch.parse_launch_options(own)
    parsed = parse_train_args(launch.process_args(train_args, num_processes, 0, f"127.0.0.1:{port or 1}")[1:])
    if not any(a == "--run-dir" or a.startswith("--run-dir=") for a in train_args):
        train_args = [*train_args, "--run-dir", parsed.cfg.run_dir]  # one directory for every process
    return launch.launch(train_args, num_processes, port, heartbeat_s=parsed.cfg.distributed.heartbeat_timeout_s)


if __name__ == "__main__":
    sys.exit(main())
