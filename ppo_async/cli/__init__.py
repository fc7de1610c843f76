"""Layer 9, `cli/`: `python -m ppo_async COMMAND`, one tyro subcommand per command. May import every layer below.

`dispatch` (the entry point `main` and the subcommands), `train`, `tools` (eval / plot /
compare), `tune`, `launch`: each command a frozen dataclass of its options; `parsing` (tyro
with one-line errors, in the user's words), `config_file` (`--config FILE`), `paths` (the paths
a command line names, checked before they are read or written), `noise` (library noise at the
entry point).
"""

from ppo_async.cli.config_file import nest_dotted_keys
from ppo_async.cli.dispatch import main
from ppo_async.cli.train import parse_train_args

__all__ = ["main", "nest_dotted_keys", "parse_train_args"]
