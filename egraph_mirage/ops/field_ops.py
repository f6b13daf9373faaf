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


#: names of the random functions the op table uses; the verifier draws them once per test
#: ("max_hash" and "max" model the running max of online softmax: ``mugraph/accumulators.py``)
TABLES: set[str] = {"sqrt", "max_hash", "max"}


def table(name: str):
    """A function with no algebraic model: a random function of the value mod p."""
    TABLES.add(name)
    return lambda f, xs, p: f.apply_table(name, xs[0])


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
    from ..verify.field import FFArrays

    arrays = FFArrays(f.xp)
    a, b = xs
    d = p["dim"] % len(a.shape)
    common = f.xp.broadcast_shapes(a.shape[:d] + (1,) + a.shape[d + 1:],
                                  b.shape[:d] + (1,) + b.shape[d + 1:])
    a = arrays.broadcast_to(a, common[:d] + (a.shape[d],) + common[d + 1:])
    b = arrays.broadcast_to(b, common[:d] + (b.shape[d],) + common[d + 1:])
    return arrays.concatenate([a, b], axis=d)


def customized(f: Any, xs: FFs, p: Params) -> Any:
    from ..mugraph import accumulators as accs
    from ..verify.chunks import splitter
    from ..verify.field import FFArrays
    from . import lookup

    kernel = p["kernel"]
    key = (id(kernel), *(id(x) for x in xs))
    if key not in f.memo:  # the operands stay alive in the memo, so their ids stay unique
        f.memo[key] = (xs, kernel.run_vectorised(
            xs, xp=FFArrays(f.xp), apply_op=lambda op, ys, q: lookup(op).ff(f, ys, q),
            accumulate=lambda acc, x, n, dimx: accs.lookup_accumulator(acc).ff(f, x, n, dimx),
            running_max=lambda x: accs.running_max_ff(f, x),
            rescale=lambda x, m: accs.rescale_ff(f, x, m),
            matmul_loop_sum=lambda a, b: accs.matmul_loop_sum_ff(f, a, b),
            split=splitter(f, kernel.tb),
        ))
    return f.memo[key][1][p["output"]]
