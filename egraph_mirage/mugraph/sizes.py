"""Sizes of a μGraph, apart from its structure.

A μGraph's *structure* is what it computes and how the work is cut: which dimension each
kernel's grid axes split and its for-loop walks, the block operators, accumulators and outputs,
how many kernels. Its *sizes* are the numbers: blocks per grid axis and loop iterations, which
fix the tile sizes and the number of pieces a split form cuts a reduction into. The search finds
structures; this module instantiates one at other sizes, for a tuner to choose among
(``rank.size_variants.size_variants`` verifies and orders them).

``resize(g, sizes)`` rebuilds ``g`` with each graph-defined kernel's grid and loop range
replaced; the block graph is replayed operator by operator on the new tiles. ``size_choices(g,
caps)`` derives the sizes of one ``Caps`` (largest tiles under caps, as powers of two dividing
the dimension) from the structure alone:

- a grid axis that cuts a dimension into tiles keeps tile 1 where it had tile 1 (one index per
  block is structural) and otherwise takes the largest tile under ``caps.grid``;
- a grid axis that cuts the dimension its own loop walks is a *split* (split-K, split-KV: each
  block reduces one piece): it takes ``caps.splits`` pieces, each walked in loop tiles;
- a loop takes the largest tile under ``caps.loop`` that leaves it at least two iterations; a loop
  over an earlier kernel's results (the partial results of a split) takes as many steps per
  piece as before, over however many pieces that kernel now writes (a piece's rows grow with
  the batch when the μGraph is retargeted), and the kernel's other loads are walked in as many
  steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import EMError, MapError
from ..graph import KernelGraph, Tensor, new_kernel_graph
from . import maps as pt
from .threadblock import ThreadBlockGraph


@dataclass(frozen=True)
class KernelSizes:
    """The sizes of one graph-defined kernel: blocks per grid axis and loop iterations."""

    grid: tuple[int, int, int]
    frange: int


@dataclass(frozen=True)
class Caps:
    """Caps on a μGraph's tiles: each tile is the largest power of two dividing its dimension
    under its cap."""

    #: along a dimension a grid axis cuts into tiles
    grid: int = 64
    #: along the dimension a for-loop walks
    loop: int = 64
    #: most pieces a split grid axis cuts its reduction into
    splits: int = 8
    #: bytes of shared memory each block may take (None: the μGraph's own budget, the search's);
    #: a tuner for one GPU gives that GPU's (``with_smem``): larger tiles then fit
    smem: int | None = None


#: caps a tuner tries by default: the middle first, then more and fewer blocks, longer and
#: shorter loop steps, more and fewer pieces (32 last: a decode attention of 8 KV heads over
#: 4,096 keys fills a GPU's 132 SMs only with 16 or more pieces a head)
DEFAULT_CAPS: tuple[Caps, ...] = tuple(
    Caps(g, lp, s) for s in (8, 4, 16, 2, 32) for lp in (64, 128, 32, 256)
    for g in (64, 32, 128, 16))


def with_smem(caps: Sequence[Caps], smem: int | None) -> tuple[Caps, ...]:
    """``caps`` with each block's shared memory budget ``smem`` (a GPU's per-block limit)."""
    return tuple(replace(c, smem=smem) for c in caps)


def kernels(g: KernelGraph) -> list[Any]:
    """The graph-defined kernels of ``g`` in program order (one entry per kernel)."""
    out: list[Any] = []
    for t in g.operators:
        k = t.params.get("kernel") if t.op == "customized" else None
        if k is not None and all(k is not o for o in out):
            out.append(k)
    return out


def sizes_of(g: KernelGraph) -> tuple[KernelSizes, ...]:
    """The sizes of each graph-defined kernel of ``g``."""
    return tuple(KernelSizes(tuple(k.tb.grid_dim), k.tb.forloop_range)  # type: ignore[arg-type]
                 for k in kernels(g))


def resize(g: KernelGraph, sizes: Sequence[KernelSizes]) -> KernelGraph:
    """``g``'s structure at ``sizes`` (one entry per graph-defined kernel). Raises an ``EMError``
    (``MapError``, ``ResourceError``, ...) when the sizes do not fit the structure."""
    ks = kernels(g)
    if len(sizes) != len(ks):
        raise MapError(f"resize: {len(sizes)} kernel sizes for {len(ks)} graph-defined kernels")
    return _rebuild(g, lambda i, tb, sources, maps: sizes[i])


def with_caps(g: KernelGraph, caps: Caps) -> KernelGraph:
    """``g``'s structure with every tile chosen under ``caps`` (see the module's rules)."""
    return _rebuild(g, lambda i, tb, sources, maps: _choose(tb, sources, caps), smem=caps.smem)


def retarget(g: KernelGraph, program: KernelGraph,
             caps: Sequence[Caps] = DEFAULT_CAPS) -> KernelGraph:
    """``g``'s structure on ``program``'s inputs (the same program at another batch size, say),
    its tiles chosen under the first of ``caps`` that fits. Raises a ``MapError`` where the
    inputs differ in number, rank or dtype, or the last ``EMError`` where no caps fit the new
    shapes. The result is not verified: ``rank.size_variants.size_variants(h, target=program)``
    checks
    it (and tries the other caps)."""
    if len(g.inputs) != len(program.inputs):
        raise MapError(f"retarget: the μGraph takes {len(g.inputs)} inputs, the program "
                       f"{len(program.inputs)}")
    for i, (a, b) in enumerate(zip(g.inputs, program.inputs)):
        if len(a.dims) != len(b.dims) or a.dtype != b.dtype:
            raise MapError(f"retarget: input {i} is {a.dims} {a.dtype.name} in the μGraph, "
                           f"{b.dims} {b.dtype.name} in the program")
    dims = [t.dims for t in program.inputs]
    error: EMError = MapError("retarget: no caps given")
    for c in caps:
        try:
            return _rebuild(g, lambda i, tb, sources, maps, c=c: _choose(tb, sources, c, maps),
                            dims)
        except EMError as exc:
            error = exc
    raise error


@dataclass(frozen=True)
class _Maps:
    """A kernel's input and output maps with one more grid axis (``_grown``)."""

    inputs: tuple[tuple[int, ...], ...]
    outputs: tuple[tuple[int, ...], ...]
    axis: int
    blocks: int


