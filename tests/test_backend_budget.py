"""The backend's ``budget`` bounds a whole compilation (``fx.budget``), ``refine`` included.

A stand-in search records the ``time_budget`` it is handed and spends it (sleeps, or moves a
fake clock, ``Clock``, which the ``clock`` fixture puts in ``fx.budget``'s place: the budget's
arithmetic whatever the host's load), finding nothing, so that every piece is refined into
parts that are searched too. Nothing here waits on the clock to find something: sleeps only
spend budgets, and the assertions bound time.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import egraph_mirage as em
from egraph_mirage.fx.backend import Backend
from egraph_mirage.fx.budget import SPENT
from egraph_mirage.fx.report import KEPT
from egraph_mirage.search.results import SearchResults, SearchStats

#: seconds a search may end past the compilation's deadline: a stand-in's sleep overshooting
#: its budget and its own bookkeeping, on a busy host
MARGIN_S = 0.5


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def three_blocks(x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
    """Three pieces (the cumsums are left out of every piece), each an RMSNorm before a matmul,
    which ``refine`` cuts into two parts at the matmul's input."""
    for w in ws:
        x = torch.relu(torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6) @ w)
        x = torch.cumsum(x, dim=-1)
    return x


def block_inputs(widths: tuple[int, ...] = (32, 32, 32, 32)) -> tuple[torch.Tensor, ...]:
    """``x`` and one weight per block; blocks of other widths are other programs."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, widths[0], generator=gen),
            *(torch.randn(a, b, generator=gen) / 4 for a, b in itertools.pairwise(widths)))


class Clock:
    """A clock for ``fx.budget`` that moves only when a stand-in search spends time on it: the
    budget's arithmetic checked whatever the host's speed (the partition and tracing take no
    time on it)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """``fx.budget``'s clock replaced by a ``Clock`` for the test."""
    fake = Clock()
    monkeypatch.setattr(sys.modules["egraph_mirage.fx.budget"], "time", fake)
    return fake


class Spending:
    """A search that finds nothing and spends its ``time_budget`` (sleeps ``min(time_budget,
    cap)``, or ``first`` seconds on its first call, however small its budget: a search that
    overruns), recording each budget and the seconds each call took, and when it ended. With
    a ``clock``, it moves that clock instead of sleeping, and its times are the clock's."""

    def __init__(self, cap: float = 10.0, first: float | None = None,
                 clock: Clock | None = None) -> None:
        self.cap, self.first, self.clock = cap, first, clock
        self.budgets: list[float | None] = []
        self.seconds: list[float] = []
        self.started: list[float] = []  # each call's ``time.perf_counter()`` (or clock time)
        self.ended = 0.0

    def _now(self) -> float:
        return time.perf_counter() if self.clock is None else self.clock.now

    def _spend(self, seconds: float) -> None:
        if self.clock is None:
            time.sleep(seconds)
        else:
            self.clock.now += seconds

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        t0 = self._now()
        self.started.append(t0)
        budget = options["time_budget"]
        self.budgets.append(budget)
        if self.first is not None and len(self.budgets) == 1:
            self._spend(self.first)
        elif budget is not None:
            self._spend(min(budget, self.cap))
        self.ended = self._now()
        self.seconds.append(self.ended - t0)
        return SearchResults([], SearchStats())  # nothing found


