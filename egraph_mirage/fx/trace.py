"""From PyTorch to a kernel graph: ``from_torch``, ``trace`` and ``trace_fx``.

``trace(fn_or_module, *example_inputs)`` exports the program with ``torch.export`` (decomposing
every aten operator that the mapping table, ``aten.RULES``, cannot take whole into core aten
operators) and hands the FX graph to ``trace_fx``, which builds the ``KernelGraph`` node by
node through the table (``tracer.py``). Parameters and buffers become graph inputs
(``get_attr`` sources). Views on program inputs fold into graph inputs (``views.py``); what the
caller applies is recorded in ``TracedProgram.inputs``, and how graph outputs become the
program's outputs in ``TracedProgram.outputs`` (``traced.py``). Anything else raises an
``UnsupportedOpError`` naming the aten operator and the user's source line.

Casts between float types are op-table operator ``cast`` (a cast of a program input is done
where the input is read), and every graph tensor has torch's dtype: type promotion, a
reduction's ``dtype=`` and softmax's ``half_to_float`` cast the operands first
(``Tracer.as_result``); ``OutputView.dtype`` records torch's dtype.
"""

from __future__ import annotations

import math
import types
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ..errors import EMError, UnsupportedOpError
from ..graph import KernelGraph, Tensor, new_kernel_graph
from . import aten
from .cache_writes import stripped, with_writes
from .traced import (
    DTYPES,
    InputView,
    OutputView,
    TracedProgram,
    UnsupportedDTypeError,
    aten_name,
    meta_of,
    user_line,
)
from .tracer import Tracer
from .views import Source, Step, check_views


def from_torch(fn_or_module: Any, *example_inputs: Any) -> KernelGraph:
    """The kernel graph of a PyTorch function or module at the shapes of ``example_inputs``."""
    return trace(fn_or_module, *example_inputs).graph


def trace(fn_or_module: Any, *example_inputs: Any) -> TracedProgram:
    """``from_torch``, with how to call the graph (a module's parameters are attributes)."""
    return trace_fx(export_aten(fn_or_module, example_inputs), example_inputs)


def trace_fx(gm: Any, example_inputs: Sequence[Any]) -> TracedProgram:
    """The kernel graph of fx graph module ``gm`` (aten operators, or any fx graph, which is
    exported first) called with ``example_inputs`` (tensors or fake tensors, one per
    placeholder)."""
    names = tuple(n.name for n in gm.graph.nodes if n.op == "placeholder")
    if not is_aten(gm):
        gm = export_aten(gm, example_inputs)
    ensure_meta(gm, example_inputs)
    cut = stripped(gm)  # a static cache's write: the value traced, where it goes recorded
    gm = cut.module
    traced = Tracer(gm, example_inputs).run()
    inputs = tuple(replace(v, source=names[v.position]) if v.kind == "placeholder" else v
                   for v in traced.inputs)
    return with_writes(with_batch_folded(with_rows_folded(without_unit_batch(
        replace(traced, placeholders=names, inputs=inputs))), example_inputs), cut)


def without_unit_batch(traced: TracedProgram) -> TracedProgram:
    """``traced`` with the leading dims of size 1 that its tensors share dropped: a decode
    step's ``(1, 1, 4096) @ (1, 4096, 4096)`` (a batch of one sequence of one token) becomes
    ``(1, 4096) @ (4096, 4096)``, the program the search and its kernels know best.

    The graph keeps rank ``R - k`` (``R`` its largest rank, at least 2): every tensor of a
    larger rank loses its leading dims down to that rank, all of size 1 and not reduced or
    joined along (broadcasting aligns trailing dims, so the others are unchanged). Graph inputs
    get a reshape step; the outputs are reshaped back as before (``TracedProgram.fx_outputs``)."""
    g = traced.graph
    rank = max(len(t.dims) for t in g.tensors)
    keep = rank
    while keep > 2 and all(len(t.dims) < keep or t.dims[len(t.dims) - keep] == 1
                           for t in g.tensors):
        keep -= 1

    def drop(t: Tensor) -> int:
        return max(0, len(t.dims) - keep)

    if keep == rank or any("dim" in t.params and t.params["dim"] % len(t.dims) < drop(t)
                           for t in g.operators):
        return traced
    h = new_kernel_graph()
    new: dict[int, Tensor] = {}
    for t in g.tensors:
        if t.op is None:
            new[t.index] = h.new_input(t.dims[drop(t):], t.dtype)
            continue
        params = dict(t.params)
        if "dim" in params:
            params["dim"] = params["dim"] % len(t.dims) - drop(t)
        new[t.index] = h.apply(t.op, [new[a.index] for a in t.operands], **params)
    for t in g.outputs:
        h.mark_output(new[t.index])

    inputs = tuple(_reshaped(v, t.dims[drop(t):]) if drop(t) else v
                   for v, t in zip(traced.inputs, g.inputs, strict=True))
    return replace(traced, graph=h, inputs=inputs)


