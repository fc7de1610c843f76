"""Layer 7, `modes/`: the execution modes and `train()`, the one entry that picks one.

`registry` (modes by name), `common` (what every mode's host loop shares), `sync`,
`simulated`, `threaded/` (sampler threads, the learner thread, their programs and the run
lifecycle) and `train` (`train`, `load`, `resume`: the dispatcher). Importing this package
registers every mode. May import every layer below: `errors` .. `run`. Never `study` or `cli`.
"""

from ppo_async.modes import simulated, sync, threaded  # noqa: F401  (registers every mode)
