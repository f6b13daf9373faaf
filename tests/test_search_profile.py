"""``superoptimize(..., profile=True)``: results ranked by measured GPU time, on the CPU with a
fake compiler and timer; the cost model where no GPU is present; ``optimize --profile``; and, on
a CUDA machine (marker ``gpu``), the real thing end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from search_space import TINY

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.lower import graph_knobs
from egraph_mirage.pipeline import Request, superoptimize
from egraph_mirage.pipeline.results_folder import result_files, write_results
from egraph_mirage.rank.forms import spread
from egraph_mirage.rank.measured import (
    BY_COST_MODEL,
    BY_GPU,
    PROFILE_MIN_TIMED,
    GpuProfiler,
    Measurement,
    cuda_available,
    profile_stage,
)
from egraph_mirage.search import SearchConfig, SearchError, SearchResults
from egraph_mirage.search.results import SearchResult, SearchStats

ROOT = Path(__file__).resolve().parents[1]
@pytest.fixture(scope="module")
def by_cost(rmsnorm: em.KernelGraph) -> SearchResults:
    """The search's results in the cost model's order (``profile=False``)."""
    return superoptimize(rmsnorm, TINY, workers=1, progress=False)


class FakeGpu:
    """A compiler and a timer for ``GpuProfiler`` on the CPU. Each μGraph (by its JSON) runs in
    the time ``us`` gives it, 1 µs less with ``num_warps=8``; the one named ``broken`` does not
    lower, the one named ``wrong`` computes twice the right answer."""

    def __init__(self, us: dict[str, float], broken: str = "", wrong: str = "") -> None:
        self.us, self.broken, self.wrong, self.timed = us, broken, wrong, 0

    def compiler(self, h: em.KernelGraph, knobs: dict[str, Any]) -> Any:
        from egraph_mirage.gpu.torch_eval import torch_function

        text = em.to_json(h)
        if text == self.broken:
            raise em.LowerError("fake lowering: this μGraph cannot be lowered")
        fn = torch_function(h)
        scale = 2.0 if text == self.wrong else 1.0

        def run(*xs: Any) -> Any:
            return [o * scale for o in fn(*xs)]

        run.us = self.us[text] - (1.0 if knobs.get("num_warps") == 8 else 0.0)  # type: ignore
        return run

    def graph(self, fn: Any, sets: Any) -> float:
        self.timed += 1
        fn(*sets[0])
        return fn.us

    plain = graph

    def profiler(self) -> GpuProfiler:
        from egraph_mirage.gpu.tune import TuneCache

        return GpuProfiler(compiler=self.compiler, timer=self, device="cpu", name="Fake GPU",
                           cache=TuneCache(None), space={"num_warps": (4, 8)})


def test_profile_ranks_by_measured_time(rmsnorm: em.KernelGraph, by_cost: SearchResults,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from egraph_mirage.pipeline import stages

    monkeypatch.setattr(stages, "PROFILE_SIZES", 1)  # the search's own sizes only (see below)
    texts = [r.to_json() for r in by_cost]
    assert len(texts) >= 4
    # measured times in the reverse of the cost model's order: the GPU must win
    fake = FakeGpu({t: 100.0 - i for i, t in enumerate(texts)}, broken=texts[-1],
                   wrong=texts[-2])
    results = superoptimize(rmsnorm, TINY, workers=1, progress=False, profile=True,
                            profiler=fake.profiler())
    st = results.stats
    assert st.ranked_by == BY_GPU and st.profile_device == "Fake GPU"
    assert (st.profile_failed, st.profile_wrong) == (1, 1)  # dropped, counted, not returned
    assert sorted(m.split(":")[0] for m in st.profile_messages) == ["failed", "wrong"]
    assert any("cannot be lowered" in m for m in st.profile_messages)
    assert any(m.startswith("wrong: relative error") for m in st.profile_messages)
    assert [r.to_json() for r in results] == texts[-3::-1]
    assert [r.measured_us for r in results] == sorted(r.measured_us for r in results)
    assert results.best.measured_us == 100.0 - (len(texts) - 3) - 1.0
    # the faster setting, kept (with the μGraph's own knobs, e.g. swap_dots, at their first)
    assert all(r.knobs == {"num_warps": 8, **{k: v[0] for k, v in graph_knobs(r.graph).items()}}
               for r in results)
    assert all(r.estimated_seconds > 0 for r in results)  # the estimate stays alongside
    assert "measured" in results.best.summary() and "num_warps=8" in results.best.summary()
    assert f"{len(texts) - 2} of {len(texts)} results timed on Fake GPU" in st.profile_note
    assert st.seconds["profile"] >= 0.0


class WallClock:
    """Times one call on the CPU: enough to rank, nothing to quote."""

    def graph(self, fn: Any, sets: Any) -> float:
        t0 = time.perf_counter()
        fn(*sets[0])
        return (time.perf_counter() - t0) * 1e6

    plain = graph


def test_search_results_lower_in_triton_s_interpreter(rmsnorm: em.KernelGraph) -> None:
    """The real lowering (``KernelGraph.compile``; Triton's interpreter without a GPU) compiles
    the search's μGraphs, and they pass the float32 check against PyTorch."""
    from egraph_mirage.gpu.tune import TuneCache, default_compiler

    if cuda_available()[0]:
        pytest.skip("with a GPU the lowering compiles for it: test_profile_on_the_gpu_end_to_end")
    compiler = default_compiler()
    if compiler is None:
        pytest.skip("no lowering")
    profiler = GpuProfiler(compiler=compiler, timer=WallClock(), device="cpu", name="interpreter",
                           cache=TuneCache(None), space={"num_warps": (4,), "num_stages": (2,)})
    config = SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0, max_results=4)
    results = superoptimize(rmsnorm, config, workers=1, progress=False, profile=True,
                            profiler=profiler)
    st = results.stats
    assert st.ranked_by == BY_GPU and (st.profile_failed, st.profile_wrong) == (0, 0), st
    assert len(results) >= 4
    assert all(r.knobs == {"num_warps": 4, "num_stages": 2} for r in results)


