"""Finite-field semantics of graph-defined kernels: a kernel's thread-block graph run over
Z_p x Z_q with the op table's ``ff`` entries and the accumulators' ``ff`` semantics.

The op table's ``customized`` entry is evaluated as a whole (``OpSpec.graph_defined``): the
kernel's vectorised evaluator runs every block at once, with a matmul accumulated over the loop as
one product (``Field.matmul_sum``) and the grid-slicing of ``chunks.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..mugraph import accumulators as accs
from ..ops import lookup
from ..ops.spec import Params
from .chunks import splitter


def kernel_output(f: Any, xs: Sequence[Any], p: Params) -> Any:
    """Output ``p["output"]`` of the graph-defined kernel ``p["kernel"]`` on operands ``xs``
    (``FF`` values of the field ``f``); all outputs of one call are computed once."""
    kernel = p["kernel"]
    key = (id(kernel), *(id(x) for x in xs))
    if key not in f.memo:  # the operands stay alive in the memo, so their ids stay unique
        f.memo[key] = (xs, kernel.run_vectorised(
            list(xs), xp=f.arrays, apply_op=lambda op, ys, q: field_op(f, op, ys, q),
            accumulate=lambda acc, x, n, dimx: accs.lookup_accumulator(acc).ff(f, x, n, dimx),
            running_max=lambda x: accs.running_max_ff(f, x),
            rescale=lambda x, m, running: accs.rescale_ff(f, x, m, running),
            matmul_loop_sum=lambda a, b: f.matmul_sum(a, b, accs.LOOP),
            split=splitter(f, kernel.tb),
        ))
    return f.memo[key][1][p["output"]]


def field_op(f: Any, op: str, xs: Sequence[Any], p: Params) -> Any:
    """Operator ``op`` over the field: its table entry's ``ff``, or the kernel as a whole."""
    spec = lookup(op)
    return kernel_output(f, xs, p) if spec.graph_defined else spec.ff(f, xs, p)
