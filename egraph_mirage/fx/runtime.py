"""A replaced piece at run time: the runner that computes it with its μGraph's compiled kernels
(``make_runner``), and the ``torch.library`` operator that calls the runner in the compiled
graph (``PieceOp``, ``PieceCall``).

A runner's first call goes through the compiled μGraph's checks; later calls launch the
kernels directly, pass a contiguous source that its views only reshape as it is, and read a
view whose elements do not overlap in place through the view's own strides
(``LowerOptions.input_strides``): a permutation (``nn.Linear``'s weight read as Wᵀ), a slice or
narrow (RoPE's rotate-half halves ``q[..., :64]``, ``q[..., 64:]``), a select, or a permutation
of those. The kernels' loads take the strides as compile-time constants and the tensor's data
pointer carries the view's storage offset, so no copy is made per call.

The rule (``_view_strides``, ``_disjoint``): a view is read in place where its strides are
non-negative and no two of its elements share a memory location. Gaps between the elements
are allowed; overlaps (an ``expand`` of a source, stride 0 on a dim of size > 1) are not: such
a view is copied to a row-major tensor at every call, as before. A slice that does not start on
a 16-byte boundary is read in place too: the generated program's ``_launch`` takes its direct
path only where every pointer is 16-byte aligned and otherwise launches through Triton, which
compiles the kernel for the pointer's alignment (and Inductor, launching the kernels itself,
derives the alignment from the view's offset).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from ..errors import LowerError
from ..graph import KernelGraph
from ..lower.compile import laid_out
from ..lower.writes import OutputWrite
from .traced import CacheWrite, TracedProgram
from .views import apply_steps

#: the namespace of the backend's operators (``torch.ops.egraph_mirage``)
NAMESPACE = "egraph_mirage"
#: a piece computed by compiled kernels: its inputs (a list) -> its outputs (a list)
Runner = Callable[[list[Any]], list[Any]]


def make_runner(traced: TracedProgram, mugraph: KernelGraph, knobs: Mapping[str, Any],
            example_inputs: Sequence[Any] | None = None) -> Runner:
    """The piece computed by ``mugraph``'s compiled kernels: a function of the piece's inputs
    (a list) returning its outputs (a list of fresh, contiguous tensors).

    With the piece's ``example_inputs``, a graph input that is a view of its source whose
    elements do not overlap (``nn.Linear``'s weight, stored (out, in), read as Wᵀ; a slice such
    as RoPE's ``q[..., :64]``) is read in place through the view's strides
    (``LowerOptions.input_strides``), not copied at every call.

    The first call goes through the compiled μGraph's checks (number, shapes and dtypes of its
    inputs); later calls, whose inputs Dynamo's guards keep to the same shapes and dtypes, go
    straight to the generated program's ``launch``: per call, only the views that change the
    element order, the launches and the outputs' reshapes run on the host."""
    # in Triton's interpreter (no CUDA device), compiling also makes Triton's library functions
    # interpreted, though torch._dynamo imported triton first (``lower.compile.use_interpreter``)
    fn, strides, by_kernels = _compiled(
        mugraph, dict(knobs), _view_strides(traced, example_inputs)
        if example_inputs is not None else (),
        output_writes(traced, example_inputs) if example_inputs is not None else ())
    # per cache write, the call's destination and index positions (``lower.writes``)
    extra = [p for w in traced.writes for p in (w.dest, w.index)] if by_kernels else []
    # per graph input: where its source is, its views, and whether those only reshape (the
    # element order stays the source's) an input that only graph-defined kernels read: a
    # kernel reads it through its pointer in row-major order, so a contiguous source then goes
    # in as it is, with no view made per call (a library operator needs the shape)
    shaped = {id(a) for t in mugraph.operators if t.op != "customized" for a in t.operands}
    views = [(v.position, v.source, v.steps, id(t) not in shaped
              and all(name == "reshape" for name, _ in v.steps),
              strides[i] if strides else None)
             for i, (v, t) in enumerate(zip(traced.inputs, mugraph.inputs, strict=True))]
    attributes = traced.attributes
    outs = [(o.index, o.shape, getattr(torch, o.dtype)) for o in traced.outputs]
    # the program's outputs are fresh tensors: one may alias an input or another output only
    # where the graph returns an input, or one tensor twice
    graph_ins = {id(t) for t in traced.graph.inputs}
    returned: set[int] = set()
    may_alias = []
    for o in traced.outputs:
        t = id(traced.graph.outputs[o.index])
        may_alias.append(t in graph_ins or t in returned)
        returned.add(t)
    state = {"checked": False}
    launch = fn.module.launch
    if fn.interpret:
        def launch(*ins: Any) -> list[Any]:
            import numpy as np

            with np.errstate(all="ignore"):  # as ``CompiledGraph`` calls it
                return fn.module.launch(*ins)

    def run(xs: list[Any]) -> list[Any]:
        if state["checked"]:  # same shapes and dtypes as the first call (Dynamo's guards)
            ins = []
            for p, source, steps, flat, read in views:
                x = xs[p] if p >= 0 else attributes[source]
                if flat and x.is_contiguous():
                    ins.append(x)
                    continue
                # the layout compiled for (a copy that has it where the view has another)
                ins.append(laid_out(apply_steps(x, steps), read))
            results = launch(*ins, *(xs[p] for p in extra))
        else:  # the compiled μGraph checks the number, shapes and dtypes of its inputs
            results = fn(*traced.graph_inputs(*xs), *(xs[p] for p in extra))
            state["checked"] = True
        if traced.writes and not by_kernels:
            write_by_hand(traced, xs, results)
        fresh: list[Any] = []
        for (index, shape, dtype), alias in zip(outs, may_alias, strict=True):
            y = results[index]
            if y.shape != shape:
                y = y.reshape(shape)
            if y.dtype != dtype:
                y = y.to(dtype)
            if alias:  # no output may alias an input or another output (custom-op contract)
                y = y.contiguous()
                if y.numel() and any(y.data_ptr() == t.data_ptr() for t in [*xs, *fresh]):
                    y = y.clone()
            fresh.append(y)
        return fresh

    run.writes_by = ("its kernels" if by_kernels else "torch") if traced.writes else ""  # type: ignore[attr-defined]
    return run