def test_profile_without_a_gpu_keeps_the_cost_model(rmsnorm: em.KernelGraph,
                                                    by_cost: SearchResults) -> None:
    ok, why = cuda_available()
    if ok:
        pytest.skip("a CUDA GPU is present: profile=True measures on it")
    results = superoptimize(rmsnorm, TINY, workers=1, progress=False, profile=True)
    assert results.stats.ranked_by == BY_COST_MODEL == by_cost.stats.ranked_by
    assert "no CUDA GPU" in results.stats.profile_note and why in results.stats.profile_note
    assert [r.to_json() for r in results] == [r.to_json() for r in by_cost]
    assert all(r.measured_us is None and r.knobs is None for r in results)
    assert "profile" not in results.stats.seconds


def test_cuda_available_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert cuda_available() == (False, "torch is not installed")


def _results(graphs: list[em.KernelGraph]) -> list[SearchResult]:
    return [SearchResult(h, 1, 1e-6 * (i + 1), 1e-10, 2, 0.0, 0.1)
            for i, h in enumerate(graphs)]


class Broken:
    device_name = "Broken GPU"

    def __init__(self, exc: BaseException | None = None, count: int = 0) -> None:
        self.exc, self.count = exc, count

    def measure(self, program: em.KernelGraph, mugraphs: Any) -> list[Measurement]:
        if self.exc is not None:
            raise self.exc
        return [Measurement("ok", 1.0)] * self.count


@pytest.mark.parametrize("profiler, note", [
    (Broken(RuntimeError("CUDA error: out of memory")), "profiling failed (RuntimeError"),
    (Broken(KeyboardInterrupt()), "profiling interrupted"),
    (Broken(count=1), "returned 1 measurements for 2 results"),
])
def test_a_broken_profiler_never_loses_the_results(profiler: Broken, note: str) -> None:
    g = em.benchmarks.get("lora", small=True)
    ranked = _results([fixtures.lora(g), fixtures.lora_concat(g)])
    stats = SearchStats()
    assert profile_stage(list(ranked), g, stats, profiler) == ranked
    assert stats.ranked_by == BY_COST_MODEL and note in stats.profile_note
    assert stats.interrupted == isinstance(profiler.exc, KeyboardInterrupt)


