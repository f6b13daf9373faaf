"""Padded tile shapes: every tile dimension gets a power-of-two block size for Triton.

Triton blocks have power-of-two sizes, and ``tl.dot`` needs at least 16 along M, N and K on the
GPU, so a tile of 2 × 16 that feeds a dot is held as a 16 × 16 block whose extra rows are masked
(see ``docs/lowering.md``). Dimensions that meet in an operator must be padded alike: a union-find
over (tile, dimension) pairs joins the dimensions each operator aligns (its op-table entry's
``triton.dims``, or the accumulator's rule) when their real sizes are equal; a dimension of size
1 that is broadcast against a larger one stays apart. Each class gets the next power of two of
its size, and at least 16 when a dot uses any of its members.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..mugraph.threadblock import BlockTensor, ThreadBlockGraph
from ..ops import lookup
from ..ops.spec import TileDims
from ..unionfind import UnionFind
from .accumulate import accumulator_emission, rescaled_dims, running_max_dims

#: tl.dot's smallest block size along M, N and K on the GPU
DOT_MIN = 16

Key = tuple[int, int]  # (tile index, dimension)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def tile_dims(t: BlockTensor, tb: ThreadBlockGraph) -> TileDims:
    """How tile ``t``'s dimensions relate to its operands' (loaders: no operands)."""
    if t.op == "input":
        return TileDims(out=tuple(() for _ in t.dims))
    if t.op in ("forloop_accum", "forloop_accum_rescale"):
        rel = accumulator_emission(t.params["acc"]).dims(len(t.dims))
        return rescaled_dims(rel) if len(t.operands) == 2 else rel
    if t.op == "forloop_max":
        return running_max_dims(len(t.dims))
    return lookup(t.op).triton.dims([o.dims for o in t.operands], t.params)


@dataclass
class Padding:
    """Padded block shape of every live tile."""

    padded: dict[int, tuple[int, ...]]

    def __getitem__(self, index: int) -> tuple[int, ...]:
        return self.padded[index]


def solve(tb: ThreadBlockGraph, live: Iterable[int]) -> Padding:
    """Padded shapes of the live tiles of ``tb``."""
    tiles = [tb.tensors[i] for i in sorted(live)]
    uf = UnionFind()
    dot_keys: list[Key] = []
    for t in tiles:
        rel = tile_dims(t, tb)
        for j, group in enumerate(rel.out):
            for o, d in group:
                src = t.operands[o]
                if src.dims[d] == t.dims[j]:  # else a size-1 dimension broadcast: kept apart
                    uf.union((src.index, d), (t.index, j))
        for group in rel.joined:
            first = group[0]
            for o, d in group[1:]:
                uf.union((t.operands[first[0]].index, first[1]), (t.operands[o].index, d))
        dot_keys += [(t.operands[o].index, d) for o, d in rel.dot]
    dotted = {uf.find(k) for k in dot_keys}
    padded: dict[int, tuple[int, ...]] = {}
    for t in tiles:
        dims = []
        for j, size in enumerate(t.dims):
            p = next_pow2(size)
            if uf.find((t.index, j)) in dotted:
                p = max(p, DOT_MIN)
            dims.append(p)
        padded[t.index] = tuple(dims)
    return Padding(padded)
