"""The registry of execution modes: how `train()` finds a mode without importing it by name.

Each mode module registers a `Mode` when it is imported (`ppo_async.modes` imports them all).
`train`, `load` and `resume` look modes up here, so no mode ever imports back up into them,
and a new mode (or launcher) is one more `register_mode` call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ppo_async.config import ConfigError


@dataclass(frozen=True)
class Mode:
    """One execution mode.

    Attributes:
      name: the `Config.mode` value.
      run: `run(config, recorder, resume) -> TrainResult`: the host loop; it says *when*
        (rows, checkpoints), the `RunRecorder` says *what is written*.
      checkpoint_like: `checkpoint_like(config)` -> the abstract (ShapeDtypeStruct) pytree
        its checkpoints hold, for restoring; its `.train_state` has a leading seed axis.
      resumable: whether `train(..., resume=True)` continues its runs exactly (a resumed run
        computes bit for bit what the uninterrupted one would have: sync, simulated). What
        needs that (a benchmark that compares runs) tests this.
      why_not_resumable: the reason when it does not.
      resumes_learner: whether `train(..., resume=True)` continues its runs all the same, not
        exactly: the learner's whole state restored exactly, what depends on timing made anew
        (threaded: the lag).
    """

    name: str
    run: Callable[..., Any]
    checkpoint_like: Callable[[Any], Any]
    resumable: bool = True
    why_not_resumable: str = ""
    resumes_learner: bool = False

    @property
    def can_resume(self) -> bool:
        """Whether `train(..., resume=True)` continues its runs (exactly or not)."""
        return self.resumable or self.resumes_learner


_MODES: dict[str, Mode] = {}


def register_mode(mode: Mode) -> Mode:
    """Adds (or replaces) a mode under `mode.name`; returns it."""
    _MODES[mode.name] = mode
    return mode


def get_mode(name: str) -> Mode:
    """The registered mode `name`; ConfigError listing the registered ones otherwise."""
    try:
        return _MODES[name]
    except KeyError:
        raise ConfigError(f"mode = {name!r} is not available; registered modes: {sorted(_MODES)}") from None


def mode_names() -> tuple[str, ...]:
    return tuple(sorted(_MODES))
