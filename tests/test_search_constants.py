"""A program's constants reach the block graphs the search builds: ``rms_norm``'s ``eps`` is
offered to ``add_scalar``, so ``sqrt(mean(x * x) + eps)`` is made from an accumulated mean and
RMSNorm with an ``eps`` (Llama's) fuses with the matmul after it, as RMSNorm without one does."""

from __future__ import annotations

import pytest

import egraph_mirage as em
from egraph_mirage.bench.search_bench import largest_intermediate
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig
from egraph_mirage.search.prepare import program_scalars

#: about twice the tasks the search needs (measured 2026-11-26: the first fused result at task 77)
MAX_TASKS = 160


def rms_norm_linear(eps: float, gain: bool) -> em.KernelGraph:
    g = em.new_kernel_graph()
    x = g.new_input((2, 64), dtype=em.float16)
    w = g.new_input((64, 96), dtype=em.float16)
    operands = (x, g.new_input((1, 64), dtype=em.float16)) if gain else (x,)
    g.mark_output(g.matmul(g.apply("rms_norm", operands, normalized_shape=(64,), eps=eps), w))
    return g


def test_the_constants_of_a_program_are_its_scalars_and_float_parameters() -> None:
    g = rms_norm_linear(1e-6, gain=False)
    assert program_scalars(g) == {1e-6}
    h = em.new_kernel_graph()
    x = h.new_input((4, 8), dtype=em.float16)
    h.mark_output(h.mul_scalar(h.reduction(x, 1), 0.125))
    assert program_scalars(h) == {0.125}


@pytest.mark.parametrize("gain", [False, True], ids=["plain", "gain"])
def test_rms_norm_with_eps_fuses_with_the_matmul(gain: bool) -> None:
    g = rms_norm_linear(1e-6, gain)
    results = superoptimize(g, SearchConfig(max_results=1, max_kernels=1, max_kernel_ops=0),
                            max_tasks=MAX_TASKS, workers=1, progress=False)
    assert results, f"nothing in the first {MAX_TASKS} tasks ({results.stats})"
    best = results.best
    assert best.num_kernels == 1 and largest_intermediate(best.graph) == 0
    (kernel,) = [t.params["kernel"] for t in best.graph.operators]
    assert any(t.op == "add_scalar" and t.params["scalar"] == 1e-6 for t in kernel.tb.tensors)
    assert em.verify(g, best.graph, tests=4, seed=5).equivalent
    assert em.check_numerics(best.graph, g) < 1e-6
    # eps changes the function: the same μGraph is not the program with another eps
    assert not em.verify(rms_norm_linear(1e-3, gain), best.graph, tests=4, seed=5).equivalent
