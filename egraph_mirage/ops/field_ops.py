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


#: random functions used outside the op table's own ``RandomFunction`` entries: sqrt inside rms
#: and rsqrt, sigmoid inside tanh, and the max of amax and of online softmax's running max
#: ("max_hash" and "max": ``mugraph/accumulators.py``)
SHARED_TABLES: frozenset[str] = frozenset({"sqrt", "sigmoid", "max_hash", "max"})


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


def negate(f: Any, x: Any) -> Any:
    """-x: x times the field constant -1 (what ``mul_scalar(x, -1.0)`` computes)."""
    return f.mul(x, f.constant(-1, x))


def sub(f: Any, xs: FFs, p: Params) -> Any:
    """a - b as its expression says: a + b * (-1)."""
    return f.add(xs[0], negate(f, xs[1]))


def neg(f: Any, xs: FFs, p: Params) -> Any:
    return negate(f, xs[0])


def rsqrt(f: Any, xs: FFs, p: Params) -> Any:
    """1 / sqrt(x), with sqrt the random function of the op table's ``sqrt`` ("sqrt"): so
    x * rsqrt(y) and x / sqrt(y) agree exactly."""
    return f.div(f.constant(1, xs[0]), f.apply_table("sqrt", xs[0]))


def tanh(f: Any, xs: FFs, p: Params) -> Any:
    """tanh(x) = 2 sigmoid(2x) - 1 over the reals; here sigmoid is a random function
    ("sigmoid", the op table's ``sigmoid``), so tanh needs no table of its own and a program
    that writes one through the other verifies equal."""
    x = xs[0]
    s = f.apply_table("sigmoid", f.mul(x, f.constant(2, x)))
    return f.add(f.mul(s, f.constant(2, s)), f.constant(-1, s))


def square(f: Any, xs: FFs, p: Params) -> Any:
    return f.mul(xs[0], xs[0])


def mul_scalar(f: Any, xs: FFs, p: Params) -> Any:
    return f.mul(xs[0], f.constant(p["scalar"], xs[0]))


def div_count(f: Any, xs: FFs, p: Params) -> Any:
    """x / count: x times the exact rational 1 / count."""
    from fractions import Fraction

    return f.mul(xs[0], f.constant(Fraction(1, int(p["count"])), xs[0]))


def add_scalar(f: Any, xs: FFs, p: Params) -> Any:
    return f.add(xs[0], f.constant(p["scalar"], xs[0]))


def reduction(f: Any, xs: FFs, p: Params) -> Any:
    return f.sum(xs[0], axis=p["dim"])


def mean(f: Any, xs: FFs, p: Params) -> Any:
    """The sum over ``dim`` times the field constant 1/n (n its size; x itself when n is 1)."""
    from fractions import Fraction

    x = xs[0]
    n = x.shape[p["dim"]]
    if n == 1:
        return x
    s = f.sum(x, axis=p["dim"])
    return f.mul(s, f.constant(Fraction(1, n), s))


def amax(f: Any, xs: FFs, p: Params) -> Any:
    """The max over ``dim``: an uninterpreted function of the multiset of values, as the
    running max of online softmax (``mugraph.accumulators.running_max_ff``) defines it:
    ``max`` of the sum over ``dim`` of ``max_hash`` of every value. So a max taken by this
    operator and one taken by a running max over tiles of the same row agree. The max of one
    value is the value (as the expression says)."""
    x = xs[0]
    if x.shape[p["dim"]] == 1:
        return x
    return f.apply_table("max", f.sum(f.apply_table("max_hash", x), axis=p["dim"]))


def slice_last(f: Any, xs: FFs, p: Params) -> Any:
    """Elements ``start:stop`` of the last dimension, of both parts."""
    x = xs[0]
    start, stop = p["start"], p["stop"]
    q = f.later(lambda: x.q[..., start:stop]) if x.has_q else None
    return f.lift(x.p[..., start:stop], q, x.why)


def rms(f: Any, sum_of_squares: Any, count: int) -> Any:
    """sqrt(sum / count), with sqrt the same random function everywhere ("sqrt")."""
    from fractions import Fraction

    return f.apply_table("sqrt", f.mul(sum_of_squares, f.constant(Fraction(1, count),
                                                                  sum_of_squares)))


def rms_with_eps(f: Any, sum_of_squares: Any, count: int, eps: float) -> Any:
    """sqrt(sum / count + eps), sqrt the random function "sqrt"."""
    from fractions import Fraction

    s = sum_of_squares
    mean_square = f.mul(s, f.constant(Fraction(1, count), s)) if count > 1 else s
    return f.apply_table("sqrt", f.add(mean_square, f.constant(eps, s)))


def rms_norm(f: Any, xs: FFs, p: Params) -> Any:
    from .shapes import _trailing_count, normalized_size

    x = xs[0]
    n = normalized_size("rms_norm", x.shape, p["normalized_shape"])
    k = _trailing_count(x.shape, n)
    axes = tuple(range(len(x.shape) - k, len(x.shape)))
    eps = p.get("eps", 0.0)
    squares = f.sum(f.mul(x, x), axis=axes)
    y = f.div(x, rms_with_eps(f, squares, n, eps) if eps else rms(f, squares, n))
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
