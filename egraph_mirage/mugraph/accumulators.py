"""For-loop accumulators: how a block combines a tensor across the iterations of its loop.

One entry per accumulator kind, each holding its shape rule, abstract expression and float
semantics on the vectorised layout ``(gx, gy, gz, F, *tile)`` (axis ``LOOP`` is the iteration).
A tensor that does not change across iterations (size 1 on the loop axis) is accumulated
``forloop_range`` times, exactly as a block running the loop would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import BlockGraphError
from ..expr import Term, app, sum_

LOOP = 3
Dims = tuple[int, ...]


def _last_dim_shape(tile: Dims, dimx: int) -> Dims:
    return (*tile[:-1], 1)


def _todimx_shape(tile: Dims, dimx: int) -> Dims:
    if tile[-1] % dimx:
        raise BlockGraphError(f"forloop_accum 'sum_todimx': last dimension {tile[-1]} is not a "
                              f"multiple of reduction_dimx {dimx}")
    return (*tile[:-1], dimx)


def _ff_loop(f: Any, x: Any, iters: int) -> Any:
    from ..verify.field import FFArrays

    shape = list(x.shape)
    shape[LOOP] = iters
    return FFArrays(f.xp).broadcast_to(x, shape)


def _ff_sum(f: Any, x: Any, iters: int, dimx: int) -> Any:
    return f.sum(_ff_loop(f, x, iters), axis=(LOOP, len(x.shape) - 1))


def _ff_todimx(f: Any, x: Any, iters: int, dimx: int) -> Any:
    from ..verify.field import FFArrays

    y = _ff_loop(f, x, iters)
    y = FFArrays(f.xp).reshape(y, (*y.shape[:-1], y.shape[-1] // dimx, dimx))
    return f.sum(f.sum(y, axis=len(y.shape) - 2, keepdims=False), axis=LOOP)


def _ff_rms(f: Any, x: Any, iters: int, dimx: int) -> Any:
    from ..ops.field_ops import rms

    return rms(f, _ff_sum(f, f.mul(x, x), iters, dimx), iters * x.shape[-1])


def _loop(x: np.ndarray, iters: int) -> np.ndarray:
    shape = list(x.shape)
    shape[LOOP] = iters
    return np.broadcast_to(x, shape)


def _sum_ref(x: np.ndarray, iters: int, dimx: int) -> np.ndarray:
    return np.sum(_loop(x, iters), axis=(LOOP, -1), keepdims=True)


def _todimx_ref(x: np.ndarray, iters: int, dimx: int) -> np.ndarray:
    y = _loop(x, iters)
    y = y.reshape(*y.shape[:-1], y.shape[-1] // dimx, dimx).sum(axis=-2)
    return np.sum(y, axis=LOOP, keepdims=True)


@dataclass(frozen=True)
class Accumulator:
    """One accumulator kind."""

    name: str
    #: tile dims after the loop, from the tile dims before and ``reduction_dimx``
    shape: Callable[[Dims, int], Dims]
    #: ``expr(term, tile, iterations, dimx)``: the abstract expression after the loop
    expr: Callable[[Term, Dims, int, int], Term]
    #: ``reference(x, iterations, dimx)`` on the vectorised layout, float
    reference: Callable[[np.ndarray, int, int], np.ndarray]
    #: ``step(x, dimx)``: what one iteration adds to the running sum (per-block interpreter)
    step: Callable[[np.ndarray, int], np.ndarray]
    #: ``finish(total, count)``: the result after the loop; count = iterations x last dimension
    finish: Callable[[np.ndarray, int], np.ndarray]
    #: ``ff(field, x, iterations, dimx)``: the same over Z_p x Z_q, on the vectorised layout
    ff: Callable[[Any, Any, int, int], Any]
    doc: str


ACCUMULATORS: dict[str, Accumulator] = {a.name: a for a in [
    Accumulator(
        "plain", lambda tile, dimx: tile,
        lambda t, tile, n, dimx: sum_(n, t),
        lambda x, n, dimx: np.sum(_loop(x, n), axis=LOOP, keepdims=True),
        lambda x, dimx: x, lambda s, count: s,
        lambda f, x, n, dimx: f.sum(_ff_loop(f, x, n), axis=LOOP),
        "sum over iterations, shape unchanged"),
    Accumulator(
        "sum", _last_dim_shape,
        lambda t, tile, n, dimx: sum_(n * tile[-1], t),
        _sum_ref, lambda x, dimx: x.sum(-1, keepdims=True), lambda s, count: s, _ff_sum,
        "sum over iterations and the last dimension (kept as size 1)"),
    Accumulator(
        "mean", _last_dim_shape,
        lambda t, tile, n, dimx: (app("Div", sum_(n * tile[-1], t), app("Num", n * tile[-1]))
                                  if n * tile[-1] > 1 else t),
        lambda x, n, dimx: _sum_ref(x, n, dimx) / (n * x.shape[-1]),
        lambda x, dimx: x.sum(-1, keepdims=True), lambda s, count: s / count,
        lambda f, x, n, dimx: f.mul(_ff_sum(f, x, n, dimx),
                                    f.constant(Fraction(1, n * x.shape[-1]), x)),
        "mean over iterations and the last dimension"),
    Accumulator(
        "rms", _last_dim_shape,
        lambda t, tile, n, dimx: app("Rms", n * tile[-1], t),
        lambda x, n, dimx: np.sqrt(_sum_ref(x * x, n, dimx) / (n * x.shape[-1])),
        lambda x, dimx: (x * x).sum(-1, keepdims=True), lambda s, count: np.sqrt(s / count),
        _ff_rms, "sqrt(sum of squares / count) over iterations and the last dimension"),
    Accumulator(
        "sum_todimx", _todimx_shape,
        lambda t, tile, n, dimx: sum_(n * tile[-1] // dimx, t),
        _todimx_ref,
        lambda x, dimx: x.reshape(*x.shape[:-1], x.shape[-1] // dimx, dimx).sum(-2),
        lambda s, count: s, _ff_todimx,
        "strided sums of the last dimension down to reduction_dimx, over iterations"),
]}


def lookup_accumulator(acc: str | None) -> Accumulator:
    """``None`` is the plain sum; other names as in ``ACCUMULATORS``."""
    name = "plain" if acc is None else acc
    if name not in ACCUMULATORS:
        raise BlockGraphError(f"forloop_accum: unknown accumulator {acc!r}; known: None, "
                              + ", ".join(repr(k) for k in ACCUMULATORS if k != "plain"))
    return ACCUMULATORS[name]
