"""A program of a real model's sizes is searched as a scaled copy, and what the search finds is
re-sized to the program's own sizes and verified there (``pipeline.scaled``).

The programs here are just above the size at which scaling starts (``scaled.SCALE_ABOVE``), so
that the checks at their own sizes take a second, not a minute; every search is bounded by
tasks."""

from __future__ import annotations

import numpy as np
import pytest
from model_programs import folded_decode_attention, transformers_norm_projection

import egraph_mirage as em
from egraph_mirage.graph import KernelGraph
from egraph_mirage.pipeline import scaled as sc
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchResult, SearchStats

HIDDEN, OUT = 2048, 2048  # X (2, 2048) @ W (2048, 2048): 4.2M elements, past SCALE_ABOVE


def norm_projection(hidden: int = HIDDEN, out: int = OUT) -> KernelGraph:
    """``rms_norm(X) @ W`` with transformers' float32 statistics, as the tracer writes it."""
    return transformers_norm_projection((2,), hidden, out, 1e-5)


def test_a_large_program_scales_its_large_dimensions_and_keeps_its_operators() -> None:
    g = norm_projection()
    assert sc.elements(g) > sc.SCALE_ABOVE
    h = sc.scaled_program(g)
    assert h is not None
    # 2048 / 16 is 128: raised to SMALLEST (256), as the factor divides it
    assert [t.dims for t in h.inputs] == [(2, 256), (256, 256)]
    assert [t.op for t in h.operators] == [t.op for t in g.operators]
    assert [t.dims for t in h.outputs] == [(2, 256)]


def test_keys_scale_to_no_fewer_than_leave_room_for_a_split_and_a_loop() -> None:
    """An 8B model's decode attention over 8 sequences' 1,024 keys (the batch folded into the KV
    heads): the keys are divided by 4, not 16 (which would leave 64 keys, no room for the split
    form's blocks each looping over tiles)."""
    h = sc.scaled_program(folded_decode_attention(1024))
    assert h is not None
    assert [t.dims for t in h.inputs] == [(64, 4, 128), (64, 128, 256), (64, 256, 128),
                                          (64, 1, 256)]


def test_a_small_program_is_searched_at_its_own_sizes() -> None:
    assert sc.scaled_program(norm_projection(256, 256)) is None


def test_a_slice_of_a_scaled_dimension_scales_its_bounds_or_keeps_the_program() -> None:
    def sliced(start: int, stop: int) -> KernelGraph:
        g = em.new_kernel_graph()
        x = g.new_input((2, 4096))
        w = g.new_input((2048, 2048))
        g.mark_output(g.matmul(g.apply("slice_last", [x], start=start, stop=stop), w))
        return g

    # the slice's 2,048 columns are 4,096's divided by 16: the product's 2,048 are too (not
    # raised to SMALLEST), so the program scales by FACTOR alone
    h = sc.scaled_program(sliced(2048, 4096))
    assert h is not None
    assert h.operators[0].params == {"start": 128, "stop": 256}
    assert [t.dims for t in h.inputs] == [(2, 256), (128, 128)]
    # bounds that the factor does not divide: the program is searched at its own sizes
    assert sc.scaled_program(sliced(2040, 4088)) is None


def test_the_search_runs_scaled_and_returns_results_verified_at_the_programs_sizes() -> None:
    g = norm_projection()
    res = superoptimize(g, max_tasks=100, workers=1, progress=False)  # results by task 40
    assert res, res.stats.no_result_reasons
    assert res.stats.searched_sizes == [(2, 256), (256, 256)]
    assert 0 < len(res) <= sc.KEEP
    assert res.stats.resize_rejected == 0
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.dims) for t in g.inputs]
    (want,) = g.evaluate(xs, exact=True)
    for r in res:
        assert [t.dims for t in r.graph.inputs] == [t.dims for t in g.inputs]
        assert r.verify_tests >= 1 and r.numeric_error <= 1e-6
        (got,) = r.graph.evaluate(xs, exact=True)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)
    # scale=False: at the program's own sizes
    own = superoptimize(g, max_tasks=1, workers=1, progress=False, scale=False)
    assert own.stats.searched_sizes is None


def test_a_result_that_is_wrong_at_the_programs_sizes_is_rejected() -> None:
    """The resize stage verifies at the program's own sizes: a μGraph of another function (the
    projection without the norm, verified for nothing) is dropped and counted."""
    g = norm_projection()
    wrong = em.new_kernel_graph()
    x = wrong.new_input((2, HIDDEN))
    w = wrong.new_input((HIDDEN, OUT))
    wrong.mark_output(wrong.matmul(x, w))
    stats = SearchStats()
    fake = SearchResult(wrong, num_kernels=1, estimated_seconds=1e-6, verify_bound=0.0,
                        verify_tests=2, numeric_error=0.0, found_after=0.0)
    assert sc.resized([fake], g, stats, deadline=None, tolerance=1e-6) == []
    assert stats.resize_rejected == 1


