"""MuJoCo's notices about Gymnasium's own model files, dropped; every other MuJoCo warning kept.

MuJoCo prints a user warning as `WARNING: <message>` from C unless a Python hook is set
(`mujoco.set_mju_user_warning`). Gymnasium's HalfCheetah-v5 XML sets the compiler attribute
`settotalmass`, deprecated after MuJoCo 3.3.7: every model compiled from it (the probe that reads
the env's spaces, then one per env per sampler) printed a line that says nothing about the run.
The hook must be installed before the first model is compiled, so every place that builds a
Gymnasium MuJoCo env calls `filter_mujoco_notices` first.

Message forms seen (`KNOWN_MUJOCO_NOTICES` matches each by a fragment, so a reworded tail
still matches): MuJoCo 3.17.0, 4.0.0 and 4.0.1 all send
"compiler attribute 'settotalmass' is deprecated and will be removed in a future release:
scale the masses and densities in the model, or call mj_setTotalmass and mj_setConst on the
compiled model"; MuJoCo 3.3.7 sends none.
"""

from __future__ import annotations

import sys
import threading

KNOWN_MUJOCO_NOTICES = ("'settotalmass' is deprecated",)
"""Fragments of MuJoCo warnings about Gymnasium's model files, not about a run."""

_notice_filter_lock = threading.Lock()


def is_known_notice(message: str) -> bool:
    """Whether a MuJoCo warning is one of `KNOWN_MUJOCO_NOTICES` (a fragment anywhere in it)."""
    return any(fragment in message for fragment in KNOWN_MUJOCO_NOTICES)


def mujoco_warning(message: str, stream=None) -> None:
    """MuJoCo's user-warning hook: a known notice is dropped, any other warning printed as
    MuJoCo prints it (`WARNING: <message>`, on stderr)."""
    if not is_known_notice(message):
        print(f"WARNING: {message}", file=stream or sys.stderr, flush=True)


def filter_mujoco_notices() -> bool:
    """Installs `mujoco_warning` as MuJoCo's process-wide warning hook where nothing else has
    set one (a user's own hook is left alone). Idempotent; returns whether ours is installed
    (False also where MuJoCo is not installed)."""
    try:
        import mujoco
    except ImportError:
        return False
    with _notice_filter_lock:
        current = mujoco.get_mju_user_warning()
        if current is None:
            mujoco.set_mju_user_warning(mujoco_warning)
            current = mujoco.get_mju_user_warning()
        return current is mujoco_warning