def test_an_interrupted_search_is_not_profiled() -> None:
    g = em.benchmarks.get("lora", small=True)
    ranked = _results([fixtures.lora(g)])
    stats = SearchStats(interrupted=True)
    assert profile_stage(list(ranked), g, stats, Broken(count=1)) == ranked
    assert stats.ranked_by == BY_COST_MODEL and "interrupted" in stats.profile_note


class Counting:
    """A profiler that counts its calls and the μGraphs it measured. Result ``i`` of ``graphs``
    runs in ``100 - i`` µs (the reverse of the cost model's order); those in ``wrong`` fail the
    numeric check."""

    device_name = "Counting GPU"

    def __init__(self, graphs: list[em.KernelGraph], wrong: tuple[int, ...] = ()) -> None:
        self.index = {id(h): i for i, h in enumerate(graphs)}
        self.wrong, self.calls, self.measured = wrong, 0, 0

    def measure(self, program: em.KernelGraph, mugraphs: Any) -> list[Measurement]:
        self.calls += 1
        self.measured += len(mugraphs)
        return [Measurement("wrong", message="off") if self.index[id(h)] in self.wrong
                else Measurement("ok", 100.0 - self.index[id(h)], {"num_warps": 4})
                for h in mugraphs]


def _ranked(by_cost: SearchResults, n: int = 6) -> list[SearchResult]:
    return _results([r.graph for r in by_cost[:n]])


def test_a_deadline_already_passed_still_times_the_first_few(rmsnorm: em.KernelGraph,
                                                             by_cost: SearchResults) -> None:
    """The cost model does not order sizes as a GPU does, so a ranking with nothing timed can
    pick a winner far from the floor: the first ``PROFILE_MIN_TIMED`` of the profiling order
    are timed even when the search used up the budget."""
    ranked = _ranked(by_cost)
    profiler, stats = Counting([r.graph for r in ranked]), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, deadline=0.0,
                        clock=lambda: 1.0)
    assert profiler.measured == PROFILE_MIN_TIMED == 4
    assert stats.ranked_by == BY_GPU
    assert [r.graph for r in out] == [ranked[i].graph for i in (3, 2, 1, 0, 4, 5)]
    assert stats.profile_note.startswith("time budget reached after profiling 4 of 6 results")
    # with no minimum, nothing is timed and the cost model's order stands
    profiler, stats = Counting([r.graph for r in ranked]), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, deadline=0.0,
                        clock=lambda: 1.0, min_timed=0)
    assert profiler.calls == 0 and out == ranked
    assert stats.ranked_by == BY_COST_MODEL
    assert stats.profile_note == ("time budget reached before profiling: none of 6 results "
                                  "measured, ranked by the cost model")


def test_the_deadline_stops_profiling_between_results(rmsnorm: em.KernelGraph,
                                                       by_cost: SearchResults) -> None:
    ranked = _ranked(by_cost)
    profiler, stats = Counting([r.graph for r in ranked]), SearchStats()
    # the clock passes the deadline once the fifth result has been measured
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, deadline=10.0,
                        clock=lambda: 20.0 if profiler.measured >= 5 else 0.0)
    assert profiler.measured == 5 and profiler.calls == 5
    assert stats.ranked_by == BY_GPU
    # the measured five by measured time, then the rest unmeasured in the cost model's order
    assert [r.graph for r in out] == [ranked[i].graph for i in (4, 3, 2, 1, 0, 5)]
    assert [r.measured_us for r in out] == [96.0, 97.0, 98.0, 99.0, 100.0, None]
    assert stats.profile_note.startswith("time budget reached after profiling 5 of 6 results: "
                                         "the rest keep the cost model's order")


def test_a_wrong_result_is_dropped_under_a_deadline(rmsnorm: em.KernelGraph,
                                                    by_cost: SearchResults) -> None:
    ranked = _ranked(by_cost)
    profiler, stats = Counting([r.graph for r in ranked], wrong=(1,)), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, deadline=10.0,
                        clock=lambda: 20.0 if profiler.measured >= 5 else 0.0)
    assert profiler.measured == 5 and stats.profile_wrong == 1
    assert [r.graph for r in out] == [ranked[i].graph for i in (4, 3, 2, 0, 5)]
    assert "after profiling 5 of 6 results" in stats.profile_note


