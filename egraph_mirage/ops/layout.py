"""The op table's operators that move elements (block and kernel level): ``concat`` joins two
tensors along a dimension; ``slice_last`` takes a range of the last dimension (kernel level: a
torch slice between kernels; block level: a half of a tile that holds the whole dimension, as
RoPE's rotate-half takes it, ``TileContext.half``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..expr import Term, app
from . import field_ops as ff
from . import shapes as sh
from .elementwise import term
from .emit import torch_module
from .reductions import GRAPH_LEVELS
from .spec import OpSpec, Params, Shape, TileDims, TritonEmission
from .terms import largest


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


def _torch_concat(xs: Sequence[Any], p: Params) -> Any:
    torch = torch_module()
    a, b = xs  # operands may differ in size-1 dimensions other than the joined one
    d = p["dim"] % a.ndim
    other = torch.broadcast_shapes(a.shape[:d] + (1,) + a.shape[d + 1:],
                                   b.shape[:d] + (1,) + b.shape[d + 1:])
    a = a.expand(*other[:d], a.shape[d], *other[d + 1:])
    b = b.expand(*other[:d], b.shape[d], *other[d + 1:])
    return torch.cat((a, b), dim=d)


def _slice_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    """``(Slice start stop x)``; ``x`` itself when the slice is the whole dimension."""
    if (p["start"], p["stop"]) == (0, shapes[0][-1]):
        return ts[0]
    return app("Slice", p["start"], p["stop"], ts[0])


def _slice_dims(shapes: Sequence[Shape], p: Params) -> TileDims:
    rank = len(shapes[0])
    return TileDims(out=(*(((0, j),) for j in range(rank - 1)), ()))


def _slice_tile(args: Sequence[str], ctx: Any, p: Params) -> str:
    return ctx.half(args[0], p["start"], p["stop"])


LAYOUT: list[OpSpec] = [
    OpSpec(
        name="concat", num_inputs=(2, 2), params=("dim",), shape=sh.concat, dtype=sh.same_dtype,
        expr=_concat_expr, reference=_concat_ref, ff=ff.concat, torch=_torch_concat,
        terms=(term("Concat", 1.0, "a (k1 long) followed by b (k2 long) along one dimension",
                    largest, ("i64", "i64", "Expr", "Expr")),),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(
            tile=lambda args, ctx, p: ctx.concat(args[0], args[1], p["dim"] % len(ctx.real(0))),
            host=_concat_host, dims=_concat_dims, keeps_zero=False),
        doc="join two tensors along one dimension",
    ),
]

#: added for transformer blocks (issue 19), after the table's first entries
MORE_LAYOUT: list[OpSpec] = [
    OpSpec(
        name="slice_last", num_inputs=(1, 1), params=("start", "stop"), shape=sh.slice_last,
        dtype=sh.same_dtype, expr=_slice_expr,
        reference=lambda xs, p: xs[0][..., p["start"]:p["stop"]], ff=ff.slice_last,
        torch=lambda xs, p: xs[0][..., p["start"]:p["stop"]],
        terms=(term("Slice", 1.0, "elements start..stop-1 of the last dimension of x", largest,
                    ("i64", "i64", "Expr")),),
        levels=GRAPH_LEVELS, commutative=False,
        triton=TritonEmission(
            tile=_slice_tile,
            host=lambda args, shapes, p: f"{args[0]}[..., {p['start']}:{p['stop']}].contiguous()",
            dims=_slice_dims, keeps_zero=False),
        doc="elements start:stop of the last dimension",
    ),
]
