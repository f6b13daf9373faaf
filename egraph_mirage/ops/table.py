"""The op table: one ``OpSpec`` per operator of the kernel-graph language.

To add an operator, add one entry here (and, if its expression uses a new term constructor, declare
the constructor and its reachability rule under ``rules/``). Nothing else switches on op names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import ShapeError
from ..expr import Term, app, sum_
from . import field_ops as ff
from . import shapes as sh
from .spec import BLOCK, KERNEL, THREAD, OpSpec, Params, Shape

ALL_LEVELS = frozenset({KERNEL, BLOCK, THREAD})
GRAPH_LEVELS = frozenset({KERNEL, BLOCK})


def _unary(name: str, ctor: str, fn, field, doc: str) -> OpSpec:
    return OpSpec(
        name=name, num_inputs=(1, 1), params=(), shape=sh.same_shape, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app(ctor, ts[0]),
        reference=lambda xs, p: fn(xs[0]), ff=field,
        levels=ALL_LEVELS, commutative=False, doc=doc,
    )


def _binary(name: str, ctor: str, fn, commutative: bool, doc: str) -> OpSpec:
    return OpSpec(
        name=name, num_inputs=(2, 2), params=(), shape=sh.broadcast, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app(ctor, ts[0], ts[1]),
        reference=lambda xs, p: fn(xs[0], xs[1]), ff=ff.binary(name),
        levels=ALL_LEVELS, commutative=commutative, doc=doc,
    )


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:
    # The tanh form of GELU (PyTorch's approximate="tanh").
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _scalar_text(c: object) -> str:
    if isinstance(c, bool) or not isinstance(c, (int, float)):
        raise ShapeError(f"mul_scalar: the scalar must be a number, got {c!r}")
    if not math.isfinite(c):
        raise ShapeError(f"mul_scalar: the scalar must be finite, got {c!r}")
    return repr(float(c))


def _mul_scalar_shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
    _scalar_text(p["scalar"])
    return sh.same_shape(op, shapes, p)


def _customized_shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
    kernel = _kernel(p)
    expected = [t.dims for t in kernel.tb.sources]
    if [tuple(s) for s in shapes] != expected:
        raise ShapeError(f"{op}: the kernel's loaders read shapes {sh.fmt(expected)}, "
                         f"got {sh.fmt(shapes)}")
    return kernel.output_dims(p["output"])


def _matmul_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    return sum_(shapes[0][-1], app("Mul", ts[0], ts[1]))


def _reduction_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    a = shapes[0]
    return sum_(a[sh.normalize_dim("reduction", a, p["dim"])], ts[0])


def _reduction_ref(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    return np.sum(xs[0], axis=p["dim"], keepdims=True)


def _rms_norm_shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
    out = sh.rms_norm(op, shapes, p)
    if len(shapes) == 2 and sh.broadcast(op, shapes, p) != tuple(shapes[0]):
        raise ShapeError(f"{op}: gain of shape {tuple(shapes[1])} would enlarge the input of shape "
                         f"{tuple(shapes[0])}")
    return out


def _rms_norm_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    n = sh.normalized_size("rms_norm", shapes[0], p["normalized_shape"])
    normed = app("Div", ts[0], app("Rms", n, ts[0]))
    return app("Mul", normed, ts[1]) if len(ts) == 2 else normed


def _rms_norm_ref(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    x = xs[0]
    n = sh.normalized_size("rms_norm", x.shape, p["normalized_shape"])
    flat = x.reshape(*x.shape[: x.ndim - sh._trailing_count(x.shape, n)], n)
    rms = np.sqrt(np.mean(flat * flat, axis=-1, keepdims=True))
    y = (flat / rms).reshape(x.shape)
    return y * xs[1] if len(xs) == 2 else y


def _concat_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    d = sh.normalize_dim("concat", shapes[0], p["dim"])
    return app("Concat", shapes[0][d], shapes[1][d], ts[0], ts[1])


def _concat_ref(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    # Operands may differ in broadcast (size-1) dimensions other than the joined one.
    a, b = xs
    d = p["dim"] % a.ndim
    shape = np.broadcast_shapes(a.shape[:d] + (1,) + a.shape[d + 1:],
                                b.shape[:d] + (1,) + b.shape[d + 1:])
    a = np.broadcast_to(a, shape[:d] + (a.shape[d],) + shape[d + 1:])
    b = np.broadcast_to(b, shape[:d] + (b.shape[d],) + shape[d + 1:])
    return np.concatenate((a, b), axis=d)


def _kernel(p: Params):
    return p["kernel"]


OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    OpSpec(
        name="matmul", num_inputs=(2, 2), params=(), shape=sh.matmul, dtype=sh.same_dtype,
        expr=_matmul_expr, reference=lambda xs, p: np.matmul(xs[0], xs[1]), ff=ff.binary("matmul"),
        levels=GRAPH_LEVELS, commutative=False,
        doc="matrix product over the last two dimensions, batched over the leading ones",
    ),
    _binary("add", "Add", np.add, True, "element-wise sum with size-1 broadcasting"),
    _binary("mul", "Mul", np.multiply, True, "element-wise product with size-1 broadcasting"),
    _binary("div", "Div", np.divide, False, "element-wise quotient with size-1 broadcasting"),
    _unary("exp", "Exp", np.exp, ff.exp, "element-wise e**x"),
    _unary("sqrt", "Sqrt", np.sqrt, ff.table("sqrt"), "element-wise square root"),
    _unary("square", "Square", np.square, ff.square, "element-wise x*x"),
    _unary("silu", "Silu", _silu, ff.table("silu"), "element-wise x * sigmoid(x)"),
    _unary("gelu", "Gelu", _gelu, ff.table("gelu"), "element-wise GELU, tanh form"),
    _unary("relu", "Relu", lambda x: np.maximum(x, 0.0), ff.table("relu"),
           "element-wise max(x, 0)"),
    OpSpec(
        name="mul_scalar", num_inputs=(1, 1), params=("scalar",), shape=_mul_scalar_shape,
        dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app("Mul", ts[0], app("Const", _scalar_text(p["scalar"]))),
        reference=lambda xs, p: xs[0] * float(p["scalar"]), ff=ff.mul_scalar,
        levels=ALL_LEVELS, commutative=False, doc="multiply every element by a constant",
    ),
    OpSpec(
        name="reduction", num_inputs=(1, 1), params=("dim",), shape=sh.reduction,
        dtype=sh.same_dtype, expr=_reduction_expr, reference=_reduction_ref, ff=ff.reduction,
        levels=GRAPH_LEVELS, commutative=False,
        doc="sum over one dimension, kept with size 1",
    ),
    OpSpec(
        name="rms_norm", num_inputs=(1, 2), params=("normalized_shape",), shape=_rms_norm_shape,
        dtype=sh.same_dtype, expr=_rms_norm_expr, reference=_rms_norm_ref, ff=ff.rms_norm,
        levels=GRAPH_LEVELS, commutative=False,
        doc="x / sqrt(mean(x**2)) over the trailing normalized_shape, times an optional gain",
    ),
    OpSpec(
        name="concat", num_inputs=(2, 2), params=("dim",), shape=sh.concat, dtype=sh.same_dtype,
        expr=_concat_expr, reference=_concat_ref, ff=ff.concat,
        levels=GRAPH_LEVELS, commutative=False, doc="join two tensors along one dimension",
    ),
    OpSpec(
        name="customized", num_inputs=(1, 64), params=("kernel", "output"),
        shape=_customized_shape, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: _kernel(p).exprs(ts)[p["output"]],
        reference=lambda xs, p: _kernel(p).run_vectorised(xs)[p["output"]], ff=ff.customized,
        levels=frozenset({KERNEL}), commutative=False,
        doc="output number `output` of a graph-defined kernel (a thread-block graph)",
    ),
]}
