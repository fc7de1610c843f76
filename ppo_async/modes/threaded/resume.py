"""Resuming a threaded run: what its checkpoints carry beside the train state, and where the
learner starts again (pure).

A threaded checkpoint's arrays are the learner's `TrainState` (params, optimiser state,
normalisation statistics, version and step counters); its metadata's `mode_state` holds the
rest of the learner: its RNG key for the next iteration, the KL controller's state (its lag
knobs and learning-rate scale, from which the resumed learner sets its stale filter and
learning rate) and the sample accounting at that iteration. A resumed run restores all of it exactly; its samplers
start again from the restored params (the ParamStore's first snapshot) with fresh env states
and keys derived from the iteration. What cannot be carried over is timing: the lag history is
not replayed (the resumed run's lags emerge anew), the chunks resident in the buffer when the
run stopped are lost with it (counted: `dropped_at_resume`), and the per-sampler counters
(`sampler_*`) start again from zero. Rows of a resumed run carry `resumed_at_iteration`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

import jax
import numpy as np

from ppo_async.core import kl_control
from ppo_async.core.types import TrainState
from ppo_async.modes.threaded.shared import LearnerState
from ppo_async.run.checkpoint import CheckpointError

MODE_STATE_KEY = "mode_state"
# The row fields a resumed run's accounting continues from (running totals at the checkpoint).
CARRIED = ("samples_produced", "samples_consumed", "samples_resident", "dropped_forced_refresh",
           "dropped_overwritten", "dropped_stale_total")


@dataclass(frozen=True)
class LearnerStart:
    """Where a threaded run's learner starts: nothing done (a fresh run), or a resumed run's
    totals at its checkpoint. The buffer and the samplers start afresh either way."""

    iteration: int = 0  # learner iterations done: the checkpoint's (0: a fresh run)
    produced: int = 0  # samples produced before (the new buffer's counters start at 0)
    consumed: int = 0
    forced: int = 0  # dropped by forced refreshes before
    overwritten: int = 0
    stale: int = 0  # dropped by the learner's stale filter before
    lost: int = 0  # resident in the buffer when a run stopped, over every resume so far
    wall_time: float = 0.0  # seconds the run had taken up to the checkpoint
    control: kl_control.ControllerState | None = None  # the KL controller's state (None: fresh or off)

    @property
    def resumed(self) -> bool:
        return self.iteration > 0


class ResumePoint(NamedTuple):
    """A threaded checkpoint, restored: the learner's state and where it starts."""

    train_state: TrainState  # without a seed axis, on the host or the default device
    key: np.ndarray  # the learner's RNG key for iteration `start.iteration + 1`
    start: LearnerStart


def controller_to_json(state: kl_control.ControllerState | None) -> dict[str, Any] | None:
    """The KL controller's state as JSON (`kl_control.state_to_dict`: its knobs, learning-rate
    scale, windows and history of finite KLs; kl_mean and aims may be None)."""
    return None if state is None else kl_control.state_to_dict(state)


def controller_from_json(data: Mapping[str, Any] | None) -> kl_control.ControllerState | None:
    """Inverse of `controller_to_json` (a checkpoint written before a field existed gives its default)."""
    return None if data is None else kl_control.state_from_dict(data)


def key_to_json(key: Any) -> dict[str, Any]:
    """A (legacy uint32 or typed) PRNG key's data, bit for bit, as JSON."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    data = np.asarray(jax.device_get(key))
    return {"data": data.tolist(), "dtype": str(data.dtype)}


def key_from_json(data: Mapping[str, Any]) -> np.ndarray:
    """Inverse of `key_to_json` (the key's raw data)."""
    return np.asarray(data["data"], dtype=np.dtype(data["dtype"]))


def mode_state(state: LearnerState, row: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint metadata a resumed run needs beside the train state: the learner's key and
    KL-controller state after the row's iteration, and the row's running sample totals."""
    carried = {name: int(row[name]) for name in CARRIED}
    carried["dropped_at_resume"] = int(row.get("dropped_at_resume", 0))
    return {"learner_key": key_to_json(state.key), "controller": controller_to_json(state.control),
            "accounting": carried}


def check_mode_state(meta: Mapping[str, Any]) -> None:
    """CheckpointError unless a checkpoint's metadata holds a threaded run's `mode_state`."""
    if MODE_STATE_KEY not in meta:
        raise CheckpointError(
            f"checkpoint {meta.get('iteration')} of this threaded run was written by a version of ppo_async that "
            "could not resume threaded runs (no learner key, KL-controller state or sample totals in it); its "
            "policy still loads (pa.load / eval), but the run cannot be continued: start a new run")


def learner_start(meta: Mapping[str, Any]) -> LearnerStart:
    """Where the learner starts again from a checkpoint's metadata (`check_mode_state` first).
    The samples resident when the run stopped join `lost`; CheckpointError when the totals
    do not add up (`produced = consumed + dropped + resident`)."""
    state = meta[MODE_STATE_KEY]
    acc = state["accounting"]
    start = LearnerStart(
        iteration=int(meta["iteration"]), produced=acc["samples_produced"], consumed=acc["samples_consumed"],
        forced=acc["dropped_forced_refresh"], overwritten=acc["dropped_overwritten"], stale=acc["dropped_stale_total"],
        lost=acc["dropped_at_resume"] + acc["samples_resident"], wall_time=float(meta.get("wall_time", 0.0)),
        control=controller_from_json(state["controller"]),
    )
    if start.produced != start.consumed + start.forced + start.overwritten + start.stale + start.lost:
        raise CheckpointError(f"checkpoint {start.iteration}: its sample totals do not add up ({acc}); it cannot be resumed")
    return start


def resume_point(checkpoint_train_state: TrainState, meta: Mapping[str, Any]) -> ResumePoint:
    """The `ResumePoint` of a restored threaded checkpoint (train state leaves `[1, ...]`) and its metadata."""
    train_state = jax.tree.map(lambda x: x[0], checkpoint_train_state)
    return ResumePoint(train_state, key_from_json(meta[MODE_STATE_KEY]["learner_key"]), learner_start(meta))
