"""Partitioning whole models into pieces for the search (``egraph_mirage.fx.pieces``): the
rewritten module matches eager, has no cycle, keeps the caps, and leaves unsupported operators
outside the pieces."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from egraph_mirage.errors import GraphError  # noqa: E402
from egraph_mirage.fx import partition, trace_fx  # noqa: E402
from egraph_mirage.fx.trace import export_aten  # noqa: E402
from egraph_mirage.mugraph.serialize import dumps  # noqa: E402

#: aten operators that are a matmul, and that reduce (softmax twice), counted from the pieces
MATMULS = {"aten.mm.default", "aten.bmm.default", "aten.matmul.default", "aten.linear.default",
           "aten.addmm.default"}
REDUCTIONS = {"aten.sum.dim_IntList": 1, "aten.mean.dim": 1, "aten.amax.default": 1,
              "aten.rms_norm.default": 1, "aten.softmax.int": 2, "aten._softmax.default": 2}
UNSUPPORTED = {"aten.cumsum.default", "aten.sort.default"}


class Block(torch.nn.Module):
    """A small decoder block with grouped-query attention, and two operators no op-table entry
    computes (a running sum and a sort)."""

    def __init__(self, d: int = 16, heads: int = 4, kv: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.kv, self.dh = heads, kv, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, kv * self.dh, bias=False)
        self.v = torch.nn.Linear(d, kv * self.dh, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.up, self.down = torch.nn.Linear(d, 32), torch.nn.Linear(32, d)
        self.n1, self.n2 = torch.nn.Parameter(torch.rand(d) + 0.5), torch.nn.Parameter(
            torch.rand(d) + 0.5)

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        y = F.rms_norm(x, (d,), self.n1, 1e-6)
        q = self.q(y).view(b, t, self.heads, self.dh).transpose(1, 2)
        k = self.k(y).view(b, t, self.kv, self.dh).transpose(1, 2)
        v = self.v(y).view(b, t, self.kv, self.dh).transpose(1, 2)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) / self.dh ** 0.5, -1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        z = self.down(F.silu(self.up(F.rms_norm(x, (d,), self.n2, 1e-6))))
        z = torch.cumsum(z, 1)
        return torch.sort(x + z, -1).values.exp()


@pytest.fixture(scope="module")
def block() -> tuple[Any, Any, Any]:
    model, x = Block().eval(), torch.randn(2, 5, 16)
    return model, x, export_aten(model, (x,))


def _targets(module: Any) -> list[str]:
    return [str(n.target) for n in module.graph.nodes if n.op == "call_function"]


def _output_cones(module: Any) -> list[set[Any]]:
    """Each output of a piece's module with its ancestors there."""
    out = next(n for n in module.graph.nodes if n.op == "output")
    cones = []
    for root in out.all_input_nodes:
        cone, todo = set(), [root]
        while todo:
            n = todo.pop()
            if n not in cone:
                cone.add(n)
                todo.extend(n.all_input_nodes)
        cones.append(cone)
    return cones