def _replayed(g: KernelGraph, dims: Callable[[Tensor], tuple[int, ...]],
              dim: Callable[[int], int]) -> KernelGraph | None:
    """``g``'s operators replayed on inputs of ``dims(t)``, a ``dim`` parameter ``d`` made
    ``dim(d)``: the program laid out again (a fold); None where a result's dims are not
    ``dims`` of the original's. An operator that refuses its operands raises its ``EMError``."""
    h = new_kernel_graph()
    new: dict[int, Tensor] = {}
    for t in g.tensors:
        if t.op is None:
            new[t.index] = h.new_input(dims(t), t.dtype)
            continue
        params = dict(t.params)
        if "dim" in params:
            params["dim"] = dim(params["dim"])
        out = h.apply(t.op, [new[a.index] for a in t.operands], **params)
        if out.dims != dims(t):
            return None
        new[t.index] = out
    for t in g.outputs:
        h.mark_output(new[t.index])
    return h


def _reshaped(v: InputView, dims: tuple[int, ...], *steps: Step) -> InputView:
    """Graph input ``v`` made of ``dims``: its last reshape (if any) replaced by ``steps`` and a
    reshape to ``dims``."""
    kept = v.steps[:-1] if v.steps and v.steps[-1][0] == "reshape" else v.steps
    return replace(v, steps=(*kept, *steps, ("reshape", (dims,))), dims=dims)


#: operators a row of a folded program may go through: elementwise ones, and these along the
#: last dim
_ALONG_LAST = {"reduction", "mean", "amax", "concat", "slice_last", "rms_norm", "div_count"}


def with_rows_folded(traced: TracedProgram) -> TracedProgram:
    """``traced`` with single rows folded into the matrices they share: grouped-query attention
    at decode, ``q (kv, g, 1, d) @ K (kv, 1, d, n)``, becomes ``q (kv, g, d) @ K (kv, d, n)``,
    the ``g`` query heads that share a key head the rows of one matrix product (the layout of
    the benchmarks' gqa program), and so on through the softmax and the product with ``V``.

    It applies where every tensor has one rank ``R >= 3`` and each is either a *row* (dim
    ``-2`` of size 1: dropped) or a *matrix* (a graph input read only as a matmul's right
    operand whose dim ``-3`` is 1, broadcast over the rows' dim ``-3``: dropped), every matmul
    takes a row on the left and a matrix on the right, and every other operator takes and
    gives rows, along their last dim where it has one (``_ALONG_LAST``); and where at least one
    matmul folds more than one row. Otherwise ``traced`` is returned as it is. Graph inputs get
    a reshape step; the outputs are reshaped back as before (``TracedProgram.fx_outputs``)."""
    g = traced.graph
    ranks = {len(t.dims) for t in g.tensors}
    if len(ranks) != 1 or (rank := ranks.pop()) < 3:
        return traced
    right = {t.operands[1].index for t in g.operators if t.op == "matmul"}
    matrix = {t.index for t in g.inputs if t.index in right and t.dims[-3] == 1}
    folds = False
    for t in g.operators:
        if t.op == "matmul":
            a, b = t.operands
            if a.index in matrix or b.index not in matrix or a.dims[-2] != 1:
                return traced
            folds = folds or a.dims[-3] > 1
            continue
        if any(o.index in matrix for o in t.operands) or t.op == "customized":
            return traced
        if "dim" in t.params and t.params["dim"] % rank != rank - 1:
            return traced
        if t.op not in _ALONG_LAST and "dim" in t.params:
            return traced
        if t.op == "rms_norm":
            shape = t.params["normalized_shape"]
            if not isinstance(shape, int) and len(shape) != 1:
                return traced
    rows = [t for t in g.tensors if t.index not in matrix]
    if not folds or any(t.dims[-2] != 1 for t in rows):
        return traced

    def dims(t: Tensor) -> tuple[int, ...]:
        return t.dims[:-3] + t.dims[-2:] if t.index in matrix else t.dims[:-2] + t.dims[-1:]

    h = _replayed(g, dims, lambda d: rank - 2)
    if h is None:
        return traced
    inputs = tuple(_reshaped(v, dims(t)) for v, t in zip(traced.inputs, g.inputs, strict=True))
    return replace(traced, graph=h, inputs=inputs)


