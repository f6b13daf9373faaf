"""The oracle as the search uses it: e-classes of new tensors, one dict lookup per e-node.

A tensor under construction is known by its e-class. Its operator's abstract expression (from the
op table) is built over *class references* (``$c`` leaves) and resolved bottom-up against the
frozen e-graph, so a new tensor costs a few lookups whatever the size of its full expression.
``ReachIndex`` is plain data: it pickles to worker processes without egglog.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..expr import Term
from ..oracle import Oracle

CLASS_REF = "$c"


def ref(c: int) -> Term:
    """A leaf standing for e-class ``c``."""
    return Term(CLASS_REF, (c,))


@dataclass(frozen=True)
class ReachIndex:
    """E-nodes, reachable classes and target classes of a saturated e-graph."""

    nodes: dict[tuple, int]
    reachable: frozenset[int]
    roots: tuple[int, ...]
    complete: bool

    @classmethod
    def from_oracle(cls, oracle: Oracle) -> ReachIndex:
        s = oracle.snapshot
        return cls(dict(s.nodes), frozenset(s.reachable), tuple(s.roots), oracle.complete)

    def classify(self, term: Term) -> int | None:
        """E-class of ``term`` (whose leaves may be class references), or None."""
        if term.op == CLASS_REF:
            return term.args[0]  # type: ignore[return-value]
        kids = []
        for a in term.args:
            if isinstance(a, Term):
                c = self.classify(a)
                if c is None:
                    return None
                kids.append(c)
            else:
                kids.append(a)
        return self.nodes.get((term.op, tuple(kids)))

    @cached_property
    def _siblings(self) -> frozenset[tuple[int, int]]:
        classes = set(self.nodes.values())

        def children(kids: tuple) -> list[int]:
            return [k for k in kids if isinstance(k, int) and k in classes]

        # classes of constants only (no e-node with a class child): Num, Const
        constant = classes - {c for (_, kids), c in self.nodes.items() if children(kids)}
        # per class, the classes it holds times constants: c = f(z, constants)
        wrapped: dict[int, set[int]] = {}
        for (_, kids), c in self.nodes.items():
            live = [k for k in children(kids) if k not in constant]
            if len(live) == 1 and len(children(kids)) > 1:
                wrapped.setdefault(c, set()).add(live[0])
        pairs = set()
        for (_, kids), c in self.nodes.items():
            if c not in self.reachable:
                continue
            cs = [k for k in children(kids) if k in self.reachable]
            pairs.update((a, b) for a in cs for b in cs)
            near = [{k, *wrapped.get(k, ())} for k in cs]
            for x, xs in enumerate(near):
                for y, ys in enumerate(near):
                    if x != y:
                        pairs.update((a, b) for a in xs for b in ys)
        return frozenset(pairs)

    def siblings(self, a: int, b: int) -> bool:
        """Whether some reachable e-node has both classes among its children, each maybe
        times a constant (``(Add a (Mul b (Const "-1.0")))`` for ``sub``): an operator whose
        expression puts its two operands (so wrapped) under one e-node needs such a node."""
        return (a, b) in self._siblings

    def is_reachable(self, c: int | None) -> bool:
        return c is not None and c in self.reachable
