"""A frozen, picklable copy of a saturated e-graph: plain dicts keyed by e-node.

An e-node key is ``(op, children)`` where each child is an e-class id (``int``) in term positions
and the literal value (``int`` for i64, ``str`` for String) in primitive positions; an operator's
signature fixes which positions are which, so the key is unambiguous.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

NodeKey = tuple[str, tuple[Any, ...]]

#: The sort of abstract expressions, as declared by ``oracle/prelude.py``.
TERM_SORT = "Expr"
#: The relation that marks reachable e-classes, as declared by ``oracle/prelude.py``.
REACH = "Reach"


@dataclass(frozen=True)
class Snapshot:
    """Saturated e-graph of a target: e-nodes, e-classes and the reachable classes."""

    #: e-node -> e-class id
    nodes: dict[NodeKey, int]
    #: e-class id -> its e-nodes
    classes: dict[int, tuple[NodeKey, ...]]
    #: e-classes for which (Reach c) was derived
    reachable: frozenset[int]
    #: e-class of each target (output), in output order
    roots: tuple[int, ...] = field(default=())
    #: operator -> which argument positions hold e-classes (True) rather than literals
    signatures: dict[str, tuple[bool, ...]] = field(default_factory=dict)

    @property
    def num_enodes(self) -> int:
        return len(self.nodes)

    @property
    def num_eclasses(self) -> int:
        return len(self.classes)


def _literal(op: str, eclass: str) -> Any:
    sort = eclass.rsplit("-", 1)[0]
    if sort == "i64":
        return int(op)
    if sort == "String":
        return json.loads(op) if op.startswith('"') else op
    return op


def from_serialized(text: str, root_keys: list[Any] | None = None) -> Snapshot:
    """Build a snapshot from egglog's serialized JSON (the egraph-serialize format)."""
    data = json.loads(text)
    raw_nodes: dict[str, dict[str, Any]] = data["nodes"]
    class_ids: dict[str, int] = {}

    def cid(eclass: str) -> int:
        if eclass not in class_ids:
            class_ids[eclass] = len(class_ids)
        return class_ids[eclass]

    def child(node_id: str) -> Any:
        node = raw_nodes[node_id]
        if node_id.startswith("primitive"):
            return _literal(node["op"], node["eclass"])
        return cid(node["eclass"])

    nodes: dict[NodeKey, int] = {}
    classes: dict[int, list[NodeKey]] = {}
    reachable: set[int] = set()
    signatures: dict[str, tuple[bool, ...]] = {}
    for node_id, node in raw_nodes.items():
        if node_id.startswith("primitive") or node["op"].startswith("$"):
            continue
        op = node["op"]
        if op == REACH:
            reachable.add(cid(raw_nodes[node["children"][0]]["eclass"]))
            continue
        if node["eclass"].rsplit("-", 1)[0] != TERM_SORT:
            continue  # other relations and functions
        key = (op, tuple(child(c) for c in node["children"]))
        signatures.setdefault(op, tuple(not c.startswith("primitive") for c in node["children"]))
        c = cid(node["eclass"])
        nodes[key] = c
        classes.setdefault(c, []).append(key)
    return Snapshot(nodes, {c: tuple(ks) for c, ks in classes.items()}, frozenset(reachable),
                    signatures=signatures)
