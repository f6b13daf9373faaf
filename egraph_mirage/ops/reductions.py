"""The op table's reductions along a dimension (block and kernel level): ``reduction`` (sum),
``mean`` and ``amax``, which keep the reduced dimension with size 1, and ``rms_norm``, which
divides by the root mean square of the trailing dimensions.

Their expressions use the shared constructors (``ops.terms.CORE_TERMS``): a mean is
``(Div (Sum n x) (Num n))``, as the "mean" accumulator writes it; a max ``(Max n x)``, as the
running max of online softmax writes it; an rms ``(Rms n x)``, or with ``eps`` > 0 the mean
square plus the constant under a square root.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import FP32_LOWEST
from ..errors import ShapeError
from ..expr import Term, app, sum_
from . import field_ops as ff
from . import shapes as sh
from .elementwise import scalar_text
from .emit import aligned, torch_module
from .spec import BLOCK, KERNEL, OpSpec, Params, Shape, TileDims, TritonEmission

GRAPH_LEVELS = frozenset({KERNEL, BLOCK})


def mean_term(n: int, t: Term) -> Term:
    """``(Div (Sum n t) (Num n))``, the mean of n instances of ``t``; ``t`` when n is 1."""
    return app("Div", sum_(n, t), app("Num", n)) if n > 1 else t


def max_term(n: int, t: Term) -> Term:
    """``(Max n t)``, the max of n instances of ``t``; ``t`` when n is 1."""
    return app("Max", n, t) if n > 1 else t


def _dim(op: str, shapes: Sequence[Shape], p: Params) -> int:
    return sh.normalize_dim(op, shapes[0], p["dim"])


def _reduction_dims(shapes: Sequence[Shape], p: Params) -> TileDims:
    d = sh.normalize_dim("reduction", shapes[0], p["dim"])
    return TileDims(out=tuple(() if j == d else ((0, j),) for j in range(len(shapes[0]))),
                    reduced=(d,))


def _tile_dim(ctx: Any, p: Params) -> int:
    return p["dim"] % len(ctx.real(0))


def _mean_tile(args: Sequence[str], ctx: Any, p: Params) -> str:
    d = _tile_dim(ctx, p)
    return f"{ctx.sum(args[0], 0, (d,))} / {float(ctx.real(0)[d])!r}"


def along(name: str, expr, reference, field, torch_fn, tile, host: str, keeps_zero: bool,
          doc: str) -> OpSpec:
    """A reduction over the dimension ``dim``, kept with size 1: ``expr(n, term)`` of the
    size n of ``dim``, ``reference(x, dim)`` in numpy, ``torch_fn(x, dim)``, the tile emission
    and the torch text of ``host`` (a format string over ``x`` and ``dim``)."""
    return OpSpec(
        name=name, num_inputs=(1, 1), params=("dim",), shape=sh.reduction, dtype=sh.same_dtype,
        expr=lambda ts, shapes, p: expr(shapes[0][_dim(name, shapes, p)], ts[0]),
        reference=lambda xs, p: reference(xs[0], p["dim"]), ff=field,
        torch=lambda xs, p: torch_fn(xs[0], p["dim"]), terms=(),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(tile=tile,
                              host=lambda args, shapes, p: host.format(x=args[0], dim=p["dim"]),
                              dims=_reduction_dims, keeps_zero=keeps_zero),
        doc=doc,
    )


# --- rms_norm ------------------------------------------------------------------------------------

def _eps(p: Params) -> float:
    """rms_norm's ``eps``: 0.0 when left out (``OpSpec.bind`` leaves out 0.0)."""
    return float(p.get("eps", 0.0))


