"""How the ``torch.compile`` backend decides with times and how Inductor launches the replaced
pieces (``fx.backend``, ``fx.inductor_timing``, ``fx.runtime``): a winner replaces its piece only
where it is faster under the ``timing`` option (the graph as a whole: ``test_backend_whole``),
plain launches are timed in alternation, a winner is timed as the compiled graph
launches it, a search is cached across Inductor modes, the rest is autotuned, a split-K
winner is retried with its combine fused, and a fused combine's counters are a persistent
buffer. GPU timings are stand-ins (``monkeypatch``) except in the tests marked ``gpu``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from backend_stand_ins import (
    StandIn,
    inputs,
    ops_called,
    options,
    relu_mm,
    rms_mm,
)

import egraph_mirage as em
from egraph_mirage.fx import inductor_timing
from egraph_mirage.fx.backend import Backend
from egraph_mirage.fx.decision import slower
from egraph_mirage.fx.options import BackendError, BackendOptions
from egraph_mirage.fx.report import REPLACED, reports_of
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("timing, alone, whole_plain, replaced", [
    ("graph", "replay", 3.0, True), ("plain", "replay", 3.0, False), ("both", "replay", 3.0, False),
    ("plain", "replay", 1.0, True), ("both", "replay", 1.0, True),
    ("graph", "plain", 1.0, False), ("both", "plain", 1.0, True), ("both", "neither", 1.0, False)])
def test_a_winner_replaces_its_piece_only_where_faster_under_the_timing_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timing: str, alone: str,
        whole_plain: float, replaced: bool) -> None:
    """On a GPU each winner is timed against Inductor's code for its piece, under CUDA-graph
    replay (its GPU's time) and with plain launches back to back (its host's: a piece's call
    alone is bound by it). Under ``timing="graph"`` it must be faster replayed. Under "plain"
    and "both" it must be faster either way (``alone``: the way it is faster), and the graph
    with it replaced must then be faster than Inductor's code for the graph under every kind
    the option asks for (``whole_plain``: the graph's plain µs against Inductor's 2.0): in a
    graph whose GPU time exceeds its host time a call's host time overlaps the kernels before
    it, so a piece slower launched alone can make the graph faster, and a piece faster
    launched alone (one launch where Inductor makes several) can win in a graph bound by its
    host. The times are cached, the decision is made from them on each compile, so another
    ``timing`` needs no search."""
    from egraph_mirage.fx import backend as be

    replay, plain = {"replay": (5.0, 40.0), "plain": (7.0, 10.0), "neither": (7.0, 40.0)}[alone]
    times = {"ours_us": replay, "inductor_us": 6.0, "ours_plain_us": plain,
             "inductor_plain_us": 20.0, "ours_flushed_us": plain, "inductor_flushed_us": 20.0,
             "ours_synced_us": plain, "inductor_synced_us": 20.0}
    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", lambda *a, **k: dict(times))
    monkeypatch.setattr(inductor_timing, "time_graphs", lambda *a, **k: {
        "ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": whole_plain,
        "inductor_plain_us": 2.0, "ours_flushed_us": whole_plain, "inductor_flushed_us": 2.0,
        "ours_synced_us": whole_plain, "inductor_synced_us": 2.0})
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
        assert (piece.ours_plain_us, piece.inductor_plain_us) == (plain, 20.0)
        assert f"ours {replay} µs / {plain} µs, Inductor 6.0 µs / 20.0 µs" in piece.line()
        if replaced:
            continue
        if alone == "neither":
            assert piece.reason == ("not faster than Inductor's code (CUDA-graph replay); not "
                                    "faster than Inductor's code (plain launches)")
        elif timing == "graph":
            assert piece.reason == "not faster than Inductor's code (CUDA-graph replay)"
        else:
            assert piece.reason == "the whole graph was slower with it replaced"


def _launch_by(fn: Any) -> Any:
    """A stand-in for ``make_inductor_launch``: the piece as ``fn(*args)``."""
    def make(traced: Any, mugraph: Any, knobs: Any, example_inputs: Any) -> Any:
        return lambda *xs: fn(*xs)
    return make


@pytest.mark.parametrize(("dtype", "error", "right"), [
    (torch.float16, 0.0, True), (torch.float16, 1.0, False), (torch.float16, 3e-2, False),
    (torch.bfloat16, 3e-2, True), (torch.bfloat16, 0.2, False)])
def test_inductor_launches_the_replaced_pieces_where_its_outputs_match(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, error: float,
        right: bool) -> None:
    """On a GPU the replaced pieces are traced into Inductor's graph (``launch="inductor"``:
    Inductor launches their kernels itself, no custom-op call per piece), but only where the
    graph so compiled matches Dynamo's graph on the example inputs within the tolerance of its
    outputs' dtype (twice a kernel's: 1e-2 in fp16, 8e-2 in bf16, where a deep model's
    rounding adds up); otherwise each piece stays a call of its custom op. Here a stand-in of
    the traced launch (torch operators; on a GPU it is the generated program's
    ``launch_traced``) off by a relative ``error`` (1.0: all zeros)."""
    from egraph_mirage.fx import backend as be

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(be, "make_inductor_launch", _launch_by(
        lambda x, w: (torch.relu(x @ w) * 2 * (1 - error),)))
    backend = Backend(**options(tmp_path, search=StandIn(), profile=False, rest="inductor"))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(relu_mm, backend=backend, dynamic=False),
                              *inputs(dtype))
    report = backend.reports[0]
    (piece,) = report.pieces
    assert piece.status == REPLACED
    assert report.launch == ("inductor" if right else "op")
    assert len(ops) == (0 if right else 1), "launched by Inductor: no call of the custom op"
    if right:
        torch.testing.assert_close(got, relu_mm(*inputs(dtype)) * (1 - error))
    else:
        torch.testing.assert_close(got, relu_mm(*inputs(dtype)), rtol=2e-3, atol=2e-3)
        assert "outputs or inputs written differ from Dynamo's graph" in report.launch_note
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
    # compiled again (after Dynamo's reset: a new process would do the same), Inductor finds
    # the graph with the kernels in its cache of compiled graphs, keyed on their source
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend = Backend(**options(tmp_path, search=StandIn(winner=rmsnorm_linear), profile=False,
                                rest="inductor"))
    with torch.no_grad():
        again, ops = ops_called(torch.compile(rms_mm, backend=backend, dynamic=False), x, w)
    torch.testing.assert_close(again, got, rtol=0, atol=0)
    assert backend.reports[0].launch == "inductor" and ops == []
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1, dict(counters["inductor"])
    # and AOTAutograd's, keyed on the graph with the pieces' launches traced in
    assert counters["aot_autograd"]["autograd_cache_hit"] >= 1, dict(counters["aot_autograd"])


def ours() -> float:
    """A stand-in for our launch: 10 µs whatever the timer (its name tells the timers apart)."""
    return 10.0


def inductor() -> float:
    """A stand-in for Inductor's code: 12 µs."""
    return 12.0


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

        def graphs(self, fns: Any, sets: Any, rounds: int) -> list[float | None]:
            assert rounds == inductor_timing.GRAPH_ROUNDS
            return [fn() for fn in fns]

        def back_to_back(self, fn: Any, sets: Any, repeats: int = 7) -> float:
            calls.append(fn.__name__)
            return fn() + (500.0 if next(slow) else 0.0)

        def plain(self, fn: Any, sets: Any) -> float:  # after an L2 flush: the flush's cost
            return fn() + 3.0

        def synced(self, fn: Any, sets: Any, calls: int) -> float:  # + the wait's host time
            assert calls == inductor_timing.SYNCED_CALLS
            return fn() + 40.0

    monkeypatch.setattr(timing, "CudaTimer", Timer)
    times = inductor_timing.time_pair(ours, inductor, [], ("graph", "plain"))
    assert calls == ["ours", "inductor"] * inductor_timing.PLAIN_ROUNDS
    assert times == {"ours_us": 10.0, "inductor_us": 12.0, "ours_plain_us": 10.0,
                     "inductor_plain_us": 12.0, "ours_flushed_us": 13.0,
                     "inductor_flushed_us": 15.0, "ours_synced_us": 50.0,
                     "inductor_synced_us": 52.0}


