"""Cost models for abstract expressions.

A term's cost is the sum of its e-nodes' costs. The default weights make element-wise arithmetic
cheap, transcendental functions dearer, and charge a sum by how many elements it adds, so the
cheapest member of an e-class is the form with the least arithmetic: the one to print as canonical,
and the one the search ranks first among equal alternatives.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..expr import Term
from ..ops import term_constructors


def default_weights() -> dict[str, float]:
    """Each term constructor's ``cost`` (``ops.terms``; an operator's own constructors are in
    its op-table entry)."""
    return {name: c.cost for name, c in term_constructors().items()}


#: the weights of the shipped op table
DEFAULT_WEIGHTS: dict[str, float] = default_weights()


@dataclass(frozen=True)
class CostModel:
    """Per-operator weights; a ``Sum`` of n elements costs ``weights['Sum'] * log2(n) + 1``.

    Unknown operators (from user rule files) cost ``default``.
    """

    weights: dict[str, float] = field(default_factory=default_weights)
    default: float = 4.0

    def node_cost(self, op: str, args: tuple[Any, ...]) -> float:
        """Cost of one e-node, children excluded."""
        w = self.weights.get(op, self.default)
        if op == "Sum" and args and isinstance(args[0], int):
            return w * math.log2(max(args[0], 2)) + 1.0
        return w

    def term_cost(self, term: Term) -> float:
        """Cost of a whole term tree (shared sub-terms counted each time they occur)."""
        return self.node_cost(term.op, term.args) + sum(self.term_cost(c) for c in term.children)
