"""The Triton lowering: hand-written and generic μGraphs run in Triton's interpreter (no GPU) and
match the block-by-block reference; errors are typed; the package needs neither egglog nor JAX.

GPU tests (``-m gpu``) run the hand-written μGraphs at the paper's shapes.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.lower import ACCUMULATOR_EMISSIONS, generate_source
from egraph_mirage.lower.triton_program import pdl_head
from egraph_mirage.mugraph import ACCUMULATORS
from egraph_mirage.ops import BLOCK

ROOT = Path(__file__).resolve().parents[1]
TORCH = {em.float32: torch.float32, em.float16: torch.float16, em.bfloat16: torch.bfloat16}
#: largest error relative to the output's largest magnitude
TOL = {em.float32: 2e-5, em.float16: 1e-2, em.bfloat16: 5e-2}
BENCHMARKS = em.benchmarks.names()
#: compile() runs the kernels in Triton's interpreter when there is no GPU (one mode a process)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(g: em.KernelGraph, dtype: em.DType, seed: int = 0, scale: float = 0.5,
            device: str = DEVICE) -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """Random inputs in ``dtype`` and the same values in float64 (scaled so that exp(Q K) of
    the attention kernels stays inside fp16)."""
    rng = np.random.default_rng(seed)
    ts = [torch.tensor(scale * rng.standard_normal(t.dims), dtype=TORCH[dtype], device=device)
          for t in g.inputs]
    return ts, [t.double().cpu().numpy() for t in ts]


def _check(h: em.KernelGraph, dtype: em.DType, reference: Callable | None = None,
           scale: float = 0.5, **options: object) -> None:
    ts, xs = _inputs(h, dtype, scale=scale)
    expected = (reference or (lambda x: em.run_reference(h, x)))(xs)
    got = em.compile(h, **options)(*ts)
    assert isinstance(got, list) and len(got) == len(expected)
    for k, (a, b) in enumerate(zip(got, expected)):
        assert tuple(a.shape) == b.shape and a.dtype == TORCH[dtype]
        err = np.abs(a.double().cpu().numpy() - b).max() / max(np.abs(b).max(), 1e-30)
        assert err < TOL[dtype], f"output {k}: relative error {err:.2e}"


# --- the hand-written μGraphs ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_handwritten_small(name: str, dtype: em.DType) -> None:
    g = em.benchmarks.get(name, small=True, dtype=dtype)
    _check(fixtures.fused(name, g), dtype, reference=g.evaluate)


FORMS = [(name, k) for name in BENCHMARKS for k in range(len(fixtures.BUILDERS[name]))]


@pytest.mark.parametrize("name,form", FORMS, ids=[f"{n}-{k}" for n, k in FORMS])
def test_every_handwritten_form_small(name: str, form: int) -> None:
    """Each hand-written form (split-K, split-KV, one-kernel, FlashAttention ...) of each
    benchmark, at its default tiles (a form whose tiles overflow the default shared memory at
    the small shapes is built under the H100/H200 budget)."""
    g = em.benchmarks.get(name, small=True)
    build = fixtures.BUILDERS[name][form]
    try:
        h = build(g)
    except em.ResourceError:
        h = build(g, fixtures.Tiles(smem=fixtures.HOPPER_SMEM_BYTES))
    _check(h, em.float16, reference=g.evaluate)


def test_split_kv_attention_takes_the_shared_memory_budget_of_its_tiles() -> None:
    """64 query rows against 128 keys per step overflow the default budget by a few bytes;
    under the H100/H200 budget the split-KV form builds (``variants`` offers it), and its
    kernel keeps those tiles."""
    hw = fixtures
    g = em.benchmarks.get("gqa")
    with pytest.raises(em.ResourceError, match="over the budget of 98304"):
        hw.attention(g, hw.Tiles(loop=128))
    h = hw.attention(g, hw.Tiles(loop=128, smem=hw.HOPPER_SMEM_BYTES))
    first = next(t.params["kernel"].tb for t in h.operators if t.op == "customized")
    assert [x.dims for x in first.inputs] == [(1, 64, 64), (1, 64, 128), (1, 128, 64)]
    assert any(em.to_json(v) == em.to_json(h) for v in hw.variants("gqa", g))


@pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
def test_lora_concat_small(dtype: em.DType) -> None:
    g = em.benchmarks.get("lora", small=True, dtype=dtype)
    _check(fixtures.lora_concat(g), dtype, reference=g.evaluate)


@pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
@pytest.mark.parametrize("name", ["gqa", "mha", "mqa"])
def test_flash_attention_small(name: str, dtype: em.DType) -> None:
    """Online softmax (running max, rescaled accumulators) against the reference interpreter,
    on inputs large enough that exponentiating without the max would overflow fp16; the
    interpreter agrees with the plain program."""
    g = em.benchmarks.get(name, small=True, dtype=dtype)
    h = fixtures.flash_attention(g)
    _check(h, dtype, scale=3.0)
    _, xs = _inputs(g, dtype, scale=3.0)
    assert np.allclose(em.run_reference(h, xs)[0], g.evaluate(xs)[0], rtol=1e-9, atol=1e-9)


def test_rmsnorm_linear_gain_small() -> None:
    g = em.benchmarks.get("rmsnorm_linear", small=True, dtype=em.float16, gain=True)
    _check(fixtures.fused("rmsnorm_linear", g), em.float16, reference=g.evaluate)


@pytest.mark.parametrize("name", ["rmsnorm_linear", "gated_mlp"])
def test_bfloat16_runs_with_fp32_dots(name: str) -> None:
    """bf16 tl.dot is wrong in the interpreter: compile() casts dot operands to fp32 there."""
    g = em.benchmarks.get(name, small=True, dtype=em.bfloat16)
    h = fixtures.fused(name, g)
    assert "tl.bfloat16" in generate_source(h)
    fn = em.compile(h)
    assert ("tl.dot(b0.to(tl.float32)" in fn.source) == fn.interpret
    _check(h, em.bfloat16, reference=g.evaluate)


# --- generic block graphs ----------------------------------------------------------------------

def _graph(*dims: tuple[int, ...], dtype: em.DType = em.float32):
    h = em.new_kernel_graph()
    return h, [h.new_input(d, dtype) for d in dims]


def _matmul_epilogue(grid: tuple[int, int, int], xmap: tuple[int, int, int],
                     wmap: tuple[int, int, int], omap: tuple[int, int, int], loop: int,
                     op: str, m: int = 24, k: int = 64, n: int = 48) -> em.KernelGraph:
    """X (m, k) @ W (k, n) with the rows of X on one grid axis, the columns of W on another,
    the loop over k, and an element-wise operator after the loop."""
    h, (X, W) = _graph((m, k), (k, n))
    tb = em.new_threadblock_graph(grid_dim=grid, forloop_range=loop)
    x = tb.new_input(X, xmap, forloop_dim=1)
    w = tb.new_input(W, wmap, forloop_dim=0)
    acc = tb.forloop_accum(tb.matmul(x, w))
    out = tb.mul_scalar(acc, 0.5) if op == "mul_scalar" else tb.apply(op, (acc,))
    tb.new_output(out, omap)
    (O,) = h.customized([X, W], tb)
    h.mark_output(O)
    return h


MAP_CASES = [  # grid, imap of X, imap of W, omap, loop, epilogue operator
    ((1, 1, 1), (-1, -1, -1), (-1, -1, -1), (-1, -1, -1), 4, "relu"),
    ((2, 1, 1), (-1, -1, -1), (1, -1, -1), (1, -1, -1), 2, "gelu"),
    ((3, 2, 1), (-1, 0, -1), (1, -1, -1), (1, 0, -1), 4, "silu"),
    ((1, 2, 3), (-1, -1, 0), (-1, 1, -1), (-1, 1, 0), 1, "exp"),
    ((2, 1, 3), (-1, -1, 0), (1, -1, -1), (1, -1, 0), 2, "square"),
    ((1, 3, 4), (-1, 0, -1), (-1, -1, 1), (-1, 0, 1), 8, "mul_scalar"),  # k tiles of 8
]


@pytest.mark.parametrize("case", range(len(MAP_CASES)))
def test_matmul_maps(case: int) -> None:
    _check(_matmul_epilogue(*MAP_CASES[case]), em.float32)


def _reduction_mean() -> em.KernelGraph:
    """Block reduction over rows, mean accumulator, non-power-of-two tiles (6 × 12)."""
    h, (X,) = _graph((12, 48))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)
    r = tb.reduction(tb.relu(x), 0)                      # (1, 12)
    tb.new_output(tb.forloop_accum(tb.mul(tb.add(x, r), x), "mean"), (0, -1, -1))
    tb.new_output(tb.forloop_accum(r), (1, -1, -1))     # the blocks' row sums side by side
    for O in h.customized([X], tb):
        h.mark_output(O)
    return h


def _concat_matmul() -> em.KernelGraph:
    """concat in the block graph, then a dot over the joined dimension (12 + 20 = 32)."""
    h, (A, B, W) = _graph((8, 48), (8, 80), (32, 16))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    a = tb.new_input(A, (0, -1, -1), forloop_dim=1)       # (4, 12)
    b = tb.new_input(B, (0, -1, -1), forloop_dim=1)       # (4, 20)
    w = tb.new_input(W, (-1, -1, -1), forloop_dim=-1)     # (32, 16), the same every iteration
    c = tb.concat(tb.exp(a), b, 1)                        # (4, 32)
    tb.new_output(tb.forloop_accum(tb.matmul(c, w)), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.concat(a, a, 0), "rms"), (0, -1, -1))
    for O in h.customized([A, B, W], tb):
        h.mark_output(O)
    return h


def _rms_norm_gain_rows() -> em.KernelGraph:
    """rms_norm with a gain in the block graph; a 1-row matmul (M = 1 padded to 16) broadcast
    against a 4-row tile after the loop; an invariant accumulator."""
    h, (X, W, Y, G) = _graph((1, 64), (64, 32), (4, 32), (1, 16))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)     # (1, 16)
    w = tb.new_input(W, (1, -1, -1), forloop_dim=0)      # (16, 16)
    y = tb.new_input(Y, (1, -1, -1), forloop_dim=-1)     # (4, 16), invariant
    gain = tb.new_input(G, (1, -1, -1), forloop_dim=-1)  # (1, 8), joined to (1, 16) below
    xn = tb.apply("rms_norm", (tb.matmul(x, w), tb.concat(gain, gain, 1)),
                  normalized_shape=(16,))
    acc = tb.forloop_accum(xn)                            # (1, 16)
    inv = tb.forloop_accum(tb.sqrt(tb.square(y)))        # 4 × |y|
    tb.new_output(tb.div(tb.add(acc, inv), tb.forloop_accum(y, "sum")), (1, -1, -1))
    h.mark_output(h.customized([X, W, Y, G], tb)[0])
    return h


def _batched_todimx() -> em.KernelGraph:
    """Rank-3 tiles, a batched dot whose left operand broadcasts over the batch, and
    sum_todimx to a width of 12 (not a power of two) on three grid axes."""
    h, (A, B) = _graph((1, 16, 32), (4, 32, 48))
    tb = em.new_threadblock_graph(grid_dim=(2, 2, 1), forloop_range=2, reduction_dimx=12)
    a = tb.new_input(A, (-1, 1, -1), forloop_dim=2)       # (1, 8, 16)
    b = tb.new_input(B, (0, -1, -1), forloop_dim=1)       # (2, 16, 48)
    ab = tb.matmul(a, b)                                   # (2, 8, 48)
    tb.new_output(tb.forloop_accum(ab, "sum_todimx"), (0, 1, -1))
    tb.new_output(tb.forloop_accum(tb.gelu(ab)), (0, 1, -1))
    for O in h.customized([A, B], tb):
        h.mark_output(O)
    return h


def _batch_of_one(dimx: int = 12) -> em.KernelGraph:
    """Rank-3 tiles whose batch dimension is 1 in every tile, which the code holds as 2-D
    blocks: reductions over the batch dimension (size 1) and over a middle dimension broadcast
    back, sum_todimx to ``dimx`` (12: gathers; 16: a reshape and a sum), a one-row matmul
    (padded to 16 rows) added to four rows, concat, online softmax, rms."""
    h, (A, B, Y) = _graph((2, 8, 32), (2, 32, 48), (2, 4, 48))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=2, reduction_dimx=dimx)
    a = tb.new_input(A, (0, -1, -1), forloop_dim=2)       # (1, 8, 16)
    b = tb.new_input(B, (0, -1, -1), forloop_dim=1)       # (1, 16, 48)
    y = tb.new_input(Y, (0, -1, -1), forloop_dim=-1)      # (1, 4, 48), invariant
    col = tb.reduction(tb.reduction(a, 0), 1)              # (1, 1, 16); dim 0 has size 1
    ab = tb.matmul(tb.add(a, col), b)                      # (1, 8, 48)
    tb.new_output(tb.forloop_accum(ab, "sum_todimx"), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.add(tb.matmul(col, b), y)), (0, -1, -1))
    c = tb.concat(ab, tb.exp(ab), 2)                       # (1, 8, 96)
    m = tb.forloop_max(c)
    p = tb.exp(tb.add(c, tb.mul_scalar(m, -1.0)))
    tb.new_output(tb.forloop_accum(p, "sum", rescale=m), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.rms_norm(ab), "rms"), (0, -1, -1))
    for O in h.customized([A, B, Y], tb):
        h.mark_output(O)
    return h


def _transformer_ops() -> em.KernelGraph:
    """The element-wise operators and reductions of transformer blocks on padded (6, 12) tiles:
    mean and amax over either dimension, rms_norm with eps, a division by a count."""
    h, (X, Y) = _graph((12, 48), (12, 48))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)       # (6, 12)
    y = tb.new_input(Y, (0, -1, -1), forloop_dim=1)
    s = tb.sub(tb.sigmoid(x), tb.tanh(tb.neg(tb.div_count(y, 3))))
    g = tb.add(tb.gelu_tanh(x), tb.gelu_erf(y))
    r = tb.rsqrt(tb.add_scalar(tb.mean(tb.mul(x, x), 1), 0.5))  # (6, 1)
    tb.new_output(tb.forloop_accum(tb.add(tb.mul(s, r), tb.amax(g, 0))), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.rms_norm(g, eps=1e-3), "mean"), (0, -1, -1))
    for O in h.customized([X, Y], tb):
        h.mark_output(O)
    return h


def _heads_sharing_a_key_head(dtype: em.DType = em.float32) -> em.KernelGraph:
    """Grouped-query attention's product, as a GQA decode piece's search gave it: rank-5 tiles
    (batch, key head, query head of the group, row, ...) whose batch and key-head dimensions
    are 1 in every tile (left out of the code), four query heads sharing one key head: tiles
    (1, 1, 4, 1, 16) @ (1, 1, 1, 16, 64), once "tl.dot takes tiles of rank 2 or 3"."""
    h, (A, B) = _graph((2, 2, 4, 1, 32), (2, 2, 1, 32, 64), dtype=dtype)
    tb = em.new_threadblock_graph(grid_dim=(2, 2, 1), forloop_range=2)
    a = tb.new_input(A, (0, 1, -1), forloop_dim=4)        # (1, 1, 4, 1, 16)
    b = tb.new_input(B, (0, 1, -1), forloop_dim=3)        # (1, 1, 1, 16, 64)
    tb.new_output(tb.forloop_accum(tb.matmul(a, b)), (0, 1, -1))
    h.mark_output(h.customized([A, B], tb)[0])
    return h


def _two_batch_dimensions() -> em.KernelGraph:
    """Rank-4 tiles kept whole in the code, the right operand broadcast over the second batch
    dimension: (2, 4, 16, 16) @ (2, 1, 16, 48)."""
    h, (A, B) = _graph((2, 4, 16, 32), (2, 1, 32, 48))
    tb = em.new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=2)
    a = tb.new_input(A, (-1, -1, -1), forloop_dim=3)
    b = tb.new_input(B, (-1, -1, -1), forloop_dim=2)
    tb.new_output(tb.forloop_accum(tb.matmul(a, b)), (-1, -1, -1))
    h.mark_output(h.customized([A, B], tb)[0])
    return h


def _casts() -> em.KernelGraph:
    """Casts in a block graph: X's and W's tiles rounded to float16 and back to float32 (the
    rounding of loaded values, the same in the reference), then X @ W. (Triton's interpreter
    truncates to bfloat16 where a GPU rounds to nearest: ``tests/test_mixed_precision.py``
    checks bfloat16 casts within bfloat16's tolerance.)"""
    h, (X, W) = _graph((8, 64), (64, 32))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)      # (8, 16)
    w = tb.new_input(W, (1, -1, -1), forloop_dim=0)       # (16, 16)
    xr = tb.cast(tb.cast(x, em.float16), em.float32)
    wr = tb.cast(tb.cast(w, em.float16), em.float32)
    tb.new_output(tb.forloop_accum(tb.matmul(xr, wr)), (1, -1, -1))
    h.mark_output(h.customized([X, W], tb)[0])
    return h


