"""Programs of several outputs: each output searched as a program of its own, the winners joined.

A μGraph may have several outputs (an RMSNorm feeding the query, key and value projections; a
gated MLP's gate and up projections). The search itself looks for one output at a time, so a
program of ``n`` outputs is run as ``n`` searches:

1. **split** (``cone``): output ``i`` and the operators it depends on, over the inputs it reads,
   become a program of one output;
2. **search**: each runs through the pipeline's stages (``stages.run``) with a share of what is
   left of the time budget (the seconds left divided by the outputs not yet searched, and one
   share more with ``profile``: the joined program's, step 3) and the
   request's ``max_tasks`` each; a checkpoint file ``C`` becomes ``C.out<i>`` per output. The
   largest output's cone is searched first (``search_order``), and once an output's search has
   no result, the outputs after it are not searched (``NOT_SEARCHED``): no result of the whole
   program can be joined, and the time is left to the caller (the backend's refined parts);
3. **join** (``join``): a result of the whole program takes one result of each output, their
   operators copied over the program's inputs, outputs in the program's order. An operator
   that two parts compute alike (the same operator, operands and parameters; kernels compared
   by their block graphs) is computed once: where the winners of two outputs share a first
   kernel (a norm written once and read by two projections), it runs once. The parts'
   operators are interleaved by depth (``depths``): the parts' first kernels one after another,
   then their second kernels, so that the lowering may launch each such run of siblings as one
   grid (``LowerOptions.horizontal``, a knob the joined program's profile tunes).

The joined results are the best of each output together, then, in order of their estimated
time, the combinations that take one other result of one output (at most
``config.max_results``, when set). With ``profile``, each output's search is timed with the
profiler cut to its inputs (``rank.for_inputs``: a ``GpuProfiler``'s input layout), and the
joined results are then profiled as programs of their own (``rank.profile_stage``): the
lowering's knobs are the whole program's (warps, stages, sibling kernels launched as one grid),
so the joined program's are tuned on it, and the results ranked by its measured time. Each
part is exactly a verified result of its output's program over the same inputs, so the joined
program equals the whole program; statistics are the parts' summed, and
``no_result_reasons`` names the output a reason is about.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from ..graph import KernelGraph, Tensor
from ..lower.cost_model import ProgramCost
from ..mugraph.serialize import kernel_text
from ..rank import for_inputs, profile_stage
from ..search import SearchResult, SearchResults, SearchStats
from .request import Request

#: why an output after one with no result is not searched (the index of that one)
NOT_SEARCHED = ("not searched: output {} has no result, and a result of the program takes one "
                "of each")


def cone(g: KernelGraph, i: int) -> tuple[KernelGraph, list[int]]:
    """Output ``i`` of ``g`` as a program of its own: the operators it depends on, over the
    inputs it reads (in ``g``'s order); and those inputs' positions in ``g.inputs``."""
    out = g.outputs[i]
    needed: set[int] = set()
    todo = [out]
    while todo:
        t = todo.pop()
        if t.index not in needed:
            needed.add(t.index)
            todo.extend(t.operands)
    positions = [k for k, t in enumerate(g.inputs) if t.index in needed]
    sub = KernelGraph()
    new = {g.inputs[k].index: sub.new_input(g.inputs[k].dims, g.inputs[k].dtype)
           for k in positions}
    _copy(sub, [(t, new) for t in g.operators if t.index in needed])
    sub.mark_output(new[out.index])
    return sub, positions


def join(g: KernelGraph, parts: Sequence[tuple[KernelGraph, Sequence[int]]]) -> KernelGraph:
    """One program over ``g``'s inputs computing each part's one output, in order; ``parts``:
    (a program of one output, the positions in ``g.inputs`` of its inputs). Operators two
    parts compute alike are computed once (module docstring)."""
    joined = KernelGraph()
    inputs = [joined.new_input(t.dims, t.dtype) for t in g.inputs]
    seen: dict[Any, Tensor] = {}
    news = [{t.index: inputs[k] for t, k in zip(part.inputs, positions)}
            for part, positions in parts]
    # the parts' operators interleaved by depth: the first kernel of each part, then the
    # second of each, ... so that kernels of one depth, which read none of each other's
    # outputs, are launched one after another (``lower.horizontal`` runs such a sequence as
    # one grid); each part's own order is kept, so every operand comes before its readers
    steps = sorted((d, n, i) for n, (part, _) in enumerate(parts)
                   for i, d in enumerate(depths(part)))
    _copy(joined, [(parts[n][0].operators[i], news[n]) for _, n, i in steps], seen)
    for (part, _), new in zip(parts, news):
        (out,) = part.outputs
        joined.mark_output(new[out.index])
    return joined


def depths(g: KernelGraph) -> list[int]:
    """Per operator of ``g`` (in order), its depth: 1 + the largest of its operands' (an input's
    is 0)."""
    depth: dict[int, int] = {t.index: 0 for t in g.inputs}
    for t in g.operators:
        depth[t.index] = 1 + max((depth[o.index] for o in t.operands), default=0)
    return [depth[t.index] for t in g.operators]


def _copy(into: KernelGraph, steps: Sequence[tuple[Tensor, dict[int, Tensor]]],
          seen: dict[Any, Tensor] | None = None) -> None:
    """Apply each operator of ``steps`` (of another graph, in order) in ``into``, its operands
    mapped by its ``new`` (tensor index -> tensor of ``into``), which gets the copy; with
    ``seen``, an operator applied alike before is not applied again."""
    kernels: dict[int, str] = {}  # a kernel's text, made once however many outputs it has
    for t, new in steps:
        operands = [new[o.index] for o in t.operands]
        key = None
        if seen is not None:
            params = dict(t.params)
            if t.op == "customized":
                kernel = params.pop("kernel")
                if id(kernel) not in kernels:
                    kernels[id(kernel)] = kernel_text(kernel)
                params["kernel"] = kernels[id(kernel)]
            key = (t.op, tuple(o.index for o in operands),
                   json.dumps(params, sort_keys=True, default=repr))
            if key in seen:
                new[t.index] = seen[key]
                continue
        made = into.apply(t.op, operands, **t.params)
        new[t.index] = made
        if key is not None:
            seen[key] = made


def combinations(per_output: Sequence[Sequence[SearchResult]], most: int | None
                 ) -> list[list[int]]:
    """Which result of each output each joined result takes: the best of every output, then
    those taking one other result of one output, by their summed estimates (``most``: at most
    this many)."""
    first = [0] * len(per_output)
    others = [(r.estimated_seconds - rs[0].estimated_seconds, i, j)
              for i, rs in enumerate(per_output) for j, r in enumerate(rs) if j]
    out = [first]
    for _, i, j in sorted(others):
        pick = list(first)
        pick[i] = j
        out.append(pick)
    return out if most is None else out[:most]


def merged_stats(parts: Sequence[SearchStats], outputs: Sequence[int] | None = None
                 ) -> SearchStats:
    """The parts' statistics as one search's: counts and seconds summed, lists joined, what
    stopped each part and why each found nothing prefixed with its output (``outputs[i]`` for
    part i; default: i)."""
    outputs = list(range(len(parts))) if outputs is None else list(outputs)
    st = SearchStats()
    for f in fields(SearchStats):
        values = [getattr(p, f.name) for p in parts]
        if f.name in ("stopped_by", "no_result_reasons"):
            continue
        if all(isinstance(v, bool) for v in values):
            setattr(st, f.name, any(values))
        elif all(isinstance(v, int) for v in values):
            setattr(st, f.name, sum(values))
        elif all(isinstance(v, list) for v in values):
            setattr(st, f.name, [x for v in values for x in v])
        elif all(isinstance(v, dict) for v in values):
            total: dict[str, Any] = {}
            for v in values:
                for k, x in v.items():
                    total[k] = total.get(k, 0) + x if isinstance(x, (int, float)) else x
            setattr(st, f.name, total)
        else:
            setattr(st, f.name, values[0])
    st.workers = parts[0].workers if parts else None
    st.stopped_by = "; ".join(f"output {i}: {p.stopped_by}" for i, p in zip(outputs, parts)
                              if p.stopped_by)
    st.no_result_reasons = [f"output {i}: {r}" for i, p in zip(outputs, parts)
                            for r in p.no_result_reasons]
    return st


def run_outputs(g: KernelGraph, request: Request,
                run_one: Callable[..., SearchResults],
                on_result: Callable[[SearchResult], None] | None = None,
                on_stage: Callable[[str, Any], None] | None = None,
                program_info: Mapping[str, Any] | None = None) -> tuple[SearchResults, float]:
    """Search each output of ``g`` (``run_one``: the one-output pipeline, ``stages.run``) and
    join the results (module docstring); returns them and the seconds it took. ``on_result``
    is called with each joined result once all are joined; ``on_stage`` after each stage of
    each output's search."""
    t0 = time.perf_counter()
    end = time.time() + request.time_budget if request.limited() else None  # type: ignore[operator]
    parts = [cone(g, i) for i in range(len(g.outputs))]
    found: dict[int, SearchResults] = {}
    order = search_order(parts)
    shares = len(parts) + bool(request.profile)  # profiled, the joined program takes a share
    for n, i in enumerate(order):
        budget = None if end is None else max(1e-3, (end - time.time()) / (shares - n))
        checkpoint = None if request.checkpoint is None else \
            Path(f"{request.checkpoint}.out{i}")
        sub_request = replace(request, time_budget=budget, checkpoint=checkpoint,
                              profiler=for_inputs(request.profiler, parts[i][1]))
        found[i] = run_one(parts[i][0], sub_request, on_stage=on_stage,
                           program_info={**dict(program_info or {}), "output": i})
        if not found[i]:  # a joined result needs one of each: the others' time is not spent
            break
    stats = merged_stats([r.stats for r in found.values()], list(found))
    stats.no_result_reasons += [f"output {j}: {NOT_SEARCHED.format(i)}"
                                for j in order if j not in found]
    results: list[SearchResult] = []
    if len(found) == len(parts) and all(found.values()):
        per = [found[i] for i in range(len(parts))]
        for pick in combinations(per, request.config.max_results):
            chosen = [per[i][j] for i, j in enumerate(pick)]
            graph = join(g, [(r.graph, positions)
                             for r, (_, positions) in zip(chosen, parts)])
            results.append(_joined(graph, chosen))
    if request.profile and results:  # the joined program's own knobs and time: the parts'
        # summed times were taken at their own knobs, so a result not timed whole has none
        results = profile_stage([replace(r, measured_us=None) for r in results], g, stats,
                                request.profiler, deadline=end)
    for r in results:
        if on_result is not None:
            on_result(r)
    stats.seconds_to_best = results[0].found_after if results else None
    return SearchResults(results, stats), time.perf_counter() - t0


def search_order(parts: Sequence[tuple[KernelGraph, list[int]]]) -> list[int]:
    """The order the outputs are searched in: the largest cone first (most operators; on a tie,
    program order). A large cone is the likeliest to find nothing in its share (a projection
    with its RoPE rotation beside a bare one), and once one finds nothing the others are not
    searched: the time goes to the caller's parts instead of to outputs that cannot help."""
    return sorted(range(len(parts)), key=lambda i: -len(parts[i][0].operators))


def _joined(graph: KernelGraph, chosen: Sequence[SearchResult]) -> SearchResult:
    """The result of the joined program ``graph`` made of ``chosen`` (one per output)."""
    measured = [r.measured_us for r in chosen]
    cost = ProgramCost()
    return SearchResult(
        graph=graph,
        num_kernels=cost.launches(graph),
        estimated_seconds=cost.seconds(graph),
        verify_bound=sum(r.verify_bound for r in chosen),
        verify_tests=min(r.verify_tests for r in chosen),
        numeric_error=max(r.numeric_error for r in chosen),
        found_after=max(r.found_after for r in chosen),
        measured_us=None if None in measured else sum(m for m in measured if m is not None),
        knobs=None)
