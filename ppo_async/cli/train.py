"""`python -m ppo_async train`: every `Config` field a flag, `--config FILE` under them, the env
preset under both; `train --resume RUN_DIR` continues a run.

The flags are parsed by tyro over a default built before the parse (`prepare`): the config
file's fields, and the env's preset on the fields the file leaves out (the env, and the mode,
as the flags or the file say). A flag overrides its default either way, so the preset fills
exactly what neither the file nor a flag sets. With `--resume RUN_DIR` the default is the
run's own config and only `--quiet`, `--timings` and `--total-env-steps N` may change it.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shlex
from typing import Annotated, Any, Mapping, Sequence

import numpy as np
import tyro

from ppo_async.cli.parsing import PROG, Explained, in_their_words, parse
from ppo_async.cli.progress import Waiting
from ppo_async.runtime.launch import peer_done_line
from ppo_async.cli.config_file import file_config, file_fields, load_config_file
from ppo_async.config import Config, DistributedConfig, check_given_apply, get_path, presets, replace_paths
from ppo_async.config.checks import FieldFailures, every_failure, field_of, field_paths
from ppo_async.errors import ConfigError

CLI_RUN_DIR = "runs/<env>-<mode>-<timestamp>"
"""The CLI's default --run-dir (shown by `train --help`); replaced by `default_run_dir`."""


def default_run_dir(env: str, mode: str) -> str:
    """runs/<env>-<mode>-<timestamp>."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join("runs", f"{env}-{mode}-{stamp}")


@dataclasses.dataclass(frozen=True)
class CliConfig(Config):
    """`Config` with the command line's default run directory."""

    run_dir: str | None = CLI_RUN_DIR
    """Directory for config.json, metrics.jsonl, checkpoints/, tb/ and plots. CLI default: a new runs/<env>-<mode>-<timestamp> (e.g. runs/Pendulum-v1-sync-20250101-120000); None means the same."""


def cli_config(config: Config) -> CliConfig:
    """`config` as the parse's default (no run_dir: the CLI's default one)."""
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(Config)}
    return CliConfig(**{**values, "run_dir": config.run_dir or CLI_RUN_DIR})


@dataclasses.dataclass(frozen=True)
class TrainRun:
    """A parsed `train` command line: the validated config (its run_dir resolved) and the rest."""

    cfg: Config
    quiet: bool = False
    timings: bool = False
    config: str | None = None
    resume: str | None = None
    preset: dict = dataclasses.field(default_factory=dict)
    """The env preset's fields applied (dotted field -> value): those neither the file nor a flag set."""