def _grown(tb: ThreadBlockGraph, sources: Sequence[Tensor]) -> _Maps | None:
    """Where a dimension of one index (a batch of one) has grown on the new sources, and no grid
    axis or loop cuts it: the same dimension of every load that grew and of every output, on a
    grid axis the kernel does not use, one index per block, so that the block graph stays as it
    was. None where nothing grew, or where this does not apply (several dimensions grew, no
    free axis, an output without that dimension of one index or with it on a grid axis already:
    a split form that writes its pieces along the batch dimension); then nothing changes."""
    grown: set[tuple[int, int]] = set()
    sizes: set[int] = set()
    for i, (ld, s, old) in enumerate(zip(tb.inputs, sources, tb.sources)):
        imap, fd = ld.params["input_map"], ld.params["forloop_dim"]
        for d, (n, o) in enumerate(zip(s.dims, old.dims)):
            if o == 1 and n > 1 and d not in imap and d != fd:
                grown.add((i, d))
                sizes.add(n)
    dims = {d for _, d in grown}
    if len(dims) != 1 or len(sizes) != 1:
        return None
    (d,), (n,) = dims, sizes
    free = [a for a in range(3) if tb.grid_dim[a] == 1
            and all(ld.params["input_map"][a] == -1 for ld in tb.inputs)
            and all(om[a] == -1 for _, om in tb.outputs)]
    if not free or any(len(t.dims) <= d or t.dims[d] != 1 or d in om for t, om in tb.outputs):
        return None
    a = free[0]

    def put(m: Sequence[int], on: bool) -> tuple[int, ...]:
        return tuple(d if on and ax == a else v for ax, v in enumerate(m))

    return _Maps(tuple(put(ld.params["input_map"], (i, d) in grown)
                       for i, ld in enumerate(tb.inputs)),
                 tuple(put(om, True) for _, om in tb.outputs), a, n)


