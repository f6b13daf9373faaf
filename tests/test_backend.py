"""The ``torch.compile`` backend (``fx.backend``) on the CPU, kernels in Triton's interpreter.

Most tests search with a stand-in (``search=``, a function returning a chosen program as the
"winner"), so they test the backend's flow and not the search; one test runs the real search on
a tiny space (``tests/search_space.TINY``), and the Llama layer runs it with one task per piece.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from search_space import TINY

import egraph_mirage as em
from egraph_mirage.fx import inductor_timing
from egraph_mirage.fx.backend import NAME, Backend, egraph_mirage_backend
from egraph_mirage.fx.decision import slower
from egraph_mirage.fx.options import BackendError, BackendOptions, DynamicShapesError
from egraph_mirage.fx.report import KEPT, RECENT, REPLACED, reports_of, torch_report
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def relu_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w) * 2


def rms_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6) @ w


def inputs(dtype: torch.dtype = torch.float16, rows: int = 2) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(rows, 64, generator=gen).to(dtype),
            torch.randn(64, 96, generator=gen).to(dtype))


class StandIn:
    """A search that returns ``winner(g)`` (default: the piece's own program ``g``) as its one
    result, and counts its calls."""

    def __init__(self, winner: Any = None) -> None:
        self.calls = 0
        self.winner = winner
        self.__qualname__ = f"StandIn.{getattr(winner, '__name__', 'same')}"

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        self.calls += 1
        winner = self.winner(g) if self.winner else g
        return SearchResults([SearchResult(winner, 0, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats())


def scaled_by_three(g: em.KernelGraph) -> em.KernelGraph:
    """A program of ``g``'s inputs that is not ``g``: relu(x @ w) * 3."""
    h = em.new_kernel_graph()
    x, w = (h.new_input(t.dims, dtype=t.dtype) for t in g.inputs)
    h.mark_output(h.mul_scalar(h.relu(h.matmul(x, w)), 3.0))
    return h


def ops_called(fn: Any, *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)`` (compiled by a first call) under the profiler, and the names of the
    backend's custom ops it ran."""
    fn(*args)
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, [e.name for e in prof.events() if e.name.startswith("egraph_mirage::")]


def options(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cache_dir": str(tmp_path), "workers": 1, "budget": 60, "rest": "eager", **more}


def test_a_found_piece_is_replaced_and_matches_eager(tmp_path: Path) -> None:
    search = StandIn()
    backend = Backend(**options(tmp_path, search=search))
    compiled = torch.compile(relu_mm, backend=backend, dynamic=False)
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(compiled, x, w)
    torch.testing.assert_close(got, relu_mm(x, w), rtol=2e-3, atol=2e-3)
    assert search.calls == 1 and len(ops) == 1 and ops[0].startswith("egraph_mirage::egm_0_")
    (report,) = backend.reports
    (piece,) = report.pieces
    assert piece.status == REPLACED and piece.cache == "miss"
    assert piece.operators == ("matmul", "relu", "mul_scalar")
    assert piece.shapes == ((2, 64), (64, 96)) and piece.dtypes == ("float16", "float16")
    assert torch_report(compiled) == report.text() == torch_report(backend)
    assert "replaced" in report.text() and report in RECENT


def test_the_second_compile_hits_the_cache(tmp_path: Path) -> None:
    x, w = inputs()
    first, second = StandIn(), StandIn()
    with torch.no_grad():
        torch.compile(relu_mm, backend=Backend(**options(tmp_path, search=first)))(x, w)
        torch._dynamo.reset()
        backend = Backend(**options(tmp_path, search=second))
        got, ops = ops_called(torch.compile(relu_mm, backend=backend), x, w)
    assert (first.calls, second.calls, backend.searches) == (1, 0, 0)
    (piece,) = backend.reports[0].pieces
    assert piece.cache == "hit" and piece.status == REPLACED and piece.search_seconds is None
    assert len(ops) == 1
    torch.testing.assert_close(got, relu_mm(x, w), rtol=2e-3, atol=2e-3)
    assert "0 search(es), cache 1 hit(s) / 0 miss(es)" in backend.reports[0].text()


def test_a_winner_that_differs_from_eager_is_kept(tmp_path: Path) -> None:
    backend = Backend(**options(tmp_path, search=StandIn(winner=scaled_by_three)))
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(torch.compile(relu_mm, backend=backend), x, w)
    assert ops == []
    torch.testing.assert_close(got, relu_mm(x, w))
    (piece,) = backend.reports[0].pieces
    assert piece.status == KEPT and "differs from eager" in piece.reason


def test_with_nothing_replaced_the_rest_is_dynamos_own_graph(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    """Never slower: when no piece is replaced, the rest compiler gets the graph Dynamo gave
    the backend, not the partitioned one (Inductor compiles exactly what torch.compile would)."""
    import egraph_mirage.fx.backend as backend_module

    given: list[Any] = []
    real = backend_module._rest

    def spy(module: Any, example_inputs: Any, rest: str, mode: Any, dynamo: Any = None) -> Any:
        given.append(module)
        return real(module, example_inputs, rest, mode, dynamo)

    monkeypatch.setattr(backend_module, "_rest", spy)
    x, w = inputs()
    with torch.no_grad():
        torch.compile(relu_mm, backend=Backend(**options(
            tmp_path, search=StandIn(winner=scaled_by_three))), dynamic=False)(x, w)
        torch.compile(relu_mm, backend=Backend(**options(
            tmp_path / "other", search=StandIn())), dynamic=False)(x, w)
    kept, replaced = given
    assert not any(name.startswith("egm_") for name, _ in kept.named_children())
    assert any(name.startswith("egm_") for name, _ in replaced.named_children())


def test_an_unsupported_operator_runs_in_the_rest(tmp_path: Path) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(relu_mm(x, w), dim=0)

    backend = Backend(**options(tmp_path, search=StandIn()))
    x, w = inputs(torch.float32)
    with torch.no_grad():
        got, ops = ops_called(torch.compile(f, backend=backend), x, w)
    torch.testing.assert_close(got, f(x, w), rtol=1e-4, atol=1e-4)
    report = backend.reports[0]
    assert [p.status for p in report.pieces] == [REPLACED] and len(ops) == 1
    (name,) = [n for n in report.left_out if "cumsum" in n]
    assert "left out: " + name in report.text()


def test_the_real_search_on_a_tiny_space_with_inductor_for_the_rest(tmp_path: Path) -> None:
    config = {**asdict(TINY), "max_results": 1}
    compiled = torch.compile(relu_mm, backend=NAME, dynamic=False,
                             options=options(tmp_path, config=config, rest="inductor"))
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(compiled, x, w)
    torch.testing.assert_close(got, relu_mm(x, w), rtol=2e-3, atol=2e-3)
    (report,) = [r for r in RECENT if r.rest == "inductor"][-1:]
    (piece,) = report.pieces
    assert piece.status == REPLACED and piece.num_kernels == 1 and len(piece.grids) == 1
    assert len(ops) == 1 and report.searches == 1


def test_rms_norm_then_matmul_by_the_fused_kernel(tmp_path: Path) -> None:
    """The one-kernel μGraph of RMSNorm + Linear (hand-written, as the search finds it) as the
    winner: its kernel (which calls ``tl.sum``) replaces the piece and matches eager."""
    from egraph_mirage.bench.handwritten_fixtures import rmsnorm_linear

    backend = Backend(**options(tmp_path, search=StandIn(winner=rmsnorm_linear)))
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(torch.compile(rms_mm, backend=backend, dynamic=False), x, w)
    torch.testing.assert_close(got, rms_mm(x, w), rtol=2e-3, atol=2e-3)
    (piece,) = backend.reports[0].pieces
    assert piece.operators == ("rms_norm", "matmul") and piece.status == REPLACED
    assert len(ops) == 1 and piece.grids == [(6, 1, 1)]


class NothingForNormAndMatmul(StandIn):
    """A stand-in search that finds nothing for a program holding both a norm and a matmul, and
    the program itself for any other."""

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        ops = {t.op for t in g.operators}
        if {"rms_norm", "matmul"} <= ops:
            self.calls += 1
            return SearchResults([], SearchStats())  # nothing found
        return super().__call__(g, config, **options)


def gated(x: torch.Tensor, r: torch.Tensor, g: torch.Tensor, wg: torch.Tensor,
          wu: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.rms_norm(x + r, (x.shape[-1],), g, 1e-5)
    return torch.nn.functional.silu(h @ wg) * (h @ wu)


@pytest.mark.parametrize("refine", [True, False])
def test_a_piece_with_nothing_found_is_searched_again_in_parts(tmp_path: Path,
                                                               refine: bool) -> None:
    """The residual add, RMSNorm and gated projections of an MLP, for which the search finds
    nothing whole: cut at the projections' inputs, the norm and the projections are searched
    apart and both replaced (``refine=False``: the piece stays); a second compile finds every
    decision in the cache."""
    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(2, 64, generator=gen).half(), torch.randn(2, 64, generator=gen).half(),
          (torch.rand(64, generator=gen) + 0.5).half(),
          torch.randn(64, 32, generator=gen).half() / 8,
          torch.randn(64, 32, generator=gen).half() / 8)
    search = NothingForNormAndMatmul()
    backend = Backend(**options(tmp_path, search=search, refine=refine))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(gated, backend=backend, dynamic=False), *xs)
    torch.testing.assert_close(got, gated(*xs), rtol=2e-3, atol=2e-3)
    whole, *parts = backend.reports[0].pieces
    assert whole.status == KEPT and whole.nothing_found()
    assert search.calls == (3 if refine else 1)  # the whole piece, then its two parts
    if not refine:
        assert parts == [] and ops == []
        return
    assert "searched in 2 parts (0.0–0.1)" in whole.reason
    assert [(p.index, p.part, p.name, p.status) for p in parts] == [
        (0, 0, "egm_0.egm_0", REPLACED), (0, 1, "egm_0.egm_1", REPLACED)]
    assert parts[0].operators == ("add", "rms_norm") and "matmul" in parts[1].operators
    assert len(ops) == 2 and "piece 0.1 (egm_0.egm_1)" in backend.reports[0].text()
    torch._dynamo.reset()
    again = Backend(**options(tmp_path, search=search, refine=refine))
    with torch.no_grad():
        torch.compile(gated, backend=again, dynamic=False)(*xs)
    assert [p.cache for p in again.reports[0].pieces] == ["hit"] * 3 and again.searches == 0


class NothingForMatmulAndConcat(StandIn):
    """A stand-in search that finds nothing for a program holding a matmul and a concat (a
    projection with its RoPE rotation), and the program itself for any other."""

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        ops = {t.op for t in g.operators}
        if {"concat", "matmul"} <= ops:
            self.calls += 1
            return SearchResults([], SearchStats())
        return super().__call__(g, config, **options)


def norm_projection_rope(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.rms_norm(x, (x.shape[-1],), g, 1e-5)
    q = (h @ w).view(1, 1, 4, 16).transpose(1, 2)
    return q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin


def test_a_part_with_nothing_found_is_cut_again_after_its_matmul(tmp_path: Path) -> None:
    """An RMSNorm, a projection and its RoPE rotation, for which the search finds nothing
    whole nor for the projection with its rotation: the piece is cut at the projection's
    input (the norm, replaced; the projection with the rotation, nothing found), and that part
    again after its matmul (``levels=EPILOGUES``): the projection and the rotation are
    replaced apart, and the whole matches eager."""
    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(1, 64, generator=gen).half(), (torch.rand(64, generator=gen) + 0.5).half(),
          torch.randn(64, 64, generator=gen).half() / 8,
          torch.randn(1, 1, 1, 16, generator=gen).half(),
          torch.randn(1, 1, 1, 16, generator=gen).half())
    search = NothingForMatmulAndConcat()
    backend = Backend(**options(tmp_path, search=search))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(norm_projection_rope, backend=backend,
                                            dynamic=False), *xs)
    torch.testing.assert_close(got, norm_projection_rope(*xs), rtol=2e-3, atol=2e-3)
    whole, *parts = backend.reports[0].pieces
    assert whole.status == KEPT and search.calls == 5  # 2 with nothing found, 3 parts found
    assert [(p.name, p.status) for p in parts] == [
        ("egm_0.egm_0", REPLACED), ("egm_0.egm_1", KEPT),
        ("egm_0.egm_1.egm_0", REPLACED), ("egm_0.egm_1.egm_1", REPLACED)]
    assert "searched in 2 parts (0.1.0–0.1.1)" in parts[1].reason
    assert "concat" in parts[3].operators and "matmul" not in parts[3].operators
    assert len(ops) == 3 and "piece 0.1.1 (egm_0.egm_1.egm_1)" in backend.reports[0].text()


@pytest.mark.parametrize("timing, replaced", [("graph", True), ("plain", False),
                                              ("both", False)])
def test_a_winner_replaces_its_piece_only_where_faster_under_the_timing_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timing: str, replaced: bool) -> None:
    """On a GPU each winner is timed against Inductor's code for its piece, under CUDA-graph
    replay and with plain launches (here a stand-in timing: faster replayed, slower launched
    plainly, as a piece whose host overhead outweighs its kernels' gain). ``timing`` says
    which must be faster; the times are cached, the decision is made from them on each
    compile, so another ``timing`` needs no search."""
    from egraph_mirage.fx import backend as be

    times = {"ours_us": 5.0, "inductor_us": 6.0, "ours_plain_us": 40.0,
             "inductor_plain_us": 20.0, "ours_flushed_us": 40.0, "inductor_flushed_us": 20.0}
    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", lambda *a, **k: dict(times))
    monkeypatch.setattr(inductor_timing, "time_graphs", lambda *a, **k: {  # the whole graph: faster
        "ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0, "inductor_plain_us": 2.0,
        "ours_flushed_us": 1.0, "inductor_flushed_us": 2.0})
    search = StandIn()
    for rerun in (False, True):  # the second compile decides from the cached times
        torch._dynamo.reset()
        backend = Backend(**options(tmp_path, search=search, profile=True, timing=timing))
        with torch.no_grad():
            got, ops = ops_called(torch.compile(relu_mm, backend=backend, dynamic=False),
                                  *inputs())
        torch.testing.assert_close(got, relu_mm(*inputs()), rtol=2e-3, atol=2e-3)
        (piece,) = backend.reports[0].pieces
        assert (piece.status == REPLACED) == replaced and len(ops) == int(replaced)
        assert piece.cache == ("hit" if rerun else "miss") and search.calls == 1
        assert (piece.ours_plain_us, piece.inductor_plain_us) == (40.0, 20.0)
        assert "ours 5.0 µs / 40.0 µs, Inductor 6.0 µs / 20.0 µs" in piece.line()
        if not replaced:
            assert piece.reason == "not faster than Inductor's code (plain launches)"