@dataclasses.dataclass(frozen=True)
class TrainCommand:
    """Train PPO on an environment (gymnax, brax/*, playground/*, gymnasium/*). Every Config
    field is a flag; flags override the config of --config FILE, and the env's preset
    (docs/reference/presets.md) fills the fields neither sets. Writes RUN_DIR/config.json and
    RUN_DIR/metrics.jsonl. With a run directory, train --resume RUN_DIR continues that run from
    its latest checkpoint instead (other options: only --quiet, --timings, and
    --total-env-steps N to extend it)."""

    cfg: Annotated[CliConfig, tyro.conf.arg(name="")] = dataclasses.field(default_factory=CliConfig)
    quiet: bool = False
    """No progress bar or start line; still prints the one-line summary (final return, run dir)."""
    timings: bool = False
    """Also print where the seconds before the first result went: before train() (interpreter, imports), set-up (env, programs), tracing, lowering, XLA compile, the writers, the first iteration. Every run writes them to RUN_DIR/startup.json."""
    config: Annotated[str | None, tyro.conf.arg(metavar="FILE")] = None
    """JSON or YAML file with a (partial, nested) config; command-line flags override it."""
    resume: Annotated[str | None, tyro.conf.arg(metavar="RUN_DIR")] = None
    """Continue the run in RUN_DIR from its latest complete checkpoint, with the config in RUN_DIR/config.json (other flags: only --quiet, --timings, and --total-env-steps N to extend it)."""
    preset: tyro.conf.Suppress[dict] = dataclasses.field(default_factory=dict)
    """The env preset's fields in the default (dotted field -> value)."""
    given: tyro.conf.Suppress[tuple] = ()
    """The dotted fields the command line sets by flag (`given_fields`)."""
    file_fields: tyro.conf.Suppress[tuple] = ()
    """The dotted fields the --config FILE sets."""

    def resolved(self) -> TrainRun:
        """The run: a plain `Config` with the CLI default run_dir made concrete, and the preset
        fields that kept the preset's value. A ConfigError names each field where the user set it."""
        try:
            return self._resolved()
        except ConfigError as exc:
            raise self.explained(exc) from None

    def explained(self, exc: ConfigError) -> Explained:
        """`exc` in the user's words: a field set in --config FILE named as its key there, else as its flag."""
        return Explained(in_their_words(exc, train_fields(), self.config, self.file_fields, self.given))

    def _resolved(self) -> TrainRun:
        cfg = self.cfg
        run_dir = cfg.run_dir if cfg.run_dir not in (None, CLI_RUN_DIR) else default_run_dir(cfg.env, cfg.mode)
        config = Config(**{**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Config)}, "run_dir": run_dir})
        check_given_apply(config, self.given)  # a field set by hand that this run never reads, whatever its value
        applied = {path: value for path, value in self.preset.items() if get_path(config, path) == value}
        return TrainRun(cfg=config, quiet=self.quiet, timings=self.timings, config=self.config, resume=self.resume,
                        preset=applied)

    def run(self) -> int:
        run = self.resolved()
        try:
            return run_train(run)
        except Explained:
            raise
        except ConfigError as exc:  # e.g. run_dir (from a flag or the file) checked as the run starts
            raise self.explained(exc) from None


@dataclasses.dataclass(frozen=True)
class _Given:
    """What the default of the full parse depends on (read first; every other flag is left over)."""

    config: str | None = None
    resume: str | None = None
    env: str | None = None
    mode: str | None = None


@dataclasses.dataclass(frozen=True)
class _ResumeOptions:
    """The options `train --resume RUN_DIR` accepts."""

    resume: str
    quiet: bool = False
    timings: bool = False
    total_env_steps: int | None = None


def _resume_refusal(tokens: list[str]) -> str:
    return (f"train --resume takes the config from RUN_DIR/config.json; unexpected arguments {tokens} "
            "(only --quiet, --timings and --total-env-steps N are allowed)")


def prepare(args: Sequence[str], join: bool = False) -> tuple[list[str], TrainCommand]:
    """(the options to parse, the parse's default) of `train ARGS`. With `join`, a run of several
    processes (`--distributed.*`, here or in `--config`) is joined first, since checking a gymnax
    env name imports gymnax, which runs JAX; the layout a cluster gave is added to the options."""
    args = list(args)
    given, rest = parse(_Given, args, command="train", return_unknown_args=True, add_help=False)
    helping = any(a in ("-h", "--help") for a in rest)
    if given.resume is not None and not helping:
        from ppo_async.run.rundir import read_run_config  # reads checkpoints: JAX

        parse(_ResumeOptions, args, command="", unknown=_resume_refusal)
        config = read_run_config(given.resume)
        check_resume_config(given.resume, config)
        return args, TrainCommand(cfg=cli_config(config), resume=given.resume)
    file_data = load_config_file(given.config) if given.config else {}
    if join and not helping:
        args += _join_processes(args, file_data)
    base = file_config(given.config, file_data) if given.config else Config()
    env, mode = given.env or base.env, given.mode or base.mode
    preset = presets.preset_changes(env, file_data)
    if preset:  # the preset on the file's config, for the env and mode as given
        base = replace_paths(base, {"env": env, "mode": mode, **preset})
    return args, TrainCommand(cfg=cli_config(base), config=given.config, preset=preset, given=given_fields(args),
                              file_fields=tuple(file_fields(file_data)))


