"""The graph as a whole never slower than Inductor's code for it (``never_slower``).

A piece faster alone can make the graph slower: its call's host time, its boundary's effect on
what Inductor makes of its neighbours. So, on a CUDA GPU with ``profile`` on, the graph with
its replaced pieces is timed against Inductor's code for Dynamo's graph (both kinds of timing,
``fx.inductor_timing.time_graphs``; a mixed verdict, faster under one kind and slower under
another, is timed again and the fastest of each side counts: ``WholeGraph._timed``; a kind
lost by at most ``decision.TIE`` ties where another is won by ``decision.WIN``:
``decision.slower_whole``). Where it is slower under the ``timing`` option, the kind of piece
(the same winners: a model's identical layers) that gains least alone under the kind of timing
it lost by is kept too (``fx.decision.least_gain``), the graph with the others is built and
timed again, at most ``WHOLE_TRIES`` times more; where none is faster, every piece is kept
and Inductor's code is returned. The times are cached per set of replaced pieces
(``fx.cache.whole_key``: the graph, its inputs' layout and those pieces' winners), and the
decisions are made from them at each compile, as for a piece: a set of pieces whose graph the
cache holds as slower is not built again (a second compilation of a model compiles Inductor's
code for its graph once, not the graph with pieces first).

Where Inductor may compile the rest in two modes (``BackendOptions.inductor_modes``: its
max-autotune counterpart and ``torch.compile``'s own), Inductor's code for Dynamo's graph is
first compiled and timed in both, with or without replaced pieces: the other mode is kept only
where its code is faster under every kind of timing the ``timing`` option asks for, and then
the rest and the code the graph is judged against are compiled in it. The choice is cached per
graph (``fx.cache.whole_key`` with the modes), so a second compilation compiles one mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import inductor_timing as timing
from . import report as rep
from .cache import SearchCache, whole_key
from .decision import TIE, least_gain, mixed, slower, slower_whole, ties
from .mutation import written
from .options import BackendOptions
from .rest import compile_rest

#: graphs with fewer replaced pieces timed after the graph with all of them was slower
WHOLE_TRIES = 3
LOG = logging.getLogger("egraph_mirage.fx")


@dataclass
class WholeGraph:
    """Dynamo's graph ``gm`` on its example inputs, compiled in ``mode``, with its report, the
    backend's options and cache, ``build``: the graph with the pieces it names replaced,
    compiled in the mode given, and ``launched``: who would launch that graph's kernels
    (``report.launch``, part of the times' cache key) before it is built. ``others``: modes
    Inductor may compile the rest in instead (module docstring)."""

    gm: Any
    example_inputs: Sequence[Any]
    report: rep.CompileReport
    mode: str | None
    options: BackendOptions
    cache: SearchCache | None
    build: Callable[[Sequence[str], str | None], Callable[..., Any]]
    launched: Callable[[Sequence[str]], str]
    others: tuple[str | None, ...] = ()

    def never_slower(self, names: list[str]) -> Callable[..., Any]:
        """The graph with the pieces ``names`` replaced, or with fewer of them, or Inductor's
        code for ``gm``: the first not slower than Inductor's code (module docstring), each
        built only where its times are not cached or say it is not slower, in the mode whose
        code for ``gm`` is faster (``_faster_mode``). The report's pieces kept so say why."""
        report = self.report
        inductor = self._faster_mode()
        if not names:
            return inductor if inductor is not None else self._inductor(self.mode)
        compiled = None
        tried: list[str] = []
        while True:
            expected = report.launch = self.launched(names)
            record = self._cached(names)
            if record is None or not slower_whole(record, self.options.timing):
                compiled = self.build(names, self.mode)  # sets report.launch: its key may differ
                if record is None or report.launch != expected:
                    record, inductor = self._measured(compiled, names, inductor)
            if record is None:
                why = "could not be timed"
            else:
                report.whole_times = timing.fmt_times(record)
                why = slower_whole(record, self.options.timing)
            if not why:
                tied = ties(record, self.options.timing)
                if tied:
                    tried.append(f"with {len(names)} piece(s) replaced: a tie under "
                                 f"{', '.join(tied)} (at most {100 * TIE:.0f} %), faster "
                                 f"under the others: {report.whole_times}")
                break
            tried.append(f"with {len(names)} piece(s) replaced: {why}"
                         + (f": {report.whole_times}" if record is not None else ""))
            drop = record and least_gain(report.pieces, names, record, self.options.timing)
            if not drop or len(drop) == len(names) or len(tried) > WHOLE_TRIES:
                names = []
                break
            names = [n for n in names if n not in drop]
            compiled = None
        for p in report.pieces:
            if p.status == rep.REPLACED and p.name.split(".")[0] not in names:
                p.status, p.reason = rep.KEPT, "the whole graph was slower with it replaced"
        if tried:
            kept = (f"{', '.join(names)} replaced, the others kept" if names
                    else "every piece kept")
            report.note = f"the graph {'; '.join(tried)}; {kept}"
        if names:
            return compiled if compiled is not None else self.build(names, self.mode)
        return inductor if inductor is not None else self._inductor(self.mode)

    def _inductor(self, mode: str | None) -> Callable[..., Any]:
        """Inductor's code for Dynamo's graph, as ``torch.compile`` would compile it in
        ``mode``."""
        with self.report.stage("Inductor"):
            return compile_rest(self.gm, self.example_inputs, self.options.rest, mode)

    def _faster_mode(self) -> Callable[..., Any] | None:
        """Sets ``mode`` to the mode, of ``mode`` and ``others``, whose code for Dynamo's graph
        is faster (module docstring), the times cached; returns that code where it was compiled
        to be timed (None: the choice was cached). The report's ``rest`` names the mode, and
        ``mode_times`` gives the times."""
        if not self.others:
            return None
        report, (other,) = self.report, self.others[:1]
        key = whole_key(self.gm, self.example_inputs, [], "", self.options.search_settings(),
                        timing.key_settings(self.mode), modes=[self.mode, other])
        record = self.cache.get(key) if self.cache is not None else None
        cached = "off" if self.cache is None else "miss" if record is None else "hit"
        codes: dict[Any, Callable[..., Any]] = {}
        if record is None:
            codes = {m: self._inductor(m) for m in (self.mode, other)}
            try:
                with report.stage("whole-graph timing"):
                    # "ours": the other mode's code, which must be faster to be kept
                    record = self._timed(codes[other], codes[self.mode])
            except Exception as e:  # not measurable: the first mode, as without a choice
                LOG.warning("egraph-mirage: Inductor's modes could not be timed: %s: %s",
                            type(e).__name__, e)
                return codes[self.mode]
            if self.cache is not None:
                self.cache.put(key, record)
        first = self.mode
        if not slower(record, self.options.timing):
            self.mode = other
        report.rest = f"{self.options.rest} ({self.mode or 'default'})"
        names = (other or "default", first or "default")
        report.mode_times = f"{timing.fmt_times(record, names)} | cache {cached}"
        return codes.get(self.mode)

    def _timed(self, ours: Callable[..., Any], theirs: Callable[..., Any]
               ) -> dict[str, float | None]:
        """``ours`` against ``theirs`` on the example inputs (``time_graphs``); where the
        verdict is mixed, faster under one kind of timing the ``timing`` option asks for and
        slower under another (``decision.mixed``), timed once more and the fastest of each
        side's two timings counting (``inductor_timing.fastest``). Two timings of the same
        compiled code within one compilation differ by more than a piece gains: plain launches
        of Inductor's code for a bf16 decoder layer measured 157.7, 261.7 and 289.1 µs back
        to back (H200), its replayed time 143.7–144.0."""
        writes = written(self.gm)
        record = timing.time_graphs(ours, theirs, self.example_inputs, writes)
        if mixed(record, self.options.timing):
            again = timing.time_graphs(ours, theirs, self.example_inputs, writes)
            record = timing.fastest(record, again)
        return record

    def _key(self, names: list[str]) -> Any:
        """The cache key of the times of the graph with the pieces ``names`` replaced, their
        kernels launched as ``report.launch`` says."""
        winners = [[p.name, p.winner] for p in self.report.pieces
                   if p.status == rep.REPLACED and p.name.split(".")[0] in names]
        return whole_key(self.gm, self.example_inputs, winners, self.report.launch,
                         self.options.search_settings(), timing.key_settings(self.mode))

    def _cached(self, names: list[str]) -> dict[str, Any] | None:
        """The cached times of the graph with the pieces ``names`` replaced (None: none), the
        report's ``whole_cache`` saying whether they were found."""
        report = self.report
        record = self.cache.get(self._key(names)) if self.cache is not None else None
        if not report.whole_cache or report.whole_cache == "hit":
            report.whole_cache = ("off" if self.cache is None
                                  else "miss" if record is None else "hit")
        return record

    def _measured(self, compiled: Callable[..., Any], names: list[str],
                  inductor: Callable[..., Any] | None
                  ) -> tuple[dict[str, Any] | None, Callable[..., Any] | None]:
        """The times of ``compiled`` (the pieces ``names`` replaced) and Inductor's code for
        ``gm``, measured and cached (None: not measurable), and Inductor's code where it was
        compiled (``inductor``, or compiled here for the measurement)."""
        report = self.report
        if self.cache is not None:
            report.whole_cache = "miss"
        if inductor is None:
            inductor = self._inductor(self.mode)
        try:
            with report.stage("whole-graph timing"):
                record = self._timed(compiled, inductor)
        except Exception as e:  # not measurable: Inductor's code, which is never slower
            LOG.warning("egraph-mirage: the whole graph could not be timed: %s: %s",
                        type(e).__name__, e)
            return None, inductor
        if self.cache is not None:
            self.cache.put(self._key(names), record)
        return record, inductor


__all__ = ["WHOLE_TRIES", "WholeGraph"]