def _rebuild(g: KernelGraph, pick: Any, input_dims: Sequence[tuple[int, ...]] | None = None,
             smem: int | None = None) -> KernelGraph:
    h = new_kernel_graph()
    new: dict[int, Tensor] = {}
    for i, t in enumerate(g.inputs):
        new[t.index] = h.new_input(t.dims if input_dims is None else input_dims[i], t.dtype)
    built: dict[int, list[Tensor]] = {}
    order = {id(k): i for i, k in enumerate(kernels(g))}
    for t in g.operators:
        if t.op == "customized":
            kernel = t.params["kernel"]
            if id(kernel) not in built:
                tb = kernel.tb
                sources = [new[s.index] for s in t.operands]
                maps = _grown(tb, sources) if input_dims is not None else None
                size = pick(order[id(kernel)], tb, sources, maps)
                built[id(kernel)] = h.customized(sources, _replay(tb, sources, size, maps, smem))
            new[t.index] = built[id(kernel)][t.params["output"]]
        else:
            new[t.index] = h.apply(t.op, [new[o.index] for o in t.operands], **t.params)
    for t in g.outputs:
        h.mark_output(new[t.index])
    return h


def _replay(tb: ThreadBlockGraph, sources: Sequence[Tensor], size: KernelSizes,
            maps: _Maps | None = None, smem: int | None = None) -> ThreadBlockGraph:
    """``tb``'s block graph on new sources with ``size``'s grid and loop (and ``maps``' input and
    output maps, and the shared memory budget ``smem``, where given)."""
    imaps = maps.inputs if maps else tuple(ld.params["input_map"] for ld in tb.inputs)
    omaps = maps.outputs if maps else tuple(om for _, om in tb.outputs)
    old_tiles = [t.dims for t in tb.inputs]
    new_tiles = [pt.tile_dims(f"new_input #{i}", s.dims, size.grid, size.frange,
                              imaps[i], ld.params["forloop_dim"])
                 for i, (s, ld) in enumerate(zip(sources, tb.inputs))]
    dimx = tb.reduction_dimx
    if old_tiles and dimx == min(d[-1] for d in old_tiles):  # the search's choice: follow it
        dimx = min(d[-1] for d in new_tiles)
    out = ThreadBlockGraph(size.grid, tb.block_dim, size.frange, dimx,
                           tb.smem_bytes if smem is None else smem)
    made: dict[int, Any] = {}
    for t in tb.tensors:
        args = [made[o.index] for o in t.operands]
        p = t.params
        if t.op == "input":
            made[t.index] = out.new_input(sources[p["position"]], imaps[p["position"]],
                                          p["forloop_dim"])
        elif t.op == "forloop_accum":
            made[t.index] = out.forloop_accum(args[0], p["acc"])
        elif t.op == "forloop_accum_rescale":
            made[t.index] = out.forloop_accum(args[0], p["acc"], rescale=args[1])
        elif t.op == "forloop_max":
            made[t.index] = out.forloop_max(args[0])
        else:
            params = dict(p)
            if "normalized_shape" in params:  # the same trailing dimensions of the new tile
                n = len(tuple(params["normalized_shape"]))
                params["normalized_shape"] = tuple(args[0].dims[-n:])
            made[t.index] = out.apply(t.op, args, **params)
    for (t, _), omap in zip(tb.outputs, omaps):
        out.new_output(made[t.index], omap)
    return out


def _largest(n: int, cap: int, at_most: int | None = None) -> int:
    """The largest power of two dividing ``n``, at most ``cap`` (and ``at_most``)."""
    limit = min(cap, at_most) if at_most is not None else cap
    t = 1
    while t * 2 <= limit and n % (t * 2) == 0:
        t *= 2
    return t


