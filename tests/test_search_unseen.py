"""Programs outside the paper's eight (``benchmarks.UNSEEN``), written down before the search
was tried on them: at small shapes, under a budget of tasks (never seconds), the search returns a
verified one-kernel μGraph that writes nothing to device memory but the output; and model code's
RoPE after a projection, in one kernel and split over the hidden dim."""

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


def test_ropes_rotate_half_is_one_kernel_that_slices_its_tiles() -> None:
    """RoPE as ``transformers`` writes it, ``x * cos + cat(-x[..., 16:], x[..., :16]) * sin``:
    its two slices are halves of a tile that holds the whole head dim, so the search takes
    them in the thread block (``slice_last`` at block level) and the rotation is one kernel,
    not slices between kernels; it lowers and matches the program in Triton's interpreter."""
    g = em.new_kernel_graph()
    x = g.new_input((8, 32), em.float16)
    _rotated(g, x, g.new_input((1, 32), em.float16), g.new_input((1, 32), em.float16))
    results = superoptimize(g, SearchConfig(max_results=1), max_tasks=200, workers=1,
                            progress=False)  # found at task 94 (2026-11-28)
    assert results, results.stats.no_result_reasons
    best = results.best.graph
    assert [t.op for t in best.operators] == ["customized"]
    (kernel,) = best.operators
    assert [t.op for t in kernel.params["kernel"].tb.tensors].count("slice_last") == 2
    _verified_and_interpreted(g, best)


def test_a_projection_with_ropes_rotation_is_one_kernel_with_its_accumulator() -> None:
    """A query projection per head followed by RoPE (``q = x @ Wq``, then ``q * cos +
    cat(-q[..., 16:], q[..., :16]) * sin``), 8 operators: its one-kernel form loops over the
    hidden dim and accumulates, so it holds 9 block operators (a ``forloop_accum`` beside
    them). The search's depth for a program that reduces counts that accumulator
    (``SearchConfig.block_ops``); at the program's own 8 no one-kernel form exists. The form
    found rotates each step's partial product and accumulates the rotated partials (RoPE is
    linear); it verifies and matches the program in Triton's interpreter."""
    from egraph_mirage.search.prepare import prepare

    g = em.new_kernel_graph()
    x, w = g.new_input((1, 1, 64), em.float16), g.new_input((4, 64, 32), em.float16)
    cos, sin = g.new_input((1, 1, 32), em.float16), g.new_input((1, 1, 32), em.float16)
    _rotated(g, g.matmul(x, w), cos, sin)
    assert prepare(g, SearchConfig()).config.max_block_ops == 9
    results = superoptimize(g, SearchConfig(max_kernels=1, max_results=1), max_tasks=300,
                            workers=1, progress=False)  # 18 s on one core (2026-11-28)
    assert results, results.stats.no_result_reasons
    best = results.best.graph
    (kernel,) = best.operators
    ops = [t.op for t in kernel.params["kernel"].tb.tensors if t.op != "input"]
    assert len(ops) == 9 and "forloop_accum" in ops and ops.count("slice_last") == 2
    _verified_and_interpreted(g, best)


def test_a_projection_with_ropes_rotation_splits_its_hidden_dim_and_rotates_in_the_combine(
        ) -> None:
    """The same projection with RoPE at a decode step's shape (4 heads of 128, hidden 256):
    its one-kernel form has one block per head, too few to stream a real model's weights.
    Split-K gives more: the first kernel writes the partial products of each piece of the
    hidden dim, the second sums them and rotates the sum. Its combine holds the rotation's 7
    operators after the sum: the tail of the program after its matmul (``tasks.tail``) raises
    ``Context.combine_ops`` from ``SPLIT_COMBINE``'s 5 to 8, without which no two-kernel form
    is found within the same 60 tasks. The form verifies and matches the program in Triton's
    interpreter."""
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import SPLIT_COMBINE, Context, tail

    g = em.new_kernel_graph()
    x, w = g.new_input((1, 1, 256), em.float16), g.new_input((4, 256, 128), em.float16)
    cos, sin = g.new_input((1, 1, 128), em.float16), g.new_input((1, 1, 128), em.float16)
    _rotated(g, g.matmul(x, w), cos, sin)
    assert [t.op for t in tail(g)] == ["slice_last", "slice_last", "neg", "concat", "mul",
                                      "mul", "add"]
    assert SPLIT_COMBINE == 5 and Context(prepare(g, SearchConfig())).combine_ops == 8
    results = superoptimize(g, SearchConfig(max_kernels=2, max_results=1), max_tasks=60,
                            workers=1, progress=False)  # 2.3 s on one core (2026-11-29)
    assert results, results.stats.no_result_reasons
    best = results.best.graph
    split, combine = (t.params["kernel"].tb for t in best.operators)
    assert [t.op for t in split.tensors if t.op != "input"] == ["matmul", "forloop_accum"]
    assert split.grid_dim[0] > 1  # the pieces of the hidden dim: blocks beside the heads'
    ops = [t.op for t in combine.tensors if t.op != "input"]
    assert ops[0] == "forloop_accum" and ops.count("slice_last") == 2 and "concat" in ops
    _verified_and_interpreted(g, best)