def test_past_its_deadline_the_resize_stage_stops_after_a_few_failed_checks() -> None:
    """A resize started past its deadline still checks while nothing has passed, but no more
    than ``LATE_CHECKS`` candidates: five wrong μGraphs cost three checks, not five."""
    g = norm_projection()
    fakes = []
    for k in range(5):
        wrong = em.new_kernel_graph()
        x = wrong.new_input((2, HIDDEN))
        w = wrong.new_input((HIDDEN, OUT))
        wrong.mark_output(wrong.mul_scalar(wrong.matmul(x, w), float(k + 2)))
        fakes.append(SearchResult(wrong, num_kernels=1, estimated_seconds=1e-6,
                                  verify_bound=0.0, verify_tests=2, numeric_error=0.0,
                                  found_after=0.0))
    stats = SearchStats()
    assert sc.resized(fakes, g, stats, deadline=0.0, tolerance=1e-6) == []
    assert stats.resize_rejected == sc.LATE_CHECKS == 3


@pytest.mark.parametrize("op", ["div_count"])
def test_an_operator_holding_a_count_keeps_the_program_at_its_sizes(op: str) -> None:
    g = em.new_kernel_graph()
    x = g.new_input((2, 4096))
    w = g.new_input((4096, 2048))
    s = g.reduction(g.square(x), 1)
    g.mark_output(g.matmul(g.div(x, g.apply(op, [s], count=4096)), w))
    assert sc.scaled_program(g) is None


def test_a_scaled_copy_is_searched_only_in_shapes_that_fit_the_programs_own_sizes() -> None:
    """The scaled copy's kernel shapes that load a scaled dimension whole (no grid axis or loop
    cutting it) would load it 16 times as large at the program's own sizes, past shared memory,
    and the resize stage could not fit what they find (``mugraph.sizes.retarget``): an 8B
    model's gated MLP at b = 8 found 8 such forms and none other. The payload records each
    dimension class's growth (``prepare.growth``), and such shapes are not searched
    (``tiling.own_tile_bytes``); the shapes that walk the hidden dimension in a loop stay."""
    from egraph_mirage.search.config import SearchConfig
    from egraph_mirage.search.prepare import prepare_with_rules
    from egraph_mirage.search.tasks import Context
    from egraph_mirage.search.tiling import own_tile_bytes, structure

    g = transformers_norm_projection((8,), 4096, 4096, 1e-5)
    scaled = sc.scaled_program(g)
    assert scaled is not None and [t.dims for t in scaled.inputs] == [(8, 256), (256, 256)]
    config = SearchConfig()
    plain, _ = prepare_with_rules(scaled, config)
    sized, _ = prepare_with_rules(scaled, config, own=g)
    assert plain.growth == () and sorted(f for _, f in sized.growth) == [16, 16]
    growth = dict(sized.growth)

    def own_bytes(ks: object) -> int:
        return sum(own_tile_bytes(ld, growth) for ld in ks.loaders)  # type: ignore[attr-defined]

    before, after = Context(plain).first_shapes, Context(sized).first_shapes
    assert any(own_bytes(ks) > config.smem_bytes for ks in before)
    assert after and all(own_bytes(ks) <= config.smem_bytes for ks in after)
    kept = {(ks.grid, ks.frange, structure(ks, config)) for ks in after}
    assert kept <= {(ks.grid, ks.frange, structure(ks, config)) for ks in before}
    assert len(after) < len(before) and any(ks.frange > 1 for ks in after)


def test_a_scaled_search_spends_its_tasks_on_structures_that_fit_the_programs_sizes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end, the norm with its projection at b = 8 (4096 x 4096): in 60 tasks the scaled
    search without the own-size check found 18 structures the resize stage could not fit and
    one that it could; with it, none that do not fit, and more that do, in fewer seconds."""
    from egraph_mirage.search import prepare as pr

    g = transformers_norm_projection((8,), 4096, 4096, 1e-5)
    with_check = superoptimize(g, em.SearchConfig(max_kernels=2), max_tasks=60, workers=1,
                               progress=False)
    monkeypatch.setattr(pr, "growth", lambda inputs, own: ())
    without = superoptimize(g, em.SearchConfig(max_kernels=2), max_tasks=60, workers=1,
                            progress=False)
    assert without.stats.resize_unfit > 0 and with_check.stats.resize_unfit == 0
    assert len(with_check) > len(without) >= 1
    assert with_check.stats.tasks_total < without.stats.tasks_total
