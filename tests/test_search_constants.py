"""A program's constants reach the block graphs the search builds: ``rms_norm``'s ``eps`` (and
any other float parameter or scalar) is offered to ``add_scalar`` and, where positive, as the eps
of the ``"rms+EPS"`` accumulator (``sqrt(mean(x²) + eps)`` in one accumulator,
``mugraph.accumulators.rms_with_eps``). So RMSNorm with an ``eps`` (Llama's) fuses with the
matmul after it, as RMSNorm without one does, whether written as ``rms_norm`` or as
``transformers`` writes it (float32 inside, ``x * rsqrt(mean(x²) + eps)``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from model_programs import transformers_norm_projection

import egraph_mirage as em
from egraph_mirage.bench.search_bench import largest_intermediate
from egraph_mirage.mugraph import serialize
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig
from egraph_mirage.search.prepare import program_scalars

#: about twice the tasks the search needs (measured 2026-11-28: the first fused result at task
#: 25 without a gain, 37 with one; 77 before the "rms+EPS" accumulator, from an accumulated mean,
#: add_scalar and a root)
MAX_TASKS = 80


def rms_norm_linear(eps: float, gain: bool) -> em.KernelGraph:
    g = em.new_kernel_graph()
    x = g.new_input((2, 64), dtype=em.float16)
    w = g.new_input((64, 96), dtype=em.float16)
    operands = (x, g.new_input((1, 64), dtype=em.float16)) if gain else (x,)
    g.mark_output(g.matmul(g.apply("rms_norm", operands, normalized_shape=(64,), eps=eps), w))
    return g


def transformers_norm_linear(eps: float, gain: bool) -> em.KernelGraph:
    """The same function as ``transformers``' RMSNorm traces: ``x32 = x.float()``,
    ``(x32 * rsqrt(x32.pow(2).mean(-1) + eps)).half()``, times the gain, then the projection."""
    return transformers_norm_projection((2,), 64, 96, eps, gain)


def test_the_constants_of_a_program_are_its_scalars_and_float_parameters() -> None:
    g = rms_norm_linear(1e-6, gain=False)
    assert program_scalars(g) == {1e-6}
    h = em.new_kernel_graph()
    x = h.new_input((4, 8), dtype=em.float16)
    h.mark_output(h.mul_scalar(h.reduction(x, 1), 0.125))
    assert program_scalars(h) == {0.125}


@pytest.mark.parametrize("written", [rms_norm_linear, transformers_norm_linear],
                         ids=["rms_norm", "transformers"])
@pytest.mark.parametrize("gain", [False, True], ids=["plain", "gain"])
def test_rms_norm_with_eps_fuses_with_the_matmul(gain: bool, written: Any) -> None:
    g = written(1e-6, gain)
    results = superoptimize(g, SearchConfig(max_results=1, max_kernels=1, max_kernel_ops=0),
                            max_tasks=MAX_TASKS, workers=1, progress=False)
    assert results, f"nothing in the first {MAX_TASKS} tasks ({results.stats})"
    best = results.best
    assert best.num_kernels == 1 and largest_intermediate(best.graph) == 0
    (kernel,) = [t.params["kernel"] for t in best.graph.operators]
    # the norm's statistic, eps included, is one accumulator
    assert [t.params["acc"] for t in kernel.tb.tensors if t.op == "forloop_accum"
            and t.params["acc"].startswith("rms")] == ["rms+1e-06"]
    assert em.verify(g, best.graph, tests=4, seed=5).equivalent
    assert em.check_numerics(best.graph, g) < 1e-3
    # eps changes the function: the same μGraph is not the program with another eps
    assert not em.verify(written(1e-3, gain), best.graph, tests=4, seed=5).equivalent
    # and it survives its JSON (the name carries the constant), and lowers and matches
    again = serialize.loads(em.to_json(best.graph))
    assert em.verify(g, again, tests=4, seed=6).equivalent
    torch = pytest.importorskip("torch")
    xs = [torch.randn(t.dims, dtype=torch.float16) for t in g.inputs]
    (got,) = em.compile(again)(*xs)
    want = g.evaluate([x.double().numpy() for x in xs])[0]
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-2, atol=2e-2)