def make_inductor_launch(traced: TracedProgram, mugraph: KernelGraph, knobs: Mapping[str, Any],
                         example_inputs: Sequence[Any]) -> Callable[..., tuple[Any, ...]]:
    """The piece as a function of its inputs that torch's tracing can follow: the views as
    torch operators, each graph-defined kernel called through ``torch.library.wrap_triton``
    (the generated program's ``launch_traced``), so that Inductor, compiling the graph that
    calls it, launches the kernels from its own code as it launches its own: no operator call
    or runner per call on the host. Compiled without programmatic dependent launch
    (which ``wrap_triton`` does not pass on). Views read in place as in ``make_runner``; where
    the lowering refuses that layout, the views are copied. Raises ``LowerError`` where the
    lowering refuses the knobs; only a CUDA device can trace it (Triton's interpreter runs
    kernels as Python).

    The function's ``counters`` attribute is how many int32 completion counters its fused
    combines need (0: none); ``counters=`` passes a persistent buffer of that many zeros, which
    every call leaves zeroed, as an input of the traced graph (``PieceCall`` holds one as a
    buffer): Inductor then mutates it in place, where a buffer made in the function would be
    zeroed by a kernel of its own at every call."""
    fn, strides, by_kernels = _compiled(mugraph, {**dict(knobs), "pdl": False},
                                        _view_strides(traced, example_inputs),
                                        output_writes(traced, example_inputs))
    extra = [p for w in traced.writes for p in (w.dest, w.index)] if by_kernels else []
    launch = fn.module.launch_traced
    views = [(v.position, v.source, v.steps, strides[i] if strides else None)
             for i, v in enumerate(traced.inputs)]
    attributes = traced.attributes
    outs = [(o.index, o.shape, getattr(torch, o.dtype)) for o in traced.outputs]

    def run(*xs: Any, counters: Any = None) -> tuple[Any, ...]:
        ins = []
        for p, source, steps, read in views:
            ins.append(laid_out(apply_steps(xs[p] if p >= 0 else attributes[source], steps),
                                read))
        results = launch(*ins, *(xs[p] for p in extra), counters=counters)
        if traced.writes and not by_kernels:
            write_by_hand(traced, xs, results)
        return tuple(results[index].reshape(shape).to(dtype) for index, shape, dtype in outs)

    run.counters = getattr(fn.module, "COUNTERS", 0)  # type: ignore[attr-defined]
    return run


