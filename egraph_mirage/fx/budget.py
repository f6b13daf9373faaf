"""The backend's time budget: one deadline per compilation, shared by its searches.

The ``budget`` option bounds a whole compilation (one graph Dynamo hands the backend), not a
piece. When the compilation starts, ``CompileBudget.start`` sets one deadline, ``budget``
seconds away. The rule, one line:

    a search gets the seconds left before the deadline, divided by the pieces not yet reached
    (itself included); a piece refined into parts adds its parts to those.

Every piece is searched whole before any piece is refined (a whole block fused is worth more
than its parts), those that move the most bytes first (where the layer's time is), and with
``refine`` on one share more is counted among the pieces while they are searched: it is kept
for the parts, which share it with whatever the pieces left.

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


@dataclass
class CompileBudget:
    """The deadline of one compilation (``time.monotonic()`` seconds; None: none) and the pieces
    not yet reached."""

    deadline: float | None = None
    #: pieces and parts not yet reached, the one being decided included
    pieces: int = 0

    @classmethod
    def start(cls, seconds: float | None) -> CompileBudget:
        """A deadline ``seconds`` from now (None: none)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    def add(self, pieces: int) -> None:
        """``pieces`` more to decide: the partition's pieces, or the parts of a refined piece."""
        self.pieces += pieces

    def reached(self) -> None:
        """A piece is decided (searched or not): one fewer to share the time with."""
        self.pieces = max(self.pieces - 1, 0)

    def left(self) -> float | None:
        """Seconds before the deadline (None: no deadline; 0 or less: spent)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def spent(self) -> bool:
        """Whether no time is left for a search."""
        left = self.left()
        return left is not None and left <= 0

    def share(self) -> float | None:
        """The ``time_budget`` of the search of the piece being decided (module docstring):
        None without a deadline, 0 or less when spent."""
        left = self.left()
        return None if left is None else left / max(self.pieces, 1)


__all__ = ["SPENT", "CompileBudget"]