GENERIC = {"reduction_mean": _reduction_mean, "concat_matmul": _concat_matmul,
           "rms_norm_gain_rows": _rms_norm_gain_rows, "batched_todimx": _batched_todimx,
           "batch_of_one": _batch_of_one, "batch_of_one_dimx16": lambda: _batch_of_one(16),
           "transformer_ops": _transformer_ops,
           "heads_sharing_a_key_head": _heads_sharing_a_key_head,
           "two_batch_dimensions": _two_batch_dimensions, "casts": _casts}


@pytest.mark.parametrize("name", GENERIC)
def test_generic_block_graphs(name: str) -> None:
    _check(GENERIC[name](), em.float32)


def test_query_heads_sharing_a_key_head_lower_as_one_2d_dot_in_fp16() -> None:
    """The GQA tiles of a verified μGraph that once failed to lower: the four query heads'
    rows fold into one 2-D dot against the shared key head (no copy of it per query head),
    and the result matches in fp16."""
    h = _heads_sharing_a_key_head(em.float16)
    src = generate_source(h)
    assert "tl.dot(tl.reshape(" in src and "tl.broadcast_to" not in src
    _check(h, em.float16)


def test_a_batch_of_one_is_written_as_2d_blocks() -> None:
    """A leading dimension of block size 1 in every tile is left out of the code (no 3-D
    blocks, no reshapes around tl.dot); a batch tile of 2 keeps its rank-3 blocks."""
    squeezed = generate_source(_batch_of_one())
    assert "[:, None, None]" not in squeezed and "tl.reshape(tl.dot" not in squeezed
    assert "tl.zeros((16, 1), tl.float32)" in squeezed  # the (1, 8, 1) sums, rows padded
    assert "[:, None, None]" in generate_source(_batched_todimx())