def _choose(tb: ThreadBlockGraph, sources: Sequence[Tensor], caps: Caps,
            maps: _Maps | None = None) -> KernelSizes:
    """The sizes ``caps`` gives one kernel (the module's rules), on its new sources (with
    ``maps``' grid axis of one index per block, where given)."""
    grid = list(tb.grid_dim)
    imaps = maps.inputs if maps else tuple(ld.params["input_map"] for ld in tb.inputs)
    loads = [(imap, ld.params["forloop_dim"], s.dims, old.dims)
             for imap, ld, s, old in zip(imaps, tb.inputs, sources, tb.sources)]
    looped = [(i, fd, dims) for i, (_, fd, dims, _) in enumerate(loads) if fd != -1]
    made = [(i, fd) for i, fd, _ in looped if sources[i].op == "customized"]
    for axis, g in enumerate(tb.grid_dim):
        if g == 1:
            continue
        cut = [(imap[axis], dims, old) for imap, fd, dims, old in loads if imap[axis] != -1]
        d, dims, old = cut[0]
        if tb.forloop_range > 1 and any(imap[axis] == fd for imap, fd, _, _ in loads if fd != -1):
            pieces = _largest(dims[d], caps.splits)
            grid[axis] = pieces if pieces > 1 else g
        elif old[d] // g == 1:
            grid[axis] = dims[d]  # one index per block
        else:
            tile = _largest(dims[d], caps.grid, dims[d] // 2)
            grid[axis] = dims[d] // tile
    if maps is not None:
        grid[maps.axis] = maps.blocks
    frange = tb.forloop_range
    if frange > 1 and made:
        # an earlier kernel's results (the pieces of a split): as many iterations per piece as
        # before, over however many pieces that kernel now writes (each piece's rows may have
        # grown with the batch); every other looped load is walked in as many steps
        i, fd = made[0]
        before, now = _pieces(tb.sources[i], fd), _pieces(sources[i], fd)
        if (frange * now) % before:
            raise MapError(f"resize: {frange} loop steps over {before} pieces do not scale to "
                           f"{now} pieces")
        frange = frange * now // before
    elif frange > 1 and looped:
        _, fd, dims = looped[0]
        parts = _grid_parts(grid, fd, loads)  # the grid's cut of the looped dimension
        if dims[fd] % parts:
            raise MapError(f"resize: dimension {dims[fd]} does not split into {parts} pieces")
        extent = dims[fd] // parts
        tile = _largest(extent, caps.loop, extent // 2)
        if tile < 1 or extent % tile:
            raise MapError(f"resize: loop tile {tile} does not divide {extent}")
        frange = extent // tile
    return KernelSizes((grid[0], grid[1], grid[2]), frange)


def _pieces(t: Tensor, d: int) -> int:
    """How many pieces the kernel that wrote ``t`` cuts its dimension ``d`` into: the blocks of
    its grid axes that write along ``d``."""
    kernel = t.params["kernel"]
    omap = kernel.tb.outputs[t.params["output"]][1]
    n = 1
    for axis, g in enumerate(kernel.tb.grid_dim):
        if omap[axis] == d:
            n *= g
    return n


def _grid_parts(grid: Sequence[int], fd: int, loads: Sequence[Any]) -> int:
    """How many pieces ``grid`` cuts dimension ``fd`` of the looped loads into."""
    parts = 1
    for axis, g in enumerate(grid):
        if any(imap[axis] == fd for imap, f, _, _ in loads if f == fd):
            parts *= g
    return parts


def size_choices(g: KernelGraph, caps: Sequence[Caps] = DEFAULT_CAPS) -> list[KernelGraph]:
    """``g`` first, then its structure under each of ``caps`` that fits, one per set of sizes
    (unverified: ``rank.size_variants.size_variants`` checks them; a budget of shared memory that
    only
    lets the same sizes through again gives nothing new)."""
    seen = {sizes_of(g)}
    out = [g]
    for c in caps:
        try:
            h = with_caps(g, c)
            key = sizes_of(h)
        except EMError:
            continue
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out


def structure_of(g: KernelGraph) -> tuple[Any, ...]:
    """``g`` with its sizes erased: per kernel (graph-defined or library, in program order), the
    grid axes it uses, how it loads each input, whether it loops, its block operators (a
    multiset, accumulators with their kind and whether they are rescaled) and its outputs' maps
    (a map onto an axis of one block cuts nothing and counts as none). Two μGraphs of one
    structure differ only in sizes (``resize``)."""
    out: list[Any] = []
    seen: set[int] = set()
    for t in g.operators:
        if t.op != "customized":
            out.append((t.op, tuple(sorted((k, repr(v)) for k, v in t.params.items()))))
            continue
        k = t.params["kernel"]
        if id(k) in seen:
            continue
        seen.add(id(k))
        tb = k.tb
        used = tuple(d > 1 for d in tb.grid_dim)

        def cut(m: Sequence[int], used: tuple[bool, ...] = used) -> tuple[int, ...]:
            return tuple(d if u else -1 for d, u in zip(m, used))  # one block: no cut

        loads = sorted((cut(ld.params["input_map"]), ld.params["forloop_dim"])
                       for ld in tb.inputs)
        ops = sorted(b.op + (":" + b.params["acc"] if "acc" in b.params else "")
                     for b in tb.tensors if b.op != "input")
        out.append((used, tb.forloop_range > 1, tuple(loads), tuple(ops),
                    tuple(sorted(cut(omap) for _, omap in tb.outputs))))
    return tuple(out)
