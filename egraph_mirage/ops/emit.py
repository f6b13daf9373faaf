"""Helpers the op-table entries write their Triton emission (``TritonEmission``) with."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .spec import Params, Shape, TileDims, TritonEmission

#: 2 * sqrt(2 / pi): the tanh form of GELU is x * sigmoid(GELU_K * (x + 0.044715 x^3))
GELU_K = 2.0 * math.sqrt(2.0 / math.pi)
#: log2(e): the lowering writes exp(x) as exp2(x * LOG2E) (``triton_exp``)
LOG2E = 1.4426950408889634
#: 1 / sqrt(2): the erf form of GELU is 0.5 x (1 + erf(x / sqrt(2)))
SQRT1_2 = 0.7071067811865476


def triton_exp(x: str) -> str:
    """Triton for e**x of fp32 expression ``x``: ``tl.math.exp2(x * log2(e))``. Measured on an
    H200 with Triton 3.6 (``docs/lowering.md``, section 4), this is faster than ``tl.exp(x)`` where
    exponentials are much of a kernel's work (the attention kernels' inner loop: mqa at b = 16
    47.0 → 41.5 µs), with the same measured error."""
    arg = x if x.replace(".", "_").isidentifier() else f"({x})"
    return f"tl.math.exp2({arg} * {LOG2E!r})"


def aligned(shapes: Sequence[Shape], p: Params) -> TileDims:
    """Element-wise: every output dimension aligned with the same dimension of each operand."""
    rank = len(shapes[0])
    return TileDims(out=tuple(tuple((o, j) for o in range(len(shapes))) for j in range(rank)))


def elementwise(tile: str, host: str, keeps_zero: bool) -> TritonEmission:
    """An element-wise emission from format strings over ``{x}`` (unary) or ``{a}``, ``{b}``;
    ``{exp_x}`` is ``triton_exp`` of ``{x}``, ``{k}`` is ``GELU_K`` and ``{r}`` ``SQRT1_2``."""
    def fmt(text: str, args: Sequence[str]) -> str:
        return text.format(x=args[0], a=args[0], b=args[-1], k=repr(GELU_K), r=repr(SQRT1_2),
                           exp_x=triton_exp(args[0]))

    return TritonEmission(tile=lambda args, ctx, p: fmt(tile, args),
                          host=lambda args, shapes, p: fmt(host, args),
                          dims=aligned, keeps_zero=keeps_zero)


def torch_module() -> Any:
    """PyTorch, imported on first use (the package imports without it)."""
    import torch

    return torch
