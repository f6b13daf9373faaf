"""The element-wise entries of the op table (thread, block and kernel level): binary operators
with size-1 broadcasting, functions of one operand, and operators with a scalar parameter.

``sub`` and ``neg`` have no constructor of their own: their expressions are ``Add`` and ``Mul``
by the constant -1 (``(Const "-1.0")``, what ``mul_scalar(x, -1.0)`` writes), so the e-graph
sees a - b and a + (-1) b as one term and every identity of add and mul applies to them.
``gelu`` is the tanh form (PyTorch's ``approximate="tanh"``); ``gelu_tanh`` is the same function
under its explicit name, with the same constructor; ``gelu_erf`` is PyTorch's default form.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ShapeError
from ..expr import Term, app
from . import field_ops as ff
from . import shapes as sh
from .emit import GELU_K, aligned, elementwise, torch_module
from .spec import BLOCK, KERNEL, THREAD, OpSpec, Params, Shape, TritonEmission
from .terms import Constructor, exponential, largest, opaque, product, square

ALL_LEVELS = frozenset({KERNEL, BLOCK, THREAD})
#: the constant -1 of ``sub`` and ``neg`` (Python's repr of the float, as ``mul_scalar`` writes it)
MINUS_ONE = app("Const", repr(-1.0))


def term(name: str, cost: float, doc: str, degree=opaque, sorts: tuple[str, ...] = ("Expr",)
         ) -> Constructor:
    return Constructor(name, sorts, doc, cost, degree)


def unary(name: str, term: Constructor, fn, field, torch_fn, doc: str,
          triton: TritonEmission) -> OpSpec:
    """An element-wise operator of one operand: ``term`` is its constructor (``(Name Expr)``),
    ``fn`` its numpy function, ``torch_fn(x)`` its PyTorch function."""
    ctor = term.name
    return OpSpec(
        name=name, num_inputs=(1, 1), params=(), shape=sh.same_shape, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app(ctor, ts[0]),
        reference=lambda xs, p: fn(xs[0]), ff=field, torch=lambda xs, p: torch_fn(xs[0]),
        terms=(term,), levels=ALL_LEVELS, commutative=False, triton=triton, doc=doc,
    )


def binary(name: str, term: Constructor, fn, commutative: bool, sign: str, keeps_zero: bool,
           doc: str) -> OpSpec:
    ctor = term.name
    return OpSpec(
        name=name, num_inputs=(2, 2), params=(), shape=sh.broadcast, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app(ctor, ts[0], ts[1]),
        reference=lambda xs, p: fn(xs[0], xs[1]), ff=ff.binary(name),
        torch=lambda xs, p: fn(xs[0], xs[1]), terms=(term,),
        levels=ALL_LEVELS, commutative=commutative,
        triton=elementwise(f"{{a}} {sign} {{b}}", f"{{a}} {sign} {{b}}", keeps_zero), doc=doc,
    )


def scalar_text(c: object, op: str = "mul_scalar") -> str:
    """The scalar of ``op`` as written in expressions and code: Python's repr of the float."""
    if isinstance(c, bool) or not isinstance(c, (int, float)):
        raise ShapeError(f"{op}: the scalar must be a number, got {c!r}")
    if not math.isfinite(c):
        raise ShapeError(f"{op}: the scalar must be finite, got {c!r}")
    return repr(float(c))


def with_scalar(name: str, ctor: str, sign: str, fn: Callable[[Any, float], Any], field,
                keeps_zero: bool, doc: str) -> OpSpec:
    """``x <sign> scalar`` for a number parameter ``scalar``: the expression is ``ctor`` of x
    and ``(Const "<scalar>")``; the search tries the scalars of the program (and
    ``SearchConfig.scalars``)."""
    def shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
        scalar_text(p["scalar"], op)
        return sh.same_shape(op, shapes, p)

    def code(args: Sequence[str], p: Params) -> str:
        return f"{args[0]} {sign} {scalar_text(p['scalar'], name)}"

    return OpSpec(
        name=name, num_inputs=(1, 1), params=("scalar",), shape=shape, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app(ctor, ts[0], app("Const", scalar_text(p["scalar"], name))),
        reference=lambda xs, p: fn(xs[0], float(p["scalar"])), ff=field,
        torch=lambda xs, p: fn(xs[0], float(p["scalar"])), terms=(),
        levels=ALL_LEVELS, commutative=False,
        triton=TritonEmission(tile=lambda args, ctx, p: code(args, p),
                              host=lambda args, shapes, p: code(args, p),
                              dims=aligned, keeps_zero=keeps_zero),
        doc=doc,
    )