def test_without_a_deadline_everything_is_measured(rmsnorm: em.KernelGraph,
                                                   by_cost: SearchResults) -> None:
    ranked = _ranked(by_cost)
    profiler, stats = Counting([r.graph for r in ranked]), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, clock=lambda: math.inf)
    assert profiler.measured == 6 and profiler.calls == 1  # one call, as without a budget
    assert [r.graph for r in out] == [r.graph for r in reversed(ranked)]
    assert stats.ranked_by == BY_GPU and "budget" not in stats.profile_note
    assert stats.profile_note.startswith("6 of 6 results timed on Counting GPU")


class TwoRounds:
    """A profiler with first timings: result ``i`` first times at ``100 - i`` µs; tuned, result
    3 runs in 50 µs and every other 1 µs faster than its first timing. ``log`` records each
    measurement as (round, i)."""

    device_name = "Two-round GPU"

    def __init__(self, graphs: list[em.KernelGraph], quick: bool = False,
                 log: list[tuple[str, int]] | None = None) -> None:
        self.graphs, self.quick = graphs, quick
        self.log: list[tuple[str, int]] = [] if log is None else log

    def first_timing(self) -> TwoRounds:
        return TwoRounds(self.graphs, True, self.log)

    def measure(self, program: em.KernelGraph, mugraphs: Any) -> list[Measurement]:
        out = []
        for h in mugraphs:
            i = next(j for j, g in enumerate(self.graphs) if g is h)
            self.log.append(("first" if self.quick else "tuned", i))
            us = 100.0 - i if self.quick else (50.0 if i == 3 else 99.0 - i)
            out.append(Measurement("ok", us, {"round": self.log[-1][0]}))
        return out


def test_first_timings_of_every_result_then_the_fastest_tuned(
        rmsnorm: em.KernelGraph, by_cost: SearchResults) -> None:
    """Every result is timed once cheaply, then the fastest three are tuned: tuning can
    reorder them (result 3, third by its first timing, is the fastest tuned)."""
    ranked = _ranked(by_cost)
    graphs = [r.graph for r in spread(ranked, lambda r: r.graph)]
    profiler, stats = TwoRounds(graphs), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler)
    assert profiler.log == [("first", i) for i in range(6)] + [("tuned", i) for i in (5, 4, 3)]
    assert [graphs.index(r.graph) for r in out] == [3, 5, 4, 2, 1, 0]
    assert [r.measured_us for r in out] == [50.0, 94.0, 95.0, 98.0, 99.0, 100.0]
    assert [r.knobs["round"] for r in out] == ["tuned"] * 3 + ["first"] * 3
    assert "6 of 6 results timed on Two-round GPU (first timings, the fastest 3 tuned)" in \
        stats.profile_note
    # under a deadline the first timings take at most their share of the time left (but the
    # first PROFILE_MIN_TIMED always), and the tuning what is left after them: here 2 time
    # units a measurement, 10 in all
    profiler, stats = TwoRounds(graphs), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, deadline=10.0,
                        clock=lambda: 2.0 * len(profiler.log))
    assert profiler.log == [("first", 0), ("first", 1), ("first", 2), ("first", 3),
                            ("tuned", 3)]
    assert [r.measured_us for r in out[:4]] == [50.0, 98.0, 99.0, 100.0]
    assert "after profiling 4 of 6 results" in stats.profile_note
    assert "(first timings, the fastest 1 tuned)" in stats.profile_note


class Until(TwoRounds):
    """``TwoRounds`` whose ``until`` records the deadline the tuning is given."""

    def __init__(self, graphs: list[em.KernelGraph], quick: bool = False,
                 log: list[tuple[str, int]] | None = None,
                 untils: list[float] | None = None) -> None:
        super().__init__(graphs, quick, log)
        self.untils: list[float] = [] if untils is None else untils

    def first_timing(self) -> Until:
        return Until(self.graphs, True, self.log, self.untils)

    def until(self, deadline: float, clock: Any) -> Until:
        self.untils.append(deadline)
        return Until(self.graphs, self.quick, self.log, self.untils)


