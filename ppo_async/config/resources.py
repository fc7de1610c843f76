"""Sizes of a run, from its config alone: integer bounds and a memory estimate, checked before
anything is allocated or compiled.

Two checks, both raising `ConfigError` naming the field that drives the size:

- `check_sizes(config)` (machine-independent; `Config` runs it at construction): counts that
  a compiled program holds as int32 (transitions per batch, learner iterations, SGD steps
  over the run) must fit in int32, and a few counts have a sane upper bound (`MAX_SEEDS`).
- `check_memory(config, limit_bytes)` (the machine's limit: `host_memory_bytes()`; called by
  `train` and `sweep` before they compile): the estimate of `estimate_bytes` must fit.

The estimate is a lower bound (the env's observation and action sizes are not in the config,
so each counts as 1 float), so a refused config would certainly not fit. Nothing here imports
JAX, nor the config sections (`config` arguments are `Config`s; a section's defaults are read
from the config's own classes).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, NamedTuple, Sequence

from ppo_async.config.samplers import default_num_samplers
from ppo_async.errors import ConfigError


INT32_MAX = 2**31 - 1
"""Largest count a compiled program holds (step and iteration counters are int32)."""

MAX_SEEDS = 10_000
"""Largest num_seeds (or seeds of a sweep) vmapped into one program."""

FLOAT_BYTES = 4
TRANSITION_FLOATS = 10
"""Floats per stored transition with 1-float observations and actions: obs, action, the
behaviour Gaussian (mean, log_std), reward, done, truncated, value, log-prob, policy version."""
BATCH_COPIES = 3
"""Copies of the learner batch alive during an update: the rollout, advantages / returns and
the shuffled minibatch view."""
PARAM_COPIES = 4
"""Copies of the parameters per seed: params, gradients and Adam's two moments."""
METRIC_FLOATS = 32
"""Floats of the metrics row a compiled run keeps per learner iteration and seed (a lower bound)."""


class Term(NamedTuple):
    """One part of the memory estimate: its bytes and the fields that drive it."""

    name: str
    bytes: int
    fields: tuple[str, ...]


def mlp_params(widths: Sequence[int], inputs: int = 1, outputs: int = 1) -> int:
    """Weights and biases of an MLP `inputs -> widths... -> outputs`:
    sum over layers of (fan_in + 1) * fan_out."""
    sizes = [inputs, *widths, outputs]
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))


def param_count(config: Any) -> int:
    """Parameters of one seed's actor-critic (1-float observations and actions): the actor
    MLP plus the critic MLP (or one torso with both heads when `network.shared_torso`)."""
    net = config.network
    if net.shared_torso:
        return mlp_params(net.actor_hidden, outputs=2)
    return mlp_params(net.actor_hidden) + mlp_params(net.critic_hidden)


def memory_terms(config: Any, stacked_seeds: int | None = None) -> list[Term]:
    """The parts of `estimate_bytes`, each in bytes:

    - batch: seeds * batch_size * TRANSITION_FLOATS * 4 * BATCH_COPIES
      (batch_size = rollout.num_envs * rollout.num_steps [* chunks per batch * processes]);
    - buffer (threaded): buffer chunks * chunk_size * TRANSITION_FLOATS * 4;
    - params: seeds * param_count * 4 * PARAM_COPIES, plus one snapshot per threaded sampler
      (`effective_num_samplers`);
    - metrics: seeds * num_iterations * METRIC_FLOATS * 4.

    `stacked_seeds` (default `config.num_seeds`) is the number of seeds in one program: a
    sweep's vmapped group stacks grid points x seeds.
    """
    seeds = config.num_seeds if stacked_seeds is None else stacked_seeds
    transition = TRANSITION_FLOATS * FLOAT_BYTES
    params = param_count(config) * FLOAT_BYTES
    terms = [
        Term("learner batch", seeds * config.batch_size * transition * BATCH_COPIES,
             ("rollout.num_envs", "rollout.num_steps", "num_seeds")),
        Term("params and optimiser state", seeds * params * PARAM_COPIES,
             ("network.actor_hidden", "network.critic_hidden", "num_seeds")),
        Term("metrics per iteration", seeds * config.num_iterations * METRIC_FLOATS * FLOAT_BYTES,
             ("total_env_steps", "num_seeds")),
    ]
    if config.mode == "threaded":
        terms.append(Term("ring buffer", config.buffer_capacity_chunks * config.chunk_size * transition,
                          ("threaded.buffer_capacity", "rollout.num_envs", "rollout.num_steps")))
        terms.append(Term("sampler snapshots", config.effective_num_samplers * params,
                          ("num_samplers", "network.actor_hidden")))
    return terms


def estimate_bytes(config: Any, stacked_seeds: int | None = None) -> int:
    """A lower bound of the memory a run of `config` needs: the sum of `memory_terms`."""
    return sum(term.bytes for term in memory_terms(config, stacked_seeds))


