"""What an op-table entry's Triton emission sees: its operands' shapes and helpers for padding.

Every tile is a Triton block of its padded shape (``padding``). Elements outside the real tile
(the padding) hold unspecified values unless the tile is known to be zero there (``zero_pad``:
masked loads, and operators whose emission keeps zeros). Anything that reduces over a padded
dimension (sums, rms, the contraction of ``tl.dot``) masks the padding to zero first; stores are
masked. Helpers here write that code; all shapes are constants of the generated kernel.

Tiles keep the dimensions of their block graph (``Val.real``, ``Val.padded``), but the code may
hold them at a lower rank: a ``BlockLayout`` leaves out leading dimensions that are 1 in every
tile of a kernel (a batch tile of one), so attention's (1, m, n) tiles are written as 2-D
blocks. Every helper here takes dimensions of the block graph and writes axes and shapes of the
code through the layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..dtypes import FP32_LOWEST, DType
from ..errors import LowerError
from ..ops import OPS

if TYPE_CHECKING:
    from ..mugraph.threadblock import BlockTensor

Dims = tuple[int, ...]
# the lowest finite fp32 as Triton source: the floor of every max (``TileContext.max``)
LOWEST = repr(FP32_LOWEST)

TL_DTYPE = {DType.float16: "tl.float16", DType.bfloat16: "tl.bfloat16",
            DType.float32: "tl.float32"}


@dataclass(frozen=True)
class Val:
    """A tile held in a variable of the generated kernel."""

    name: str
    real: Dims
    padded: Dims
    #: Triton dtype of the variable: the storage dtype for loaded tiles, else tl.float32
    dtype: str
    #: whether every padded element is 0
    zero_pad: bool

    @property
    def f32(self) -> str:
        return self.name if self.dtype == "tl.float32" else f"{self.name}.to(tl.float32)"


def fmt_shape(dims: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


@dataclass(frozen=True)
class BlockLayout:
    """How a kernel's tiles are held in its code: tiles of rank ``rank`` leave out dimensions
    ``dropped`` (each of block size 1 in every tile). The default leaves out nothing."""

    rank: int = 0
    dropped: tuple[int, ...] = ()

    def left_out(self, dim: int, rank: int) -> bool:
        """Whether dimension ``dim`` of a tile of ``rank`` dimensions is left out of the code."""
        return rank == self.rank and dim in self.dropped

    def kept(self, rank: int) -> int:
        """The code's rank for a tile of ``rank`` dimensions."""
        return rank - len(self.dropped) if rank == self.rank else rank

    def axis(self, dim: int, rank: int) -> int:
        """The code's axis for dimension ``dim`` of a tile of ``rank`` dimensions."""
        if rank != self.rank:
            return dim
        if self.left_out(dim, rank):
            raise LowerError(f"dimension {dim} of a rank-{rank} tile is left out of the code")
        return dim - sum(1 for d in self.dropped if d < dim)

    def dims(self, dims: Sequence[int]) -> list[int]:
        """The code's block dimensions for block-graph dimensions ``dims``."""
        return [n for d, n in enumerate(dims) if not self.left_out(d, len(dims))]

    def shape(self, dims: Sequence[int]) -> str:
        """``fmt_shape`` of the code's block for block-graph dimensions ``dims``."""
        return fmt_shape(self.dims(dims))


#: the layout that leaves out nothing
FULL = BlockLayout()


def squeezed(padded: Sequence[Dims]) -> BlockLayout:
    """The layout of a kernel whose live tiles have block shapes ``padded``: when all have one
    rank of at least 3, its leading (batch) dimensions of block size 1 in every tile are left
    out; the last two always stay (``tl.dot`` works on them)."""
    ranks = {len(p) for p in padded}
    if len(ranks) != 1:
        return FULL
    (rank,) = ranks
    dropped = tuple(d for d in range(rank - 2) if all(p[d] == 1 for p in padded))
    return BlockLayout(rank, dropped) if dropped else FULL


def arange(size: int, dim: int, rank: int, start: str = "", layout: BlockLayout = FULL) -> str:
    """``tl.arange(0, size)`` laid along dimension ``dim`` of a rank-``rank`` tile."""
    r = f"tl.arange(0, {size})"
    if start:
        r = f"({start} + {r})"
    at, code_rank = layout.axis(dim, rank), layout.kept(rank)
    if code_rank == 1:
        return r
    return r + "[" + ", ".join(":" if j == at else "None" for j in range(code_rank)) + "]"


