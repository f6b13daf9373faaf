"""The μGraph optimizer stage: a found structure at the sizes a tuner should time.

The search returns structures at one size each (``mugraph.sizes``). ``size_variants`` lists a
μGraph's structure under the default caps, orders the variants by the cost model, and keeps those
that pass the finite-field test and the float check against the program: the GPU tuner then
picks the sizes (with the lowering's knobs) by measurement. One structure serves every batch
size: a program at another batch gets the same structure re-sized here.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import EMError, GraphError
from ..graph import KernelGraph
from ..mugraph.sizes import DEFAULT_CAPS, Caps, size_choices
from .cost_model import ProgramCost

#: variants kept per structure unless a limit is given (verification costs about 0.1 s each at
#: the benchmarks' shapes)
DEFAULT_LIMIT = 16
#: largest float error a variant may show against the program (the search's default)
TOLERANCE = 1e-6


def size_variants(g: KernelGraph, target: KernelGraph | None = None, limit: int | None = None,
                  caps: Sequence[Caps] = DEFAULT_CAPS) -> list[KernelGraph]:
    """``g`` first, then its structure at other sizes, cheapest by the cost model first (the
    cheapest of each grid before a second loop step of any: the cost model does not tell loop
    steps apart), at most ``limit`` in all (``DEFAULT_LIMIT``). With ``target``, only variants
    that pass the finite-field test and the float check against it are returned (``g`` itself
    is returned as given: the caller verified it)."""
    limit = DEFAULT_LIMIT if limit is None else limit
    if limit < 1:
        raise GraphError(f"size_variants: limit must be a positive integer, got {limit!r}")
    first, *others = size_choices(g, caps)
    cost = ProgramCost()

    def seconds(h: KernelGraph) -> float:
        try:
            return cost.seconds(h)
        except EMError:
            return float("inf")

    others = _spread(sorted(others, key=seconds))
    out = [first]
    verifier = numerics = None
    if target is not None:
        from ..verify import NumericCheck, Verifier

        verifier, numerics = Verifier(target, backend="numpy"), NumericCheck(target)
    for h in others:
        if len(out) >= limit:
            break
        if verifier is not None and numerics is not None:
            try:
                ok = bool(verifier.check(h).equivalent)
                ok = ok and numerics.error(h) <= TOLERANCE
            except EMError:
                ok = False
            if not ok:
                continue
        out.append(h)
    return out


def _spread(ordered: Sequence[KernelGraph]) -> list[KernelGraph]:
    """``ordered`` with the first variant of each set of grids first (in order), then the second
    of each, and so on."""
    from ..mugraph.sizes import sizes_of

    rounds: list[list[KernelGraph]] = []
    seen: dict[tuple[tuple[int, int, int], ...], int] = {}
    for h in ordered:
        key = tuple(k.grid for k in sizes_of(h))
        n = seen.get(key, 0)
        seen[key] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(h)
    return [h for r in rounds for h in r]