def check_resume_config(run_dir: str, config: Config) -> None:
    """ConfigError (one line) when RUN_DIR/config.json no longer matches the config its latest
    checkpoint was written with (up to the fields a resumed run may change): the fields that
    differ, before a restore would report the mismatch leaf by leaf (`pa.resume` checks the
    same, `recorder.check_resume_config`). No checkpoint: nothing to compare (the run reports
    it as it starts)."""
    from ppo_async.run import rundir
    from ppo_async.run.recorder import check_resume_config as check

    try:
        check(config, source=os.path.join(run_dir, rundir.CONFIG_FILE))
    except ConfigError as exc:
        raise Explained(str(exc)) from None


def train_fields() -> list[str]:
    """The names a train error may start with that the command line spells as flags."""
    return [*field_paths(Config), *(f.name for f in dataclasses.fields(TrainCommand))]


def train_error(exc: ConfigError, args: Sequence[str]) -> Explained:
    """A rejected `train ARGS` as one line in the user's words (`in_their_words`: each field
    named by the flag or the --config FILE key that set it), an unknown env they named first:
    the parse leaves the env check out (a gymnax name starts JAX), so it is made here, for a
    command line refused anyway."""
    if isinstance(exc, Explained):
        return exc
    flags, config, fields, env = _origins(args)
    failures = exc.failures if isinstance(exc, FieldFailures) else [(field_of(str(exc)), str(exc))]
    if env is not None and all(field != "env" and f"env = {env!r}" not in message for field, message in failures):
        from ppo_async.envs.registry import check_env_name

        try:
            check_env_name(env)
        except ConfigError as env_error:
            failures = [("env", str(env_error)), *failures]
    return Explained(in_their_words(FieldFailures(failures), train_fields(), config, fields, flags))


def _origins(args: Sequence[str]) -> tuple[tuple[str, ...], str | None, tuple[str, ...], str | None]:
    """(the fields `train ARGS` sets by flag, its --config FILE, the fields the file sets, the
    env the flags or the file name); what cannot be read is left out."""
    flags = given_fields(args)
    try:
        given, _ = parse(_Given, args, command="train", return_unknown_args=True, add_help=False)
    except ConfigError:
        return flags, None, (), None
    data: dict = {}
    if given.config:
        try:
            data = load_config_file(given.config)
        except ConfigError:
            pass
    env = given.env or data.get("env")
    return flags, given.config, tuple(file_fields(data)), env if isinstance(env, str) else None