def test_a_tile_feeding_a_large_dot_and_register_code_is_loaded_twice() -> None:
    """RMSNorm + Linear at 64 rows: X's tile feeds the 64-row dot (Hopper's wgmma, whose
    operands Triton stages in shared memory) and the sum of squares, so the sum of squares reads
    its own ``.cg`` load of the tile (Triton 3.6 miscompiled the shared use on an H200); at 32
    rows the code keeps one load. Either way the numbers match the fixtures."""
    big = em.benchmarks.get("rmsnorm_linear", batch=32, small=True)  # X (64, 64)
    h = fixtures.fused("rmsnorm_linear", big)
    src = generate_source(h)
    assert 'b0_r = tl.load(in0 + b0_off + i * 16, cache_modifier=".cg")' in src
    assert "tl.dot(b0, b1)" in src and "b0_r.to(tl.float32) * b0_r.to(tl.float32)" in src
    _check(h, em.float16, reference=big.evaluate)
    small = fixtures.fused("rmsnorm_linear", em.benchmarks.get("rmsnorm_linear", batch=16,
                                                                     small=True))
    assert "_r = tl.load" not in generate_source(small)


def test_swap_dots_writes_a_few_row_dot_transposed() -> None:
    """``swap_dots`` (a knob the tuner tries where it applies) writes 4 rows of X against a
    128-column tile of W as (Wᵀ Xᵀ)ᵀ, so that W's columns are the tensor cores' rows, and gives
    the sum of squares its own load of X (the swapped dot runs as wgmma); numbers unchanged."""
    for dtype in (em.float16, em.float32):
        g = em.new_kernel_graph()
        X, W = g.new_input((4, 256), dtype), g.new_input((256, 256), dtype)
        g.mark_output(g.matmul(g.rms_norm(X, (256,)), W))
        h = fixtures.rmsnorm_linear_split_k(g, fixtures.Tiles(grid=128))
        assert em.lower.graph_knobs(h)["swap_dots"] == (False, True)
        _check(h, dtype, reference=g.evaluate, swap_dots=True)
    src = generate_source(h, em.lower.LowerOptions(swap_dots=True))
    assert "tl.trans(tl.dot(tl.trans(b1), tl.trans(b0)" in src
    assert ("b0_r = tl.load(in0 + b0_off + i * 16, mask=b0_mask, other=0.0, "
            'cache_modifier=".cg")') in src
    assert "tl.trans" not in generate_source(h)
    small = fixtures.fused("rmsnorm_linear", em.benchmarks.get("rmsnorm_linear",
                                                                     small=True))
    assert "swap_dots" not in em.lower.graph_knobs(small)  # 32-column tiles: nothing to swap
    # attention's dots (rank-3 tiles, P computed) are never swapped
    gqa = em.benchmarks.get("gqa")
    assert not any("swap_dots" in em.lower.graph_knobs(v)
                   for v in fixtures.variants("gqa", gqa))


