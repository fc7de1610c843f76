"""Layer 9, `cli/`: `python -m ppo_async COMMAND`. May import every layer below."""

from ppo_async.cli.commands import main

__all__ = ["main"]