def _check(parts: Any, run: Any, xs: tuple[Any, ...], caps: tuple[int, int]) -> None:
    """The rewritten module matches eager; no cycle; caps; unsupported operators outside; every
    piece traces and its kernel graph matches the piece."""
    graph = parts.module.graph
    graph.lint()  # every node's inputs come before it: no cycle
    seen: set[Any] = set()
    for node in graph.nodes:
        assert all(a in seen for a in node.all_input_nodes)
        seen.add(node)
    with torch.no_grad():
        torch.testing.assert_close(parts.module(*xs), run(*xs))
    for piece in parts.pieces:
        targets = _targets(piece.module)
        matmuls = sum(t in MATMULS for t in targets)
        reductions = sum(REDUCTIONS.get(t, 0) for t in targets)
        assert (matmuls, reductions) == (piece.matmuls, piece.reductions)
        for cone in _output_cones(piece.module):  # the caps bound what one search takes
            assert sum(str(n.target) in MATMULS for n in cone) <= caps[0]
            assert sum(REDUCTIONS.get(str(n.target), 0) for n in cone) <= caps[1]
        assert not UNSUPPORTED & set(targets)
        assert f"call_module[target={piece.name}]" in str(graph) and piece.name.startswith("egm_")
        traced = trace_fx(piece.module, piece.example_inputs)
        with torch.no_grad():
            want = piece.module(*piece.example_inputs)
        for w, g in zip(want, traced.reference(*piece.example_inputs)):
            tol = (1e-4, 1e-5) if w.dtype == torch.float32 else (2e-3, 2e-3)  # an ulp of fp16
            torch.testing.assert_close(g, w, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("caps", [(4, 4), (2, 2), (1, 2)])
def test_a_decoder_block_is_cut_within_the_caps_and_still_matches_eager(
        block: Any, caps: tuple[int, int]) -> None:
    model, x, gm = block
    parts = partition(gm, (x,), max_matmuls=caps[0], max_reductions=caps[1])
    _check(parts, model, (x,), caps)
    matmuls = sum(p.matmuls for p in parts.pieces)
    assert matmuls == 8  # the six projections and both attention products are in pieces
    assert "a view of a computed value" in parts.left_out["transpose"]
    assert parts.left_out["cumsum"] == "no op-table operator computes it"
    assert UNSUPPORTED <= set(_targets(parts.module))
    attention = next(p for p in parts.pieces if "softmax" in p.nodes)
    together = {"repeat_interleave", "matmul"} | ({"matmul_1"} if caps[0] >= 2 else set())
    assert together <= set(attention.nodes)  # the K/V views folded into the attention piece


def test_the_caller_s_graph_module_is_not_changed(block: Any) -> None:
    _, x, gm = block
    before = str(gm.graph)
    partition(gm, (x,))
    assert str(gm.graph) == before


def test_a_torch_level_graph_is_brought_to_aten_first() -> None:
    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            h = torch.softmax(self.lin(x), -1) * x
            return torch.cumsum(h, -1) @ self.lin.weight

    model, x = Mixed(), torch.randn(3, 8)
    gm = torch.fx.symbolic_trace(model)
    assert any(n.op == "call_module" for n in gm.graph.nodes)
    parts = partition(gm, (x,))
    _check(parts, model, (x,), (4, 4))
    assert len(parts.pieces) == 2


def test_a_module_or_a_function_is_exported_first(block: Any) -> None:
    model, x, gm = block
    from_module = partition(model, (x,))
    _check(from_module, model, (x,), (4, 4))
    assert [p.nodes for p in from_module.pieces] == [p.nodes for p in partition(gm, (x,)).pieces]

    def f(x: Any, w: Any) -> Any:
        return torch.cumsum(torch.relu(x @ w) * 2, -1)

    xs = (torch.randn(3, 8), torch.randn(8, 4))
    parts = partition(f, xs)
    _check(parts, f, xs, (4, 4))
    assert len(parts.pieces) == 1 and "cumsum" in parts.left_out


def test_a_chain_of_matmuls_is_split_to_the_cap() -> None:
    def chain(x: Any, *ws: Any) -> Any:
        for w in ws:
            x = torch.relu(x @ w)
        return x

    xs = (torch.randn(4, 8), *(torch.randn(8, 8) / 3 for _ in range(6)))
    gm = export_aten(chain, xs)
    parts = partition(gm, xs, max_matmuls=2)
    _check(parts, chain, xs, (2, 4))
    assert [p.matmuls for p in parts.pieces] == [2, 2, 2]


def test_lone_element_wise_pieces_and_nodes_over_the_caps_run_as_is() -> None:
    def f(x: Any) -> Any:
        y = torch.sort(x, -1).values
        y = torch.sort(torch.relu(y), -1).values  # a lone relu between two sorts
        return torch.softmax(y, -1)  # two reductions: over a cap of one

    x = torch.randn(3, 8)
    gm = export_aten(f, (x,))
    parts = partition(gm, (x,), max_reductions=1)
    _check(parts, f, (x,), (4, 1))
    assert parts.pieces == ()
    assert "not kept" in parts.left_out["relu"]
    assert "over the caps" in parts.left_out["softmax"]


def test_negative_caps_are_refused(block: Any) -> None:
    _, x, gm = block
    with pytest.raises(GraphError, match="caps"):
        partition(gm, (x,), max_matmuls=-1)


def _outputs(piece: Any) -> int:
    return len(next(n for n in piece.module.graph.nodes if n.op == "output").args[0])


def test_a_shared_producer_is_computed_once_in_a_piece_of_several_outputs() -> None:
    """An RMSNorm feeding three projections: one piece with three outputs, the norm computed
    once (the pipeline searches the outputs one at a time and joins the winners); a shared
    matmul is never copied either."""
    g = torch.rand(16) + 0.5

    def qkv(x: Any, wq: Any, wk: Any, wv: Any) -> Any:
        h = F.rms_norm(x, (16,), g, 1e-6)
        return h @ wq, (h @ wk).exp(), h @ wv

    xs = (torch.randn(4, 16), torch.randn(16, 8), torch.randn(16, 8), torch.randn(16, 8))
    parts = partition(qkv, xs)
    _check(parts, qkv, xs, (2, 2))
    (piece,) = parts.pieces
    assert _outputs(piece) == 3 and (piece.matmuls, piece.reductions) == (3, 1)
    assert _targets(piece.module).count("aten.rms_norm.default") == 1
    assert len(trace_fx(piece.module, piece.example_inputs).graph.outputs) == 3
    assert "aten.rms_norm.default" not in _targets(parts.module)

    def shared_matmul(x: Any, w: Any) -> Any:
        y = x @ w
        return y.exp(), y.sum(-1, keepdim=True)

    xs2 = (torch.randn(4, 16), torch.randn(16, 8))
    parts = partition(shared_matmul, xs2)
    _check(parts, shared_matmul, xs2, (4, 4))
    # the matmul is computed once, in one piece with what reads it: two outputs
    (piece,) = parts.pieces
    assert piece.nodes == ("matmul", "exp", "sum_1") and _outputs(piece) == 2


def test_a_norm_of_a_projections_output_starts_the_next_piece_so_identical_layers_are_one_program(
        ) -> None:
    """Two layers in float16 (transformers' RMSNorm in float32, cast back; q, k and v
    projections; an output projection and the residual add; a gated MLP): the second layer's
    first norm reads the first layer's down projection, over all its outputs. No kernel fuses
    across that (the norm needs every block's part of the projection), so even within the caps
    the norm starts a new piece with the projections it feeds, and the second layer's piece is
    the same program as the first's, which the search then takes once (the backend's cache).
    Fails where the caps alone cut: the down projection and its residual add join the next
    layer's norm and projections (two matmuls in each output's cone)."""
    torch.manual_seed(0)
    d, f, h16 = 16, 32, torch.float16

    def w(*shape: int) -> Any:
        return (torch.randn(*shape) / shape[0] ** 0.5).to(h16)

    ws = [(w(d) + 1, w(d, d), w(d, 8), w(d, 8), w(d, d), w(d) + 1, w(d, f), w(d, f), w(f, d))
          for _ in range(2)]

    def norm(x: Any, g: Any) -> Any:
        h = x.float()
        return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * g

    def layers(x: Any) -> Any:
        outs = []
        for g1, wq, wk, wv, wo, g2, wg, wu, wd in ws:
            h = norm(x, g1)
            q, k, v = h @ wq, (h @ wk).exp(), h @ wv
            outs += [k, v]
            x = x + q @ wo
            h = norm(x, g2)
            x = x + (F.silu(h @ wg) * (h @ wu)) @ wd
        return (*outs, x)

    xs = (torch.randn(1, d).to(h16),)
    parts = partition(layers, xs)
    _check(parts, layers, xs, (2, 4))
    # per layer: the norm, q, k, v and the output projection with its add (no attention
    # between them here); the second norm with the gated MLP; the down projection with its add
    assert [(p.matmuls, p.reductions) for p in parts.pieces] == [(4, 1), (2, 1), (1, 0)] * 2
    qkv = [p for p in parts.pieces if p.matmuls == 4]
    assert all(p.nodes[0].startswith("_to_copy") for p in qkv)  # the norm's cast comes first
    first, second = (trace_fx(p.module, p.example_inputs).graph for p in qkv)
    assert dumps(first) == dumps(second)


def test_no_node_of_the_decoder_block_is_computed_twice_within_the_caps(block: Any) -> None:
    """Cones that share a node are one piece; each output's cone keeps the caps (``_check``)."""
    model, x, gm = block
    parts = partition(gm, (x,))
    _check(parts, model, (x,), (2, 4))
    names = [n for p in parts.pieces for n in p.nodes]
    assert len(names) == len(set(names))
    assert not any("rms_norm" in n for n in names if n.count("_") > 2)  # no copies


def _gated(x: Any, r: Any, g: Any, wg: Any, wu: Any) -> Any:
    h = F.rms_norm(x + r, (x.shape[-1],), g, 1e-5)
    return F.silu(h @ wg) * (h @ wu)


def test_levels_cut_a_piece_at_its_matmuls_inputs() -> None:
    """A residual add and RMSNorm before a gated MLP's two projections: one piece by default;
    with ``levels`` (what the backend does when the search finds nothing for it whole), the
    norm is a piece and the projections with their SiLU·mul another, which takes the norm's
    output as its input."""
    xs = (torch.randn(2, 16), torch.randn(2, 16), torch.rand(16) + 0.5, torch.randn(16, 32),
          torch.randn(16, 32))
    (whole,) = partition(_gated, xs).pieces
    assert (whole.matmuls, whole.reductions) == (2, 1)
    parts = partition(_gated, xs, levels=True)
    _check(parts, _gated, xs, (2, 4))
    norm, mlp = parts.pieces
    assert (norm.matmuls, norm.reductions) == (0, 1) and (mlp.matmuls, mlp.reductions) == (2, 0)
    assert "add" in norm.nodes and not {"add", "rms_norm"} & set(mlp.nodes)
    assert all(_outputs(p) == 1 for p in parts.pieces)
    # a matmul of a matmul's output is a level further: the norm, then one part per matmul
    def chain(x: Any, w1: Any, w2: Any) -> Any:
        return F.rms_norm(x, (16,)) @ w1 @ w2

    xs2 = (torch.randn(2, 16), torch.randn(16, 16), torch.randn(16, 16))
    assert len(partition(chain, xs2).pieces) == 1
    parts = partition(chain, xs2, levels=True)
    _check(parts, chain, xs2, (2, 4))
    assert [(p.matmuls, p.reductions) for p in parts.pieces] == [(0, 1), (1, 0), (1, 0)]


def _projection_rope(x: Any, w: Any, cos: Any, sin: Any) -> Any:
    q = (x @ w).view(1, 1, 4, 16).transpose(1, 2)
    rotated = torch.cat((-q[..., 8:], q[..., :8]), dim=-1)
    return q * cos + rotated * sin


def test_epilogue_levels_cut_a_matmul_from_what_follows_it() -> None:
    """A projection and its RoPE rotation: one piece by default and with ``levels`` (one
    level of matmuls); with ``levels=EPILOGUES`` (what the backend does when the search finds
    nothing for that either) the projection and the rotation are parts of their own."""
    from egraph_mirage.fx.pieces import EPILOGUES

    xs = (torch.randn(1, 64), torch.randn(64, 64), torch.randn(1, 1, 1, 16),
          torch.randn(1, 1, 1, 16))
    assert len(partition(_projection_rope, xs).pieces) == 1
    assert len(partition(_projection_rope, xs, levels=True).pieces) == 1
    parts = partition(_projection_rope, xs, levels=EPILOGUES)
    _check(parts, _projection_rope, xs, (2, 4))
    matmul, rope = parts.pieces
    assert (matmul.matmuls, rope.matmuls) == (1, 0) and "cat" in rope.nodes


def _norm_qkv_rope(x: Any, g: Any, wq: Any, wk: Any, wv: Any, cos: Any, sin: Any
                   ) -> tuple[Any, Any, Any]:
    h = F.rms_norm(x, (64,), g, 1e-6)
    q, k = (_projection_rope(h, w, cos, sin) for w in (wq, wk))
    return q, k, (h @ wv).view(1, 1, 4, 16).transpose(1, 2)


def test_a_cut_after_the_matmuls_keeps_the_norm_with_its_projections() -> None:
    """An RMSNorm feeding the query, key and value projections, RoPE rotating the first two:
    with ``levels=AFTER_MATMULS`` the norm and the three projections are one piece of three
    outputs (V's heads, a view of its projection read by no other node, go with it), and each
    rotation, with the slices of its projection's heads, a piece of its own; with
    ``levels=True`` the norm is apart from the projections, each with its rotation."""
    from egraph_mirage.fx.pieces import AFTER_MATMULS

    xs = (torch.randn(1, 64), torch.rand(64) + 0.5, *(torch.randn(64, 64) for _ in range(3)),
          torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16))
    parts = partition(_norm_qkv_rope, xs, levels=AFTER_MATMULS)
    _check(parts, _norm_qkv_rope, xs, (2, 4))
    (norm,) = [p for p in parts.pieces if p.matmuls]
    ropes = [p for p in parts.pieces if not p.matmuls]
    assert (norm.matmuls, norm.reductions, _outputs(norm)) == (3, 1, 3)
    assert {"view_2", "transpose_2"} <= set(norm.nodes)  # V's heads
    assert [(p.reductions, _outputs(p)) for p in ropes] == [(0, 1)] * 2
    assert all(any(n.startswith("cat") for n in p.nodes) and "rms_norm" not in p.nodes
               for p in ropes)
    assert parts.left_out == {}
    before = partition(_norm_qkv_rope, xs, levels=True)
    _check(before, _norm_qkv_rope, xs, (2, 4))
    assert sorted((p.matmuls, p.reductions) for p in before.pieces) == \
        [(0, 1), (1, 0), (1, 0), (1, 0)]


