"""Search configuration: the knobs users of the original system know, with defaults from shapes.

Nothing here knows a model. Grid dimensions, input maps, for-loop dimensions and ranges all
follow from the *dimension classes* of the program (``dims.py``) through two named strategies:

- ``grid_parts``: a grid axis splits one dimension class into ``p`` parts, where each block keeps
  a tile of ``grid_tiles`` elements (1 only for dimensions of at most ``unit_tile_max``), or the
  dimension is cut into a few large pieces (``grid_splits``: split-K / split-KV forms, whose
  partial results a later kernel combines).
- ``loop_parts``: the for-loop walks one class (after the grid's split) in tiles of ``loop_tiles``.

Explicit lists (``griddims``, ``imaps``, ``fmaps``, ``franges``, ``omaps``) restrict the derived
candidates to the given values, as in the original's configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import EMError

#: the most operators in one block graph where ``SearchConfig.max_block_ops`` is None: the
#: program's own count, one more for a program that reduces (its one-kernel form that loops
#: accumulates what it reduces: a ``forloop_accum`` beside the matmul), no fewer than the first
#: (a program's one-kernel form may hold more operators than the program, an accumulator
#: beside each reduction) and no more than the second (deeper block graphs are more than a
#: search's budget enumerates)
BLOCK_OPS = (8, 12)


class SearchError(EMError):
    """A search that cannot run: bad configuration, foreign checkpoint, bad input program."""


@dataclass(frozen=True)
class SearchConfig:
    """What the search may build. Defaults are derived from shapes; lists restrict them."""

    #: tile sizes a grid axis may leave to each block along the dimension it splits
    grid_tiles: tuple[int, ...] = (1, 16, 64)
    #: tile size 1 (one index per block) only along dimensions at most this long
    unit_tile_max: int = 64
    #: numbers of large pieces a grid axis may cut a dimension into
    grid_splits: tuple[int, ...] = (4, 8)
    #: tile sizes the for-loop may walk a dimension in
    loop_tiles: tuple[int, ...] = (16, 64)
    #: kernel shapes searched per structure (grid classes, loop class, loads), the best by the
    #: shape heuristic first; the μGraph optimizer stage (``rank.size_variants``) re-sizes what is
    #: found.
    #: None: every size
    sizes_per_structure: int | None = 1
    #: most blocks in one grid
    max_blocks: int = 16384
    #: the search ranks grids by how close their block count is to this (about the GPU's SMs)
    target_blocks: int = 128
    #: explicit grid dims (x, y, z) to allow; None: all derived ones
    griddims: tuple[tuple[int, int, int], ...] | None = None
    #: explicit input maps to allow; None: all derived ones
    imaps: tuple[tuple[int, int, int], ...] | None = None
    #: explicit output maps to allow; None: all derived ones
    omaps: tuple[tuple[int, int, int], ...] | None = None
    #: explicit for-loop dimensions to allow (-1: none); None: all derived ones
    fmaps: tuple[int, ...] | None = None
    #: explicit for-loop ranges to allow; None: all derived ones
    franges: tuple[int, ...] | None = None
    #: threads per block (recorded in the μGraph; the lowering may tune it)
    blockdims: tuple[int, int, int] = (128, 1, 1)
    #: most library operators at kernel level (concat, reductions, ...)
    max_kernel_ops: int = 1
    #: most operators in one block graph (loaders not counted, accumulators counted); None:
    #: as many as the program has, within ``BLOCK_OPS`` (``block_ops``)
    max_block_ops: int | None = None
    #: most graph-defined kernels in one program
    max_kernels: int = 2
    #: most outputs of one block graph
    max_block_outputs: int = 2
    #: shared memory a block may use, bytes
    smem_bytes: int = 96 * 1024
    #: stop after this many verified results (None: search the whole space)
    max_results: int | None = None
    #: finite-field tests per candidate
    verify_tests: int = 2
    #: largest relative float error a result may show against the input program
    numeric_tolerance: float = 1e-6
    #: prune with the e-graph (switch off only to measure what pruning buys)
    use_oracle: bool = True
    #: scalars mul_scalar may use besides those in the program
    scalars: tuple[float, ...] = field(default=())

    def block_ops(self, program_ops: int, reduces: bool = False) -> int:
        """The most operators in one block graph for a program of ``program_ops`` operators
        (``reduces``: among them a matmul or a reduction): ``max_block_ops``, or where it is
        None the program's count, one more where it reduces, within ``BLOCK_OPS`` (a one-kernel
        form of a program holds at least each of its operators once, and a form that loops
        over what it reduces an accumulator beside it: a projection with RoPE's rotation,
        8 operators, is one kernel of 9)."""
        if self.max_block_ops is not None:
            return self.max_block_ops
        least, most = BLOCK_OPS
        return min(max(least, program_ops + reduces), most)

    def __post_init__(self) -> None:
        for name in ("grid_tiles", "grid_splits", "loop_tiles"):
            vals = getattr(self, name)
            if not all(isinstance(v, int) and v >= 1 for v in vals):
                raise SearchError(f"SearchConfig.{name} must be positive integers, got {vals!r}")
        for name in ("max_kernel_ops", "max_block_ops", "max_kernels", "max_block_outputs",
                     "max_blocks", "smem_bytes", "verify_tests"):
            v = getattr(self, name)
            if v is None and name == "max_block_ops":
                continue
            if not isinstance(v, int) or v < (0 if name == "max_kernel_ops" else 1):
                raise SearchError(f"SearchConfig.{name} must be a positive integer, got {v!r}")
        n = self.sizes_per_structure
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise SearchError(f"SearchConfig.sizes_per_structure must be a positive integer or "
                              f"None, got {n!r}")
        m = self.max_results
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise SearchError(f"SearchConfig.max_results must be a positive integer or None, "
                              f"got {m!r}")
        tol = self.numeric_tolerance
        if (not isinstance(tol, (int, float)) or isinstance(tol, bool) or math.isnan(tol)
                or tol < 0):
            raise SearchError(f"SearchConfig.numeric_tolerance must be a number >= 0, got "
                              f"{tol!r}")


def grid_parts(config: SearchConfig, sizes: Sequence[int]) -> list[int]:
    """Strategy ``grid_parts``: how many blocks a grid axis may cut a class of these sizes into."""
    big = max(sizes)
    out = set()
    for t in config.grid_tiles:
        if big % t == 0 and big // t > 1 and (t > 1 or big <= config.unit_tile_max):
            out.add(big // t)
    out.update(p for p in config.grid_splits if big % p == 0 and big // p > 1)
    return sorted(p for p in out if all(s % p == 0 for s in sizes))


def loop_parts(config: SearchConfig, sizes: Sequence[int]) -> list[int]:
    """Strategy ``loop_parts``: ranges for a for-loop over a class of these (per-block) sizes."""
    big = max(sizes)
    out = {big // t for t in config.loop_tiles if big % t == 0 and big // t > 1}
    return sorted(p for p in out if all(s % p == 0 for s in sizes)
                  and (config.franges is None or p in config.franges))