def count_of(p: Params, op: str = "div_count") -> int:
    """The ``count`` parameter of ``op``: a whole number from 1 to 2**53 (exact as a float)."""
    c = p.get("count")
    if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 2**53:
        raise ShapeError(f"{op}: the count must be a whole number from 1 to 2**53, got {c!r}")
    return c


def _div_count() -> OpSpec:
    """``x / count`` for a whole number ``count``: the last step of a mean, written as the
    mean's own expression ``(Div x (Num count))`` (``Const`` scalars are floats, counts are
    not), so that a sum accumulated in pieces can be finished into a mean or an rms. The search
    tries the counts of the program's expression (``tasks.Context.counts``)."""
    def shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
        count_of(p, op)
        return sh.same_shape(op, shapes, p)

    def code(args: Sequence[str], p: Params) -> str:
        return f"{args[0]} / {float(count_of(p))!r}"

    return OpSpec(
        name="div_count", num_inputs=(1, 1), params=("count",), shape=shape,
        dtype=sh.same_dtype, expr=lambda ts, shapes, p: app("Div", ts[0], app("Num", count_of(p))),
        reference=lambda xs, p: xs[0] / count_of(p), ff=ff.div_count,
        torch=lambda xs, p: xs[0] / count_of(p), terms=(), levels=ALL_LEVELS,
        commutative=False,
        triton=TritonEmission(tile=lambda args, ctx, p: code(args, p),
                              host=lambda args, shapes, p: code(args, p), dims=aligned,
                              keeps_zero=True),
        doc="divide every element by a whole number (a mean's last step), (Div x (Num count))")


def _sub_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    return app("Add", ts[0], app("Mul", ts[1], MINUS_ONE))


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # no overflow on either side
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _gelu(x: np.ndarray) -> np.ndarray:
    # The tanh form of GELU (PyTorch's approximate="tanh").
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _erf(x: np.ndarray) -> np.ndarray:
    try:  # SciPy comes with JAX
        from scipy.special import erf
    except ImportError:  # pragma: no cover
        erf = np.vectorize(math.erf, otypes=[np.float64])
    return np.asarray(erf(x), dtype=np.result_type(x, np.float32))


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


#: GELU's constructor, shared by ``gelu`` and ``gelu_tanh`` (one function)
GELU = term("Gelu", 8.0, "GELU, tanh form")
#: tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
GELU_TANH_TILE = "{x} * tl.sigmoid({k} * ({x} + 0.044715 * {x} * {x} * {x}))"


def _torch_gelu_tanh(x: Any) -> Any:
    return torch_module().nn.functional.gelu(x, approximate="tanh")


ELEMENTWISE: list[OpSpec] = [
    binary("add", term("Add", 1.0, "element-wise sum", largest, ("Expr", "Expr")),
           operator.add, True, "+", True, "element-wise sum with size-1 broadcasting"),
    binary("mul", term("Mul", 1.0, "element-wise product", product, ("Expr", "Expr")),
           operator.mul, True, "*", True, "element-wise product with size-1 broadcasting"),
    binary("div", term("Div", 2.0, "element-wise quotient", product, ("Expr", "Expr")),
           operator.truediv, False, "/", False, "element-wise quotient with size-1 broadcasting"),
    unary("exp", term("Exp", 4.0, "e**x", exponential), np.exp, ff.exp,
          lambda x: torch_module().exp(x), "element-wise e**x",
          elementwise("{exp_x}", "torch.exp({x})", False)),
    unary("sqrt", term("Sqrt", 4.0, "square root"), np.sqrt, ff.table("sqrt"),
          lambda x: torch_module().sqrt(x), "element-wise square root",
          elementwise("tl.sqrt({x})", "torch.sqrt({x})", True)),
    unary("square", term("Square", 1.0, "x*x", square), np.square, ff.square,
          lambda x: x * x, "element-wise x*x", elementwise("{x} * {x}", "{x} * {x}", True)),
    unary("silu", term("Silu", 6.0, "x * sigmoid(x)"), _silu, ff.table("silu"),
          lambda x: torch_module().nn.functional.silu(x), "element-wise x * sigmoid(x)",
          elementwise("{x} * tl.sigmoid({x})", "{x} * torch.sigmoid({x})", True)),
    unary("gelu", GELU, _gelu, ff.table("gelu"), _torch_gelu_tanh,
          "element-wise GELU, tanh form",
          elementwise(GELU_TANH_TILE, "torch.nn.functional.gelu({x}, approximate='tanh')", True)),
    unary("relu", term("Relu", 1.0, "max(x, 0)"), lambda x: np.maximum(x, 0.0),
          ff.table("relu"), lambda x: torch_module().relu(x), "element-wise max(x, 0)",
          elementwise("tl.maximum({x}, 0.0)", "torch.relu({x})", True)),
    with_scalar("mul_scalar", "Mul", "*", operator.mul, ff.mul_scalar, True,
                "multiply every element by a constant"),
]

