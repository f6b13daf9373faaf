"""Kernel graphs as PyTorch functions: one table entry per operator, one per accumulator.

``torch_function(g)`` walks ``g`` once and returns ``fn(*inputs) -> list of outputs`` that calls
``TORCH_OPS[op]`` for every operator, in the inputs' dtype and on their device. It is the PyTorch
eager baseline, what ``torch.compile`` compiles, and (upcast to float32) the reference that tuned
kernels are checked against. Graph-defined kernels (``customized``) run through the kernel's own
vectorised evaluator with the torch entries below, so a μGraph evaluates too; online softmax's
running max and rescaled accumulators (``running_max``, ``rescale``) give the per-block
interpreter's results (``em.run_reference``), infinities and NaNs included.

Like the op table, nothing here switches on operator names: add an operator to ``OPS`` and one
entry to ``TORCH_OPS`` (a test fails until both exist).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import GraphError
from ..graph import KernelGraph, Tensor
from ..mugraph.accumulators import LOOP
from ..ops import shapes as sh

Params = dict[str, Any]
TorchOp = Callable[[Sequence[torch.Tensor], Params], torch.Tensor]
TorchAcc = Callable[[torch.Tensor, int, int], torch.Tensor]


def _rms_norm(xs: Sequence[torch.Tensor], p: Params) -> torch.Tensor:
    x = xs[0]
    n = sh.normalized_size("rms_norm", tuple(x.shape), p["normalized_shape"])
    trailing = sh._trailing_count(tuple(x.shape), n)
    y = F.rms_norm(x, tuple(x.shape[x.ndim - trailing:]), eps=0.0)  # the reference has no eps
    return y * xs[1] if len(xs) == 2 else y


def _gelu(xs: Sequence[torch.Tensor], p: Params) -> torch.Tensor:
    return F.gelu(xs[0], approximate="tanh")  # the op table's GELU is the tanh form


def _concat(xs: Sequence[torch.Tensor], p: Params) -> torch.Tensor:
    a, b = xs  # operands may differ in size-1 dimensions other than the joined one
    d = p["dim"] % a.ndim
    other = torch.broadcast_shapes(a.shape[:d] + (1,) + a.shape[d + 1:],
                                   b.shape[:d] + (1,) + b.shape[d + 1:])
    a = a.expand(*other[:d], a.shape[d], *other[d + 1:])
    b = b.expand(*other[:d], b.shape[d], *other[d + 1:])
    return torch.cat((a, b), dim=d)


def running_max(x: torch.Tensor) -> torch.Tensor:
    """``forloop_max`` on the vectorised layout: the row max, then the maximum over the
    iterations so far (``mugraph.accumulators.running_max_ref``; NaN propagates)."""
    return torch.cummax(torch.amax(x, dim=-1, keepdim=True), dim=LOOP).values


def rescale(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The terms ``x_i * w_i`` of ``forloop_accum_rescale`` (``m`` with every iteration on the
    loop axis): ``w_i = exp(m_i - m_last)``, 1 for the last iteration, NaN where a later factor
    ``exp(m_(j-1) - m_j)`` is NaN, so that the sum is the per-block recurrence's total
    (``mugraph.accumulators.rescale_ref``)."""
    last = m.shape[LOOP] - 1
    w = torch.exp(m - m.narrow(LOOP, last, 1))
    bad = torch.isnan(torch.diff(m, dim=LOOP)).to(torch.int32)  # factor j = 1 .. F-1 at j - 1
    later = torch.flip(torch.cumsum(torch.flip(bad, [LOOP]), dim=LOOP), [LOOP]) > 0
    head = w.narrow(LOOP, 0, last).masked_fill(later, math.nan)
    return x * torch.cat([head, torch.ones_like(w.narrow(LOOP, last, 1))], dim=LOOP)


def _customized(xs: Sequence[torch.Tensor], p: Params) -> torch.Tensor:
    return p["kernel"].run_vectorised(list(xs), xp=TorchArrays, apply_op=apply_op,
                                      accumulate=accumulate, running_max=running_max,
                                      rescale=rescale)[p["output"]]