def test_two_graphs_are_replayed_in_alternation_and_the_fastest_round_counts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU drifts between two measurements (the same compiled decode graph measured 4 %
    slower a minute later on an H200): ``CudaTimer.graphs`` captures each program once and
    replays them in alternation, round after round, so that a drift falls on both; each one's
    fastest round counts, and a program that cannot be captured gets None."""
    from egraph_mirage.gpu import timing

    replays: list[str] = []
    drift = iter([1.0] * 6 + [1.5] * 100)  # a slow spell from the second round on

    class Graph:
        def __init__(self, name: str, ms: float) -> None:
            self.name, self.ms = name, ms

        def replay(self) -> float:
            replays.append(self.name)
            return self.ms * next(drift)

    def captured(self: Any, fn: Any, sets: Any) -> tuple[Graph, int]:
        if fn.__name__ == "inductor":
            raise RuntimeError("operation not permitted when stream is capturing")
        return Graph(fn.__name__, fn()), 2  # two calls per replay

    def ours_again() -> float:
        return 0.030

    monkeypatch.setattr(timing.CudaTimer, "_captured", captured)
    monkeypatch.setattr(timing, "_event_ms", lambda work: work())
    timer = timing.CudaTimer(timing.TimingConfig(graph_replays=3))
    got = timer.graphs([ours, inductor, ours_again], [], rounds=3)
    assert replays == (["ours"] * 3 + ["ours_again"] * 3) * 3
    assert got == [pytest.approx(10.0 / 2 * 1e3), None, pytest.approx(0.030 / 2 * 1e3)]


@pytest.mark.parametrize("ours_captures", [True, False])
def test_graphs_that_record_their_own_cuda_graphs_are_timed_by_their_calls(
        monkeypatch: pytest.MonkeyPatch, ours_captures: bool) -> None:
    """Code compiled in a mode with CUDA graphs (``reduce-overhead``, ``max-autotune``, as a
    decode loop is compiled) records and replays its own graphs, which the timer's capture
    cannot hold: where neither side can be captured, a call of each (a replay of its own
    graph) is timed instead; where only one can, the graph time is unknown (None), so that
    no decision compares a replay with a plain launch. A piece's Inductor code is compiled for
    timing without CUDA graphs (``_inductor_compiled``), so both of its sides capture."""
    from egraph_mirage.gpu import timing

    class Timer:
        def __init__(self, config: Any = None) -> None:
            pass

        def graphs(self, fns: Any, sets: Any, rounds: int) -> list[float | None]:
            # None: "operation not permitted when stream is capturing"
            return [None if fn.__name__ == "inductor" or not ours_captures else fn()
                    for fn in fns]

        def back_to_back(self, fn: Any, sets: Any, repeats: int = 7) -> float:
            return fn() + 1.0

        def plain(self, fn: Any, sets: Any) -> float:
            return fn() + 3.0

    monkeypatch.setattr(timing, "CudaTimer", Timer)
    times = inductor_timing.time_pair(ours, inductor, [], ("graph",))
    if ours_captures:
        assert times == {"ours_us": 10.0, "inductor_us": None}
    else:
        assert times == {"ours_us": 11.0, "inductor_us": 13.0}


def test_plain_launches_must_be_faster_back_to_back_after_an_l2_flush_and_each_waited_for(
        ) -> None:
    """Plain launches are timed back to back, each after an L2 flush (as ``bench torch``
    reports them) and each waited for before the next (as ``generate()`` runs a decode step:
    a graph whose call costs more host time loses it there, where back to back its GPU time
    hides it); a replacement slower any one way is not used."""
    faster = {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 10.0,
              "inductor_plain_us": 12.0, "ours_flushed_us": 9.0, "inductor_flushed_us": 11.0,
              "ours_synced_us": 30.0, "inductor_synced_us": 31.0}
    assert slower(faster, "both") == "" and slower(faster, "plain") == ""
    flushed = {**faster, "ours_flushed_us": 13.0}
    assert slower(flushed, "both") == ("not faster than Inductor's code (plain launches, each "
                                       "after an L2 flush)")
    assert slower(flushed, "plain") and not slower(flushed, "graph")
    assert "plain, L2 flushed" in inductor_timing.fmt_times(flushed)
    host_bound = {**faster, "ours_synced_us": 33.0}  # its host time adds to its GPU time
    assert slower(host_bound, "both") == ("not faster than Inductor's code (plain launches, "
                                          "each waited for)")
    assert slower(host_bound, "plain") and not slower(host_bound, "graph")
    assert inductor_timing.fmt_times(host_bound) == (
        "ours 1.0 / 10.0 / 9.0 / 33.0 µs, Inductor 2.0 / 12.0 / 11.0 / 31.0 µs (graph replay / "
        "plain launches / plain, L2 flushed / each waited for)")
    old = {k: v for k, v in faster.items() if "synced" not in k}  # timed by an earlier version
    assert "not timed under plain launches, each waited for" in slower(old, "both")


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
    rest = be.compile_rest
    monkeypatch.setattr(be, "compile_rest", lambda module, xs, how, mode, *a: (
        modes.append(mode), rest(module, xs, "eager", mode, *a))[1])
    backend = Backend(**options(tmp_path, search=StandIn(), rest="inductor", autotune=True))
    with torch.no_grad():
        torch.compile(relu_mm, backend=backend, dynamic=False)(*inputs())
    assert modes and set(modes) == {"max-autotune-no-cudagraphs"}
    assert "rest by inductor (max-autotune-no-cudagraphs)" in backend.reports[0].text()


@pytest.mark.parametrize("default_faster", [True, False])
def test_inductors_code_for_the_graph_is_timed_in_both_modes_and_the_faster_one_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_faster: bool) -> None:
    """With ``autotune`` and ``profile`` on, Inductor could compile the rest in torch.compile's
    mode or in its max-autotune counterpart, whose GEMM templates, each chosen alone, can make
    a graph slower. Inductor's code for Dynamo's graph is compiled and timed in both: the
    given mode is kept only where it is faster, and then the graph with its pieces is compiled
    and judged in it, with or without a piece to replace. The choice is cached: a second
    compile compiles Inductor's code in one mode only."""
    from egraph_mirage.fx import backend as be
    from egraph_mirage.fx import whole as whole_graph
    from egraph_mirage.fx.runtime import PieceCall

    autotuned = "max-autotune-no-cudagraphs"
    built: list[tuple[bool, Any]] = []  # per compilation: (calls a replaced piece, mode)
    rest = be.compile_rest

    def compiled(module: Any, xs: Any, how: str, mode: Any, *a: Any) -> Any:
        fn = rest(module, xs, "eager", mode, *a)

        def run(*args: Any) -> Any:
            return fn(*args)

        run.mode, run.pieces = mode, any(isinstance(m, PieceCall) for m in module.modules())
        built.append((run.pieces, mode))
        return run

    def us(fn: Any) -> float:  # a replaced piece gains 0.5 µs in either mode
        return ({autotuned: 3.0}.get(fn.mode, 2.0 if default_faster else 4.0)
                - 0.5 * fn.pieces)

    def time_graphs(a: Any, b: Any, *args: Any, **kwargs: Any) -> dict[str, float]:
        return {"ours_us": us(a), "inductor_us": us(b), "ours_plain_us": us(a),
                "inductor_plain_us": us(b), "ours_flushed_us": us(a),
                "inductor_flushed_us": us(b),
                "ours_synced_us": us(a), "inductor_synced_us": us(b)}

    monkeypatch.setattr(be, "compile_rest", compiled)
    monkeypatch.setattr(whole_graph, "compile_rest", compiled)
    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", lambda *a, **k: {
        "ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0, "inductor_plain_us": 2.0,
        "ours_flushed_us": 1.0, "inductor_flushed_us": 2.0,
        "ours_synced_us": 1.0, "inductor_synced_us": 2.0})
    monkeypatch.setattr(inductor_timing, "time_graphs", time_graphs)
    kept = None if default_faster else autotuned
    for rerun in (False, True):
        torch._dynamo.reset()
        built.clear()
        backend = Backend(**options(tmp_path, search=StandIn(), profile=True, autotune=True,
                                    rest="inductor"))
        with torch.no_grad():
            got = torch.compile(relu_mm, backend=backend, dynamic=False)(*inputs())
        torch.testing.assert_close(got, relu_mm(*inputs()), rtol=2e-3, atol=2e-3)
        report = backend.reports[0]
        assert report.pieces[0].status == REPLACED
        # Dynamo's graph in both modes, then the graph with the piece in the faster one;
        # again, only the graph that runs
        assert built == ([(True, kept)] if rerun else
                         [(False, autotuned), (False, None), (True, kept)])
        assert f"rest by inductor ({kept or 'default'})" in report.text()
        ours, theirs = (2.0, 3.0) if default_faster else (4.0, 3.0)
        assert (f"  Inductor's modes: default {ours} / {ours} / {ours} / {ours} µs, "
                f"{autotuned} {theirs} / {theirs} / {theirs} / {theirs} µs (graph replay / "
                f"plain launches / plain, L2 flushed / each waited for) | cache "
                f"{'hit' if rerun else 'miss'}") in report.text()
    # a graph with no piece to replace runs in the faster mode too
    torch._dynamo.reset()
    built.clear()
    backend = Backend(**options(tmp_path, search=StandIn(), profile=True, autotune=True,
                                rest="inductor"))
    with torch.no_grad():
        torch.compile(lambda x: torch.cumsum(x, 0) * 2, backend=backend, dynamic=False)(
            inputs()[0])
    assert not backend.reports[0].pieces and built == [(False, autotuned), (False, None)]
    assert f"rest by inductor ({kept or 'default'})" in backend.reports[0].text()


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
                "inductor_plain_us": 2.0, "ours_flushed_us": plain, "inductor_flushed_us": 2.0,
                "ours_synced_us": plain, "inductor_synced_us": 2.0}

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
        "ours_flushed_us": 1.0, "inductor_flushed_us": 2.0,
        "ours_synced_us": 1.0, "inductor_synced_us": 2.0})
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
        __call__ = staticmethod(lambda xs: [xs[0] * 3])

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


