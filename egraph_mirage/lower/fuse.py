"""Fused combines: a kernel that only combines another kernel's partial results runs inside it.

Split plans (split-K matmuls, split-KV attention) are two graph-defined kernels: the producer's
grid cuts a reduction into pieces and writes partials; the consumer's grid keeps the other axes
and sums the pieces. As two launches, the consumer costs a launch, a kernel's ramp-up and a
pass over the partials, a large share at these sizes. Fused, the producer ends with a
completion count: the blocks that differ only along the split axes (a *group*) each add 1 to
their group's counter after writing their partials, and the block that brings the count to
the group size (the last of its group to finish) runs the consumer's block body for that group,
then sets the counter back to 0. The counter update is an ``acq_rel`` atomic at GPU scope after
a block-wide barrier, so the last block sees every partial of its group; the partials are loaded
with ``.cg`` (from L2, never a stale L1 line).

``plan`` finds the pairs where this is exact. For a consumer B reading outputs of a producer A
(the last kernel launched before B that B reads, with nothing B reads computed in between:
kernels launched between the two then run after B where it is fused, as a program of several
outputs launches its parts' splits, then their combines, ``pipeline.outputs.join``):

- each grid axis of B is either A's axis of the same size (a *kept* axis) or 1 (A's axis is cut
  into pieces, or is 1 too);
- for every tensor B reads from A and every kept axis, A's output map and B's input map send the
  axis to the same dimension, in tiles of the same size, and B's loop does not walk that
  dimension.

Then the blocks of B's group ``q`` read only what the blocks of A's group ``q`` wrote: two
groups differ along some kept axis, where their tiles are disjoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..graph import KernelGraph, Tensor
from ..mugraph.kernel import GraphDefinedKernel
from ..mugraph.threadblock import ThreadBlockGraph
from .kernel_codegen import KernelRole

#: a fused combine's loop of at most this many steps is unrolled (``tl.static_range``)
MAX_UNROLL = 16


@dataclass(frozen=True)
class Combine:
    """Consumer kernel ``consumer`` runs inside ``producer``, one block per group."""

    producer: GraphDefinedKernel
    consumer: GraphDefinedKernel
    #: grid axes of the producer that the consumer keeps (the others are cut into pieces)
    kept: tuple[int, ...]
    #: per consumer input: the producer output it reads, or None (an earlier tensor)
    from_producer: tuple[int | None, ...]
    #: producer outputs only the consumer reads (not graph outputs): kept in fp32
    private: frozenset[int] = frozenset()

    @property
    def group(self) -> int:
        """Producer blocks per consumer block."""
        grid = self.producer.tb.grid_dim
        return math.prod(g for a, g in enumerate(grid) if a not in self.kept)

    @property
    def groups(self) -> int:
        """Consumer blocks (one counter each)."""
        return math.prod(self.consumer.tb.grid_dim)


def launches(graph: KernelGraph) -> list[tuple[GraphDefinedKernel, list[Tensor]]]:
    """Graph-defined kernels in launch order, each with its outputs (by output index)."""
    order: list[tuple[GraphDefinedKernel, list[Tensor]]] = []
    seen: dict[int, list[Tensor]] = {}
    for t in graph.operators:
        if t.op != "customized":
            continue
        kernel = t.params["kernel"]
        if id(kernel) not in seen:
            seen[id(kernel)] = []
            order.append((kernel, seen[id(kernel)]))
        seen[id(kernel)].append(t)
    for _, outs in order:
        outs.sort(key=lambda u: u.params["output"])
    return order


def plan(graph: KernelGraph) -> dict[int, Combine]:
    """The fused combines of ``graph``, keyed by ``id`` of the consumer kernel (and of the
    producer: each kernel takes part in at most one)."""
    position = {t.index: k for k, t in enumerate(graph.operators)}
    first_op = {id(t.params["kernel"]): position[t.index] for t in reversed(graph.operators)
                if t.op == "customized"}
    readers: dict[int, set[int]] = {}  # tensor -> id of every operator or kernel reading it
    for t in graph.operators:
        who = id(t.params["kernel"]) if t.op == "customized" else id(t)
        for o in t.operands:
            readers.setdefault(o.index, set()).add(who)
    returned = {t.index for t in graph.outputs}
    out: dict[int, Combine] = {}
    order = launches(graph)
    for j, (b, _) in enumerate(order):
        read = {id(src.params["kernel"]) for src in b.tb.sources if src.op == "customized"}
        # the producer: the last kernel launched before B that B reads
        a, a_outs = next(((k, outs) for k, outs in reversed(order[:j]) if id(k) in read),
                         (None, []))
        if a is None or id(a) in out or id(b) in out:
            continue
        c = _combine(a, b, first_op[id(a)], position)
        if c is not None:
            private = frozenset(k for k, u in enumerate(a_outs) if u.index not in returned
                                and readers.get(u.index, set()) == {id(b)})
            out[id(a)] = out[id(b)] = replace(c, private=private)
    return out


def _combine(a: GraphDefinedKernel, b: GraphDefinedKernel, a_at: int,
             position: dict[int, int]) -> Combine | None:
    ta, tb = a.tb, b.tb
    kept = tuple(ax for ax in range(3) if tb.grid_dim[ax] > 1)
    if any(tb.grid_dim[ax] != ta.grid_dim[ax] for ax in kept):
        return None
    from_producer: list[int | None] = []
    for t, src in zip(tb.inputs, tb.sources):
        if src.op == "customized" and src.params["kernel"] is a:
            k = src.params["output"]
            if not _aligned(ta, k, tb, t.params["input_map"], t.params["forloop_dim"], t.dims,
                            kept):
                return None
            from_producer.append(k)
        elif position.get(src.index, -1) > a_at:  # graph inputs have no position
            return None  # computed after the producer is launched
        else:
            from_producer.append(None)
    if all(k is None for k in from_producer):
        return None
    return Combine(a, b, kept, tuple(from_producer))


def _aligned(ta: ThreadBlockGraph, k: int, tb: ThreadBlockGraph, imap: tuple[int, ...],
             fdim: int, tile: tuple[int, ...], kept: tuple[int, ...]) -> bool:
    """Along every kept axis, producer output ``k`` and the consumer's loader tile the same
    dimension the same way (see the module docstring)."""
    written, omap = ta.outputs[k][0].dims, ta.outputs[k][1]
    for ax in kept:
        d = omap[ax]
        if d < 0 or imap[ax] != d or fdim == d or written[d] != tile[d]:
            return False
    return True


def consumer_role(c: Combine) -> KernelRole:
    """The consumer, called in the producer: partials through L2, private ones in fp32, a short
    loop unrolled."""
    return KernelRole(
        cg_inputs=frozenset(j for j, k in enumerate(c.from_producer) if k is not None),
        fp32_inputs=frozenset(j for j, k in enumerate(c.from_producer) if k in c.private),
        unroll=c.consumer.tb.forloop_range <= MAX_UNROLL)


def producer_role(c: Combine, consumer_name: str, writes: int = 0,
                  flat: int | None = None) -> KernelRole:
    """The producer: private outputs in fp32, and extra parameters and closing lines for the
    completion count and the consumer's call (``consumer_name`` is its ``@triton.jit``
    function), passing on the destinations and index tensors of the consumer's ``writes``
    output writes (``lower.writes``). ``flat``: launched beside siblings (``lower.horizontal``),
    its counters from this one on, and the consumer's block given as a flat index (its
    ``KernelRole.flat_pid``), since ``tl.program_id`` is then the shared grid's."""
    tb = c.consumer.tb
    extra = [f"cin{j}" for j, k in enumerate(c.from_producer) if k is None]
    extra += [f"cout{k}" for k in range(len(tb.outputs))]
    passed = [f"c{p}{j}" for j in range(writes) for p in ("w", "wi")]
    extra += [*passed, "counters"]
    group = "0"
    for ax in c.kept:
        pid = f"pid_{'xyz'[ax]}"
        group = pid if group == "0" else f"({group}) * {tb.grid_dim[ax]} + {pid}"
    if flat:
        group = f"{flat} + {group}"
    args = [f"out{k}" if k is not None else f"cin{j}" for j, k in enumerate(c.from_producer)]
    args += [f"cout{k}" for k in range(len(tb.outputs))] + passed
    if flat is not None:  # the consumer's flat block index: x fastest (``flat_pid_lines``)
        terms = [f"pid_{'xyz'[ax]}" + "".join(f" * {tb.grid_dim[a]}" for a in range(ax)
                                                if tb.grid_dim[a] > 1)
                 for ax in c.kept]
        args.append(" + ".join(terms) or "0")
    tail = (
        f"# fused combine: the last of the {c.group} blocks of this group (they differ only along",
        f"# the grid axes cut into pieces) runs {consumer_name} for the group",
        "tl.debug_barrier()",
        f"group = {group}",
        'ticket = tl.atomic_add(counters + group, 1, sem="acq_rel", scope="gpu")',
        f"if ticket == {c.group - 1}:",
        f"    {consumer_name}({', '.join(args)})",
        "    tl.store(counters + group, 0)",
    )
    return KernelRole(fp32_outputs=c.private, extra_args=tuple(extra), tail=tail)
