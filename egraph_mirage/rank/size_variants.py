"""The μGraph optimizer stage: a found structure at the sizes a tuner should time.

The search returns structures at one size each (``mugraph.sizes``). ``size_variants`` lists a
μGraph's structure under the default caps, orders the variants by the cost model, and keeps those
that pass the finite-field test and the float check against the program: the GPU tuner then
picks the sizes (with the lowering's knobs) by measurement. One structure serves every batch
size: a program at another batch gets the same structure re-sized here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..errors import EMError, GraphError
from ..graph import KernelGraph
from ..lower.cost_model import ProgramCost
from ..mugraph.sizes import DEFAULT_CAPS, Caps, size_choices

#: variants kept per structure unless a limit is given (verification costs about 0.1 s each at
#: the benchmarks' shapes)
DEFAULT_LIMIT = 16
#: largest float error a variant may show against the program (the search's default)
TOLERANCE = 1e-6


def size_variants(g: KernelGraph, target: KernelGraph | None = None, limit: int | None = None,
                  caps: Sequence[Caps] = DEFAULT_CAPS, workers: int = 1) -> list[KernelGraph]:
    """``g`` first, then its structure at other sizes, cheapest by the cost model first (the
    cheapest of each grid before a second loop step of any: the cost model does not tell loop
    steps apart), at most ``limit`` in all (``DEFAULT_LIMIT``). With ``target``, only variants
    that pass the finite-field test and the float check against it are returned (``g`` itself
    is returned as given: the caller verified it).

    ``workers`` > 1: where one check takes longer than ``PARALLEL_AFTER_S`` (a large program
    at its real sizes: several seconds each), the rest are checked ``workers`` at a time in
    worker processes; the variants returned, and their order, are the same."""
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
    if target is None:
        return [first, *others[:limit - 1]]
    return [first, *_passing(others, target, limit - 1, workers)]


#: seconds one variant's check must take before the others are checked in worker processes
PARALLEL_AFTER_S = 2.0


def _passing(variants: list[KernelGraph], target: KernelGraph, limit: int,
             workers: int) -> list[KernelGraph]:
    """The first ``limit`` of ``variants`` that pass the checks against ``target``, in order:
    one by one, or, once a check took longer than ``PARALLEL_AFTER_S``, the rest in as many of
    ``workers`` processes as fit in memory (``_workers_that_fit``)."""
    check = _Check(target)
    out: list[KernelGraph] = []
    todo = list(variants)
    while todo and len(out) < limit:
        t0 = time.perf_counter()
        h = todo.pop(0)
        if check(h):
            out.append(h)
        if workers > 1 and time.perf_counter() - t0 > PARALLEL_AFTER_S:
            shared = min(workers, len(todo), _workers_that_fit(target))
            if shared > 1 and len(out) < limit:
                return out + _passing_in_workers(todo, target, limit - len(out), shared)
            workers = 1  # no second check fits: the rest one by one
    return out


def _passing_in_workers(variants: list[KernelGraph], target: KernelGraph, limit: int,
                        workers: int) -> list[KernelGraph]:
    """``_passing``'s rest, checked ``workers`` at a time in worker processes, in order."""
    from ..mugraph.serialize import dumps
    from ..processes import worker_pool

    out: list[KernelGraph] = []
    todo = list(variants)
    pool = worker_pool(workers)
    try:
        text = dumps(target)
        while todo and len(out) < limit:
            # in order, a batch at a time: the variants one by one would give
            batch, todo = todo[:workers], todo[workers:]
            oks = pool.map(_check_in_worker, [text] * len(batch), [dumps(h) for h in batch])
            out += [h for h, ok in zip(batch, oks) if ok]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return out[:limit]


def _workers_that_fit(target: KernelGraph) -> int:
    """How many checks of variants of ``target`` fit side by side in the share of the memory
    available now that checks may take (``verify.checks_that_fit``: 15 workers on a 16-core
    host can take more than its memory); unlimited where that is unknown."""
    from ..verify import checks_that_fit

    fit = checks_that_fit(target)
    return 1 << 30 if fit is None else fit


class _Check:
    """The finite-field test and the float check of a variant against one program."""

    def __init__(self, target: KernelGraph) -> None:
        from ..verify import NumericCheck, Verifier

        self.verifier, self.numerics = Verifier(target, backend="numpy"), NumericCheck(target)

    def __call__(self, h: KernelGraph) -> bool:
        try:
            return (bool(self.verifier.check(h).equivalent)
                    and self.numerics.error(h) <= TOLERANCE)
        except EMError:
            return False


#: a worker's checks, by the program's JSON: its inputs and outputs are computed once
_WORKER_CHECKS: dict[str, _Check] = {}


def _check_in_worker(target: str, variant: str) -> bool:
    from ..mugraph.serialize import loads

    if target not in _WORKER_CHECKS:
        _WORKER_CHECKS.clear()  # one program at a time
        _WORKER_CHECKS[target] = _Check(loads(target))
    return _WORKER_CHECKS[target](loads(variant))


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
