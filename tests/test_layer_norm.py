"""LayerNorm (GPT-2, GPT-NeoX, Phi, Falcon): ``aten.layer_norm.default`` stays whole through
export and traces as its definition over the last dim, in float32 whatever the input's float
type (the input, weight and bias cast up, the result cast back, as torch computes it)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import egraph_mirage as em  # noqa: E402
from egraph_mirage.fx import partition  # noqa: E402
from egraph_mirage.fx.report import REPLACED, reports_of  # noqa: E402
from egraph_mirage.fx.trace import trace_fx  # noqa: E402

F = torch.nn.functional
HIDDEN = 64
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
#: (rtol, atol) of the float reference against eager: fp32 exact-ish, else one rounding
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}


def _inputs(dtype: Any, affine: bool) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, HIDDEN, generator=gen) * 3 + 1  # a mean and a spread far from 0 and 1
    w = torch.randn(HIDDEN, 32, generator=gen) / 8
    if not affine:
        return x.to(dtype), w.to(dtype)
    gain, bias = torch.rand(HIDDEN, generator=gen) + 0.5, torch.randn(HIDDEN, generator=gen)
    return x.to(dtype), gain.to(dtype), bias.to(dtype), w.to(dtype)


def ln_mm(x: Any, w: Any) -> Any:
    return F.layer_norm(x, (HIDDEN,), eps=1e-5) @ w


def ln_affine_mm(x: Any, gain: Any, bias: Any, w: Any) -> Any:
    return F.layer_norm(x, (HIDDEN,), gain, bias, 1e-5) @ w


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
def test_layer_norm_then_a_projection_is_one_piece_whose_reference_matches_eager(
        dtype: Any, affine: bool) -> None:
    fn, args = (ln_affine_mm if affine else ln_mm), _inputs(dtype, affine)
    parts = partition(fn, args)
    assert dict(parts.left_out) == {}
    (piece,) = parts.pieces
    assert piece.nodes == ("layer_norm", "matmul")
    assert (piece.matmuls, piece.reductions) == (1, 2)
    traced = trace_fx(piece.module, piece.example_inputs)
    ops = [t.op for t in traced.graph.operators]
    core = ["mean", "sub", "square", "mean", "add_scalar", "rsqrt", "mul"]
    assert [op for op in ops if op != "cast"][:len(core)] == core
    assert ops.count("mul") == 1 + affine and ops.count("add") == int(affine)
    # every step of the norm in float32; a cast up of each input and one back before the
    # projection where the program is in a half type
    f32 = [t for t in traced.graph.operators if t.op in core]
    assert all(t.dtype is em.float32 for t in f32)
    assert ops.count("cast") == (0 if dtype is torch.float32 else 2 + 2 * affine)
    got = traced.reference(*piece.example_inputs)[0]
    assert got.dtype == dtype
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got, fn(*args), rtol=rtol, atol=atol)
    with torch.no_grad():
        torch.testing.assert_close(parts.module(*args), fn(*args))


def test_layer_norm_over_more_than_the_last_dim_is_left_out_with_its_reason() -> None:
    x, w = torch.randn(2, 4, 16), torch.randn(16, 8)
    parts = partition(lambda x, w: F.layer_norm(x, (4, 16)) @ w, (x, w))
    assert parts.left_out["layer_norm"] == (
        "layer_norm over the last 2 dims (4, 16) (only the last dim is mapped: a reduction is "
        "along one dim)")


def _neox_step() -> tuple[Any, tuple[Any, ...]]:
    """A GPT-NeoX layer (parallel residual, two LayerNorms) at decode: one token, no cache."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        GPTNeoXLayer,
        GPTNeoXRotaryEmbedding,
    )

    cfg = transformers.GPTNeoXConfig(hidden_size=HIDDEN, num_attention_heads=4,
                                     intermediate_size=128, num_hidden_layers=1, vocab_size=128,
                                     use_parallel_residual=True, attn_implementation="eager")
    torch.manual_seed(0)
    layer = GPTNeoXLayer(cfg, 0).to(torch.float16).eval()
    x = torch.randn(1, 1, HIDDEN, dtype=torch.float16)
    cos, sin = GPTNeoXRotaryEmbedding(cfg)(x, torch.tensor([[3]]))

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            return self.layer(x, position_embeddings=(cos, sin), attention_mask=None)

    return Step(), (x, cos, sin)


def test_a_gpt_neox_layer_at_decode_has_its_layer_norms_inside_pieces() -> None:
    """Both LayerNorms start the piece of the projections they feed, nothing left out: the
    fused QKV projection's ``chunk(3, dim=-1)`` (``split`` and its three ``getitem``) is three
    slices in the piece of the projection, its RoPE and the scores."""
    module, args = _neox_step()
    with torch.no_grad():
        parts = partition(module, args)
    assert dict(parts.left_out) == {}
    pieces = {p.nodes[0]: p for p in parts.pieces}
    assert pieces["layer_norm"].nodes[:8] == ("layer_norm", "linear", "view", "transpose",
                                              "split", "getitem", "getitem_1", "getitem_2")
    assert "softmax" in pieces["layer_norm"].nodes
    assert pieces["layer_norm_1"].nodes == ("layer_norm_1", "linear_2", "gelu", "linear_3",
                                            "clone_2", "add_2", "add_3")
    for p in (pieces["layer_norm"], pieces["layer_norm_1"]):
        traced = trace_fx(p.module, p.example_inputs)
        for want, got in zip(p.module(*p.example_inputs),
                             traced.reference(*p.example_inputs), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    with torch.no_grad():
        got = parts.module(*args)
        got = got[0] if isinstance(got, (tuple, list)) else got
        torch.testing.assert_close(got, module(*args), rtol=1e-2, atol=1e-2)


def test_layer_norm_then_a_projection_by_one_kernel_under_torch_compile() -> None:
    """The real search (one worker) finds the piece's one-kernel μGraph: its first is at task
    113 of 321 (none in the first 60), so ``max_tasks`` is 120 (about 7 s of search)."""
    torch._dynamo.reset()
    x, w = _inputs(torch.float16, affine=False)
    fast = torch.compile(ln_mm, backend="egraph_mirage", dynamic=False,
                         options={"max_tasks": 120, "workers": 1, "rest": "eager",
                                  "budget": None,  # bounded by tasks, not seconds
                                  "cache": False})
    try:
        with torch.no_grad():
            got = fast(x, w)
        torch.testing.assert_close(got, ln_mm(x, w), rtol=1e-2, atol=1e-2)
        (report,) = reports_of(fast)
        (piece,) = report.pieces
        assert piece.status == REPLACED and piece.num_kernels == 1
        assert piece.operators[-1] == "matmul" and "mean" in piece.operators
    finally:
        torch._dynamo.reset()