def test_pdl_lets_each_kernel_after_the_first_wait_for_the_one_before() -> None:
    """``pdl`` (a knob the tuner tries where a program launches two kernels or more): the
    first kernel lets the next one launch early, each later kernel waits for the kernels
    before it (``gdc_wait``) before its first statement and is launched with ``pdl=PDL``; PDL
    is off under the interpreter, so the numbers are the program's. With the combine fused
    the program is one launch and ``pdl`` changes nothing."""
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    h = fixtures.rmsnorm_linear_split_k(g)
    assert em.lower.graph_knobs(h)["pdl"] == (False, True)
    src = generate_source(h, em.lower.LowerOptions(fuse_combines=False, pdl=True))
    first, second = src.split("def kernel_1(")
    assert "gdc_launch_dependents()" in first and "gdc_wait()" not in first
    assert "gdc_wait()" in second.split("def run(")[0]
    assert "gdc_launch_dependents()" not in second.split("def run(")[0]
    launches = [line for line in src.splitlines() if line.strip().startswith("_launch(kernel")]
    assert [line.endswith("pdl=PDL)") for line in launches] == [False, True]
    _check(h, em.float16, reference=g.evaluate, fuse_combines=False, pdl=True)
    assert generate_source(h, em.lower.LowerOptions(pdl=True)) == generate_source(h)
    assert em.lower.canonical_knobs(h, {"fuse_combines": True, "pdl": True})["pdl"] is False
    assert "pdl" not in em.lower.graph_knobs(fixtures.flash_attention(
        em.benchmarks.get("gqa", small=True)))  # one kernel
    # a kernel between two others waits, then lets the next launch
    middle = "\n".join(pdl_head(1, 3))
    assert middle.index("gdc_wait()") < middle.index("gdc_launch_dependents()")


