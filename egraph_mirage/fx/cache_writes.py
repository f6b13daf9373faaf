"""A static cache's in-place write of the new token, taken into the piece that computes it.

transformers' ``StaticCache`` writes the new token's K and V into the layer's cache tensors
with ``index_copy_`` at ``cache_position`` (a tensor on the device). Exported, that is
``put = index_put(cache, [None, None, position], value)`` (or ``index_copy(cache, 2,
position, value)``), attention reading ``put``, and ``copy_(cache, put)`` at the graph's end.

**In the partition** (``absorbed``): where ``cache`` is a graph input nothing else reads,
``position`` 1-D integers from outside the piece (an input, or computed from what the piece
does not compute), and ``value`` a piece's node of ``cache``'s dtype and shape but along the
written dimension, the ``copy_`` moves right after ``put``, whatever read ``put`` reads the
``copy_``'s result (the cache itself, written: the same values), and both join the piece of
``value``. The piece's module then writes its cache input in place and
returns it; left unreplaced, it computes exactly what the graph did.

**In the trace** (``stripped``): the kernel graph is traced from the piece less its writes,
``value`` an output of it; ``TracedProgram.writes`` says where each goes (``CacheWrite``). The
replaced piece's kernels store ``value`` into the cache too (``lower.writes``): the kernel
that computes the new token writes it, with no launch of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .traced import CacheWrite, TracedProgram, aten_name, meta_of

PUT = "aten.index_put.default"
INDEX_COPY = "aten.index_copy.default"
COPY = "aten.copy_.default"


@dataclass(frozen=True)
class _Found:
    put: Any
    back: Any  # the copy_ into dest
    dest: Any
    index: Any
    value: Any
    dim: int


def _pattern(put: Any) -> _Found | None:
    """The write ``put`` starts (an ``index_put`` with one index tensor after Nones, or an
    ``index_copy``, copied back into its destination by a ``copy_``), else None."""
    name = aten_name(put.target) if put.op == "call_function" else ""
    if name == PUT and len(put.args) == 3 and not put.kwargs:
        dest, indices, value = put.args
        if not isinstance(indices, (list, tuple)) or not indices \
                or any(i is not None for i in indices[:-1]) or indices[-1] is None:
            return None
        index, dim = indices[-1], len(indices) - 1
    elif name == INDEX_COPY and len(put.args) == 4 and not put.kwargs:
        dest, dim, index, value = put.args
    else:
        return None
    backs = [u for u in put.users if u.op == "call_function" and aten_name(u.target) == COPY
             and u.args[:2] == (dest, put)]
    if len(backs) != 1:
        return None
    return _Found(put, backs[0], dest, index, value, dim)


def _fits(w: _Found) -> bool:
    """Whether write ``w`` can go into a piece: ``dest`` an input only it touches, the index
    1-D integers, ``value`` of ``dest``'s dtype and shape but along ``dim``."""
    d, i, v = meta_of(w.dest), meta_of(w.index), meta_of(w.value)
    if w.dest.op != "placeholder" or set(w.dest.users) != {w.put, w.back} \
            or any(u.op != "output" for u in w.back.users):  # (a piece's module returns it)
        return False
    if i is None or i.dim() != 1 or i.is_floating_point() or i.is_complex():
        return False
    if d is None or v is None or not 0 <= w.dim < d.dim() or v.dtype != d.dtype:
        return False
    return _put_shape(w) is not None


def _put_shape(w: _Found) -> tuple[int, ...] | None:
    """The shape ``w`` puts into its destination (the destination's, ``dim`` as long as the
    index), where ``value`` has it, or has it less leading dims of 1 (a slice assignment's
    value: the same elements in the same order); else None."""
    d, i, v = meta_of(w.dest), meta_of(w.index), meta_of(w.value)
    want = [int(n) for n in d.shape]
    want[w.dim] = int(i.shape[0])
    have = [int(n) for n in v.shape]
    lead = len(want) - len(have)
    if lead < 0 or any(n != 1 for n in want[:lead]) or want[lead:] != have:
        return None
    return tuple(want)


