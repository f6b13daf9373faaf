"""Which earlier tiles a binary operator may pair with a tile, found through the e-graph.

The goal-distance closure applies every operator to every pair of tiles a kernel shape can make;
trying each pair costs time quadratic in the tiles (thousands of them). Most pairs make nothing:
an operator's abstract expression ``T(a, b)`` has a lowest node ``op(.., L(a), .., R(b), ..)``
that holds both operands, and ``T(a, b)`` has a class only if ``L(a)`` and ``R(b)`` have classes
that some reachable ``op`` e-node of the saturated e-graph holds at those positions
(``children_at``). So each tile gets, per operator and side, the class of its ``L`` or ``R`` (its
*handle*), and two tiles pair when such an e-node holds their handles' classes. That depends on
the tiles' classes and dims alone, so it is decided once per pair of (class, dims) and read back
for the tiles of every closure. The pairs left out are pairs whose every operator has no class:
the closure is the same, and ``joinable`` prunes the same way in the walk.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import EMError
from ..expr import Term
from ..ops import OPS
from .reach import ReachIndex, ref
from .tile import Dims, Tile

#: per operator joining pattern: (own handle, other handle, joining operator, positions)
Plan = list[tuple[Term, Term, str, tuple[int, int]]]
Candidates = Callable[[tuple[Dims, Dims], bool], list[tuple[str, dict[str, Any]]]]
#: the leaves that stand for the first and the second operand in a handle
_A, _B = ref(-1), ref(-2)


@dataclass(frozen=True)
class Join:
    """The lowest node of an operator's expression that holds both operands: its operator, the
    positions of its children over ``a`` only and over ``b`` only, and those children."""

    op: str
    at: tuple[int, int]
    handles: tuple[Term, Term]


def split(term: Any, a: Term, b: Term) -> Join | None:
    """Where ``term`` joins the leaves ``a`` and ``b``; None when it lacks one of them."""
    node = term
    while isinstance(node, Term):
        inner = [x for x in node.args if _holds(x, a) and _holds(x, b)]
        if inner:
            node = inner[0]
            continue
        left = next((i for i, x in enumerate(node.args) if _holds(x, a)), None)
        right = next((i for i, x in enumerate(node.args) if _holds(x, b)), None)
        if left is None or right is None:
            return None
        return Join(node.op, (left, right), (node.args[left], node.args[right]))
    return None


def children_at(reach: ReachIndex, op: str, at: tuple[int, int], memo: dict
                ) -> dict[int, frozenset[int]]:
    """Per class ``c``, the classes ``d`` such that a reachable ``op`` e-node has ``c`` at
    position ``at[0]`` and ``d`` at position ``at[1]``. Memoised in ``memo``."""
    key = ("children_at", op, at)
    if key not in memo:
        out: dict[int, set[int]] = {}
        p, q = at
        for (name, kids), c in reach.nodes.items():
            if name == op and len(kids) > max(p, q) and c in reach.reachable:
                out.setdefault(kids[p], set()).add(kids[q])
        memo[key] = {c: frozenset(ds) for c, ds in out.items()}
    return memo[key]


def handles(name: str, dims: tuple[Dims, Dims], params: dict[str, Any], memo: dict
            ) -> Join | str | None:
    """Where operator ``name``'s expression over the leaves ``ref(-1)`` and ``ref(-2)`` joins
    them: "any" when no node holds both, None when it does not apply to these dims. Memoised in
    ``memo``."""
    key = ("handles", name, dims, tuple(sorted(params.items())))
    if key not in memo:
        try:
            term = OPS[name].expr([_A, _B], list(dims), params)
        except EMError:
            memo[key] = None
        else:
            memo[key] = split(term, _A, _B) or "any"
    return memo[key]


def handle_class(reach: ReachIndex, cls: int | None, handle: Term, side: int, memo: dict
                 ) -> int | None:
    """The class of ``handle`` with operand ``side``'s leaf standing for class ``cls``."""
    if cls is None:
        return None
    key = ("handle", handle, side, cls)
    if key not in memo:
        memo[key] = reach.classify(_subst(handle, (_A, _B)[side], ref(cls)))
    return memo[key]


def joinable(reach: ReachIndex, name: str, dims: tuple[Dims, Dims], params: dict[str, Any],
             classes: tuple[int, int], memo: dict) -> bool:
    """Whether operator ``name`` may give operands of these classes a class: its handles have
    classes that a reachable e-node of the joining operator holds at the joining positions."""
    h = handles(name, dims, params, memo)
    if h is None:
        return False
    if h == "any":
        return True
    a = handle_class(reach, classes[0], h.handles[0], 0, memo)
    b = handle_class(reach, classes[1], h.handles[1], 1, memo) if a is not None else None
    return b is not None and b in children_at(reach, h.op, h.at, memo).get(a, ())


def _holds(t: Any, leaf: Term) -> bool:
    return t == leaf or (isinstance(t, Term) and any(_holds(x, leaf) for x in t.args))


