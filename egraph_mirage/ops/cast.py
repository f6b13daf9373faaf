"""The op table's dtype conversion: ``cast(x, dtype=...)``, the first step of mixed precision.

A cast rounds every element to the target dtype (``"float16"``, ``"bfloat16"`` or
``"float32"``, the values of ``dtypes.DType``) and gives the result that dtype. What the
oracle and the verifier see of it is the identity: its abstract expression is the operand's
expression itself (no term constructor, no rule) and its finite-field semantics is the operand,
so a program that computes a norm in float32 between two casts is the same e-class as one that
computes it in its storage dtype, and every identity of the rest applies through the casts.

The float reference rounds as PyTorch does, through float32: float16 by numpy's float16,
bfloat16 by round-to-nearest-even on the float32 bits (``to_dtype``). The Triton lowering
computes in float32 inside a kernel, so a cast there rounds and stays float32 (``x.to(tl.float16)
.to(tl.float32)``); between kernels it is ``x.to(torch.float16)``.

The search never proposes a cast: it chooses only the parameters it has a strategy for (an
axis, the program's scalars and counts: ``search/blocks.py`` ``_params``, ``search/tasks.py``
``_library_moves``), and none chooses a dtype. A program's casts are absorbed: their expression
is the identity, a kernel computes in float32 whatever the storage dtype, and a found μGraph's
inputs and outputs keep the program's dtypes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import DTypeError
from . import shapes as sh
from .emit import aligned, torch_module
from .spec import BLOCK, KERNEL, THREAD, OpSpec, Params, Shape, TritonEmission

#: the dtype names a cast may target, in ``DType``'s order
DTYPE_NAMES: tuple[str, ...] = tuple(d.value for d in DType)


def target(op: str, p: Params) -> DType:
    """The target dtype of cast ``p``: its ``dtype`` parameter, one of ``DTYPE_NAMES``."""
    name = p.get("dtype")
    if not isinstance(name, str) or name not in DTYPE_NAMES:
        raise DTypeError(f"{op}: dtype must be one of {', '.join(DTYPE_NAMES)} (a name, "
                         f"e.g. em.float16.value), got {name!r}")
    return DType(name)


def _bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (round to nearest, ties to even, on the float32 bits:
    PyTorch's and Triton's rounding), as float32."""
    bits = x.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    rounded = bits.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, rounded)


def to_dtype(x: np.ndarray, dtype: DType) -> np.ndarray:
    """``x`` rounded to ``dtype`` through float32, as PyTorch's conversions round (their half
    and bfloat16 types convert from float), in the wider of ``x``'s type and float32."""
    x = np.asarray(x)
    with np.errstate(over="ignore"):  # beyond a type's range: infinity, as in PyTorch
        single = np.array(x, dtype=np.float32, order="C")
        if dtype is DType.float16:
            single = single.astype(np.float16).astype(np.float32)
        elif dtype is DType.bfloat16:
            single = _bfloat16(single)
    return single.astype(np.promote_types(x.dtype, np.float32))


def _shape(op: str, shapes: Sequence[Shape], p: Params) -> Shape:
    target(op, p)
    return sh.same_shape(op, shapes, p)


def _torch(xs: Sequence[Any], p: Params) -> Any:
    return xs[0].to(getattr(torch_module(), target("cast", p).value))


def _tile(args: Sequence[str], ctx: Any, p: Params) -> str:
    """Values in a kernel are float32: round to the target, and go on in float32."""
    dtype = target("cast", p)
    return args[0] if dtype is DType.float32 else \
        f"{args[0]}.to(tl.{dtype.value}).to(tl.float32)"


def _host(args: Sequence[str], shapes: Sequence[Shape], p: Params) -> str:
    return f"{args[0]}.to(torch.{target('cast', p).value})"


CAST = OpSpec(
    name="cast", num_inputs=(1, 1), params=("dtype",), shape=_shape,
    dtype=lambda op, dtypes, p: target(op, p),
    expr=lambda ts, shapes, p: ts[0],
    reference=lambda xs, p: to_dtype(xs[0], target("cast", p)),
    ff=lambda f, xs, p: xs[0],
    torch=_torch, terms=(), levels=frozenset({KERNEL, BLOCK, THREAD}), commutative=False,
    triton=TritonEmission(tile=_tile, host=_host, dims=aligned, keeps_zero=True),
    doc="convert to dtype (float16, bfloat16, float32): rounds; the identity to the oracle",
)

#: the conversion entries, after the table's earlier ones
CASTS: list[OpSpec] = [CAST]

__all__ = ["CAST", "CASTS", "DTYPE_NAMES", "target", "to_dtype"]