def _apart(index: Any, piece: Sequence[Any]) -> bool:
    """Whether the position ``index`` can be an input of ``piece``: computed outside it, from
    nothing it computes (a graph input, or positions the graph computes before it: an
    ``arange`` plus the cache's length in ``generate()``)."""
    inside = set(piece)
    seen: set[Any] = set()
    todo = [index]
    while todo:
        n = todo.pop()
        if n in inside:
            return False
        if n not in seen:
            seen.add(n)
            todo += n.all_input_nodes
    return True


def absorbed(work: Any, pieces: Sequence[list[Any]], left: dict[Any, str]
             ) -> list[list[Any]]:
    """``pieces`` (node lists of ``work``'s graph, in graph order) with each cache write of a
    value one of them computes taken into that piece (module docstring); ``work``'s graph is
    rewired for it and ``left`` loses the write's nodes."""
    out = [list(c) for c in pieces]
    holder = {n: k for k, c in enumerate(out) for n in c}
    for node in list(work.graph.nodes):
        w = _pattern(node)
        if w is None or w.value not in holder or not _fits(w) \
                or any(holder.get(u) == holder[w.value] for u in w.put.users) \
                or not _apart(w.index, out[holder[w.value]]):
            continue  # (a piece reading the written cache cannot trace it)
        w.put.append(w.back)  # the write right after the value is put: readers read the cache
        w.put.replace_all_uses_with(w.back, delete_user_cb=lambda u, w=w: u is not w.back)
        out[holder[w.value]] += [w.put, w.back]
        left.pop(w.put, None)
        left.pop(w.back, None)
    order = {n: i for i, n in enumerate(work.graph.nodes)}
    return [sorted(c, key=order.__getitem__) for c in out]


@dataclass(frozen=True)
class Stripped:
    """A piece's module less its writes (``stripped``) and what they were: per write, (the
    value's node name, the shape it is put as, dest's and index's placeholder positions, dim,
    position among the module's outputs it returned dest at or None); ``added``: how many
    values were appended to the outputs (the last ones)."""

    module: Any
    writes: tuple[tuple[str, tuple[int, ...], int, int, int, int | None], ...]
    added: int


def stripped(gm: Any) -> Stripped:
    """``gm`` with its cache writes (``copy_(p, index_put(p, ..., value))`` on placeholders)
    erased, the written placeholders no longer returned, each value an output (appended where
    it was not one); ``gm`` itself is not changed."""
    import copy

    import torch

    found = [w for n in gm.graph.nodes if (w := _pattern(n)) is not None
             and w.dest.op == "placeholder" and w.index.op == "placeholder"
             and all(u.op == "output" for u in w.back.users) and _put_shape(w) is not None]
    if not found:
        return Stripped(gm, (), 0)
    graph = copy.deepcopy(gm.graph)
    nodes = {n.name: n for n in graph.nodes}
    places = [n.name for n in graph.nodes if n.op == "placeholder"]
    out = next(n for n in graph.nodes if n.op == "output")
    returned = list(out.args[0])
    names = [r.name if isinstance(r, torch.fx.Node) else None for r in returned]
    writes, kept = [], [r for r in returned
                        if not any(r is nodes[w.back.name] for w in found)]
    added = 0
    for w in found:
        value = nodes[w.value.name]
        if value not in kept:
            kept.append(value)
            added += 1
        at = names.index(w.back.name) if w.back.name in names else None
        writes.append((w.value.name, _put_shape(w) or (), places.index(w.dest.name),
                       places.index(w.index.name), w.dim, at))
    out.args = (tuple(kept),)
    for w in found:
        graph.erase_node(nodes[w.back.name])
        graph.erase_node(nodes[w.put.name])
    return Stripped(torch.fx.GraphModule(gm, graph), tuple(writes), added)


def with_writes(traced: TracedProgram, cut: Stripped) -> TracedProgram:
    """``traced`` (of ``cut.module``) with ``cut``'s writes (``TracedProgram.writes``) and
    without the outputs ``stripped`` appended for them."""
    from dataclasses import replace

    if not cut.writes:
        return traced
    by_name = {o.value: o for o in traced.outputs}
    writes = tuple(CacheWrite(by_name[value].index, shape, dest, index, dim, at)
                   for value, shape, dest, index, dim, at in cut.writes)
    return replace(traced, outputs=traced.outputs[:len(traced.outputs) - cut.added],
                   writes=writes)


__all__ = ["CacheWrite", "Stripped", "absorbed", "stripped", "with_writes"]
