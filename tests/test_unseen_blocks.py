"""Unseen code: blocks written as real model code writes them (``unseen_blocks.py``:
``transformers``' Llama and Qwen3 decoder layers at a decode step with a static cache, Gemma's
norm and gated-GELU MLP, GPT-NeoX's parallel residual, PEFT's LoRA projection, a final norm and
LM head), at small sizes, each test saying what fuses and what does not yet.

Two levels. **Partition** (cheap; every block in fp16 and bf16): ``fx.partition`` cuts the
block into exactly the pieces listed here, each written as its tags (``_signature``: ``norm``
an RMSNorm, ``layernorm``, ``proj`` a projection, ``rope`` a rotation, ``sdpa``, ``bmm`` an
attention product, ``softmax``, ``silu``, ``gelu``, in graph order) and its number of outputs,
and leaves out exactly the operators listed (a static cache's in-place write; over several
tokens, true transposes). **Backend** (a search per piece, budgeted by tasks, CPU
and Triton's interpreter): ``torch.compile(..., backend="egraph_mirage")`` matches eager within
``TOLERANCE`` and replaces the computations listed, each by a piece of its own (today often a
part of a piece: one the search found nothing for whole within its tasks is cut at its matmuls
and its parts searched, ``refine``; a part found whole later still passes).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import unseen_blocks as ub  # noqa: E402

import egraph_mirage as em  # noqa: E402
from egraph_mirage.fx import partition  # noqa: E402
from egraph_mirage.fx.report import REPLACED, reports_of  # noqa: E402
from egraph_mirage.fx.trace import trace_fx  # noqa: E402
from egraph_mirage.gpu.torch_eval import relative_error  # noqa: E402
from egraph_mirage.gpu.tune import TOLERANCE  # noqa: E402

DTYPES = {torch.float16: em.float16, torch.bfloat16: em.bfloat16}
both_dtypes = pytest.mark.parametrize("dtype", list(DTYPES), ids=["fp16", "bf16"])

#: node name (less its number) -> tag of a piece's signature
TAGS = {"rsqrt": "norm", "layer_norm": "layernorm", "linear": "proj", "cat": "rope",
        "scaled_dot_product_attention": "sdpa", "matmul": "bmm", "softmax": "softmax",
        "silu": "silu", "gelu": "gelu", "index_put": "write"}
INPUT_COPY = "a copy of a value from outside runs as is (the piece takes the copy)"
VIEW_COPY = "a view of a computed value would be a copy (only views of inputs fold)"

#: the pieces of each decoder layer (family, attention): (signature, outputs), in order
LAYER_PIECES = {
    # SDPA: attention in 3 pieces (the norm with the q, k and v projections, both RoPEs and
    # the static cache's write of the new K and V (``index_copy_`` exports as ``index_put``
    # and a ``copy_`` back), of five outputs: q, the new K and V (the test's step returns
    # them) and both caches, written in place; SDPA with its shared K/V heads as a broadcast,
    # reading the written caches; the output projection with the residual add); MLP in 2
    ("llama", "sdpa"): [("norm proj proj proj rope rope write write", 5), ("sdpa", 1),
                        ("proj", 1), ("norm proj silu proj", 1), ("proj", 1)],
    # eager: the query's projection and RoPE go with the scores and softmax (which read the
    # written cache, so they cannot join the norm's piece), the second product with the
    # output projection and residual
    ("llama", "eager"): [("norm proj proj rope write write", 5), ("proj rope bmm softmax", 1),
                         ("bmm proj", 1), ("norm proj silu proj", 1), ("proj", 1)],
    # Qwen3: the per-head q_norm/k_norm join the projection before them
    ("qwen3", "sdpa"): [("norm proj norm proj norm proj rope rope write write", 5), ("sdpa", 1),
                        ("proj", 1), ("norm proj silu proj", 1), ("proj", 1)],
    ("qwen3", "eager"): [("norm proj norm proj rope write write", 5),
                         ("proj norm rope bmm softmax", 1), ("bmm proj", 1),
                         ("norm proj silu proj", 1), ("proj", 1)],
}
#: what each decoder layer leaves out: nothing
LAYER_LEFT_OUT: dict[tuple[str, str], dict[str, str]] = {
    (family, attn): {} for family in ("llama", "qwen3") for attn in ("sdpa", "eager")}


def _signature(piece: Any) -> tuple[str, int]:
    """A piece as its tags (``TAGS``, in graph order) and its module's number of outputs."""
    names = (re.sub(r"_\d+$", "", n) for n in piece.nodes)
    out = next(n for n in piece.module.graph.nodes if n.op == "output")
    return " ".join(TAGS[n] for n in names if n in TAGS), len(out.args[0])