def _eps_checked(op: str, p: Params) -> float:
    eps = p.get("eps", 0.0)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) \
            or eps < 0:
        raise ShapeError(f"{op}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _rms_norm_shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
    _eps_checked(op, p)
    out = sh.rms_norm(op, shapes, p)
    if len(shapes) == 2 and sh.broadcast(op, shapes, p) != tuple(shapes[0]):
        raise ShapeError(f"{op}: gain of shape {tuple(shapes[1])} would enlarge the input of shape "
                         f"{tuple(shapes[0])}")
    return out


def _rms_norm_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    n = sh.normalized_size("rms_norm", shapes[0], p["normalized_shape"])
    x, eps = ts[0], _eps(p)
    if eps:  # sqrt(mean(x * x) + eps)
        root = app("Sqrt", app("Add", mean_term(n, app("Mul", x, x)),
                               app("Const", scalar_text(eps, "rms_norm"))))
    else:
        root = app("Rms", n, x)
    normed = app("Div", x, root)
    return app("Mul", normed, ts[1]) if len(ts) == 2 else normed


def _rms_norm_ref(xs: Sequence[np.ndarray], p: Params) -> np.ndarray:
    x = xs[0]
    n = sh.normalized_size("rms_norm", x.shape, p["normalized_shape"])
    flat = x.reshape(*x.shape[: x.ndim - sh._trailing_count(x.shape, n)], n)
    mean_square = np.mean(flat * flat, axis=-1, keepdims=True)
    eps = _eps(p)
    rms = np.sqrt(mean_square + eps if eps else mean_square)
    y = (flat / rms).reshape(x.shape)
    return y * xs[1] if len(xs) == 2 else y


def _rms_norm_axes(shape: Shape, p: Params) -> tuple[int, ...]:
    """The (non-negative) trailing dimensions that rms_norm normalises over."""
    n = sh.normalized_size("rms_norm", shape, p["normalized_shape"])
    k = sh._trailing_count(shape, n)
    return tuple(range(len(shape) - k, len(shape)))


def _plus_eps(p: Params) -> str:
    eps = _eps(p)
    return f" + {eps!r}" if eps else ""


def _rms_norm_tile(args: Sequence[str], ctx, p: Params) -> str:
    x = args[0]
    axes = _rms_norm_axes(ctx.real(0), p)
    n = math.prod(ctx.real(0)[d] for d in axes)
    normed = f"{x} / tl.sqrt({ctx.sum(f'{x} * {x}', 0, axes)} / {float(n)!r}{_plus_eps(p)})"
    return f"{normed} * {args[1]}" if len(args) == 2 else normed


def _rms_norm_host(args: Sequence[str], shapes: Sequence[Shape], p: Params) -> str:
    x = args[0]
    dims = tuple(d - len(shapes[0]) for d in _rms_norm_axes(shapes[0], p))
    normed = (f"{x} / torch.sqrt(torch.mean({x} * {x}, dim={dims}, keepdim=True)"
              f"{_plus_eps(p)})")
    return f"{normed} * {args[1]}" if len(args) == 2 else normed


def _torch_rms_norm(xs: Sequence[Any], p: Params) -> Any:
    x = xs[0]
    n = sh.normalized_size("rms_norm", tuple(x.shape), p["normalized_shape"])
    trailing = sh._trailing_count(tuple(x.shape), n)
    # eps 0 unless given (the reference has none)
    y = torch_module().nn.functional.rms_norm(x, tuple(x.shape[x.ndim - trailing:]),
                                              eps=_eps(p))
    return y * xs[1] if len(xs) == 2 else y


REDUCTIONS: list[OpSpec] = [
    along("reduction", sum_, lambda x, d: np.sum(x, axis=d, keepdims=True), ff.reduction,
          lambda x, d: torch_module().sum(x, dim=d, keepdim=True),
          lambda args, ctx, p: ctx.sum(args[0], 0, (_tile_dim(ctx, p),)),
          "torch.sum({x}, dim={dim}, keepdim=True)", True,
          "sum over one dimension, kept with size 1"),
    OpSpec(
        name="rms_norm", num_inputs=(1, 2), params=("normalized_shape",), shape=_rms_norm_shape,
        dtype=sh.same_dtype, expr=_rms_norm_expr, reference=_rms_norm_ref, ff=ff.rms_norm,
        torch=_torch_rms_norm, terms=(),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(tile=_rms_norm_tile, host=_rms_norm_host, dims=aligned,
                              keeps_zero=False),
        doc="x / sqrt(mean(x**2) + eps) over the trailing normalized_shape, times an optional "
            "gain (eps 0 unless given)",
        optional=(("eps", 0.0),),
    ),
]

def floored(m: Any) -> Any:
    """A max (a numpy array or a torch tensor) no lower than the lowest finite fp32
    (``FP32_LOWEST``; NaN propagates); a tensor in its own dtype (-inf in fp16 and bf16, which
    cannot hold it: as the lowering stores it). The floor of ``amax`` and of the μGraph
    interpreters' maxima (``mugraph.accumulators``)."""
    if isinstance(m, (np.ndarray, np.generic)):
        return np.maximum(m, FP32_LOWEST)
    torch = torch_module()
    return torch.maximum(m, torch.tensor(FP32_LOWEST).to(m.dtype))


#: the reductions added for transformer blocks (issue 19), after the table's first entries
MORE_REDUCTIONS: list[OpSpec] = [
    along("mean", mean_term, lambda x, d: np.mean(x, axis=d, keepdims=True), ff.mean,
          lambda x, d: torch_module().mean(x, dim=d, keepdim=True), _mean_tile,
          "torch.mean({x}, dim={dim}, keepdim=True)", True,
          "mean over one dimension, kept with size 1"),
    along("amax", max_term,
          lambda x, d: floored(np.max(x, axis=d, keepdims=True)), ff.amax,
          lambda x, d: floored(torch_module().amax(x, dim=d, keepdim=True)),
          lambda args, ctx, p: ctx.max(args[0], 0, (_tile_dim(ctx, p),)),
          f"torch.maximum(torch.amax({{x}}, dim={{dim}}, keepdim=True), "
          f"torch.tensor({FP32_LOWEST!r}).to({{x}}.dtype))", False,
          "max over one dimension, kept with size 1, no lower than the lowest finite fp32"),
]