def _subst(t: Any, old: Term, new: Term) -> Any:
    if t == old:
        return new
    if not isinstance(t, Term):
        return t
    return Term(t.op, tuple(_subst(x, old, new) for x in t.args))


class Pairing:
    """Partners of each tile of a growing list (the closure's), by class and dims.

    ``combos(k)`` gives the operand index tuples of the moves that take tile ``k`` and otherwise
    only tiles before it, in the order ``BlockSearch._moves_with`` tries them, less the pairs
    that no operator can join. Whether two tiles may pair depends only on their classes and
    dims (their *kinds*): the tiles are grouped by kind, and whether two kinds pair is decided
    once per process (``_joins``), for the closures of every kernel shape."""

    def __init__(self, tiles: list[Tile], reach: ReachIndex, candidates: Candidates,
                 memo: dict) -> None:
        self.tiles = tiles
        self.reach = reach
        self.candidates = candidates
        self.memo = memo
        #: (class, dims) -> indices of the tiles of that kind, ascending
        self._by_kind: dict[tuple[int | None, Dims], list[int]] = {}
        self._registered = 0

    def combos(self, k: int) -> list[tuple[int, ...]]:
        self._register()
        t = self.tiles[k]
        joins = self._joins(t.cls, t.dims)
        before: list[int] = []  # partners i < k in (i, k)
        after: list[int] = []  # partners i < k in (k, i)
        for kind, members in self._by_kind.items():
            if members[0] >= k:
                continue
            pair = joins.get(kind)
            if pair is None:
                pair = joins[kind] = (self._pairs(t.cls, t.dims, kind, 1, False),
                                      self._pairs(t.cls, t.dims, kind, 0, True))
            if pair[0] or pair[1]:
                below = members[: bisect_left(members, k)]
                if pair[0]:
                    before.extend(below)
                if pair[1]:
                    after.extend(below)
        before.sort()  # the kinds' members are disjoint: no index comes twice
        after.sort()
        return [(k,)] + [(i, k) for i in before] + [(k, k)] + [(k, i) for i in after]

    def _register(self) -> None:
        while self._registered < len(self.tiles):
            i = self._registered
            t = self.tiles[i]
            self._by_kind.setdefault((t.cls, t.dims), []).append(i)
            self._registered += 1

    def _joins(self, cls: int | None, dims: Dims) -> dict[tuple[int | None, Dims],
                                                         tuple[bool, bool]]:
        """Per kind (class, dims) of partner, whether a tile of class ``cls`` and ``dims`` may
        pair with it as the second operand and as the first (filled in by ``combos``).
        Memoised in ``memo``: a tile's partners depend on nothing but the two kinds."""
        return self.memo.setdefault(("joins", cls, dims), {})

    def _pairs(self, cls: int | None, dims: Dims, other: tuple[int | None, Dims], own: int,
               swapped: bool) -> bool:
        """Whether a tile of class ``cls`` and ``dims``, as operand ``own``, may pair with a
        tile of kind ``other``: some operator's joining e-node holds, beside this tile's
        handle, the class of the other tile's handle (or an operator joins them under no
        node)."""
        wanted = self._wanted(cls, dims, other[1], own, swapped)
        if wanted == "any":
            return True
        return any(handle_class(self.reach, other[0], theirs, 1 - own, self.memo) in ds
                   for theirs, ds in wanted)

    def _wanted(self, cls: int | None, own_dims: Dims, dims: Dims, own: int, swapped: bool
                ) -> tuple[tuple[Term, frozenset[int]], ...] | str:
        """What a tile of class ``cls`` and ``own_dims`` (operand ``own``) asks of its partners
        of ``dims``: per other handle, the handle classes that some operator's joining e-node
        holds beside this tile's handle ("any": every partner)."""
        plan = self._plan((dims, own_dims) if own else (own_dims, dims), own, swapped)
        if plan == "any":
            return "any"
        merged: dict[Term, set[int]] = {}
        for mine, theirs, op, at in plan:
            c = handle_class(self.reach, cls, mine, own, self.memo)
            if c is None:
                continue
            ds = children_at(self.reach, op, at, self.memo).get(c)
            if ds:
                merged.setdefault(theirs, set()).update(ds)
        return tuple((h, frozenset(ds)) for h, ds in merged.items())

    def _plan(self, dims: tuple[Dims, Dims], own: int, swapped: bool) -> Plan | str:
        """The distinct (own handle, other handle, joining operator, positions) of the operators
        that take operands of these dims; "any" when one of them joins under no node."""
        key = ("plan", dims, own, swapped)
        if key not in self.memo:
            plan: dict[Any, None] = {}
            for name, params in self.candidates(dims, swapped):
                h = handles(name, dims, params, self.memo)
                if h is None:  # the operator does not apply to these dims
                    continue
                if h == "any":
                    plan = {"any": None}
                    break
                plan[(h.handles[own], h.handles[1 - own], h.op, (h.at[own], h.at[1 - own]))] = None
            self.memo[key] = "any" if "any" in plan else list(plan)
        return self.memo[key]
