"""Kernel shapes: the grid, the for-loop and every loader's maps of one graph-defined kernel.

A kernel shape assigns up to three dimension classes to the grid axes (each cut into a number of
parts by the ``grid_parts`` strategy) and at most one class to the for-loop (``loop_parts``). Each
available tensor is then loaded with the maps that follow: a grid axis splits the tensor's
dimension of that class, or replicates it (-1); the loop walks the tensor's dimension of the loop
class, or loads the same tile every iteration (-1).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType
from ..errors import MapError
from ..mugraph import maps as pt
from ..mugraph.sizes import DEFAULT_CAPS
from .config import SearchConfig, grid_parts, loop_parts

Dims = tuple[int, ...]
#: the smallest tile the resize stage may give a cut dimension at a program's own sizes (its
#: caps' smallest, ``mugraph.sizes.DEFAULT_CAPS``)
SMALLEST_OWN_TILE = min(min(c.grid, c.loop) for c in DEFAULT_CAPS)


@dataclass(frozen=True)
class DTensor:
    """A tensor in device memory during the search."""

    ref: int  # position in the plan's tensor list
    dims: Dims
    dtype: DType
    cls: int | None  # e-class of its abstract expression
    dcls: tuple[Any, ...]  # dimension classes
    key: Any  # identity for deduplication: e-class, or a structural key without the oracle


@dataclass(frozen=True)
class Loader:
    tensor: DTensor
    imap: tuple[int, int, int]
    fdim: int
    tile: Dims
    tile_classes: tuple[Any, ...]


@dataclass(frozen=True)
class KernelShape:
    grid: tuple[int, int, int]
    axis_classes: tuple[Any, Any, Any]
    frange: int
    loop_class: Any
    loaders: tuple[Loader, ...]

    @property
    def blocks(self) -> int:
        return math.prod(self.grid)


def _class_sizes(tensors: Sequence[DTensor]) -> dict[Any, list[int]]:
    sizes: dict[Any, list[int]] = {}
    for t in tensors:
        for c, s in zip(t.dcls, t.dims):
            if c is not None:
                sizes.setdefault(c, []).append(s)
    return sizes


def _loader(t: DTensor, grid: tuple[int, int, int], axis_classes: Sequence[Any], frange: int,
            loop_class: Any, config: SearchConfig) -> Loader | None:
    imap = tuple(_axis_dim(t, c, g) for c, g in zip(axis_classes, grid))
    fdim = -1
    if loop_class is not None:
        if loop_class in t.dcls:
            fdim = t.dcls.index(loop_class)
        else:  # partial results of a split of the loop's class, one piece per iteration
            fdim = next((d for d, c in enumerate(t.dcls) if split_of(c) == (loop_class, frange)),
                        -1)
    if config.imaps is not None and imap not in config.imaps:
        return None
    if config.fmaps is not None and fdim not in config.fmaps:
        return None
    try:
        tile = pt.tile_dims("search", t.dims, grid, frange, imap, fdim)
    except MapError:
        return None
    classes = tuple(c if s > 1 else None for c, s in zip(t.dcls, tile))
    return Loader(t, imap, fdim, tile, classes)  # type: ignore[arg-type]


def _axis_dim(t: DTensor, cls: Any, count: int) -> int:
    """The dimension of ``t`` a grid axis that cuts ``cls`` into ``count`` parts splits, or -1.
    Besides a dimension of that class, an earlier kernel's result computed without the class
    may have been written once per part of a grid of the same cut (a per-piece sum of squares
    beside split partial products: ``plan.output_maps``, ``copy_of``): each block then reads
    its own copy. Partial results along a ``split_of`` dimension are not split by the grid:
    each block reads them all (a vocabulary's per-block sums)."""
    if cls is None:
        return -1
    if cls in t.dcls:
        return t.dcls.index(cls)
    return next((d for d, c in enumerate(t.dcls) if copy_of(c) == (cls, count)), -1)


class ShapeMemo:
    """``kernel_shapes`` remembered per *signature* of its tensors: each tensor's position,
    dims, dtype and dimension classes (all a shape depends on; not its e-class), and the grid
    of ``keep``. A two-kernel task asks for the last kernels' shapes over the tensors of every
    first kernel it makes, and most first kernels write tensors of a signature seen before:
    the shapes are then rebuilt over the new tensors from the remembered maps, the same shapes
    in the same order as ``kernel_shapes`` gives. One per process and payload (the search's
    ``Context``)."""

    def __init__(self, config: SearchConfig, growth: Mapping[Any, int] | None = None) -> None:
        self.config = config
        self.growth = dict(growth or {})
        self._known: dict[Any, list[tuple[Any, ...]]] = {}

    def shapes(self, tensors: Sequence[DTensor], keep: KernelShape | None = None
               ) -> list[KernelShape]:
        key = (tuple((t.ref, t.dims, t.dtype, t.dcls) for t in tensors),
               None if keep is None else (keep.grid, keep.axis_classes))
        known = self._known.get(key)
        if known is None:
            position = {id(t): i for i, t in enumerate(tensors)}
            made = list(kernel_shapes(tensors, self.config, keep, self.growth))
            self._known[key] = [
                (ks.grid, ks.axis_classes, ks.frange, ks.loop_class,
                 tuple((position[id(ld.tensor)], ld.imap, ld.fdim, ld.tile, ld.tile_classes)
                       for ld in ks.loaders)) for ks in made]
            return made
        return [KernelShape(grid, axes, frange, loop,
                            tuple(Loader(tensors[i], imap, fdim, tile, classes)
                                  for i, imap, fdim, tile, classes in loaders))
                for grid, axes, frange, loop, loaders in known]


def kernel_shapes(tensors: Sequence[DTensor], config: SearchConfig,
                  keep: KernelShape | None = None, growth: Mapping[Any, int] | None = None
                  ) -> Iterator[KernelShape]:
    """Every kernel shape over ``tensors``, best-first by the ``target_blocks`` heuristic.
    ``keep``: only the shapes of a kernel that combines the partial results of a kernel of shape
    ``keep``: each grid axis is ``keep``'s (same class, same count, same position) or 1, so
    the lowering can run it in ``keep``'s last block of each group (``lower.fuse``), and the
    loop, if any, walks the pieces. ``growth``: where the tensors are a scaled copy's, how
    many times as large each dimension class is at the program's own sizes; a shape whose
    inputs' tiles overflow shared memory there too (``own_tile_bytes``) is left out, since
    the resize stage could not fit it (``mugraph.sizes.retarget``)."""
    sizes = _class_sizes(tensors)
    shapes: list[tuple[float, int, KernelShape]] = []
    n = 0
    for grid, axis_classes in _grids(sizes, config, keep):
        if math.prod(grid) > config.max_blocks:
            continue
        if config.griddims is not None and grid not in config.griddims:
            continue
        cuts = {c: g for c, g in zip(axis_classes, grid) if c is not None}
        for loop_class, frange in _loops(sizes, cuts, config):
            if keep is not None and not _walks_pieces(loop_class, frange, sizes):
                continue
            # a tile over the shared-memory budget on its own can never be loaded:
            # the tensor is left out of this shape (a later kernel that reads only
            # the small partials of an earlier one still has a shape)
            loaders = [ld for t in tensors
                       if (ld := _loader(t, grid, axis_classes, frange, loop_class,
                                         config)) is not None
                       and math.prod(ld.tile) * t.dtype.itemsize <= config.smem_bytes]
            if not _uses_grid(grid, loaders) or not loaders:
                continue
            if frange > 1 and all(ld.fdim == -1 for ld in loaders):
                continue
            if sum(math.prod(ld.tile) * ld.tensor.dtype.itemsize
                   for ld in loaders) > config.smem_bytes:
                continue  # the inputs' tiles alone overflow shared memory
            if growth and sum(own_tile_bytes(ld, growth) for ld in loaders) > config.smem_bytes:
                continue  # ... and at the program's own sizes
            ks = KernelShape(grid, axis_classes, frange, loop_class,  # type: ignore
                             tuple(loaders))
            shapes.append((_score(ks, config), n, ks))
            n += 1
    shapes.sort(key=lambda s: (s[0], s[1]))
    per_structure: dict[Any, int] = {}
    for _, _, ks in shapes:
        key = structure(ks, config)
        if config.sizes_per_structure is not None:
            if per_structure.get(key, 0) >= config.sizes_per_structure:
                continue
        per_structure[key] = per_structure.get(key, 0) + 1
        yield ks


def own_tile_bytes(ld: Loader, growth: Mapping[Any, int]) -> int:
    """Bytes of the tile ``ld`` loads at the program's own sizes, about the least the resize
    stage can give it: a dimension that no grid axis or loop cuts is loaded whole, ``growth``
    times as large; one that is cut takes tiles of at most its tile here, and the resize stage
    chooses powers of two dividing the dimension, as small as ``SMALLEST_OWN_TILE``
    (``mugraph.sizes.Caps``; smaller where a piece of a split is not a multiple of it)."""
    n = ld.tensor.dtype.itemsize
    for c, dim, tile in zip(ld.tensor.dcls, ld.tensor.dims, ld.tile):
        own = dim * growth.get(c, 1) if dim > 1 else 1  # a broadcast 1 stays 1
        n *= own if tile == dim else min(tile, SMALLEST_OWN_TILE, own & -own)
    return n


def _grids(sizes: dict[Any, list[int]], config: SearchConfig, keep: KernelShape | None
           ) -> Iterator[tuple[tuple[int, int, int], tuple[Any, Any, Any]]]:
    """(grid, class per axis) choices: up to three classes, each cut by a ``grid_parts``
    count, on the first axes; with ``keep``, any subset of ``keep``'s axes where they are."""
    if keep is not None:
        axes = [a for a in range(3) if keep.grid[a] > 1 and keep.axis_classes[a] in sizes]
        for k in range(len(axes) + 1):
            for chosen in itertools.combinations(axes, k):
                yield (tuple(keep.grid[a] if a in chosen else 1 for a in range(3)),  # type: ignore
                       tuple(keep.axis_classes[a] if a in chosen else None for a in range(3)))
        return
    classes = sorted(sizes, key=repr)
    options = {c: grid_parts(config, sizes[c]) for c in classes}
    for k in range(0, 4):
        for chosen in itertools.combinations(classes, k):
            for parts in itertools.product(*(options[c] for c in chosen)):
                yield (tuple(list(parts) + [1] * (3 - k)),  # type: ignore[misc]
                       tuple(list(chosen) + [None] * (3 - k)))


def _walks_pieces(loop_class: Any, frange: int, sizes: dict[Any, list[int]]) -> bool:
    """Whether a loop (or none) walks the pieces of an earlier kernel's split: along the
    dimension the partial results were written side by side, or along the split class itself in
    as many steps as there are pieces."""
    if frange == 1 or split_of(loop_class) is not None:
        return True
    return any(split_of(c) == (loop_class, frange) for c in sizes)


def structure(ks: KernelShape, config: SearchConfig) -> tuple[Any, ...]:
    """What a kernel shape is apart from its sizes: the classes its grid axes cut (and whether
    each block keeps one index of the class, a tile, or one of a few large pieces:
    ``grid_splits``), the class its loop walks, and how each tensor is loaded. Shapes of one
    structure differ only in block and iteration counts, which the μGraph optimizer stage
    re-chooses for the found structure (``rank.size_variants``)."""
    sizes = {c: t for ld in ks.loaders for c, t in zip(ld.tensor.dcls, ld.tile) if c is not None}
    axes = tuple((c, g > 1, sizes.get(c, 0) == 1, g in config.grid_splits)
                 for g, c in zip(ks.grid, ks.axis_classes))
    loads = tuple((ld.tensor.ref, ld.imap, ld.fdim) for ld in ks.loaders)
    return axes, ks.loop_class if ks.frange > 1 else None, loads


def split_of(cls: Any) -> tuple[Any, int] | None:
    """(class, pieces) when ``cls`` is the dimension along which a kernel whose grid cut
    ``class`` into ``pieces`` wrote its partial results side by side (``plan.output_maps``)."""
    return _cut_by(cls, "split")


def copy_of(cls: Any) -> tuple[Any, int] | None:
    """(class, parts) when ``cls`` is the dimension along which a kernel whose grid cut
    ``class`` into ``parts`` wrote one identical copy of a result per part (``plan.output_maps``
    with ``copied``)."""
    return _cut_by(cls, "copy")


def _cut_by(cls: Any, kind: str) -> tuple[Any, int] | None:
    """(class, parts) of a ``(kind, axis classes, axis, grid)`` dimension class, else None."""
    if isinstance(cls, tuple) and len(cls) == 4 and cls[0] == kind:
        _, axis_classes, a, grid = cls
        return axis_classes[a], grid[a]
    return None


def can_finish(ks: KernelShape, out_classes: Sequence[Any]) -> bool:
    """Whether a kernel of this shape can write the program's output on its own.

    Every loaded tensor is cut along the classes of the grid and of the loop. A grid axis over a
    class the output lacks leaves each block a part of a reduction (partials a later kernel must
    combine); a loop over a class the output has leaves the epilogue only one iteration's share of
    that dimension. Neither kernel produces the output, so a final kernel needs neither.
    """
    if reduced_cuts(ks, out_classes):
        return False
    return ks.frange == 1 or ks.loop_class is None or ks.loop_class not in out_classes


def reduced_cuts(ks: KernelShape, out_classes: Sequence[Any]) -> list[tuple[int, Any]]:
    """(blocks, class) of each grid axis of ``ks`` that cuts a class the output lacks: its
    blocks each hold a part of a reduction."""
    return [(g, c) for g, c in zip(ks.grid, ks.axis_classes)
            if g > 1 and (c is None or c not in out_classes)]


def _score(ks: KernelShape, config: SearchConfig) -> float:
    """Heuristic order of kernel shapes: little re-reading of inputs across blocks and loop
    iterations, and a block count near ``target_blocks``."""
    traffic = sum(math.prod(ld.tile) * ks.blocks * (ks.frange if ld.fdim != -1 else 1)
                  for ld in ks.loaders)
    needed = sum(math.prod(ld.tensor.dims) for ld in ks.loaders)
    return math.log2(traffic / needed) + 0.5 * abs(math.log2(ks.blocks / config.target_blocks))


def _loops(sizes: dict[Any, list[int]], grid: dict[Any, int], config: SearchConfig
           ) -> Iterator[tuple[Any, int]]:
    if config.fmaps is None or -1 in config.fmaps:
        if config.franges is None or 1 in config.franges:
            yield None, 1
    pieces: dict[Any, set[int]] = {}
    for c in sizes:
        if (sp := split_of(c)) is not None:
            pieces.setdefault(sp[0], set()).add(sp[1])
    for c in sorted(sizes, key=repr):
        per_block = [s // grid.get(c, 1) for s in sizes[c] if s % grid.get(c, 1) == 0]
        if len(per_block) != len(sizes[c]):
            continue
        # a loop may also walk the pieces of an earlier kernel's split of this class
        extra = {p for p in pieces.get(c, ()) if c not in grid and all(s % p == 0 and s > p
                                                                      for s in per_block)
                 and (config.franges is None or p in config.franges)}
        for f in sorted(set(loop_parts(config, per_block)) | extra):
            yield c, f


def _uses_grid(grid: Sequence[int], loaders: Sequence[Loader]) -> bool:
    return all(g == 1 or any(ld.imap[a] != -1 for ld in loaders) for a, g in enumerate(grid))
