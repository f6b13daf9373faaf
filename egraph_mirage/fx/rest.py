"""The rest of a graph: what the backend hands Inductor (or runs as is), the replaced pieces
among it, with the metadata Dynamo gave the graph carried over."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import inductor_timing as timing
from .runtime import PieceCall, inductor_launches, piece_calls


def compile_rest(module: Any, example_inputs: Sequence[Any], rest: str, mode: str | None,
          dynamo: Any = None) -> Callable[..., Any]:
    """``module`` compiled by Inductor, or as is for ``rest="eager"``. ``dynamo``: the graph
    Dynamo handed the backend, when ``module`` is another over the same inputs (its pieces
    replaced), whose metadata Inductor is given (``as_dynamo_s``)."""
    if rest == "eager":
        return module
    source = module if dynamo is None else dynamo
    # a plain GraphModule: torch.export's module carries a lambda that Inductor's cache of
    # compiled graphs cannot pickle
    graph = module.graph if dynamo is None else flat_graph(module.graph)
    module = as_dynamo_s(torch.fx.GraphModule(module, graph), source)
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = dict(list_mode_options(mode)) if mode not in (None, "default") else {}
    calls = piece_calls([module])
    if calls:
        # Inductor's on-disk cache of compiled graphs would key on our ops by name only (and
        # cannot pickle their implementations): off for graphs that call them. Where Inductor
        # launches every piece's kernels, the graph it compiles holds ``wrap_triton`` calls
        # instead, which its cache keys on the kernels' source and constants: a second
        # compilation of the graph finds it there
        if not (inductor_launches(calls) and all(c.by_inductor for c in calls)):
            patches["fx_graph_cache"] = False
        patches.update(timing.ours_launched_patches())  # their launches as cheap as Inductor's
    return compile_fx(module, list(example_inputs), config_patches=patches or None)


def flat_graph(graph: Any) -> Any:
    """``graph``, or where its code flattens its inputs and unflattens its outputs by pytree
    specs at every call (``torch.export``'s modules, which the partition's is: their
    ``_PyTreeCodeGen``) and both are flat (positional inputs, a tuple or list of outputs, as
    Dynamo's graphs take and give them), a copy whose code takes and gives them as they are.
    Inductor's code for a graph of the first kind flattens and unflattens too, in Python at
    every call: on a decode step of 2 small Llama layers (62 inputs) 267 more Python calls
    per call than for Dynamo's graph, host time that plain launches pay."""
    from torch.fx.graph import CodeGen, _PyTreeCodeGen
    from torch.utils import _pytree as pytree

    codegen = graph._codegen
    if not isinstance(codegen, _PyTreeCodeGen):
        return graph
    ins = sum(n.op == "placeholder" for n in graph.nodes)
    outs = len(pytree.tree_leaves(graph.output_node().args[0]))
    info = codegen.pytree_info
    flat_in = info.in_spec is None or pytree.tree_unflatten(
        list(range(ins)), info.in_spec) == (tuple(range(ins)), {})
    flat_out = info.out_spec is None or pytree.tree_unflatten(
        list(range(outs)), info.out_spec) in (tuple(range(outs)), list(range(outs)))
    if not (flat_in and flat_out):
        return graph
    flat = copy.deepcopy(graph)
    flat._codegen = CodeGen()
    return flat


def as_dynamo_s(module: Any, dynamo: Any) -> Any:
    """``module`` with the metadata by which Inductor knows a graph of Dynamo's (``dynamo``'s
    ``meta``, its parameters' sources, each input's source and recorded tensor attributes, by
    position), where both have as many inputs. From these Inductor reads which inputs have
    static addresses (parameters, and buffers marked so, as transformers' static cache is):
    without them a graph that writes such an input in place runs without CUDA graphs under
    ``mode="reduce-overhead"`` ("skipping cudagraphs due to mutated inputs"). The pieces' own
    buffers (``PieceCall.counters``, which no source of Dynamo's names) get a source each
    (``ConstantSource``), so that Inductor takes them as the static inputs they are."""
    from torch._dynamo.source import ConstantSource

    ours = [n for n in module.graph.nodes if n.op == "placeholder"]
    theirs = [n for n in dynamo.graph.nodes if n.op == "placeholder"]
    if len(ours) != len(theirs):
        return module
    for key, value in dynamo.meta.items():
        module.meta.setdefault(key, value)
    sources = getattr(dynamo, "_param_name_to_source", None)
    pieces = {f"{name}.counters" for name, m in module.named_modules()
              if isinstance(m, PieceCall) and m.counters is not None}
    held = itertools.chain(module.named_parameters(), module.named_buffers())
    if sources is not None and all(name in sources or name in pieces for name, _ in held):
        module._param_name_to_source = {
            **sources, **{name: ConstantSource(f"egraph_mirage:{name}") for name in pieces}}
    for a, b in zip(theirs, ours):
        if hasattr(a, "_dynamo_source"):
            b._dynamo_source = a._dynamo_source
        if "tensor_dict" in a.meta:
            b.meta.setdefault("tensor_dict", a.meta["tensor_dict"])
    return module


__all__ = ["as_dynamo_s", "compile_rest", "flat_graph"]
