"""The oracle as the search uses it: e-classes of new tensors, one dict lookup per e-node.

A tensor under construction is known by its e-class. Its operator's abstract expression (from the
op table) is built over *class references* (``$c`` leaves) and resolved bottom-up against the
frozen e-graph, so a new tensor costs a few lookups whatever the size of its full expression.
``ReachIndex`` is plain data: it pickles to worker processes without egglog.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def is_reachable(self, c: int | None) -> bool:
        return c is not None and c in self.reachable
