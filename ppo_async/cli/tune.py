"""`python -m ppo_async tune`: the tuning recipe of asynchronous PPO (`ppo_async.study.tune`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import tyro

from ppo_async.cli.config_file import file_fields, load_config_file
from ppo_async.cli.parsing import Explained, in_their_words
from ppo_async.cli.paths import check_output_dir
from ppo_async.cli.train import default_run_dir
from ppo_async.config.checks import every_failure
from ppo_async.config.presets import describe
from ppo_async.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class TuneCommand:
    """The tuning recipe of asynchronous PPO on threaded runs (docs/how-to/tune.md): samplers and
    buffer until the KL to the behaviour policy is under the target, samplers up to the
    throughput knee, bigger batches, then clip, epochs and minibatches on the simulated mode
    replaying the chosen setting's version schedule. Prints each step's grid, rule and choice;
    writes report.md, knee.png, kl_vs_buffer.png, chosen_config.json (train --config it),
    measurements.jsonl and schedules/ into the output directory. Run again on the same one, it
    skips finished runs."""

    config: Annotated[str | None, tyro.conf.arg(metavar="FILE")] = None
    """JSON or YAML starting config (mode, if set, must be 'threaded'); the env's preset fills what it leaves out, and so do 4 samplers and a 16-chunk buffer (the throughput-first start the recipe cuts back)."""
    env: Annotated[str | None, tyro.conf.arg(metavar="NAME", help_behavior_hint="(default: the file's, else Pendulum-v1)")] = None
    """The env (over the file's)."""
    kl_target: Annotated[float, tyro.conf.arg(metavar="X")] = 0.02
    """Mean KL every step keeps under."""
    budget_per_run: Annotated[int | None, tyro.conf.arg(metavar="N", help_behavior_hint="(default: the config's total_env_steps)")] = None
    """Env steps of each run."""
    out: Annotated[str | None, tyro.conf.arg(metavar="DIR", help_behavior_hint="(default: runs/tune-<env>-<timestamp>)")] = None
    """Output directory."""
    seeds: Annotated[int, tyro.conf.arg(metavar="N")] = 1
    """Threaded runs per setting, averaged."""
    max_samplers: Annotated[int, tyro.conf.arg(metavar="N")] = 6
    """The most samplers step 2 tries."""
    throughput_target: Annotated[float | None, tyro.conf.arg(metavar="X", help_behavior_hint="(default: always try it)")] = None
    """Env steps/s at which step 3 is skipped."""
    replay_seeds: Annotated[int, tyro.conf.arg(metavar="N")] = 2
    """Seeds of step 4's simulated sweep."""
    quiet: bool = False
    """Print only the chosen setting and where the report is."""

    def run(self) -> int:
        from ppo_async.study.tune import start_config, tune  # here: `--help` and parse errors need no JAX

        data = load_config_file(self.config) if self.config else {}
        try:
            with every_failure(own=True):
                config, filled = start_config(data, self.env)
        except ConfigError as exc:  # a field of the file named as its key there (--env as the flag)
            raise Explained(in_their_words(exc, ["env"], self.config, (*file_fields(data), ""),
                                           ("env",) if self.env else ())) from None
        out = self.out or default_run_dir(config.env, "tune").replace(f"{config.env}-tune", f"tune-{config.env}")
        check_output_dir("--out", out)
        if not self.quiet:
            print(f"tune {config.env} from {self.config or 'the default config'}; filled in: {describe(filled) or 'nothing'}",
                  flush=True)
        result = tune(config, kl_target=self.kl_target, budget_per_run=self.budget_per_run, out=out, seeds=self.seeds,
                      max_samplers=self.max_samplers, throughput_target=self.throughput_target,
                      replay_seeds=self.replay_seeds, progress=not self.quiet)
        changed = {k: v for step in result.steps for k, v in step.choice.items()}
        print(f"chosen: {describe(changed)}; report {out}/report.md; train it: python -m ppo_async train --config "
              f"{out}/chosen_config.json", flush=True)
        return 0
