"""Wrong arguments to the public functions are one-line typed errors (``EMError``) naming the
argument, never a raw traceback: graph builder dims and parameters, ``em.verify`` and
``em.check_numerics`` arguments, and programs too large for the search or the oracle.
(``em.load`` of what is not a file: ``tests/test_serialize.py``; random inputs:
``tests/test_fuzz.py``.)
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import egraph_mirage as em


def test_builder_errors_name_the_argument() -> None:
    g = em.new_kernel_graph()
    with pytest.raises(em.ShapeError, match=r"dims must be a sequence.*got int 8"):
        g.new_input(8)
    for bad in [(0, 2), (-1, 2), (2.0, 2), ("2",), (), (True, 2)]:
        with pytest.raises(em.ShapeError, match=r"new_input: dims must be"):
            g.new_input(bad)
    with pytest.raises(em.ShapeError, match=r"\(1099511627776, 1099511627776\) hold 1.21e\+24"):
        g.new_input((2**40, 2**40))
    assert g.new_input((np.int64(2), 4)).dims == (2, 4)  # numpy integers are sizes too
    X = g.new_input((2**25, 1))
    with pytest.raises(em.ShapeError, match=r"matmul of shapes .*\(33554432, 16777216\)"):
        g.matmul(X, g.new_input((1, 2**24)))
    with pytest.raises(em.GraphError, match="customized: parameters"):
        g.apply("customized", [X], kernel=None, output=0)
    with pytest.raises(em.GraphError, match="the operator must be a name"):
        g.apply(None, [X])  # type: ignore[arg-type]
    with pytest.raises(em.ShapeError, match="normalized_shape must be"):
        g.rms_norm(X, None)  # type: ignore[arg-type]


def test_verify_arguments_are_checked() -> None:
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    with pytest.raises(em.GraphError, match="verify: b must be a KernelGraph, got str"):
        em.verify(g, "x")  # type: ignore[arg-type]
    with pytest.raises(em.GraphError, match="check_numerics: reference must be a KernelGraph, "
                                            "got int"):
        em.check_numerics(g, 3)  # type: ignore[arg-type]
    with pytest.raises(em.GraphError, match="dtype must be"):
        em.check_numerics(g, g, "float16")  # type: ignore[arg-type]
    for kwargs in [{"tests": "2"}, {"seed": -1}, {"seed": 2**70}, {"tests": 1.0}]:
        with pytest.raises(em.GraphError):
            em.verify(g, g, **kwargs)  # type: ignore[arg-type]


def test_huge_programs_reach_the_search_as_a_clear_error() -> None:
    from egraph_mirage.search import SearchError
    from egraph_mirage.search.dims import LinkProbe, dim_classes

    g = em.benchmarks.get("lora", batch=100_000_000)  # builds: 2.6e10 elements, < 2**48
    with pytest.raises(SearchError, match=r"matmul of shapes \[\(100000000, 256\)"):
        dim_classes(g, LinkProbe())
    with pytest.raises(SearchError, match=r"\(result \(100000000, 4096\)\)"):
        em.superoptimize(g, workers=1, progress=False)


def test_huge_sizes_do_not_stall_the_oracle() -> None:
    """Split sizes come from the divisors of the sum sizes: found from the prime factors, not
    by trying every number up to the size (2**31 - 1 is prime)."""
    g = em.new_kernel_graph()
    X = g.new_input((1, 2**31 - 1))
    g.mark_output(g.reduction(X, 1))
    t0 = time.perf_counter()
    oracle = em.Oracle(g)
    assert oracle.complete and time.perf_counter() - t0 < 10
    p = 2**31 - 1
    assert oracle.sizes == [2, p, 2 * p]  # the divisors of p and of the sum of two sizes, 2p
