"""Programs of several outputs (``pipeline.outputs``): each output is searched as a program of
its own over the inputs it reads, and the winners are joined over the program's inputs, an
operator two parts compute alike computed once.

- ``cone`` gives each output's program; ``join`` of the cones is the program again, with the
  shared RMSNorm once; the parts' kernels are interleaved by depth, so that the lowering
  launches each depth's kernels as one grid (``horizontal``);
- ``em.superoptimize`` of an RMSNorm feeding two projections returns joined μGraphs that the
  verifier finds equal to the program and that lower and match it;
- the largest output is searched first; an output the search finds nothing for leaves no joined
  result, the outputs after it are not searched, and the reasons name them;
- the torch backend replaces a piece of three outputs (one norm, three projections) with the
  joined winners, matching eager.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.fx.report import REPLACED, reports_of
from egraph_mirage.lower import LowerOptions, generate_source
from egraph_mirage.lower.horizontal import groups
from egraph_mirage.mugraph import ThreadBlockGraph
from egraph_mirage.pipeline.outputs import combinations, cone, join, search_order
from egraph_mirage.verify import verify

#: tasks that find the fused norm + projection of each output (under 60 each at the time of
#: writing)
TASKS = 120


def _norm_two_projections() -> em.KernelGraph:
    g = em.new_kernel_graph()
    x, w = g.new_input((2, 64), em.float16), g.new_input((1, 64), em.float16)
    wq, wk = g.new_input((64, 32), em.float16), g.new_input((64, 16), em.float16)
    n = g.rms_norm(x, (64,), w, eps=1e-5)
    g.mark_output(g.matmul(n, wq))
    g.mark_output(g.exp(g.matmul(n, wk)))
    return g


def test_each_output_s_cone_and_their_join() -> None:
    g = _norm_two_projections()
    (q, qpos), (k, kpos) = cone(g, 0), cone(g, 1)
    assert qpos == [0, 1, 2] and kpos == [0, 1, 3]
    assert [t.op for t in q.operators] == ["rms_norm", "matmul"]
    assert [t.op for t in k.operators] == ["rms_norm", "matmul", "exp"]
    joined = join(g, [(q, qpos), (k, kpos)])
    assert [t.op for t in joined.operators] == ["rms_norm", "matmul", "matmul", "exp"]
    assert verify(joined, g)
    xs = [np.random.default_rng(0).standard_normal(t.dims) for t in g.inputs]
    for a, b in zip(joined.evaluate(xs), g.evaluate(xs)):
        np.testing.assert_allclose(a, b)


def _projection(g: em.KernelGraph, x: em.Tensor, w: em.Tensor) -> em.Tensor:
    """``x @ w`` as a graph-defined kernel of one block per 8 columns."""
    tb = ThreadBlockGraph(grid_dim=(w.dims[1] // 8, 1, 1), forloop_range=1)
    a = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=-1)
    b = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.matmul(a, b)), output_map=(1, -1, -1))
    (out,) = g.customized([x, w], tb)
    return out


def test_the_joined_parts_kernels_of_one_depth_are_launched_as_one_grid() -> None:
    """Each output a chain of two kernels (a split and its combine, as the search's split-K
    forms are): joined, the first kernels of both come first, then the second ones, so that
    with ``horizontal`` the program is two launches, not four, and still equals the
    program."""
    g = em.new_kernel_graph()
    x = g.new_input((4, 32), em.float16)
    ws = [g.new_input(d, em.float16) for d in ((32, 32), (32, 16), (32, 16), (16, 8))]
    g.mark_output(_projection(g, _projection(g, x, ws[0]), ws[1]))
    g.mark_output(_projection(g, _projection(g, x, ws[2]), ws[3]))
    parts = [cone(g, 0), cone(g, 1)]
    one_grid = LowerOptions(horizontal=True, fuse_combines=False)
    assert generate_source(g, one_grid).count("_launch(kernel_") == 3
    joined = join(g, parts)
    first, second = groups(joined, {})
    assert [k.tb.grid_dim[0] for k in first] == [4, 2]  # 32 and 16 columns, 8 a block
    assert [k.tb.grid_dim[0] for k in second] == [2, 1]  # 16 and 8
    assert generate_source(joined, one_grid).count("_launch(kernel_") == 2
    rng = np.random.default_rng(0)
    ts = [torch.tensor(0.3 * rng.standard_normal(t.dims), dtype=torch.float16)
          for t in g.inputs]
    want = g.evaluate([t.double().numpy() for t in ts])
    for got in (em.compile(joined, horizontal=True, fuse_combines=False)(*ts),
                em.compile(joined)(*ts)):
        for a, b in zip(got, want, strict=True):
            assert np.abs(a.double().numpy() - b).max() <= 1e-2 * np.abs(b).max()


def test_the_search_joins_a_winner_per_output() -> None:
    g = _norm_two_projections()
    results = em.superoptimize(g, max_tasks=TASKS, workers=1, progress=False,
                               config=em.SearchConfig(max_results=2))
    assert results, results.stats.no_result_reasons
    assert len(results) <= 2 and results.stats.tasks_done <= 2 * TASKS  # max_results stops each
    best = results[0]
    assert len(best.graph.outputs) == 2 and len(best.graph.inputs) == 4
    assert verify(best.graph, g)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # else Triton's interpreter
    rng = np.random.default_rng(1)
    ts = [torch.tensor(0.5 * rng.standard_normal(t.dims), dtype=torch.float16, device=device)
          for t in g.inputs]
    got = em.compile(best.graph)(*ts)
    want = g.evaluate([t.double().cpu().numpy() for t in ts])
    for a, b in zip(got, want, strict=True):
        assert np.linalg.norm(a.double().cpu().numpy() - b) <= 1e-2 * np.linalg.norm(b)


def test_an_output_with_nothing_found_leaves_no_joined_result() -> None:
    """The largest output's cone is searched first (output 1: the norm, its projection and an
    exp); nothing found for it: no joined result, and output 0 is not searched (no result of
    the program could take it), its time left to the caller; the reasons name both."""
    g = _norm_two_projections()
    assert search_order([cone(g, 0), cone(g, 1)]) == [1, 0]
    results = em.superoptimize(g, max_tasks=1, workers=1, progress=False)
    assert not results
    assert any(r.startswith("output 1: ") for r in results.stats.no_result_reasons)
    assert results.stats.no_result_reasons[-1] == (
        "output 0: not searched: output 1 has no result, and a result of the program takes one "
        "of each")
    assert results.stats.stopped_by.startswith("output 1: task budget")
    assert results.stats.tasks_done == 1


def test_combinations_take_the_best_then_one_other_result_at_a_time() -> None:
    class R:
        def __init__(self, s: float) -> None:
            self.estimated_seconds = s

    per = [[R(1.0), R(1.5)], [R(2.0), R(2.1), R(4.0)]]
    assert combinations(per, None) == [[0, 0], [0, 1], [1, 0], [0, 2]]
    assert combinations(per, 2) == [[0, 0], [0, 1]]


class _NormQKV(torch.nn.Module):
    def __init__(self, hidden: int = 64, kv: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.rand(hidden) + 0.5)
        self.q = torch.nn.Linear(hidden, hidden, bias=False)
        self.k = torch.nn.Linear(hidden, kv, bias=False)
        self.v = torch.nn.Linear(hidden, kv, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        h = self.w * h.to(x.dtype)
        return self.q(h), self.k(h), self.v(h)


def test_torch_compile_replaces_a_norm_and_three_projections_as_one_piece(
        tmp_path: Path) -> None:
    torch._dynamo.reset()
    m = _NormQKV().to(torch.float16).eval()
    x = torch.randn(2, 64, dtype=torch.float16)
    fast = torch.compile(m, backend="egraph_mirage", dynamic=False,
                         options={"max_tasks": TASKS, "workers": 1, "rest": "eager",
                                  "budget": None,  # bounded by tasks, not seconds
                                  "config": em.SearchConfig(max_results=1),
                                  "cache_dir": str(tmp_path)})
    with torch.no_grad():
        got, want = fast(x), m(x)
    (report,) = reports_of(fast)
    (piece,) = report.pieces
    assert piece.status == REPLACED, em.torch_report(fast)
    assert piece.operators.count("matmul") == 3 and piece.operators.count("rsqrt") == 1
    for a, b in zip(got, want):
        assert (a.float() - b.float()).norm() <= 5e-3 * b.float().norm()
    torch._dynamo.reset()


@pytest.mark.parametrize("profile", [False, True])
def test_each_output_gets_a_share_of_the_budget_and_profiled_the_join_one_more(
        profile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two outputs within 30 s, each search using its whole share (a clock of the test's
    own): each output's search gets the seconds left over the outputs not yet searched, 15 s
    each; where results are profiled, the joined program (whose knobs are tuned on it whole)
    counts as one more, 10 s each, and the join is then profiled."""
    from dataclasses import replace

    from egraph_mirage.pipeline import outputs
    from egraph_mirage.pipeline.outputs import run_outputs
    from egraph_mirage.pipeline.request import Request
    from egraph_mirage.rank.measured import Measurement
    from egraph_mirage.search import SearchResult, SearchResults, SearchStats

    class Timed:
        device_name = "Fake GPU"

        def __init__(self) -> None:
            self.programs: list[int] = []

        def measure(self, program: em.KernelGraph, mugraphs: Any) -> list[Measurement]:
            self.programs.append(len(program.outputs))
            return [Measurement("ok", us=1.0, knobs={"num_warps": 4}) for _ in mugraphs]

    class Clock:
        now = 1000.0

        def time(self) -> float:
            return self.now

        perf_counter = time

    clock = Clock()
    monkeypatch.setattr(outputs, "time", clock)
    budgets: list[float] = []

    def run_one(h: em.KernelGraph, request: Any, **_: Any) -> SearchResults:
        budgets.append(request.time_budget)
        clock.now += request.time_budget
        return SearchResults([SearchResult(h, 1, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats())

    profiler = Timed()
    request = replace(Request(), time_budget=30.0, profile=profile,
                      profiler=profiler if profile else None)
    results, _ = run_outputs(_norm_two_projections(), request, run_one)
    assert budgets == pytest.approx([10.0, 10.0] if profile else [15.0, 15.0])
    assert len(results) == 1 and (results[0].knobs is not None) == profile
    assert profiler.programs == ([2] if profile else [])
