"""Forms of μGraphs (graph-defined kernels + library operators) and how they steer what a GPU
budget times: ``spread`` puts the best of each form first, the profile stage measures in that
order, and the cost model's rank correlation with measured times."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.mugraph.serialize import dumps, loads
from egraph_mirage.rank.forms import FORM_SLACK, form, form_label, rank_correlation, spread, to_tune
from egraph_mirage.rank.measured import BY_GPU, Measurement, profile_stage
from egraph_mirage.search.results import SearchResult, SearchStats


@pytest.fixture(scope="module")
def forms() -> tuple[em.KernelGraph, list[em.KernelGraph]]:
    """rmsnorm_linear at small shapes (library operators only) and two copies of its
    hand-written one-kernel form."""
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    fused = fixtures.variants("rmsnorm_linear", g)[0]
    return g, [fused, loads(dumps(fused))]


def test_a_form_counts_kernels_and_names_library_operators(forms) -> None:
    g, fused = forms
    assert form(g) == (0, ("matmul", "rms_norm"))
    assert form_label(g) == "0 kernels + matmul + rms_norm"
    assert form(fused[0]) == (1, ()) and form_label(fused[0]) == "1 kernel"


def test_spread_puts_the_best_of_each_form_first(forms) -> None:
    g, fused = forms
    a1, a2 = fused[0], fused[1]
    assert form(a1) == form(a2) != form(g)
    assert spread([a1, a2, g]) == [a1, g, a2]
    assert spread([g, a1, a2]) == [g, a1, a2]  # already spread: unchanged
    assert spread([]) == []


def test_the_fastest_of_a_close_form_is_tuned_beside_the_fastest_few(forms) -> None:
    """After first timings the fastest ``top`` are tuned, and the fastest of each other form
    within ``FORM_SLACK`` of the fastest of all (tuning may still reorder them); a form
    further behind is not. rmsnorm_linear at b = 16 on an H100: three library-matmul forms
    first-timed at 23.2-25.0 µs kept the split-K form (27.8) from being tuned; tuned, it won."""
    g, fused = forms
    lib = [g, loads(dumps(g)), loads(dumps(g))]  # one form, three sizes
    graphs = [*lib, fused[0], fused[1]]
    first = [23.2, 24.0, 25.0, 27.8, 28.0]
    picks, extra = to_tune(first, graphs, 3)
    assert picks == [0, 1, 2, 3] and extra == {3}  # only the fastest of the other form
    assert to_tune([23.2, 24.0, 25.0, 23.2 * FORM_SLACK + 0.1, 40.0], graphs, 3) == (
        [0, 1, 2], set())
    assert to_tune(first, graphs, 5) == ([0, 1, 2, 3, 4], set())
    assert to_tune([24.0, 20.0], [fused[0], g], 1) == ([1, 0], {0})  # fastest first
    assert to_tune([], [], 3) == ([], set())


class _Clocked:
    """A profiler that records what it measured; each measurement takes one tick."""

    device_name = "Fake GPU"

    def __init__(self, us: dict[int, float]) -> None:
        self.us, self.seen, self.now = us, [], 0.0

    def measure(self, program: em.KernelGraph, mugraphs: Sequence[em.KernelGraph]
                ) -> list[Measurement]:
        self.seen += [id(h) for h in mugraphs]
        self.now += len(mugraphs)
        return [Measurement("ok", self.us[id(h)], {}) for h in mugraphs]


def _result(h: em.KernelGraph, est: float) -> SearchResult:
    return SearchResult(h, num_kernels=form(h)[0], estimated_seconds=est, verify_bound=0.0,
                        verify_tests=1, numeric_error=0.0, found_after=0.0)


def test_a_short_profile_budget_times_every_form_before_a_second_of_one(forms) -> None:
    """The cost model ranks two μGraphs of one form first; with time for two measurements,
    the second measured is the other form's best, and it wins."""
    g, fused = forms
    a1, a2 = fused[0], fused[1]
    ranked = [_result(a1, 1e-6), _result(a2, 2e-6), _result(g, 3e-6)]
    prof = _Clocked({id(a1): 30.0, id(a2): 20.0, id(g): 10.0})
    stats = SearchStats()
    # no minimum of timed results (``PROFILE_MIN_TIMED``): the deadline alone stops it
    out = profile_stage(ranked, g, stats, prof, deadline=2.0, clock=lambda: prof.now,
                        min_timed=0)
    assert prof.seen == [id(a1), id(g)]
    assert [r.graph for r in out] == [g, a1, a2]  # measured by time, then the unmeasured
    assert out[0].measured_us == 10.0 and out[2].measured_us is None
    assert stats.ranked_by == BY_GPU and "2 of 3" in stats.profile_note


def test_rank_correlation() -> None:
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # tied values share their mean rank: ranks (0, 1.5, 1.5, 3) and (0, 2, 1, 3)
    assert rank_correlation([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9487, abs=1e-4)
    assert rank_correlation([1, 2], [1, 2]) is None  # too few pairs
    assert rank_correlation([1, 1, 1], [1, 2, 3]) is None  # constant
    with pytest.raises(ValueError, match="3 and 2"):
        rank_correlation([1, 2, 3], [1, 2])
