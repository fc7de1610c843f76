"""Folded collectives: a whole pytree reduced over a data-parallel axis in one call.

`jax.lax.psum` of a pytree lowers to one all-reduce per leaf; across processes each is a gloo
call with its own latency (~0.4-0.9 ms on loopback, `experiments/results/bench_distributed`),
so the learner's diagnostics reduce their dozen leaves as one flat float32 vector instead.
Integer leaves travel as float32, exact up to 2**24 (16,777,216) per device: counts of one
learner batch's samples.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree


def _folded(reduce: Callable[[jax.Array, str], jax.Array], tree: Any, axis_name: str) -> Any:
    """`reduce` (a collective) of every leaf of `tree` as one flat float32 vector
    (`ravel_pytree`), the leaves' shapes and dtypes restored."""
    if not jax.tree.leaves(tree):
        return tree
    flat, unravel = ravel_pytree(tree)  # one vector of the leaves' promoted dtype
    return unravel(reduce(flat.astype(jnp.float32), axis_name).astype(flat.dtype))


def folded_psum(tree: Any, axis_name: str) -> Any:
    """`jax.lax.psum(tree, axis_name)` in one all-reduce (leaves as float32, dtypes restored)."""
    return _folded(jax.lax.psum, tree, axis_name)


def folded_pmax(tree: Any, axis_name: str) -> Any:
    """`jax.lax.pmax(tree, axis_name)` in one all-reduce (leaves as float32, dtypes restored)."""
    return _folded(jax.lax.pmax, tree, axis_name)