def host_memory_bytes() -> int | None:
    """This machine's physical memory (`os.sysconf`: pages * page size); None where unknown."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def format_bytes(n: float) -> str:
    """`1536` -> `'1.5 KiB'`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def driver(config: Any, fields: Sequence[str]) -> str:
    """Of `fields` (dotted), the one furthest above its default (value / default): the field
    that drives a size. Sequences count by their largest element."""
    best, best_ratio = fields[0], -1.0
    for path in fields:
        value, base = _value(config, path), _default(config, path)
        ratio = value / max(base, 1)
        if ratio > best_ratio:
            best, best_ratio = path, ratio
    return best


def _value(config: Any, path: str) -> int:
    if path == "num_samplers":  # None: the mode's count
        return config.effective_num_samplers
    node: object = config
    for part in path.split("."):
        node = getattr(node, part)
    if isinstance(node, (tuple, list)):
        return max(node, default=0)
    return int(node or 0)


def _default(config: Any, path: str) -> int:
    """The default of a dotted field of `config`'s classes as a count (a sequence: its largest
    element; num_samplers: what None stands for in the config's mode)."""
    if path == "num_samplers":
        return default_num_samplers(config.mode, config.lag)
    cls: Any = type(config)
    *sections, name = path.split(".")
    for section in sections:
        cls = {f.name: f.default_factory for f in dataclasses.fields(cls)}[section]  # the section's class
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    value = field.default if field.default is not dataclasses.MISSING else field.default_factory()  # type: ignore[misc]
    if isinstance(value, (tuple, list)):
        return max(value, default=1)
    return int(value or 1)


def _refuse(config: Any, fields: Sequence[str], what: str) -> None:
    name = driver(config, fields)
    raise ConfigError(f"{name} = {_shown(config, name)!r} is invalid: {what}")


def _shown(config: Any, path: str) -> object:
    if path == "num_samplers":  # None: the mode's count, shown as such
        return config.effective_num_samplers
    node: object = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


def check_sizes(config: Any) -> None:
    """ConfigError for a count beyond what a compiled program holds (int32) or a sane bound:
    num_seeds <= MAX_SEEDS; the network's parameters (`param_count`), batch_size (num_envs * num_steps ...), num_iterations
    (total_env_steps / batch_size) and the run's SGD steps (num_iterations * num_epochs *
    num_minibatches) <= INT32_MAX. The field named is the one of the product furthest above
    its default."""
    if config.num_seeds > MAX_SEEDS:
        _refuse(config, ("num_seeds",), f"must be <= {MAX_SEEDS} seeds in one program")
    if param_count(config) > INT32_MAX:
        _refuse(config, ("network.actor_hidden", "network.critic_hidden"),
                f"the network's parameters ({param_count(config):,} per seed) must be <= 2^31 - 1")
    shape = ("rollout.num_envs", "rollout.num_steps")
    if config.batch_size > INT32_MAX:
        _refuse(config, shape, f"the learner batch ({config.batch_size:,} transitions) must be <= 2^31 - 1")
    steps = config.num_iterations
    if config.total_env_steps // max(config.chunk_size, 1) > INT32_MAX:
        _refuse(config, ("total_env_steps",), f"the run's learner iterations ({steps:,}) must be <= 2^31 - 1")
    sgd = max(steps, 1) * config.sgd_steps_per_iteration
    if sgd > INT32_MAX:
        _refuse(config, ("ppo.num_epochs", "ppo.num_minibatches", "total_env_steps"),
                f"the run's SGD steps (iterations * ppo.num_epochs * ppo.num_minibatches = {sgd:,}) must be <= 2^31 - 1")


def check_memory(config: Any, limit_bytes: int | None, stacked_seeds: int | None = None,
                 where: str = "host memory") -> None:
    """ConfigError when `estimate_bytes(config, stacked_seeds)` exceeds `limit_bytes` (nothing
    when the limit is unknown), naming the field driving the largest term, the estimate and
    the limit."""
    if limit_bytes is None:
        return
    terms = memory_terms(config, stacked_seeds)
    total = sum(term.bytes for term in terms)
    if total <= limit_bytes:
        return
    largest = max(terms, key=lambda term: term.bytes)
    _refuse(config, largest.fields, f"the run needs at least {format_bytes(total)} ({largest.name}: "
                            f"{format_bytes(largest.bytes)}, from {' * '.join(largest.fields)}) but the {where} is "
                            f"{format_bytes(limit_bytes)}")


def check_fits_machine(config: Any, stacked_seeds: int | None = None) -> None:
    """`check_memory` against this machine's physical memory (`host_memory_bytes`); the entry
    points that compile (`train`, `sweep`) call it before anything is allocated."""
    check_memory(config, host_memory_bytes(), stacked_seeds)


def budget_blame(config: Any) -> str:
    """The field to name when the learner batch exceeds `total_env_steps`: the batch's driver
    (`rollout.num_envs` / `rollout.num_steps`) when it is further above its default than
    total_env_steps is below its own, else `total_env_steps`."""
    shape = ("rollout.num_envs", "rollout.num_steps")
    name = driver(config, shape)
    up = _value(config, name) / _default(config, name)
    down = _default(config, "total_env_steps") / max(config.total_env_steps, 1)
    return name if up > down else "total_env_steps"
