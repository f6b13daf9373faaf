"""Triton emission of the for-loop accumulators, one entry per kind of ``mugraph.ACCUMULATORS``.

An accumulator is an fp32 block, zero before the loop; every iteration adds ``step(x)`` to it,
and after the loop ``finish(acc, count)`` gives the tile (``count`` = iterations × the operand's
last dimension, as in ``Accumulator.finish``). An operand that is the same in every iteration is
stepped once and multiplied by the iteration count instead.

Online softmax: ``forloop_max`` is a running fp32 block, ``-inf`` before the loop and
``tl.maximum``-ed with the row max of each iteration's tile; a rescaled accumulator
(``forloop_accum_rescale``, operands ``x`` and ``m``) multiplies its total by
``exp(m_prev - m)`` before adding the step, ``m_prev`` being ``m`` of the previous iteration;
the factor is 0 in the first iteration, whose total is its step (the reference interpreter's
recurrence, also where ``m`` is infinite).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import LowerError
from ..ops.spec import TileDims


def _keep_leading(rank: int) -> TileDims:
    """Sum-like kinds: leading dimensions aligned, the last one reduced to size 1."""
    return TileDims(out=(*(((0, j),) for j in range(rank - 1)), ()), reduced=(rank - 1,))


def _same(rank: int) -> TileDims:
    return TileDims(out=tuple(((0, j),) for j in range(rank)))


def _todimx(rank: int) -> TileDims:
    """Leading dimensions aligned; the last one is built at the reduction width."""
    return TileDims(out=(*(((0, j),) for j in range(rank - 1)), ()))


def _last(ctx: Any) -> tuple[int, ...]:
    return (len(ctx.real(0)) - 1,)


@dataclass(frozen=True)
class AccumulatorEmission:
    """How one accumulator kind is written in Triton."""

    #: ``step(x, ctx, dimx) -> str``: what one iteration adds, ``x`` the operand's fp32 text
    step: Callable[[str, Any, int], str]
    #: ``finish(acc, count) -> str``: the tile after the loop
    finish: Callable[[str, int], str]
    #: ``dims(rank)``: how the accumulator's dimensions relate to its operand's
    dims: Callable[[int], TileDims]


ACCUMULATOR_EMISSIONS: dict[str, AccumulatorEmission] = {
    "plain": AccumulatorEmission(lambda x, ctx, dimx: x, lambda acc, n: acc, _same),
    "sum": AccumulatorEmission(lambda x, ctx, dimx: ctx.sum(x, 0, _last(ctx)),
                               lambda acc, n: acc, _keep_leading),
    "mean": AccumulatorEmission(lambda x, ctx, dimx: ctx.sum(x, 0, _last(ctx)),
                                lambda acc, n: f"{acc} / {float(n)!r}", _keep_leading),
    "rms": AccumulatorEmission(lambda x, ctx, dimx: ctx.sum(f"{x} * {x}", 0, _last(ctx)),
                               lambda acc, n: f"tl.sqrt({acc} / {float(n)!r})", _keep_leading),
    "sum_todimx": AccumulatorEmission(lambda x, ctx, dimx: ctx.fold(x, 0, dimx),
                                      lambda acc, n: acc, _todimx),
}


def running_max_dims(rank: int) -> TileDims:
    """``forloop_max``: leading dimensions aligned, the last one reduced to size 1."""
    return _keep_leading(rank)


def rescaled_dims(rel: TileDims) -> TileDims:
    """A rescaled accumulator: the kind's rule, and the rescale tile (operand 1) broadcast onto
    the result."""
    return TileDims(out=tuple((*g, (1, j)) for j, g in enumerate(rel.out)), reduced=rel.reduced,
                    joined=rel.joined, dot=rel.dot)


def accumulator_emission(kind: str) -> AccumulatorEmission:
    if kind not in ACCUMULATOR_EMISSIONS:
        raise LowerError(f"forloop_accum: no Triton emission for accumulator {kind!r}; known: "
                         f"{', '.join(ACCUMULATOR_EMISSIONS)}")
    return ACCUMULATOR_EMISSIONS[kind]
