"""Forms of μGraphs, for choosing which to time on a GPU.

A μGraph's *form* is the coarsest thing that tells GPU-speed families apart: how many
graph-defined kernels it launches and which operators it leaves to library calls (a
``matmul`` computed by cuBLAS between kernels, say). The cost model's order (``rank.by_cost``)
can put many μGraphs of one form ahead of every other form — all "library matmul plus a
kernel", for instance — and a GPU budget that times the first few then never sees a fused
form. ``spread`` orders candidates so that the best of each form comes first, and ``to_tune``
gives a close form's fastest μGraph the knob tuning that the fastest few get.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from ..graph import KernelGraph

T = TypeVar("T")


def form(g: KernelGraph) -> tuple[int, tuple[str, ...]]:
    """(graph-defined kernels, the library operators, sorted) of ``g``."""
    kernels = {id(t.params["kernel"]) for t in g.operators if t.op == "customized"}
    library = sorted(t.op for t in g.operators if t.op != "customized")
    return len(kernels), tuple(library)


def form_label(g: KernelGraph) -> str:
    """``form(g)`` as text, e.g. ``"1 kernel + matmul"``."""
    n, library = form(g)
    text = f"{n} kernel{'s' if n != 1 else ''}"
    return " + ".join([text, *library]) if library else text


def spread(items: Sequence[T], graph: Callable[[T], KernelGraph] = lambda x: x  # type: ignore
           ) -> list[T]:
    """``items`` (best first) reordered: the first of each form, in order, then the rest in
    their order. Taking the first ``n`` of the result times ``n`` forms before a second
    μGraph of any one form."""
    seen: set[tuple[int, tuple[str, ...]]] = set()
    first: list[T] = []
    rest: list[T] = []
    for x in items:
        f = form(graph(x))
        (rest if f in seen else first).append(x)
        seen.add(f)
    return first + rest


#: after first timings, a form whose fastest μGraph is within this factor of the fastest of
#: all is tuned too: tuning the lowering's knobs has taken a μGraph's first timing down by up
#: to 1.27× (rmsnorm_linear's split-K form at b = 16 on an H100, 27.7 -> 21.8 µs, where it
#: then won; ``docs/results/gpu_h100.json``), so a form that close may still win and one further
#: behind is not expected to
FORM_SLACK = 1.35


def to_tune(first_us: Sequence[float], graphs: Sequence[KernelGraph], top: int,
            slack: float = FORM_SLACK) -> tuple[list[int], set[int]]:
    """Which first-timed μGraphs to tune: the fastest ``top``, then the fastest of each form
    none of those has, where its first timing is within ``slack`` of the fastest of all.
    Returns their indices, fastest first, and the set of those of the second kind."""
    order = sorted(range(len(first_us)), key=lambda i: first_us[i])
    picked = order[:top]
    seen = {form(graphs[i]) for i in picked}
    extra: set[int] = set()
    for i in order[top:]:
        f = form(graphs[i])
        if f not in seen and first_us[i] <= slack * first_us[order[0]]:
            extra.add(i)
            seen.add(f)
    return sorted([*picked, *extra], key=lambda i: first_us[i]), extra


def rank_correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long sequences (ties share their mean rank);
    None for fewer than 3 pairs or a constant sequence."""
    if len(xs) != len(ys):
        raise ValueError(f"rank_correlation: {len(xs)} and {len(ys)} values")
    if len(xs) < 3:
        return None

    def ranks(v: Sequence[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        out = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx)
    vy = sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        return None
    return cov / (vx * vy) ** 0.5