def given_fields(args: Sequence[str]) -> tuple[str, ...]:
    """The dotted fields `train ARGS` sets by flag (`--ppo.rho-bar 1.0` -> `ppo.rho_bar`). A
    config file's keys are not counted: a saved config (RUN_DIR/config.json, tune's
    chosen_config.json) lists every field, so its inert fields are refused by value only."""
    paths = [arg[2:].partition("=")[0].replace("-", "_") for arg in args if arg.startswith("--")]
    return tuple(dict.fromkeys(paths))


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The `distributed.*` options, read before the full parse to join the processes."""

    distributed: DistributedConfig = dataclasses.field(default_factory=DistributedConfig)


def distributed_layout(args: Sequence[str], file_data: Mapping[str, Any] | None = None) -> DistributedConfig | None:
    """The `distributed` section asked for by `train ARGS` (`--distributed.*` over a config
    file's section), read before the full parse to join the processes; None when neither sets
    any. A bad value is a ConfigError naming the field (the full parse checks everything again)."""
    section = (file_data or {}).get("distributed", {})
    section = section if isinstance(section, dict) else {}
    if not section and not any(a.startswith("--distributed.") for a in args):
        return None
    with every_failure(own=True):  # a layout with a failed field is never joined
        default = _Layout(DistributedConfig(**section))
        return parse(_Layout, args, command="train", default=default, return_unknown_args=True,
                     add_help=False)[0].distributed


def _join_processes(args: Sequence[str], file_data: dict) -> list[str]:
    """Joins the processes of a multi-process run (nothing for one process); returns the
    options the full parse needs on top of `args`: the layout a cluster gave (else none)."""
    asked = distributed_layout(args, file_data)
    if asked is None:
        return []
    from ppo_async.runtime import distributed  # joining processes starts JAX

    joined = distributed.initialize(asked)
    return distributed.cluster_flags(joined) if asked.cluster != "none" and asked.process_id is None else []


def parse_train_args(args: Sequence[str]) -> TrainRun:
    """The `train` options (without the command name) as a validated run (ConfigError on bad
    values; `--help` prints every option and raises SystemExit(0)). Without `--run-dir` (here
    or in `--config`) the run goes to `default_run_dir(env, mode)`. Joins no processes."""
    args, default = prepare(args)
    command = parse(TrainCommand, args, f"{PROG} train", command="train", default=default)
    return command.resolved()


def run_train(run: TrainRun) -> int:
    """Trains: a start line, the progress bar and a two-line summary; with `--quiet` only one
    line, the final return and the run directory. Each warning of the run is printed once
    either way: as it arises above the progress, or (with `--quiet`) after the run."""
    from ppo_async.modes.train import train  # here, not at import: `--help` and config errors need no JAX

    config = run.cfg
    process = config.distributed.process_id or 0
    if process != 0:  # another process of a multi-process run: process 0 speaks for the run
        result = train(config, progress=False, resume=run.resume is not None)
        print(peer_done_line(process, _peer_summary(result)), flush=True)
        return 0
    if not run.quiet:
        print(f"ppo_async: {config.env}, mode={config.mode}, {config.num_seeds} seed(s) x "
              f"{config.num_iterations * config.batch_size} env steps -> {config.run_dir}"
              + (" (resuming)" if run.resume is not None else "")
              + "; compiling first (seconds to minutes on CPU), then the progress", flush=True)
        if run.preset:
            print(f"env preset for {config.env} (fields no flag or --config set): {presets.describe(run.preset)}",
                  flush=True)
    with Waiting("compiling", enabled=not run.quiet) as waiting:  # until the first iteration
        result = train(config, progress=not run.quiet, resume=run.resume is not None, on_iteration=waiting.done)
    finals = _finals(result.final_returns())
    if run.quiet:  # with the progress on, each warning was printed once as it arose (above the bar)
        for message in result.extras.get("warnings", []):  # see ppo_async.report.health
            print(f"warning: {message}", flush=True)
    if run.quiet:
        print(f"final return (mean of last 10% of iterations): {finals}; run dir: {config.run_dir}", flush=True)
    else:
        steps = config.num_iterations * config.batch_size
        sps = steps * config.num_seeds / max(result.run_seconds, 1e-9)
        print(f"done: {steps} env steps per seed in {result.run_seconds:.1f}s (+{result.compile_seconds:.1f}s compile), "
              f"{sps:,.0f} env steps/s; final return (mean of last 10% of iterations): {finals}", flush=True)
        plots = ("PNG plots in the run dir" if config.plots
                 else f"plots: python -m ppo_async plot {shlex.quote(config.run_dir)}")
        print(f"metrics: {os.path.join(config.run_dir, 'metrics.jsonl')}; {plots}", flush=True)
    if run.timings and result.extras.get("startup"):
        from ppo_async.run.startup import STARTUP_FILE, describe

        print(f"{describe(result.extras['startup'])} ({os.path.join(config.run_dir, STARTUP_FILE)})", flush=True)
    return 0


def _peer_summary(result: Any) -> str:
    """What a process other than 0 says at the end: its times and final return (no paths)."""
    return (f"{result.run_seconds:.1f}s (+{result.compile_seconds:.1f}s compile), final return "
            f"{_finals(result.final_returns())}")


def _finals(final: Any) -> str:
    """Each seed's final return ("none ended" for NaN), and their mean when several have one."""
    text = ", ".join("none ended" if np.isnan(r) else f"{r:.1f}" for r in final)
    if len(final) > 1 and not np.all(np.isnan(final)):
        text += f" (mean {np.nanmean(final):.1f})"
    return text

