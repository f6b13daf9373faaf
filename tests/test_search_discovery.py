"""Discovery: with the default configuration, the search finds each benchmark's fused form.

Every benchmark program at its small shapes: the first verified μGraph the search returns must
meet the program's goal (one kernel, or at most two for attention with nothing as large as the
attention scores written to device memory), re-verify with fresh tests, and match the program in
float. The search is told nothing about the programs; ``GOALS`` is only read here.
"""

from __future__ import annotations

import pytest

import egraph_mirage as em
from egraph_mirage.bench.search_bench import GOALS, largest_intermediate
from egraph_mirage.search import SearchConfig, superoptimize

#: seconds a small search may take before the test gives up (it finds the form much sooner)
BUDGET = 240.0


def _block_ops(g: em.KernelGraph) -> list[list[str]]:
    return [[b.op for b in t.params["kernel"].tb.tensors]
            for t in g.operators if t.op == "customized" and t.params["output"] == 0]


@pytest.mark.parametrize("name", em.benchmarks.names())
def test_the_fused_form_is_discovered(name: str) -> None:
    g = em.benchmarks.get(name, small=True)
    results = superoptimize(g, SearchConfig(max_results=1), time_budget=BUDGET, workers=1,
                            progress=False)
    assert results, f"{name}: nothing found in {BUDGET:.0f} s ({results.stats})"
    best = results.best
    assert best.num_kernels <= GOALS[name]
    assert largest_intermediate(best.graph) < largest_intermediate(g)
    assert em.verify(g, best.graph, tests=4, seed=11).equivalent
    assert em.check_numerics(best.graph, g) < 1e-6
    assert best.numeric_error < 1e-6
    ops = [op for kernel in _block_ops(best.graph) for op in kernel]
    if name in ("gqa", "mha", "mqa", "qknorm"):  # the scores are exponentiated in a block
        assert "exp" in ops and ops.count("matmul") == 2
    if name == "qknorm":  # the norms are fused in
        assert ops.count("rms_norm") == 2 or "rms" in str(best.graph.to_json())