def test_a_cast_of_inputs_of_another_dtype_runs_as_is_so_a_piece_reads_one_dtype() -> None:
    """RoPE as ``generate()`` traces it: the angles' ``cos`` computed in float32, scaled, then
    cast to the query's float16 inside the rotation's piece, which would then read float32
    and float16 (the search takes inputs of one dtype). The scale and the cast run as is, with
    the view of their result, and the piece reads the cast value: float16 only. A float32
    RMSNorm's cast back to float16 (from a reduction) stays in its piece."""
    def rope_and_norm(q: torch.Tensor, cos: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        c = (cos * 2.0).to(q.dtype).unsqueeze(0)
        half = q.shape[-1] // 2
        rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
        r = q * c + rotated * c
        h = r.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(q.dtype)

    q = torch.randn(4, 1, 16).half()
    cos, w = torch.randn(1, 16), torch.randn(16).half()
    parts = partition(rope_and_norm, (q, cos, w))
    assert [n for n, why in parts.left_out.items() if why.startswith("a cast to float16")] \
        and len(parts.pieces) == 1
    (piece,) = parts.pieces
    assert {x.dtype for x in piece.example_inputs} == {torch.float16}
    assert "rsqrt" in piece.nodes and sum(n.startswith("_to_copy") for n in piece.nodes) == 2
    traced = trace_fx(piece.module, piece.example_inputs)
    with torch.no_grad():
        want = rope_and_norm(q, cos, w)
    (got,) = traced.reference(*piece.example_inputs)
    assert (got.float() - want.float()).abs().max() < 1e-2


def test_layers_sharing_a_boolean_mask_share_its_additive_mask() -> None:
    """``generate()`` hands every layer's SDPA the same boolean mask; the partition makes its
    additive form (``where(mask, 0, -inf)``, run as is) once, and both attention pieces read
    it, each traced piece matching its SDPA given the boolean mask."""
    def two_layers(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
                   ) -> torch.Tensor:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        a = sdpa(q, k, v, attn_mask=mask)
        return sdpa(a * 2.0, k, v, attn_mask=mask)

    q, k, v = (torch.randn(1, 2, n, 16).half() for n in (1, 8, 8))
    mask = torch.arange(8).view(1, 1, 1, 8) < 5
    parts = partition(two_layers, (q, k, v, mask))
    wheres = [n for n in parts.left_out if n.startswith("where")]
    assert len(wheres) == 1, parts.left_out
    attention = [p for p in parts.pieces if any("scaled_dot_product" in n or "sdpa" in n
                                                for n in p.nodes)]
    assert len(attention) == 2
    for piece in attention:
        additive = piece.example_inputs[-1]
        assert additive.dtype == torch.float16 and additive[..., 5:].isinf().all()
        traced = trace_fx(piece.module, piece.example_inputs)
        with torch.no_grad():  # the piece's own SDPA given the boolean mask back
            (want,) = piece.module(*piece.example_inputs[:-1], additive == 0)
        (got,) = traced.reference(*piece.example_inputs)
        assert (got.float() - want.float()).abs().max() < 1e-2
