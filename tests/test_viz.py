"""Drawing e-graphs and expressions (needs the Graphviz ``dot`` program, a declared test
dependency)."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import graphviz
import pytest

import egraph_mirage as em
from egraph_mirage.extract.snapshot import Snapshot
from egraph_mirage.viz import RenderError, egraph_dot, egraph_svg, expr_dot, expr_svg

ENODE_BOX = re.compile(r"^\s+n\d+_\d+ \[label=", re.MULTILINE)
CLUSTER = re.compile(r"^\s+subgraph cluster_(\d+) \{", re.MULTILINE)
#: number of term (Expr) arguments of each constructor of the generated prelude (oracle/prelude.py)
TERM_ARITY = {"Var": 0, "Num": 0, "Const": 0, "Sum": 1, "Rms": 1, "Exp": 1, "Sqrt": 1,
              "Square": 1, "Silu": 1, "Gelu": 1, "Relu": 1, "Add": 2, "Mul": 2, "Div": 2,
              "Concat": 2}


@pytest.fixture(scope="module")
def oracle() -> em.Oracle:
    return em.Oracle(em.benchmarks.get("rmsnorm_linear", small=True))


def svg_texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)  # raises on invalid XML
    assert root.tag.endswith("svg")
    return ["".join(e.itertext()) for e in root.iter() if e.tag.endswith("text")]


def test_svg_is_valid_xml_with_operator_labels(oracle: em.Oracle) -> None:
    texts = svg_texts(egraph_svg(oracle))
    joined = "\n".join(texts)
    assert "Rms 64" in texts and "Sum" in joined and 'Var "v0"' in texts
    assert "target e-class" in joined


def test_dot_has_one_box_per_enode_and_one_cluster_per_eclass(oracle: em.Oracle) -> None:
    dot = egraph_dot(oracle)
    snap = oracle.snapshot
    assert len(ENODE_BOX.findall(dot)) == snap.num_enodes
    assert sorted(int(c) for c in CLUSTER.findall(dot)) == sorted(snap.classes)
    edges = re.findall(r"^\s+n\d+_\d+ -> a(\d+)", dot, re.MULTILINE)
    assert len(edges) == sum(TERM_ARITY[op] for op, _ in snap.nodes)
    assert "compound=true" in dot and "not shown" not in dot and "truncated" not in dot


def test_edges_end_at_the_child_cluster(oracle: em.Oracle) -> None:
    dot = egraph_dot(oracle)
    for tail, head, attrs in re.findall(r"^\s+n(\d+)_\d+ -> a(\d+)(.*);$", dot, re.MULTILINE):
        if tail != head:
            assert f"lhead=cluster_{head}" in attrs


def test_literal_arguments_are_in_the_labels(oracle: em.Oracle) -> None:
    pattern = r'^\s+n\d+_\d+ \[label="((?:[^"\\]|\\.)*)"\]'
    labels = set(re.findall(pattern, egraph_dot(oracle), re.MULTILINE))
    assert {"Sum 64", "Sum 16", "Rms 64", "Num 64", 'Var \\"v0\\"', 'Var \\"v1\\"', "Mul",
            "Div"} <= labels


def test_roots_bold_and_reachable_green(oracle: em.Oracle) -> None:
    dot = egraph_dot(oracle)
    (root,) = oracle.snapshot.roots
    block = dot.split(f"subgraph cluster_{root} {{", 1)[1].split("}", 1)[0]
    assert "bold" in block and "penwidth=3" in block and "#d4f5d0" in block
    assert len(re.findall(r"style=\"filled,bold\"", dot)) == 1


def test_unreachable_classes_are_grey_and_snapshot_accepted() -> None:
    # a hand-made snapshot: class 2 is not reachable; "Sum 2" has literal 2, also a class id
    nodes = {("Var", ("v0",)): 0, ("Exp", (0,)): 1, ("Sum", (2, 1)): 3, ("Sqrt", (0,)): 2}
    classes: dict[int, tuple] = {}
    for key, c in nodes.items():
        classes.setdefault(c, ())
        classes[c] += (key,)
    snap = Snapshot(nodes=nodes, classes=classes, reachable=frozenset({0, 1, 3}), roots=(3,))
    dot = egraph_dot(snap)
    grey = dot.split("subgraph cluster_2 {", 1)[1].split("}", 1)[0]
    assert "#e4e4e4" in grey and "#d4f5d0" not in grey
    assert '[label="Sum 2"]' in dot  # the literal 2 is a label, not an edge to class 2
    assert len(re.findall(r"-> a\d+", dot)) == 3
    svg_texts(egraph_svg(snap))
    # without roots, truncation starts from the lowest class id
    rootless = Snapshot(nodes=nodes, classes=classes, reachable=snap.reachable)
    assert CLUSTER.findall(egraph_dot(rootless, max_classes=2)) == ["0", "1"]
    assert "filled,bold" not in egraph_dot(rootless)


def test_dot_is_deterministic(oracle: em.Oracle) -> None:
    snap = oracle.snapshot
    shuffled = Snapshot(nodes=dict(reversed(list(snap.nodes.items()))),
                        classes={c: tuple(reversed(ks))
                                 for c, ks in reversed(snap.classes.items())},
                        reachable=snap.reachable, roots=snap.roots,
                        **({"signatures": snap.signatures} if hasattr(snap, "signatures") else {}))
    assert egraph_dot(oracle) == egraph_dot(oracle) == egraph_dot(shuffled)
    assert egraph_dot(oracle, 10) == egraph_dot(shuffled, 10)


def test_truncation_keeps_classes_near_the_roots(oracle: em.Oracle) -> None:
    total = oracle.snapshot.num_eclasses
    dot = egraph_dot(oracle, max_classes=10)
    shown = {int(c) for c in CLUSTER.findall(dot)}
    assert len(shown) == 10 and set(oracle.snapshot.roots) <= shown
    assert f"showing 10 of {total} e-classes" in dot
    assert "not shown" in dot
    boxes = len(ENODE_BOX.findall(dot))
    assert boxes == sum(len(oracle.snapshot.classes[c]) for c in shown)
    texts = "\n".join(svg_texts(egraph_svg(oracle, max_classes=10)))
    assert f"showing 10 of {total} e-classes" in texts
    # direct children of the target come first in breadth-first order
    (root,) = oracle.snapshot.roots
    assert egraph_dot(oracle, max_classes=1).count("subgraph cluster_") == 1
    assert f"subgraph cluster_{root} " in egraph_dot(oracle, max_classes=1)
    assert "truncated" not in egraph_dot(oracle, max_classes=total)
    with pytest.raises(ValueError):
        egraph_dot(oracle, max_classes=0)


def test_path_variant_writes_the_file(oracle: em.Oracle, tmp_path: Path) -> None:
    path = tmp_path / "egraph.svg"
    svg = egraph_svg(oracle, path=path, max_classes=15)
    assert path.read_text(encoding="utf-8") == svg
    assert os.listdir(tmp_path) == ["egraph.svg"]  # no temporary file left behind
    svg_texts(path.read_text(encoding="utf-8"))
    egraph_svg(oracle, path=str(path))  # replaces an existing file
    assert len(ENODE_BOX.findall(egraph_dot(oracle))) == oracle.snapshot.num_enodes
    assert "truncated" not in path.read_text(encoding="utf-8")


def test_missing_dot_raises_render_error(oracle: em.Oracle, no_dot: Path) -> None:
    path = no_dot / "out.svg"
    with pytest.raises(RenderError, match="apt-get install graphviz") as info:
        egraph_svg(oracle, path=path)
    assert isinstance(info.value, em.EMError)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not path.exists() and os.listdir(no_dot) == []
    with pytest.raises(RenderError, match="graphviz"):
        expr_svg(oracle.targets[0])


def test_render_call_raising_executable_not_found(oracle: em.Oracle,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*args: object, **kwargs: object) -> None:
        raise graphviz.ExecutableNotFound(("dot", "-Tsvg"))

    monkeypatch.setattr(graphviz.Source, "pipe", missing)
    with pytest.raises(RenderError, match="install"):
        egraph_svg(oracle, max_classes=3)


def test_expr_tree() -> None:
    term = em.parse('(Sum 64 (Mul (Div (Var "v0") (Rms 64 (Var "v0"))) (Var "v1")))')
    dot = expr_dot(term)
    assert len(re.findall(r"^\s+t\d+ \[label=", dot, re.MULTILINE)) == term.size() == 7
    assert len(re.findall(r"^\s+t\d+ -> t\d+;", dot, re.MULTILINE)) == term.size() - 1
    assert dot == expr_dot(term.to_sexpr())
    texts = svg_texts(expr_svg(term))
    assert {"Sum 64", "Mul", "Div", "Rms 64", 'Var "v0"', 'Var "v1"'} <= set(texts)
    assert texts.count('Var "v0"') == 2  # drawn as a tree: shared sub-terms repeat


def test_expr_tree_of_the_benchmark_target(oracle: em.Oracle) -> None:
    svg = expr_svg(em.abstract_term(oracle.target.outputs[0]))
    assert "Rms 64" in svg_texts(svg)
