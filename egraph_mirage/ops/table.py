"""The op table: one ``OpSpec`` per operator of the kernel-graph language.

To add an operator, add one entry (here, or in the module of its kind: ``elementwise``,
``reductions``, ``layout``, ``cast``); if its expression uses a new term constructor, the entry
declares it (``terms``) and the oracle derives the datatype line and the reachability rule. Its
identities go under ``rules/``, one per line. Nothing else switches on op names.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import LowerError, ShapeError
from ..expr import Term, app, sum_
from . import field_ops as ff
from . import shapes as sh
from .cast import CASTS
from .elementwise import ALL_LEVELS, ELEMENTWISE, MORE_ELEMENTWISE, unary
from .emit import GELU_K, LOG2E, elementwise, torch_module, triton_exp
from .layout import LAYOUT, MORE_LAYOUT
from .reductions import GRAPH_LEVELS, MORE_REDUCTIONS, REDUCTIONS
from .spec import KERNEL, OpSpec, Params, Shape, TileDims, TritonEmission


def _customized_shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
    kernel = _kernel(p)
    expected = [t.dims for t in kernel.tb.sources]
    if [tuple(s) for s in shapes] != expected:
        raise ShapeError(f"{op}: the kernel's loaders read shapes {sh.fmt(expected)}, "
                         f"got {sh.fmt(shapes)}")
    return kernel.output_dims(p["output"])


def _matmul_expr(ts: Sequence[Term], shapes: Sequence[Shape], p: Params) -> Term:
    return sum_(shapes[0][-1], app("Mul", ts[0], ts[1]))


def _kernel(p: Params):
    return p["kernel"]


def _matmul_dims(shapes: Sequence[Shape], p: Params) -> TileDims:
    r = len(shapes[0])
    batch = tuple(((0, j), (1, j)) for j in range(r - 2))
    return TileDims(out=(*batch, ((0, r - 2),), ((1, r - 1),)),
                    joined=(((0, r - 1), (1, r - 2)),),
                    dot=((0, r - 2), (0, r - 1), (1, r - 2), (1, r - 1)))


def _not_an_expression(*args: object) -> str:
    raise LowerError("customized: a graph-defined kernel is lowered as a whole (one Triton "
                     "kernel, egraph_mirage.lower), not as an expression")


def _evaluated_whole(*args: object) -> Any:
    raise LowerError("customized: a graph-defined kernel is evaluated as a whole (its thread-"
                     "block graph, by each evaluator: verify.kernels, gpu.torch_eval)")


MATMUL = OpSpec(
    name="matmul", num_inputs=(2, 2), params=(), shape=sh.matmul, dtype=sh.same_dtype,
    expr=_matmul_expr, reference=lambda xs, p: np.matmul(xs[0], xs[1]), ff=ff.binary("matmul"),
    torch=lambda xs, p: torch_module().matmul(xs[0], xs[1]), terms=(),
    levels=GRAPH_LEVELS, commutative=False,
    triton=TritonEmission(tile=lambda args, ctx, p: ctx.dot(0, 1),
                          host=lambda args, shapes, p: f"torch.matmul({args[0]}, {args[1]})",
                          dims=_matmul_dims, keeps_zero=True, dot_operands=(0, 1),
                          host_stored=True),
    doc="matrix product over the last two dimensions, batched over the leading ones",
)

CUSTOMIZED = OpSpec(
    name="customized", num_inputs=(1, 64), params=("kernel", "output"),
    shape=_customized_shape, dtype=sh.same_dtype,
    expr=lambda ts, shapes, p: _kernel(p).exprs(ts)[p["output"]],
    reference=lambda xs, p: _kernel(p).run_vectorised(xs)[p["output"]],
    ff=_evaluated_whole, torch=_evaluated_whole, terms=(),
    levels=frozenset({KERNEL}), commutative=False,
    triton=TritonEmission(tile=_not_an_expression, host=_not_an_expression,
                          dims=_not_an_expression, keeps_zero=False),  # type: ignore[arg-type]
    doc="output number `output` of a graph-defined kernel (a thread-block graph)",
)

#: the entries in table order, which is the order of the oracle's datatype and of the search's
#: candidate operators: the first entries as they have always been, then those added for
#: transformer blocks (``MORE_*``), so the search meets the earlier operators first, then the
#: dtype conversion (which the search never proposes: ``cast.py``)
OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    MATMUL, *ELEMENTWISE, *REDUCTIONS, *LAYOUT,
    *MORE_ELEMENTWISE, *MORE_REDUCTIONS, *MORE_LAYOUT, *CASTS, CUSTOMIZED,
]}

#: the operators that reduce a dimension (a matmul's contraction, a sum, a mean, a max, a
#: norm's statistics): a block graph that loops over it accumulates what they reduce
REDUCING: frozenset[str] = frozenset(
    spec.name for spec in [MATMUL, *REDUCTIONS, *MORE_REDUCTIONS])

__all__ = ["ALL_LEVELS", "GELU_K", "GRAPH_LEVELS", "LOG2E", "OPS", "REDUCING", "elementwise",
           "triton_exp", "unary"]