def _left_out_matches(left_out: dict[str, str], expected: dict[str, str]) -> bool:
    """``left_out`` names exactly ``expected``'s nodes, each reason beginning as expected."""
    return left_out.keys() == expected.keys() and all(
        left_out[k].startswith(why) for k, why in expected.items())


# -- partition level: every block, fp16 and bf16 ---------------------------------------------


@both_dtypes
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_decoder_layer_at_decode_is_cut_at_its_norms_and_nothing_is_left_out(
        family: str, attn: str, dtype: Any) -> None:
    """``LlamaDecoderLayer`` / ``Qwen3DecoderLayer`` (transformers 5.x, random init), one
    decode step with a static cache written in place, attention ``sdpa`` or ``eager``.
    Fuses (one piece each): transformers' float32 RMSNorm with the projections and RoPEs it
    feeds and the static cache's write of the new K and V (five outputs: the three values,
    and both caches, written in place; eager: K, V and the normed hidden state the query's
    projection takes, which goes with the scores and softmax); SDPA; the output projection
    with the residual add; the MLP's norm with gate/up and silu·mul; the down projection with
    the residual. Nothing is left out."""
    step = ub.hf_step(family, attn, dtype)
    parts = partition(step, step.example_inputs())
    assert [_signature(p) for p in parts.pieces] == LAYER_PIECES[family, attn]
    assert _left_out_matches(dict(parts.left_out), LAYER_LEFT_OUT[family, attn])
    norm_piece = next(p for p in parts.pieces if _signature(p)[0].startswith("norm proj"))
    assert _signature(norm_piece)[1] == 5  # the float32 RMSNorm with the projections it feeds
    traced = trace_fx(norm_piece.module, norm_piece.example_inputs)
    assert len(traced.outputs) == 3 and len(traced.writes) == 2  # the caches: written


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_decoder_layer_at_decode_with_batch_8_is_cut_as_at_batch_1(
        family: str, attn: str) -> None:
    """The same layers with 8 sequences of one new token each: the same pieces and the same
    left-outs as at batch 1. The query's ``view(8, 1, heads, head_dim).transpose(1, 2)`` moves
    a size-1 dim only, so the projection is traced per head with the sequences before the
    heads (graph dims (8, heads, 1, head_dim): x as (8, 1, 1, hidden) against the weight as
    (1, heads, hidden, head_dim)), the norm before it laid out alike; the attention's output
    (rows, kv_heads, n_rep, 1, head_dim) goes into the output projection as one product per
    row and head, summed over the heads. SDPA's sequences merge into its KV heads
    (``trace.with_batch_folded``): every graph tensor of its piece is rank 3 with the
    (sequence × KV head) batch first, the search's problem at one sequence. The first two
    pieces evaluate as eager does."""
    step = ub.hf_step(family, attn, torch.float16)
    parts = partition(step, step.example_inputs(batch=8))
    assert [_signature(p) for p in parts.pieces] == LAYER_PIECES[family, attn]
    assert _left_out_matches(dict(parts.left_out), LAYER_LEFT_OUT[family, attn])
    first = trace_fx(parts.pieces[0].module, parts.pieces[0].example_inputs)
    # the hidden state, read once as (8, 1, 1, hidden): the sequences before the heads
    assert [v.dims for v in first.inputs if math.prod(v.dims) == 8 * ub.HIDDEN] == \
        [(8, 1, 1, ub.HIDDEN)]
    if attn == "sdpa":
        (sdpa,) = [p for p in parts.pieces if _signature(p)[0] == "sdpa"]
        graph = trace_fx(sdpa.module, sdpa.example_inputs).graph
        kv_heads = ub.LlamaSizes.small().kv_heads
        assert {(len(t.dims), t.dims[0]) for t in graph.tensors} == {(3, 8 * kv_heads)}
    for piece in parts.pieces[:2]:
        traced = trace_fx(piece.module, piece.example_inputs)
        with torch.no_grad():  # (the caches it returns, written, are no graph output)
            want = [w for k, w in enumerate(piece.module(*piece.example_inputs))
                    if k not in {c.returned_at for c in traced.writes}]
        for w, g in zip(want, traced.reference(*piece.example_inputs), strict=True):
            assert relative_error(g, w) <= TOLERANCE[DTYPES[torch.float16]]