def pad_mask(real: Dims, padded: Dims, dims: Sequence[int],
             layout: BlockLayout = FULL) -> str | None:
    """Boolean block, true on the real elements along ``dims`` (None if none is padded)."""
    parts = [f"({arange(padded[d], d, len(padded), '', layout)} < {real[d]})" for d in dims
             if padded[d] > real[d]]
    return " & ".join(parts) if parts else None


def broadcast(v: Val, padded: Dims, layout: BlockLayout = FULL) -> Val:
    """Grow size-1 block dimensions to ``padded`` (the real size stays as it is)."""
    if v.padded == padded:
        return v
    return replace(v, name=f"tl.broadcast_to({v.name}, {layout.shape(padded)})", padded=padded,
                   zero_pad=False)


def shrink(v: Val, dims: Sequence[int], layout: BlockLayout = FULL) -> Val:
    """Block dimensions of real size 1 but padded size > 1 brought down to 1 (element 0)."""
    text, padded, rank = v.f32, list(v.padded), len(v.padded)
    for d in dims:
        if v.real[d] == 1 and padded[d] > 1:
            first = f"{arange(padded[d], d, rank, '', layout)} == 0"
            text = (f"tl.sum(tl.where({first}, {text}, 0.0), axis={layout.axis(d, rank)}, "
                    "keep_dims=True)")
            padded[d] = 1
    if tuple(padded) == v.padded:
        return v
    return replace(v, name=text, padded=tuple(padded), dtype="tl.float32")


#: dots of at least this many rows may run on Hopper's asynchronous tensor-core instruction
#: (wgmma, whose operands Triton's pipeliner keeps in shared memory); fewer rows run on the
#: older mma instruction
WGMMA_ROWS = 64


def swaps(rows: int, cols: int) -> bool:
    """Whether the ``swap_dots`` knob writes a 2-D dot of ``rows`` x ``cols`` (code block) as
    ``(Bᵀ Aᵀ)ᵀ``: too few rows for wgmma, enough columns to be its rows once swapped."""
    return rows < WGMMA_ROWS <= cols


def swappable(t: BlockTensor) -> bool:
    """Whether ``swap_dots`` applies to block tensor ``t``: a dot of two rank-2 tiles that are
    both loads, with few rows and many columns (``swaps``). Limited to loaded operands of rank
    2 by measurement: on an H200 with Triton 3.6 the swapped attention kernels (rank-3 tiles,
    one operand computed) hit an illegal memory access."""
    return (t.op in OPS and bool(OPS[t.op].triton.dot_operands) and len(t.dims) == 2
            and all(o.op == "input" for o in t.operands) and swaps(*t.dims))


