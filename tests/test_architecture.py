"""The package's house: the floors of ``docs/architecture.md`` and the imports that obey them.

The floors are data: the fenced ``floors`` block of ``docs/architecture.md`` lists them, top
floor first, one floor a line; a unit is a subpackage (``search``) or a top-level module
(``graph``; ``egraph_mirage`` is the package's own ``__init__``). A module may import only units
on floors below its own, or its own unit: units on one floor (siblings) import nothing of each
other, and nothing imports upward. Every import counts: ``import``/``from ... import`` at the
top, inside functions (lazy), under ``if TYPE_CHECKING:`` (annotations), and
``importlib.import_module`` / ``__import__`` calls (whose argument must then be a literal name,
so that it can be checked). Within the package no module imports another that imports it back,
in any of those ways.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import egraph_mirage

PACKAGE = Path(egraph_mirage.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
ROOT = "egraph_mirage"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for p in package.rglob("*.py"):
        parts = [ROOT, *p.relative_to(package).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _dynamic_target(node: ast.Call) -> str | None:
    """The module an ``import_module("...")`` or ``__import__("...")`` call names, "" for one
    that names it otherwise than by a literal (it cannot be checked), None for another call."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__"):
        return None
    if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value,
                                                                            str):
        return node.args[0].value
    return ""


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package modules it imports, in every way (module docstring); a
    ``from X import name`` points at ``X.name`` when that is a module, else at ``X``. A dynamic
    import of a name that is not a literal points at ``"?"``."""
    mods = _modules(package)
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m.split(".") if path.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                base = pkg[: len(pkg) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{name}.{alias.name}"
                    targets.append(sub if sub in mods else name)
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.Call) and (dyn := _dynamic_target(node)) is not None:
                if dyn.startswith("."):
                    level = len(dyn) - len(dyn.lstrip("."))
                    dyn = ".".join(pkg[: len(pkg) - level + 1] + [dyn.lstrip(".")])
                targets = [dyn or "?"]
            edges[m].update(t for t in targets if (t in mods or t == "?") and t != m)
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
                if w not in edges:
                    continue
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


def floors(text: str) -> dict[str, int]:
    """Unit -> floor (0: the ground floor) from the ``floors`` block of ``text``."""
    block = re.search(r"```floors\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```floors block"
    lines = [ln.split("#")[0].split() for ln in block.group(1).splitlines()]
    lines = [ln for ln in lines if ln]
    out: dict[str, int] = {}
    for level, units in enumerate(reversed(lines)):
        for u in units:
            assert u not in out, f"{u} is on two floors"
            out[u] = level
    return out


def unit(module: str) -> str:
    """The unit a module belongs to: its subpackage or top-level module (``egraph_mirage``
    for the package's ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def arrows_against(edges: dict[str, set[str]], floor_of: dict[str, int]) -> list[str]:
    """Every import that goes up or sideways (to a sibling on the same floor), or that cannot
    be checked, as ``module -> module (unit floor -> unit floor)``."""
    bad = []
    for m, targets in sorted(edges.items()):
        for t in sorted(targets):
            if t == "?":
                bad.append(f"{m} imports a module named at run time: give the name literally")
                continue
            a, b = unit(m), unit(t)
            if a != b and floor_of[b] >= floor_of[a]:
                how = "up" if floor_of[b] > floor_of[a] else "to a sibling"
                bad.append(f"{m} -> {t} ({how}: {a} on floor {floor_of[a]}, {b} on floor "
                           f"{floor_of[b]})")
    return bad


def test_every_unit_has_a_floor_and_every_import_points_down() -> None:
    edges = import_graph()
    floor_of = floors(ARCHITECTURE.read_text())
    units = {unit(m) for m in edges}
    assert units - set(floor_of) == set(), "units missing from docs/architecture.md's floors"
    assert set(floor_of) - units == set(), "floors name units the package does not have"
    bad = arrows_against(edges, floor_of)
    assert not bad, "imports against the floors:\n" + "\n".join(bad)


def test_the_import_graph_has_no_cycle() -> None:
    edges = import_graph()
    assert len(edges) > 50 and "egraph_mirage.ops.table" in edges["egraph_mirage.ops"]
    found = cycles(edges)
    detail = [{m: sorted(edges[m] & set(c)) for m in c} for c in found]
    assert not found, f"import cycles: {detail}"


def test_the_checker_sees_lazy_typing_only_and_dynamic_imports(tmp_path: Path) -> None:
    """The three ways an import hides from a reader of the top of a file all count."""
    pkg = tmp_path / ROOT
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text("")
    (pkg / "high.py").write_text("from .low import a\n")
    (pkg / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..high import x\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from .. import high\n")
    (pkg / "low" / "c.py").write_text(
        "import importlib\nM = importlib.import_module('egraph_mirage.high')\n"
        "N = importlib.import_module(name_from_somewhere)\n")
    edges = import_graph(pkg)
    assert edges[f"{ROOT}.low.a"] == {f"{ROOT}.high"}
    assert edges[f"{ROOT}.low.b"] == {f"{ROOT}.high"}
    assert edges[f"{ROOT}.low.c"] == {f"{ROOT}.high", "?"}
    assert cycles(edges) == [[f"{ROOT}.high", f"{ROOT}.low.a"]]
    floor_of = floors("```floors\nhigh\nlow\negraph_mirage\n```")
    bad = arrows_against(edges, floor_of)
    assert len(bad) == 4 and all("high" in b or "literally" in b for b in bad), bad
    assert arrows_against({f"{ROOT}.high": {f"{ROOT}.low.a"}}, floor_of) == []
    sideways = floors("```floors\nhigh low\negraph_mirage\n```")
    assert arrows_against({f"{ROOT}.high": {f"{ROOT}.low.a"}}, sideways) != []


def test_the_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_two_modules_share_a_basename() -> None:
    """A module's name says what it holds, in the whole package (``__init__`` aside)."""
    seen: dict[str, list[str]] = {}
    for m, path in _modules().items():
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(m)
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_no_deprecated_alias_or_shim_is_kept() -> None:
    """There has been no release: nothing is kept under an old name. No module warns of a
    deprecation or forwards unknown attributes (a module ``__getattr__``) except the package's
    lazy export of the torch front end (``em.from_torch``, ``em.torch_report``)."""
    found = []
    for m, path in sorted(_modules().items()):
        text = path.read_text()
        if "DeprecationWarning" in text or re.search(r"\bdeprecated\b", text, re.I):
            found.append(f"{m}: deprecated")
        if re.search(r"^def __getattr__", text, re.M) and m != ROOT:
            found.append(f"{m}: module __getattr__")
    assert not found, found
    with pytest.raises(AttributeError):
        _ = egraph_mirage.KernelGraph.to_json  # type: ignore[attr-defined]


def test_docs_name_the_pipeline_s_stages() -> None:
    """``docs/architecture.md`` names the pipeline's stages, in the pipeline's order."""
    from egraph_mirage.pipeline import STAGES

    names = [name for name, _ in STAGES]
    text = ARCHITECTURE.read_text()
    assert " → ".join(names) in text, names


def test_the_hand_written_mugraphs_are_no_api_and_the_search_names_no_program() -> None:
    """The hand-written μGraphs are fixtures of the tests and benchmarks
    (``bench.handwritten_fixtures``), not API; the search finds its μGraphs from the program
    alone: no module under ``search/`` mentions a benchmark program by name, comments included
    (whole words, any case)."""
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