#: a program whose batch fold copies inputs holds them to this share of its inputs' elements
COPY_SHARE = 1 / 16


def with_batch_folded(traced: TracedProgram, example_inputs: Sequence[Any]) -> TracedProgram:
    """``traced`` with its two leading dims merged into one: a batch of sequences' grouped-query
    attention at decode, ``q (b, kv, g, d) @ K (b, kv, d, n)`` after ``with_rows_folded``,
    becomes ``q (b·kv, g, d) @ K (b·kv, d, n)``, the batch one more run of the products' batch
    dim, and the search's problem the one it has at ``b = 1`` (its space follows the dimension
    classes: a leading dim of its own multiplies it).

    It applies where every tensor has one rank ``R >= 4``, no operator works along dim 0 or 1,
    both leading dims of the operators' results are the program's (``(B, H)``, both above 1)
    and its outputs are of the full leading size. An input with leading dims ``(1, 1)`` keeps a
    broadcast dim; one with ``(B, 1)`` or ``(1, H)`` (the attention's mask, one row per
    sequence, shared by the heads) is expanded and copied to ``(B·H)`` at every call (a
    ``reshape`` step after an ``expand``), which the fold takes only where the copies hold at
    most ``COPY_SHARE`` of the inputs' elements (a mask of ``n`` keys a head against
    ``2·d·n`` of K and V). Every other input's merge must be a view of its source (given by
    ``example_inputs``, the placeholders' values, and the attributes'): a transpose that puts
    the sequence between the two (``(b, n, h, d)`` read as ``(b, h, n, d)``) would be copied at
    every call, so the fold is not taken. Otherwise ``traced`` is returned as it is."""
    g = traced.graph
    ranks = {len(t.dims) for t in g.tensors}
    if len(ranks) != 1 or (rank := ranks.pop()) < 4:
        return traced
    lead = max((t.dims[:2] for t in g.operators), default=(1, 1))
    if min(lead) < 2 or any(t.dims[:2] != lead for t in [*g.operators, *g.outputs]):
        return traced
    for t in g.operators:
        if "dim" in t.params and t.params["dim"] % rank < 2:
            return traced
        if t.op == "rms_norm":
            shape = t.params["normalized_shape"]
            if not isinstance(shape, int) and len(shape) > rank - 2:
                return traced
    expanded = {t.index: t for t in g.inputs if t.dims[:2] not in (lead, (1, 1))}
    if any(t.dims[0] not in (1, lead[0]) or t.dims[1] not in (1, lead[1])
           for t in expanded.values()):
        return traced
    copied = sum(math.prod(lead) * math.prod(t.dims[2:]) for t in expanded.values())
    if copied > COPY_SHARE * sum(math.prod(t.dims) for t in g.inputs):
        return traced

    def dims(t: Tensor) -> tuple[int, ...]:
        return (1 if t.dims[:2] == (1, 1) else math.prod(lead), *t.dims[2:])

    try:
        h = _replayed(g, dims, lambda d: d % rank - 1)
    except EMError:
        return traced
    if h is None:
        return traced

    def folded(v: InputView, t: Tensor) -> InputView:
        if t.index in expanded:  # copied: the source's rows expanded over the merged dim
            return _reshaped(v, dims(t), ("reshape", (t.dims,)),
                             ("expand", ((*lead, *t.dims[2:]),)))
        return _reshaped(v, dims(t))

    inputs = tuple(folded(v, t) for v, t in zip(traced.inputs, g.inputs, strict=True))
    for v, t in zip(inputs, g.inputs, strict=True):
        if t.index in expanded:
            continue
        x = example_inputs[v.position] if v.kind == "placeholder" else traced.attributes[v.source]
        try:
            check_views(Source(v.source, v.kind, v.position, tuple(x.shape), tuple(x.stride()),
                               x.dtype), v.steps, "the batch fold")
        except UnsupportedOpError:
            return traced  # the merge would copy this input at every call
    return replace(traced, graph=h, inputs=inputs)


