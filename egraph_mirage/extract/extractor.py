"""Extraction: the cheapest term of each e-class of a saturated e-graph snapshot."""

from __future__ import annotations

import math
from typing import Any

from ..errors import OracleError
from ..expr import Term
from .cost import CostModel
from .snapshot import NodeKey, Snapshot


class Extractor:
    """Computes, once, the cheapest e-node of every e-class under a cost model.

    Costs are found by relaxation to a fixed point (the e-graph may be cyclic); a class whose
    every node depends on itself has no finite term and is reported as such.
    """

    def __init__(self, snapshot: Snapshot, cost_model: CostModel | None = None) -> None:
        self.snapshot = snapshot
        self.cost_model = cost_model or CostModel()
        self.cost: dict[int, float] = {c: math.inf for c in snapshot.classes}
        self.best: dict[int, NodeKey] = {}
        self._relax()

    def _node_total(self, key: NodeKey) -> float:
        op, children = key
        total = self.cost_model.node_cost(op, children)
        for ch, is_class in zip(children, self.snapshot.signatures[op]):
            if is_class:
                total += self.cost[ch]
        return total

    def _relax(self) -> None:
        changed = True
        while changed:
            changed = False
            for c, keys in self.snapshot.classes.items():
                for key in keys:
                    total = self._node_total(key)
                    if total < self.cost[c]:
                        self.cost[c] = total
                        self.best[c] = key
                        changed = True

    def extract(self, eclass: int) -> Term:
        """The cheapest term of ``eclass``."""
        if eclass not in self.snapshot.classes:
            raise OracleError(f"extract: e-class {eclass} is not in the e-graph")
        if eclass not in self.best:
            raise OracleError(f"extract: e-class {eclass} has no finite term")
        op, children = self.best[eclass]
        args: list[Any] = []
        for ch, is_class in zip(children, self.snapshot.signatures[op]):
            args.append(self.extract(ch) if is_class else ch)
        return Term(op, tuple(args))
