"""Plans: what the search found, as plain data, and how a plan becomes a μGraph.

A plan is the list of steps after the program's inputs: graph-defined kernels (a kernel shape, the
tiles of its block graph, its outputs with their output maps) and library operators. ``build``
replays a plan through the public builder API, so every result is a μGraph like a hand-written
one (validated, serialisable, drawable, lowerable).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import MapError
from ..graph import KernelGraph, Tensor, new_kernel_graph
from ..mugraph import maps as pt
from ..mugraph import new_threadblock_graph
from .blocks import loads_read, used_tiles
from .tile import Tile
from .tiling import DTensor, KernelShape


@dataclass(frozen=True)
class KernelStep:
    shape: KernelShape
    tiles: tuple[Tile, ...]
    outputs: tuple[tuple[int, tuple[int, int, int]], ...]  # (tile, output map)
    dimx: int
    block_dim: tuple[int, int, int]
    smem_bytes: int


@dataclass(frozen=True)
class OpStep:
    op: str
    args: tuple[int, ...]  # tensor refs
    params: tuple[tuple[str, Any], ...]


Step = KernelStep | OpStep


def output_maps(tile: Tile, shape: KernelShape, config_omaps: Sequence[tuple[int, ...]] | None,
                copied: frozenset[Any] = frozenset()
                ) -> Iterator[tuple[tuple[int, int, int], tuple[int, ...], tuple[Any, ...]]]:
    """Output maps for a sink tile: (omap, output dims, output dimension classes).

    A grid axis that split a class the tile still has writes along that dimension; an axis that
    split a class the tile no longer has (a split reduction) concatenates its partial results
    along any other dimension, which then gets a class of its own (``("split", ...)``: a later
    kernel sums the pieces). An axis that leaves each block one index of its class (a tile of
    1, whose class the tile no longer names) writes along a dimension of size 1, which gets
    that class back. An axis over a class in ``copied`` (one the tile was computed without:
    the per-piece sums of squares of X, beside X @ W's column blocks) writes one identical copy
    per block, along a dimension of class ``("copy", ...)``: a later kernel's block reads its
    own copy (``tiling._axis_dim``).
    """
    unit = {c for ld in shape.loaders for c, t in zip(ld.tensor.dcls, ld.tile)
            if t == 1 and c is not None}
    forced: dict[int, int] = {}
    free: list[int] = []
    for a, g in enumerate(shape.grid):
        if g == 1:
            continue
        c = shape.axis_classes[a]
        if c is not None and c in tile.dcls:
            forced[a] = tile.dcls.index(c)
        else:
            free.append(a)
    rest = [d for d in range(len(tile.dims)) if d not in forced.values()]
    for chosen in itertools.permutations(rest, len(free)):
        omap = [-1, -1, -1]
        for a, d in forced.items():
            omap[a] = d
        for a, d in zip(free, chosen):
            omap[a] = d
        if config_omaps is not None and tuple(omap) not in config_omaps:
            continue
        try:
            dims = pt.output_dims("search", tile.dims, shape.grid, omap)
        except MapError:
            continue
        dcls = list(tile.dcls)
        for a, d in zip(free, chosen):
            c = shape.axis_classes[a]
            dcls[d] = (c if c in unit and tile.dims[d] == 1 else
                       ("copy" if c in copied else "split", tuple(shape.axis_classes), a,
                        shape.grid))
        yield tuple(omap), tuple(dims), tuple(dcls)  # type: ignore[misc]


def uses_whole_shape(step: KernelStep) -> bool:
    """Whether the loaders the outputs depend on split every grid axis of more than one block
    (and walk the loop, if there is one). Otherwise the blocks along that axis (or the loop's
    iterations) repeat one computation: not a valid kernel, and the same block graph on a
    smaller grid is searched anyway."""
    used = [step.shape.loaders[p]
            for p in loads_read(step.tiles, [o for o, _ in step.outputs])]
    if any(g > 1 and all(ld.imap[a] == -1 for ld in used)
           for a, g in enumerate(step.shape.grid)):
        return False
    return step.shape.frange == 1 or any(ld.fdim != -1 for ld in used)


def build(target: KernelGraph, steps: Sequence[Step], outputs: Sequence[int]) -> KernelGraph:
    """The μGraph of a plan: ``outputs`` are tensor refs (inputs first, then step results).
    Its inputs and outputs have the target's dtypes: an output of another dtype (a kernel
    writes its inputs' dtype; a program may cast its result) is cast to the target's."""
    h = new_kernel_graph()
    tensors: list[Tensor] = [h.new_input(t.dims, t.dtype) for t in target.inputs]
    for step in steps:
        if isinstance(step, OpStep):
            tensors.append(h.apply(step.op, [tensors[i] for i in step.args], **dict(step.params)))
            continue
        tensors.extend(_build_kernel(h, tensors, step))
    for r, want in zip(outputs, target.outputs, strict=True):
        out = tensors[r]
        h.mark_output(out if out.dtype is want.dtype else h.cast(out, want.dtype))
    return h


def _build_kernel(h: KernelGraph, tensors: list[Tensor], step: KernelStep) -> list[Tensor]:
    shape = step.shape
    tb = new_threadblock_graph(grid_dim=shape.grid, block_dim=step.block_dim,
                               forloop_range=shape.frange, reduction_dimx=step.dimx,
                               smem_bytes=step.smem_bytes)
    built: dict[int, Any] = {}
    sources: list[Tensor] = []
    for i in used_tiles(step.tiles, [o for o, _ in step.outputs]):
        t = step.tiles[i]
        params = dict(t.params)
        if t.op == "input":
            ld = shape.loaders[params["position"]]
            built[i] = tb.new_input(tensors[ld.tensor.ref], ld.imap, forloop_dim=ld.fdim)
            sources.append(tensors[ld.tensor.ref])
        elif t.op == "accum":
            acc = None if params["acc"] == "plain" else params["acc"]
            rescale = built[t.args[1]] if params.get("rescale") else None
            built[i] = tb.forloop_accum(built[t.args[0]], acc, rescale=rescale)
        elif t.op == "max":
            built[i] = tb.forloop_max(built[t.args[0]])
        else:
            built[i] = tb.apply(t.op, [built[a] for a in t.args], **params)
    for i, omap in step.outputs:
        tb.new_output(built[i], omap)
    return h.customized(sources, tb)


def new_tensors(step: KernelStep, first_ref: int, dcls: Sequence[tuple[Any, ...]],
                dims: Sequence[tuple[int, ...]]) -> list[DTensor]:
    """The device tensors a kernel step writes."""
    out = []
    for k, ((i, _), d, c) in enumerate(zip(step.outputs, dims, dcls)):
        t = step.tiles[i]
        ld = step.shape.loaders[0]
        key = (t.key, d) if t.cls is None else t.cls
        out.append(DTensor(first_ref + k, tuple(d), ld.tensor.dtype, t.cls, tuple(c), key))
    return out
