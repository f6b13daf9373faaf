"""The op table: one ``OpSpec`` per operator of the kernel-graph language.

To add an operator, add one entry here; if its expression uses a new term constructor, the entry
declares it (``terms``) and the oracle derives the datatype line and the reachability rule. Its
identities go under ``rules/``, one per line. Nothing else switches on op names.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import LowerError, ShapeError
from ..expr import Term, app, sum_
from . import field_ops as ff
from . import shapes as sh
from .spec import BLOCK, KERNEL, THREAD, OpSpec, Params, Shape, TileDims, TritonEmission
from .terms import Constructor, exponential, largest, opaque, product, square

ALL_LEVELS = frozenset({KERNEL, BLOCK, THREAD})
GRAPH_LEVELS = frozenset({KERNEL, BLOCK})
#: 2 * sqrt(2 / pi): the tanh form of GELU is x * sigmoid(GELU_K * (x + 0.044715 x^3))
GELU_K = 2.0 * math.sqrt(2.0 / math.pi)
#: log2(e): the lowering writes exp(x) as exp2(x * LOG2E) (``triton_exp``)
LOG2E = 1.4426950408889634


def triton_exp(x: str) -> str:
    """Triton for e**x of fp32 expression ``x``: ``tl.math.exp2(x * log2(e))``. Measured on an
    H200 with Triton 3.6 (``docs/benchmarks.md``), this is faster than ``tl.exp(x)`` where
    exponentials are much of a kernel's work (the attention kernels' inner loop: mqa at b = 16
    47.0 → 41.5 µs), with the same measured error."""
    arg = x if x.replace(".", "_").isidentifier() else f"({x})"
    return f"tl.math.exp2({arg} * {LOG2E!r})"


# --- Triton emission helpers (see ``TritonEmission``) ------------------------------------------

def _aligned(shapes: Sequence[Shape], p: Params) -> TileDims:
    """Element-wise: every output dimension aligned with the same dimension of each operand."""
    rank = len(shapes[0])
    return TileDims(out=tuple(tuple((o, j) for o in range(len(shapes))) for j in range(rank)))


def elementwise(tile: str, host: str, keeps_zero: bool) -> TritonEmission:
    """An element-wise emission from format strings over ``{x}`` (unary) or ``{a}``, ``{b}``;
    ``{exp_x}`` is ``triton_exp`` of ``{x}``."""
    def fmt(text: str, args: Sequence[str]) -> str:
        return text.format(x=args[0], a=args[0], b=args[-1], k=repr(GELU_K),
                           exp_x=triton_exp(args[0]))

    return TritonEmission(tile=lambda args, ctx, p: fmt(tile, args),
                          host=lambda args, shapes, p: fmt(host, args),
                          dims=_aligned, keeps_zero=keeps_zero)


def _torch() -> Any:
    """PyTorch, imported on first use (the package imports without it)."""
    import torch

    return torch


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


def _binary(name: str, term: Constructor, fn, commutative: bool, sign: str, keeps_zero: bool,
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


def _matmul_dims(shapes: Sequence[Shape], p: Params) -> TileDims:
    r = len(shapes[0])
    batch = tuple(((0, j), (1, j)) for j in range(r - 2))
    return TileDims(out=(*batch, ((0, r - 2),), ((1, r - 1),)),
                    joined=(((0, r - 1), (1, r - 2)),),
                    dot=((0, r - 2), (0, r - 1), (1, r - 2), (1, r - 1)))


def _reduction_dims(shapes: Sequence[Shape], p: Params) -> TileDims:
    d = sh.normalize_dim("reduction", shapes[0], p["dim"])
    return TileDims(out=tuple(() if j == d else ((0, j),) for j in range(len(shapes[0]))),
                    reduced=(d,))


def _rms_norm_axes(shape: Shape, p: Params) -> tuple[int, ...]:
    """The (non-negative) trailing dimensions that rms_norm normalises over."""
    n = sh.normalized_size("rms_norm", shape, p["normalized_shape"])
    k = sh._trailing_count(shape, n)
    return tuple(range(len(shape) - k, len(shape)))


def _rms_norm_tile(args: Sequence[str], ctx, p: Params) -> str:
    x = args[0]
    axes = _rms_norm_axes(ctx.real(0), p)
    n = math.prod(ctx.real(0)[d] for d in axes)
    normed = f"{x} / tl.sqrt({ctx.sum(f'{x} * {x}', 0, axes)} / {float(n)!r})"
    return f"{normed} * {args[1]}" if len(args) == 2 else normed


def _rms_norm_host(args: Sequence[str], shapes: Sequence[Shape], p: Params) -> str:
    x = args[0]
    dims = tuple(d - len(shapes[0]) for d in _rms_norm_axes(shapes[0], p))
    normed = f"{x} / torch.sqrt(torch.mean({x} * {x}, dim={dims}, keepdim=True))"
    return f"{normed} * {args[1]}" if len(args) == 2 else normed


def _concat_dims(shapes: Sequence[Shape], p: Params) -> TileDims:
    d = sh.normalize_dim("concat", shapes[0], p["dim"])
    return TileDims(out=tuple(() if j == d else ((0, j), (1, j)) for j in range(len(shapes[0]))))


def _concat_host(args: Sequence[str], shapes: Sequence[Shape], p: Params) -> str:
    d = sh.normalize_dim("concat", shapes[0], p["dim"])
    a, b = shapes
    joint = [max(x, y) for x, y in zip(a, b)]
    parts = []
    for name, s in zip(args, shapes):
        want = tuple(s[j] if j == d else joint[j] for j in range(len(s)))
        parts.append(name if want == tuple(s) else f"{name}.expand({want})")
    return f"torch.cat(({parts[0]}, {parts[1]}), dim={d})"


def _not_an_expression(*args: object) -> str:
    raise LowerError("customized: a graph-defined kernel is lowered as a whole (one Triton "
                     "kernel, egraph_mirage.lower), not as an expression")


def _evaluated_whole(*args: object) -> Any:
    raise LowerError("customized: a graph-defined kernel is evaluated as a whole (its thread-"
                     "block graph, by each evaluator: verify.kernels, gpu.torch_eval)")


def _torch_rms_norm(xs: Sequence[Any], p: Params) -> Any:
    x = xs[0]
    n = sh.normalized_size("rms_norm", tuple(x.shape), p["normalized_shape"])
    trailing = sh._trailing_count(tuple(x.shape), n)
    # the reference has no eps
    y = _torch().nn.functional.rms_norm(x, tuple(x.shape[x.ndim - trailing:]), eps=0.0)
    return y * xs[1] if len(xs) == 2 else y


def _torch_concat(xs: Sequence[Any], p: Params) -> Any:
    torch = _torch()
    a, b = xs  # operands may differ in size-1 dimensions other than the joined one
    d = p["dim"] % a.ndim
    other = torch.broadcast_shapes(a.shape[:d] + (1,) + a.shape[d + 1:],
                                   b.shape[:d] + (1,) + b.shape[d + 1:])
    a = a.expand(*other[:d], a.shape[d], *other[d + 1:])
    b = b.expand(*other[:d], b.shape[d], *other[d + 1:])
    return torch.cat((a, b), dim=d)


def _term(name: str, cost: float, doc: str, degree=opaque, sorts: tuple[str, ...] = ("Expr",)
          ) -> Constructor:
    return Constructor(name, sorts, doc, cost, degree)


OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    OpSpec(
        name="matmul", num_inputs=(2, 2), params=(), shape=sh.matmul, dtype=sh.same_dtype,
        expr=_matmul_expr, reference=lambda xs, p: np.matmul(xs[0], xs[1]), ff=ff.binary("matmul"),
        torch=lambda xs, p: _torch().matmul(xs[0], xs[1]), terms=(),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(tile=lambda args, ctx, p: ctx.dot(0, 1),
                              host=lambda args, shapes, p: f"torch.matmul({args[0]}, {args[1]})",
                              dims=_matmul_dims, keeps_zero=True, dot_operands=(0, 1)),
        doc="matrix product over the last two dimensions, batched over the leading ones",
    ),
    _binary("add", _term("Add", 1.0, "element-wise sum", largest, ("Expr", "Expr")),
            operator.add, True, "+", True, "element-wise sum with size-1 broadcasting"),
    _binary("mul", _term("Mul", 1.0, "element-wise product", product, ("Expr", "Expr")),
            operator.mul, True, "*", True, "element-wise product with size-1 broadcasting"),
    _binary("div", _term("Div", 2.0, "element-wise quotient", product, ("Expr", "Expr")),
            operator.truediv, False, "/", False, "element-wise quotient with size-1 broadcasting"),
    unary("exp", _term("Exp", 4.0, "e**x", exponential), np.exp, ff.exp,
          lambda x: _torch().exp(x), "element-wise e**x",
          elementwise("{exp_x}", "torch.exp({x})", False)),
    unary("sqrt", _term("Sqrt", 4.0, "square root"), np.sqrt, ff.table("sqrt"),
          lambda x: _torch().sqrt(x), "element-wise square root",
          elementwise("tl.sqrt({x})", "torch.sqrt({x})", True)),
    unary("square", _term("Square", 1.0, "x*x", square), np.square, ff.square,
          lambda x: x * x, "element-wise x*x", elementwise("{x} * {x}", "{x} * {x}", True)),
    unary("silu", _term("Silu", 6.0, "x * sigmoid(x)"), _silu, ff.table("silu"),
          lambda x: _torch().nn.functional.silu(x), "element-wise x * sigmoid(x)",
          elementwise("{x} * tl.sigmoid({x})", "{x} * torch.sigmoid({x})", True)),
    # tanh form: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
    unary("gelu", _term("Gelu", 8.0, "GELU"), _gelu, ff.table("gelu"),
          lambda x: _torch().nn.functional.gelu(x, approximate="tanh"),
          "element-wise GELU, tanh form",
          elementwise("{x} * tl.sigmoid({k} * ({x} + 0.044715 * {x} * {x} * {x}))",
                       "torch.nn.functional.gelu({x}, approximate='tanh')", True)),
    unary("relu", _term("Relu", 1.0, "max(x, 0)"), lambda x: np.maximum(x, 0.0),
          ff.table("relu"), lambda x: _torch().relu(x), "element-wise max(x, 0)",
          elementwise("tl.maximum({x}, 0.0)", "torch.relu({x})", True)),
    OpSpec(
        name="mul_scalar", num_inputs=(1, 1), params=("scalar",), shape=_mul_scalar_shape,
        dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: app("Mul", ts[0], app("Const", _scalar_text(p["scalar"]))),
        reference=lambda xs, p: xs[0] * float(p["scalar"]), ff=ff.mul_scalar,
        torch=lambda xs, p: xs[0] * float(p["scalar"]), terms=(),
        levels=ALL_LEVELS, commutative=False,
        triton=TritonEmission(
            tile=lambda args, ctx, p: f"{args[0]} * {_scalar_text(p['scalar'])}",
            host=lambda args, shapes, p: f"{args[0]} * {_scalar_text(p['scalar'])}",
            dims=_aligned, keeps_zero=True),
        doc="multiply every element by a constant",
    ),
    OpSpec(
        name="reduction", num_inputs=(1, 1), params=("dim",), shape=sh.reduction,
        dtype=sh.same_dtype, expr=_reduction_expr, reference=_reduction_ref, ff=ff.reduction,
        torch=lambda xs, p: _torch().sum(xs[0], dim=p["dim"], keepdim=True), terms=(),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(
            tile=lambda args, ctx, p: ctx.sum(args[0], 0, (p["dim"] % len(ctx.real(0)),)),
            host=lambda args, shapes, p: f"torch.sum({args[0]}, dim={p['dim']}, keepdim=True)",
            dims=_reduction_dims, keeps_zero=True),
        doc="sum over one dimension, kept with size 1",
    ),
    OpSpec(
        name="rms_norm", num_inputs=(1, 2), params=("normalized_shape",), shape=_rms_norm_shape,
        dtype=sh.same_dtype, expr=_rms_norm_expr, reference=_rms_norm_ref, ff=ff.rms_norm,
        torch=_torch_rms_norm, terms=(),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(tile=_rms_norm_tile, host=_rms_norm_host, dims=_aligned,
                              keeps_zero=False),
        doc="x / sqrt(mean(x**2)) over the trailing normalized_shape, times an optional gain",
    ),
    OpSpec(
        name="concat", num_inputs=(2, 2), params=("dim",), shape=sh.concat, dtype=sh.same_dtype,
        expr=_concat_expr, reference=_concat_ref, ff=ff.concat, torch=_torch_concat,
        terms=(_term("Concat", 1.0, "a (k1 long) followed by b (k2 long) along one dimension",
                     largest, ("i64", "i64", "Expr", "Expr")),),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(
            tile=lambda args, ctx, p: ctx.concat(args[0], args[1], p["dim"] % len(ctx.real(0))),
            host=_concat_host, dims=_concat_dims, keeps_zero=False),
        doc="join two tensors along one dimension",
    ),
    OpSpec(
        name="customized", num_inputs=(1, 64), params=("kernel", "output"),
        shape=_customized_shape, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: _kernel(p).exprs(ts)[p["output"]],
        reference=lambda xs, p: _kernel(p).run_vectorised(xs)[p["output"]],
        ff=_evaluated_whole, torch=_evaluated_whole, terms=(),
        levels=frozenset({KERNEL}), commutative=False,
        triton=TritonEmission(tile=_not_an_expression, host=_not_an_expression,
                              dims=_not_an_expression, keeps_zero=False),  # type: ignore[arg-type]
        doc="output number `output` of a graph-defined kernel (a thread-block graph)",
    ),
]}
