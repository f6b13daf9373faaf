"""The verifier's model of an operator over the reals: ``Field``'s operations on float64.

The op table's ``ff`` entries and the accumulators' ``FieldOps`` are written against a few
operations of ``field.Field`` (add, mul, div, exp, sums, products, constants and random
functions). ``RealField`` is the same operations over float64 numpy arrays, with every random
function a float function the caller chooses (``stand_in``). An operator's ``ff`` evaluated
with it is what the verifier assumes the operator computes, with its random functions made
concrete: the mutation benchmark uses it to tell false rejects that are equal only through a
property the model does not know (``rms_norm(2x) = rms_norm(x)``) from verifier bugs
(``bench.verify_bench.generic_functions``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from .field import FF, FFArrays


def real(x: Any) -> FF:
    """A real value as an ``FF``: both parts hold it."""
    return FF(x, x)


class RealField:
    """``field.Field``'s operations used by ``ff`` entries, over float64 numpy arrays; random
    function ``name`` is ``stand_in(name)``. ``read`` collects the random functions used."""

    xp = np

    def __init__(self, stand_in: Callable[[str], Callable[[np.ndarray], np.ndarray]]) -> None:
        self.stand_in = stand_in
        self.read: set[str] = set()
        self.zero_division = False
        self.memo: dict[Any, Any] = {}

    @property
    def arrays(self) -> FFArrays:
        return FFArrays(np)

    def constant(self, c: float | Fraction, like: FF) -> FF:
        return real(np.float64(float(Fraction(c))))

    def lift(self, p_part: Any, q_part: Any | None, why: str = "") -> FF:
        return FF(p_part, q_part, why)

    def later(self, compute: Callable[[], Any], shape: tuple[int, ...] | None = None) -> Any:
        return compute()

    def add(self, a: FF, b: FF) -> FF:
        return real(a.p + b.p)

    def mul(self, a: FF, b: FF) -> FF:
        return real(a.p * b.p)

    def div(self, a: FF, b: FF) -> FF:
        return real(a.p / b.p)

    def exp(self, a: FF) -> FF:
        return real(np.exp(a.p))

    def matmul(self, a: FF, b: FF) -> FF:
        return real(np.matmul(a.p, b.p))

    def sum(self, a: FF, axis: int | Sequence[int], keepdims: bool = True) -> FF:
        return real(np.sum(a.p, axis=axis, keepdims=keepdims))

    def cumsum(self, a: FF, axis: int) -> FF:
        return real(np.cumsum(a.p, axis=axis))

    def apply_table(self, name: str, a: FF) -> FF:
        self.read.add(name)
        return real(self.stand_in(name)(a.p))
