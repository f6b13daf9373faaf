"""Triton emission of the for-loop accumulators, read from each kind's record
(``mugraph.accumulators.Accumulator``: ``triton_step``, ``triton_finish``, ``tile_dims``).

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
from ..mugraph.accumulators import (
    ACCUMULATORS,
    WITH_EPS,
    Accumulator,
    RecordView,
    reduce_last_dims,
)
from ..ops.spec import TileDims


@dataclass(frozen=True)
class AccumulatorEmission:
    """How one accumulator kind is written in Triton (a view of its record)."""

    #: ``step(x, ctx, dimx) -> str``: what one iteration adds, ``x`` the operand's fp32 text
    step: Callable[[str, Any, int], str]
    #: ``finish(acc, count) -> str``: the tile after the loop
    finish: Callable[[str, int], str]
    #: ``dims(rank)``: how the accumulator's dimensions relate to its operand's
    dims: Callable[[int], TileDims]


def _emission(acc: Accumulator) -> AccumulatorEmission:
    return AccumulatorEmission(acc.triton_step, acc.triton_finish, acc.tile_dims)


#: accumulator kind -> its Triton emission, following ``mugraph.ACCUMULATORS``
ACCUMULATOR_EMISSIONS: RecordView[AccumulatorEmission] = RecordView(_emission)


def running_max_dims(rank: int) -> TileDims:
    """``forloop_max``: leading dimensions aligned, the last one reduced to size 1."""
    return reduce_last_dims(rank)


def rescaled_dims(rel: TileDims) -> TileDims:
    """A rescaled accumulator: the kind's rule, and the rescale tile (operand 1) broadcast onto
    the result."""
    return TileDims(out=tuple((*g, (1, j)) for j, g in enumerate(rel.out)), reduced=rel.reduced,
                    joined=rel.joined, dot=rel.dot)


def accumulator_emission(kind: str) -> AccumulatorEmission:
    """The Triton emission of accumulator ``kind`` (a name of ``ACCUMULATORS``, or
    ``"rms+EPS"``)."""
    try:
        return ACCUMULATOR_EMISSIONS[kind]
    except KeyError:
        raise LowerError(f"forloop_accum: no Triton emission for accumulator {kind!r}; known: "
                         f"{', '.join(ACCUMULATORS)}, {WITH_EPS}EPS") from None