#: what a boolean attention mask leaves out: its expansion to the batch (a bool tensor) and
#: the additive mask made of it for SDPA (``where(mask, 0, -inf)``), which run as is
MASK_LEFT_OUT = {"expand_2": "a tensor of dtype bool",
                 **{name: "no op-table operator computes it" for name in (
                     "scalar_tensor_default", "scalar_tensor_default_1", "where_self")}}


@both_dtypes
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_boolean_attention_mask_leaves_attention_in_its_piece(family: str, dtype: Any
                                                                ) -> None:
    """``generate()`` with a static cache gives SDPA a boolean mask (the positions not yet
    written hidden). The partition hands SDPA the additive mask its fused kernels apply for
    it, ``where(mask, 0, -inf)`` in the query's dtype, made as is outside the pieces: the
    layer is cut as without a mask, SDPA and its shared K/V heads in one piece, which takes
    the additive mask as an input and evaluates as eager does with the boolean one."""
    step = ub.hf_step(family, "sdpa", dtype, masked=True)
    parts = partition(step, step.example_inputs())
    assert [_signature(p) for p in parts.pieces] == LAYER_PIECES[family, "sdpa"]
    assert _left_out_matches(dict(parts.left_out), MASK_LEFT_OUT)
    (piece,) = [p for p in parts.pieces if _signature(p)[0] == "sdpa"]
    mask = piece.example_inputs[-1]
    assert mask.dtype == dtype and mask.isinf().any() and (mask == 0).any()
    traced = trace_fx(piece.module, piece.example_inputs)
    with torch.no_grad():  # the piece's own SDPA given the boolean mask back
        (want,) = piece.module(*piece.example_inputs[:-1], mask == 0)
    (got,) = traced.reference(*piece.example_inputs)
    assert relative_error(got, want) <= TOLERANCE[DTYPES[dtype]]