class TileContext:
    """The operands of one operator, the shape of its result, and code-writing helpers.
    ``swap_dots``: write 2-D dots that ``swaps`` as ``tl.trans(tl.dot(Bᵀ, Aᵀ))``."""

    def __init__(self, operands: Sequence[Val], out_real: Dims, out_padded: Dims,
                 bind: Callable[[str, str], str], dot_dtype: str, dot_precision: str,
                 layout: BlockLayout = FULL, swap_dots: bool = False) -> None:
        self.operands = list(operands)
        self.out_real, self.out_padded = out_real, out_padded
        self._bind = bind
        self.dot_dtype, self.dot_precision = dot_dtype, dot_precision
        self.layout = layout
        self.swap_dots = swap_dots

    # --- shapes -----------------------------------------------------------------------------
    def real(self, i: int) -> Dims:
        return self.operands[i].real

    def padded(self, i: int) -> Dims:
        return self.operands[i].padded

    def bind(self, expr: str, hint: str) -> str:
        """Emit ``name = expr`` before the operator's line; returns the name."""
        return self._bind(expr, hint)

    # --- padding ----------------------------------------------------------------------------
    def zero(self, text: str, i: int, dims: Sequence[int]) -> str:
        """``text`` (an expression of operand ``i`` that is 0 where the operand is 0) with
        operand ``i``'s padding along ``dims`` set to 0."""
        v = self.operands[i]
        mask = None if v.zero_pad else pad_mask(v.real, v.padded, dims, self.layout)
        return text if mask is None else f"tl.where({mask}, {text}, 0.0)"

    def sum(self, text: str, i: int, dims: Sequence[int]) -> str:
        """Sum of ``text`` (shaped like operand ``i``) over ``dims``, padding masked, dims kept
        (a sum over a dimension the layout leaves out, of size 1, is the tile itself)."""
        rank = len(self.operands[i].padded)
        dims = [d for d in dims if not self.layout.left_out(d, rank)]
        out = self.zero(text, i, dims)
        for d in dims:
            out = f"tl.sum({out}, axis={self.layout.axis(d, rank)}, keep_dims=True)"
        return out

    def max(self, text: str, i: int, dims: Sequence[int]) -> str:
        """Max of ``text`` (shaped like operand ``i``) over ``dims``, padding masked to -inf,
        and no lower than the lowest finite fp32 (``LOWEST``): a row of scores that a mask
        set all to -inf then has a finite max, so ``exp(s - max)`` is 0 there, not NaN
        (a piece of a split softmax whose keys are all masked adds nothing)."""
        v = self.operands[i]
        dims = [d for d in dims if not self.layout.left_out(d, len(v.padded))]
        mask = pad_mask(v.real, v.padded, dims, self.layout)
        out = text if mask is None else f"tl.where({mask}, {text}, float('-inf'))"
        for d in dims:
            out = f"tl.max({out}, axis={self.layout.axis(d, len(v.padded))}, keep_dims=True)"
        return f"tl.maximum({out}, {LOWEST})"

    # --- structural operators ---------------------------------------------------------------
    def dot(self, i: int, j: int) -> str:
        """``tl.dot`` of operands ``i`` @ ``j``, contraction padding masked, operands cast to
        the dot dtype, batch dimensions broadcast. Tiles of rank 2 and 3 are ``tl.dot``'s own;
        tiles of rank 4 and more (heads beside batches; several query heads sharing one key
        head) have their batch dimensions folded into one (``_folded_dot``). The code's ranks
        count (``layout``: a leading dimension of block size 1 in every tile is left out)."""
        a, b = self.operands[i], self.operands[j]
        r = len(a.padded)
        ca, cb = self.layout.dims(a.padded), self.layout.dims(b.padded)
        if len(ca) < 2 or len(cb) != len(ca):
            raise LowerError(f"tl.dot takes tiles of one rank of at least 2, got {a.real} @ "
                             f"{b.real}")
        texts = [self._dot_operand(a, r - 1), self._dot_operand(b, r - 2)]
        extra = ""
        if self.dot_dtype == "tl.float32":
            extra = f', input_precision="{self.dot_precision}"'
        if r > 3 and len(ca) > 2:
            return self._folded_dot(texts, ca, cb, extra)
        batched = len(ca) == 3
        if batched:  # the batch dimension broadcast
            for t, (cv, co) in enumerate(((ca, cb), (cb, ca))):
                if cv[0] < co[0]:
                    texts[t] = f"tl.broadcast_to({texts[t]}, {fmt_shape((co[0], *cv[1:]))})"
        m, k, n = ca[-2], ca[-1], cb[-1]
        if batched and ca[0] == 1 and cb[0] == 1:
            # a batch of one: a plain 2-D dot (Triton's batched dot is far slower on the GPU)
            product = (f"tl.dot(tl.reshape({texts[0]}, ({m}, {k})), "
                       f"tl.reshape({texts[1]}, ({k}, {n})){extra})")
            return f"tl.reshape({product}, (1, {m}, {n}))"
        if r == 2 and self.swap_dots and swaps(a.padded[0], b.padded[1]):
            return f"tl.trans(tl.dot(tl.trans({texts[1]}), tl.trans({texts[0]}){extra}))"
        return f"tl.dot({texts[0]}, {texts[1]}{extra})"

    def _dot_operand(self, v: Val, k: int) -> str:
        """Operand ``v`` of a dot, its padding along the contraction dimension ``k`` masked to
        0, cast to the dot dtype."""
        mask = None if v.zero_pad else pad_mask(v.real, v.padded, [k], self.layout)
        text = v.name if mask is None else f"tl.where({mask}, {v.name}, 0.0)"
        return text if v.dtype == self.dot_dtype else f"{text}.to({self.dot_dtype})"

    def _folded_dot(self, texts: list[str], ca: Sequence[int], cb: Sequence[int],
                    extra: str) -> str:
        """The dot of code tiles of rank 4 and more: their batch dimensions broadcast to one
        shape and folded into one (a 3-D ``tl.dot``; where one right operand serves every
        batch, a 2-D dot of all the left operand's rows), the product unfolded again."""
        m, k, n = ca[-2], ca[-1], cb[-1]
        batch = tuple(max(x, y) for x, y in zip(ca[:-2], cb[:-2]))
        count = math.prod(batch)
        left = (texts[0] if tuple(ca[:-2]) == batch
                else f"tl.broadcast_to({texts[0]}, {fmt_shape((*batch, m, k))})")
        if math.prod(cb[:-2]) == 1:  # one right operand for every batch: fold into the rows
            product = (f"tl.dot(tl.reshape({left}, ({count * m}, {k})), "
                       f"tl.reshape({texts[1]}, ({k}, {n})){extra})")
        else:
            right = (texts[1] if tuple(cb[:-2]) == batch
                     else f"tl.broadcast_to({texts[1]}, {fmt_shape((*batch, k, n))})")
            product = (f"tl.dot(tl.reshape({left}, ({count}, {m}, {k})), "
                       f"tl.reshape({right}, ({count}, {k}, {n})){extra})")
        return f"tl.reshape({product}, {fmt_shape((*batch, m, n))})"

    def concat(self, a: str, b: str, dim: int) -> str:
        """Operands ``a`` and ``b`` joined along ``dim``: two halves of one size without padding
        are interleaved as a new axis (``tl.join``) moved before ``dim`` and merged into it;
        otherwise each element is gathered from its operand (``tl.gather``, which some Triton
        versions fail to compile for the GPU in some layouts)."""
        pa, pb = self.padded(0), self.padded(1)
        ra = self.real(0)[dim]
        out, lay = self.out_padded, self.layout
        rank = len(out)
        texts = []
        for text, p in ((a, pa), (b, pb)):  # non-joined dims broadcast to the result's
            want = tuple(p[d] if d == dim else out[d] for d in range(rank))
            texts.append(text if want == p else f"tl.broadcast_to({text}, {lay.shape(want)})")
        if ra == pa[dim] == pb[dim] == self.real(1)[dim] and out[dim] == 2 * ra:
            at, kept = lay.axis(dim, rank), len(lay.dims(out))
            perm = (*range(at), kept, *range(at, kept))  # the join's new last axis before ``at``
            joined = f"tl.join({texts[0]}, {texts[1]})"
            return f"tl.reshape(tl.permute({joined}, {perm}), {lay.shape(out)})"
        pos = arange(out[dim], dim, rank, "", lay)
        ia = self.bind(f"tl.broadcast_to(tl.minimum({pos}, {pa[dim] - 1}), {lay.shape(out)})",
                       "ia")
        ib = self.bind(f"tl.broadcast_to(tl.minimum(tl.maximum({pos} - {ra}, 0), "
                       f"{pb[dim] - 1}), {lay.shape(out)})", "ib")
        at = lay.axis(dim, rank)
        return (f"tl.where({pos} < {ra}, tl.gather({texts[0]}, {ia}, {at}), "
                f"tl.gather({texts[1]}, {ib}, {at}))")

    def half(self, a: str, start: int, stop: int) -> str:
        """Operand ``a``'s first or second half along its last dimension (``start:stop`` of a
        tile that holds the whole dimension, unpadded): the dimension split into (2, half), the
        2 moved last and taken apart (``tl.split``). Raises ``LowerError`` for another range."""
        real, padded = self.real(0), self.padded(0)
        n, lay = real[-1], self.layout
        rank = len(real)
        if padded[-1] != n or n % 2 or (start, stop) not in ((0, n // 2), (n // 2, n)):
            raise LowerError(f"slice_last: [{start}:{stop}] of a tile of {n} (padded to "
                             f"{padded[-1]}): only a half of an unpadded last dimension is "
                             "sliced in a thread block")
        at, kept = lay.axis(rank - 1, rank), len(lay.dims(padded))
        split = [*lay.dims(padded)[:-1], 2, n // 2]
        perm = (*range(at), kept, at)  # (…, 2, half) -> (…, half, 2)
        halves = f"tl.split(tl.permute(tl.reshape({a}, {fmt_shape(split)}), {perm}))"
        return f"{halves}[{0 if start == 0 else 1}]"

    def fold(self, x: str, i: int, dimx: int) -> str:
        """``out[..., j] = sum_k x[..., k * dimx + j]`` (the sum_todimx step)."""
        v, lay = self.operands[i], self.layout
        rank, last = len(v.padded), len(v.padded) - 1
        p, width = v.padded[last], self.out_padded[last]
        x = self.zero(x, i, [last])
        if width == dimx and p % dimx == 0:  # a reshape into (..., p / dimx, dimx) and a sum
            shape = fmt_shape((*lay.dims(v.padded)[:-1], p // dimx, dimx))
            return f"tl.sum(tl.reshape({x}, {shape}), axis={lay.axis(last, rank)})"
        xs = x if x.isidentifier() else self.bind(x, "fold")
        shape = lay.shape((*v.padded[:last], width))
        terms = []
        for k in range(v.real[last] // dimx):
            idx = f"tl.minimum({arange(width, last, rank, str(k * dimx), lay)}, {p - 1})"
            terms.append(f"tl.gather({xs}, tl.broadcast_to({idx}, {shape}), "
                         f"{lay.axis(last, rank)})")
        total = " + ".join(terms)
        if width == dimx:
            return total
        return f"tl.where({arange(width, last, rank, '', lay)} < {dimx}, {total}, 0.0)"