def test_generic_graphs_cover_the_block_ops_and_accumulators() -> None:
    ops, accs = set(), set()
    graphs = [f() for f in GENERIC.values()]
    graphs += [_matmul_epilogue(*c) for c in MAP_CASES]
    graphs.append(_rotary_of_halves(32))  # slice_last: halves of a tile
    for h in graphs:
        for t in h.operators:
            if t.op == "customized":
                for b in t.params["kernel"].tb.tensors:
                    ops.add(b.op)
                    accs.add(b.params.get("acc"))
    block_ops = {n for n, s in em.OPS.items() if BLOCK in s.levels}
    assert block_ops <= ops, block_ops - ops
    assert set(ACCUMULATORS) <= accs


def test_library_operators_between_kernels() -> None:
    """Library operators (torch) before, between and after kernels, reusing one block graph."""
    h, (X, W) = _graph((4, 32), (32, 32), dtype=em.float16)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=2)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, (1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(x, w)), (1, -1, -1))
    (A,) = h.customized([h.rms_norm(X, (32,)), W], tb)
    (B,) = h.customized([h.silu(A), h.gelu(W)], tb)
    C = h.reduction(h.concat(h.exp(h.mul_scalar(B, 0.1)), h.sqrt(h.square(A)), 0), 1)
    h.mark_output(C)
    h.mark_output(X)
    assert generate_source(h).count("@triton.jit") == 1  # one kernel, launched twice
    _check(h, em.float16)


# --- online softmax: corner cases ---------------------------------------------------------------

def _rescaled_kinds(dtype: em.DType) -> em.KernelGraph:
    """Every linear kind rescaled by a running max of another input; a loaded tile (in the
    storage dtype) as the rescale tile; an invariant operand rescaled by a loop-side max."""
    h, (X, Y, Z) = _graph((4, 64), (4, 64), (4, 8), dtype=dtype)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4, reduction_dimx=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)       # (2, 16)
    y = tb.new_input(Y, (0, -1, -1), forloop_dim=1)
    z = tb.new_input(Z, (0, -1, -1), forloop_dim=-1)      # (2, 8), invariant
    m = tb.forloop_max(y)
    for acc in (None, "sum", "mean", "sum_todimx"):
        tb.new_output(tb.forloop_accum(x, acc, rescale=m), (0, -1, -1))
    tb.new_output(tb.forloop_accum(x, rescale=y), (0, -1, -1))
    tb.new_output(tb.forloop_accum(z, "sum", rescale=m), (0, -1, -1))
    for O in h.customized([X, Y, Z], tb):
        h.mark_output(O)
    return h


