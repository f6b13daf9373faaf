"""For-loop accumulators: how a block combines a tile across the iterations of its loop.

One record (``Accumulator``) per kind holds everything about it: the shape rule, the abstract
expression, the per-iteration ``step`` and the ``finish`` after the loop, how its dimensions
align with its operand's in the Triton lowering, and whether it may be rescaled. ``step`` and
``finish`` are written once, against a small set of operations ``o`` (``sum_last``, ``fold``,
``mul``, ``div``, ``sqrt``), and every consumer runs them with its own operations:

- ``ArrayOps(numpy)``: the float reference, per block (``GraphDefinedKernel.run_blocks``) and,
  on the vectorised layout ``(gx, gy, gz, F, *tile)`` (axis ``LOOP`` is the iteration), for all
  blocks at once (``Accumulator.reference``);
- ``ArrayOps(torch)``: PyTorch evaluation (``Accumulator.torch``, ``gpu.torch_eval``);
- ``FieldOps``: the finite-field verifier over Z_p x Z_q (``Accumulator.ff``);
- ``TritonOps``: Triton source text (``Accumulator.triton_step`` / ``triton_finish``).

A tile that does not change across iterations (size 1 on the loop axis) is accumulated
``forloop_range`` times, exactly as a block running the loop would. A new kind is one new
record in ``ACCUMULATORS``; ``docs/mugraph.md`` section 6 states the semantics.

Online softmax adds two pieces: the running max of a tile (``forloop_max``: a loop-side tile, the
max over the last dimension and the iterations so far) and the rescaled form of the linear kinds
(``forloop_accum(x, acc, rescale=m)``: each iteration's term weighted by ``exp(m_i - m_last)``).
Their float semantics are written once against ``ArrayOps`` too; their finite-field semantics
are the functions ``running_max_ff`` and ``rescale_ff``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np

from ..errors import BlockGraphError, LowerError
from ..expr import Term, app, sum_
from ..ops import lookup
from ..ops.elementwise import scalar_text
from ..ops.reductions import floored, mean_term
from ..ops.spec import TileDims

LOOP = 3
Dims = tuple[int, ...]
V = TypeVar("V")


# --- the operations accumulators are written with ----------------------------------------------

class ArrayOps:
    """Float arrays of the module ``xp``: numpy, or torch (whose functions accept numpy's
    ``axis`` and ``keepdims`` names). Values keep every dimension (size 1 after a sum)."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def sum_last(self, x: Any) -> Any:
        """The sum over the last dimension, kept as size 1."""
        return self.xp.sum(x, axis=-1, keepdims=True)

    def fold(self, x: Any, dimx: int) -> Any:
        """``out[..., j] = sum_k x[..., k * dimx + j]``: strided sums down to width ``dimx``."""
        return self.xp.sum(self.xp.reshape(x, (*x.shape[:-1], x.shape[-1] // dimx, dimx)),
                           axis=-2)

    def mul(self, a: Any, b: Any) -> Any:
        return a * b

    def div(self, x: Any, count: int) -> Any:
        """``x`` divided by a positive integer."""
        return x / count

    def sqrt(self, x: Any) -> Any:
        return self.xp.sqrt(x)

    def add_const(self, x: Any, c: float) -> Any:
        """``x`` plus the number ``c``."""
        return x + c

    def loop_sum(self, x: Any, iters: int) -> Any:
        """The sum over the loop axis of the vectorised layout, a loop-invariant ``x`` (size 1
        there) counted ``iters`` times."""
        return self.xp.sum(self.xp.broadcast_to(x, with_loop(x.shape, iters)), axis=LOOP,
                           keepdims=True)

    # online softmax
    def cummax(self, x: Any, axis: int) -> Any:
        """Running maximum along ``axis`` (NaN propagates)."""
        return np.maximum.accumulate(x, axis=axis)

    def floored(self, x: Any) -> Any:
        """``x``, no lower than the lowest finite fp32 (``ops.reductions.floored``)."""
        return floored(x)

    def part(self, x: Any, start: int, stop: int | None, axis: int) -> Any:
        """``x[start:stop]`` along ``axis``."""
        return x[(slice(None),) * axis + (slice(start, stop),)]


class TorchOps(ArrayOps):
    """``ArrayOps`` on torch tensors (torch is imported by ``torch_ops`` only)."""

    def cummax(self, x: Any, axis: int) -> Any:
        return self.xp.cummax(x, dim=axis).values


NUMPY = ArrayOps(np)


def torch_ops() -> ArrayOps:
    """``ArrayOps`` on torch tensors."""
    import torch

    return TorchOps(torch)


class FieldOps:
    """``FF`` values of a field ``f`` (``verify.field.Field``): sums are sums mod p and q,
    division by a count multiplies by the field constant ``1/count``, and ``sqrt`` is the random
    function the op table's ``sqrt`` uses (so an rms here is ``rms_norm``'s)."""

    def __init__(self, f: Any) -> None:
        self.f = f

    def sum_last(self, x: Any) -> Any:
        return self.f.sum(x, axis=len(x.shape) - 1)

    def fold(self, x: Any, dimx: int) -> Any:
        y = self.f.arrays.reshape(x, (*x.shape[:-1], x.shape[-1] // dimx, dimx))
        return self.f.sum(y, axis=len(y.shape) - 2, keepdims=False)

    def mul(self, a: Any, b: Any) -> Any:
        return self.f.mul(a, b)

    def div(self, x: Any, count: int) -> Any:
        return self.f.mul(x, self.f.constant(Fraction(1, count), x))

    def sqrt(self, x: Any) -> Any:
        return lookup("sqrt").ff(self.f, [x], {})

    def add_const(self, x: Any, c: float) -> Any:
        """``x`` plus the field constant of ``c``, as ``add_scalar`` adds it."""
        return lookup("add_scalar").ff(self.f, [x], {"scalar": c})

    def loop_sum(self, x: Any, iters: int) -> Any:
        return self.f.sum(self.f.arrays.broadcast_to(x, with_loop(x.shape, iters)), axis=LOOP)


class TritonOps:
    """Triton source text. ``ctx`` (the lowering's ``TileContext``, operand 0 the accumulated
    tile) masks the padding before a sum; ``finish`` runs without one (element-wise only)."""

    def __init__(self, ctx: Any = None) -> None:
        self.ctx = ctx

    def _context(self, what: str) -> Any:
        if self.ctx is None:
            raise LowerError(f"accumulator {what} needs the tile's context: only a step may "
                             "reduce")
        return self.ctx

    def sum_last(self, x: str) -> str:
        ctx = self._context("sum_last")
        return ctx.sum(x, 0, (len(ctx.real(0)) - 1,))

    def fold(self, x: str, dimx: int) -> str:
        return self._context("fold").fold(x, 0, dimx)

    def mul(self, a: str, b: str) -> str:
        return f"{_operand(a)} * {_operand(b)}"

    def div(self, x: str, count: int) -> str:
        return f"{_operand(x)} / {float(count)!r}"

    def sqrt(self, x: str) -> str:
        return f"tl.sqrt({x})"

    def add_const(self, x: str, c: float) -> str:
        return f"{x} + {float(c)!r}"


def _operand(text: str) -> str:
    """``text`` as an operand of ``*`` or ``/``: parenthesised if it has a space outside
    brackets (a binary expression), as is where it is a name, attribute or call."""
    depth = 0
    for c in text:
        depth += c in "([{"
        depth -= c in ")]}"
        if c == " " and depth == 0:
            return f"({text})"
    return text


def with_loop(shape: tuple[int, ...], iters: int) -> tuple[int, ...]:
    """``shape`` of the vectorised layout with ``iters`` on the loop axis."""
    return (*shape[:LOOP], iters, *shape[LOOP + 1:])


# --- shape rules and their Triton alignment -----------------------------------------------------

def same_shape(tile: Dims, dimx: int) -> Dims:
    return tile


def reduce_last_shape(tile: Dims, dimx: int) -> Dims:
    return (*tile[:-1], 1)


def fold_last_shape(tile: Dims, dimx: int) -> Dims:
    if tile[-1] % dimx:
        raise BlockGraphError(f"forloop_accum 'sum_todimx': last dimension {tile[-1]} is not a "
                              f"multiple of reduction_dimx {dimx}")
    return (*tile[:-1], dimx)


def same_dims(rank: int) -> TileDims:
    """Every dimension aligned with the operand's."""
    return TileDims(out=tuple(((0, j),) for j in range(rank)))


def reduce_last_dims(rank: int) -> TileDims:
    """Leading dimensions aligned, the last one reduced to size 1."""
    return TileDims(out=(*(((0, j),) for j in range(rank - 1)), ()), reduced=(rank - 1,))


def fold_last_dims(rank: int) -> TileDims:
    """Leading dimensions aligned; the last one is built at the reduction width."""
    return TileDims(out=(*(((0, j),) for j in range(rank - 1)), ()))


# --- the record ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Accumulator:
    """One accumulator kind: everything egraph-mirage knows about it."""

    name: str
    doc: str
    #: ``shape(tile, dimx)``: tile dims after the loop, from the operand's and ``reduction_dimx``
    shape: Callable[[Dims, int], Dims]
    #: ``expr(term, tile, iterations, dimx)``: the abstract expression after the loop
    expr: Callable[[Term, Dims, int, int], Term]
    #: ``step(x, dimx, o=NUMPY)``: what one iteration adds to the running total, written with
    #: the operations ``o``
    step: Callable[..., Any]
    #: ``finish(total, count, o=NUMPY)``: the result after the loop; count = iterations x the
    #: operand's last dimension
    finish: Callable[..., Any]
    #: ``tile_dims(rank)``: how the result's dimensions align with the operand's (Triton padding)
    tile_dims: Callable[[int], TileDims]
    #: ``step`` is linear in its operand (``step(x * w) = step(x) * w`` for a weight ``w``
    #: constant over the reduced dimensions), so ``rescale=`` may weight each iteration's
    #: term by weighting its operand
    linear: bool = True
    #: ``reference(x, iterations, dimx)``: float64 numpy semantics on the vectorised layout;
    #: derived from ``step`` and ``finish`` unless given
    reference: Callable[[np.ndarray, int, int], np.ndarray] | None = None

    def __post_init__(self) -> None:
        if self.reference is None or isinstance(self.reference, _FromSteps):
            object.__setattr__(self, "reference", _FromSteps(self, NUMPY))

    def evaluate(self, o: Any, x: Any, iters: int, dimx: int) -> Any:
        """The accumulator on the vectorised layout with the operations ``o``: every iteration's
        step, summed over the loop, then finished."""
        return self.finish(o.loop_sum(self.step(x, dimx, o), iters), iters * x.shape[-1], o)

    def torch(self, x: Any, iters: int, dimx: int) -> Any:
        """PyTorch semantics on the vectorised layout, in ``x``'s dtype and device."""
        return self.evaluate(torch_ops(), x, iters, dimx)

    def ff(self, f: Any, x: Any, iters: int, dimx: int) -> Any:
        """The same over Z_p x Z_q (``f`` a ``verify.field.Field``), on the vectorised layout."""
        return self.evaluate(FieldOps(f), x, iters, dimx)

    def triton_step(self, x: str, ctx: Any, dimx: int) -> str:
        """The Triton text one iteration adds, ``x`` the operand's fp32 text."""
        return self.step(x, dimx, TritonOps(ctx))

    def triton_finish(self, acc: str, count: int) -> str:
        """The Triton text of the tile after the loop, from the accumulator's variable."""
        return self.finish(acc, count, TritonOps())


class _FromSteps:
    """An accumulator's vectorised semantics with fixed operations (its derived ``reference``)."""

    def __init__(self, acc: Accumulator, o: Any) -> None:
        self.acc, self.o = acc, o

    def __call__(self, x: Any, iters: int, dimx: int) -> Any:
        return self.acc.evaluate(self.o, x, iters, dimx)

    def _key(self) -> tuple[Any, ...]:
        return (self.acc.step, self.acc.finish, id(self.o))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FromSteps) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"<{self.acc.name!r} from its step and finish>"


def _mean_expr(t: Term, tile: Dims, n: int, dimx: int) -> Term:
    count = n * tile[-1]
    return app("Div", sum_(count, t), app("Num", count)) if count > 1 else t


ACCUMULATORS: dict[str, Accumulator] = {a.name: a for a in [
    Accumulator(
        "plain", "sum over iterations, shape unchanged",
        shape=same_shape, tile_dims=same_dims,
        expr=lambda t, tile, n, dimx: sum_(n, t),
        step=lambda x, dimx, o=NUMPY: x,
        finish=lambda total, count, o=NUMPY: total),
    Accumulator(
        "sum", "sum over iterations and the last dimension (kept as size 1)",
        shape=reduce_last_shape, tile_dims=reduce_last_dims,
        expr=lambda t, tile, n, dimx: sum_(n * tile[-1], t),
        step=lambda x, dimx, o=NUMPY: o.sum_last(x),
        finish=lambda total, count, o=NUMPY: total),
    Accumulator(
        "mean", "mean over iterations and the last dimension",
        shape=reduce_last_shape, tile_dims=reduce_last_dims, expr=_mean_expr,
        step=lambda x, dimx, o=NUMPY: o.sum_last(x),
        finish=lambda total, count, o=NUMPY: o.div(total, count)),
    Accumulator(
        "rms", "sqrt(sum of squares / count) over iterations and the last dimension",
        shape=reduce_last_shape, tile_dims=reduce_last_dims,
        expr=lambda t, tile, n, dimx: app("Rms", n * tile[-1], t),
        step=lambda x, dimx, o=NUMPY: o.sum_last(o.mul(x, x)),
        finish=lambda total, count, o=NUMPY: o.sqrt(o.div(total, count)),
        linear=False),
    Accumulator(
        "sum_todimx", "strided sums of the last dimension down to reduction_dimx, over iterations",
        shape=fold_last_shape, tile_dims=fold_last_dims,
        expr=lambda t, tile, n, dimx: sum_(n * tile[-1] // dimx, t),
        step=lambda x, dimx, o=NUMPY: o.fold(x, dimx),
        finish=lambda total, count, o=NUMPY: total),
]}


#: ``"rms+EPS"``: the "rms" kind with the number EPS > 0 added to the mean square under the root
#: (``rms_with_eps``)
WITH_EPS = "rms+"


def rms_with_eps(eps: float) -> Accumulator:
    """``sqrt(Σ x² / n + eps)``, as ``rms_norm``'s ``eps`` and a traced RMSNorm's
    ``x * rsqrt(mean(x²) + eps)`` have it: the "rms" kind's step, ``eps`` added before the root
    (the field constant of ``eps``, as ``add_scalar`` adds it). Named ``"rms+EPS"``, ``EPS``
    Python's repr of the float: the name carries the constant through the μGraph's JSON. The
    search tries one per positive constant of the program (``search.blocks``), so the norm of a
    norm + projection is one accumulator, not four operators (square, mean, add, root)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) \
            or eps <= 0:
        raise BlockGraphError(f"forloop_accum: the eps of {WITH_EPS}EPS must be a finite number "
                              f"> 0, got {eps!r}")
    return _rms_with_eps(float(eps))


@functools.cache
def _rms_with_eps(eps: float) -> Accumulator:
    name = f"{WITH_EPS}{eps!r}"
    const = app("Const", scalar_text(eps, "forloop_accum"))  # as add_scalar writes it
    rms = ACCUMULATORS["rms"]
    return Accumulator(
        name, f"sqrt(sum of squares / count + {eps!r}) over iterations and the last "
        "dimension",
        shape=rms.shape, tile_dims=rms.tile_dims,
        expr=lambda t, tile, n, dimx: app("Sqrt", app("Add", mean_term(
            n * tile[-1], app("Square", t)), const)),
        step=rms.step,
        finish=lambda total, count, o=NUMPY: o.sqrt(o.add_const(o.div(total, count), eps)),
        linear=False)


def lookup_accumulator(acc: str | None) -> Accumulator:
    """``None`` is the plain sum; other names as in ``ACCUMULATORS``, or ``"rms+EPS"``
    (``rms_with_eps``)."""
    name = "plain" if acc is None else acc
    if isinstance(name, str) and name.startswith(WITH_EPS) and name not in ACCUMULATORS:
        try:
            eps = float(name[len(WITH_EPS):])
        except ValueError:
            raise BlockGraphError(f"forloop_accum: unknown accumulator {acc!r}: "
                                  f"'{WITH_EPS}EPS' takes a number EPS > 0") from None
        return rms_with_eps(eps)
    if name not in ACCUMULATORS:
        raise BlockGraphError(f"forloop_accum: unknown accumulator {acc!r}; known: None, "
                              + ", ".join(repr(k) for k in ACCUMULATORS if k != "plain")
                              + f", '{WITH_EPS}EPS' (EPS a number > 0)")
    return ACCUMULATORS[name]


class RecordView(Mapping[str, V]):
    """A read-only view of ``ACCUMULATORS``, one value per kind derived from its record (for
    consumers that want a table of one aspect); it follows the table as it changes."""

    def __init__(self, aspect: Callable[[Accumulator], V]) -> None:
        self._aspect = aspect

    def __getitem__(self, kind: str) -> V:
        """The aspect of ``kind``'s record (``lookup_accumulator``: ``"rms+EPS"`` too; a
        ``KeyError`` for no kind)."""
        try:
            return self._aspect(lookup_accumulator(kind))
        except BlockGraphError as e:
            raise KeyError(kind) from e

    def __iter__(self) -> Iterator[str]:
        return iter(ACCUMULATORS)

    def __len__(self) -> int:
        return len(ACCUMULATORS)


def _sum_ref(x: np.ndarray, iters: int, dimx: int) -> np.ndarray:
    """Float sum over the iterations and the last dimension (the "sum" kind's reference; the
    verifier benchmark builds its generic rms on it)."""
    return ACCUMULATORS["sum"].evaluate(NUMPY, x, iters, dimx)


# --- online softmax: the running max and rescaled accumulation ---------------------------------

def running_max_shape(tile: Dims) -> Dims:
    """A running max reduces the last dimension to 1."""
    return (*tile[:-1], 1)


def running_max_expr(t: Term, tile: Dims, count: int) -> Term:
    """``(Max n e)``: the max of n instances of ``e`` (n = iterations x last dimension for a
    loop-side operand, the last dimension for an invariant one); just ``e`` when n is 1."""
    return app("Max", count, t) if count > 1 else t


def shifted(term: Term, m: Term) -> Term:
    """The abstract expression of an accumulator rescaled by a tile that is not a running max,
    from the plain accumulator's (``term``) and the rescale tile's (``m``): its sum ``(Sum n a)``
    becomes ``(SumShift n a m)``, each term weighted by ``exp(m - the max of m)`` (inside a
    mean's quotient too); a loop of one term is unweighted (``exp(m - m)``)."""
    if term.op == "Sum":
        n, a = term.args
        return app("SumShift", n, a, m)
    if term.op == "Div" and isinstance(term.args[0], Term) and term.args[0].op == "Sum":
        return app("Div", shifted(term.args[0], m), term.args[1])
    return term


def running_max_in(o: ArrayOps, x: Any) -> Any:
    """Running max on the vectorised layout: the row max, then the maximum over the iterations
    so far, no lower than the lowest finite fp32 (NaN propagates)."""
    return o.floored(o.cummax(o.xp.amax(x, axis=-1, keepdims=True), LOOP))


def rescale_in(o: ArrayOps, x: Any, m: Any, running: bool = True) -> Any:
    """``x_i * w_i``: the terms of a rescaled accumulator, ``m`` with every iteration on the loop
    axis. ``w_i = exp(m_i - max_j m_j)``. For a running max (``running``, m never falls) that
    is ``exp(m_i - m_last)`` (1 for the last iteration), which is what the per-block
    recurrence multiplies term i by, ``prod_(j > i) exp(m_(j-1) - m_j)``, also for infinite
    values: a factor ``exp(m_(j-1) - m_j)`` that is NaN (both +inf; a running max is never
    below the lowest finite fp32, so tiles of -inf scores give none) makes every earlier term
    NaN, as it does in the recurrence."""
    xp, last = o.xp, m.shape[LOOP] - 1
    if not running:  # any tile: weights relative to its largest value over the loop
        return x * xp.exp(m - o.floored(xp.amax(m, axis=LOOP, keepdims=True)))
    w = xp.exp(m - o.part(m, last, None, LOOP))
    bad = xp.isnan(o.part(m, 1, None, LOOP) - o.part(m, 0, last, LOOP))  # factor j at j - 1
    later = xp.sum(bad, axis=LOOP, keepdims=True) - xp.cumsum(bad, axis=LOOP) + bad > 0
    head = xp.where(later, math.nan, o.part(w, 0, last, LOOP))  # some factor j > i is NaN
    return x * xp.concatenate([head, xp.ones_like(o.part(w, last, None, LOOP))], axis=LOOP)


def running_max_ref(x: np.ndarray) -> np.ndarray:
    """Float running max on the vectorised layout (``running_max_in`` with numpy)."""
    return running_max_in(NUMPY, x)


def rescale_ref(x: np.ndarray, m: np.ndarray, running: bool = True) -> np.ndarray:
    """Float terms of a rescaled accumulator (``rescale_in`` with numpy)."""
    return rescale_in(NUMPY, x, m, running)


def running_max_ff(f: Any, x: Any) -> Any:
    """Over Z_p x Z_q the max is an uninterpreted function of the multiset of values seen so far:
    ``max_hash`` (a random function) of every value, summed over the row and the iterations so
    far, then ``max`` (another random function) of that sum. Any tiling of the same row gives
    the same multiset, hence the same value; see ``docs/mugraph.md`` section 11."""
    h = f.sum(f.apply_table("max_hash", x), axis=len(x.shape) - 1)
    if h.shape[LOOP] > 1:
        h = f.cumsum(h, axis=LOOP)
    return f.apply_table("max", h)


def rescale_ff(f: Any, x: Any, m: Any, running: bool = True) -> Any:
    """``x_i * exp(m_i - max_j m_j)`` over Z_p x Z_q (exp of the q-parts: needs m's q-part).
    For a running max, ``max_j m_j`` is ``m_last``; for any other tile it is the max over the
    loop of its values, uninterpreted as every max is (``running_max_ff``): exp being a
    homomorphism, a program whose result does not depend on it (a ratio of sums rescaled
    alike) agrees whatever value it takes."""
    top = running_max_ff(f, m) if not running else m
    last = f.arrays.take(top, -1, LOOP)
    return f.mul(x, f.exp(f.add(m, f.mul(last, f.constant(-1, last)))))


def rescale_step(total: np.ndarray | None, step: np.ndarray, m_prev: np.ndarray | None,
                 m: np.ndarray) -> np.ndarray:
    """One iteration of a rescaled accumulator in the per-block interpreter: the running total
    is multiplied by ``exp(m_prev - m)`` before this iteration's term is added. For a rescale
    tile that is not a running max, ``m_prev`` and ``m`` are its running max before and after
    this iteration, and the caller weights ``step`` by ``exp(m_i - m)`` first."""
    return step if total is None else total * np.exp(m_prev - m) + step