#: other blocks: (build(dtype) -> (module, inputs), partition options, pieces, left out)
BLOCKS: dict[str, tuple[Any, dict[str, int], list[tuple[str, int]], dict[str, str]]] = {
    # Gemma: the (1 + w) norm in float32, cast back after the weight, with gate/up and the
    # gelu-tanh product; down projection and residual apart (the cap of two matmuls)
    "gemma": (lambda dt: (ub.GemmaNormMLP(dt), (ub.tokens(dt),)), {},
              [("norm proj gelu proj", 1), ("proj", 1)], {}),
    # GPT-NeoX's parallel residual over several tokens, each norm with the projection it
    # feeds; the fused query_key_value's chunk into q, k, v is three slices; the heads'
    # permute of the projection and the keys' transpose are true transposes over several
    # tokens (copies: they run as is, and the attention piece takes the contiguous copy)
    **{f"neox-{norm}": (lambda dt, norm=norm: (ub.NeoXParallelBlock(dt, norm), (ub.tokens(dt),)),
                        {}, [(f"{tag} proj", 1), ("bmm softmax bmm", 1), ("proj", 1),
                             (f"{tag} proj gelu proj", 1)],
                        {"permute": VIEW_COPY, "transpose_1": VIEW_COPY,
                         "clone": INPUT_COPY})
       for norm, tag in (("layer", "layernorm"), ("rms", "norm"))},
    # LoRA under the default caps: the adapter's two projections, then the base projection
    # with the sum (eval-mode dropout's clone of x folds: the pieces read x itself)
    "lora": (lambda dt: (ub.LoraLinear(dt), (ub.tokens(dt),)), {},
             [("proj proj", 1), ("proj", 1)], {}),
    # LoRA with three matmuls a piece: one piece
    "lora-3": (lambda dt: (ub.LoraLinear(dt), (ub.tokens(dt),)), {"max_matmuls": 3},
               [("proj proj proj", 1)], {}),
    # the final norm (LlamaRMSNorm) with the LM head: one piece, the paper's RMSNorm + Linear
    "head": (lambda dt: (ub.FinalNormHead(dt), (ub.tokens(dt, (1, 1, ub.HIDDEN)),)), {},
             [("norm proj", 1)], {}),
}


@both_dtypes
@pytest.mark.parametrize("block", list(BLOCKS))
def test_a_block_is_cut_into_the_pieces_its_code_suggests(block: str, dtype: Any) -> None:
    """Each block of ``BLOCKS`` (its comment says what fuses and what runs as is): exactly
    those pieces, exactly that left out; every norm in the piece of the projection it feeds."""
    build, options, pieces, left_out = BLOCKS[block]
    model, inputs = build(dtype)
    parts = partition(model, inputs, **options)
    assert [_signature(p) for p in parts.pieces] == pieces
    assert _left_out_matches(dict(parts.left_out), left_out)


# -- backend level: a search per piece, budgeted by tasks -------------------------------------


def _compiled(model: Any, inputs: tuple[Any, ...], tmp_path: Path, max_tasks: int,
              **options: Any) -> tuple[Any, Any, Any]:
    """``model`` compiled by the backend (``max_tasks`` per piece, no time budget, one worker,
    the rest eager) and run once on ``inputs``; returns (eager outputs, compiled outputs,
    the compilation's report). Inputs are cloned for each run (a static cache is written)."""
    torch._dynamo.reset()  # the reports are found through Dynamo's cache entries of the code
    with torch.no_grad():
        want = model(*(x.clone() for x in inputs))
        compiled = torch.compile(model, backend="egraph_mirage", dynamic=False, options={
            "max_tasks": max_tasks, "workers": 1, "rest": "eager", "budget": None,
            "config": em.SearchConfig(max_results=1), "cache_dir": str(tmp_path), **options})
        got = compiled(*(x.clone() for x in inputs))
    (report,) = reports_of(compiled)
    print(report.text())
    return want, got, report


def _check(want: Any, got: Any, report: Any, dtype: Any, replaced: list[str]) -> None:
    """Every output within ``TOLERANCE`` of eager; each computation of ``replaced`` (operators
    as the report names them) done by a replaced piece of its own, that one or a larger one
    holding it (a piece found whole where today only its parts are)."""
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, g in zip(wants, gots, strict=True):
        assert relative_error(g, w) < TOLERANCE[DTYPES[dtype]]
    pieces = [f" {' '.join(p.operators)} " for p in report.pieces if p.status == REPLACED]
    for ops in sorted(replaced, key=len, reverse=True):
        found = next((p for p in pieces if f" {ops} " in p), None)
        assert found is not None, f"no replaced piece computes {ops!r}: {report.text()}"
        pieces.remove(found)


#: what the report calls transformers' float32 RMSNorm with eps (Gemma's adds one to the weight)
RMS_NORM = "cast square mean add_scalar rsqrt mul cast mul"
GEMMA_NORM = "cast square mean add_scalar rsqrt mul cast add_scalar mul cast"


