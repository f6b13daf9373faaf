"""Evaluating a graph-defined kernel over the field in parts of its grid.

The blocks of a kernel are independent, so the vectorised evaluation may run on a slice of the
grid at a time and join the saved tiles. The verifier does this when a tile of the whole grid
would be large: at the paper's shapes attention's scores are 4 M elements per test, and on a
CPU fresh buffers of that size (32 MB of float64) cost page faults on every run and do not stay
in cache. ``plan`` picks one grid axis and a number of parts from the tiles' sizes, statically;
``split`` runs the parts one after another (``jax.lax.map`` under JAX, a loop under numpy). The
arithmetic is the same, so the verdict is too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..mugraph import maps as pt
from ..mugraph.kernel import Body
from ..mugraph.maps import NUM_AXES
from ..mugraph.threadblock import EPILOGUE, ThreadBlockGraph
from .field import FF, FFArrays, Field

#: the most elements a tile of one part should have (8 MB of float64)
PART_ELEMENTS = 1 << 20


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for s in dims:
        n *= s
    return n


def layout_leads(tb: ThreadBlockGraph) -> dict[int, tuple[int, ...]]:
    """The leading ``(gx|1, gy|1, gz|1, F|1)`` sizes of every tile in the vectorised layout."""
    leads: dict[int, tuple[int, ...]] = {}
    for t in tb.tensors:
        if t.op == "input":
            imap, fdim = t.params["input_map"], t.params["forloop_dim"]
            lead = [tb.grid_dim[a] if imap[a] != -1 else 1 for a in range(NUM_AXES)]
            leads[t.index] = (*lead, tb.forloop_range if fdim != -1 else 1)
            continue
        lead = [max(leads[o.index][a] for o in t.operands) for a in range(NUM_AXES + 1)]
        if t.side == EPILOGUE and t.op.startswith("forloop_accum"):
            lead[NUM_AXES] = 1
        leads[t.index] = tuple(lead)
    return leads


def plan(tb: ThreadBlockGraph, limit: int | None = None) -> tuple[int, int] | None:
    """``(grid axis, parts)`` for evaluating ``tb`` in parts, or None for all at once (when no
    tile exceeds ``limit`` elements, or the loaders' tiles together). Otherwise the fewest
    parts that bring every tile varying along the axis under ``limit`` elements (or as close as
    one axis gets), preferring an axis along which fewer loader elements are split (their tiles
    are laid out again for each part), then fewer parts."""
    limit = PART_ELEMENTS if limit is None else limit
    leads = layout_leads(tb)
    sizes = [(_numel(leads[t.index]) * _numel(t.dims), leads[t.index]) for t in tb.tensors
             if t.op != "input"]  # loader tiles are the inputs, rearranged: already there
    loaders = sum(_numel(leads[t.index]) * _numel(t.dims) for t in tb.inputs)
    if max((n for n, _ in sizes), default=0) <= max(limit, loaders):
        return None  # small, or dominated by the inputs: parts would not save memory traffic
    best: tuple[int, ...] | None = None  # (largest part, sliced loader elements, parts, axis)
    for axis in range(NUM_AXES):
        sliced = sum(_numel(leads[t.index]) * _numel(t.dims) for t in tb.inputs
                     if leads[t.index][axis] > 1)  # loaders split along the axis: re-laid out
        for parts in range(2, tb.grid_dim[axis] + 1):
            if tb.grid_dim[axis] % parts:
                continue
            largest = max(n // parts if lead[axis] > 1 else n for n, lead in sizes)
            key = (max(largest, limit), sliced, parts, axis)
            if best is None or key < best:
                best = key
            if largest <= limit:
                break
    return None if best is None else (best[3], best[2])


def splitter(f: Field, tb: ThreadBlockGraph) -> Callable[[Body, dict[int, FF]], list[FF]] | None:
    """A ``split`` hook for ``GraphDefinedKernel.run_vectorised`` over field ``f``, or None when the
    kernel is small enough to evaluate at once. Part k of ``parts`` along grid axis ``axis`` is
    the kernel on a grid with ``grid[axis] / parts`` blocks there, reading, for each loader that
    splits an input dimension along that axis, the k-th slice of that dimension (the input is
    sliced, not its rearranged tiles: no copy of the whole input is made)."""
    chosen = plan(tb)
    if chosen is None:
        return None
    axis, parts = chosen
    size = tb.grid_dim[axis]
    grid = tuple(g // parts if a == axis else g for a, g in enumerate(tb.grid_dim))
    xp = f.xp
    is_jax = xp.__name__.startswith("jax")

    def cut(a: Any, dim: int, k: Any) -> Any:  # slice k of ``parts`` along ``dim``
        n = a.shape[dim] // parts
        if is_jax:
            import jax

            return jax.lax.dynamic_slice_in_dim(a, k * n, n, dim)
        return a[(slice(None),) * dim + (slice(k * n, (k + 1) * n),)]

    def join(a: Any) -> Any:  # (parts, ..., size / parts | 1, ...) -> (..., size, ...)
        shape = list(a.shape[1:])
        shape[axis] = size // parts
        a = xp.broadcast_to(a, (parts, *shape))
        a = xp.moveaxis(a, 0, axis)
        return xp.reshape(a, (*shape[:axis], size, *shape[axis + 1:]))

    def split(body: Body, raw: dict[int, FF]) -> list[FF]:
        whys: list[str] = []  # FF.why of the outputs (static text, not traced)
        dims = {i: tb.tensors[i].params["input_map"][axis] for i in raw}
        sliced = {i: x for i, x in raw.items() if dims[i] != -1}
        arrays = FFArrays(xp)
        loaded = {i: pt.to_blocks(arrays, x, tb.grid_dim, tb.forloop_range,  # once, for all
                                  tb.tensors[i].params["input_map"],
                                  tb.tensors[i].params["forloop_dim"])
                  for i, x in raw.items() if dims[i] == -1}

        def part_of(k: Any, i: int, x: FF) -> FF:  # input ``x`` of part k
            q = f.later(lambda: cut(x.q, dims[i], k)) if x.has_q else None
            return FF(cut(x.p, dims[i], k), q, x.why)

        def one_part(k: Any) -> tuple[list[FF], Any]:
            flag, tables = f.zero_division, dict(f._tables)
            f.zero_division = xp.asarray(False)
            outs = body({i: part_of(k, i, x) for i, x in sliced.items()}, grid, loaded)
            part_flag = f.zero_division
            f.zero_division, f._tables = flag, tables  # nothing traced here may leak out
            whys[:] = [o.why for o in outs]
            return outs, part_flag

        if is_jax:
            import jax

            def one(k: Any) -> tuple[list[tuple[Any, Any]], Any]:
                outs, part_flag = one_part(k)
                return [(o.p, o.q) for o in outs], part_flag

            arrays_out, flags = jax.lax.map(one, xp.arange(parts))
            f.zero_division = f.zero_division | xp.any(flags)
            return [FF(join(p), None if q is None else join(q), why)
                    for (p, q), why in zip(arrays_out, whys)]
        results = [one_part(k) for k in range(parts)]
        f.zero_division = f.zero_division | xp.any(xp.stack([r[1] for r in results]))
        joined = []
        for j, why in enumerate(whys):
            outs = [r[0][j] for r in results]
            q = (f.later(lambda outs=outs: join(xp.stack([o.q for o in outs])))
                 if outs[0].has_q else None)
            joined.append(FF(join(xp.stack([o.p for o in outs])), q, why))
        return joined

    return split