def _compiled(mugraph: KernelGraph, knobs: dict[str, Any],
              strides: tuple[tuple[int, ...] | None, ...],
              writes: tuple[OutputWrite, ...] = ()
              ) -> tuple[Any, tuple[tuple[int, ...] | None, ...], bool]:
    """``mugraph`` compiled with ``knobs``, reading the inputs that ``strides`` gives strides
    in place and storing ``writes`` from its kernels; where the lowering refuses that
    (``LowerError``: a fused combine reading such an input, or a written output a library
    operator computes), compiled without it: for row-major inputs, which the caller copies
    at every call, as before, or without the writes, which the caller then makes itself.
    Returns the compiled μGraph, the strides it was compiled for (() for none) and whether
    its kernels write."""
    from ..api import compile as compile_mugraph

    tries = [(st, w) for st in ((strides, ()) if any(strides) else ((),))
             for w in ((writes, ()) if writes else ((),))]
    for st, w in tries[:-1]:
        try:
            return (compile_mugraph(mugraph, **knobs, **_lowering(st, w)), st,
                    bool(w))
        except LowerError:
            pass
    st, w = tries[-1]
    return compile_mugraph(mugraph, **knobs, **_lowering(st, w)), st, bool(w)


def _lowering(strides: tuple[tuple[int, ...] | None, ...], writes: tuple[OutputWrite, ...]
              ) -> dict[str, Any]:
    return {**({"input_strides": strides} if strides else {}),
            **({"writes": writes} if writes else {})}


def output_writes(traced: TracedProgram, example_inputs: Sequence[Any]
                  ) -> tuple[OutputWrite, ...]:
    """The lowering's writes (``lower.writes``) of ``traced``'s cache writes, each destination
    addressed with the strides of its example input."""
    out = []
    for w in traced.writes:
        dest = example_inputs[w.dest]
        extent = 1 + sum((n - 1) * st for n, st in zip(dest.shape, dest.stride()))
        out.append(OutputWrite(w.output, w.shape, tuple(dest.stride()), w.dim, extent))
    return tuple(out)


def write_by_hand(traced: TracedProgram, xs: Sequence[Any], results: Sequence[Any]) -> None:
    """``traced``'s cache writes made with torch (where the kernels do not make them)."""
    for w in traced.writes:
        dest = xs[w.dest]
        dest.index_copy_(w.dim, xs[w.index], results[w.output].reshape(w.shape).to(dest.dtype))


def input_layout(traced: TracedProgram, example_inputs: Sequence[Any]
                 ) -> tuple[tuple[int, ...] | None, ...]:
    """Per graph input of ``traced``, the strides the piece's kernels read it in place with
    (``_view_strides``; None: row-major): the layout a search's GPU timings should use
    (``rank.measured.GpuProfiler.strides``), so that the sizes and knobs that win are those of
    the layout the piece runs with."""
    return _view_strides(traced, example_inputs)


