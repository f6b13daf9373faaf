"""Grouped-query attention's shared K/V heads on computed values: an index map, never a copy.

At decode (one token), ``proj(x).view(b, 1, h, d).transpose(1, 2)`` only moves a size-1 dim (a
relabelling), and ``repeat_kv`` / ``repeat_interleave`` of a computed K or V keeps a size-1
graph dim that broadcasts where the value is used (``views.Expanded``); a true transpose of a
computed matrix is still refused.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from egraph_mirage.errors import UnsupportedOpError  # noqa: E402
from egraph_mirage.fx import aten, partition  # noqa: E402
from egraph_mirage.fx.trace import trace, trace_fx  # noqa: E402

H, KVH, D, HIDDEN = 4, 2, 16, 64


def _rand(*shape: int) -> Any:
    return torch.randn(*shape, dtype=torch.float32) * 0.5


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _repeat_kv(x: Any, n_rep: int) -> Any:  # transformers' repeat_kv
    b, kvh, s, d = x.shape
    return x[:, :, None, :, :].expand(b, kvh, n_rep, s, d).reshape(b, kvh * n_rep, s, d)


def _attention(share: Any) -> Any:
    def f(q: Any, k: Any, v: Any, cos: Any, sin: Any) -> Any:  # one token: (1, heads, 1, D)
        q, k, v = _rope(q, cos, sin), _rope(k, cos, sin), v * 2  # computed q, k, v
        k, v = share(k), share(v)
        p = torch.softmax((q @ k.transpose(2, 3)) * D ** -0.5, dim=-1)
        return (p @ v).transpose(1, 2).reshape(1, 1, H * D)
    return f


SHARES = {"repeat_kv": lambda t: _repeat_kv(t, H // KVH),
          "repeat_interleave": lambda t: t.repeat_interleave(H // KVH, dim=1)}


@pytest.mark.parametrize("name", SHARES)
def test_gqa_on_computed_kv_traces_to_one_graph_without_repeating_k(name: str) -> None:
    torch.manual_seed(0)
    args = (_rand(1, H, 1, D), _rand(1, KVH, 1, D), _rand(1, KVH, 1, D), _rand(1, 1, 1, D),
            _rand(1, 1, 1, D))
    f = _attention(SHARES[name])
    traced = trace(f, *args)
    g = traced.graph
    # K and V are read and computed once per KV head, held as (KVH, 1, D): the size-1 dim
    # broadcasts over the query heads of a group where q @ k^T and p @ v use them (at one key
    # both are products that broadcast), and nothing concatenates a repeated copy
    n_rep = H // KVH
    shared = [t for t in g.operators if t.op == "mul" and t.dims == (KVH, n_rep, D)
              and any(o.dims == (KVH, 1, D) for o in t.operands)]
    assert len(shared) == 2, [(t.op, t.dims) for t in g.operators]
    assert all(t.dims[:2] == (KVH, n_rep) for t in shared)
    assert not [t for t in g.operators if t.op == "concat" and t.dims[:2] == (KVH, n_rep)
                and any(o.dims[:2] == (KVH, 1) for o in t.operands)]
    got = traced.reference(*args)[0]
    torch.testing.assert_close(got.float(), f(*args), rtol=1e-4, atol=1e-4)


def _sdpa_decode(x: Any, wq: Any, wk: Any, wv: Any, k_cache: Any, v_cache: Any) -> Any:
    """One token against a cache of 7, ``F.scaled_dot_product_attention(enable_gqa=True)``
    (transformers' SDPA path when there is no mask)."""
    q = (x @ wq).view(1, 1, H, D).transpose(1, 2)
    k = torch.cat([k_cache, (x @ wk).view(1, 1, KVH, D).transpose(1, 2)], 2)
    v = torch.cat([v_cache, (x @ wv).view(1, 1, KVH, D).transpose(1, 2)], 2)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    return out.transpose(1, 2).reshape(1, H * D)


def test_sdpa_with_shared_kv_heads_is_attention_with_a_broadcast() -> None:
    """The SDPA node stays whole through export and traces as its definition, two products and
    a softmax, each KV head read once for the query heads that share it (no repeated copy of
    the cache): at decode those query heads are the rows of one product per KV head
    (``trace.with_rows_folded``), the benchmarks' gqa layout."""
    torch.manual_seed(0)
    args = (_rand(1, HIDDEN), _rand(HIDDEN, H * D), _rand(HIDDEN, KVH * D),
            _rand(HIDDEN, KVH * D), _rand(1, KVH, 7, D), _rand(1, KVH, 7, D))
    parts = partition(_sdpa_decode, args)
    assert not parts.left_out, parts.left_out
    (attention,) = [p for p in parts.pieces if "scaled_dot_product_attention" in p.nodes]
    traced = trace_fx(attention.module, attention.example_inputs)
    ops = [t.op for t in traced.graph.operators]
    assert ops.count("matmul") == 2 and "exp" in ops and "concat" not in ops
    n_rep = H // KVH
    keys = [t for t in traced.graph.inputs if t.dims[-1] == 8 or t.dims[-2] == 8]
    assert keys and all(t.dims[0] == KVH for t in keys)  # one matrix per KV head
    assert all(math.prod(t.dims) == KVH * 8 * D for t in keys), n_rep
    (query,) = [t for t in traced.graph.inputs if t not in keys]
    assert query.dims == (KVH, n_rep, D)  # the query heads sharing a KV head: its rows
    want = attention.module(*attention.example_inputs)
    for w, g in zip(want, traced.reference(*attention.example_inputs)):
        torch.testing.assert_close(g.float(), w, rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        torch.testing.assert_close(parts.module(*args), _sdpa_decode(*args))


def test_a_true_transpose_of_a_computed_matrix_is_refused() -> None:
    x = _rand(2, 4, 8)
    with pytest.raises(UnsupportedOpError, match="transpose"):
        trace(lambda x: x.exp().transpose(1, 2) @ x, x)


def test_the_relabel_predicates_say_yes_only_for_size_one_moves() -> None:
    assert aten.relabels((1, 1, 4, 16), (0, 2, 1, 3))  # (b, 1, h, d) -> (b, h, 1, d)
    assert not aten.relabels((1, 3, 4, 16), (0, 2, 1, 3))
    assert aten.relabels((1, 4, 1, 16), (0, 1, 3, 2))  # K^T of one key


def _layer(kind: str) -> tuple[Any, tuple[Any, ...]]:
    transformers = pytest.importorskip("transformers")
    kw = dict(hidden_size=HIDDEN, intermediate_size=128, num_attention_heads=H,
              num_key_value_heads=KVH, head_dim=D, rms_norm_eps=1e-5, num_hidden_layers=1,
              vocab_size=128, attn_implementation="eager")
    if kind == "llama":
        from transformers.models.llama.modeling_llama import (
            LlamaDecoderLayer as Layer,
        )
        from transformers.models.llama.modeling_llama import (
            LlamaRotaryEmbedding as Rope,
        )
        cfg = transformers.LlamaConfig(**kw)
    else:
        from transformers.models.qwen3.modeling_qwen3 import (
            Qwen3DecoderLayer as Layer,
        )
        from transformers.models.qwen3.modeling_qwen3 import (
            Qwen3RotaryEmbedding as Rope,
        )
        cfg = transformers.Qwen3Config(**kw)
    return _decode_step(Layer, Rope, cfg)


def _decode_step(Layer: Any, Rope: Any, cfg: Any) -> tuple[Any, tuple[Any, ...]]:
    """A decoder layer of ``transformers`` (random init, fp16) at decode: one token, no cache."""
    torch.manual_seed(0)
    layer = Layer(cfg, 0).to(torch.float16).eval()
    x = torch.randn(1, 1, HIDDEN, dtype=torch.float16)
    cos, sin = Rope(cfg)(x, torch.tensor([[3]]))

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            out = self.layer(x, position_embeddings=(cos, sin), attention_mask=None)
            return out[0] if isinstance(out, tuple) else out

    return Step(), (x, cos, sin)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_decoder_layer_at_decode_leaves_no_attention_view_out(kind: str) -> None:
    module, args = _layer(kind)
    with torch.no_grad():
        parts = partition(module, args)
    assert dict(parts.left_out) == {}
    names = {n for p in parts.pieces for n in p.nodes}
    assert {"transpose", "transpose_1", "transpose_2", "expand", "expand_1", "clone",
            "clone_1", "unsqueeze", "unsqueeze_1"} <= names
    with torch.no_grad():
        got = parts.module(*args)
        got = got[0] if isinstance(got, (tuple, list)) else got
        want = module(*args)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def _normed_q_against_shared_keys(h: Any, wq: Any, g: Any, kc: Any) -> Any:
    """Qwen3's per-head q_norm (in float32) at decode, against repeat_kv's shared keys."""
    q = (h @ wq).view(1, 1, H, D)
    x = q.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    q = (g * x.to(h.dtype)).transpose(1, 2)
    return q @ _repeat_kv(kc, H // KVH).transpose(2, 3)


def test_a_per_head_norm_and_shared_heads_agree_on_one_layout() -> None:
    """The norm wants the projection's columns split as (heads, head_dim), the shared keys as
    (kv_heads, n_rep, head_dim): the finer layout serves both (no relayout ping-pong)."""
    torch.manual_seed(0)
    args = (torch.randn(1, HIDDEN).half(), (_rand(HIDDEN, H * D) * 0.3).half(),
            torch.rand(D).half() + 0.5, torch.randn(1, KVH, 33, D).half())
    parts = partition(_normed_q_against_shared_keys, args)
    assert dict(parts.left_out) == {} and len(parts.pieces) == 1
    traced = trace(_normed_q_against_shared_keys, *args)
    ops = [(t.op, t.dims[-4:]) for t in traced.graph.operators]
    # the norm's mean over head_dim and the scores in (kv_heads, n_rep): keys read once per
    # KV head, never repeated
    assert ("mean", (KVH, H // KVH, 1, 1)) in ops and ("matmul", (KVH, H // KVH, 1, 33)) in ops
    assert "concat" not in {op for op, _ in ops}
    want = _normed_q_against_shared_keys(*(a.float() for a in args))
    torch.testing.assert_close(traced.reference(*args)[0].float(), want, rtol=2e-2, atol=2e-2)


def test_qwen3_eager_decode_with_a_static_cache_leaves_nothing_out() -> None:
    pytest.importorskip("transformers")
    import sys
    from pathlib import Path

    examples = str(Path(__file__).resolve().parents[1] / "examples")
    sys.path.insert(0, examples)
    try:
        import llama_layer
    finally:
        sys.path.remove(examples)
    step = llama_layer.HFDecodeStep(llama_layer.LlamaSizes.small(), torch.float16,
                                    family="qwen3", cache="static")
    step.layer.self_attn.config._attn_implementation = "eager"
    with torch.no_grad():
        parts = partition(step, step.example_inputs(1))
    assert dict(parts.left_out) == {}  # the cache's write joins the piece computing K, V


def test_a_fused_qkv_projection_chunked_into_heads_traces_whole() -> None:
    """GPT-NeoX's ``query_key_value(x).view(b, 1, h, 3 d).transpose(1, 2).chunk(3, -1)``: the
    split stays whole through export and each part a ``getitem`` takes is a slice of the
    projection's last dim (``slice_last``), so nothing is left out."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox.modeling_gpt_neox import (
        GPTNeoXLayer,
        GPTNeoXRotaryEmbedding,
    )

    cfg = transformers.GPTNeoXConfig(hidden_size=HIDDEN, num_attention_heads=H,
                                     intermediate_size=128, num_hidden_layers=1, vocab_size=128,
                                     use_parallel_residual=True, attn_implementation="eager")
    module, args = _decode_step(GPTNeoXLayer, GPTNeoXRotaryEmbedding, cfg)
    with torch.no_grad():
        parts = partition(module, args)
    assert dict(parts.left_out) == {}
    (qkv,) = [p for p in parts.pieces if "getitem_2" in p.nodes]
    assert {"linear", "transpose", "getitem", "getitem_1", "matmul"} <= set(qkv.nodes)
    for p in parts.pieces:
        traced = trace_fx(p.module, p.example_inputs)
        for want, got in zip(p.module(*p.example_inputs),
                             traced.reference(*p.example_inputs), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    with torch.no_grad():
        got, want = parts.module(*args), module(*args)
    got = got[0] if isinstance(got, (tuple, list)) else got
    want = want[0] if isinstance(want, (tuple, list)) else want
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Grouped-query attention at decode as eager code writes it: q (kv, g, 1, d) against each
    KV head's keys and values (kv, 1, n, d), broadcast over its g query heads."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def test_single_rows_sharing_a_matrix_are_folded_into_its_rows() -> None:
    """``with_rows_folded``: the g query heads that share a KV head, one row each, become the g
    rows of one product per KV head: q (kv, g, d) @ K (kv, d, n), and so through the softmax
    and the product with V; the program computes what the code computes."""
    q, k, v = _rand(KVH, H // KVH, 1, D), _rand(KVH, 1, 8, D), _rand(KVH, 1, 8, D)
    traced = trace(_decode_attention, q, k, v)
    assert [t.dims for t in traced.graph.inputs] == [(KVH, H // KVH, D), (KVH, D, 8),
                                                     (KVH, 8, D)]
    assert traced.graph.outputs[0].dims == (KVH, H // KVH, D)
    (got,) = traced.reference(q, k, v)
    torch.testing.assert_close(got.float(), _decode_attention(q, k, v), rtol=1e-4, atol=1e-4)


def test_rows_are_not_folded_where_a_right_operand_has_its_own_rows_dim() -> None:
    """A right operand with a dim ``-3`` of its own (one matrix per query head, no sharing) is
    no matrix shared by rows: each product keeps its single row (its two leading dims merge
    into one batch dim, ``with_batch_folded``)."""
    q, k = _rand(KVH, H // KVH, 1, D), _rand(KVH, H // KVH, D, 8)
    traced = trace(lambda q, k: (q @ k).exp(), q, k)
    assert [t.dims for t in traced.graph.inputs] == [(H, 1, D), (H, D, 8)]


def _batched_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
                       ) -> torch.Tensor:
    """``_decode_attention`` for a batch of sequences (leading dim ``b``), each with its mask
    over the keys (``(b, 1, 1, 1, n)``, shared by its heads)."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5 + mask
    return torch.softmax(s.float(), dim=-1).to(q.dtype) @ v


def test_a_batch_of_sequences_is_folded_into_the_kv_heads() -> None:
    """``with_batch_folded``: with 3 sequences the rows fold as at one, giving
    q (3, kv, g, d) @ K (3, kv, d, n); the sequences and KV heads then merge into one batch
    dim, q (3·kv, g, d) @ K (3·kv, d, n), the program the search knows from one sequence. The
    mask, one row of keys per sequence, is copied to one per sequence and head (an ``expand``
    before the merge); the program computes what the code computes."""
    b, n = 3, 64
    q, k, v = _rand(b, KVH, H // KVH, 1, D), _rand(b, KVH, 1, n, D), _rand(b, KVH, 1, n, D)
    mask = torch.where(torch.rand(b, 1, 1, 1, n) < 0.3, float("-inf"), 0.0)
    mask[..., 0] = 0.0  # every row sees a key
    traced = trace(_batched_attention, q, k, v, mask)
    assert [t.dims for t in traced.graph.inputs] == [
        (b * KVH, H // KVH, D), (b * KVH, D, n), (b * KVH, 1, n), (b * KVH, n, D)]
    (copied,) = [v for v in traced.inputs if any(s == "expand" for s, _ in v.steps)]
    assert copied.source == "mask" and copied.dims == (b * KVH, 1, n)
    (got,) = traced.reference(q, k, v, mask)
    torch.testing.assert_close(got.float(), _batched_attention(q, k, v, mask),
                               rtol=1e-4, atol=1e-4)


def test_a_batch_fold_that_would_copy_a_shared_matrix_is_not_taken() -> None:
    """One weight for every sequence, ``(1, h, hidden, d)`` against the sequences' rows
    ``(b, 1, 1, hidden)``: merging the leading dims would copy the weight once per sequence,
    more than ``COPY_SHARE`` of the inputs, so the program keeps its layout."""
    x, w = _rand(3, 1, 1, HIDDEN), _rand(1, H, HIDDEN, D)
    traced = trace(lambda x, w: (x @ w).exp(), x, w)
    assert [t.dims for t in traced.graph.inputs] == [(3, 1, 1, HIDDEN), (1, H, HIDDEN, D)]


def test_a_batch_fold_is_not_taken_where_an_operator_works_along_a_leading_dim() -> None:
    """A sum over the heads (dim 1) needs them apart: the program keeps its layout."""
    q, k = _rand(3, KVH, H // KVH, D), _rand(3, KVH, D, 8)
    traced = trace(lambda q, k: (q @ k).exp().sum(1), q, k)
    assert [t.dims for t in traced.graph.inputs] == [(3, KVH, H // KVH, D), (3, KVH, D, 8)]
    (got,) = traced.reference(q, k)
    torch.testing.assert_close(got.float(), (q @ k).exp().sum(1), rtol=1e-4, atol=1e-4)


def test_a_batch_fold_that_would_copy_a_transposed_input_is_not_taken() -> None:
    """Projections' outputs ``(b, n, h, d)`` read as ``(b, h, n, d)`` (``transpose(1, 2)``): the
    sequences and heads are not one run of memory, so merging them would copy q, K and V at
    every call; the program keeps its layout, each input a view of its source."""
    def f(q: Any, k: Any, v: Any) -> Any:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, dim=-1) @ v

    q, k, v = _rand(3, 5, H, D), _rand(3, 5, H, D), _rand(3, 5, H, D)
    traced = trace(f, q, k, v)
    assert all(t.dims[:2] == (3, H) for t in traced.graph.inputs)
    for view, source in zip(traced.inputs, (q, k, v)):
        made = view.apply(source)
        assert made.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
    (got,) = traced.reference(q, k, v)
    torch.testing.assert_close(got.float(), f(q, k, v), rtol=1e-4, atol=1e-4)