@pytest.mark.parametrize("whole, replaced", [((1.0, 2.0), True), ((3.0, 2.0), False)])
def test_the_whole_graph_is_never_slower_than_inductors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: tuple[float, float],
        replaced: bool) -> None:
    """Pieces faster alone can make the graph slower (each call's host time, where Inductor's
    code for the piece is fused into the graph's): the graph with its pieces replaced is timed
    against Inductor's code for Dynamo's graph, and where it is slower every piece is kept and
    Inductor's code runs, with a note saying why. The times are cached: a second compile of
    the same graph times nothing and decides the same."""
    from egraph_mirage.fx import backend as be

    faster = {"ours_us": 5.0, "inductor_us": 6.0, "ours_plain_us": 10.0,
              "inductor_plain_us": 20.0, "ours_flushed_us": 10.0, "inductor_flushed_us": 20.0}
    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", lambda *a, **k: dict(faster))
    ours, theirs = whole
    timed: list[int] = []

    def time_graphs(*args: Any, **kwargs: Any) -> dict[str, float]:
        timed.append(1)
        return {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": ours,
                "inductor_plain_us": theirs, "ours_flushed_us": ours, "inductor_flushed_us": theirs}

    monkeypatch.setattr(inductor_timing, "time_graphs", time_graphs)
    for rerun in (False, True):
        torch._dynamo.reset()
        backend = Backend(**options(tmp_path, search=StandIn(), profile=True))
        with torch.no_grad():
            got, ops = ops_called(torch.compile(relu_mm, backend=backend, dynamic=False),
                                  *inputs())
        torch.testing.assert_close(got, relu_mm(*inputs()), rtol=2e-3, atol=2e-3)
        report = backend.reports[0]
        (piece,) = report.pieces
        assert (piece.status == REPLACED) == replaced and len(ops) == int(replaced)
        assert len(timed) == 1, "the second compile decides from the cached times"
        assert report.whole_cache == ("hit" if rerun else "miss")
        assert (f"  whole graph: ours 1.0 / {ours} / {ours} µs, Inductor 2.0 / {theirs} / "
                f"{theirs} µs (graph replay / plain launches / plain, L2 flushed) | cache "
                f"{report.whole_cache}") in report.text()
        if not replaced:
            assert piece.reason == "the whole graph was slower with it replaced"
            assert report.note == ("the graph with 1 piece(s) replaced: not faster than "
                                   "Inductor's code (plain launches): ours 1.0 / 3.0 / 3.0 µs, "
                                   "Inductor 2.0 / 2.0 / 2.0 µs (graph replay / plain launches "
                                   "/ plain, L2 flushed); every piece kept")
    # another graph (here: other shapes) is timed again
    torch._dynamo.reset()
    backend = Backend(**options(tmp_path, search=StandIn(), profile=True))
    with torch.no_grad():
        torch.compile(relu_mm, backend=backend, dynamic=False)(*inputs(rows=4))
    assert backend.reports[0].whole_cache == "miss" and len(timed) == 2


