"""Programs outside the paper's eight (``benchmarks.UNSEEN``), written down before the search
was tried on them: at small shapes, under a budget of tasks (never seconds), the search returns a
verified one-kernel μGraph that writes nothing to device memory but the output."""

from __future__ import annotations

import pytest

import egraph_mirage as em
from egraph_mirage.bench.search_bench import largest_intermediate
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig

#: about twice the tasks the slowest of them needs (measured 2026-11-23: 41, 30 and 185 tasks)
MAX_TASKS = 400


def test_the_unseen_programs_are_not_among_the_eight() -> None:
    assert set(em.benchmarks.UNSEEN).isdisjoint(em.benchmarks.names())
    assert em.benchmarks.names(unseen=True) == [*em.benchmarks.names(), *em.benchmarks.UNSEEN]


@pytest.mark.parametrize("name", em.benchmarks.UNSEEN)
def test_an_unseen_program_gets_a_fused_kernel(name: str) -> None:
    g = em.benchmarks.get(name, small=True)
    results = superoptimize(g, SearchConfig(max_results=1), max_tasks=MAX_TASKS, workers=1,
                            progress=False)
    assert results, f"{name}: nothing in the first {MAX_TASKS} tasks ({results.stats})"
    best = results.best
    assert best.num_kernels == 1
    assert largest_intermediate(best.graph) == 0 < largest_intermediate(g)
    assert em.verify(g, best.graph, tests=4, seed=5).equivalent
    assert em.check_numerics(best.graph, g) < 1e-6