def three_blocks_summed(x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
    """``three_blocks`` and a cumsum more (left out of every piece): another graph, the same
    three pieces."""
    return torch.cumsum(three_blocks(x, *ws), dim=-1)


def compile_timed(backend: Backend, xs: tuple[torch.Tensor, ...], fn: Any = three_blocks,
                  clock: Clock | None = None) -> float:
    """Compile and run ``fn`` through ``backend``; returns when the backend was called
    (``time.perf_counter()``, or ``clock``'s time): its deadline counts from then, not from
    Dynamo's tracing."""
    started: list[float] = []

    def timed(gm: Any, example_inputs: Any) -> Any:
        started.append(time.perf_counter() if clock is None else clock.now)
        return backend(gm, example_inputs)

    with torch.no_grad():
        got = torch.compile(fn, backend=timed, dynamic=False)(*xs)
    torch.testing.assert_close(got, fn(*xs))
    (t0,) = started
    return t0


def test_a_compilation_of_three_pieces_searches_within_its_budget_refine_included(
        clock: Clock) -> None:
    """budget=B for three pieces whose searches find nothing and spend what they are given:
    the budgets handed out add up to at most B, and every search, the parts' included, ends
    within B (plus ``MARGIN_S``) of the compilation's start. A piece reached with no time left
    is kept unsearched, saying so. The budget's clock moves only by what the searches spend
    (``Clock``), so the partition's time on a loaded host does not take the first share."""
    budget = 2.0
    search = Spending(clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1)
    t0 = compile_timed(backend, block_inputs(), clock=clock)
    report = backend.reports[0]
    pieces = [p for p in report.pieces if p.part is None]
    parts = [p for p in report.pieces if p.part is not None]
    assert len(pieces) == 3 and all(p.status == KEPT for p in report.pieces)
    assert "searched in 2 parts (0.0–0.1)" in pieces[0].reason and len(parts) >= 2
    assert all(b is not None and b > 0 for b in search.budgets)
    # the deadline moved by the rooms' measuring (real seconds the searches are not charged)
    excluded = report.stages.get("rooms", 0.0)
    assert sum(search.budgets) <= budget + excluded  # type: ignore[arg-type]
    assert sum(search.seconds) <= budget + excluded
    assert search.ended - t0 <= budget + excluded
    searched = [p for p in report.pieces if p.search_seconds is not None]
    assert len(searched) == len(search.budgets) == backend.searches == report.searches
    assert [p.search_share for p in searched] == search.budgets  # the report says each share
    assert f"of a {searched[0].search_share:.1f} s share" in report.text()
    assert sum(p.search_seconds for p in searched) <= budget + MARGIN_S  # type: ignore[misc]
    for p in report.pieces:
        if p.search_seconds is None:
            assert p.reason == SPENT


def test_the_seconds_held_for_the_parts_outlast_a_search_that_overran(
        clock: Clock) -> None:
    """With ``refine``, one share of the budget is held back in seconds for the parts of the
    pieces found nothing for (``CompileBudget.held``): the first piece's search overruns the
    whole budget (a search may end later than its share), so the two pieces after it are not
    searched, but the parts still get the held seconds (``release`` moves the deadline), where
    a reserve counted as a weight alone was taken by the overrun and no part was searched. On
    a fake clock (``Clock``): only the searches spend time."""
    budget = 2.0
    search = Spending(first=budget + 1.0, clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1)
    compile_timed(backend, block_inputs(), clock=clock)
    report = backend.reports[0]
    pieces = [p for p in report.pieces if p.part is None]
    parts = [p for p in report.pieces if p.part is not None]
    assert [p.search_seconds is not None for p in pieces] == [True, False, False]
    assert [p.reason for p in pieces[1:]] == [SPENT, SPENT]
    # three pieces of one weight and the reserve of that weight: a quarter of the budget
    held = budget / 4
    # its share: a third of what the parts' reserve leaves
    assert search.budgets[0] == pytest.approx(budget / 4, abs=0.05)
    searched = [p for p in parts if p.search_seconds is not None]
    assert searched and len(search.budgets) == 1 + len(searched)
    # the first piece's parts share the held seconds, each spending its share
    assert all(b is not None and b > 0 for b in search.budgets[1:])
    assert sum(search.budgets[1:]) == pytest.approx(held, abs=0.05)  # type: ignore[arg-type]


def test_the_held_seconds_are_shared_by_every_refined_piece_s_parts(
        clock: Clock) -> None:
    """Three pieces found nothing for, each spending its whole share: the first refined
    piece's parts share the held seconds with the pieces refined after it (each weighs in
    until its parts take its place), so every piece's parts are searched and the first's take
    about a third of the held seconds, where they once took them all and left the others'
    parts unsearched (a compilation's first layer found nothing for its norm with the q, k, v
    projections, whose parts the last layer's norm with the down projection then left no
    time). On a fake clock (``Clock``)."""
    budget = 4.0
    search = Spending(clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1)
    compile_timed(backend, block_inputs(), clock=clock)
    report = backend.reports[0]
    pieces = [p for p in report.pieces if p.part is None]
    parts = [p for p in report.pieces if p.part is not None]
    assert all(p.search_seconds is not None for p in pieces)
    by_piece = {p.index: [q for q in parts if q.index == p.index] for p in pieces}
    assert all(by_piece.values())
    assert all(q.search_seconds is not None for q in parts), [q.reason for q in parts]
    held = budget / 4  # three pieces of one weight and the parts' reserve of that weight
    first = sum(q.search_share or 0 for q in by_piece[pieces[0].index])
    # about a third (the parts weigh the bytes they move, a little more than their piece)
    assert held / 4 < first < held / 2
    assert sum(q.search_share or 0 for q in parts) == pytest.approx(held, abs=0.05)


def test_what_a_piece_found_nothing_for_left_of_its_share_goes_to_its_parts(
        clock: Clock) -> None:
    """The first piece's search ends with nothing long before its share is spent (a program
    of several outputs stops at its first output with no result); the other two spend theirs.
    The rest of the first piece's share is held for the parts (``CompileBudget.hold_rest``): the
    pieces after it share only what they would have had, and the parts get the reserve and
    that rest, where the pieces after it once took the rest. On a fake clock (``Clock``)."""
    budget, spent_first = 4.0, 0.1
    search = Spending(first=spent_first, clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1)
    compile_timed(backend, block_inputs(), clock=clock)
    report = backend.reports[0]
    pieces = [p for p in report.pieces if p.part is None]
    parts = [p for p in report.pieces if p.part is not None]
    # three pieces of one weight and the reserve: a quarter each
    assert [p.search_share for p in pieces] == pytest.approx([budget / 4] * 3, abs=0.05)
    assert all(p.search_seconds is not None for p in parts)
    rest = budget / 4 - spent_first
    assert sum(p.search_share or 0 for p in parts) == pytest.approx(budget / 4 + rest,
                                                                     abs=0.05)


def test_every_piece_is_searched_whole_before_any_is_refined(
        clock: Clock) -> None:
    """With ``refine``, the three pieces are searched whole first, each with a share that keeps
    one share back (the first: the budget over 4), and only then the parts of those the search
    found nothing for: a whole block fused is worth more than its parts, so no piece's parts
    take the time of a later piece searched whole. (The searches find nothing at once; on a
    fake clock, ``Clock``, whatever the host's load.)"""
    budget = 30.0
    search = Spending(cap=0.0, clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1)
    compile_timed(backend, block_inputs(), clock=clock)
    report = backend.reports[0]
    searched = [p for p in report.pieces if p.search_seconds is not None]
    assert [p.part is None for p in searched][:3] == [True, True, True]
    assert all(p.part is not None for p in searched[3:]) and len(searched) > 3
    # the first search's share: the budget over 3 pieces and the parts' reserve
    assert search.budgets[0] == pytest.approx(budget / 4, abs=1e-3)


def test_a_piece_reached_after_the_deadline_is_not_searched_nor_cached(
        tmp_path: Path, clock: Clock) -> None:
    """A first search that overruns the whole budget leaves none for the other pieces: they
    are kept, unsearched, and not cached. The same graph compiled again with the same settings
    comes from the cache: the graph's record says what its first compilation left unsearched,
    and nothing is searched. Another graph with the same pieces searches them: there the piece
    found in the cache costs nothing and the others share the budget by weight. On a fake
    clock (``Clock``): only the searches spend time, whatever the host's load."""
    budget = 2.0
    xs = block_inputs((32, 24, 16, 8))  # three pieces, three programs
    first = Spending(first=budget + 0.2, clock=clock)
    backend = Backend(search=first, budget=budget, rest="eager", cache_dir=str(tmp_path),
                      workers=1, refine=False)
    compile_timed(backend, xs, clock=clock)
    report = backend.reports[0]
    assert len(first.budgets) == 1 and backend.searches == report.searches == 1
    assert [p.reason for p in report.pieces[1:]] == [SPENT, SPENT]
    assert [p.search_seconds for p in report.pieces[1:]] == [None, None]
    assert f"kept: {SPENT}" in report.text()
    torch._dynamo.reset()
    same = Spending(cap=0.0, clock=clock)
    backend = Backend(search=same, budget=budget, rest="eager", cache_dir=str(tmp_path),
                      workers=1, refine=False)
    compile_timed(backend, xs, clock=clock)
    assert same.budgets == [] and backend.reports[0].searches == 0
    assert [p.reason for p in backend.reports[0].pieces[1:]] == [
        f"{SPENT} (in this graph's first compilation with these settings)"] * 2
    torch._dynamo.reset()
    again = Spending(cap=0.0, clock=clock)  # finds nothing at once
    backend = Backend(search=again, budget=budget, rest="eager", cache_dir=str(tmp_path),
                      workers=1, refine=False)
    compile_timed(backend, xs, three_blocks_summed, clock=clock)
    assert [p.cache for p in backend.reports[0].pieces] == ["hit", "miss", "miss"]
    (second, third) = again.budgets
    assert second is not None and third is not None
    # the hit took no share: the two searched share what is left by weight (``fx.budget``: the
    # bytes each moves, plus a quarter of the mean), the larger piece two thirds of it, where a
    # share taken by the hit would leave it a third; the last gets what the first left (it
    # ended at once), so the first's share is more than half of the last's, whatever the time
    # spent before them
    assert third / 2 < second < third <= budget


def test_without_a_budget_each_search_is_unbounded() -> None:
    search = Spending(cap=0.0)
    backend = Backend(search=search, budget=None, rest="eager", cache=False, workers=1,
                      refine=False)
    compile_timed(backend, block_inputs())
    assert search.budgets == [None, None, None]


def test_real_searches_stay_within_the_budget_and_the_stated_margin() -> None:
    """The same with ``em.superoptimize``: three pieces, each e-graph saturated and searched
    inside its share (``search.prepare`` caps the saturation at what is left), ``refine``
    included where nothing is found. Every search ends within the budget plus the stated
    margin (``fx.budget``: a task in one long step may hold a search ``search.run.OVERRUN_S``
    longer); whatever is found is checked against eager by the backend."""
    from egraph_mirage.pipeline import superoptimize
    from egraph_mirage.search.run import OVERRUN_S

    budget = 6.0
    handed: list[float | None] = []

    def search(g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        handed.append(options["time_budget"])
        return superoptimize(g, config, **options)

    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1)
    compile_timed(backend, block_inputs())  # the compiled function matches eager
    report = backend.reports[0]
    searched = [p for p in report.pieces if p.search_seconds is not None]
    assert len(searched) == len(handed) >= 1 and sum(handed) <= budget  # type: ignore[arg-type]
    assert sum(p.search_seconds for p in searched) <= budget + OVERRUN_S  # type: ignore[misc]


def test_identical_pieces_share_one_search_and_the_budget_counts_them_once(
        tmp_path: Path) -> None:
    """Three blocks of one width are three pieces of one program (a model's identical layers):
    with the cache on, the first is searched with the whole budget to itself (the other two
    will be cache hits), and the other two hit the cache. (The budget is large, so that the
    time tracing and partitioning take before the first search, on a busy host, does not
    matter: the search finds nothing at once, so nothing waits on it.)"""
    budget = 20.0
    search = Spending(cap=0.0)  # finds nothing at once
    backend = Backend(search=search, budget=budget, rest="eager", cache_dir=str(tmp_path),
                      workers=1, refine=False)
    compile_timed(backend, block_inputs())  # widths 32, 32, 32, 32: one program three times
    assert [p.cache for p in backend.reports[0].pieces] == ["miss", "hit", "hit"]
    (first,) = search.budgets
    assert first is not None and budget / 2 < first <= budget


def test_a_program_that_comes_in_several_places_weighs_its_gain_in_each(
        tmp_path: Path) -> None:
    """Three identical blocks and a narrower one: one program three times (a model's identical
    layers; searched once, the others cache hits) and another once. A faster form of the first
    gains in three places, so its search weighs three times its bytes: about 78 % of the
    budget (weights 3 x 1,152 and 608 elements, each plus a quarter of their mean), where
    counted once it would get about 62 %."""
    search = Spending(cap=0.0)  # finds nothing at once
    budget = 40.0
    backend = Backend(search=search, budget=budget, rest="eager", cache_dir=str(tmp_path),
                      workers=1, refine=False)
    compile_timed(backend, block_inputs((32, 32, 32, 32, 16)))
    assert [p.cache for p in backend.reports[0].pieces] == ["miss", "hit", "hit", "miss"]
    first, _ = search.budgets
    assert first is not None and first > 0.7 * budget


def test_the_pieces_that_move_the_most_bytes_are_searched_first() -> None:
    """Three pieces of growing widths (8 -> 16 -> 32 -> 64): the last, which moves the most
    bytes (its weight is the largest), is searched first, then the middle one, then the
    first, so that a budget that runs out leaves the smallest pieces unsearched."""
    seen: list[tuple[int, ...]] = []

    def search(g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        seen.append(max((t.dims for t in g.inputs), key=lambda d: math.prod(d)))
        return SearchResults([], SearchStats())

    backend = Backend(search=search, budget=20.0, rest="eager", cache=False, workers=1,
                      refine=False)
    compile_timed(backend, block_inputs((8, 16, 32, 64)))
    assert [math.prod(d) for d in seen] == [32 * 64, 16 * 32, 8 * 16]
    assert [p.index for p in backend.reports[0].pieces] == [2, 1, 0]


def test_a_search_gets_a_share_in_proportion_to_the_bytes_its_piece_moves() -> None:
    """Pieces of different sizes: each search's share of the seconds left is its piece's
    weight (bytes moved plus a quarter of the mean) over the weights not yet reached, so the
    largest piece, searched first, gets the largest share, and a small one less than an equal
    share would give it."""
    from egraph_mirage.fx.budget import FLOOR_SHARE, CompileBudget

    b = CompileBudget.start(100.0)
    b.pieces([3000, 1000, 2000], reserve=True)
    assert b.floor == FLOOR_SHARE * 2000
    # weights 3500, 1500 and 2500, and the parts' reserve 2500, held back in seconds
    assert 100 * 2500 / 10000 - 1 < b.held <= 100 * 2500 / 10000
    first = b.share(b.weigh(3000))
    assert first is not None and 75 * 3500 / 7500 - 1 < first <= 75 * 3500 / 7500
    b.reached(b.weigh(3000))
    small = b.share(b.weigh(1000))
    assert small is not None and small < (b.left() or 0) / 2  # less than an equal share
    # in a compilation of three pieces the largest, searched first, gets more than an equal
    # share would give it (about 53 % of what is left; it is searched at once, so that only
    # the tracing before it, not seconds of a busy host between searches, is spent)
    search = Spending(cap=0.0)
    budget = 20.0
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1,
                      refine=False)
    compile_timed(backend, block_inputs((32, 24, 16, 8)))
    assert len(search.budgets) == 3 and search.budgets[0] is not None
    assert search.budgets[0] > budget / 3


def test_on_a_gpu_a_search_is_weighed_by_its_room_above_the_floor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the backend times on a GPU (stand-in timings here), Inductor's code for each piece
    is timed before any search, against its copy floor (its bytes over the copy bandwidth):
    the piece Inductor already runs at its floor is not searched at all, though it moves the
    most bytes, and of the other two the one with more room above its floor gets the larger
    share, though it moves fewer bytes."""
    import egraph_mirage.fx.backend as be
    from egraph_mirage.fx import inductor_timing
    from egraph_mirage.fx.budget import AT_FLOOR_REASON
    from egraph_mirage.gpu.floor import io_bytes

    # Inductor's µs over its floor's, by the piece's weight shape: 32 -> 24 at the floor
    over = {(32, 24): 1.0, (24, 16): 1.5, (16, 8): 5.0}
    timed: list[tuple[int, int]] = []

    def time_inductor(piece: Any, mode: Any = None) -> float:
        (w,) = [tuple(x.shape) for x in piece.example_inputs if tuple(x.shape) in over]
        timed.append(w)
        return io_bytes(Backend._trace(piece).graph) * over[w]  # 1 B/µs: a floor of 1 µs a byte

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(Backend, "_bandwidth", lambda self: 1e6)
    monkeypatch.setattr(inductor_timing, "time_inductor", time_inductor)
    search = Spending(cap=0.0)
    budget = 20.0
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1,
                      refine=False, profile=True)
    compile_timed(backend, block_inputs((32, 24, 16, 8)))
    assert sorted(timed) == sorted(over)  # each piece timed once, before the searches
    report = backend.reports[0]
    at_floor = [p for p in report.pieces if p.reason.startswith(AT_FLOOR_REASON)]
    assert [p.index for p in at_floor] == [0] and at_floor[0].search_seconds is None
    assert at_floor[0].status == KEPT and "floor" in report.text()
    assert len(search.budgets) == 2  # 24 -> 16 (more bytes) first, then 16 -> 8
    first, second = search.budgets
    assert first is not None and second is not None
    # rooms 0.5 and 4 times the floors (928 and 2,816 µs), plus a quarter of their mean: the
    # first gets 1,240 / 4,368 of what is left, not half
    assert first < 0.3 * budget and second > 2 * first


def test_on_a_gpu_each_part_of_a_refined_piece_is_timed_and_one_at_its_floor_is_not_searched(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A piece the search finds nothing for is cut into parts (an RMSNorm, then the matmul
    after it); on a GPU each part's Inductor code is timed too before the parts are searched:
    the matmul parts, which Inductor runs at their floor (stand-in timings), are kept unsearched,
    so the parts' time goes to the norms."""
    import egraph_mirage.fx.backend as be
    from egraph_mirage.fx import inductor_timing
    from egraph_mirage.fx.budget import AT_FLOOR_REASON
    from egraph_mirage.gpu.floor import io_bytes

    def time_inductor(piece: Any, mode: Any = None) -> float:
        g = Backend._trace(piece).graph
        ops = {t.op for t in g.operators}
        at_floor = ops == {"matmul", "relu"} or ops == {"matmul"}
        return io_bytes(g) * (1.0 if at_floor else 3.0)  # 1 B/µs: a floor of 1 µs a byte

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(Backend, "_bandwidth", lambda self: 1e6)
    monkeypatch.setattr(inductor_timing, "time_inductor", time_inductor)
    search = Spending(cap=0.0)
    backend = Backend(search=search, budget=20.0, rest="eager", cache=False, workers=1,
                      profile=True)
    compile_timed(backend, block_inputs((32, 24, 16, 8)))
    parts = [p for p in backend.reports[0].pieces if p.part is not None]
    assert len(parts) == 6  # two parts of each of the three pieces
    at_floor = [p for p in parts if p.reason.startswith(AT_FLOOR_REASON)]
    searched = [p for p in parts if p.search_seconds is not None]
    assert len(at_floor) == 3 and all("matmul" in p.operators for p in at_floor)
    assert len(searched) == 3 and not any("matmul" in p.operators for p in searched)
    assert len(search.budgets) == 3 + 3  # the pieces whole, then the norm parts


def test_timing_inductors_code_before_the_searches_is_not_charged_to_them(
        monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """On a GPU each distinct piece's Inductor code is compiled and timed before any search
    (its room, ``Backend._gains``), which for a model of many distinct pieces takes longer than
    a small budget. That time is not the searches': here timing the three rooms (a stand-in)
    takes longer than the whole budget, and the searches still get all of it. On a fake clock
    (``Clock``): only the rooms and the searches spend time, whatever the host's load."""
    from egraph_mirage.fx import backend as be
    from egraph_mirage.fx import inductor_timing

    budget, room_s = 3.0, 1.2

    def time_inductor(piece: Any, mode: Any) -> float:
        clock.now += room_s  # an Inductor compilation and its timing
        return 100.0  # µs: far above the floor, worth searching

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(be.Backend, "_bandwidth", lambda self: 1e12)
    monkeypatch.setattr(inductor_timing, "time_inductor", time_inductor)
    search = Spending(clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1,
                      refine=False, profile=True)
    t0 = compile_timed(backend, block_inputs((32, 24, 16, 8)), clock=clock)
    assert 3 * room_s > budget
    assert len(search.budgets) == 3 and all(b is not None and b > 0 for b in search.budgets)
    assert sum(search.budgets) == pytest.approx(budget)  # type: ignore[arg-type]
    assert search.ended - t0 == pytest.approx(3 * room_s + budget)


def test_timing_the_parts_rooms_is_not_charged_to_their_searches(
        monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """On a GPU a refined piece's parts have Inductor's code timed too before they are
    searched (their rooms); that takes seconds per part (an Inductor compilation each), which
    are not the parts' share: here each room's timing (a stand-in on the fake clock,
    ``Clock``) takes as long as the whole budget, and the parts still share the seconds held
    for them, where they once found the budget spent."""
    import egraph_mirage.fx.backend as be
    from egraph_mirage.fx import inductor_timing

    budget = 2.0

    def time_inductor(piece: Any, mode: Any = None) -> float:
        clock.now += budget  # an Inductor compilation and its timing
        return 100.0  # µs: far above the floor, worth searching

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(Backend, "_bandwidth", lambda self: 1e12)
    monkeypatch.setattr(inductor_timing, "time_inductor", time_inductor)
    search = Spending(clock=clock)
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1,
                      profile=True)
    compile_timed(backend, block_inputs((32, 24, 16, 8)), clock=clock)
    report = backend.reports[0]
    parts = [p for p in report.pieces if p.part is not None]
    assert len(parts) == 6 and all(p.search_seconds is not None for p in parts)
    held = budget / 4  # three pieces and the parts' reserve, of equal rooms
    assert sum(p.search_share or 0 for p in parts) == pytest.approx(held, rel=0.05)


def test_timing_the_winners_against_inductors_code_is_not_charged_to_the_searches(
        monkeypatch: pytest.MonkeyPatch, clock: Clock) -> None:
    """On a GPU each winner is compiled as Inductor would launch it and timed against Inductor's
    code for its piece: seconds per winner, which would leave the pieces searched after it (and
    the refined pieces' parts) less than their shares. That time is not the searches': here
    timing each of the three winners (a stand-in) takes longer than the whole budget, and every
    search still gets its share of it. On a fake clock (``Clock``): only the timings spend
    time, whatever the host's load."""
    from backend_stand_ins import StandIn

    from egraph_mirage.fx import backend as be
    from egraph_mirage.fx import inductor_timing

    budget, timing_s = 4.0, 1.6
    budgets: list[float | None] = []
    winners = StandIn()

    def search(g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        budgets.append(options["time_budget"])
        return winners(g, config, **options)

    def time_against_inductor(*a: Any, **k: Any) -> dict[str, float]:
        clock.now += timing_s  # a compilation of the winner and of Inductor's code, and timing
        return {"ours_us": 1.0, "inductor_us": 2.0, "ours_plain_us": 1.0,
                "inductor_plain_us": 2.0}

    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    monkeypatch.setattr(be.Backend, "_bandwidth", lambda self: 1e12)
    monkeypatch.setattr(inductor_timing, "time_inductor", lambda piece, mode: 100.0)
    monkeypatch.setattr(inductor_timing, "time_against_inductor", time_against_inductor)
    monkeypatch.setattr(inductor_timing, "time_graphs", lambda *a, **k: {})  # not measurable
    backend = Backend(search=search, budget=budget, rest="eager", cache=False, workers=1,
                      refine=False, profile=True)
    compile_timed(backend, block_inputs((32, 24, 16, 8)), clock=clock)
    assert len(budgets) == 3 and winners.calls == 3
    # the searches spend nothing: the last one, after two timings (3.2 s of a 4 s budget), gets
    # the whole budget (0.8 s if the timings counted)
    assert budgets == pytest.approx([budget / 3, budget / 2, budget], abs=1e-3), budgets