def test_where_the_whole_graph_is_slower_the_piece_that_gains_least_is_kept_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decisions for the whole graph: two pieces each faster alone, the graph with both slower
    with plain launches. The piece that gains least alone under the kind of timing the graph
    lost by (here: 2 against 10 µs with plain launches) is kept and the graph with the other
    one is timed; it is faster, so that one stays replaced. Every set's times are cached: the
    second compile times nothing and decides the same."""
    from egraph_mirage.fx import backend as be

    def two_layers(x: torch.Tensor, w: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w) @ w2

    gains = {"egm_0": 10.0, "egm_1": 2.0}  # µs each piece saves alone, plain launches

    def alone(runner: Any, traced: Any, piece: Any, *args: Any, **kwargs: Any) -> dict:
        plain = 20.0 - gains[piece.name]
        return {"ours_us": 5.0, "inductor_us": 6.0, "ours_plain_us": plain,
                "inductor_plain_us": 20.0, "ours_flushed_us": plain, "inductor_flushed_us": 20.0}

    timed: list[int] = []

    def time_graphs(*args: Any, **kwargs: Any) -> dict[str, float]:
        timed.append(1)
        ours = 30.0 if len(timed) == 1 else 15.0  # both pieces replaced: slower; one: faster
        return {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": ours,
                "inductor_plain_us": 20.0, "ours_flushed_us": ours, "inductor_flushed_us": 20.0}

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", alone)
    monkeypatch.setattr(inductor_timing, "time_graphs", time_graphs)
    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(2, 64, generator=gen).half(), torch.randn(64, 96, generator=gen).half(),
          torch.randn(96, 32, generator=gen).half())
    for rerun in (False, True):
        torch._dynamo.reset()
        backend = Backend(**options(tmp_path, search=StandIn(), profile=True, max_matmuls=1))
        with torch.no_grad():
            got, ops = ops_called(torch.compile(two_layers, backend=backend, dynamic=False), *xs)
        torch.testing.assert_close(got, two_layers(*xs), rtol=2e-2, atol=2e-2)
        report = backend.reports[0]
        status = {p.name: p.status for p in report.pieces}
        assert status == {"egm_0": REPLACED, "egm_1": KEPT} and len(ops) == 1
        assert len(timed) == 2, "the second compile decides from the cached times"
        assert report.note.startswith("the graph with 2 piece(s) replaced: not faster than "
                                      "Inductor's code (plain launches)")
        assert report.note.endswith("; egm_0 replaced, the others kept")
        assert "ours 1.0 / 15.0 / 15.0 µs" in report.text()  # the graph that runs


def test_the_timing_criterion() -> None:
    timed = {"ours_us": 5.0, "inductor_us": 6.0, "ours_plain_us": 10.0,
             "inductor_plain_us": 20.0, "ours_flushed_us": 11.0, "inductor_flushed_us": 21.0}
    assert slower(timed, "both") == slower(timed, "graph") == slower(timed, "plain") == ""
    slow_replay = dict(timed, ours_us=7.0)
    assert slower(slow_replay, "both") == "not faster than Inductor's code (CUDA-graph replay)"
    assert slower(slow_replay, "plain") == ""
    assert slower({}, "both") == ""  # not timed: no GPU
    assert "earlier version" in slower({"ours_us": 5.0, "inductor_us": 6.0}, "both")
    # a winner whose CUDA graph could not be captured is not used where replay counts
    uncaptured = dict(timed, ours_us=None)
    assert slower(uncaptured, "graph") == "could not be timed under CUDA-graph replay"
    assert slower(uncaptured, "plain") == ""
    with pytest.raises(BackendError, match="timing must be one of"):
        BackendOptions.of({"timing": "fast"})


def test_dynamic_true_is_a_clear_error(tmp_path: Path) -> None:
    compiled = torch.compile(relu_mm, backend=NAME, dynamic=True, options=options(tmp_path))
    with pytest.raises(Exception, match=r"static shapes only.*dynamic=True\) is not supported"
                       ) as caught, torch.no_grad():
        compiled(*inputs())
    inner = getattr(caught.value, "inner_exception", caught.value.__cause__)
    assert isinstance(inner, DynamicShapesError)


def test_automatic_dynamic_shapes_and_autograd_run_in_the_rest(tmp_path: Path) -> None:
    backend = Backend(**options(tmp_path, search=StandIn()))
    compiled = torch.compile(relu_mm, backend=backend)  # dynamic=None: automatic
    with torch.no_grad():
        compiled(*inputs(rows=2))
        x, w = inputs(rows=4)
        torch.testing.assert_close(compiled(x, w), relu_mm(x, w))
    assert "symbolic shapes" in backend.reports[-1].note and not backend.reports[-1].pieces
    torch._dynamo.reset()
    x, w = inputs(torch.float32)
    w.requires_grad_(True)
    got = torch.compile(relu_mm, backend=backend, dynamic=False)(x, w)
    torch.testing.assert_close(got, relu_mm(x, w))
    assert "inference only" in backend.reports[-1].note


def test_options_are_checked() -> None:
    with pytest.raises(BackendError, match="unknown option"):
        BackendOptions.of({"budjet": 3})
    with pytest.raises(BackendError, match="rest"):
        BackendOptions.of({"rest": "aot_eager"})
    with pytest.raises(BackendError, match="budget"):
        BackendOptions.of({"budget": -1})
    with pytest.raises(BackendError, match="workers"):
        BackendOptions.of({"workers": 0})
    assert BackendOptions.of({"config": {"max_kernels": 1}}).config.max_kernels == 1
    with pytest.raises(BackendError, match="Backend\\(\\.\\.\\.\\)"):
        Backend()(None, [], options={"budget": 1})


def test_registered_with_dynamo() -> None:
    assert NAME in torch._dynamo.list_backends(exclude_tags=())
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend(NAME) is egraph_mirage_backend


def test_the_entry_point_is_found_by_dynamo(tmp_path: Path) -> None:
    """A distribution whose entry points are pyproject's lets Dynamo find the backend without
    importing egraph_mirage first (and without a duplicate registration when it loads)."""
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    (value,) = eps["torch_dynamo_backends"].values()
    info = tmp_path / "site" / "egraph_mirage_entry-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: egraph-mirage-entry\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\n{NAME} = {value}\n")
    script = textwrap.dedent(f"""
        import sys, torch
        assert "egraph_mirage" not in sys.modules
        f = torch.compile(lambda x: x + 1, backend={NAME!r}, dynamic=False,
                          options={{"rest": "eager", "cache": False}})
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))
        print("ok", "egraph_mirage.fx.backend" in sys.modules)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "True"]


