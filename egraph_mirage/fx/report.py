"""What the ``torch.compile`` backend did with each piece of a graph, and its text report.

One ``CompileReport`` per graph Dynamo hands the backend (one per compilation: a new shape or a
graph break gives another), one ``PieceReport`` per piece the partitioner cut out of it.
``torch_report(x)`` formats the reports of ``x``: a ``CompileReport``, a list of them, a
``Backend`` object (``fx.backend``; anything with a ``reports`` list), a model or function
compiled with ``torch.compile`` (its compilations, found through Dynamo's cache entries), or
None: every compilation of this process still in ``RECENT``. One line per graph, then one per
piece (fields separated by " | ") and one per operator left out of every piece::

    egraph-mirage: graph 0: 1 piece(s), 1 replaced, 0 kept, 0 unsupported, 1 operator(s) left
    out; 1 search(es), cache 0 hit(s) / 1 miss(es); rest by inductor; 6.2 s
      time: partition 0.3 s, rooms 0.0 s, pieces 3.1 s (searches 2.9 s), Inductor 2.6 s
      piece 0 (egm_0): matmul relu mul_scalar on 2x64 64x96 float16 | replaced: 1 kernel(s),
      grid (8,1,1) | cache miss, search 2.9 s of a 60.0 s share
      left out: cumsum: no op-table operator computes it

(each entry is one line; wrapped here). On a GPU with ``profile`` on, a piece also shows
``ours 8.1 µs / 30.2 µs, Inductor 12.0 µs / 25.0 µs (graph replay / plain launches)``; a piece
kept says why (no μGraph found, several outputs, not faster than Inductor's code, not
searched: the compilation's time budget was spent, ...).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

#: how a piece ended: its μGraph replaced it; the original code was kept (nothing found, or not
#: faster); the piece could not be taken in (an operator or shape the tracer refuses)
REPLACED, KEPT, UNSUPPORTED = "replaced", "kept", "unsupported"
#: how the reason of a piece kept because the search found nothing begins
NOTHING_FOUND = "no μGraph found"
LOG = logging.getLogger("egraph_mirage.fx")
#: the stages of a compilation whose seconds the report gives (``CompileReport.stage``):
#: cutting the graph into pieces and tracing them; timing Inductor's code for each distinct
#: uncached piece before the searches (its room); deciding each piece whole (searches, checks,
#: timing against Inductor's code), then the parts of those nothing was found for; compiling
#: the graph with its replaced pieces (and Dynamo's graph, for the whole-graph check) with
#: Inductor; timing the whole graph against Inductor's code
STAGES = ("partition", "rooms", "pieces", "refine", "Inductor", "whole-graph timing")


@dataclass
class PieceReport:
    """One piece: what it computes, what became of it, and why."""

    index: int
    #: the piece's submodule in the partitioned graph (``egm_0``, ...; ``egm_7.egm_0`` for a
    #: part of piece 7)
    name: str = ""
    #: a part of piece ``index`` (which the search found nothing for, cut at its matmuls): which
    #: (``"1.0"``: part 0 of its part 1, cut again after its matmuls)
    part: int | str | None = None
    operators: tuple[str, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    dtypes: tuple[str, ...] = ()
    status: str = KEPT
    reason: str = ""
    num_kernels: int | None = None
    grids: list[tuple[int, ...]] = field(default_factory=list)
    #: measured times (µs) of the replacement and of Inductor's code for the piece, on a GPU,
    #: under CUDA-graph replay and with plain launches
    ours_us: float | None = None
    inductor_us: float | None = None
    ours_plain_us: float | None = None
    inductor_plain_us: float | None = None
    #: "hit", "miss" or "off" (no cache)
    cache: str = "off"
    #: "hit" where the decision missed but the piece's search was cached (a compilation in
    #: another ``torch.compile`` mode ran it): only the timing against Inductor ran anew
    search_cache: str = ""
    #: seconds the search took (None: no search ran, e.g. on a cache hit)
    search_seconds: float | None = None
    #: the seconds of the compilation's budget the search was given (None: no deadline)
    search_share: float | None = None
    #: SHA-256 of the winner's μGraph JSON and knobs ("" when there is none): what the
    #: whole-graph decision's cache key records of a replaced piece
    winner: str = ""
    #: the inputs a replaced piece writes in place (by the names Dynamo gave them:
    #: ``input_names``) and who stores them (a static cache's new token, ``fx.cache_writes``):
    #: ``"k_cache, v_cache by its kernels"`` (or ``by torch``, where the lowering could not
    #: store them from the kernel computing them)
    writes: str = ""

    def line(self) -> str:
        shapes = " ".join("x".join(map(str, s)) for s in self.shapes)
        number = f"{self.index}" if self.part is None else f"{self.index}.{self.part}"
        parts = [f"  piece {number} ({self.name}): {' '.join(self.operators) or '?'}"]
        if shapes:
            parts[0] += f" on {shapes} {'/'.join(sorted(set(self.dtypes)))}"
        if self.status == REPLACED:
            grids = " ".join("(" + ",".join(map(str, g)) + ")" for g in self.grids)
            parts.append(f"{REPLACED}: {self.num_kernels} kernel(s)"
                         + (f", grid {grids}" if grids else "")
                         + (f", writes {self.writes}" if self.writes else ""))
        else:
            parts.append(f"{self.status}" + (f": {self.reason}" if self.reason else ""))
        if self.ours_plain_us is not None or self.inductor_plain_us is not None:
            parts.append(f"ours {_us(self.ours_us)} / {_us(self.ours_plain_us)}, Inductor "
                         f"{_us(self.inductor_us)} / {_us(self.inductor_plain_us)} "
                         "(graph replay / plain launches)")
        elif self.ours_us is not None or self.inductor_us is not None:
            parts.append(f"ours {_us(self.ours_us)}, Inductor {_us(self.inductor_us)}")
        cache = "no cache" if self.cache == "off" else f"cache {self.cache}"
        if self.search_cache == "hit":
            cache += ", search cached"
        if self.search_seconds is not None:
            cache += f", search {self.search_seconds:.1f} s" + (
                "" if self.search_share is None else f" of a {self.search_share:.1f} s share")
        parts.append(cache)
        return " | ".join(parts)

    def nothing_found(self) -> bool:
        """Kept because the search found nothing (within its budget)."""
        return self.status == KEPT and self.reason.startswith(NOTHING_FOUND)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def input_names(dynamo_gm: Any, module: Any) -> dict[str, str]:
    """The placeholders of ``module`` (Dynamo's graph brought to aten: ``args_3``) by the names
    Dynamo gave them, less its ``l_`` and trailing ``_`` (``l_k_cache_``: ``k_cache``), for the
    report; {} where the two graphs do not have as many placeholders."""
    def places(gm: Any) -> list[str]:
        return [n.name for n in gm.graph.nodes if n.op == "placeholder"]

    ours, theirs = places(module), places(dynamo_gm)
    if len(ours) != len(theirs):
        return {}
    return {a: re.sub(r"^[lL]_", "", b).rstrip("_") or b for a, b in zip(ours, theirs)}


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f} µs"


@dataclass
class CompileReport:
    """One graph compiled by the backend: its pieces, the operators left to the rest and why,
    what ran the rest, and a note when the whole graph went to the rest (dynamic shapes,
    autograd)."""

    graph: int
    num_inputs: int = 0
    pieces: list[PieceReport] = field(default_factory=list)
    #: operator nodes the partitioner left out of every piece -> why
    left_out: dict[str, str] = field(default_factory=dict)
    #: what runs everything not replaced: "inductor" or "eager"
    rest: str = "inductor"
    note: str = ""
    #: searches run (a cache hit runs none)
    searches: int = 0
    #: the whole-graph check of a graph with replaced pieces (on a GPU): "hit" or "miss" in
    #: the cache, "off" (no cache), "" (not checked)
    whole_cache: str = ""
    #: that check's times: the graph with its replaced pieces and Inductor's code for it
    whole_times: str = ""
    #: where Inductor could compile the rest in two modes (``fx.whole``): its code for the
    #: graph in each, timed, and whether the times came from the cache
    mode_times: str = ""
    #: how the replaced pieces' kernels are launched: "inductor" (from Inductor's code), "op"
    #: (their custom ops), "" (nothing replaced); and why not by Inductor where that failed
    launch: str = ""
    launch_note: str = ""
    seconds: float = 0.0
    #: seconds spent in each stage of the compilation (``STAGES``' names), where it ran
    stages: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the time of the ``with`` block to the stage ``name`` (one of ``STAGES``), and
        log it as it ends."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - t0
            self.stages[name] = self.stages.get(name, 0.0) + took
            # at INFO where it took a second or more (a search, a compile), else at DEBUG
            LOG.log(logging.INFO if took >= 1.0 else logging.DEBUG,
                    "egraph-mirage: graph %d: %s %.1f s (%.1f s in all)", self.graph, name,
                    took, self.stages[name])

    def stages_text(self) -> str:
        """Where the compile time went: "partition 0.4 s, pieces 12.1 s (searches 10.2 s),
        ..." ("" before any stage ran)."""
        searched = {"pieces": sum(p.search_seconds or 0.0 for p in self.pieces
                                  if p.part is None),
                    "refine": sum(p.search_seconds or 0.0 for p in self.pieces
                                  if p.part is not None)}
        parts = []
        for name in STAGES:
            if name in self.stages:
                parts.append(f"{name} {self.stages[name]:.1f} s" + (
                    f" (searches {searched[name]:.1f} s)" if searched.get(name) else ""))
        return ", ".join(parts)

    def count(self, status: str) -> int:
        return sum(p.status == status for p in self.pieces)

    def head(self) -> str:
        """The one-line summary (the log line of a compilation)."""
        hits = sum(p.cache == "hit" for p in self.pieces) + (self.whole_cache == "hit")
        misses = sum(p.cache == "miss" for p in self.pieces) + (self.whole_cache == "miss")
        return (f"egraph-mirage: graph {self.graph}: {len(self.pieces)} piece(s), "
                f"{self.count(REPLACED)} replaced, {self.count(KEPT)} kept, "
                f"{self.count(UNSUPPORTED)} unsupported, {len(self.left_out)} operator(s) left "
                f"out; {self.searches} search(es), cache {hits} hit(s) / {misses} miss(es); "
                f"rest by {self.rest}; {self.seconds:.1f} s")

    def text(self) -> str:
        lines = [self.head()]
        if self.note:
            lines.append(f"  note: {self.note}")
        if self.launch:
            lines.append(f"  kernels launched by: {self.launch}"
                         + (f" ({self.launch_note})" if self.launch_note else ""))
        if self.mode_times:
            lines.append(f"  Inductor's modes: {self.mode_times}")
        if self.whole_times:
            lines.append(f"  whole graph: {self.whole_times} | cache {self.whole_cache}")
        if self.stages:
            lines.append(f"  time: {self.stages_text()}")
        lines += [p.line() for p in self.pieces]
        lines += [f"  left out: {name}: {why}" for name, why in self.left_out.items()]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: the latest compilations of this process, oldest first (the backend appends; bounded)
RECENT: collections.deque[CompileReport] = collections.deque(maxlen=256)


def clear_recent() -> None:
    """Forget the compilations in ``RECENT``."""
    RECENT.clear()


def reports_of(x: Any = None) -> list[CompileReport]:
    """The compile reports ``x`` stands for (module docstring)."""
    if x is None:
        return list(RECENT)
    if isinstance(x, CompileReport):
        return [x]
    if isinstance(x, (list, tuple)) and all(isinstance(r, CompileReport) for r in x):
        return list(x)
    if isinstance(getattr(x, "reports", None), list):
        return list(x.reports)
    return _from_dynamo(x)


def torch_report(x: Any = None) -> str:
    """The text report of ``x``'s compilations (module docstring); a line saying there are none
    when the backend has not compiled anything for it."""
    reports = reports_of(x)
    if not reports:
        return "egraph-mirage: no graph compiled by the egraph_mirage backend"
    return "\n".join(r.text() for r in reports)


def _from_dynamo(compiled: Any) -> list[CompileReport]:
    """Reports attached (as ``egraph_mirage_report``) to the callables Dynamo got from the
    backend for ``compiled`` (a model or function returned by ``torch.compile``, or the original
    one), found through Dynamo's cache entries of its code. Private Dynamo API: an empty list
    when it is not there."""
    target = getattr(compiled, "_orig_mod", compiled)
    fn = getattr(target, "forward", target)
    fn = getattr(fn, "_torchdynamo_orig_callable", fn)
    func = getattr(fn, "__func__", fn)
    code, globs = getattr(func, "__code__", None), getattr(func, "__globals__", None)
    if code is None or globs is None:
        return []
    try:
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        entries = _debug_get_cache_entry_list(code)
    except Exception:
        return []
    found: list[CompileReport] = []
    for entry in reversed(entries):  # the newest entry is first
        for name in entry.code.co_names:
            if name.startswith("__compiled_fn") and name in globs:
                found.extend(r for r in _attached(globs[name]) if r not in found)
    return sorted(found, key=lambda r: r.graph)


def _attached(fn: Any) -> Iterable[CompileReport]:
    """Reports on ``fn`` or on the callables it wraps (attributes and closures)."""
    seen: set[int] = set()
    stack = [fn]
    while stack:
        f = stack.pop()
        if id(f) in seen or len(seen) > 64:
            continue
        seen.add(id(f))
        report = getattr(f, "egraph_mirage_report", None)
        if isinstance(report, CompileReport):
            yield report
            continue
        for attr in ("__wrapped__", "_torchdynamo_orig_callable"):
            if hasattr(f, attr):
                stack.append(getattr(f, attr))
        for cell in getattr(f, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:
                pass


__all__ = ["KEPT", "RECENT", "REPLACED", "STAGES", "UNSUPPORTED", "CompileReport", "PieceReport",
           "clear_recent", "reports_of", "torch_report"]
