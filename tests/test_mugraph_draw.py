"""Drawing μGraphs (needs the Graphviz ``dot`` program, a declared test dependency)."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.mugraph.draw import mugraph_dot, mugraph_svg
from egraph_mirage.render import RenderError


def fused(name: str) -> em.KernelGraph:
    return fixtures.fused(name, em.benchmarks.get(name, small=True))


def kernels(g: em.KernelGraph) -> list:
    """The graph-defined kernels of ``g``, in order of first use."""
    seen: dict[int, object] = {}
    for t in g.operators:
        if t.op == "customized":
            seen.setdefault(id(t.params["kernel"]), t.params["kernel"])
    return list(seen.values())


def svg_text(svg: str) -> str:
    root = ET.fromstring(svg)  # raises on invalid XML
    assert root.tag.endswith("svg")
    texts = ("".join(e.itertext()) for e in root.iter() if e.tag.endswith("text"))
    return "\n".join(texts).replace("\xa0", " ")


def fmt(dims: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, dims)) + ")"


@pytest.mark.parametrize("name", em.benchmarks.names())
def test_every_handwritten_mugraph_draws(name: str) -> None:
    h = fused(name)
    text = svg_text(mugraph_svg(h))
    ks = kernels(h)
    assert ks, name
    for k, kern in enumerate(ks):
        tb = kern.tb
        assert f"kernel k{k}: graph-defined" in text
        assert f"grid_dim={fmt(tb.grid_dim)}" in text
        assert f"forloop_range={tb.forloop_range}" in text
        for t in tb.tensors:
            if t.op == "forloop_accum":
                assert f"b{t.index} accum {t.params['acc']}" in text
            elif t.op == "input":
                imap, fdim = t.params["input_map"], t.params["forloop_dim"]
                assert f"imap={fmt(imap)}, forloop_dim={fdim}" in text
        for _, omap in tb.outputs:
            assert f"omap={fmt(omap)}" in text
        if any(t.side == "loop" for t in tb.tensors):
            assert f"for i in range({tb.forloop_range}):" in text
        uses_dimx = any(t.params.get("acc") == "sum_todimx" for t in tb.tensors)
        if uses_dimx:
            assert f"reduction_dimx={tb.reduction_dimx}" in text
    assert ("reduction_dimx=" in text) == any(
        t.params.get("acc") == "sum_todimx" for kern in ks for t in kern.tb.tensors)
    for t in h.tensors:  # every device tensor: index, dims, dtype
        assert re.search(rf"\bt{t.index}\b", text)
        assert fmt(t.dims) in text
    assert "float16" in text and "epilogue" in text


def test_structure_of_the_dot_text() -> None:
    h = fused("gqa")
    dot = mugraph_dot(h)
    assert dot == mugraph_dot(fused("gqa"))  # deterministic: no object ids, stable order
    assert "0x" not in dot
    # two kernels, each a cluster; loaders fed by labelled edges, savers feed device tensors
    assert re.findall(r"subgraph (cluster_k\d+) \{", dot) == ["cluster_k0", "cluster_k1"]
    assert 't0 -> k0_b0 [label="imap=(0, -1, 1)\\nforloop_dim=-1"]' in dot
    assert 'k0_s0 -> t3 [label="omap=(0, 2, 1)"]' in dot
    assert 'k0_s1 -> t4 [label="omap=(0, 2, 1)"]' in dot
    assert 't3 -> k1_b0' in dot and 't4 -> k1_b1' in dot
    # sides: invariant loader in the dashed frame, loop body nested in the kernel, epilogue
    inv = dot.split("subgraph cluster_k0_invariant {", 1)[1].split("subgraph cluster_k0_loop", 1)[0]
    assert "k0_b0 [" in inv and "dashed" in inv
    loop = dot.split("subgraph cluster_k0_loop {", 1)[1].split("subgraph cluster_k0_epilogue", 1)[0]
    assert all(f"k0_b{i} [" in loop for i in (1, 2, 3, 4, 5))
    assert "for i in range(2):" in loop
    epi = dot.split("subgraph cluster_k0_epilogue {", 1)[1].split("k0_s0 [", 1)[0]
    assert "k0_b6 [" in epi and "k0_b7 [" in epi and "peripheries=2" in epi
    # the exp is a one-operator thread graph inside the loop; the div of kernel 2 one after it
    assert "cluster_k0_loop_thread0" in loop and "thread graph" in loop
    assert "cluster_k1_epilogue_thread0" in dot
    # operand order of the non-commutative matmul is marked
    assert re.search(r'k0_b0 -> k0_b3 \[headlabel="1"', dot)
    assert re.search(r'k0_b1 -> k0_b3 \[headlabel="2"', dot)


def test_library_operators_are_plain_boxes() -> None:
    h = fixtures.lora_concat(em.benchmarks.get("lora", small=True))
    dot = mugraph_dot(h)
    assert len(re.findall(r"subgraph cluster_k\d+ \{", dot)) == 2
    concats = re.findall(r"^\s+op\d+ \[label=<<b>concat</b>", dot, re.MULTILINE)
    assert len(concats) == 2
    g = em.benchmarks.get("qknorm", small=True)  # no graph-defined kernel at all
    text = svg_text(mugraph_svg(g))
    assert "kernel graph: 3 inputs, 0 graph-defined kernels, 7 library operators" in text
    assert "rms_norm" in text and "reduction" in text and "cluster" not in mugraph_dot(g)


def test_thread_chain_across_sides_is_split() -> None:
    g = em.new_kernel_graph()
    X, Y = g.new_input((2, 16)), g.new_input((2, 64))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=-1)
    y = tb.new_input(Y, (0, -1, -1), forloop_dim=1)
    a = tb.silu(tb.add(tb.mul_scalar(x, 0.5), tb.exp(y)))  # invariant -> loop chain
    tb.new_output(tb.div(tb.forloop_accum(a, "mean"), tb.forloop_accum(x, "sum")), (0, -1, -1))
    (O,) = g.customized([X, Y], tb)
    g.mark_output(O)
    dot = mugraph_dot(g)
    assert "thread graph, part 1 of 2" in dot and "thread graph, part 2 of 2" in dot
    inv = dot.split("subgraph cluster_k0_invariant {", 1)[1].split("subgraph cluster_k0_loop", 1)[0]
    assert "part 1 of 2" in inv and "k0_b2 [" in inv
    text = svg_text(mugraph_svg(g))
    assert "accum mean" in text and "accum sum" in text and "for i in range(4):" in text


def test_path_variant_and_to_svg(tmp_path: Path) -> None:
    h = fused("rmsnorm_linear")
    path = tmp_path / "mugraph.svg"
    svg = mugraph_svg(h, path=path)
    assert path.read_text(encoding="utf-8") == svg
    assert os.listdir(tmp_path) == ["mugraph.svg"]  # no temporary file left behind
    svg_text(path.read_text(encoding="utf-8"))
    other = fused("lora")
    assert em.to_svg(other, str(path)) == path.read_text(encoding="utf-8")  # replaces the file
    assert "accum plain" in svg_text(path.read_text(encoding="utf-8"))
    assert em.to_svg(h) == svg


def test_missing_dot_raises_render_error(no_dot: Path) -> None:
    h = fused("rmsnorm_linear")
    path = no_dot / "out.svg"
    with pytest.raises(RenderError, match="apt-get install graphviz") as info:
        mugraph_svg(h, path=path)
    assert isinstance(info.value, em.EMError)
    assert not path.exists() and os.listdir(no_dot) == []
    with pytest.raises(RenderError):
        em.to_svg(h)
    assert "digraph mugraph" in mugraph_dot(h)  # the DOT text needs no Graphviz


def test_not_a_graph() -> None:
    with pytest.raises(em.GraphError, match="expected a KernelGraph"):
        mugraph_dot("not a graph")
