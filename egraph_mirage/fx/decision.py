"""What the backend decided for one piece (``PieceDecision``), and the rule a timed winner
must pass to replace its piece (``slower``).

A decision is made once per piece, after its search (``fx.backend``): "replace" when the winner
compiled, ran and matched the piece's eager outputs (and, on a GPU, carries its times and
Inductor's); "keep" otherwise, with the reason. It is what the disk cache stores
(``fx.cache``), as a JSON object whose keys are the dataclass's fields, the optional ones
only where set and the times flat (``TIMES``' fields): ``to_record`` writes that object,
``from_record`` reads it back, also as an earlier version wrote it (fields it lacks stay
unset). Timed winners are judged at each compile, from the times, so that the ``timing`` option
needs no new search: a piece alone by its GPU time or its host's (``slower_alone``), the graph
with its replaced pieces under every kind of timing the option asks for (``slower``,
``fx.whole``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..graph import KernelGraph
from . import report as rep
from .inductor_timing import TIME_FIELDS, TIMED, TIMES, kinds

#: the decisions
REPLACE, KEEP = "replace", "keep"
#: the record's fields written only where set (not None)
_OPTIONAL = ("search_seconds", "num_kernels", "grids", "estimated_us")
#: a winner slower alone than Inductor's code for its piece under CUDA-graph replay by at most
#: this fraction is used all the same, and judged in the whole graph (``fx.whole``), which
#: drops it first where the graph is slower (its gain alone is the least, ``least_gain``):
#: Inductor compiles the rest again around a replaced piece, and what it fuses across the
#: piece's boundary changes (H200, a Llama layer's decode step: the norm, gate/up and SiLU·mul
#: ran 67.5 µs ours, 66.3 Inductor's alone, where Inductor's layer ran them in 55.5 µs and
#: fused SiLU·mul into the down projection, 44.7 µs against 28.4 alone)
CLOSE = 0.05
#: a whole graph slower than Inductor's code by at most this fraction under a kind of timing
#: ties with it there, and is used where it is faster by at least ``WIN`` under another kind
#: (``slower_whole``): two timings of the same code with plain launches differ by more
#: (H200, a bf16 decoder layer: 157.7, 261.7 and 289.1 µs back to back, replayed 143.7–144.0);
#: a b = 8 Llama layer with 5 pieces replaced ran 175.8 against 192.3 µs replayed and 212.7
#: against 211.8 with plain launches, and was not used before ties counted
TIE = 0.01
WIN = 0.05


@dataclass
class PieceDecision:
    """One piece's decision, as cached: "replace" or "keep" and why, the winner (its μGraph
    JSON and knobs, with statistics) and, on a GPU, its times against Inductor's."""

    decision: str = KEEP
    reason: str = ""
    #: the winner's μGraph as JSON text (``mugraph.serialize.dumps``; None: no winner)
    mugraph: str | None = None
    knobs: dict[str, Any] | None = None
    #: when the decision was made (``time.time()``)
    created: float = field(default_factory=time.time)
    #: seconds the search took (None: no search ran)
    search_seconds: float | None = None
    num_kernels: int | None = None
    #: the grid of each of the winner's graph-defined kernels, in order
    grids: list[list[int]] | None = None
    estimated_us: float | None = None
    #: µs per call, ours and Inductor's, under each kind of timing measured (``TIMES``' fields;
    #: a field absent: not measured; None: not measurable, a CUDA graph not captured)
    times: dict[str, float | None] = field(default_factory=dict)

    def replaces(self) -> bool:
        """Whether the winner replaces the piece (before ``slower`` judges its times)."""
        return self.decision == REPLACE

    def to_record(self) -> dict[str, Any]:
        """The JSON-able object the cache stores."""
        record: dict[str, Any] = {"decision": self.decision, "reason": self.reason,
                                  "mugraph": self.mugraph, "knobs": self.knobs,
                                  "created": self.created}
        record.update((k, getattr(self, k)) for k in _OPTIONAL if getattr(self, k) is not None)
        record.update(self.times)
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PieceDecision:
        """The decision a cached record holds (``to_record``'s, or an earlier version's)."""
        return cls(decision=record.get("decision", KEEP), reason=record.get("reason", ""),
                   mugraph=record.get("mugraph"), knobs=record.get("knobs"),
                   created=record.get("created", 0.0),
                   **{k: record.get(k) for k in _OPTIONAL},
                   times={k: record[k] for k in TIME_FIELDS if k in record})

    def set_winner(self, mugraph: KernelGraph, knobs: dict[str, Any] | None, num_kernels: int,
                   estimated_seconds: float) -> None:
        """Record the search's best result (not yet checked)."""
        from ..mugraph.serialize import dumps

        self.mugraph, self.knobs, self.num_kernels = dumps(mugraph), knobs, num_kernels
        self.grids, self.estimated_us = _grids(mugraph), estimated_seconds * 1e6

    def winner(self) -> str:
        """SHA-256 of the winner's μGraph JSON and knobs ("" without a winner)."""
        if not self.mugraph:
            return ""
        text = json.dumps([self.mugraph, self.knobs], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def why_not_used(self, timing: str) -> str:
        """Why a winner to replace its piece is not used under the ``timing`` option after all
        (``slower_alone``; "" when it is used, and for a decision to keep)."""
        return slower_alone(self.times, timing) if self.replaces() else ""

    def fill(self, out: rep.PieceReport) -> None:
        """The report's fields from this decision."""
        out.status = rep.REPLACED if self.replaces() else rep.KEPT
        out.reason = self.reason
        out.num_kernels = self.num_kernels
        out.grids = [tuple(g) for g in self.grids or []]
        out.ours_us, out.inductor_us = self.times.get("ours_us"), self.times.get("inductor_us")
        out.ours_plain_us = self.times.get("ours_plain_us")
        out.inductor_plain_us = self.times.get("inductor_plain_us")
        if self.mugraph:
            out.winner = self.winner()


def slower(times: Mapping[str, Any], timing: str) -> str:
    """Why a timed winner (or graph) with these ``times`` (``TIMES``' fields) is not used under
    the ``timing`` option ("" when it is faster, or was not timed: no GPU)."""
    if "ours_us" not in times and "ours_plain_us" not in times:
        return ""
    for kind in kinds(timing):
        ours, theirs = TIMES[kind]
        if ours not in times or theirs not in times:
            return f"not timed under {TIMED[kind]} (a decision cached by an earlier version)"
        if times[ours] is None or times[theirs] is None:  # a CUDA graph could not be captured
            return f"could not be timed under {TIMED[kind]}"
        if times[ours] >= times[theirs]:
            return f"not faster than Inductor's code ({TIMED[kind]})"
    return ""


def slower_whole(times: Mapping[str, Any], timing: str) -> str:
    """Why a whole graph with these ``times`` is not used under the ``timing`` option ("" when
    it is): as ``slower``, but a kind of timing it is slower under by at most ``TIE`` is a tie,
    not a loss, where it is faster by at least ``WIN`` under another (``ties``)."""
    why = slower(times, timing)
    return "" if why and ties(times, timing) else why


def ties(times: Mapping[str, Any], timing: str) -> list[str]:
    """The kinds of timing, of those the ``timing`` option asks for, under which a whole graph
    with these ``times`` is slower than Inductor's code by at most ``TIE``, in words with the
    difference, where it is faster under each other kind and by at least ``WIN`` under one
    (empty otherwise: a clear loss, no loss or no clear gain). Plain launches of a decode
    layer are bound by the host, whose noise exceeds ``TIE``; a decode loop replays them."""
    tied, won = [], False
    for kind in kinds(timing):
        ours, theirs = (times.get(f) for f in TIMES[kind])
        if ours is None or theirs is None:
            return []
        if ours >= theirs:
            if ours > theirs * (1 + TIE):
                return []
            tied.append(f"{TIMED[kind]} {100 * (ours / theirs - 1):.1f} % slower")
        won = won or ours <= theirs * (1 - WIN)
    return tied if won else []


def mixed(times: Mapping[str, Any], timing: str) -> bool:
    """Whether ``times`` are faster than Inductor's under some kind of timing the ``timing``
    option asks for and slower under another: a verdict the host's or the GPU's noise may have
    made (``fx.whole`` times such a pair again)."""
    verdicts = set()
    for kind in kinds(timing):
        ours, theirs = (times.get(f) for f in TIMES[kind])
        if ours is not None and theirs is not None:
            verdicts.add(ours < theirs)
    return verdicts == {True, False}


def slower_alone(times: Mapping[str, Any], timing: str) -> str:
    """Why a piece's timed winner with these ``times`` is not used under the ``timing`` option,
    judged alone ("" when it is used). Under "graph", it must be faster under CUDA-graph
    replay. Under "plain" and "both" it must be faster either under replay, its GPU's time,
    or with plain launches, its host's: timed alone, back to back, a piece's plain launches
    measure its call's host time, which counts in a graph whose host time exceeds its GPU
    time (one decoder layer, its kernels small) and overlaps the kernels before it in a graph
    whose GPU time exceeds its host time (a decode step of many layers), where the GPU time
    is what counts. One slower under replay by at most ``CLOSE`` is used too (``close``).
    Either can gain, so the graph with its replaced pieces is judged whole
    under every kind the option asks for (``fx.whole``: a graph slower with them keeps first
    the kind of piece that gains least under the kind of timing it lost by)."""
    whys = [slower(times, kind) for kind in (("graph",) if timing == "graph"
                                             else ("graph", "plain"))]
    return "" if not all(whys) or close(times) else "; ".join(dict.fromkeys(whys))


def close(times: Mapping[str, Any]) -> bool:
    """Whether a winner with these ``times`` is slower than Inductor's code under CUDA-graph
    replay by at most ``CLOSE`` (and so is judged in the whole graph, ``slower_alone``)."""
    ours, theirs = (times.get(f) for f in TIMES["graph"])
    return ours is not None and theirs is not None and theirs <= ours <= theirs * (1 + CLOSE)


#: the piece report's fields of each kind of timing (``TIMES``' keys): ours, Inductor's (the
#: report gives a piece's plain launches back to back only: they stand for the other two)
_REPORTED = {"graph": ("ours_us", "inductor_us"),
             "plain": ("ours_plain_us", "inductor_plain_us"),
             "flushed": ("ours_plain_us", "inductor_plain_us"),
             "synced": ("ours_plain_us", "inductor_plain_us")}


def least_gain(pieces: Sequence[rep.PieceReport], names: Sequence[str],
               times: Mapping[str, Any], timing: str) -> list[str]:
    """Of the replaced pieces ``names`` (top-level pieces: a refined piece's parts count as
    its own), the kind whose replacement gains least alone, in µs summed over its pieces,
    under the first kind of timing the ``timing`` option asks for that the whole graph with
    them (``times``) was not faster under; on a tie, the later kind in ``names``. A kind is
    the pieces replaced by the same winners (``PieceReport.winner``): a model's identical
    layers, whose pieces are kept or replaced together, so that a graph of many layers is
    rebuilt once per kind, not once per layer. Where some kinds gain nothing alone (``CLOSE``:
    used to be judged in the graph) and others do, those are all kept at once. What
    ``fx.whole.WholeGraph`` keeps next when the graph with every replaced piece was slower."""
    lost = next((k for k in kinds(timing) if times.get(TIMES[k][0]) is None
                 or times.get(TIMES[k][1]) is None
                 or times[TIMES[k][0]] >= times[TIMES[k][1]]), kinds(timing)[0])
    ours, theirs = _REPORTED[lost]
    gain = dict.fromkeys(names, 0.0)
    winners: dict[str, list[str]] = {n: [] for n in names}
    for p in pieces:
        top = p.name.split(".")[0]
        if p.status != rep.REPLACED or top not in gain:
            continue
        winners[top].append(p.winner)
        a, b = getattr(p, ours), getattr(p, theirs)
        if a is not None and b is not None:
            gain[top] += b - a
    groups: dict[tuple[str, ...], list[str]] = {}
    for n in names:
        groups.setdefault(tuple(sorted(winners[n])), []).append(n)
    nothing = [n for g in groups.values() if sum(gain[n] for n in g) <= 0 for n in g]
    if nothing and len(nothing) < len(names):  # those gaining nothing alone (``CLOSE``) at once
        return nothing
    return min(reversed(list(groups.values())), key=lambda g: sum(gain[n] for n in g))


def _grids(mugraph: KernelGraph) -> list[list[int]]:
    """The grid of each graph-defined kernel, in order."""
    grids, seen = [], set()
    for t in mugraph.operators:
        kernel = t.params.get("kernel") if t.op == "customized" else None
        if kernel is not None and id(kernel) not in seen:
            seen.add(id(kernel))
            grids.append(list(kernel.tb.grid_dim))
    return grids


__all__ = ["CLOSE", "KEEP", "REPLACE", "PieceDecision", "close", "least_gain", "mixed", "slower",
           "slower_alone"]