@both_dtypes
def test_the_final_norm_and_lm_head_fuse_into_one_kernel(dtype: Any, tmp_path: Path) -> None:
    """``lm_head(LlamaRMSNorm(h))``: the float32 RMSNorm (eps, the weight after the cast back)
    and the projection are one piece, found whole within 40 tasks: one kernel that divides
    the product by the accumulated RMS."""
    model, inputs = BLOCKS["head"][0](dtype)
    want, got, report = _compiled(model, inputs, tmp_path, max_tasks=40)
    _check(want, got, report, dtype, [f"{RMS_NORM} matmul"])
    assert [p.num_kernels for p in report.pieces] == [1]


@both_dtypes
def test_lora_is_searched_in_parts_each_replaced(dtype: Any, tmp_path: Path) -> None:
    """PEFT's LoRA projection as one piece (``max_matmuls=3``): not found whole within 40 tasks
    (of 1,671); cut at its matmuls, its parts are replaced: the base projection, ``lora_A``,
    and ``lora_B`` with the scaling and the sum (one kernel each)."""
    model, inputs = BLOCKS["lora-3"][0](dtype)
    want, got, report = _compiled(model, inputs, tmp_path, max_tasks=40, max_matmuls=3)
    _check(want, got, report, dtype, ["matmul", "matmul", "matmul mul_scalar add"])


@both_dtypes
def test_gemma_norm_and_gelu_mlp_are_replaced_in_parts(dtype: Any, tmp_path: Path) -> None:
    """Gemma's ``(1 + w)`` RMSNorm with gate/up and gelu-tanh·up: not found whole within 70
    tasks (of 367); cut after its matmuls, the norm with the gate and up projections (one
    part of two outputs, a kernel each computing ``(1 + w)`` and the norm's statistics) and
    ``gelu_tanh(g) * u`` are replaced, and so is the down projection with the residual
    (split-K, 2 kernels)."""
    model, inputs = BLOCKS["gemma"][0](dtype)
    want, got, report = _compiled(model, inputs, tmp_path, max_tasks=70)
    _check(want, got, report, dtype, [f"{GEMMA_NORM} matmul matmul", "gelu_tanh mul",
                                      "matmul add"])


def test_neox_parallel_block_with_layer_norm(tmp_path: Path) -> None:
    """GPT-NeoX's parallel residual with LayerNorm, 40 tasks a piece. Replaced: the
    ``query_key_value`` projection with its bias (the norm before it is a part of its own,
    not found within 40 of 67 tasks), attention's second product, ``dense`` with both
    residual adds, the MLP's up projection with bias and GELU, its down projection with
    bias and the sum. Kept: both LayerNorms, the scores with mask and softmax (not found
    within 40 tasks); the heads' transposes over several tokens run as is."""
    dt = torch.float16
    model, inputs = BLOCKS["neox-layer"][0](dt)
    want, got, report = _compiled(model, inputs, tmp_path, max_tasks=40)
    _check(want, got, report, dt, ["matmul add", "matmul", "matmul add add",
                                   "matmul add gelu_erf", "matmul add add"])


#: the attention core as the report names it: scores, scale, softmax with its max, product
ATTENTION = "matmul mul_scalar amax sub exp reduction div matmul"


@both_dtypes
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_attention_core_of_a_decode_step_is_one_kernel(family: str, dtype: Any,
                                                           tmp_path: Path) -> None:
    """The attention piece of a decoder layer's decode step (SDPA over the static cache, its
    shared K/V heads a broadcast, ``enable_gqa``), as the partition cuts it from the layer,
    compiled alone: the search finds one kernel computing the whole of it (scores, scale,
    softmax with its row max subtracted, the product with V), a block per KV head holding
    its rows of queries. Its one-kernel forms of 8 operators come after the shorter ones and
    the split forms of up to 5 (task 91 of 345 at these sizes), so the budget is 96 tasks;
    the layer test below gives each piece 20."""
    step = ub.hf_step(family, "sdpa", dtype)
    parts = partition(step, step.example_inputs())
    (piece,) = [p for p in parts.pieces if _signature(p)[0] == "sdpa"]
    want, got, report = _compiled(piece.module, tuple(piece.example_inputs), tmp_path,
                                  max_tasks=96)
    _check(want, got, report, dtype, [ATTENTION])
    assert [p.num_kernels for p in report.pieces] == [1]


