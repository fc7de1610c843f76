"""Orbax save/restore of everything needed to resume a run (side effects: disk I/O).

A checkpoint is one step directory `DIR/<step>/` holding three orbax items:

- `state`: the train-state pytree (any nesting of NamedTuples / dicts / tuples of arrays,
  int32 counters, uint32 PRNG keys, optionally with a leading seed axis), written with
  `StandardSave` (tensorstore/OCDBT, bitwise exact);
- `metadata`: the caller's JSON dict (config, counters, ...);
- `layout`: our own JSON record of every leaf's key path, shape and dtype, so that a restore
  into the wrong structure fails with a message naming the leaves that differ, before orbax
  reads any array.

Saves are synchronous: `Checkpointer.save` returns only once the step directory is final on
disk, so another process can restore it straight away. Orbax writes each step into
`<step>.orbax-checkpoint-tmp` and renames it when complete (after writing
`commit_success.txt` inside it); a save killed half way leaves only the temporary directory,
which `all_steps` / `latest_step` / `restore` never see. We additionally require
`commit_success.txt` in a step directory before treating it as a checkpoint.

Typed PRNG keys (`jax.random.key`) are stored as their uint32 key data and re-wrapped with
the implementation of the matching `state_like` leaf; legacy `jax.random.PRNGKey` arrays are
plain uint32 arrays and stored as such.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import jax
import numpy as np

__all__ = ["Checkpointer", "CheckpointError"]


@functools.cache
def _commit_file() -> str:
    """The name of the file orbax writes last into a step directory, before the rename. Read
    when a Checkpointer first needs it (orbax is imported by then): importing this module
    imports no orbax, so a run without a run directory never does, and one with a run
    directory not before its first checkpoint (`RunRecorder` makes its Checkpointer then)."""
    try:
        from orbax.checkpoint._src.path.atomicity import COMMIT_SUCCESS_FILE
    except Exception:  # pragma: no cover - private location moved
        return "commit_success.txt"
    return COMMIT_SUCCESS_FILE


_LAYOUT_VERSION = 1
_MAX_LISTED = 12


class CheckpointError(ValueError):
    """A checkpoint cannot be saved or restored; the message says which step and why."""


_MAX_REASON = 240


def _short_reason(exc: BaseException) -> str:
    """The first line of an orbax / tensorstore error, without the TensorStore spec dump
    ("See full TensorStore details: ..."), at most _MAX_REASON characters."""
    text = str(exc).split("See full TensorStore details")[0].strip()
    line = text.splitlines()[0].strip() if text else ""
    line = line or type(exc).__name__
    return line if len(line) <= _MAX_REASON else line[: _MAX_REASON - 3] + "..."


def _is_typed_key(x: Any) -> bool:
    dtype = getattr(x, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _leaf_shape_dtype(x: Any) -> tuple[tuple[int, ...], str, str | None]:
    """(shape, dtype name, key impl name) of a leaf as it is stored on disk."""
    if _is_typed_key(x):
        data = jax.eval_shape(jax.random.key_data, x)
        return tuple(data.shape), str(np.dtype(data.dtype)), str(jax.random.key_impl(x))
    if isinstance(x, jax.ShapeDtypeStruct):
        return tuple(x.shape), str(np.dtype(x.dtype)), None
    arr = x if hasattr(x, "dtype") and hasattr(x, "shape") else np.asarray(x)
    # As stored: numpy / Python leaves go through jnp.asarray (float64 -> float32 without x64).
    return tuple(arr.shape), str(np.dtype(jax.dtypes.canonicalize_dtype(arr.dtype))), None


def _layout(tree: Any) -> list[dict[str, Any]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    out = []
    for path, leaf in leaves:
        shape, dtype, impl = _leaf_shape_dtype(leaf)
        out.append({"path": jax.tree_util.keystr(path), "shape": list(shape), "dtype": dtype, "key_impl": impl})
    return out


def _is_empty(x: Any) -> bool:
    """A leaf with a zero-size axis (MJX data has some, e.g. `act` of an env without
    activations); orbax cannot store those, so they are saved as None and rebuilt as zeros."""
    return 0 in _leaf_shape_dtype(x)[0]


def _to_storable(tree: Any) -> Any:
    """Typed keys -> uint32 key data; zero-size leaves -> None; everything else -> jax arrays
    (numpy in a multi-process run: orbax refuses a process's own jax arrays there; both restore
    alike)."""
    host = jax.process_count() > 1

    def conv(x: Any) -> Any:
        if _is_empty(x):
            return None
        if _is_typed_key(x):
            x = jax.random.key_data(x)
        value = jax.numpy.asarray(x)
        return np.asarray(value) if host else value

    return jax.tree.map(conv, tree)


def _default_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _abstract_target(state_like: Any) -> Any:
    """ShapeDtypeStructs (with a sharding, so orbax returns jax arrays) of the stored leaves."""

    def conv(x: Any) -> jax.ShapeDtypeStruct | None:
        shape, dtype, _ = _leaf_shape_dtype(x)
        if 0 in shape:
            return None  # stored as None (`_to_storable`)
        sharding = getattr(x, "sharding", None)
        if not isinstance(sharding, jax.sharding.Sharding):
            sharding = _default_sharding()
        elif _is_typed_key(x) and not isinstance(sharding, jax.sharding.SingleDeviceSharding):
            sharding = _default_sharding()  # key data has an extra trailing axis
        return jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=sharding)

    return jax.tree.map(conv, state_like)


def _describe_mismatch(saved: list[dict[str, Any]], wanted: list[dict[str, Any]]) -> list[str]:
    saved_by_path = {e["path"]: e for e in saved}
    wanted_by_path = {e["path"]: e for e in wanted}
    problems = []
    for path in wanted_by_path:
        if path not in saved_by_path:
            problems.append(f"leaf {path or '<root>'} is in state_like but not in the checkpoint")
    for path in saved_by_path:
        if path not in wanted_by_path:
            problems.append(f"leaf {path or '<root>'} is in the checkpoint but not in state_like")
    for path, w in wanted_by_path.items():
        s = saved_by_path.get(path)
        if s is None:
            continue
        if list(s["shape"]) != list(w["shape"]):
            problems.append(f"leaf {path or '<root>'} has shape {tuple(s['shape'])} in the checkpoint but {tuple(w['shape'])} in state_like")
        if s["dtype"] != w["dtype"]:
            problems.append(f"leaf {path or '<root>'} has dtype {s['dtype']} in the checkpoint but {w['dtype']} in state_like")
        if (s.get("key_impl") is None) != (w.get("key_impl") is None):
            kind = lambda e: "a typed PRNG key" if e.get("key_impl") else "a plain array"  # noqa: E731
            problems.append(f"leaf {path or '<root>'} is {kind(s)} in the checkpoint but {kind(w)} in state_like")
    if not problems and [e["path"] for e in saved] != [e["path"] for e in wanted]:
        problems.append("the leaves are the same but in a different order (container types differ?)")
    return problems


class Checkpointer:
    """Keeps the last `max_to_keep` checkpoints of a run in `directory` (orbax CheckpointManager).

    >>> with Checkpointer(run_dir + "/checkpoints") as ckpt:
    ...     ckpt.save(step, state, {"config": cfg_dict, "env_steps": n})
    ...     state, meta = ckpt.restore(fresh_state)          # latest step

    `save` blocks until the checkpoint is complete on disk. A save that was interrupted
    (process killed) is never returned by `latest_step` / `all_steps` / `restore`.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3) -> None:
        import orbax.checkpoint as ocp

        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise CheckpointError(f"max_to_keep must be an integer >= 1, got {max_to_keep!r}")
        self._ocp = ocp
        self.directory = os.path.abspath(os.fspath(directory))
        self.max_to_keep = max_to_keep
        os.makedirs(self.directory, exist_ok=True)
        # In a multi-process run only process 0 checkpoints (params are replicated, saved from the
        # host): orbax must not wait at barriers for processes that never open a checkpointer.
        multi = jax.process_count() > 1
        alone = {"multiprocessing_options": ocp.options.MultiprocessingOptions(
            primary_host=jax.process_index(), active_processes={jax.process_index()})} if multi else {}
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=False,  # save() returns only when the step is final
            create=not multi,  # (made above; orbax refuses create with active_processes)
            # Never delete other processes' in-flight temp dirs when merely opening to read.
            cleanup_tmp_directories=False,
            **alone,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_handlers={
                "state": ocp.StandardCheckpointHandler(**alone),
                "metadata": ocp.JsonCheckpointHandler(**alone),
                "layout": ocp.JsonCheckpointHandler(**alone),
            },
        )
        self._closed = False

    # ------------------------------------------------------------------ steps

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _is_complete(self, step: int) -> bool:
        d = self._step_dir(step)
        return os.path.isfile(os.path.join(d, _commit_file())) and os.path.isdir(os.path.join(d, "layout"))

    def all_steps(self) -> list[int]:
        """Steps of the complete checkpoints on disk, ascending."""
        self._check_open()
        self._manager.reload()  # another process may have written since we opened
        return sorted(int(s) for s in self._manager.all_steps() if self._is_complete(int(s)))

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None if there is none."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # ------------------------------------------------------------------ save

    def save(self, step: int, state: Any, metadata: dict) -> None:
        """Writes `state` (a pytree of arrays) and `metadata` (a JSON dict) as checkpoint `step`.

        Blocks until the checkpoint is final on disk; then deletes the oldest beyond
        `max_to_keep`. Raises CheckpointError if `step` already exists or is older than the
        latest checkpoint (orbax would silently skip it), or if `metadata` is not JSON.
        """
        self._check_open()
        ocp = self._ocp
        step = int(step)
        if step < 0:
            raise CheckpointError(f"step must be >= 0, got {step}")
        if not isinstance(metadata, dict):
            raise CheckpointError(f"metadata must be a dict, got {type(metadata).__name__}")
        try:
            metadata = json.loads(json.dumps(metadata, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"metadata for step {step} is not JSON-serialisable (no NaN/inf allowed): {e}") from e
        steps = self.all_steps()
        if step in steps:
            raise CheckpointError(f"checkpoint step {step} already exists in {self.directory}")
        if steps and step < steps[-1]:
            raise CheckpointError(
                f"cannot save step {step}: it is older than the latest checkpoint {steps[-1]} in {self.directory}; "
                "delete the newer checkpoints first or use a new directory"
            )
        # (A temp dir left by a killed save of this step is replaced by orbax itself.)
        if os.path.exists(self._step_dir(step)):
            raise CheckpointError(
                f"{self._step_dir(step)} exists but is not a complete checkpoint (no {_commit_file()}); "
                "remove it by hand if it is garbage"
            )
        layout = {"version": _LAYOUT_VERSION, "leaves": _layout(state)}
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(_to_storable(state)),
            metadata=ocp.args.JsonSave(metadata),
            layout=ocp.args.JsonSave(layout),
        )
        saved = self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()
        if not saved or not self._is_complete(step):
            raise CheckpointError(f"orbax did not write checkpoint step {step} in {self.directory}")

    # ------------------------------------------------------------------ restore

    def _complete_step(self, step: int | None) -> int:
        """`step`, or the latest when None; CheckpointError unless it is a complete checkpoint."""
        self._check_open()
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"no complete checkpoint in {self.directory}")
            return steps[-1]
        step = int(step)
        if step not in steps:
            raise CheckpointError(f"no complete checkpoint for step {step} in {self.directory}; available steps: {steps}")
        return step

    def _unreadable(self, step: int, what: str, exc: BaseException) -> CheckpointError:
        """The one-line error for a checkpoint orbax cannot read (a corrupted or truncated file)."""
        others = [s for s in self.all_steps() if s != step]
        hint = (
            f"delete that directory to fall back to an earlier checkpoint (other complete steps: {others})"
            if others else "no other complete checkpoint exists in this directory"
        )
        return CheckpointError(
            f"checkpoint step {step} in {self._step_dir(step)} is corrupted or unreadable: "
            f"cannot read its {what} ({_short_reason(exc)}); {hint}"
        )

    def _read_json_items(self, step: int, *names: str) -> Any:
        args = self._ocp.args.Composite(**{name: self._ocp.args.JsonRestore() for name in names})
        try:
            return self._manager.restore(step, args=args)
        except Exception as e:  # noqa: BLE001 - orbax raises many kinds
            raise self._unreadable(step, "metadata", e) from e

    def metadata(self, step: int | None = None) -> dict:
        """The metadata dict of checkpoint `step` (default: the latest), without reading any array."""
        step = self._complete_step(step)
        return dict(self._read_json_items(step, "metadata").metadata)

    def restore(self, state_like: Any, step: int | None = None) -> tuple[Any, dict]:
        """Restores checkpoint `step` (default: the latest) into the structure of `state_like`.

        `state_like` is a pytree of the same structure, shapes and dtypes as the saved state
        (e.g. a freshly initialised state, or ShapeDtypeStructs). Returns `(state, metadata)`
        with `state` made of jax arrays inside `state_like`'s own container types.
        Raises CheckpointError if there is no such checkpoint or the structure differs.
        """
        ocp = self._ocp
        step = self._complete_step(step)
        head = self._read_json_items(step, "metadata", "layout")
        wanted = _layout(state_like)
        problems = _describe_mismatch(head.layout["leaves"], wanted)
        if problems:
            listed = "\n  ".join(problems[:_MAX_LISTED])
            more = f"\n  ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} does not match state_like "
                f"({len(problems)} difference(s)):\n  {listed}{more}"
            )

        target = _abstract_target(state_like)
        try:
            out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))
        except Exception as e:  # noqa: BLE001
            raise self._unreadable(step, "arrays", e) from e

        restored_leaves, restored_def = jax.tree.flatten(out.state)
        target_def = jax.tree.structure(target)
        if restored_def != target_def:
            raise CheckpointError(
                f"orbax restored step {step} into an unexpected structure:\n  got {restored_def}\n  wanted {target_def}"
            )
        like_leaves, like_def = jax.tree.flatten(state_like)
        stored = iter(restored_leaves)
        leaves = []
        for like in like_leaves:
            if _is_empty(like):
                shape, dtype, _ = _leaf_shape_dtype(like)
                leaves.append(jax.numpy.zeros(shape, dtype))
                continue
            value = next(stored)
            if _is_typed_key(like):
                value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(like))
            elif not isinstance(value, jax.Array):
                value = jax.numpy.asarray(value)
            leaves.append(value)
        return jax.tree.unflatten(like_def, leaves), dict(head.metadata)

    # ------------------------------------------------------------------ lifetime

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"Checkpointer for {self.directory} is closed")

    def close(self) -> None:
        if not self._closed:
            self._manager.wait_until_finished()
            self._manager.close()
            self._closed = True

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpointer({self.directory!r}, max_to_keep={self.max_to_keep})"
