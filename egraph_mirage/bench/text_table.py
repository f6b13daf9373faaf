"""Aligned text tables for the benchmark commands."""

from __future__ import annotations

from collections.abc import Sequence


def aligned(head: Sequence[str], body: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Lines of a table: the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return ["  ".join(c.ljust(w) if i < left else c.rjust(w)
                      for i, (c, w) in enumerate(zip(row, widths)))
            for row in (head, *body)]