def test_a_norm_with_its_projection_and_ropes_rotation_finishes_both_in_the_combine() -> None:
    """The RMSNorm as ``transformers`` writes it (in float32, eps inside the root), the query
    projection it feeds and RoPE (16 operators, a decode step's shape): the split form's first
    kernel sums the unscaled partial products, and its combine finishes the norm (its
    statistic's accumulator and the division by it) before the rotation's 7 operators, 10 in
    all. ``Context.combine_ops`` counts both (``tasks.statistics``); at the rotation's 8 alone
    no split form exists, and the search spent gigabytes and minutes finding none. The form
    verifies and matches the program in Triton's interpreter."""
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import Context, statistics

    g = em.new_kernel_graph()
    x, gain = (g.new_input((1, 1, 256), em.float16) for _ in range(2))
    w = g.new_input((4, 256, 128), em.float16)
    cos, sin = g.new_input((1, 1, 128), em.float16), g.new_input((1, 1, 128), em.float16)
    x32 = g.cast(x, em.float32)
    root = g.rsqrt(g.add_scalar(g.mean(g.square(x32), 2), 1e-5))
    _rotated(g, g.matmul(g.mul(gain, g.cast(g.mul(x32, root), em.float16)), w), cos, sin)
    assert [t.op for t in statistics(g)] == ["mean"]
    assert Context(prepare(g, SearchConfig())).combine_ops == 10
    results = superoptimize(g, SearchConfig(max_kernels=2, max_results=1), max_tasks=60,
                            workers=1, progress=False)  # 7.3 s on one core (2026-11-29)
    assert results, results.stats.no_result_reasons
    best = results.best.graph
    split, combine = (t.params["kernel"].tb for t in best.operators)
    assert "matmul" in [t.op for t in split.tensors]
    accs = [t.params["acc"] for t in combine.tensors if t.op == "forloop_accum"]
    assert any(a.startswith("rms") for a in accs)  # the norm's statistic, finished here
    assert [t.op for t in combine.tensors].count("slice_last") == 2
    _verified_and_interpreted(g, best, ulps=4)


def _rotated(g: em.KernelGraph, q: em.Tensor, cos: em.Tensor, sin: em.Tensor) -> None:
    """Marks RoPE of ``q`` as ``transformers`` writes it the program's output: ``q * cos +
    cat(-q[..., h:], q[..., :h]) * sin``, ``h`` half of ``q``'s last dim."""
    d = q.dims[-1]
    first = g.apply("slice_last", [q], start=0, stop=d // 2)
    second = g.apply("slice_last", [q], start=d // 2, stop=d)
    rotated = g.concat(g.neg(second), first, len(q.dims) - 1)
    g.mark_output(g.add(g.mul(q, cos), g.mul(rotated, sin)))


def _verified_and_interpreted(g: em.KernelGraph, best: em.KernelGraph,
                              ulps: float | None = None) -> None:
    """``best`` verifies against ``g`` and, lowered to Triton (the interpreter without a GPU),
    matches ``g``'s float64 evaluation on random fp16 inputs: within 2e-2, or, with ``ulps``,
    within that many fp16 units in the last place at the output's largest magnitude (a
    normalized input times a gain and a projection gives outputs of magnitude 20 and more,
    where one unit is 0.016)."""
    import numpy as np
    import torch

    assert em.verify(g, best, tests=4, seed=5).equivalent
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.dims).astype(np.float16) for t in g.inputs]
    (got,) = em.compile(best)(*[torch.from_numpy(v) for v in xs])
    (want,) = g.evaluate([v.astype(np.float64) for v in xs])
    atol = 2e-2 if ulps is None else ulps * float(np.spacing(np.float16(np.abs(want).max())))
    np.testing.assert_allclose(got.double().numpy(), want, rtol=2e-2, atol=atol)
