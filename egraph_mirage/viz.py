"""Drawing e-graphs and abstract expressions with Graphviz.

``egraph_dot(oracle)`` turns the oracle's frozen ``Snapshot`` into DOT text: one cluster per
e-class, one box per e-node (its operator and literal arguments, e.g. ``Sum 64``), and an edge
from every e-node to the e-class of each of its term arguments. Reachable e-classes are light
green, the target's e-classes have a bold border, other e-classes are grey. ``egraph_svg`` and
``expr_svg`` render with the ``dot`` program (``apt-get install graphviz``); a missing ``dot``
is a ``RenderError``.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .expr import Term, parse
from .files import write_atomic
from .render import RenderError, svg_of_dot

__all__ = ["RenderError", "egraph_dot", "egraph_svg", "expr_dot", "expr_svg"]

#: fill colours of e-classes
REACHABLE_FILL = "#d4f5d0"
UNREACHABLE_FILL = "#e4e4e4"
#: operators whose term arguments may be swapped (their edges carry no position label)
_COMMUTATIVE = frozenset({"Add", "Mul"})
_FONT = "Helvetica"


# --- helpers --------------------------------------------------------------------------------

def _q(text: str) -> str:
    """A DOT double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _literal_text(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _sort_key(key: tuple[str, tuple[Any, ...]]) -> tuple[Any, ...]:
    op, kids = key
    return (op, len(kids), tuple((isinstance(k, str), k) for k in kids))


_CTOR = re.compile(r"\(\s*([A-Za-z_][\w-]*)((?:\s+[A-Za-z_][\w-]*)*)\s*\)")
_DECL = re.compile(r"\(\s*constructor\s+(\S+)\s+\(([^()]*)\)\s+Expr\b")


def _signatures_from_rules(paths: Iterable[str | Path]) -> dict[str, tuple[str, ...]]:
    """Constructor signatures declared for ``Expr`` in rule files (datatype or constructor form)."""
    from .oracle.rules import rule_files, split_forms  # local: keeps viz importable on its own

    sigs: dict[str, tuple[str, ...]] = {}
    for f in rule_files(paths):
        for form in split_forms(f.read_text(), str(f)):
            text = re.sub(r";[^\n]*", "", form.text)
            if re.match(r"\(\s*datatype\s+Expr\b", text):
                body = text.split("Expr", 1)[1]
                sigs.update((m[1], tuple(m[2].split())) for m in _CTOR.finditer(body))
            sigs.update((m[1], tuple(m[2].split())) for m in _DECL.finditer(text))
    return sigs


def _signatures(oracle: Any, snap: Any) -> dict[str, tuple[bool, ...]]:
    """Which argument positions of each operator hold e-classes: from the snapshot, else from the
    oracle's live e-graph, else from its rule files."""
    sigs: dict[str, tuple[bool, ...]] = dict(getattr(snap, "signatures", None) or {})
    if {op for op, _ in snap.nodes} <= sigs.keys():
        return sigs
    egraph = getattr(oracle, "_egraph", None)
    try:
        found = {n: tuple(s == "Expr" for s in f.input_sorts)
                 for n, f in egraph.freeze().functions.items() if f.output_sort == "Expr"}
    except (AttributeError, TypeError):  # no live e-graph (a bare Snapshot), or older egglog
        from .ops import term_constructors
        from .oracle.rules import DEFAULT_RULES_DIR

        paths = getattr(oracle, "rule_paths", None) or [DEFAULT_RULES_DIR]
        declared = {n: c.sorts for n, c in term_constructors().items()}
        found = {n: tuple(s == "Expr" for s in ss)
                 for n, ss in {**declared, **_signatures_from_rules(paths)}.items()}
    return {**found, **sigs}


def _child_classes(key: tuple[str, tuple[Any, ...]], sigs: dict[str, tuple[bool, ...]],
                   classes: dict[int, Any]) -> tuple[list[tuple[int, int]], list[Any]]:
    """Split an e-node's children into ``(position, e-class)`` pairs and literal arguments."""
    op, kids = key
    sig = sigs.get(op)
    edges, literals = [], []
    for i, k in enumerate(kids):
        is_class = sig[i] if sig is not None and i < len(sig) else (
            isinstance(k, int) and k in classes)
        if is_class:
            edges.append((i, k))
        else:
            literals.append(k)
    return edges, literals


def _node_label(op: str, literals: Sequence[Any]) -> str:
    return " ".join([op, *(_literal_text(v) for v in literals)])


# --- e-graphs -------------------------------------------------------------------------------

def _bfs(roots: Sequence[int], children: dict[int, list[int]], limit: int) -> list[int]:
    """The first ``limit`` classes in breadth-first order from the roots; classes the roots do not
    lead to follow in id order (a snapshot without roots starts from the lowest id)."""
    seen: dict[int, None] = {}
    queue = deque(r for r in roots if r in children)
    rest = iter(sorted(children))
    while len(seen) < limit:
        if not queue:
            nxt = next((c for c in rest if c not in seen), None)
            if nxt is None:
                break
            queue.append(nxt)
        c = queue.popleft()
        if c in seen:
            continue
        seen[c] = None
        queue.extend(k for k in children[c] if k not in seen)
    return list(seen)


def egraph_dot(oracle: Any, max_classes: int | None = None) -> str:
    """Graphviz DOT text of ``oracle.snapshot`` (an ``Oracle``, or a ``Snapshot`` itself).

    With ``max_classes`` only the first that many e-classes in breadth-first order from the targets
    are drawn, and the graph label says so.
    """
    snap = getattr(oracle, "snapshot", oracle)
    if max_classes is not None and (not isinstance(max_classes, int) or max_classes < 1):
        raise ValueError(f"egraph_dot: max_classes must be a positive integer, got {max_classes!r}")
    sigs = _signatures(oracle, snap)
    classes: dict[int, tuple] = snap.classes
    nodes = {c: sorted(ks, key=_sort_key) for c, ks in classes.items()}
    split = {k: _child_classes(k, sigs, classes) for ks in nodes.values() for k in ks}
    children = {c: [k for key in ks for _, k in split[key][0]] for c, ks in nodes.items()}
    total = len(classes)
    if max_classes is None or max_classes >= total:
        shown = sorted(classes)
    else:
        shown = sorted(_bfs(sorted(snap.roots), children, max_classes))
    kept = set(shown)
    roots, reach = set(snap.roots), snap.reachable

    n_nodes = sum(len(nodes[c]) for c in shown)
    label = (f"e-graph: {total} e-classes, {snap.num_enodes} e-nodes, {len(reach)} reachable"
             " (green); targets have a bold border")
    if len(shown) < total:
        label += f"\\ntruncated: showing {len(shown)} of {total} e-classes ({n_nodes} e-nodes)"
    out = ["digraph egraph {",
           "  compound=true; newrank=true; rankdir=LR; nodesep=0.12; ranksep=0.6;",
           f"  graph [fontname={_q(_FONT)}, fontsize=12, labelloc=t, label=\"{label}\"];",
           (f"  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname={_q(_FONT)},"
            " fontsize=10, height=0.25, margin=\"0.06,0.03\"];"),
           "  edge [arrowsize=0.5, color=\"#555555\", fontsize=8];"]
    for c in shown:
        fill = REACHABLE_FILL if c in reach else UNREACHABLE_FILL
        style = "filled,bold" if c in roots else "filled"
        what = "target e-class" if c in roots else "e-class"
        out.append(f"  subgraph cluster_{c} {{")
        out.append(f"    label={_q(f'{what} {c}')}; style={_q(style)}; fillcolor={_q(fill)};"
                   f" color={_q('black' if c in roots else '#888888')};"
                   f" penwidth={3 if c in roots else 1}; fontsize=10;")
        out.append(f"    a{c} [shape=point, style=invis, width=0.01, height=0.01, label=\"\"];")
        for i, key in enumerate(nodes[c]):
            out.append(f"    n{c}_{i} [label={_q(_node_label(key[0], split[key][1]))}];")
        same = "; ".join([f"a{c}", *(f"n{c}_{i}" for i in range(len(nodes[c])))])
        out.append(f"    {{rank=same; {same};}}")  # one column per e-class
        out.append("  }")
    hidden: set[int] = set()
    for c in shown:
        for i, key in enumerate(nodes[c]):
            edges = split[key][0]
            numbered = len(edges) > 1 and key[0] not in _COMMUTATIVE
            for pos, (_, k) in enumerate(edges):
                attrs = [f"taillabel=\"{pos + 1}\""] if numbered else []
                if k not in kept:
                    hidden.add(k)
                    out.append(f"  n{c}_{i} -> h{k} [{', '.join([*attrs, 'style=dashed'])}];")
                    continue
                if k != c:  # an edge into its own cluster cannot end at the border
                    attrs.append(f"lhead=cluster_{k}")
                out.append(f"  n{c}_{i} -> a{k}" + (f" [{', '.join(attrs)}]" if attrs else "")
                           + ";")
    for k in sorted(hidden):
        out.append(f"  h{k} [shape=plaintext, style=\"\", fontcolor=\"#777777\","
                   f" label={_q(f'e-class {k} (not shown)')}];")
    out.append("}")
    return "\n".join(out) + "\n"


# --- rendering ------------------------------------------------------------------------------

def egraph_svg(oracle: Any, path: str | Path | None = None,
               max_classes: int | None = None) -> str:
    """SVG text of the e-graph drawing (see ``egraph_dot``); also written to ``path`` if given."""
    svg = svg_of_dot(egraph_dot(oracle, max_classes))
    if path is not None:
        write_atomic(path, svg)
    return svg


# --- abstract expressions -------------------------------------------------------------------

def expr_dot(term: Term | str) -> str:
    """Graphviz DOT text drawing one abstract expression as a tree (arguments left to right)."""
    if isinstance(term, str):
        term = parse(term)
    if not isinstance(term, Term):
        raise TypeError(f"expr_dot: expected a Term or an s-expression, got {type(term).__name__}")
    out = ["digraph expr {", "  ordering=out; nodesep=0.2; ranksep=0.35;",
           (f"  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef3ff\","
            f" fontname={_q(_FONT)}, fontsize=11, height=0.3];"),
           "  edge [arrowsize=0.5, color=\"#555555\"];"]
    counter = 0
    stack: list[tuple[Term, int | None]] = [(term, None)]
    while stack:  # pre-order, explicit stack so deep terms do not hit the recursion limit
        t, parent = stack.pop()
        me = counter
        counter += 1
        literals = [a for a in t.args if not isinstance(a, Term)]
        fill = ', fillcolor="#fff3d6"' if t.op == "Var" else ""
        out.append(f"  t{me} [label={_q(_node_label(t.op, literals))}{fill}];")
        if parent is not None:
            out.append(f"  t{parent} -> t{me};")
        stack.extend((c, me) for c in reversed(t.children))
    out.append("}")
    return "\n".join(out) + "\n"


def expr_svg(term: Term | str) -> str:
    """SVG text of ``expr_dot(term)``: the expression drawn as a tree."""
    return svg_of_dot(expr_dot(term))