#: operator name -> PyTorch semantics (the same as the op table's float ``reference``)
TORCH_OPS: dict[str, TorchOp] = {
    "matmul": lambda xs, p: torch.matmul(xs[0], xs[1]),
    "add": lambda xs, p: xs[0] + xs[1],
    "mul": lambda xs, p: xs[0] * xs[1],
    "div": lambda xs, p: xs[0] / xs[1],
    "exp": lambda xs, p: torch.exp(xs[0]),
    "sqrt": lambda xs, p: torch.sqrt(xs[0]),
    "square": lambda xs, p: xs[0] * xs[0],
    "silu": lambda xs, p: F.silu(xs[0]),
    "gelu": _gelu,
    "relu": lambda xs, p: torch.relu(xs[0]),
    "mul_scalar": lambda xs, p: xs[0] * float(p["scalar"]),
    "reduction": lambda xs, p: torch.sum(xs[0], dim=p["dim"], keepdim=True),
    "rms_norm": _rms_norm,
    "concat": _concat,
    "customized": _customized,
}


def _loop(x: torch.Tensor, iters: int) -> torch.Tensor:
    """A loop-invariant tile (size 1 on the loop axis) is accumulated ``iters`` times."""
    shape = list(x.shape)
    shape[LOOP] = iters
    return x.expand(shape)


def _sum(x: torch.Tensor, n: int, dimx: int) -> torch.Tensor:
    return torch.sum(_loop(x, n), dim=(LOOP, -1), keepdim=True)


def _todimx(x: torch.Tensor, n: int, dimx: int) -> torch.Tensor:
    y = _loop(x, n)
    y = y.reshape(*y.shape[:-1], y.shape[-1] // dimx, dimx).sum(dim=-2)
    return torch.sum(y, dim=LOOP, keepdim=True)


#: for-loop accumulator name -> PyTorch semantics on the vectorised layout (gx, gy, gz, F, *tile)
TORCH_ACCUMULATORS: dict[str, TorchAcc] = {
    "plain": lambda x, n, dimx: torch.sum(_loop(x, n), dim=LOOP, keepdim=True),
    "sum": _sum,
    "mean": lambda x, n, dimx: _sum(x, n, dimx) / (n * x.shape[-1]),
    "rms": lambda x, n, dimx: torch.sqrt(_sum(x * x, n, dimx) / (n * x.shape[-1])),
    "sum_todimx": _todimx,
}


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


def apply_op(op: str, xs: Sequence[torch.Tensor], params: Params) -> torch.Tensor:
    if op not in TORCH_OPS:
        raise GraphError(f"no PyTorch entry for operator {op!r}; add one to gpu.torch_eval")
    return TORCH_OPS[op](xs, params)


def accumulate(acc: str, x: torch.Tensor, iters: int, dimx: int) -> torch.Tensor:
    if acc not in TORCH_ACCUMULATORS:
        raise GraphError(f"no PyTorch entry for accumulator {acc!r}; add one to gpu.torch_eval")
    return TORCH_ACCUMULATORS[acc](x, iters, dimx)


def torch_function(g: KernelGraph, targets: Sequence[Tensor] | None = None
                   ) -> Callable[..., list[torch.Tensor]]:
    """``fn(*inputs) -> [outputs]`` computing ``g`` with PyTorch operators, in the inputs' dtype.

    ``targets`` (default: the graph's outputs) are the tensors returned; only the operators they
    depend on run.
    """
    outputs = [t.index for t in (g.outputs if targets is None else targets)]
    needed = set(outputs)
    for t in reversed(g.operators):
        if t.index in needed:
            needed.update(o.index for o in t.operands)
    steps = [(TORCH_OPS[t.op] if t.op in TORCH_OPS else _missing(t.op), t.index,
              tuple(o.index for o in t.operands), dict(t.params))
             for t in g.operators if t.index in needed]
    inputs = [t.index for t in g.inputs]

    def fn(*xs: torch.Tensor) -> list[torch.Tensor]:
        if len(xs) != len(inputs):
            raise GraphError(f"program takes {len(inputs)} inputs, got {len(xs)}")
        vals: dict[int, torch.Tensor] = dict(zip(inputs, xs))
        for op_fn, out, args, params in steps:
            vals[out] = op_fn([vals[a] for a in args], params)
        return [vals[i] for i in outputs]

    return fn


def _missing(op: str | None) -> TorchOp:
    raise GraphError(f"no PyTorch entry for operator {op!r}; add one to gpu.torch_eval")


def evaluate(g: KernelGraph, inputs: Sequence[torch.Tensor],
             dtype: torch.dtype | None = torch.float32) -> list[torch.Tensor]:
    """Run ``g`` on ``inputs`` (cast to ``dtype`` first unless it is None)."""
    xs = [x if dtype is None else x.to(dtype) for x in inputs]
    with torch.no_grad():
        return torch_function(g)(*xs)


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
