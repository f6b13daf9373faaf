"""The package's stages import one way: the import graph of ``egraph_mirage`` has no cycle.

Every ``import`` and ``from ... import`` in every module counts, also those inside functions
(a lazy import is still a dependency); only imports under ``if TYPE_CHECKING:`` (annotations,
never run) are left out. A package's ``__init__`` counts as a module of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import egraph_mirage

PACKAGE = Path(egraph_mirage.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = ["egraph_mirage", *p.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:``."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        out.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from X import name`` points at ``X.name``
    when that is a module, else at ``X``)."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        package = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{name}.{alias.name}"
                    targets.append(sub if sub in mods else name)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            edges[m].update(t for t in targets if t in mods and t != m)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_the_import_graph_has_no_cycle() -> None:
    edges = import_graph()
    assert len(edges) > 50 and "egraph_mirage.ops.table" in edges["egraph_mirage.ops"]
    found = cycles(edges)
    detail = [{m: sorted(edges[m] & set(c)) for m in c} for c in found]
    assert not found, f"import cycles: {detail}"


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_program_imports_no_later_stage() -> None:
    """``graph.py`` (the program) and the op table sit below every stage."""
    edges = import_graph()
    later = ("egraph_mirage.mugraph", "egraph_mirage.oracle", "egraph_mirage.search",
             "egraph_mirage.verify", "egraph_mirage.lower", "egraph_mirage.gpu",
             "egraph_mirage.extract")
    for m in ("egraph_mirage.graph", "egraph_mirage.ops.table", "egraph_mirage.ops.field_ops"):
        assert not {e for e in edges[m] if e.startswith(later)}, m


def test_moved_and_renamed_names_keep_a_deprecated_alias(tmp_path: Path) -> None:
    """The methods that moved to the free functions of ``egraph_mirage.api``, and
    ``GraphKernel``, still work for one release, with a ``DeprecationWarning``."""
    import pytest

    import egraph_mirage as em
    from egraph_mirage import mugraph
    from egraph_mirage.bench import handwritten_fixtures as fixtures

    g = em.benchmarks.get("rmsnorm_linear", small=True)
    h = fixtures.fused("rmsnorm_linear", g)
    with pytest.warns(DeprecationWarning, match="em.to_json"):
        assert h.to_json() == em.to_json(h)
    with pytest.warns(DeprecationWarning, match="em.save"):
        h.save(tmp_path / "h.json")
    assert em.load(tmp_path / "h.json").operators[0].op == h.operators[0].op
    with pytest.warns(DeprecationWarning, match="GraphDefinedKernel"):
        assert mugraph.GraphKernel is mugraph.GraphDefinedKernel


def test_the_hand_written_mugraphs_are_no_api_and_the_search_names_no_program() -> None:
    """The hand-written μGraphs are a benchmark's reference (``bench.reference``), not API;
    the search finds its μGraphs from the program alone: no module under ``search/`` mentions
    a benchmark program by name, comments included (whole words, any case)."""
    import re

    from egraph_mirage import benchmarks

    assert not hasattr(egraph_mirage, "handwritten")
    assert "handwritten" not in egraph_mirage.__all__
    word = re.compile(r"\b(" + "|".join(map(re.escape, benchmarks.names())) + r")\b",
                      re.IGNORECASE)
    files = sorted((PACKAGE / "search").rglob("*.py"))
    assert len(files) > 5
    found = [f"{p.relative_to(PACKAGE)}:{n}: {m.group(0)}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1)
             for m in word.finditer(line)]
    assert not found, found
    assert word.search("# tuned for RMSNorm_Linear here") and not word.search("lorax, mqa2")