def _view_strides(traced: TracedProgram, example_inputs: Sequence[Any]
                  ) -> tuple[tuple[int, ...] | None, ...]:
    """Per graph input, the strides of its view of the example source where that view is not
    contiguous and its elements do not overlap (``_disjoint``: a transpose or permute, a slice
    or narrow, a select, or a permutation of those), else None: the inputs the kernels read in
    place. A view whose elements overlap (an expanded source) gets None: the runner copies it
    to a row-major tensor at every call."""
    out: list[tuple[int, ...] | None] = []
    for v in traced.graph_inputs(*example_inputs):
        out.append(tuple(v.stride()) if not v.is_contiguous() and _disjoint(v) else None)
    return tuple(out)


def _disjoint(v: Any) -> bool:
    """Whether ``v``'s strides are non-negative and map no two of its elements to one memory
    location (gaps between them allowed). Dims of size 1 are left out (their stride is never
    used); the others, sorted by stride, must each step past everything the dims of smaller
    strides reach: stride > sum of (size - 1) * stride over those dims. Then every element's
    offset has one decomposition (as in a mixed-radix number), so the test never accepts an
    overlap; it holds for every view that slices, selects and permutes a contiguous tensor.
    It may refuse an interleaving of dims that does not overlap (sizes (3, 2), strides (2, 3)),
    which such views never make; those are copied, as overlapping views are."""
    reach = 0  # the largest offset the dims of smaller strides reach
    for stride, size in sorted((st, n) for n, st in zip(v.shape, v.stride()) if n > 1):
        if stride <= reach:  # also stride 0 (an expand) and negative strides
            return False
        reach += (size - 1) * stride
    return True


_OP_NUMBERS = itertools.count()


