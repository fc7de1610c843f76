"""Metric names, per-iteration rows, the JSONL writer and the console progress bar.

A *row* is one learner iteration of one seed: a flat dict of JSON scalars (lists for
histograms). Rows go to `metrics.jsonl` (one JSON object per line) and to
`TrainResult.metrics`, which converts to a pandas DataFrame.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Iterable, Mapping

import numpy as np

from ppo_async.health import short_warning

# Columns every mode writes (DESIGN.md vocabulary). Later modes add their own.
CORE_FIELDS = (
    "seed",
    "iteration",
    "learner_version",
    "env_steps",
    "sgd_steps",
    "wall_time",
    "steps_per_second",
    "episode_return",
    "episode_length",
    "episodes_finished",
    "policy_loss",
    "value_loss",
    "entropy",
    "approx_kl",
    "approx_kl_max",
    "clip_fraction",
    "dual_clip_fraction",
    "ratio_mean",
    "ratio_std",
    "ratio_max",
    "grad_norm",
    "learning_rate",
    "explained_variance",
)


class NonFiniteError(FloatingPointError):
    """Training produced a NaN or infinity; the message names the quantity and the iteration."""


def to_python(value: Any) -> Any:
    """numpy / jax scalars and arrays -> JSON-friendly Python (NaN -> None)."""
    arr = np.asarray(value)
    if arr.ndim == 0:
        item = arr.item()
        if isinstance(item, float) and not math.isfinite(item):
            return None
        return item
    return [to_python(v) for v in arr]


def split_seeds(batched: Mapping[str, Any], num_seeds: int) -> list[dict[str, Any]]:
    """`{name: [S, ...]}` -> S dicts of Python values."""
    host = {k: np.asarray(v) for k, v in batched.items()}
    return [{k: to_python(v[i]) for k, v in host.items()} for i in range(num_seeds)]


def check_finite(rows: Iterable[Mapping[str, Any]], names: Iterable[str], iteration: int) -> None:
    """Raises NonFiniteError if any listed loss metric is None (was NaN/inf) in any row."""
    for row in rows:
        for name in names:
            if name in row and row[name] is None:
                where = ", ".join(f"{k} {row[k]}" for k in ("config_id", "seed") if k in row)
                raise NonFiniteError(
                    f"{name} became NaN or infinite at iteration {iteration} ({where}); "
                    "check the env's observations/rewards, the learning rate and max_grad_norm"
                )


class JsonlWriter:
    """Appends rows to a JSONL file, flushing each write (a killed run keeps what it wrote)."""

    def __init__(self, path: str | os.PathLike, append: bool = False) -> None:
        self.path = os.fspath(path)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        self._file = open(self.path, "a" if append else "w", encoding="utf-8")

    def write(self, row: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl (a torn last line from a killed run is ignored)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise
    return rows


class Progress:
    """A tqdm bar over env steps showing steps/s, return, KL (and lag where there is one)."""

    def __init__(self, total_env_steps: int, enabled: bool = True, desc: str = "train") -> None:
        self._bar = None
        self._last_return: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_env_steps, desc=desc, unit="step", unit_scale=True, dynamic_ncols=True)

    def update(self, env_steps: int, row: Mapping[str, Any]) -> None:
        if self._bar is None:
            return
        self._bar.update(env_steps - self._bar.n)
        if row.get("episode_return") is not None:  # iterations with no finished episode keep the last one
            self._last_return = row["episode_return"]
        post = {"sps": _fmt(row.get("steps_per_second")), "return": _fmt(self._last_return), "kl": _fmt(row.get("approx_kl"), 4)}
        if row.get("lag_mean") is not None:
            post["lag"] = _fmt(row.get("lag_mean"), 2)
        warn = short_warning(row)
        if warn:
            post["WARN"] = warn
        self._bar.set_postfix(post, refresh=False)

    def write(self, message: str) -> None:
        """A line above the bar (nothing when the bar is off)."""
        if self._bar is not None:
            self._bar.write(message)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:.3g}"
    return str(value)


def scalar_items(row: Mapping[str, Any]) -> dict[str, float]:
    """The plain numeric entries of a row (no lists, None or booleans), e.g. for W&B / TensorBoard."""
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
