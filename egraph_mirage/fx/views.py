"""Views of program inputs, folded into graph inputs, and how torch shapes relate to graph dims.

Two facts drive the tracer (``trace.py``):

* A view chain (permute, reshape, expand, slice, ...) that starts at a program input costs nothing
  in torch. The tracer keeps it as a ``PendingView`` and, where an operator consumes it, makes a
  graph input of the viewed shape; the steps (``Step``) tell the caller which torch views to apply
  (``apply_steps``). An expanded dimension (``expand``, the repeat of K/V heads in grouped-query
  attention) stays a size-1 dimension of the graph input and broadcasts inside the graph: it is
  never materialised. Where a fold would need a copy, an ``UnsupportedOpError`` says so.
* A graph tensor holds its elements in row-major order, so an fx value of torch shape ``S`` with
  as many elements as the graph dims ``G`` is the graph tensor reshaped: a reshape of an
  intermediate is a relabelling that costs nothing. An operator acting along torch dim ``d`` then
  needs a graph dim that is the same dim (``graph_dim``), and operands of one operator need one
  layout (``layout``, ``fit``).

A pending view describes its torch shape by factors (``PendingView.dims``): each torch dim is a run
of factors, each factor a dim of the base tensor (the source after ``steps``) or an expanded dim
(size 1 in the base). Merging dims only regroups factors; splitting one splits a factor.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import UnsupportedOpError

Shape = tuple[int, ...]
#: one torch view applied to a source: ("reshape", (shape,)), ("permute", (order,)),
#: ("narrow", (dim, start, length)), ("expand", (shape,))
Step = tuple[str, tuple[Any, ...]]
#: a factor of a pending view: (size, expanded)
Factor = tuple[int, bool]

#: how the caller applies each kind of step to a torch tensor (all are views; a reshape that
#: merges an expanded dim with another copies: ``trace.with_batch_folded``'s broadcast inputs)
STEP_METHODS = {
    "reshape": lambda t, shape: t.reshape(shape),
    "expand": lambda t, shape: t.expand(shape),
    "permute": lambda t, order: t.permute(order),
    "narrow": lambda t, dim, start, length: t.narrow(dim, start, length),
}


def apply_steps(value: Any, steps: Sequence[Step]) -> Any:
    """``value`` (a torch tensor) with ``steps`` applied, in order."""
    for name, args in steps:
        value = STEP_METHODS[name](value, *args)
    return value


def blocks(a: Shape, b: Shape) -> list[tuple[range, range]]:
    """The finest split of shapes ``a`` and ``b`` (equal element counts) into consecutive runs of
    equal products, as pairs of index ranges: ``(6, 4)`` and ``(2, 3, 4)`` give
    ``[(range(0, 1), range(0, 2)), (range(1, 2), range(2, 3))]``."""
    if math.prod(a) != math.prod(b):
        raise ValueError(f"shapes {a} and {b} hold different numbers of elements")
    out: list[tuple[range, range]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        i0, j0, pa, pb = i, j, 1, 1
        if i < len(a):
            pa, i = a[i], i + 1
        if j < len(b):
            pb, j = b[j], j + 1
        while pa != pb:
            if pa < pb:
                pa, i = pa * a[i], i + 1
            else:
                pb, j = pb * b[j], j + 1
        out.append((range(i0, i), range(j0, j)))
    return out


def graph_dim(S: Shape, G: Shape, d: int) -> int | None:
    """The graph dim that is torch dim ``d`` of a value of torch shape ``S`` held in graph dims
    ``G``; None when a reshape merged or split it (or when torch dim ``d`` has size 1 and no
    graph dim of its own)."""
    for ri, rj in blocks(S, G):
        if d not in ri:
            continue
        if any(S[k] != 1 for k in ri if k != d):
            return None
        if S[d] == 1:
            return rj[0] if len(rj) else None
        big = [k for k in rj if G[k] != 1]
        return big[0] if len(big) == 1 else None
    return None


def fit(aligned: Shape, R: Shape, L: Shape) -> Shape | None:
    """The graph dims of an operand of (left-padded) torch shape ``aligned`` of an element-wise
    result of torch shape ``R`` laid out as graph dims ``L``: each run of ``blocks(R, L)`` is
    either all present (then ``L``'s dims) or all broadcast (then 1s). None otherwise."""
    out: list[int] = []
    for ri, rj in blocks(R, L):
        if all(aligned[k] == R[k] for k in ri):
            out += [L[k] for k in rj]
        elif all(aligned[k] == 1 for k in ri):
            out += [1] * len(rj)
        else:
            return None
    return tuple(out)


def refines(G: Shape, W: Shape) -> bool:
    """Whether graph dims ``G`` split the same elements at every boundary of graph dims ``W``
    and more: each dim of ``W`` is a run of consecutive dims of ``G``, so an operator along a
    dim that ``W`` holds whole finds it whole in ``G``, or split further. Dims that differ only
    in where their size-1 dims stand (``(1, 8, 1, 64)`` and ``(8, 1, 1, 64)``) split nothing
    further: they do not broadcast alike, and neither refines the other."""
    def big(shape: Shape) -> Shape:
        return tuple(s for s in shape if s != 1)

    return math.prod(G) == math.prod(W) and big(G) != big(W) and \
        {math.prod(W[:k]) for k in range(len(W))} <= {math.prod(G[:k]) for k in range(len(G))}


def layout(R: Shape, splits: Sequence[Sequence[Shape]], rank: int) -> Shape:
    """Graph dims for an element-wise result of torch shape ``R`` when no operand is a graph
    tensor of that full shape: ``R``, each dim split where the operands' views split it
    (``splits[i]``: for each operand, the factor sizes it holds dim ``i`` in), left-padded with
    1s to ``rank`` dims. A split that operands do not agree on is left out."""
    out: list[int] = []
    for r, ways in zip(R, splits):
        cuts = {1, r}
        for sizes in ways:
            cuts.update(math.prod(sizes[:k]) for k in range(1, len(sizes)))
        ordered = sorted(cuts)
        if all(b % a == 0 for a, b in itertools.pairwise(ordered)):
            out += [b // a for a, b in itertools.pairwise(ordered)] or [1]
        else:
            out.append(r)
    return (1,) * (rank - len(out)) + tuple(out)


def _split(factors: Sequence[Factor], targets: Shape) -> list[Factor] | None:
    """``factors`` cut at every boundary of ``targets`` (cumulative products); None when a
    boundary cuts a factor unevenly."""
    bounds = {math.prod(targets[:k]) for k in range(1, len(targets))}
    out: list[Factor] = []
    start = 1
    for size, expanded in factors:
        points = [start, *sorted(b for b in bounds if start < b < start * size), start * size]
        for lo, hi in itertools.pairwise(points):
            if hi % lo:
                return None
            out.append((hi // lo, expanded))
        start *= size
    return out


def merged(factors: Sequence[Factor], what: str) -> Factor:
    """One factor for ``factors``: expanded when they all are (size-1 factors count as either);
    an ``UnsupportedOpError`` when real and expanded ones mix (a copy would be needed)."""
    kinds = {e for s, e in factors if s != 1}
    if len(kinds) > 1:
        raise UnsupportedOpError(f"{what} merges an expanded (broadcast) dimension with a real "
                                 "one; folding it into the input would need a copy")
    return (math.prod(s for s, _ in factors), kinds == {True})


def regroup(factors: Sequence[Factor], targets: Shape, what: str) -> list[list[Factor]]:
    """``factors`` (of one run of dims) regrouped into runs of the sizes ``targets``, splitting
    factors where a target boundary falls inside one (merging them all first when it falls
    unevenly)."""
    pieces = _split(factors, targets)
    if pieces is None:
        pieces = _split([merged(factors, what)], targets)
    assert pieces is not None  # one factor splits evenly at the targets' own boundaries
    out: list[list[Factor]] = []
    it = 0
    for t in targets:
        run: list[Factor] = []
        prod = 1
        while prod < t:
            run.append(pieces[it])
            prod *= pieces[it][0]
            it += 1
        out.append(run or [(1, False)])
    if out:
        out[-1] += pieces[it:]  # size-1 leftovers
    return out


@dataclass(frozen=True)
class Source:
    """A program tensor a graph input may view: a placeholder of the fx graph or an attribute
    (parameter, buffer, constant) that a ``get_attr`` node reads."""

    name: str
    kind: str  # "placeholder" | "attribute"
    position: int  # index among the placeholders; -1 for an attribute
    shape: Shape
    stride: Shape
    dtype: Any  # torch dtype


@dataclass(frozen=True)
class PendingView:
    """A view of ``source`` not yet made a graph input (see the module docstring)."""

    source: Source
    steps: tuple[Step, ...]
    dims: tuple[Factor, ...]  # factors, in torch-dim order
    groups: tuple[int, ...]  # how many factors make each torch dim
    dtype: Any  # torch dtype of the value: a cast of the source is done where it is read

    @staticmethod
    def of(source: Source) -> PendingView:
        return PendingView(source, (), tuple((s, False) for s in source.shape),
                           (1,) * len(source.shape), source.dtype)

    @property
    def shape(self) -> Shape:
        return tuple(math.prod(s for s, _ in self.group(i)) for i in range(len(self.groups)))

    @property
    def base(self) -> Shape:
        """The shape of the source after ``steps``: expanded factors have size 1."""
        return tuple(1 if e else s for s, e in self.dims)

    def group(self, i: int) -> tuple[Factor, ...]:
        start = sum(self.groups[:i])
        return self.dims[start:start + self.groups[i]]

    def _with(self, dims: Sequence[Factor], groups: Sequence[int]) -> PendingView:
        """This view with new factors, and a reshape step when the base shape changed."""
        new = replace(self, dims=tuple(dims), groups=tuple(groups))
        if new.base != self.base:
            new = replace(new, steps=new.steps + (("reshape", (new.base,)),))
        return new

    def permute(self, perm: Sequence[int]) -> PendingView:
        starts = [sum(self.groups[:i]) for i in range(len(self.groups))]
        order = tuple(f for i in perm for f in range(starts[i], starts[i] + self.groups[i]))
        step = () if order == tuple(range(len(order))) else (("permute", (order,)),)
        return replace(self, dims=tuple(self.dims[f] for f in order),
                       groups=tuple(self.groups[i] for i in perm), steps=self.steps + step)

    def reshape(self, shape: Shape) -> PendingView:
        dims: list[Factor] = []
        groups: list[int] = []
        for ri, rj in blocks(self.shape, shape):
            if not len(rj):
                continue  # size-1 dims dropped
            factors = [f for k in ri for f in self.group(k)]
            for run in regroup(factors, tuple(shape[j] for j in rj), "a reshape"):
                dims += run
                groups.append(len(run))
        return self._with(dims, groups)

    def expand(self, sizes: Sequence[int]) -> PendingView:
        new = len(sizes) - len(self.groups)
        dims: list[Factor] = [(s, s != 1) for s in sizes[:new]]
        groups = [1] * new
        for i, s in enumerate(sizes[new:]):
            if s in (-1, self.shape[i]):
                dims += self.group(i)
                groups.append(self.groups[i])
            else:  # a size-1 dim broadcast to s
                dims.append((s, True))
                groups.append(1)
        return self._with(dims, groups)

    def narrow(self, dim: int, start: int, length: int) -> PendingView:
        if length == self.shape[dim]:
            return self
        run = self.group(dim)
        big = [k for k, (s, _) in enumerate(run) if s != 1]
        if len(big) != 1:  # a dim a reshape merged: merge its factors in the base (checked to
            # be a view where the graph input is made), then slice that
            start_f = sum(self.groups[:dim])
            dims = (*self.dims[:start_f], merged(run, "a slice"),
                    *self.dims[start_f + len(run):])
            groups = (*self.groups[:dim], 1, *self.groups[dim + 1:])
            return self._with(dims, groups).narrow(dim, start, length)
        f = sum(self.groups[:dim]) + big[0]
        dims = list(self.dims)
        expanded = dims[f][1]
        dims[f] = (length, expanded)
        step = () if expanded else (("narrow", (f, start, length)),)
        return replace(self, dims=tuple(dims), steps=self.steps + step)

    def materialise(self, R: Shape, L: Shape, what: str) -> tuple[tuple[Step, ...], Shape]:
        """The steps and graph dims of a graph input for this view as an operand of an
        element-wise result of torch shape ``R`` laid out as graph dims ``L`` (this view's shape
        is left-padded to ``R``'s rank). Expanded factors become size-1 dims of the graph input
        (the graph broadcasts them); the steps are checked to be views of the source."""
        pad = len(R) - len(self.groups)
        aligned = (1,) * pad + self.shape
        out: list[Factor] = []
        for ri, rj in blocks(R, L):
            targets = tuple(L[j] for j in rj)
            if all(aligned[k] == R[k] for k in ri):
                factors = [f for k in ri if k >= pad for f in self.group(k - pad)]
                out += [merged(run, what) for run in regroup(factors, targets, what)]
            elif all(aligned[k] == 1 for k in ri):
                out += [(1, False)] * len(rj)
            else:
                raise UnsupportedOpError(f"{what}: input {self.source.name!r} viewed as "
                                         f"{self.shape} broadcasts over part of a run of dims "
                                         f"that the graph holds merged ({R} as graph dims {L})")
        dims = tuple(1 if e else s for s, e in out)
        steps = self.steps if dims == self.base else self.steps + (("reshape", (dims,)),)
        check_views(self.source, steps, what)
        return steps, dims


def check_views(source: Source, steps: Sequence[Step], what: str) -> None:
    """An ``UnsupportedOpError`` when ``steps`` on a tensor of ``source``'s shape and strides
    would copy (a reshape that is no view of its memory)."""
    import torch

    t = torch.empty_strided(source.shape, source.stride, dtype=source.dtype, device="meta")
    try:
        for name, args in steps:
            t = t.view(*args) if name == "reshape" else STEP_METHODS[name](t, *args)
    except RuntimeError:
        raise UnsupportedOpError(f"{what}: the view of input {source.name!r} it needs "
                                 f"({describe(steps)}) is not a view of the input's memory: "
                                 "folding it would need a copy") from None


def describe(steps: Sequence[Step]) -> str:
    """``steps`` as torch code: ``.permute((1, 0)).reshape((1, 4, 8))``."""
    return "".join(f".{name}({', '.join(map(repr, args))})" for name, args in steps) or "none"


@dataclass(frozen=True)
class Expanded:
    """A computed value broadcast without a copy (an expand of an intermediate: grouped-query
    attention's shared K/V heads): graph tensor ``tensor`` broadcast to graph dims ``full`` (its
    size-1 dims grown where the expand grew them), relabelled to torch shape ``shape``. The
    graph keeps the size-1 dims; an operator that takes the value broadcasts over them."""

    tensor: Any  # graph Tensor
    full: Shape
    shape: Shape
    dtype: Any  # torch dtype


class Relayout(Exception):
    """Raised while tracing: graph tensor of fx node ``node`` is wanted in graph dims ``dims``
    (the same elements in the same row-major order, split or padded otherwise) by a later
    operator. The tracer traces again, laying that node out so (``Tracer.hints``)."""

    def __init__(self, node: str, dims: Shape) -> None:
        super().__init__(f"{node} wanted as graph dims {dims}")
        self.node = node
        self.dims = dims