def test_under_a_deadline_the_fastest_are_tuned_until_it(
        rmsnorm: em.KernelGraph, by_cost: SearchResults) -> None:
    """The full tuning gets the search's deadline (``GpuProfiler.until``: no setting tried
    past it once one has a time), not only the first timings: a result's whole knob space is
    a compile per setting, and took longer than a search's share. Without a deadline, the
    whole space."""
    ranked = _ranked(by_cost)
    graphs = [r.graph for r in spread(ranked, lambda r: r.graph)]
    profiler = Until(graphs)
    profile_stage(list(ranked), rmsnorm, SearchStats(), profiler, deadline=100.0,
                  clock=lambda: float(len(profiler.log)))
    assert profiler.untils == [100.0] and ("tuned", 5) in profiler.log
    profiler = Until(graphs)
    profile_stage(list(ranked), rmsnorm, SearchStats(), profiler)
    assert profiler.untils == []


def test_a_gpu_profiler_past_its_deadline_stops_tuning_at_the_first_time(
        rmsnorm: em.KernelGraph, by_cost: SearchResults) -> None:
    """``GpuProfiler.until``: past the deadline, tuning a μGraph ends at its first setting with
    a time (its staged space's second round not started); before it, the whole space."""
    gpu = FakeGpu({em.to_json(r.graph): 10.0 for r in by_cost})
    h = by_cost.best.graph
    for now, settings in ((2.0, 1), (0.0, 2)):  # space: num_warps 4 and 8
        gpu.timed = 0
        profiler = gpu.profiler().until(1.0, clock=lambda now=now: now)
        (m,) = profiler.measure(rmsnorm, [h])
        assert m.status == "ok" and gpu.timed == settings


class Sized:
    """A profiler for which the μGraphs it has not seen (the size variants) run in 50 µs and
    the search's own results in 100 µs."""

    device_name = "Sized GPU"

    def __init__(self, graphs: list[em.KernelGraph]) -> None:
        self.own = {id(h) for h in graphs}
        self.order: list[em.KernelGraph] = []

    def measure(self, program: em.KernelGraph, mugraphs: Any) -> list[Measurement]:
        self.order += list(mugraphs)
        return [Measurement("ok", 100.0 if id(h) in self.own else 50.0, {}) for h in mugraphs]


def test_profiling_times_the_best_structures_at_other_sizes_too(
        rmsnorm: em.KernelGraph, by_cost: SearchResults) -> None:
    """Structure from the search, sizes from the tuner: each of the first results (the best of
    each form) is followed by its size variants, verified, and a variant can win."""
    from egraph_mirage.mugraph.sizes import sizes_of, structure_of
    from egraph_mirage.verify import Verifier

    ranked = _ranked(by_cost)
    profiler, stats = Sized([r.graph for r in ranked]), SearchStats()
    out = profile_stage(list(ranked), rmsnorm, stats, profiler, sizes=3, sized_forms=1)
    first = spread(ranked, lambda r: r.graph)[0]
    variants = profiler.order[1:3]
    assert profiler.order[0] is first.graph and len(variants) == 2
    assert all(id(v) not in profiler.own for v in variants)
    for v in variants:  # the same structure at other sizes, each computing the program
        assert structure_of(v) == structure_of(first.graph)
        assert sizes_of(v) != sizes_of(first.graph)
        assert Verifier(rmsnorm, backend="numpy").check(v).equivalent
    assert {id(r.graph) for r in out[:2]} == {id(v) for v in variants}  # 50 µs: they win
    assert len(out) == len(ranked) + 2 and out[0].measured_us == 50.0


