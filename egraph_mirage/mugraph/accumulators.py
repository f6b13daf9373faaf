"""For-loop accumulators: how a block combines a tensor across the iterations of its loop.

One entry per accumulator kind, each holding its shape rule, abstract expression and float
semantics on the vectorised layout ``(gx, gy, gz, F, *tile)`` (axis ``LOOP`` is the iteration).
A tensor that does not change across iterations (size 1 on the loop axis) is accumulated
``forloop_range`` times, exactly as a block running the loop would.

Online softmax adds two pieces (``docs/mugraph.md`` section 6): the running max of a tile
(``forloop_max``: a loop-side tile, the max over the last dimension and the iterations so far)
and the rescaled form of the linear kinds (``forloop_accum(x, acc, rescale=m)``: each
iteration's contribution weighted by ``exp(m_i - m_last)``). Their semantics are the functions
at the end of this module.
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
    #: a sum of per-iteration terms (so ``rescale=`` may weight the terms)
    linear: bool = True


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
        _ff_rms, "sqrt(sum of squares / count) over iterations and the last dimension",
        linear=False),
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


# --- online softmax: the running max and rescaled accumulation ---------------------------------

def running_max_shape(tile: Dims) -> Dims:
    """A running max reduces the last dimension to 1."""
    return (*tile[:-1], 1)


def running_max_expr(t: Term, tile: Dims, count: int) -> Term:
    """``(Max n e)``: the max of n instances of ``e`` (n = iterations x last dimension for a
    loop-side operand, the last dimension for an invariant one); just ``e`` when n is 1."""
    return app("Max", count, t) if count > 1 else t


def running_max_ref(x: np.ndarray) -> np.ndarray:
    """Float running max on the vectorised layout: row max, then cumulative over the loop."""
    return np.maximum.accumulate(np.max(x, axis=-1, keepdims=True), axis=LOOP)


def running_max_ff(f: Any, x: Any) -> Any:
    """Over Z_p x Z_q the max is an uninterpreted function of the multiset of values seen so far:
    ``max_hash`` (a random function) of every value, summed over the row and the iterations so
    far, then ``max`` (another random function) of that sum. Any tiling of the same row gives
    the same multiset, hence the same value; see ``docs/mugraph.md`` section 11."""
    h = f.sum(f.apply_table("max_hash", x), axis=len(x.shape) - 1)
    if h.shape[LOOP] > 1:
        h = f.cumsum(h, axis=LOOP)
    return f.apply_table("max", h)


def rescale_ref(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x_i * w_i``: the terms of a rescaled accumulator (float), ``m`` with every iteration
    on the loop axis. ``w_i = exp(m_i - m_last)`` (1 for the last iteration), which is what the
    per-block recurrence multiplies term i by, ``prod_(j > i) exp(m_(j-1) - m_j)``, also for
    infinite values: a factor ``exp(m_(j-1) - m_j)`` that is NaN (both infinite alike, e.g. two
    tiles of -inf scores) makes every earlier term NaN, as it does in the recurrence."""
    w = np.exp(m - np.take(m, [-1], axis=LOOP))
    w[(slice(None),) * LOOP + (slice(-1, None),)] = 1.0  # added last, never multiplied
    bad = np.isnan(np.diff(m, axis=LOOP)).astype(np.int64)  # factor j = 1 .. F-1 at j - 1
    later = np.flip(np.cumsum(np.flip(bad, LOOP), axis=LOOP), LOOP) > 0  # some j > i is NaN
    head = (slice(None),) * LOOP + (slice(0, -1),)
    w[head] = np.where(later, np.nan, w[head])
    return x * w


def rescale_ff(f: Any, x: Any, m: Any) -> Any:
    """``x_i * exp(m_i - m_last)`` over Z_p x Z_q (exp of the q-parts: needs m's q-part)."""
    from ..verify.field import FFArrays

    last = FFArrays(f.xp).take(m, -1, LOOP)
    return f.mul(x, f.exp(f.add(m, f.mul(last, f.constant(-1, last)))))


def rescale_step(total: np.ndarray | None, step: np.ndarray, m_prev: np.ndarray | None,
                 m: np.ndarray) -> np.ndarray:
    """One iteration of a rescaled accumulator in the per-block interpreter: the running total
    is multiplied by ``exp(m_prev - m)`` before this iteration's term is added."""
    return step if total is None else total * np.exp(m_prev - m) + step


# --- a fast path for the verifier ---------------------------------------------------------------

def matmul_loop_sum_ff(f: Any, a: Any, b: Any) -> Any | None:
    """The plain accumulator of ``matmul(a, b)`` over Z_p x Z_q as one product: the loop axis
    joins the contraction (``sum_i a_i @ b_i = [a_0 .. a_F-1] @ [b_0; ..; b_F-1]``), so the
    per-iteration products are never stored. The same residues as the plain accumulator of the
    products; None (use the plain path) when an operand does not change with the loop."""
    from ..verify.field import FFArrays

    if a.shape[LOOP] == 1 or b.shape[LOOP] == 1 or a.shape[LOOP] != b.shape[LOOP]:
        return None
    arrays, r, iters = FFArrays(f.xp), len(a.shape), a.shape[LOOP]
    rest = list(range(LOOP + 1, r - 2))
    a = arrays.transpose(a, [0, 1, 2, *rest, r - 2, LOOP, r - 1])
    a = arrays.reshape(a, (*a.shape[:LOOP], 1, *a.shape[LOOP:r - 3], a.shape[r - 3],
                           iters * a.shape[r - 1]))
    b = arrays.transpose(b, [0, 1, 2, *rest, LOOP, r - 2, r - 1])
    b = arrays.reshape(b, (*b.shape[:LOOP], 1, *b.shape[LOOP:r - 3], iters * b.shape[r - 2],
                           b.shape[r - 1]))
    return f.matmul(a, b)
