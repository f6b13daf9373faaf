"""Kernel graphs as PyTorch functions: one table entry per operator, one per accumulator.

``torch_function(g)`` walks ``g`` once and returns ``fn(*inputs) -> list of outputs`` that calls
each operator's op-table ``torch`` rule, in the inputs' dtype and on their device. It is the PyTorch
eager baseline, what ``torch.compile`` compiles, and (upcast to float32) the reference that tuned
kernels are checked against. Graph-defined kernels (``customized``) run through the kernel's own
vectorised evaluator with the torch entries below, so a μGraph evaluates too; online softmax's
running max and rescaled accumulators (``running_max``, ``rescale``) give the per-block
interpreter's results (``em.run_reference``), infinities and NaNs included.

Nothing here switches on operator names: an operator's PyTorch semantics are part of its op-table
entry.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import GraphError
from ..graph import KernelGraph, Tensor
from ..mugraph import accumulators as accs
from ..ops import lookup

Params = dict[str, Any]
TorchOp = Callable[[Sequence[torch.Tensor], Params], torch.Tensor]
TorchAcc = Callable[[torch.Tensor, int, int], torch.Tensor]


def running_max(x: torch.Tensor) -> torch.Tensor:
    """``forloop_max`` on the vectorised layout: the row max, then the maximum over the
    iterations so far (``mugraph.accumulators.running_max_in``; NaN propagates)."""
    return accs.running_max_in(accs.torch_ops(), x)


def rescale(x: torch.Tensor, m: torch.Tensor, running: bool = True) -> torch.Tensor:
    """The terms ``x_i * w_i`` of ``forloop_accum_rescale`` (``m`` with every iteration on the
    loop axis): ``w_i = exp(m_i - m_last)``, 1 for the last iteration, NaN where a later factor
    ``exp(m_(j-1) - m_j)`` is NaN, so that the sum is the per-block recurrence's total
    (``mugraph.accumulators.rescale_in``)."""
    return accs.rescale_in(accs.torch_ops(), x, m, running)


def _customized(xs: Sequence[torch.Tensor], p: Params, hold: torch.dtype | None = None
                ) -> torch.Tensor:
    apply = apply_op if hold is None else functools.partial(apply_op, hold=hold)
    return p["kernel"].run_vectorised(list(xs), xp=TorchArrays, apply_op=apply,
                                      accumulate=accumulate, running_max=running_max,
                                      rescale=rescale)[p["output"]]


#: for-loop accumulator name -> PyTorch semantics on the vectorised layout (gx, gy, gz, F, *tile):
#: each kind's record (``Accumulator.torch``), looked up as the table changes
TORCH_ACCUMULATORS: Mapping[str, TorchAcc] = accs.RecordView(lambda acc: acc.torch)


class TorchArrays:
    """The three array functions the vectorised kernel evaluator needs, for torch tensors."""

    @staticmethod
    def reshape(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        return torch.reshape(x, tuple(shape))

    @staticmethod
    def transpose(x: torch.Tensor, perm: Sequence[int]) -> torch.Tensor:
        return x.permute(*perm)

    @staticmethod
    def broadcast_to(x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        return x.expand(*shape)


def apply_op(op: str, xs: Sequence[torch.Tensor], params: Params,
             hold: torch.dtype | None = None) -> torch.Tensor:
    """Operator ``op`` in PyTorch: its op-table entry's ``torch``, or a graph-defined kernel
    run as a whole. ``hold``: the result is held in that dtype (a cast rounds to its own dtype,
    and its value goes on in ``hold``)."""
    spec = lookup(op)
    out = _customized(xs, params, hold) if spec.graph_defined else spec.torch(xs, params)
    return out if hold is None or out.dtype == hold else out.to(hold)


def accumulate(acc: str, x: torch.Tensor, iters: int, dimx: int) -> torch.Tensor:
    return accs.lookup_accumulator(acc).torch(x, iters, dimx)


def torch_function(g: KernelGraph, targets: Sequence[Tensor] | None = None,
                   hold: torch.dtype | None = None) -> Callable[..., list[torch.Tensor]]:
    """``fn(*inputs) -> [outputs]`` computing ``g`` with PyTorch operators, in the inputs' dtype
    (and the dtypes the program casts to).

    ``targets`` (default: the graph's outputs) are the tensors returned; only the operators they
    depend on run. ``hold``: every value is held in that dtype (``apply_op``): the program
    evaluated in float32 or float64 whatever its dtypes, its casts rounding.
    """
    outputs = [t.index for t in (g.outputs if targets is None else targets)]
    needed = set(outputs)
    for t in reversed(g.operators):
        if t.index in needed:
            needed.update(o.index for o in t.operands)
    steps = [(t.op, t.index, tuple(o.index for o in t.operands), dict(t.params))
             for t in g.operators if t.index in needed]
    inputs = [t.index for t in g.inputs]

    def fn(*xs: torch.Tensor) -> list[torch.Tensor]:
        if len(xs) != len(inputs):
            raise GraphError(f"program takes {len(inputs)} inputs, got {len(xs)}")
        vals: dict[int, torch.Tensor] = dict(zip(inputs, xs))
        for op, out, args, params in steps:
            vals[out] = apply_op(op, [vals[a] for a in args], params, hold)
        return [vals[i] for i in outputs]

    return fn


def evaluate(g: KernelGraph, inputs: Sequence[torch.Tensor],
             dtype: torch.dtype | None = torch.float32) -> list[torch.Tensor]:
    """Run ``g`` on ``inputs`` cast to ``dtype``, every value held in ``dtype`` (a cast of the
    program rounds); with None, in the inputs' dtypes and those the program casts to."""
    xs = [x if dtype is None else x.to(dtype) for x in inputs]
    with torch.no_grad():
        return torch_function(g, hold=dtype)(*xs)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """The larger of ‖out − ref‖ / ‖ref‖ and max|out − ref| / max|ref|, in float64; NaN or
    infinity anywhere gives ``inf``. The second catches a kernel that is wrong in a few blocks
    only, which barely moves the first (measured: Triton miscompiles with ‖·‖ errors of 6e-4
    and worst-element errors of 3e-2, where right fp16 kernels stay under 1.1e-3 in both)."""
    o, r = out.detach().to(torch.float64), ref.detach().to(torch.float64)
    if o.shape != r.shape:
        return math.inf
    if not bool(torch.isfinite(o).all()):
        return math.inf
    if o.numel() == 0:
        return 0.0
    diff = o - r
    return max(_ratio(float(torch.linalg.vector_norm(diff)), float(torch.linalg.vector_norm(r))),
               _ratio(float(diff.abs().max()), float(r.abs().max())))


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)