def test_the_time_budget_is_counted_from_the_start(rmsnorm: em.KernelGraph,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``superoptimize`` hands the profile stage the deadline it set when it was called."""
    from egraph_mirage.pipeline import stages

    seen: dict[str, Any] = {}

    def stage(ranked: list[SearchResult], program: em.KernelGraph, stats: SearchStats,
              profiler: Any, deadline: float | None = None, **_: Any) -> list[SearchResult]:
        seen["deadline"] = deadline
        return ranked

    def task(payload: Any, task: Any, deadline: float | None, *args: Any) -> Any:
        seen["search deadline"] = deadline
        return run_task(payload, task, deadline, *args)

    from egraph_mirage.search import run as search_run

    run_task = search_run.run_task
    monkeypatch.setattr(stages, "profile_stage", stage)
    monkeypatch.setattr(search_run, "run_task", task)
    before = time.time()
    superoptimize(rmsnorm, TINY, time_budget=1000.0, workers=1, progress=False, profile=True,
                  profiler=Broken())
    after = time.time()
    assert before + 1000.0 <= seen["deadline"] <= after + 1000.0
    # the search stops at its share of the budget: the rest is the profiling's
    share = Request().search_share * 1000.0
    assert before + share <= seen["search deadline"] <= after + share < before + 1000.0
    superoptimize(rmsnorm, TINY, workers=1, progress=False, profile=True, profiler=Broken())
    assert seen["deadline"] is None


def test_profiler_needs_profile(rmsnorm: em.KernelGraph) -> None:
    with pytest.raises(SearchError, match="profile=True"):
        superoptimize(rmsnorm, TINY, workers=1, profiler=Broken())


def test_the_search_profiles_without_torch_installed() -> None:
    """The GPU side is imported lazily: with torch hidden, profile=True falls back."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        sys.modules["triton"] = None
        import egraph_mirage as em
        g = em.benchmarks.get("rmsnorm_linear", small=True)
        config = em.SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0, max_results=2)
        r = em.superoptimize(g, config, workers=1, progress=False, profile=True)
        assert r and r.stats.ranked_by == "cost model", r.stats
        assert "torch is not installed" in r.stats.profile_note, r.stats.profile_note
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("ok")