def test_the_small_llama_layer_matches_eager(tmp_path: Path) -> None:
    """The whole layer through the backend, the stand-in search's "winner" being each piece's
    own program (lowered as is): every single-output piece is replaced by its custom op, input
    views and output reshapes included, and the layer still computes what eager does. (The
    real search on these pieces takes minutes on a CPU.)"""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from llama_layer import LlamaLayer
    finally:
        sys.path.remove(str(ROOT / "examples"))
    layer = LlamaLayer()
    args = layer.example_inputs(batch=2)
    backend = Backend(**options(tmp_path, search=StandIn()))
    compiled = torch.compile(layer, backend=backend, dynamic=False)
    with torch.no_grad():
        got, ops = ops_called(compiled, *args)
        want = layer(*args)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    report = backend.reports[0]
    assert len(report.pieces) >= 3
    assert {"rms_norm", "matmul", "concat", "exp", "silu"} <= {
        op for p in report.pieces for op in p.operators}
    replaced = [p for p in report.pieces if p.status == REPLACED]
    assert replaced and len(ops) == len(replaced)
    assert all(p.reason for p in report.pieces if p.status != REPLACED)


def test_the_interpreter_is_switched_on_after_triton_was_imported() -> None:
    """``torch._dynamo`` imports triton (its interpreter off) before the backend compiles a
    winner: ``lower.compile.use_interpreter`` then also makes Triton's library functions
    (``tl.sum``) interpreted, so an interpreted kernel may call them; a second call is
    harmless."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from egraph_mirage.lower.compile import use_interpreter

        use_interpreter()

        @triton.jit
        def row_sum(x_ptr, out_ptr, n: tl.constexpr):
            row = tl.program_id(0)
            tl.store(out_ptr + row, tl.sum(tl.load(x_ptr + row * n + tl.arange(0, n)), axis=0))

        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        for _ in range(2):
            out = torch.empty(3)
            row_sum[(3,)](x, out, 4)
            assert torch.equal(out, x.sum(1)), out
            use_interpreter()
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok"]


def test_the_pieces_of_a_compilation_share_one_pool_of_workers(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    """A process count starts one pool, warmed up, at the first search of a compilation: every
    piece's search gets it (its budget is not spent starting processes), and it is shut down
    when the compilation ends. A compilation whose pieces all hit the cache starts none."""
    from egraph_mirage import processes

    started: list[Any] = []
    real = processes.worker_pool
    monkeypatch.setattr(processes, "worker_pool", lambda n: started.append(real(n)) or started[-1])

    seen: list[Any] = []

    class Recording(StandIn):
        def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
            seen.append(options["workers"])
            return super().__call__(g, config, **options)

    def chain(x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        for w in ws:
            x = torch.relu(x @ w)
        return x

    gen = torch.Generator().manual_seed(0)
    dims = (16, 16, 32, 32, 16)  # two pieces of two matmuls each, not alike
    xs = (torch.randn(4, 16, generator=gen).half(),
          *(torch.randn(a, b, generator=gen).half() / 4 for a, b in itertools.pairwise(dims)))
    for expect_pools in (1, 1):  # the second compilation hits the cache
        torch._dynamo.reset()
        search = Recording()
        backend = Backend(**options(tmp_path, search=search, workers=2, max_matmuls=2))
        with torch.no_grad():
            got = torch.compile(chain, backend=backend)(*xs)
        torch.testing.assert_close(got, chain(*xs), rtol=2e-2, atol=2e-2)
        assert len(started) == expect_pools
    assert len(seen) == 2 and seen[0] is seen[1] is started[0]
    assert started[0]._shutdown_thread  # shut down at the end of its compilation
    assert [p.cache for p in backend.reports[0].pieces] == ["hit", "hit"]


def test_a_piece_whose_checks_take_much_memory_gets_as_many_processes_as_fit(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Where fewer processes checking a piece's candidates fit in memory than the compilation's
    pool has workers (``verify.checks_that_fit``: a real model's sizes), that piece's search
    gets that many processes of its own, and no shared pool is started for it: a worker
    killed for memory would lose its tasks."""
    from egraph_mirage import processes
    from egraph_mirage.fx import backend as be

    started: list[Any] = []
    monkeypatch.setattr(processes, "worker_pool", lambda n: started.append(n))
    monkeypatch.setattr(be, "checks_that_fit", lambda g: 1)
    seen: list[Any] = []

    class Recording(StandIn):
        def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
            seen.append(options["workers"])
            return super().__call__(g, config, **options)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w)

    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(4, 16, generator=gen).half(), torch.randn(16, 16, generator=gen).half())
    backend = Backend(**options(tmp_path, search=Recording(), workers=4, cache=False))
    with torch.no_grad():
        torch.compile(f, backend=backend)(*xs)
    assert seen == [1] and started == []