def test_a_graphs_position_counter_is_set_back_before_every_timed_call(monkeypatch: Any
                                                                      ) -> None:
    """A decode graph advances a static cache's position counter (an integer input it writes
    in place) and indexes the cache with it: timed thousands of times, it would index past the
    cache. ``time_graphs`` sets the integer inputs the graph writes back before each call of
    either side; the cache (float) is written at the same position every time."""
    cache, counter = torch.zeros(4), torch.tensor(1)
    seen: list[int] = []

    def step(c: Any, n: Any) -> Any:
        seen.append(int(n))
        c[n] = 1.0  # raises once past the cache
        n.add_(1)
        return c

    def calls(ours: Any, inductor: Any, xs: list[Any], which: Any) -> dict[str, float]:
        for _ in range(6):
            ours(*xs)
            inductor(*xs)
        return {}

    monkeypatch.setattr(inductor_timing, "time_pair", calls)
    inductor_timing.time_graphs(step, step, [cache, counter], writes={0, 1})
    assert seen == [1] * 12 and cache.tolist() == [0.0, 1.0, 0.0, 0.0]
    with pytest.raises(IndexError):  # without it: past the cache by the 4th call
        inductor_timing.time_graphs(step, step, [cache, counter], writes={0})


def test_a_pieces_timed_calls_read_their_inputs_from_copies_covering_three_times_the_l2() -> None:
    """A piece timed on one input set called again and again reads it from L2 where it fits
    (a 32 MB projection weight on an H200), faster than the model's call, whose weights no
    call has read since the last step: the timed calls cycle through copies of the inputs that
    cover 3 x L2. A copy is the same view (size, strides, offset) of a copy of the storage;
    inputs viewing one storage share one copy; other arguments are passed as they are."""
    from egraph_mirage.fx.inductor_timing import rotated

    base = torch.arange(24, dtype=torch.float16)  # 48 bytes, two views of it
    w = base[4:].view(4, 5).t()
    x = base[:4].view(1, 4)
    sets = rotated([x, w, 3], l2=48)
    assert len(sets) == 3 and sets[0] == [x, w, 3]  # 3 x 48 bytes: three sets of 48
    for cx, cw, k in sets[1:]:
        assert k == 3 and cw.stride() == w.stride() and cw.storage_offset() == 4
        assert torch.equal(cw, w) and torch.equal(cx, x)
        assert cw.untyped_storage().data_ptr() == cx.untyped_storage().data_ptr()
        assert cw.untyped_storage().data_ptr() != w.untyped_storage().data_ptr()
    assert sets[1][1].untyped_storage().data_ptr() != sets[2][1].untyped_storage().data_ptr()
    assert len(rotated([x, w], l2=8)) == 1  # already larger than 3 x L2: itself alone
    assert rotated([x, w]) == [[x, w]]  # no GPU tensor: no L2 to leave
