"""Graph-defined kernels: a validated thread-block graph used as one kernel-graph operator.

Two evaluators give its meaning, and must agree:

- ``run_blocks``: the literal semantics — every block of the grid, every loop iteration, tiles
  sliced out by the maps, accumulators stepped, results placed by the output maps. Slow; the
  ground truth.
- ``run_vectorised``: all blocks and iterations at once on the layout ``(gx, gy, gz, F, *tile)``
  (see ``partition``), with each op-table entry's array semantics. Fast; used by the float
  reference and, through ``field``, by the finite-field verifier.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import GraphError
from ..expr import Term
from ..ops import lookup
from . import partition as pt
from .accumulators import lookup_accumulator
from .threadblock import EPILOGUE, INVARIANT, ThreadBlockGraph


class GraphKernel:
    """An immutable use of a thread-block graph as a kernel."""

    def __init__(self, tb: ThreadBlockGraph) -> None:
        if not isinstance(tb, ThreadBlockGraph):
            raise GraphError(f"customized: expected a ThreadBlockGraph, got {type(tb).__name__}")
        tb.validate()
        tb.frozen = True
        self.tb = tb
        self.num_outputs = len(tb.outputs)

    def output_dims(self, i: int) -> tuple[int, ...]:
        return self.tb.output_dims(i)

    def block_exprs(self, input_terms: Sequence[Term]) -> dict[int, Term]:
        """Abstract expression of every tile, loaders standing for their kernel inputs."""
        tb = self.tb
        terms: dict[int, Term] = {}
        for t in tb.tensors:
            if t.op == "input":
                terms[t.index] = input_terms[t.params["position"]]
            elif t.op == "forloop_accum":
                (a,) = t.operands
                acc = lookup_accumulator(t.params["acc"])
                terms[t.index] = acc.expr(terms[a.index], a.dims, tb.forloop_range,
                                          tb.reduction_dimx)
            else:
                terms[t.index] = lookup(t.op).expr([terms[o.index] for o in t.operands],
                                                   [o.dims for o in t.operands], t.params)
        return terms

    def exprs(self, input_terms: Sequence[Term]) -> list[Term]:
        terms = self.block_exprs(input_terms)
        return [terms[t.index] for t, _ in self.tb.outputs]

    # --- evaluation -------------------------------------------------------------------------
    def run_vectorised(self, inputs: Sequence[Any], xp: Any = np,
                       apply_op: Callable[[str, list[Any], dict[str, Any]], Any] | None = None,
                       accumulate: Callable[[str, Any, int, int], Any] | None = None
                       ) -> list[Any]:
        """All blocks at once. ``apply_op`` / ``accumulate`` default to float semantics."""
        tb = self.tb
        apply_op = apply_op or (lambda op, xs, p: lookup(op).reference(xs, p))
        accumulate = accumulate or (lambda acc, x, n, dimx:
                                    lookup_accumulator(acc).reference(x, n, dimx))
        vals: dict[int, Any] = {}
        for t in tb.tensors:
            if t.op == "input":
                x = inputs[t.params["position"]]
                vals[t.index] = pt.to_blocks(xp, x, tb.grid_dim, tb.forloop_range,
                                             t.params["input_map"], t.params["forloop_dim"])
            elif t.op == "forloop_accum":
                vals[t.index] = accumulate(t.params["acc"], vals[t.operands[0].index],
                                           tb.forloop_range, tb.reduction_dimx)
            else:
                vals[t.index] = apply_op(t.op, [vals[o.index] for o in t.operands], t.params)
        return [pt.from_blocks(xp, vals[t.index], tb.grid_dim, omap) for t, omap in tb.outputs]

    def run_blocks(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Literal semantics: loop over blocks and iterations (float64 numpy)."""
        tb = self.tb
        outs = [np.zeros(self.output_dims(i)) for i in range(self.num_outputs)]
        gx, gy, gz = tb.grid_dim
        for block in np.ndindex(gx, gy, gz):
            sums: dict[int, np.ndarray] = {}
            for it in range(tb.forloop_range):
                vals: dict[int, np.ndarray] = {}
                for t in tb.tensors:
                    if t.side == EPILOGUE:
                        continue
                    if t.op == "input":
                        vals[t.index] = _tile(inputs[t.params["position"]], t, block, it)
                    else:
                        vals[t.index] = lookup(t.op).reference(
                            [vals[o.index] for o in t.operands], t.params)
                for t in tb.tensors:
                    if t.op == "forloop_accum":
                        step = lookup_accumulator(t.params["acc"]).step(
                            vals[t.operands[0].index], tb.reduction_dimx)
                        sums[t.index] = sums.get(t.index, 0) + step
            vals = {i: v for i, v in vals.items() if tb.tensors[i].side == INVARIANT}
            for t in tb.tensors:
                if t.side != EPILOGUE:
                    continue
                if t.op == "forloop_accum":
                    a = t.operands[0]
                    count = tb.forloop_range * a.dims[-1]
                    vals[t.index] = lookup_accumulator(t.params["acc"]).finish(sums[t.index], count)
                else:
                    vals[t.index] = lookup(t.op).reference([vals[o.index] for o in t.operands],
                                                           t.params)
            for i, (t, omap) in enumerate(tb.outputs):
                index = tuple(slice(block[a] * t.dims[d], (block[a] + 1) * t.dims[d])
                              if (a := _axis_of(omap, d)) is not None else slice(None)
                              for d in range(len(t.dims)))
                outs[i][index] = vals[t.index]
        return outs


def _axis_of(omap: Sequence[int], d: int) -> int | None:
    for a, m in enumerate(omap):
        if m == d:
            return a
    return None


def _tile(x: np.ndarray, t: Any, block: tuple[int, ...], it: int) -> np.ndarray:
    imap, fdim = t.params["input_map"], t.params["forloop_dim"]
    index = []
    for d, size in enumerate(x.shape):
        a = _axis_of(imap, d)
        start = block[a] * (size // t.graph.grid_dim[a]) if a is not None else 0
        if d == fdim:
            start += it * t.dims[d]
        index.append(slice(start, start + t.dims[d]))
    return x[tuple(index)]