class PieceOp:
    """A ``torch.library`` operator ``egraph_mirage::<tag>_<n>`` (``Tensor[] -> Tensor[]``)
    running a piece's runner, with a fake implementation giving its outputs' shapes and dtypes.
    Registered through a ``torch.library.Library`` fragment, which this object keeps alive:
    a call dispatches straight to the runner (``torch.library.custom_op``'s Python wrappers
    cost several µs more per call, host time that plain launches pay)."""

    def __init__(self, runner: Runner, traced: TracedProgram, tag: str) -> None:
        self.name = f"{re.sub(r'[^0-9A-Za-z_]', '_', tag)}_{next(_OP_NUMBERS)}"
        outs = [(o.shape, getattr(torch, o.dtype)) for o in traced.outputs]
        #: the inputs the piece writes in place (a static cache: ``fx.cache_writes``), passed
        #: apart, each as a mutable argument of the operator
        self.dests = sorted({w.dest for w in traced.writes})
        dests = self.dests

        def impl(xs: list[torch.Tensor], *written: torch.Tensor) -> Any:
            return _returned(runner(_merged(list(xs), dests, written)), bool(dests))

        def fake(xs: list[torch.Tensor], *written: torch.Tensor) -> Any:
            device = xs[0].device if xs else torch.device("cpu")
            return _returned([torch.empty(shape, dtype=dtype, device=device)
                              for shape, dtype in outs], bool(dests))

        self.library = torch.library.Library(NAMESPACE, "FRAGMENT")
        # a piece that writes inputs: one mutable argument each, and a fixed number of
        # outputs (an operator returning a list and mutating inputs is not functionalized)
        mutable = "".join(f", Tensor(d{k}!) d{k}" for k in range(len(dests)))
        returns = (f"({', '.join(['Tensor'] * len(outs))})" if len(outs) != 1 else "Tensor"
                   ) if dests else "Tensor[]"
        self.library.define(f"{self.name}(Tensor[] xs{mutable}) -> {returns}")
        self.library.impl(self.name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{self.name}", fake, lib=self.library)
        self.op = getattr(getattr(torch.ops, NAMESPACE), self.name).default

    def __call__(self, xs: list[Any]) -> list[Any]:
        if not self.dests:
            return self.op(xs)
        out = self.op([x for i, x in enumerate(xs) if i not in self.dests],
                      *(xs[i] for i in self.dests))
        return [out] if isinstance(out, torch.Tensor) else list(out or ())


def _returned(outs: list[Any], fixed: bool) -> Any:
    """A runner's outputs as the operator returns them: a list, or (``fixed``, a piece that
    writes inputs) one tensor, a tuple of several, or None for none."""
    if not fixed:
        return outs
    return outs[0] if len(outs) == 1 else tuple(outs) if outs else None


def _merged(xs: list[Any], dests: Sequence[int], written: Sequence[Any] = ()) -> list[Any]:
    """The piece's inputs in order from the operator's ``xs`` and ``dests`` (``PieceOp``)."""
    for i, d in zip(dests, written):
        xs.insert(i, d)
    return xs


def define_piece_op(runner: Runner, traced: TracedProgram, tag: str) -> PieceOp:
    """A new operator ``egraph_mirage::<tag>_<n>`` running ``runner`` (``PieceOp``)."""
    return PieceOp(runner, traced, tag)


class PieceCall(torch.nn.Module):
    """Stands in for a piece's submodule: calls its custom op, returns a tuple like the piece.
    With ``inductor_launch`` (``make_inductor_launch``) and ``by_inductor`` set, it calls that
    instead, so that Inductor, tracing it, launches the kernels itself."""

    def __init__(self, op: PieceOp, inductor_launch: Callable[..., tuple[Any, ...]] | None = None,
                 device: Any = None, writes: Sequence[CacheWrite] = ()) -> None:
        super().__init__()
        self.piece_op = op  # keeps the operator's registration alive
        self.inductor_launch = inductor_launch
        #: (position among the piece's outputs, input position) of the written inputs it
        #: returns (``fx.cache_writes``): the caches, written in place
        self.returned = sorted((w.returned_at, w.dest) for w in writes
                               if w.returned_at is not None)
        #: the input positions the piece writes in place (``mutation.written``)
        self.written_inputs = frozenset(w.dest for w in writes)
        self.by_inductor = False
        n = getattr(inductor_launch, "counters", 0)
        # the fused combines' completion counters, zero between calls: a buffer, so that
        # Inductor takes it as an input it mutates in place (``make_inductor_launch``)
        self.register_buffer("counters", torch.zeros(n, dtype=torch.int32, device=device)
                             if n else None, persistent=False)

    def forward(self, *args: Any) -> tuple[Any, ...]:
        if self.by_inductor and self.inductor_launch is not None:
            if self.counters is not None:
                outs = list(self.inductor_launch(*args, counters=self.counters))
            else:
                outs = list(self.inductor_launch(*args))
        else:
            outs = list(self.piece_op(list(args)))
        return self.assembled(outs, args)

    def assembled(self, outs: Sequence[Any], args: Sequence[Any]) -> tuple[Any, ...]:
        """The piece's outputs from its kernels' ``outs`` and its inputs ``args``: the
        written inputs it returns (``returned``) put in their places."""
        outs = list(outs)
        for at, dest in self.returned:
            outs.insert(at, args[dest])
        return tuple(outs)


def piece_calls(modules: Iterable[Any]) -> list[PieceCall]:
    """The replaced pieces' calls among ``modules`` and their submodules."""
    return [m for module in modules for m in module.modules() if isinstance(m, PieceCall)]


def counters_last(launch: Callable[..., tuple[Any, ...]]) -> Callable[..., tuple[Any, ...]]:
    """``launch`` (``make_inductor_launch``'s) taking its fused combines' counters as its last
    positional input, as a traced graph passes every input."""
    return lambda *a: launch(*a[:-1], counters=a[-1])


def inductor_launches(calls: Sequence[PieceCall]) -> bool:
    """Whether Inductor can launch the kernels of all of ``calls`` (there are some, and each
    has an Inductor launch)."""
    return bool(calls) and all(c.inductor_launch is not None for c in calls)


__all__ = ["NAMESPACE", "PieceCall", "PieceOp", "Runner", "counters_last", "define_piece_op",
           "inductor_launches", "make_inductor_launch", "make_runner", "piece_calls"]