def test_after_the_first_call_a_runner_passes_its_sources_in_place(
        monkeypatch: Any) -> None:
    """A replaced piece's runner checks its inputs on the first call; later calls hand the
    kernels each contiguous source whose views only reshape it as it is (no view made), and a
    weight read transposed (``nn.Linear``'s W, stored (out, in)) through the strides of its
    view, with no copy: the kernels were compiled for them."""
    import egraph_mirage.api as api
    from egraph_mirage.fx import runtime
    from egraph_mirage.fx.trace import trace

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t())

    x, w = torch.randn(1, 1, 64).half(), (torch.randn(32, 64) / 8).half()
    traced = trace(f, x, w)
    assert [len(t.dims) for t in traced.graph.inputs] == [2, 2]  # (1, 64) @ (64, 32)
    results = em.superoptimize(traced.graph, em.SearchConfig(max_results=1), max_tasks=40,
                               workers=1, progress=False)
    kernels = results.best.graph
    assert all(t.op == "customized" for t in kernels.operators)  # graph-defined kernels only
    compiled: list[Any] = []
    real_compile = api.compile
    monkeypatch.setattr(api, "compile", lambda g, **o: compiled.append(real_compile(g, **o))
                        or compiled[-1])
    runner = runtime.make_runner(traced, kernels, {}, (x, w))
    (fn,) = compiled
    assert fn.strides == [None, (1, 64)]
    first = runner([x, w])
    launched: list[Any] = []
    real_launch = fn.module.launch
    monkeypatch.setattr(fn.module, "launch", lambda *ins: launched.append(ins)
                        or real_launch(*ins))
    second = runner([x, w])
    (ins,) = launched
    assert ins[0] is x  # as it is: the graph's (1, 64) is x's (1, 1, 64), row-major
    assert ins[1].data_ptr() == w.data_ptr() and ins[1].stride() == (1, 64)  # no copy
    torch.testing.assert_close(second[0], first[0])
    torch.testing.assert_close(second[0], f(x, w), rtol=2e-2, atol=2e-2)
    assert second[0].shape == (1, 1, 32)


