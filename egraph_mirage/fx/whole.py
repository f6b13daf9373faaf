"""The graph as a whole never slower than Inductor's code for it (``never_slower``).

A piece faster alone can make the graph slower: its call's host time, its boundary's effect on
what Inductor makes of its neighbours. So, on a CUDA GPU with ``profile`` on, the graph with
its replaced pieces is timed against Inductor's code for Dynamo's graph (both kinds of timing,
``fx.inductor_timing.time_graphs``). Where it is slower under the ``timing`` option, the kind of
piece (the same winners: a model's identical layers) that gains least alone under the kind of
timing it lost by is kept too (``fx.decision.least_gain``), the graph with the others is built
and timed again, at most ``WHOLE_TRIES`` times more; where none is faster, every piece is kept
and Inductor's code is returned. The times are cached per set of replaced pieces
(``fx.cache.whole_key``: the graph, its inputs' layout and those pieces' winners), and the
decisions are made from them at each compile, as for a piece: a set of pieces whose graph the
cache holds as slower is not built again (a second compilation of a model compiles Inductor's
code for its graph once, not the graph with pieces first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import inductor_timing as timing
from . import report as rep
from .cache import SearchCache, whole_key
from .decision import least_gain, slower
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
    compiled, and ``launched``: who would launch that graph's kernels (``report.launch``,
    part of the times' cache key) before it is built."""

    gm: Any
    example_inputs: Sequence[Any]
    report: rep.CompileReport
    mode: str | None
    options: BackendOptions
    cache: SearchCache | None
    build: Callable[[Sequence[str]], Callable[..., Any]]
    launched: Callable[[Sequence[str]], str]

    def never_slower(self, names: list[str]) -> Callable[..., Any]:
        """The graph with the pieces ``names`` replaced, or with fewer of them, or Inductor's
        code for ``gm``: the first not slower than Inductor's code (module docstring), each
        built only where its times are not cached or say it is not slower. The report's pieces
        kept so say why."""
        report = self.report
        inductor = compiled = None
        tried: list[str] = []
        while True:
            expected = report.launch = self.launched(names)
            record = self._cached(names)
            if record is None or not slower(record, self.options.timing):
                compiled = self.build(names)  # sets report.launch: its key may differ
                if record is None or report.launch != expected:
                    record, inductor = self._measured(compiled, names, inductor)
            if record is None:
                why = "could not be timed"
            else:
                report.whole_times = timing.fmt_times(record)
                why = slower(record, self.options.timing)
            if not why:
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
            return compiled if compiled is not None else self.build(names)
        return inductor if inductor is not None else self._inductor()

    def _inductor(self) -> Callable[..., Any]:
        """Inductor's code for Dynamo's graph, as ``torch.compile`` would compile it."""
        with self.report.stage("Inductor"):
            return compile_rest(self.gm, self.example_inputs, self.options.rest, self.mode)

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
            inductor = self._inductor()
        try:
            with report.stage("whole-graph timing"):
                record = timing.time_graphs(compiled, inductor, self.example_inputs,
                                            written(self.gm))
        except Exception as e:  # not measurable: Inductor's code, which is never slower
            LOG.warning("egraph-mirage: the whole graph could not be timed: %s: %s",
                        type(e).__name__, e)
            return None, inductor
        if self.cache is not None:
            self.cache.put(self._key(names), record)
        return record, inductor


__all__ = ["WHOLE_TRIES", "WholeGraph"]
