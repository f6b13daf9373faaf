"""A large program searched at smaller sizes: the ``scale`` and ``resize`` stages.

At a real model's sizes (a projection of 4096 x 14336, a cache of 4,096 keys) every candidate's
finite-field test and float check evaluate the whole program: each worker process spends
seconds building its test inputs before its first check, and gigabytes holding them, so fewer
workers fit in memory. The search itself does not need the sizes: what it finds is a
*structure* (which dimension each grid axis and loop cuts, the block operators; ``mugraph.sizes``),
and a structure found at one size is re-sized to another by ``mugraph.sizes.retarget``.

So a program with more than ``SCALE_ABOVE`` elements (inputs and operators) is searched as its
**scaled copy** (``scaled_program``): every dimension of at least ``LARGE`` is divided by
``FACTOR`` (to no less than ``SMALLEST``), the others kept, and the program's operators
replayed on those sizes. The copy is used only where it is the same program at other sizes:
each operator's result has the scaled dims of the original's, and an operator whose
parameters hold a size is rewritten to match (``rms_norm``'s normalized shape;
``slice_last``'s bounds, when the sliced dimension is scaled and the bounds divide); a program
with an operator that holds a size the scaling cannot follow (``div_count``'s count) is
searched at its own sizes.

After the search, **resize** (``resized``): each result is retargeted to the program's own
sizes, the copies of one structure kept once, ordered by the cost model at those sizes, and the
first ``KEEP`` of them that pass the finite-field test and the float check against the program
itself are the search's results. Nothing is returned that was not verified at the program's own
sizes; a structure that does not fit them is dropped (``SearchStats.resize_unfit``), and one that
fails the checks there too (``resize_rejected``).

The resize stage's time is reserved out of the search's (``resize_reserve``): building the
checks' inputs at a real model's sizes takes seconds (about ``CHECK_S_PER_ELEMENT`` a program
element on one core), each check then a fraction of one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import EMError
from ..graph import KernelGraph, Tensor
from ..lower.cost_model import ProgramCost
from ..mugraph.serialize import dumps
from ..mugraph.sizes import retarget
from ..search import SearchResult, SearchStats
from ..search.dims import PROBE_LIMIT

#: programs with more elements than this (inputs and operators' results) are searched scaled
SCALE_ABOVE = 1 << 22
#: dimensions of at least this size are scaled ...
LARGE = 1024
#: ... divided by this (a projection's 4,096 becomes 256) ...
FACTOR = 16
#: ... to no less than this, where it divides: room for a split into blocks that each loop over
#: tiles of 16 (1,024 keys become 256; at 64, the split decode attention is out of the search's
#: reach: ``scripts/task_times.py decode-attention --keys 64``)
SMALLEST = 256
#: verified results at the program's own sizes that the resize stage returns at most
KEEP = 8
#: seconds per program element to build the checks at the program's sizes (measured: 0.1 to
#: 0.2 µs on a 2-core VM for the pieces of an 8B model's layer)
CHECK_S_PER_ELEMENT = 2e-7
#: seconds per check after that
CHECK_S = 0.5
#: the resize stage takes at most this share of what is left of a search's time
RESIZE_SHARE = 0.5
#: checks the resize stage still makes past its deadline while none has passed
LATE_CHECKS = 3


def resize_reserve(g: KernelGraph, left: float) -> float:
    """Seconds of ``left`` to keep for re-sizing a scaled search's results to ``g``'s sizes."""
    return min(RESIZE_SHARE * left, CHECK_S_PER_ELEMENT * elements(g) + KEEP * CHECK_S)


def elements(g: KernelGraph) -> int:
    """Elements of ``g``'s inputs and of its operators' results."""
    return sum(math.prod(t.dims) for t in [*g.inputs, *g.operators])


def _size(n: int, smallest: int = SMALLEST) -> int:
    if n < LARGE or n % FACTOR:
        return n
    return smallest if n // FACTOR < smallest and n % smallest == 0 else n // FACTOR


def scaled_program(g: KernelGraph) -> KernelGraph | None:
    """``g`` at its scaled sizes (module docstring), or None where it is not large enough, no
    dimension scales, the scaling cannot follow one of its operators, or an operator is too
    large to check at its own sizes (``search.dims.PROBE_LIMIT``: the search refuses the
    program itself, naming that operator). Where a dimension raised to ``SMALLEST`` is a slice
    of one divided by ``FACTOR`` (a fused projection's 1,024 columns of its 6,144), the program
    is scaled by ``FACTOR`` alone."""
    if elements(g) <= SCALE_ABOVE or any(t.op == "customized" for t in g.operators):
        return None
    if any(sum(math.prod(o.dims) for o in (*t.operands, t)) > PROBE_LIMIT for t in g.operators):
        return None  # too large to check at its own sizes: the search refuses it, named
    if all(_size(d) == d for t in g.inputs for d in t.dims):
        return None
    for smallest in (SMALLEST, 0):
        if (h := _replayed(g, lambda n, s=smallest: _size(n, s))) is not None:
            return h
    return None


def _replayed(g: KernelGraph, size: Callable[[int], int]) -> KernelGraph | None:
    """``g``'s operators replayed on its inputs with every dim ``n`` made ``size(n)``; None where
    an operator's result is not its own dims sized so, or its parameters cannot follow."""
    h = KernelGraph()
    new: dict[int, Tensor] = {t.index: h.new_input(tuple(map(size, t.dims)), t.dtype)
                              for t in g.inputs}
    try:
        for t in g.operators:
            params = _params(t, size)
            if params is None:
                return None
            out = h.apply(t.op, [new[o.index] for o in t.operands], **params)
            if out.dims != tuple(map(size, t.dims)):
                return None  # a dimension the scaling does not divide alike everywhere
            new[t.index] = out
    except EMError:
        return None
    for t in g.outputs:
        h.mark_output(new[t.index])
    return h


def _params(t: Tensor, size: Callable[[int], int]) -> dict[str, Any] | None:
    """``t``'s operator parameters at the scaled sizes; None where they cannot follow."""
    p = dict(t.params)
    if t.op == "div_count":
        return None  # a count may be any product of dimensions: not followed
    if t.op == "rms_norm":
        shape = p["normalized_shape"]
        p["normalized_shape"] = (size(shape) if isinstance(shape, int)
                                 else tuple(map(size, shape)))
    if t.op == "slice_last":
        n = t.operands[0].dims[-1]
        if (factor := n // size(n)) > 1:
            if p["start"] % factor or p["stop"] % factor:
                return None
            p["start"], p["stop"] = p["start"] // factor, p["stop"] // factor
    return p


def resized(results: Sequence[SearchResult], program: KernelGraph, stats: SearchStats,
            deadline: float | None, tolerance: float, tests: int = 2, seed: int = 0,
            keep: int = KEEP) -> list[SearchResult]:
    """The results of a search of ``program``'s scaled copy at ``program``'s own sizes, each
    verified there (module docstring): at most ``keep``, cheapest by the cost model first.
    ``tolerance``, ``tests`` and ``seed``: the float check's tolerance and the finite-field
    tests' count and seed, the search's own (``SearchConfig.numeric_tolerance``,
    ``verify_tests``; the request's seed). Checks start until ``deadline`` (a
    ``time.time()``), and after it while none has passed, ``LATE_CHECKS`` at most; ``stats``
    counts what was dropped (``resize_unfit``, ``resize_rejected``) and the seconds taken."""
    from ..verify import NumericCheck, Verifier

    t0 = time.perf_counter()
    cost = ProgramCost()
    candidates: dict[str, tuple[float, SearchResult, KernelGraph]] = {}
    for r in results:
        try:
            h = retarget(r.graph, program)
            estimate = cost.seconds(h)
        except EMError:
            stats.resize_unfit += 1
            continue
        text = dumps(h)
        if text not in candidates or r.found_after < candidates[text][1].found_after:
            candidates[text] = (estimate, r, h)
    order = sorted(candidates.items(), key=lambda kv: (kv[1][0], kv[1][1].num_kernels, kv[0]))
    out: list[SearchResult] = []
    verifier = numerics = None
    for checked, (_, (estimate, r, h)) in enumerate(order):
        late = deadline is not None and time.time() > deadline
        if len(out) >= keep or (late and (out or checked >= LATE_CHECKS)):
            break
        if verifier is None:
            verifier = Verifier(program, tests=tests, seed=seed, backend="numpy")
            numerics = NumericCheck(program)
        try:
            verdict = verifier.check(h)
            error = numerics.error(h) if verdict.equivalent else math.inf
        except EMError:
            verdict, error = None, math.inf
        if verdict is None or not verdict.equivalent or error > tolerance:
            stats.resize_rejected += 1
            continue
        out.append(replace(r, graph=h, estimated_seconds=estimate, verify_bound=verdict.bound,
                           verify_tests=verdict.tests, numeric_error=error))
    stats.seconds["resize"] = time.perf_counter() - t0
    return out