def _shared_rescale(sum_first: bool, dtype: em.DType) -> em.KernelGraph:
    """One rescale tile for two accumulators, broadcast (shrunk to one column) for only one of
    them: the max is the K = 1 dimension of a dot, so its column is padded to 16."""
    h, (X, W) = _graph((4, 128), (1, 16), dtype=dtype)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)       # (2, 32)
    w = tb.new_input(W, (-1, -1, -1), forloop_dim=-1)     # (1, 16)
    m = tb.forloop_max(x)                                  # (2, 1), block (16, 16)
    kinds = ["sum", None] if sum_first else [None, "sum"]
    for acc in kinds:
        tb.new_output(tb.forloop_accum(x, acc, rescale=m), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.matmul(m, w)), (0, -1, -1))
    for O in h.customized([X, W], tb):
        h.mark_output(O)
    return h


def _all_invariant(dtype: em.DType) -> em.KernelGraph:
    """No tile changes with the loop (forloop_range 3): the kernel has no loop at all."""
    h, (X,) = _graph((2, 8), dtype=dtype)
    tb = em.new_threadblock_graph(forloop_range=3)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=-1)
    m = tb.forloop_max(x)
    tb.new_output(tb.forloop_accum(tb.exp(tb.add(x, tb.mul_scalar(m, -1.0))), "sum"),
                  (-1, -1, -1))
    tb.new_output(tb.forloop_accum(x, "mean", rescale=m), (-1, -1, -1))
    for O in h.customized([X], tb):
        h.mark_output(O)
    return h


ONLINE = {"rescaled_kinds": _rescaled_kinds,
          "shared_rescale_sum_first": lambda d: _shared_rescale(True, d),
          "shared_rescale_plain_first": lambda d: _shared_rescale(False, d),
          "all_invariant": _all_invariant}


@pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
@pytest.mark.parametrize("name", ONLINE)
def test_online_softmax_corner_cases(name: str, dtype: em.DType) -> None:
    _check(ONLINE[name](dtype), dtype, scale=1.0)


def test_rescale_with_infinite_max_follows_the_reference() -> None:
    """Rows whose first tiles, or all, are -inf (a mask hiding keys): every max is at least
    the lowest finite fp32, so no factor is exp(-inf - -inf) = NaN; the lowering gives the
    reference interpreter's finite results."""
    h = _rescaled_kinds(em.float32)
    ts, xs = _inputs(h, em.float32, scale=1.0)
    for k, cols in ((0, 16), (1, 32), (2, 64)):
        ts[1][k, :cols] = -torch.inf
        xs[1][k, :cols] = -np.inf
    want = em.run_reference(h, xs)
    got = [o.double().cpu().numpy() for o in em.compile(h)(*ts)]
    for k, (a, b) in enumerate(zip(got, want)):
        assert np.isfinite(b).all() and np.allclose(a, b, rtol=1e-5, atol=1e-5), f"output {k}"


# --- the table-driven parts ---------------------------------------------------------------------

def test_every_accumulator_has_an_emission() -> None:
    assert set(ACCUMULATORS) == set(ACCUMULATOR_EMISSIONS)


def test_silu_is_x_sigmoid_x() -> None:
    assert em.OPS["silu"].triton.tile(["x"], None, {}) == "x * tl.sigmoid(x)"


@pytest.mark.parametrize("name", sorted(n for n in em.OPS if n != "customized"))
def test_host_emission_matches_reference(name: str) -> None:
    """Every library operator's torch text computes its op-table fixtures."""
    rng = np.random.default_rng(1)
    shapes = {"matmul": [(2, 3, 4), (1, 4, 5)], "concat": [(2, 1, 4), (2, 3, 1)],
              "rms_norm": [(2, 3, 4), (1, 1, 4)]}.get(name, [(2, 3, 4), (2, 1, 4)])
    spec = em.OPS[name]
    shapes = shapes[:spec.num_inputs[1]]
    params = {"dim": -1, "scalar": 0.25, "normalized_shape": (4,), "start": 1, "stop": 3,
              "count": 4, "dtype": "bfloat16"}
    params = {k: params[k] for k in spec.params}
    xs = [np.abs(rng.standard_normal(s)) + 0.1 for s in shapes]
    text = spec.triton.host([f"x{k}" for k in range(len(xs))], shapes, params)
    got = eval(text, {"torch": torch}, {f"x{k}": torch.tensor(x) for k, x in enumerate(xs)})
    np.testing.assert_allclose(got.double().numpy(), spec.reference(xs, params), rtol=1e-10)


# --- errors ---------------------------------------------------------------------------------------

def test_a_rank4_matmul_lowers_with_its_batch_folded() -> None:
    """Once a lowering error ("tl.dot takes tiles of rank 2 or 3"): the leading dimension of
    size 1 is left out of the code and the other batch dimension folded into a 3-D dot."""
    h, (A, B) = _graph((1, 2, 16, 16), (1, 2, 16, 16))
    tb = em.new_threadblock_graph(forloop_range=1)
    a = tb.new_input(A, (-1, -1, -1))
    b = tb.new_input(B, (-1, -1, -1))
    tb.new_output(tb.forloop_accum(tb.matmul(a, b)), (-1, -1, -1))
    h.mark_output(h.customized([A, B], tb)[0])
    assert "tl.dot(tl.reshape(" in generate_source(h)
    _check(h, em.float32)