def test_a_layout_the_lowering_refuses_is_copied_instead(monkeypatch: Any) -> None:
    """Where the lowering cannot read an input in place (``LowerError``: a fused combine that
    reads it), the runner compiles the μGraph for row-major inputs and copies the view at
    each call, as before: still right."""
    import egraph_mirage.api as api
    from egraph_mirage.errors import LowerError
    from egraph_mirage.fx import runtime
    from egraph_mirage.fx.trace import trace

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t())

    x, w = torch.randn(2, 64).half(), (torch.randn(32, 64) / 8).half()
    traced = trace(f, x, w)
    kernels = em.superoptimize(traced.graph, em.SearchConfig(max_results=1), max_tasks=40,
                               workers=1, progress=False).best.graph
    real_compile, asked = api.compile, []

    def refusing(g: em.KernelGraph, **options: Any) -> Any:
        asked.append(options.get("input_strides"))
        if options.get("input_strides"):
            raise LowerError("not supported")
        return real_compile(g, **options)

    monkeypatch.setattr(api, "compile", refusing)
    runner = runtime.make_runner(traced, kernels, {}, (x, w))
    assert asked == [(None, (1, 64)), None]
    for _ in range(2):  # the checked first call, then the direct one
        torch.testing.assert_close(runner([x, w])[0], f(x, w), rtol=2e-2, atol=2e-2)


def _launch_by(fn: Any) -> Any:
    """A stand-in for ``make_inductor_launch``: the piece as ``fn(*args)``."""
    def make(traced: Any, mugraph: Any, knobs: Any, example_inputs: Any) -> Any:
        return lambda *xs: fn(*xs)
    return make


@pytest.mark.parametrize("right", [True, False])
def test_inductor_launches_the_replaced_pieces_where_its_outputs_match(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, right: bool) -> None:
    """On a GPU the replaced pieces are traced into Inductor's graph (``launch="inductor"``:
    Inductor launches their kernels itself, no custom-op call per piece), but only where the
    graph so compiled matches Dynamo's graph on the example inputs; otherwise each piece stays
    a call of its custom op. Here a stand-in of the traced launch (torch operators; on a GPU it
    is the generated program's ``launch_traced``), right or wrong."""
    from egraph_mirage.fx import backend as be

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    fn = ((lambda x, w: (torch.relu(x @ w) * 2,)) if right
          else (lambda x, w: (torch.zeros(x.shape[0], w.shape[1], dtype=x.dtype),)))
    monkeypatch.setattr(be, "make_inductor_launch", _launch_by(fn))
    backend = Backend(**options(tmp_path, search=StandIn(), profile=False, rest="inductor"))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(relu_mm, backend=backend, dynamic=False), *inputs())
    torch.testing.assert_close(got, relu_mm(*inputs()), rtol=2e-3, atol=2e-3)
    report = backend.reports[0]
    (piece,) = report.pieces
    assert piece.status == REPLACED
    assert report.launch == ("inductor" if right else "op")
    assert len(ops) == (0 if right else 1), "launched by Inductor: no call of the custom op"
    if not right:
        assert "outputs differ from Dynamo's graph" in report.launch_note
        assert "kernels launched by: op (launched by their ops: Inductor's" in report.text()


