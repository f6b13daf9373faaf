"""Partition maps: how a block's tile is cut out of a device tensor, and how outputs are placed.

Conventions (see docs/mugraph.md):

- ``imap`` has one entry per grid axis (x, y, z): ``d >= 0`` splits the input's dimension ``d``
  evenly across that axis; ``-1`` replicates the dimension to every block.
- ``forloop_dim`` splits dimension ``d`` again across the for-loop's iterations (``-1``: the same
  tile every iteration). Grid and loop on the same dimension: the block owns a contiguous chunk
  and the loop walks through it.
- ``omap`` has one entry per grid axis: ``d >= 0`` concatenates the blocks along that axis in
  output dimension ``d``; ``-1`` is allowed only on an axis of size 1.

The vectorised layout used by the evaluators keeps every block and iteration at once: an input of
dims ``D`` becomes an array ``(gx|1, gy|1, gz|1, F|1, *tile)``; size-1 entries broadcast
(replication, loop-invariance).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import MapError

#: where a tile lives: in the loop, after it, or either (loaded once, the same every iteration)
LOOP_SIDE, EPILOGUE, INVARIANT = "loop", "epilogue", "invariant"

Dims = tuple[int, ...]
NUM_AXES = 3
#: leading axes of the vectorised layout: grid x, y, z and the loop iteration
LEAD = NUM_AXES + 1


def check_grid(grid_dim: Sequence[int], forloop_range: int) -> tuple[Dims, int]:
    grid = tuple(grid_dim)
    if len(grid) != NUM_AXES or not all(isinstance(g, int) and g >= 1 for g in grid):
        raise MapError(f"threadblock graph: grid_dim must be three positive integers, got {grid!r}")
    if not isinstance(forloop_range, int) or forloop_range < 1:
        raise MapError(f"threadblock graph: forloop_range must be >= 1, got {forloop_range!r}")
    return grid, forloop_range


def tile_dims(what: str, dims: Dims, grid: Dims, forloop_range: int, imap: Sequence[int],
              forloop_dim: int) -> Dims:
    """The tile a block loads per iteration; raises MapError when a partition does not divide."""
    imap = tuple(imap)
    if len(imap) != NUM_AXES:
        raise MapError(f"{what}: input_map needs one entry per grid axis (x, y, z), got {imap!r}")
    parts = [1] * len(dims)
    named: set[int] = set()
    for axis, d in enumerate(imap):
        if d == -1:
            continue
        if not isinstance(d, int) or not 0 <= d < len(dims):
            raise MapError(f"{what}: input_map {imap} names dimension {d}, "
                           f"but the input has dims {dims}")
        if d in named:  # even on an axis of one block: the map would be ambiguous
            raise MapError(f"{what}: input_map {imap} splits dimension {d} on two grid axes")
        named.add(d)
        parts[d] = grid[axis]
    if forloop_dim != -1:
        if not isinstance(forloop_dim, int) or not 0 <= forloop_dim < len(dims):
            raise MapError(f"{what}: forloop_dim {forloop_dim} is not a dimension of {dims}")
        parts[forloop_dim] *= forloop_range
    tile = []
    for d, (size, k) in enumerate(zip(dims, parts)):
        if size % k:
            raise MapError(f"{what}: dimension {d} of size {size} does not split into {k} parts "
                           f"(grid {grid}, input_map {imap}, forloop_dim {forloop_dim}, "
                           f"forloop_range {forloop_range})")
        tile.append(size // k)
    return tuple(tile)


def check_grid_use(grid: Dims, imaps: Sequence[Sequence[int]]) -> None:
    """Every grid axis larger than 1 must split at least one input."""
    for axis, g in enumerate(grid):
        if g > 1 and all(m[axis] == -1 for m in imaps):
            raise MapError(f"threadblock graph: grid axis {'xyz'[axis]} has {g} blocks but no "
                           "input_map splits anything across it")


def output_dims(what: str, tile: Dims, grid: Dims, omap: Sequence[int]) -> Dims:
    """Dims of a kernel output: the block tile, times the grid along mapped dimensions."""
    omap = tuple(omap)
    if len(omap) != NUM_AXES:
        raise MapError(f"{what}: output_map needs one entry per grid axis (x, y, z), got {omap!r}")
    out = list(tile)
    used: set[int] = set()
    for axis, d in enumerate(omap):
        if d == -1:
            if grid[axis] > 1:
                raise MapError(f"{what}: output_map {omap} leaves grid axis {'xyz'[axis]} "
                               f"({grid[axis]} blocks) unmapped; their results would collide")
            continue
        if not isinstance(d, int) or not 0 <= d < len(tile):
            raise MapError(f"{what}: output_map {omap} names dimension {d}, but the tile has "
                           f"dims {tile}")
        if d in used:
            raise MapError(f"{what}: output_map {omap} maps two grid axes onto dimension {d}")
        used.add(d)
        out[d] *= grid[axis]
    return tuple(out)


# --- vectorised layout ----------------------------------------------------------------------

def to_blocks(xp: Any, x: Any, grid: Dims, forloop_range: int, imap: Sequence[int],
              forloop_dim: int) -> Any:
    """Input array ``x`` -> ``(gx|1, gy|1, gz|1, F|1, *tile)`` (``xp`` is numpy or jax.numpy)."""
    dims = tuple(x.shape)
    mapped = {d: axis for axis, d in enumerate(imap) if d != -1}
    split: list[int] = []
    for d, size in enumerate(dims):
        g = grid[mapped[d]] if d in mapped else 1
        f = forloop_range if d == forloop_dim else 1
        split += [g, f, size // (g * f)]  # dim d -> (grid part, loop part, tile) at 3d..3d+2
    order = [3 * d for d in imap if d != -1]
    order += [3 * forloop_dim + 1] if forloop_dim != -1 else []
    order += [3 * d + 2 for d in range(len(dims))]
    # Only parts larger than 1 take part in the transpose (keeps it a plain, fusable permute).
    big = [p for p in range(3 * len(dims)) if split[p] > 1]
    y = xp.reshape(x, [split[p] for p in big])
    perm = [big.index(p) for p in order if split[p] > 1]
    if perm != sorted(perm):
        y = xp.transpose(y, perm)
    lead = [grid[a] if imap[a] != -1 else 1 for a in range(NUM_AXES)]
    lead.append(forloop_range if forloop_dim != -1 else 1)
    tile = [split[3 * d + 2] for d in range(len(dims))]
    return xp.reshape(y, tuple(lead + tile))


def from_blocks(xp: Any, y: Any, grid: Dims, omap: Sequence[int]) -> Any:
    """``(gx|1, gy|1, gz|1, 1, *tile)`` -> the device tensor laid out by ``omap``."""
    tile = tuple(y.shape[LEAD:])
    n = len(tile)
    y = xp.broadcast_to(y, tuple(grid) + (1,) + tile)
    y = xp.reshape(y, tuple(grid) + tile)
    # for each output dim d, the grid axis mapped onto it (if any) goes right before tile dim d
    perm: list[int] = []
    out_shape: list[int] = []
    for d in range(n):
        axes = [a for a in range(NUM_AXES) if omap[a] == d]
        perm += axes + [NUM_AXES + d]
        size = tile[d]
        for a in axes:
            size *= grid[a]
        out_shape.append(size)
    unmapped = [a for a in range(NUM_AXES) if omap[a] == -1]  # all of size 1
    y = xp.transpose(y, unmapped + perm)
    return xp.reshape(y, tuple(out_shape))
