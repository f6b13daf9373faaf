"""The backend's time budget: one deadline per compilation, shared by its searches.

The ``budget`` option bounds a whole compilation (one graph Dynamo hands the backend), not a
piece. When the compilation starts, ``CompileBudget.start`` sets one deadline, ``budget``
seconds away. The rule, one line:

    a search gets the seconds left before the deadline times its piece's weight over the
    weights of the pieces not yet reached (itself included); a piece refined into parts adds
    its parts' weights to those.

A piece's weight is the bytes it moves (its inputs read and outputs written once,
``gpu.floor.io_bytes``: at small batch what its kernels' time is bound by, so what a faster
form of it can gain) plus a quarter of the mean of the compilation's distinct pieces' bytes
(``FLOOR_SHARE``: a small piece still gets some time). So a 16 KB RMSNorm cut from a layer's
MLP is not searched for as long as the 117 MB down projection; pieces of equal sizes get
equal shares.

Every piece is searched whole before any piece is refined (a whole block fused is worth more
than its parts), those that move the most bytes first (where the layer's time is), and with
``refine`` on one share more (the mean piece's weight) is counted among the pieces while they
are searched: it is kept for the parts, which share it with whatever the pieces left.

With the backend's cache on, pieces that are the same program under the same settings (a
model's identical layers) count once: the first is searched, the others are cache hits. So a
compilation of 32 identical layers shares its budget among one layer's pieces.

So a piece decided without a search (a cache hit, a piece the tracer refuses) leaves its share
to the pieces after it, a search that ends early leaves the rest of its share to the others,
and the last search left may take all that is left. A piece reached once no time is left is
not searched (``SPENT``). Tracing, compiling, checking and timing a piece's winner take their
time from the same clock; Inductor's compilation of the rest, after the last search, does not.
``budget=None``: no deadline, each search unbounded (``time_budget=None``).

The stated margin: a search (``em.superoptimize``) saturates its e-graph and searches inside its
``time_budget``, each task stopping at its next check of the deadline; a task in the middle of
one long step (the check of a candidate at a large program's real sizes) may hold the search up
to ``search.run.OVERRUN_S`` seconds longer before it is left behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: the reason a piece reached once the compilation's time budget was spent is kept
SPENT = "not searched: the compilation's time budget was spent"
#: every piece's weight has this share of the mean distinct piece's bytes added
FLOOR_SHARE = 0.25


@dataclass
class CompileBudget:
    """The deadline of one compilation (``time.monotonic()`` seconds; None: none) and the
    weights of the pieces not yet reached."""

    deadline: float | None = None
    #: the weights of the pieces and parts not yet reached, the one being decided included
    weight: float = 0.0
    #: what every piece's weight adds to its bytes (``weigh``), set by ``pieces``
    floor: float = 1.0

    @classmethod
    def start(cls, seconds: float | None) -> CompileBudget:
        """A deadline ``seconds`` from now (None: none)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    def pieces(self, moved: list[int], reserve: bool) -> float:
        """The compilation's distinct pieces, which move ``moved`` bytes each, added, and with
        ``reserve`` one share more for the parts of refined pieces; returns the mean piece's
        weight (the reserve's)."""
        mean = sum(moved) / max(len(moved), 1)
        self.floor = max(FLOOR_SHARE * mean, 1.0)
        self.add(sum(self.weigh(m) for m in moved))
        mean_weight = self.weigh(int(mean))
        if reserve:
            self.add(mean_weight)
        return mean_weight

    def weigh(self, moved: int) -> float:
        """The weight of a piece or part that moves ``moved`` bytes."""
        return moved + self.floor

    def add(self, weight: float) -> None:
        """More to decide: the partition's pieces, or the parts of a refined piece."""
        self.weight += weight

    def reached(self, weight: float) -> None:
        """A piece of this weight is decided (searched or not): less to share the time with."""
        self.weight = max(self.weight - weight, 0.0)

    def left(self) -> float | None:
        """Seconds before the deadline (None: no deadline; 0 or less: spent)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def spent(self) -> bool:
        """Whether no time is left for a search."""
        left = self.left()
        return left is not None and left <= 0

    def share(self, weight: float) -> float | None:
        """The ``time_budget`` of the search of the piece of this weight being decided (module
        docstring): None without a deadline, 0 or less when spent."""
        left = self.left()
        return None if left is None else left * weight / max(self.weight, weight)


__all__ = ["FLOOR_SHARE", "SPENT", "CompileBudget"]