def test_inductor_launch_needs_a_gpu_and_a_valid_option(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a GPU (Triton's interpreter) the kernels stay launched by the custom ops."""
    from egraph_mirage.fx import backend as be

    monkeypatch.setattr(be, "_on_gpu", lambda: False)
    backend = Backend(**options(tmp_path, search=StandIn(), profile=False, rest="inductor"))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(relu_mm, backend=backend, dynamic=False), *inputs())
    torch.testing.assert_close(got, relu_mm(*inputs()), rtol=2e-3, atol=2e-3)
    assert backend.reports[0].launch == "op" and len(ops) == 1
    with pytest.raises(BackendError, match="launch must be 'inductor' or 'op'"):
        BackendOptions.of({"launch": "triton"})


@pytest.mark.gpu
def test_inductor_launches_the_generated_kernels_on_a_gpu(tmp_path: Path) -> None:
    """The generated program's ``launch_traced`` (the fused RMSNorm + Linear kernel through
    ``wrap_triton``) traced into Inductor's graph: the output matches eager and no custom op
    runs."""
    from egraph_mirage.bench.handwritten_fixtures import rmsnorm_linear

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    backend = Backend(**options(tmp_path, search=StandIn(winner=rmsnorm_linear), profile=False,
                                rest="inductor"))
    x, w = (t.cuda() for t in inputs())
    with torch.no_grad():
        got, ops = ops_called(torch.compile(rms_mm, backend=backend, dynamic=False), x, w)
    torch.testing.assert_close(got, rms_mm(x, w), rtol=2e-3, atol=2e-3)
    report = backend.reports[0]
    assert report.pieces[0].status == REPLACED
    assert report.launch == "inductor" and ops == [], report.text()


def test_plain_launches_are_timed_in_alternation_and_the_fastest_round_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A host-bound plain launch measures slower whenever the host is busy: ours and
    Inductor's code are timed one after the other, ``PLAIN_ROUNDS`` times, and each side's
    fastest round counts, so that a slow spell of the host falls on both sides."""
    from egraph_mirage.gpu import timing

    calls: list[str] = []
    slow = iter([False, False, True, True] + [False] * 100)  # a busy host in round 2

    class Timer:
        def __init__(self, config: Any = None) -> None:
            pass

        def graph(self, fn: Any, sets: Any) -> float:
            return fn()

        def back_to_back(self, fn: Any, sets: Any, repeats: int = 7) -> float:
            calls.append(fn.__name__)
            return fn() + (500.0 if next(slow) else 0.0)

        def plain(self, fn: Any, sets: Any) -> float:  # after an L2 flush: the flush's cost
            return fn() + 3.0

    def ours() -> float:
        return 10.0

    def inductor() -> float:
        return 12.0

    monkeypatch.setattr(timing, "CudaTimer", Timer)
    times = inductor_timing.time_pair(ours, inductor, [], ("graph", "plain"))
    assert calls == ["ours", "inductor"] * inductor_timing.PLAIN_ROUNDS
    assert times == {"ours_us": 10.0, "inductor_us": 12.0, "ours_plain_us": 10.0,
                     "inductor_plain_us": 12.0, "ours_flushed_us": 13.0,
                     "inductor_flushed_us": 15.0}


def test_plain_launches_must_be_faster_back_to_back_and_after_an_l2_flush() -> None:
    """Plain launches are timed back to back and each after an L2 flush (as ``bench torch``
    reports them); a replacement faster one way and slower the other is not used."""
    faster = {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 10.0,
              "inductor_plain_us": 12.0}
    assert slower({**faster, "ours_flushed_us": 9.0, "inductor_flushed_us": 11.0}, "both") == ""
    slow = {**faster, "ours_flushed_us": 13.0, "inductor_flushed_us": 11.0}
    assert slower(slow, "both") == ("not faster than Inductor's code (plain launches, each after "
                                    "an L2 flush)")
    assert slower(slow, "plain") and not slower(slow, "graph")
    assert "plain, L2 flushed" in inductor_timing.fmt_times(slow)


@pytest.mark.parametrize("launch, rest, timed_by_inductor", [
    ("inductor", "inductor", True), ("op", "inductor", False), ("inductor", "eager", False)])
def test_a_winner_is_timed_as_the_compiled_graph_will_launch_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launch: str, rest: str,
        timed_by_inductor: bool) -> None:
    """Plain launches of a piece cost host time: through its custom op, tens of µs more than
    Inductor's own launch of the same kernels. Where the compiled graph will launch the
    winner's kernels from Inductor's code (``launch="inductor"`` with ``rest="inductor"``),
    the winner is timed that way (``time_against_inductor(launch=...)``), and the cache key
    says so: times measured through the op miss."""
    from egraph_mirage.fx import backend as be
    from egraph_mirage.fx.cache import piece_key

    stand_in = _launch_by(lambda x, w: (torch.relu(x @ w) * 2,))
    seen: list[Any] = []

    def timed(*args: Any, launch: Any = None, **kw: Any) -> dict[str, float]:
        seen.append(launch)
        return {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0,
                "inductor_plain_us": 2.0}

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(be, "make_inductor_launch", stand_in)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", timed)
    monkeypatch.setattr(inductor_timing, "time_graphs", lambda *a, **k: {
        "ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0, "inductor_plain_us": 2.0})
    backend = Backend(**options(tmp_path, search=StandIn(), profile=True, timing="graph",
                                launch=launch, rest=rest))
    with torch.no_grad():
        torch.compile(relu_mm, backend=backend, dynamic=False)(*inputs())
    assert len(seen) == 1 and (seen[0] is not None) == timed_by_inductor
    if timed_by_inductor:  # the function timed is the piece as Inductor launches it
        x, w = inputs()
        torch.testing.assert_close(seen[0](x, w)[0], relu_mm(x, w))
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    keys = {piece_key(g, {}, inductor_timing.key_settings(None, how)).digest()
            for how in ("inductor", "op")}
    assert len(keys) == 2


def test_inductor_compiles_the_launch_it_is_timed_by_or_the_op_is_timed() -> None:
    """``_launched_by_inductor``: the launch function traced and compiled by Inductor computes
    what it computes; a launch that cannot be traced gives None (the op is timed instead)."""
    x, w = inputs(torch.float32)
    compiled = inductor_timing._launched_by_inductor(
        lambda x, w: (torch.relu(x @ w) * 2,), [x, w])
    assert compiled is not None
    torch.testing.assert_close(compiled(x, w)[0], relu_mm(x, w))

    def untraceable(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor]:
        if float(x.sum()) > 0:  # data-dependent control flow: make_fx cannot trace it
            return (x @ w,)
        return (w,)

    assert inductor_timing._launched_by_inductor(untraceable, [x, w]) is None


@pytest.mark.gpu
def test_a_generated_winner_is_timed_launched_from_inductors_code_on_a_gpu(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU the winner (the fused RMSNorm + Linear kernel) is timed through the code
    Inductor compiles for its ``wrap_triton`` launch, not through its op: that compiles, and
    both kinds of timing are measured."""
    from egraph_mirage.bench.handwritten_fixtures import rmsnorm_linear

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    made: list[Any] = []
    real = inductor_timing._launched_by_inductor

    def spy(launch: Any, xs: list[Any]) -> Any:
        made.append(real(launch, xs))
        return made[-1]

    monkeypatch.setattr(inductor_timing, "_launched_by_inductor", spy)
    backend = Backend(**options(tmp_path, search=StandIn(winner=rmsnorm_linear), profile=True,
                                rest="inductor", timing="graph"))
    x, w = (t.cuda() for t in inputs())
    with torch.no_grad():
        got = torch.compile(rms_mm, backend=backend, dynamic=False)(x, w)
    torch.testing.assert_close(got, rms_mm(x, w), rtol=2e-3, atol=2e-3)
    assert len(made) == 1 and made[0] is not None, backend.reports[0].text()
    (piece,) = backend.reports[0].pieces
    assert piece.ours_us is not None and piece.ours_plain_us is not None, piece.line()


def test_a_compilation_in_another_mode_times_the_cached_search_without_searching(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece's decision is cached per ``torch.compile`` mode (its times were measured against
    Inductor's code of that mode), its search once for every mode: compiled again with
    ``mode="max-autotune-no-cudagraphs"``, the piece is timed against that mode's code but not
    searched again, and its report says the search was cached."""
    from egraph_mirage.fx import backend as be

    timed: list[Any] = []

    def timing(runner: Any, traced: Any, piece: Any, mode: Any, **kw: Any) -> dict[str, float]:
        timed.append(mode)
        return {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0,
                "inductor_plain_us": 2.0}

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", timing)
    monkeypatch.setattr(inductor_timing, "time_graphs", lambda *a, **k: {
        "ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0, "inductor_plain_us": 2.0})
    search = StandIn()
    reports = []
    for mode in (None, "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        backend = Backend(**options(tmp_path, search=search, profile=True, timing="graph",
                                    launch="op"))
        with torch.no_grad():
            compiled = torch.compile(relu_mm, backend=backend, mode=mode, dynamic=False)
            torch.testing.assert_close(compiled(*inputs()), relu_mm(*inputs()))
        (report,) = reports_of(compiled)
        reports.append(report)
    assert search.calls == 1 and timed == [None, "max-autotune-no-cudagraphs"]
    first, again = (r.pieces[0] for r in reports)
    assert (first.cache, first.search_cache) == ("miss", "")
    assert (again.cache, again.search_cache, again.search_seconds) == ("miss", "hit", None)
    assert again.status == REPLACED and "search cached" in again.line()
    assert reports[1].searches == 0


def test_autotune_compiles_the_rest_with_max_autotune_where_the_mode_does_not_ask_for_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``autotune`` (on by default where CUDA is): Inductor compiles the rest, and the code each
    winner is timed against, in the max-autotune counterpart of torch.compile's mode, so that
    what is kept is Inductor's best code; the report names the mode."""
    from egraph_mirage.fx import backend as be
    from egraph_mirage.fx.options import AUTOTUNE_MODES

    on = BackendOptions.of({"autotune": True})
    assert on.inductor_mode(None) == "max-autotune-no-cudagraphs" == AUTOTUNE_MODES["default"]
    assert on.inductor_mode("reduce-overhead") == "max-autotune"
    assert on.inductor_mode("max-autotune") == "max-autotune"
    assert BackendOptions.of({"autotune": False}).inductor_mode(None) is None
    with pytest.raises(BackendError, match="autotune must be"):
        BackendOptions.of({"autotune": "yes"})
    modes: list[Any] = []
    rest = be._rest
    monkeypatch.setattr(be, "_rest", lambda module, xs, how, mode, *a: (
        modes.append(mode), rest(module, xs, "eager", mode, *a))[1])
    backend = Backend(**options(tmp_path, search=StandIn(), rest="inductor", autotune=True))
    with torch.no_grad():
        torch.compile(relu_mm, backend=backend, dynamic=False)(*inputs())
    assert modes and set(modes) == {"max-autotune-no-cudagraphs"}
    assert "rest by inductor (max-autotune-no-cudagraphs)" in backend.reports[0].text()


def test_a_winner_that_loses_its_plain_launches_unfused_is_timed_with_its_combines_fused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search's tuner ranks knobs by the kernels' time, in which a launch costs nothing, so
    a split-K winner may come with its combine unfused (two launches). Where that loses with
    plain launches, the backend checks and times the same μGraph with its combine fused (one
    launch) and keeps that where it is used."""
    from egraph_mirage.bench import handwritten_fixtures as hw
    from egraph_mirage.fx import backend as be
    from egraph_mirage.fx.decision import REPLACE, PieceDecision

    made: list[dict[str, Any]] = []
    real = be.make_runner

    def make_runner(traced: Any, mugraph: Any, knobs: Any, xs: Any) -> Any:
        made.append(dict(knobs))
        runner = real(traced, mugraph, knobs, xs)
        runner.knobs = dict(knobs)  # type: ignore[attr-defined]
        return runner

    def timed(runner: Any, *a: Any, **k: Any) -> dict[str, float]:
        plain = 1.0 if runner.knobs.get("fuse_combines") else 3.0  # unfused: a launch more
        return {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": plain,
                "inductor_plain_us": 2.0, "ours_flushed_us": plain, "inductor_flushed_us": 2.0}

    def split_k(g: em.KernelGraph) -> em.KernelGraph:
        return hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=16, loop=32, splits=4))

    class Unfused(StandIn):
        def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
            self.calls += 1
            return SearchResults([SearchResult(split_k(g), 2, 1e-6, 0.0, 2, 0.0, 0.0,
                                               knobs={"fuse_combines": False})], SearchStats())

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(be, "make_runner", make_runner)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", timed)
    monkeypatch.setattr(inductor_timing, "time_graphs", lambda *a, **k: {
        "ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0, "inductor_plain_us": 2.0,
        "ours_flushed_us": 1.0, "inductor_flushed_us": 2.0})
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen).half()
    w = (torch.randn(256, 48, generator=gen) / 16).half()
    backend = Backend(**options(tmp_path, search=Unfused(), profile=True, launch="op"))
    with torch.no_grad():
        got = torch.compile(rms_mm, backend=backend, dynamic=False)(x, w)
    torch.testing.assert_close(got.float(), rms_mm(x, w).float(), rtol=2e-2, atol=2e-2)
    (piece,) = backend.reports[0].pieces
    assert piece.status == REPLACED and piece.ours_plain_us == 1.0
    assert made[:2] == [{"fuse_combines": False}, {"fuse_combines": True}]
    (record,) = [e["record"] for e in (json.loads(p.read_text())
                                       for p in (tmp_path / "fx").rglob("*.json"))
                 if e["record"].get("decision") == REPLACE]
    assert PieceDecision.from_record(record).knobs == {"fuse_combines": True}  # as cached


def test_a_piece_call_holds_its_fused_combines_counters_as_a_buffer() -> None:
    """A replaced piece whose kernels Inductor launches (``PieceCall.by_inductor``) passes its
    launch a persistent int32 buffer of the counters its fused combines need: a buffer of the
    module, so that Inductor, compiling the graph, takes it as an input it mutates in place
    (``runtime.make_inductor_launch``); a launch that needs none gets none."""
    from egraph_mirage.fx.runtime import PieceCall

    seen: list[Any] = []

    def launch(*xs: Any, counters: Any = None) -> tuple[Any, ...]:
        seen.append(counters)
        return (xs[0] * 2,)

    class Op:  # stands in for a PieceOp
        op = staticmethod(lambda xs: [xs[0] * 3])

    launch.counters = 16  # type: ignore[attr-defined]
    call = PieceCall(Op(), launch, device="cpu")  # type: ignore[arg-type]
    assert dict(call.named_buffers())["counters"].tolist() == [0] * 16
    assert call.counters.dtype == torch.int32
    x = torch.ones(2)
    assert torch.equal(call(x)[0], x * 3)  # its op, until Inductor launches it
    call.by_inductor = True
    assert torch.equal(call(x)[0], x * 2) and seen == [call.counters]
    plain = PieceCall(Op(), lambda *xs: (xs[0] * 2,))  # type: ignore[arg-type]
    assert dict(plain.named_buffers()) == {}