def test_bad_options_and_inputs() -> None:
    h = _matmul_epilogue((2, 1, 1), (-1, -1, -1), (1, -1, -1), (1, -1, -1), 2, "relu")
    with pytest.raises(em.LowerError, match="num_warps"):
        em.compile(h, num_warps=3)
    with pytest.raises(em.LowerError, match=r"unknown lowering option.*tile_m"):
        em.compile(h, tile_m=64)
    fn = em.compile(h, num_warps=8, num_stages=3)
    assert "NUM_WARPS = 8" in fn.source and "NUM_STAGES = 3" in fn.source
    ts, _ = _inputs(h, em.float32)
    with pytest.raises(em.ShapeError, match="input 1"):
        fn(ts[0], ts[0])
    with pytest.raises(em.DTypeError, match="input 0"):
        fn(ts[0].half(), ts[1])
    assert len(fn(*ts, num_warps=2)) == 1


# --- files and imports -------------------------------------------------------------------------

def test_program_file_is_standalone(tmp_path: Path) -> None:
    """The written file runs in a process where egraph_mirage, egglog and JAX cannot import."""
    g = em.benchmarks.get("rmsnorm_linear", small=True, dtype=em.float32)
    h = fixtures.fused("rmsnorm_linear", g)
    path = tmp_path / "program.py"
    source = em.generate_triton_program(h, path, num_warps=2)
    assert path.read_text() == source and "NUM_WARPS = 2" in source
    ts, xs = _inputs(g, em.float32, device="cpu")  # the subprocess runs the interpreter
    torch.save(ts, tmp_path / "inputs.pt")
    np.save(tmp_path / "expected.npy", g.evaluate(xs)[0])
    script = f"""
import sys, os
for m in ("egglog", "jax", "egraph_mirage"):
    sys.modules[m] = None
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {str(tmp_path)!r})
import numpy as np, torch
import program
(out,) = program.run(*torch.load({str(tmp_path / "inputs.pt")!r}))
err = np.abs(out.double().numpy() - np.load({str(tmp_path / "expected.npy")!r})).max()
assert err < 1e-4, err
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


def test_lowering_imports_without_egglog_jax_triton() -> None:
    script = """
import sys
for m in ("egglog", "jax"):
    sys.modules[m] = None
import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
import egraph_mirage.lower
assert "triton" not in sys.modules and "torch" not in sys.modules, "eager import"
g = em.benchmarks.get("gqa", small=True)
src = egraph_mirage.lower.generate_source(fixtures.fused("gqa", g))
assert "triton" not in sys.modules and src.count("@triton.jit") == 2
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]


# --- GPU ------------------------------------------------------------------------------------------

BUILDERS = {name: (name, fixtures.fused) for name in BENCHMARKS}
BUILDERS["lora_concat"] = ("lora", lambda name, g: fixtures.lora_concat(g))
BUILDERS["flash_gqa"] = ("gqa", lambda name, g: fixtures.flash_attention(g))
BUILDERS["one_kernel_mqa"] = ("mqa", lambda name, g: fixtures.attention_one_kernel(g))
BUILDERS["qknorm_one_kernel"] = ("qknorm", lambda name, g: fixtures.qknorm_one_kernel(
    g, fixtures.Tiles(smem=fixtures.HOPPER_SMEM_BYTES)))
BUILDERS["rmsnorm_linear_split_k"] = ("rmsnorm_linear",
                                      lambda name, g: fixtures.rmsnorm_linear_split_k(g))
BUILDERS["gated_mlp_split_k"] = ("gated_mlp", lambda name, g: fixtures.gated_mlp_split_k(g))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [em.float16, em.bfloat16, em.float32], ids=lambda d: d.value)
@pytest.mark.parametrize("name", BUILDERS)
def test_handwritten_paper_shapes_gpu(name: str, dtype: em.DType) -> None:
    program, build = BUILDERS[name]
    g = em.benchmarks.get(program, dtype=dtype)
    try:
        h = build(program, g)
    except em.ResourceError as e:  # the builder's tiles do not fit in fp32
        pytest.skip(str(e))
    # small inputs: the split-KV attention exponentiates without the max, and its partial sums
    # are fp16 device tensors
    _check(h, dtype, reference=g.evaluate, scale=0.1)


def test_the_lowering_is_a_list_of_named_stages() -> None:
    """Each stage's artefact can be inspected; the last is the generated program."""
    from egraph_mirage.lower import LowerOptions, lowering_stages

    g = em.benchmarks.get("gqa", small=True)
    h = fixtures.fused("gqa", g)
    done = lowering_stages(h, LowerOptions(pdl=True))
    assert list(done) == ["plan", "emit", "program"]
    assert len(done["plan"].order) >= 1 and all(done["plan"].names.values())
    assert all(src.lstrip().startswith("@triton.jit") for src in done["emit"].kernel_sources)
    assert any(line.startswith("_launch(") for line in done["emit"].body)
    assert done["program"] == generate_source(h, LowerOptions(pdl=True))


