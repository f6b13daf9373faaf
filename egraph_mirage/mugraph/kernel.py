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
from . import accumulators as accs
from . import maps as pt
from .accumulators import lookup_accumulator
from .maps import EPILOGUE, INVARIANT, LOOP_SIDE

#: the block graph run on a grid: (loader index -> the kernel input it reads, grid, loader index
#: -> its tiles already laid out) -> the saved tiles in the vectorised layout, in saver order
Body = Callable[[dict[int, Any], tuple[int, ...], dict[int, Any]], list[Any]]


class GraphDefinedKernel:
    """An immutable use of a thread-block graph as a kernel (``ThreadBlockGraph.as_kernel``)."""

    def __init__(self, tb: Any) -> None:
        """``tb``: a ``ThreadBlockGraph`` (``threadblock``, which builds kernels through
        ``as_kernel`` and so imports this module, not the other way round)."""
        if not callable(getattr(tb, "as_kernel", None)):
            raise GraphError(f"customized: expected a ThreadBlockGraph, got {type(tb).__name__}")
        tb.validate()
        tb.frozen = True
        self.tb = tb
        self.num_outputs = len(tb.outputs)

    def output_dims(self, i: int) -> tuple[int, ...]:
        return self.tb.output_dims(i)

    def __repr__(self) -> str:
        # one line: the grid, the for-loop's range and the block operators (loaders not counted);
        # ``repr(ThreadBlockGraph)`` (``kernel.tb``) lists the operators themselves
        tb = self.tb
        grid = ",".join(str(d) for d in tb.grid_dim)
        ops = sum(1 for t in tb.tensors if t.op != "input")
        return f"GraphDefinedKernel(grid=({grid}), loop={tb.forloop_range}, {ops} ops)"

    def block_exprs(self, input_terms: Sequence[Term]) -> dict[int, Term]:
        """Abstract expression of every tile, loaders standing for their kernel inputs."""
        tb = self.tb
        terms: dict[int, Term] = {}
        for t in tb.tensors:
            if t.op == "input":
                terms[t.index] = input_terms[t.params["position"]]
            elif t.op in ("forloop_accum", "forloop_accum_rescale"):
                # rescaled by a running max: exp(m_i - m_last) is 1 once indices are abstracted
                # away, so the expression is the plain accumulator's; by any other tile, each
                # term weighted by exp(m_i - max m) (docs/mugraph.md, section 6)
                a = t.operands[0]
                acc = lookup_accumulator(t.params["acc"])
                terms[t.index] = acc.expr(terms[a.index], a.dims, tb.forloop_range,
                                          tb.reduction_dimx)
                if t.op == "forloop_accum_rescale" and t.operands[1].op != "forloop_max":
                    terms[t.index] = accs.shifted(terms[t.index], terms[t.operands[1].index])
            elif t.op == "forloop_max":
                (a,) = t.operands
                count = a.dims[-1] * (tb.forloop_range if a.side == LOOP_SIDE else 1)
                terms[t.index] = accs.running_max_expr(terms[a.index], a.dims, count)
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
                       accumulate: Callable[[str, Any, int, int], Any] | None = None,
                       running_max: Callable[[Any], Any] | None = None,
                       rescale: Callable[[Any, Any], Any] | None = None,
                       matmul_loop_sum: Callable[[Any, Any], Any] | None = None,
                       split: Callable[[Body, dict[int, Any]], list[Any]] | None = None
                       ) -> list[Any]:
        """All blocks at once. The hooks default to float semantics (numpy); another ``xp``
        must bring ``running_max`` / ``rescale`` for graphs that use them (``rescale(x, m)``
        gets ``m`` broadcast to every iteration). Optional:
        ``matmul_loop_sum`` computes the plain accumulator of a matmul in one step (or returns
        None; tiles only such accumulators use are then not computed at all), and
        ``split(body, raw)`` runs ``body`` on parts of the grid (the blocks are independent:
        a part is a smaller grid over slices of the inputs) and joins the saved tiles."""
        tb = self.tb
        apply_op = apply_op or (lambda op, xs, p: lookup(op).reference(xs, p))
        accumulate = accumulate or (lambda acc, x, n, dimx:
                                    lookup_accumulator(acc).reference(x, n, dimx))
        if xp is np:
            running_max = running_max or accs.running_max_ref
            rescale = rescale or accs.rescale_ref
        fused = self._fused_matmuls() if matmul_loop_sum else {}
        needed = self._needed(fused)

        def body(raw: dict[int, Any], grid: tuple[int, ...],
                 loaded: dict[int, Any]) -> list[Any]:
            vals = {i: pt.to_blocks(xp, x, grid, tb.forloop_range,
                                    tb.tensors[i].params["input_map"],
                                    tb.tensors[i].params["forloop_dim"]) for i, x in raw.items()}
            vals.update(loaded)
            for t in tb.tensors:
                if t.index not in needed or t.op == "input":
                    continue
                if t.index in fused:
                    a, b = tb.tensors[fused[t.index]].operands
                    got = matmul_loop_sum(vals[a.index], vals[b.index])  # type: ignore[misc]
                    if got is not None:
                        vals[t.index] = got
                        continue
                    if fused[t.index] not in vals:  # the product was skipped: compute it now
                        vals[fused[t.index]] = apply_op("matmul", [vals[a.index],
                                                                   vals[b.index]], {})
                args = [vals[o.index] for o in t.operands]
                if t.op in ("forloop_max", "forloop_accum_rescale") and (
                        running_max is None or rescale is None):
                    raise GraphError(f"{t.op}: this evaluator has no semantics for online "
                                     "softmax")
                if t.op == "forloop_accum":
                    vals[t.index] = accumulate(t.params["acc"], args[0], tb.forloop_range,
                                               tb.reduction_dimx)
                elif t.op == "forloop_accum_rescale":  # m with every iteration, also if invariant
                    m = xp.broadcast_to(args[1], _with_loop(args[1].shape, tb.forloop_range))
                    running = t.operands[1].op == "forloop_max"
                    vals[t.index] = accumulate(t.params["acc"], rescale(args[0], m, running),
                                               tb.forloop_range, tb.reduction_dimx)
                elif t.op == "forloop_max":
                    vals[t.index] = running_max(args[0])
                else:
                    vals[t.index] = apply_op(t.op, args, t.params)
            # a running max written as an output: its value after the loop
            return [_last(xp, vals[t.index]) if t.op == "forloop_max" and t.side == LOOP_SIDE
                    else vals[t.index] for t, _ in tb.outputs]

        raw = {t.index: inputs[t.params["position"]] for t in tb.inputs if t.index in needed}
        saved = split(body, raw) if split else body(raw, tb.grid_dim, {})
        return [pt.from_blocks(xp, y, tb.grid_dim, omap) for y, (_, omap) in
                zip(saved, tb.outputs)]

    def _fused_matmuls(self) -> dict[int, int]:
        """Plain accumulators of a loop-side matmul: accumulator index -> matmul index."""
        return {t.index: t.operands[0].index for t in self.tb.tensors
                if t.op == "forloop_accum" and t.params["acc"] == "plain"
                and t.operands[0].op == "matmul" and t.operands[0].side == LOOP_SIDE}

    def _needed(self, fused: dict[int, int]) -> set[int]:
        """Tiles the outputs depend on, a fused accumulator reading its matmul's operands."""
        tb, needed = self.tb, set()
        todo = [t.index for t, _ in tb.outputs]
        while todo:
            i = todo.pop()
            if i in needed:
                continue
            needed.add(i)
            uses = (tb.tensors[fused[i]].operands if i in fused else tb.tensors[i].operands)
            todo += [o.index for o in uses]
        return needed

    def run_blocks(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Literal semantics: loop over blocks and iterations (float64 numpy)."""
        tb = self.tb
        outs = [np.zeros(self.output_dims(i)) for i in range(self.num_outputs)]
        gx, gy, gz = tb.grid_dim
        for block in np.ndindex(gx, gy, gz):
            sums: dict[int, np.ndarray] = {}
            prev: dict[int, np.ndarray] = {}  # the rescale tile's value in the last iteration
            for it in range(tb.forloop_range):
                vals: dict[int, np.ndarray] = {}
                for t in tb.tensors:
                    if t.side == EPILOGUE:
                        continue
                    if t.op == "input":
                        vals[t.index] = _tile(inputs[t.params["position"]], t, block, it)
                    elif t.op == "forloop_max":  # running: combined with the previous value
                        row = accs.NUMPY.floored(np.max(vals[t.operands[0].index], axis=-1,
                                                        keepdims=True))
                        vals[t.index] = row if it == 0 else np.maximum(sums[t.index], row)
                        sums[t.index] = vals[t.index]
                    else:
                        vals[t.index] = lookup(t.op).reference(
                            [vals[o.index] for o in t.operands], t.params)
                for t in tb.tensors:
                    if t.op == "forloop_accum":
                        step = lookup_accumulator(t.params["acc"]).step(
                            vals[t.operands[0].index], tb.reduction_dimx)
                        sums[t.index] = sums.get(t.index, 0) + step
                    elif t.op == "forloop_accum_rescale":
                        x, m = (vals[o.index] for o in t.operands)
                        step = lookup_accumulator(t.params["acc"]).step(x, tb.reduction_dimx)
                        if t.operands[1].op != "forloop_max":  # m's own running max, and
                            # each term weighted by exp(m_i - it)
                            top = accs.NUMPY.floored(
                                m if it == 0 else np.maximum(prev[t.index], m))
                            step, m = step * np.exp(m - top), top
                        sums[t.index] = accs.rescale_step(sums.get(t.index), step,
                                                          prev.get(t.index), m)
                        prev[t.index] = m
            # the invariant tiles, and a running max's last value (any tile, without a loop)
            vals = {i: v for i, v in vals.items() if tb.tensors[i].side == INVARIANT
                    or tb.tensors[i].op == "forloop_max" or tb.forloop_range == 1}
            for t in tb.tensors:
                if t.side != EPILOGUE:
                    continue
                if t.op in ("forloop_accum", "forloop_accum_rescale"):
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


def _last(xp: Any, x: Any) -> Any:
    """The last iteration of a loop-side value on the vectorised layout (kept with size 1);
    values that cannot be sliced (the field's pairs) through ``xp.take``."""
    if not hasattr(x, "__getitem__"):
        return xp.take(x, -1, accs.LOOP)
    return x[(slice(None),) * accs.LOOP + (slice(x.shape[accs.LOOP] - 1, None),)]


def _with_loop(shape: Sequence[int], iters: int) -> list[int]:
    """``shape`` of the vectorised layout with ``iters`` on the loop axis."""
    return [*shape[:accs.LOOP], iters, *shape[accs.LOOP + 1:]]


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

