"""The backend's time budget: one deadline per compilation, shared by its searches.

The ``budget`` option bounds a whole compilation (one graph Dynamo hands the backend), not a
piece. When the compilation starts, ``CompileBudget.start`` sets one deadline, ``budget``
seconds away. The rule, one line:

    a search gets the seconds left before the deadline times its piece's weight over the
    weights of the pieces not yet reached (itself included); a piece refined into parts adds
    its parts' weights to those.

A piece's weight is what a faster form of it can gain, plus a quarter of the mean of the
compilation's distinct pieces' (``FLOOR_SHARE``: a small piece still gets some time):

- **where the backend times on a GPU, its room** (``Room``): Inductor's µs for the piece
  (CUDA-graph replay, timed before any search) less its copy floor's (the bytes it moves over
  the copy bandwidth, ``gpu.floor``). A piece whose Inductor code already runs within
  ``AT_FLOOR`` of its floor is not searched at all (``AT_FLOOR_REASON``): no kernel can gain
  there, and its share goes to the pieces that can. So an MLP's GEMV pair that Inductor runs at
  the floor leaves its time to the attention projections above it;
- **elsewhere, the bytes it moves** (its inputs read and outputs written once,
  ``gpu.floor.io_bytes``: at small batch what its kernels' time is bound by). So a 16 KB
  RMSNorm cut from a layer's MLP is not searched for as long as the 117 MB down projection;
  pieces of equal sizes get equal shares.

The parts of a refined piece are weighed the same way: on a GPU by their own rooms (one at its
floor is not searched), elsewhere by their shares of the piece's weight, in proportion to the
bytes each moves.

Every piece is searched whole before any piece is refined (a whole block fused is worth more
than its parts), those that move the most bytes first (where the layer's time is). With
``refine`` on, one share more (the mean piece's weight) is held back for the parts, in seconds:
when the pieces' searches start, ``held`` is the seconds left times that share over the
pieces' weights and it; the pieces' searches share the seconds left less ``held``, so that
they end before it. Once every piece was searched whole, ``release`` gives the parts the held
seconds whole, with whatever the pieces left: where the pieces' searches overran their shares
into the held seconds (a search may end later than its share, below), the deadline moves so
that the parts still get them: the compilation then ends later than its budget by those
overruns, and a piece's parts are searched however long the pieces' searches took. A piece's
search that finds nothing before its share is spent (a program of several outputs stops at
the first output with none) adds the rest of its share to the held seconds (``hold_rest``): its
parts get it, not the pieces after it. The pieces found nothing for weigh in with their own
weights until their parts take their places, one piece at a time, so the first refined
piece's parts share the held seconds with the pieces refined after it instead of taking them
all.

With the backend's cache on, pieces that are the same program under the same settings (a
model's identical layers) count once: the first is searched, the others are cache hits. So a
compilation of 32 identical layers shares its budget among one layer's pieces. Such a program
weighs its gain times the number of places it comes in (a faster form gains in each): a decode
step's attention core, the same in 7 of 8 layers, weighs 7 times the first layer's own form of
it, and the pieces of one repeated layer keep their proportions among themselves.

So a piece decided without a search (a cache hit, a piece the tracer refuses) leaves its share
to the pieces after it, a search that ends early leaves the rest of its share to the others, and
the last search left may take all that is left. A piece reached once no time is left is not
searched (``SPENT``), nor cached; but the cache keeps a record of the graph's compilation
(``fx.cache.graph_key``): a second compilation of the same graph with the same settings does not
search what the first left unsearched, so that it comes from the cache, while another graph with
those pieces (a model of more layers) searches them. Tracing, compiling and checking a piece's
winner take their time from the same clock; timing Inductor's code for each piece before the
searches (its room, on a GPU: an Inductor compilation per distinct piece) and for each part of
a refined piece before the parts are searched, timing each winner against Inductor's code for
its piece (another compilation and its timing, seconds per winner on a GPU) and Inductor's
compilation of the rest, after the last search, do not: the deadline moves by their time
(``extend``, ``uncharged``), so that a model of many distinct pieces does not spend a small
budget before its first search, nor the refined pieces' parts their share on the timing of
their own rooms or of the winners before them.
``budget=None``: no deadline, each search unbounded (``time_budget=None``).

The stated margin: a search (``em.superoptimize``) saturates its e-graph and searches inside its
``time_budget``, each task stopping at its next check of the deadline; a task in the middle of
one long step (the check of a candidate at a large program's real sizes) may hold the search up
to ``search.run.OVERRUN_S`` seconds longer before it is left behind.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

#: the reason a piece reached once the compilation's time budget was spent is kept
SPENT = "not searched: the compilation's time budget was spent"
#: every piece's weight has this share of the mean distinct piece's weight added
FLOOR_SHARE = 0.25
#: a piece whose Inductor code runs in at most this many times its copy floor's µs is not
#: searched (on a GPU host, where timing Inductor's code before the search says so)
AT_FLOOR = 1.05
#: the reason such a piece is kept
AT_FLOOR_REASON = "not searched: Inductor's code runs at the copy floor"


@dataclass(frozen=True)
class Room:
    """What a piece's search can gain on a GPU: Inductor's µs for the piece (CUDA-graph replay)
    and the µs of its copy floor (its bytes over the copy bandwidth)."""

    inductor_us: float
    floor_us: float

    @property
    def us(self) -> float:
        """µs above the floor (0 where Inductor's code is at or below it)."""
        return max(self.inductor_us - self.floor_us, 0.0)

    def at_floor(self) -> bool:
        """Whether no search is worth its time: Inductor's code within ``AT_FLOOR``."""
        return self.inductor_us <= AT_FLOOR * self.floor_us

    def reason(self) -> str:
        return (f"{AT_FLOOR_REASON} ({self.inductor_us:.1f} µs, floor {self.floor_us:.1f} µs, "
                "graph replay)")


@dataclass
class CompileBudget:
    """The deadline of one compilation (``time.monotonic()`` seconds; None: none) and the
    weights of the pieces not yet reached."""

    deadline: float | None = None
    #: the weights of the pieces and parts not yet reached, the one being decided included
    weight: float = 0.0
    #: what every piece's weight adds to its bytes (``weigh``), set by ``pieces``
    floor: float = 1.0
    #: seconds held back for the parts of refined pieces while the pieces are searched whole
    #: (``pieces``, ``release``): not among the seconds ``left``
    held: float = 0.0
    #: the share last handed out and when (``share``; None: none since it was cleared)
    handed: tuple[float, float] | None = None

    @classmethod
    def start(cls, seconds: float | None) -> CompileBudget:
        """A deadline ``seconds`` from now (None: none)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    @contextlib.contextmanager
    def uncharged(self) -> Iterator[None]:
        """Time the searches are not charged with (timing Inductor's code for the rooms): the
        deadline moves by what the block took, on this module's clock."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.extend(time.monotonic() - started)

    def extend(self, seconds: float) -> None:
        """Move the deadline ``seconds`` later (time the searches are not charged with)."""
        if self.deadline is not None:
            self.deadline += seconds

    def pieces(self, gains: list[float], reserve: bool) -> None:
        """The compilation's distinct pieces, whose searches can gain ``gains`` each (bytes
        moved, or µs of room: one unit for all), added; with ``reserve``, one share more (the
        mean piece's weight) of the seconds left is held back for the parts of refined pieces
        (``held``) until ``release``."""
        mean = sum(gains) / max(len(gains), 1)
        self.floor = max(FLOOR_SHARE * mean, 1e-9)
        self.add(sum(self.weigh(m) for m in gains))
        left = self.left()
        if reserve and left is not None:
            share = self.weigh(mean)
            self.held = max(left, 0.0) * share / (self.weight + share)

    def hold_rest(self) -> None:
        """Hold back for the parts what the search last handed a share (``handed``) left of
        it: what a piece found nothing for left of its share goes to its own parts, not to
        the pieces after it."""
        if self.handed is not None:
            share, started = self.handed
            self.held += max(share - (time.monotonic() - started), 0.0)
        self.handed = None

    def release(self) -> None:
        """The held seconds join the seconds left, once every piece was searched whole: the
        deadline moves, where needed, so that at least they are left for the parts (the
        pieces' searches' overruns do not take them)."""
        held, self.held = self.held, 0.0
        if self.deadline is not None:
            self.deadline = max(self.deadline, time.monotonic() + held)

    def weigh(self, gain: float) -> float:
        """The weight of a piece or part whose search can gain ``gain`` (``pieces``' unit)."""
        return gain + self.floor

    def add(self, weight: float) -> None:
        """More to decide: the partition's pieces, or the parts of a refined piece."""
        self.weight += weight

    def reached(self, weight: float) -> None:
        """A piece of this weight is decided (searched or not): less to share the time with."""
        self.weight = max(self.weight - weight, 0.0)

    def left(self) -> float | None:
        """Seconds before the deadline (None: no deadline; 0 or less: spent)."""
        return None if self.deadline is None else self.deadline - self.held - time.monotonic()

    def spent(self) -> bool:
        """Whether no time is left for a search."""
        left = self.left()
        return left is not None and left <= 0

    def share(self, weight: float) -> float | None:
        """The ``time_budget`` of the search of the piece of this weight being decided (module
        docstring): None without a deadline, 0 or less when spent."""
        left = self.left()
        if left is None:
            return None
        share = left * weight / max(self.weight, weight)
        self.handed = (share, time.monotonic())
        return share


__all__ = ["AT_FLOOR", "AT_FLOOR_REASON", "FLOOR_SHARE", "SPENT", "CompileBudget", "Room"]