def _rotary(halves: tuple[int, int]) -> em.KernelGraph:
    """RoPE's rotation of 8 rows: ``x * cos + concat(-x2, x1) * sin`` in one kernel, the
    halves ``x1``, ``x2`` of ``halves`` columns each."""
    from egraph_mirage.mugraph import new_threadblock_graph

    n = sum(halves)
    g = em.new_kernel_graph()
    x1, x2 = g.new_input((8, halves[0])), g.new_input((8, halves[1]))
    cos, sin, x = g.new_input((1, n)), g.new_input((1, n)), g.new_input((8, n))
    tb = new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=1)
    a = tb.new_input(x1, (0, -1, -1), forloop_dim=-1)
    b = tb.new_input(x2, (0, -1, -1), forloop_dim=-1)
    c = tb.new_input(cos, (-1, -1, -1), forloop_dim=-1)
    s = tb.new_input(sin, (-1, -1, -1), forloop_dim=-1)
    t = tb.new_input(x, (0, -1, -1), forloop_dim=-1)
    rotated = tb.mul(tb.concat(tb.neg(b), a, 1), s)
    tb.new_output(tb.forloop_accum(tb.add(tb.mul(t, c), rotated)), (0, -1, -1))
    (out,) = g.customized([x1, x2, cos, sin, x], tb)
    g.mark_output(out)
    return g


@pytest.mark.parametrize("halves", [(32, 32), (32, 16)])
def test_a_concat_of_equal_halves_is_a_join_not_a_gather(halves: tuple[int, int]) -> None:
    """Two halves of one size are interleaved with ``tl.join`` (Triton 3.6 failed to compile
    RoPE's ``tl.gather`` form for the GPU: ``TritonGPUOptimizeThreadLocality``); other sizes
    keep the gather. Both compute the same."""
    g = _rotary(halves)
    source = generate_source(g)
    equal = halves[0] == halves[1]
    assert ("tl.join(" in source) == equal and ("tl.gather(" in source) != equal
    _check(g, em.float16, reference=lambda xs: [
        xs[4] * xs[2] + np.concatenate([-xs[1], xs[0]], axis=1) * xs[3]])


def _rotary_of_halves(n: int) -> em.KernelGraph:
    """RoPE's rotation of 8 rows in one kernel, the halves taken in the thread block:
    ``x * cos + concat(-x[:, n/2:], x[:, :n/2]) * sin``."""
    from egraph_mirage.mugraph import new_threadblock_graph

    g = em.new_kernel_graph()
    x, cos, sin = g.new_input((8, n)), g.new_input((1, n)), g.new_input((1, n))
    tb = new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=1)
    t = tb.new_input(x, (0, -1, -1), forloop_dim=-1)
    c = tb.new_input(cos, (-1, -1, -1), forloop_dim=-1)
    s = tb.new_input(sin, (-1, -1, -1), forloop_dim=-1)
    first = tb.apply("slice_last", [t], start=0, stop=n // 2)
    second = tb.apply("slice_last", [t], start=n // 2, stop=n)
    rotated = tb.mul(tb.concat(tb.neg(second), first, 1), s)
    tb.new_output(tb.forloop_accum(tb.add(tb.mul(t, c), rotated)), (0, -1, -1))
    (out,) = g.customized([x, cos, sin], tb)
    g.mark_output(out)
    return g


def test_a_half_of_a_tile_is_sliced_in_the_thread_block() -> None:
    """``slice_last`` at block level takes a half of a tile that holds its whole last dim: the
    dim split into (2, half) and taken apart with ``tl.split``; the kernel computes RoPE's
    rotation as numpy does. Another range, or a padded tile, is a ``LowerError``."""
    g = _rotary_of_halves(32)
    assert generate_source(g).count("tl.split(") == 2
    _check(g, em.float16, reference=lambda xs: [
        xs[0] * xs[1] + np.concatenate([-xs[0][:, 16:], xs[0][:, :16]], axis=1) * xs[2]])
    with pytest.raises(em.LowerError, match="only a half"):
        generate_source(_rotary_of_halves(24))  # 24 columns are padded to 32


def test_an_input_is_read_in_place_through_the_strides_of_its_view() -> None:
    """``input_strides``: the kernels read a transposed weight (``nn.Linear``'s W, stored
    (out, in), used as Wᵀ) through the view's strides, with no contiguous copy; the program
    matches the one reading a contiguous copy, and a copy with other strides is made to fit."""
    import torch

    g = em.new_kernel_graph()
    x = g.new_input((4, 64), em.float16)
    w = g.new_input((64, 32), em.float16)
    g.mark_output(g.relu(g.matmul(x, w)))
    found = em.superoptimize(g, em.SearchConfig(max_results=1), max_tasks=40, workers=1,
                             progress=False).best.graph
    assert all(t.op == "customized" for t in found.operators)
    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(4, 64, generator=gen).half()
    stored = (torch.randn(32, 64, generator=gen) / 8).half()  # (out, in)
    wt = stored.t()  # (64, 32), strides (1, 64)
    plain = em.compile(found)
    strided = em.compile(found, input_strides=(None, (1, 64)))
    assert "(1, 64)" in strided.source and strided.source != plain.source
    want = plain(xs, wt.contiguous())[0]
    torch.testing.assert_close(strided(xs, wt)[0], want)
    torch.testing.assert_close(strided.module.launch(xs, wt)[0], want)  # in place, no copy
    assert not torch.allclose(plain.module.launch(xs, wt)[0], want)  # read row-major: wrong
    torch.testing.assert_close(strided(xs, wt.contiguous())[0], want)  # copied to fit
