"""The search's cost model (``lower.cost_model``) on attention plans at paper shapes."""

from __future__ import annotations

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.bench.handwritten_fixtures import attention as split_kv_attention
from egraph_mirage.lower.cost_model import ProgramCost


def test_batch_dimensions_of_a_matmul_are_not_padded() -> None:
    assert ProgramCost.matmul_flop((1, 64, 64), (1, 64, 64)) == 2 * 64 * 64 * 64
    assert ProgramCost.matmul_flop((8, 4, 64), (8, 64, 64)) == 8 * 2 * 16 * 64 * 64  # M to 16
    assert ProgramCost.matmul_flop((2, 64), (64, 96)) == 2 * 16 * 64 * 96


def _scores_then_kernel(g: em.KernelGraph) -> em.KernelGraph:
    """The library matmul ``Q @ K`` writes the scores; one kernel does the rest."""
    h = em.new_kernel_graph()
    Q, K, V = (h.new_input(t.dims, t.dtype) for t in g.inputs)
    S = h.matmul(Q, K)
    heads, lq, lk = S.dims
    tb = em.new_threadblock_graph(grid_dim=(heads, lq // 16, 1), forloop_range=lk // 64)
    s = tb.new_input(S, (0, 1, -1), forloop_dim=2)
    v = tb.new_input(V, (0, -1, -1), forloop_dim=1)
    e = tb.exp(s)
    tb.new_output(tb.div(tb.forloop_accum(tb.matmul(e, v)), tb.forloop_accum(e, "sum")),
                  (0, 1, -1))
    (O,) = h.customized([S, V], tb)
    h.mark_output(O)
    return h


def test_split_kv_attention_ranks_above_writing_the_scores() -> None:
    """Split-KV attention never writes the scores; a plan that does moves them through memory
    twice. (Batch dimensions once padded to 16 made every block's matmuls 16 times dearer.)"""
    cost = ProgramCost()
    for name in ("gqa", "mqa", "mha"):
        g = em.benchmarks.get(name)
        split, scores = split_kv_attention(g), _scores_then_kernel(g)
        assert em.verify(g, scores).equivalent
        assert cost.seconds(split) < cost.seconds(scores), name


def test_a_fused_combine_pays_no_launch() -> None:
    """The lowering runs split-K's combine inside the products kernel by default
    (``lower.fuse``), so the estimate charges one launch for the two kernels; without fusion,
    two. A plan with nothing to fuse costs the same either way."""
    g = em.benchmarks.get("rmsnorm_linear")
    split = fixtures.rmsnorm_linear_split_k(g)
    one = fixtures.rmsnorm_linear(g)
    fused, apart = ProgramCost(), ProgramCost(fused_combines=False)
    assert fused.launches(split) == apart.launches(split) == 2
    assert abs(apart.seconds(split) - fused.seconds(split) - apart.launch_seconds) < 1e-12
    assert fused.seconds(one) == apart.seconds(one)