def test_optimize_profile_on_a_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from egraph_mirage.cli import main

    if cuda_available()[0]:
        pytest.skip("a CUDA GPU is present")
    code = main(["optimize", "rmsnorm_linear", "--small", "--workers", "1", "--max-results", "2",
                 "--profile", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "ranked by: cost model (profile=True but no CUDA GPU" in out
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["ranked_by"] == "cost model" and len(summary["results"]) == 2
    assert summary["stats"]["profile_note"].startswith("profile=True but no CUDA GPU")


def test_write_results_replaces_an_earlier_run(tmp_path: Path, by_cost: SearchResults) -> None:
    write_results(tmp_path, by_cost, {"name": "rmsnorm_linear"})
    assert len(result_files(tmp_path)) == len(by_cost)
    fewer = SearchResults(list(by_cost[:2]), by_cost.stats)
    write_results(tmp_path, fewer)
    assert [f.name for f in result_files(tmp_path)] == ["result_0.json", "result_1.json"]
    assert em.to_json(em.load(tmp_path / "best.json")) == by_cost[0].to_json()
    write_results(tmp_path, SearchResults([], by_cost.stats))
    assert result_files(tmp_path) == [] and not (tmp_path / "best.json").exists()
    assert json.loads((tmp_path / "results.json").read_text())["results"] == []


@pytest.mark.gpu
def test_profile_on_the_gpu_end_to_end(rmsnorm: em.KernelGraph, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user gets: the lowering, the knob space, the CUDA timer, a fresh tuning cache."""
    if not cuda_available()[0]:
        pytest.skip("needs an NVIDIA GPU")
    from egraph_mirage.gpu.tune import default_compiler

    if default_compiler() is None:
        pytest.skip("no lowering")
    # the verifier's JAX on the CPU (what keep_jax_off_the_gpu does for the commands); this
    # takes effect only where JAX is not yet in use in this process
    monkeypatch.setenv("JAX_PLATFORMS", os.environ.get("JAX_PLATFORMS", "cpu"))
    monkeypatch.setenv("EGRAPH_MIRAGE_CACHE", str(tmp_path))
    config = SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0, max_results=4)
    results = superoptimize(rmsnorm, config, workers=1, progress=False, profile=True)
    st = results.stats
    assert st.ranked_by == BY_GPU, st.profile_note
    assert results and len(results) + st.profile_failed + st.profile_wrong >= 4
    times = [r.measured_us for r in results]
    assert all(t is not None and 0.5 < t < 10_000 for t in times)
    assert times == sorted(times)
    assert all(r.knobs for r in results)
    assert list((tmp_path / "tune").glob("*.json"))  # the trials were cached
    print(f"\n{st.profile_note}; best {results.best.summary()}")


def test_a_profiler_given_strides_times_inputs_in_that_layout(rmsnorm: em.KernelGraph) -> None:
    """``GpuProfiler(strides=...)`` (the torch backend's pieces: a linear layer's weight read
    as Wᵀ): the program's inputs are made in those strides and each μGraph is compiled to read
    them in place, so that the sizes and knobs that win are those of the layout the piece runs
    with; the results still pass the float check (a wrong reading of the strides would not)."""
    from egraph_mirage.gpu.tune import TuneCache, default_compiler

    if cuda_available()[0]:
        pytest.skip("with a GPU the lowering compiles for it")
    base = default_compiler()
    seen: list[Any] = []

    def compiler(g: em.KernelGraph, knobs: Any) -> Any:
        seen.append(knobs.get("input_strides"))
        return base(g, knobs)  # type: ignore[misc]

    class Strides(WallClock):
        def graph(self, fn: Any, sets: Any) -> float:
            seen.append([tuple(x.stride()) for x in sets[0]])
            return super().graph(fn, sets)

    dims = [t.dims for t in rmsnorm.inputs]
    w = next(i for i, d in enumerate(dims) if len(d) == 2 and d[0] > 1)
    strides = tuple((1, dims[w][0]) if i == w else None for i in range(len(dims)))
    profiler = GpuProfiler(compiler=compiler, timer=Strides(), device="cpu", name="interpreter",
                           cache=TuneCache(None), space={"num_warps": (4,), "num_stages": (2,)},
                           strides=strides)
    config = SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0, max_results=2)
    results = superoptimize(rmsnorm, config, workers=1, progress=False, profile=True,
                            profiler=profiler)
    st = results.stats
    assert st.ranked_by == BY_GPU and (st.profile_failed, st.profile_wrong) == (0, 0), st
    assert strides in seen  # compiled to read the weight transposed
    timed = [s for s in seen if isinstance(s, list)]
    assert timed and all(s[w] == (1, dims[w][0]) for s in timed)  # timed on Wᵀ's layout
    assert all("input_strides" not in (r.knobs or {}) for r in results)


def test_a_program_of_two_outputs_is_profiled_per_output_and_joined(tmp_path: Path) -> None:
    """An RMSNorm feeding two projections, each weight read as Wᵀ (``GpuProfiler(strides=)``,
    as the torch backend gives a piece of several outputs): each output's search is timed with
    the layout of its own inputs (``rank.for_inputs``; the whole program's would not fit its
    cone, and its results would go untimed), and the joined program is profiled as a program
    of its own, its knobs tuned on it. The results pass the float check."""
    from egraph_mirage.gpu.tune import TuneCache, default_compiler
    from egraph_mirage.rank import for_inputs

    if cuda_available()[0]:
        pytest.skip("with a GPU the lowering compiles for it")
    g = em.new_kernel_graph()
    x = g.new_input((2, 64), em.float16)
    wq, wk = (g.new_input((64, n), em.float16) for n in (96, 32))
    h = g.rms_norm(x, (64,))
    g.mark_output(g.matmul(h, wq))
    g.mark_output(g.matmul(h, wk))
    strides = (None, (1, 64), (1, 64))
    base = default_compiler()
    seen: list[Any] = []

    def compiler(h: em.KernelGraph, knobs: Any) -> Any:
        seen.append((len(h.outputs), knobs.get("input_strides")))
        return base(h, knobs)  # type: ignore[misc]

    profiler = GpuProfiler(compiler=compiler, timer=WallClock(), device="cpu", name="interpreter",
                           cache=TuneCache(None), space={"num_warps": (4,), "num_stages": (2,)},
                           strides=strides)
    assert for_inputs(profiler, [0, 2]).strides == (None, (1, 64))  # type: ignore[union-attr]
    config = SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0, max_results=1)
    results = superoptimize(g, config, workers=1, progress=False, profile=True,
                            profiler=profiler)
    st = results.stats
    assert results and st.ranked_by == BY_GPU and (st.profile_failed, st.profile_wrong) == (0, 0)
    assert {(1, (None, (1, 64)))} <= set(seen)  # each output's cone, its own layout
    assert (2, strides) in seen  # the joined program, the whole layout
    assert results.best.measured_us is not None and results.best.knobs is not None
    # a joined result the profile did not time has no time: its parts' were at their knobs
    assert all((r.measured_us is None) == (r.knobs is None) for r in results)