#: added for transformer blocks (issue 19); the table lists them after its first entries
MORE_ELEMENTWISE: list[OpSpec] = [
    OpSpec(name="sub", num_inputs=(2, 2), params=(), shape=sh.broadcast, dtype=sh.same_dtype,
           expr=_sub_expr, reference=lambda xs, p: xs[0] - xs[1], ff=ff.sub,
           torch=lambda xs, p: xs[0] - xs[1], terms=(), levels=ALL_LEVELS, commutative=False,
           triton=elementwise("{a} - {b}", "{a} - {b}", True),
           doc="element-wise difference with size-1 broadcasting, a + (-1) b"),
    OpSpec(name="neg", num_inputs=(1, 1), params=(), shape=sh.same_shape, dtype=sh.same_dtype,
           expr=lambda ts, shapes, p: app("Mul", ts[0], MINUS_ONE),
           reference=lambda xs, p: -xs[0], ff=ff.neg, torch=lambda xs, p: -xs[0], terms=(),
           levels=ALL_LEVELS, commutative=False, triton=elementwise("-{x}", "-{x}", True),
           doc="element-wise -x, x times the constant -1"),
    unary("rsqrt", term("Rsqrt", 4.0, "1 / sqrt(x)"), lambda x: 1.0 / np.sqrt(x), ff.rsqrt,
          lambda x: torch_module().rsqrt(x), "element-wise 1 / sqrt(x)",
          elementwise("tl.math.rsqrt({x})", "torch.rsqrt({x})", False)),
    unary("sigmoid", term("Sigmoid", 4.0, "1 / (1 + e**-x)"), _sigmoid, ff.table("sigmoid"),
          lambda x: torch_module().sigmoid(x), "element-wise 1 / (1 + e**-x)",
          elementwise("tl.sigmoid({x})", "torch.sigmoid({x})", False)),
    # Triton has no tanh: 2 sigmoid(2x) - 1
    unary("tanh", term("Tanh", 4.0, "tanh(x) = 2 sigmoid(2x) - 1"), np.tanh, ff.tanh,
          lambda x: torch_module().tanh(x), "element-wise tanh",
          elementwise("2.0 * tl.sigmoid(2.0 * {x}) - 1.0", "torch.tanh({x})", True)),
    unary("gelu_tanh", GELU, _gelu, ff.table("gelu"), _torch_gelu_tanh,
          "element-wise GELU, tanh form (the same function as gelu)",
          elementwise(GELU_TANH_TILE, "torch.nn.functional.gelu({x}, approximate='tanh')", True)),
    unary("gelu_erf", term("GeluErf", 8.0, "GELU, erf form"), _gelu_erf, ff.table("gelu_erf"),
          lambda x: torch_module().nn.functional.gelu(x), "element-wise GELU, erf form",
          elementwise("0.5 * {x} * (1.0 + tl.math.erf({x} * {r}))",
                      "torch.nn.functional.gelu({x})", True)),
    with_scalar("add_scalar", "Add", "+", operator.add, ff.add_scalar, False,
                "add a constant to every element"),
    _div_count(),
]

__all__ = ["ALL_LEVELS", "ELEMENTWISE", "GELU_K", "MORE_ELEMENTWISE", "binary", "count_of",
           "scalar_text", "term", "unary", "with_scalar"]