def is_aten(gm: Any) -> bool:
    """Whether every operator node of ``gm`` calls an aten overload (or ``operator.getitem``)."""
    import operator

    import torch

    return all(n.op in ("placeholder", "get_attr", "output") or (
        n.op == "call_function" and (isinstance(n.target, torch._ops.OpOverload)
                                     or n.target is operator.getitem)) for n in gm.graph.nodes)


def decompositions() -> Any:
    """torch.export's default decomposition table, less the aten operators whose rules have
    every op-table entry they need (those stay whole)."""
    import torch

    table = torch.export.default_decompositions()
    for name, rule in aten.RULES.items():
        if name.count(".") == 2 and all(aten.available(e) for e in rule.requires):
            namespace, op, overload = name.split(".")  # aten, or prims
            table.pop(getattr(getattr(getattr(torch.ops, namespace), op), overload), None)
    return table


def export_aten(fn_or_module: Any, example_inputs: Sequence[Any]) -> Any:
    """``fn_or_module`` exported to an fx graph module of aten operators (parameters and
    buffers are its attributes); an ``UnsupportedOpError`` of one line when export fails."""
    import torch

    module = fn_or_module if isinstance(fn_or_module, torch.nn.Module) else \
        _as_module(fn_or_module, len(example_inputs))
    what = getattr(fn_or_module, "__qualname__", type(fn_or_module).__name__)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ep = torch.export.export(module, tuple(example_inputs), strict=False)
            if not all(_mapped(n) for n in ep.graph.nodes):  # (decomposing takes a while)
                ep = ep.run_decompositions(decompositions())
            return ep.module(check_guards=False)
    except EMError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UnsupportedOpError(f"{what}: torch.export could not trace it: "
                                 f"{type(exc).__name__}: {first}", op="torch.export") from None


def _mapped(node: Any) -> bool:
    """Whether fx node ``node`` is no operator, or one whose rule has its op-table entries."""
    rule = aten.RULES.get(aten_name(node.target)) if node.op == "call_function" else None
    return node.op != "call_function" or (
        rule is not None and all(aten.available(e) for e in rule.requires))


def _as_module(fn: Any, count: int) -> Any:
    """Function ``fn`` as a module; its placeholders take ``fn``'s parameter names where its
    ``count`` inputs are plain positional parameters."""
    import inspect

    import torch

    if isinstance(fn, types.FunctionType):
        # torch.export keeps only the frames of functions named "forward" in a node's stack
        # trace: the same function under that name keeps the user's source lines
        code = fn.__code__.replace(co_name="forward", co_qualname="forward")
        renamed = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__,
                                     fn.__closure__)
        renamed.__kwdefaults__ = fn.__kwdefaults__
        fn = renamed

    class Function(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fn = fn

        def forward(self, *args: Any) -> Any:
            return self.fn(*args)

    module = Function()
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return module
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = list(sig.parameters.values())
    if len(params) == count and all(p.kind in plain and p.default is p.empty for p in params):
        def forward(*args: Any) -> Any:
            return fn(*args)

        forward.__signature__ = sig.replace(return_annotation=sig.empty)  # type: ignore[attr-defined]
        module.forward = forward  # type: ignore[method-assign]
    return module


def ensure_meta(gm: Any, example_inputs: Sequence[Any]) -> None:
    """Fake-tensor shapes on every node (``node.meta["val"]``) where some are missing."""
    if all(meta_of(n) is not None for n in gm.graph.nodes
           if n.op in ("placeholder", "call_function", "get_attr")):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    try:
        FakeTensorProp(gm, FakeTensorMode(allow_non_fake_inputs=True)).propagate(*example_inputs)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise UnsupportedOpError(f"trace_fx: shapes could not be propagated: "
                                 f"{type(exc).__name__}: {first}") from None


__all__ = ["DTYPES", "InputView", "OutputView", "TracedProgram", "UnsupportedDTypeError",
           "aten_name", "decompositions", "ensure_meta", "export_aten", "from_torch", "is_aten",
           "meta_of", "trace", "trace_fx", "user_line"]
