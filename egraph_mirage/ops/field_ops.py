"""Finite-field semantics of the op-table entries (see ``verify/field.py`` for the field).

Each function takes the ``Field`` of the current test, the operands as ``FF`` pairs and the op's
parameters. Nothing here imports JAX at module import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .spec import Params

FFs = Sequence[Any]


def binary(method: str):
    return lambda f, xs, p: getattr(f, method)(xs[0], xs[1])


#: random functions used outside the op table's entries: sqrt inside rms, and the running max
#: of online softmax ("max_hash" and "max": ``mugraph/accumulators.py``)
SHARED_TABLES: frozenset[str] = frozenset({"sqrt", "max_hash", "max"})


class RandomFunction:
    """The ``ff`` of a function with no algebraic model: a random function of the value, drawn
    once per test (the same on both programs of a test). ``name`` names its table."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, f: Any, xs: FFs, p: Params) -> Any:
        return f.apply_table(self.name, xs[0])

    def __repr__(self) -> str:
        return f"RandomFunction({self.name!r})"


def table(name: str) -> RandomFunction:
    """A function with no algebraic model: a random function of the value mod p."""
    return RandomFunction(name)


def random_tables(ops: Any) -> list[str]:
    """Names of every random function a test must draw: the shared ones and those of the
    entries of ``ops`` (an op table)."""
    names = set(SHARED_TABLES)
    names.update(spec.ff.name for spec in ops.values() if isinstance(spec.ff, RandomFunction))
    return sorted(names)


def exp(f: Any, xs: FFs, p: Params) -> Any:
    return f.exp(xs[0])


def square(f: Any, xs: FFs, p: Params) -> Any:
    return f.mul(xs[0], xs[0])


def mul_scalar(f: Any, xs: FFs, p: Params) -> Any:
    return f.mul(xs[0], f.constant(p["scalar"], xs[0]))


def reduction(f: Any, xs: FFs, p: Params) -> Any:
    return f.sum(xs[0], axis=p["dim"])


def rms(f: Any, sum_of_squares: Any, count: int) -> Any:
    """sqrt(sum / count), with sqrt the same random function everywhere ("sqrt")."""
    from fractions import Fraction

    return f.apply_table("sqrt", f.mul(sum_of_squares, f.constant(Fraction(1, count),
                                                                  sum_of_squares)))


def rms_norm(f: Any, xs: FFs, p: Params) -> Any:
    from .shapes import _trailing_count, normalized_size

    x = xs[0]
    n = normalized_size("rms_norm", x.shape, p["normalized_shape"])
    k = _trailing_count(x.shape, n)
    axes = tuple(range(len(x.shape) - k, len(x.shape)))
    y = f.div(x, rms(f, f.sum(f.mul(x, x), axis=axes), n))
    return f.mul(y, xs[1]) if len(xs) == 2 else y


def concat(f: Any, xs: FFs, p: Params) -> Any:
    arrays = f.arrays
    a, b = xs
    d = p["dim"] % len(a.shape)
    common = f.xp.broadcast_shapes(a.shape[:d] + (1,) + a.shape[d + 1:],
                                  b.shape[:d] + (1,) + b.shape[d + 1:])
    a = arrays.broadcast_to(a, common[:d] + (a.shape[d],) + common[d + 1:])
    b = arrays.broadcast_to(b, common[:d] + (b.shape[d],) + common[d + 1:])
    return arrays.concatenate([a, b], axis=d)