@both_dtypes
def test_the_attention_core_with_a_boolean_mask_is_one_kernel(dtype: Any, tmp_path: Path
                                                               ) -> None:
    """The same piece of a Llama layer given a boolean mask, as ``generate()`` gives it: the
    additive mask the partition made of it is a fourth input, added to the scaled scores (9
    operators: a block graph holds as many as the program has, ``SearchConfig.block_ops``),
    and the search finds one kernel for the whole of it, among its one-kernel tasks of 9
    operators (task 100 of 345 at these sizes). It matches eager SDPA with the boolean mask,
    half of the keys hidden."""
    step = ub.hf_step("llama", "sdpa", dtype, masked=True)
    parts = partition(step, step.example_inputs())
    (piece,) = [p for p in parts.pieces if _signature(p)[0] == "sdpa"]
    *xs, mask = piece.example_inputs
    with torch.no_grad():  # the piece's SDPA given the boolean mask back
        (want,) = piece.module(*xs, mask == 0)
    _, got, report = _compiled(piece.module, tuple(piece.example_inputs), tmp_path,
                               max_tasks=108)
    _check(want, got, report, dtype, ["matmul mul_scalar add amax sub exp reduction div matmul"])
    assert [p.num_kernels for p in report.pieces] == [1]


@pytest.mark.parametrize(("family", "dtype", "max_tasks"), [
    ("llama", torch.float16, 40), ("qwen3", torch.bfloat16, 84)])
def test_a_decoder_layer_with_static_cache_sdpa(family: str, dtype: Any, max_tasks: int,
                                                tmp_path: Path) -> None:
    """``LlamaDecoderLayer`` (fp16) and ``Qwen3DecoderLayer`` (bf16, qk-norm), SDPA, one
    decode step with a static cache, 40 and 84 tasks a piece. Replaced: the MLP's norm,
    gate/up and ``silu(g) * u`` whole (one kernel); the down projection with the residual
    (split-K, 2 kernels); the output projection with the residual. The first piece (norm,
    q/k/v, qk-norms, RoPE and the cache writes) is not found whole (Llama's query output with
    RoPE after the norm: 16 operators, 332 tasks) and is cut after its matmuls: the float32
    RMSNorm with the three projections it feeds is one part of several outputs (a kernel per
    output, the norm's statistics computed in each; V's kernel writes the cache), and each
    RoPE rotation, after its head's norm in Qwen3 (found as one kernel within 84 of its 84
    tasks), a part of its own (K's writes the cache). Attention is not found within these
    budgets (40 and 84 of its 377; at 96, one kernel: the test above). Nothing is left out."""
    step = ub.hf_step(family, "sdpa", dtype)
    want, got, report = _compiled(step, step.example_inputs(), tmp_path, max_tasks=max_tasks)
    # Llama's slices of the projection are the part's input views; Qwen3's are of its norm
    rope = f"{RMS_NORM} mul slice_last slice_last neg concat mul add" if family == "qwen3" \
        else "mul neg concat mul add"
    _check(want, got, report, dtype, [f"{RMS_NORM} matmul matmul matmul", rope, rope,
                                      f"{RMS_NORM} matmul silu matmul mul", "matmul add",
                                      "matmul add"])
    (qkv,) = [p for p in report.pieces
              if p.status == REPLACED and p.operators.count("matmul") == 3]
    assert qkv.num_kernels == 3 and qkv.writes == "v_cache by its kernels"
    assert report.left_out == {}
