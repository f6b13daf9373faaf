"""The rest of a graph: what the backend hands Inductor (or runs as is), the replaced pieces
among it, with the metadata Dynamo gave the graph carried over."""

from __future__ import annotations

import copy
import functools
import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import inductor_timing as timing
from .inductor_tuning import tuned_compile
from .runtime import PieceCall, counters_last, inductor_launches, piece_calls


def compile_rest(module: Any, example_inputs: Sequence[Any], rest: str, mode: str | None,
          dynamo: Any = None) -> Callable[..., Any]:
    """``module`` compiled by Inductor (its first call tunes Inductor's kernels:
    ``inductor_tuning``), or as is for ``rest="eager"``. ``dynamo``: the graph
    Dynamo handed the backend, when ``module`` is another over the same inputs (its pieces
    replaced), whose metadata Inductor is given (``as_dynamo_s``)."""
    if rest == "eager":
        return module
    source = module if dynamo is None else dynamo
    # a plain GraphModule: torch.export's module carries a lambda that Inductor's cache of
    # compiled graphs cannot pickle
    graph = module.graph if dynamo is None else flat_graph(module.graph)
    module = torch.fx.GraphModule(module, graph)
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = dict(list_mode_options(mode)) if mode not in (None, "default") else {}
    calls = piece_calls([module])
    own: list[str] = []
    if calls:
        # Inductor's on-disk caches of compiled graphs would key on our ops by name only (and
        # cannot pickle their implementations): off for graphs that call them. Where Inductor
        # launches every piece's kernels, the graph it compiles holds ``wrap_triton`` calls
        # instead (``inlined``), which its caches key on the kernels' source and constants: a
        # second compilation of the graph finds it there
        if inductor_launches(calls) and all(c.by_inductor for c in calls):
            module, own = inlined(module)
        else:
            patches["fx_graph_cache"] = False
        patches.update(timing.ours_launched_patches())  # their launches as cheap as Inductor's
    module = as_dynamo_s(module, source, own)
    # its first call tunes Inductor's kernels, each config timed as the GPU runs it
    return tuned_compile(lambda: compile_fx(module, list(example_inputs),
                                            config_patches=patches or None))


def inlined(module: Any) -> tuple[Any, list[str]]:
    """A copy of ``module`` whose graph calls none of its replaced pieces' modules
    (``PieceCall``, each with an Inductor launch): each call is traced (``make_fx`` on fake
    tensors of its inputs' sizes, strides and dtypes) into the graph's own nodes: the views as
    aten operators, each kernel a ``triton_kernel_wrapper_mutation``, its counters
    (``PieceCall.counters``) a buffer of the copy. AOTAutograd's cache of compiled graphs
    keys on the module Dynamo's graph becomes, and cannot key on one that holds a piece's
    operator (its ``torch.library`` registration cannot be pickled): a second compilation of
    the graph then traced and compiled it all again (24 s of a 33 s recompile of an 8-layer
    Llama decode step, H200). A submodule whose own graph calls pieces (a refined piece, its
    parts replaced) is replaced by such a copy of itself. Returns the copy and the names of
    the counters buffers. A call whose inputs carry no recorded sizes, whose outputs are used
    other than by index, or whose launch cannot be traced on fake tensors is left as it is
    (Inductor traces it then, or says why not)."""
    import operator

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = torch.fx.GraphModule(module, copy.deepcopy(module.graph))
    graph, own = gm.graph, []
    for node in list(graph.nodes):
        call = gm.get_submodule(node.target) if node.op == "call_module" else None
        if (isinstance(call, torch.fx.GraphModule) and "." not in node.target
                and piece_calls([call])):  # a refined piece: its parts replaced
            inner, held = inlined(call)
            setattr(gm, node.target, inner)
            own += [f"{node.target}.{name}" for name in held]
            continue
        if not isinstance(call, PieceCall) or call.inductor_launch is None:
            continue
        vals = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
        if node.kwargs or any(isinstance(a, torch.fx.Node) and not isinstance(v, torch.Tensor)
                              for a, v in zip(node.args, vals, strict=True)) or not all(
                u.target is operator.getitem and isinstance(u.args[1], int) for u in node.users):
            continue
        xs = [_stand_in(v) if isinstance(v, torch.Tensor) else v for v in vals]
        launch, args = call.inductor_launch, list(node.args)
        if call.counters is not None:
            xs.append(call.counters)
            launch = counters_last(launch)
        if call.returned:  # the caches it writes, returned in their places
            launch = functools.partial(_assembled, call, launch)
        try:
            traced = make_fx(launch, tracing_mode="fake")(*xs)
        except Exception:  # left to Inductor's own tracing, which reports it
            continue
        if call.counters is not None:
            name = f"{node.target}_counters"
            gm.register_buffer(name, call.counters, persistent=False)
            own.append(name)
            with graph.inserting_before(node):
                args.append(graph.get_attr(name))
        env: dict[Any, Any] = dict(zip([n for n in traced.graph.nodes if n.op == "placeholder"],
                                       args, strict=True))
        with graph.inserting_before(node):
            for n in traced.graph.nodes:
                if n.op == "get_attr":  # a constant of the piece (a tensor it was traced with)
                    name = f"{node.target}_{n.target}"
                    setattr(gm, name, getattr(traced, n.target))
                    env[n] = graph.get_attr(name)
                elif n.op == "output":
                    outs = n.args[0]
                elif n.op != "placeholder":
                    env[n] = graph.node_copy(n, lambda a: env[a])
        for user in list(node.users):
            user.replace_all_uses_with(env[outs[user.args[1]]])
            graph.erase_node(user)
        graph.erase_node(node)
        gm.delete_submodule(node.target)
    graph.lint()
    gm.recompile()
    _hashed_without_kernel_indices(gm)
    return gm, own


def _assembled(call: PieceCall, launch: Any, *xs: Any) -> tuple[Any, ...]:
    """``call``'s outputs from its Inductor ``launch`` on ``xs`` (``PieceCall.assembled``)."""
    return call.assembled(launch(*xs), xs)


def _stand_in(v: Any) -> Any:
    """An empty tensor of recorded value ``v``'s sizes, strides, dtype and device (sizes that
    the export of a refined piece's parts holds as symbols taken by their values)."""
    return torch.empty_strided([int(d) for d in v.shape], [int(d) for d in v.stride()],
                               dtype=v.dtype, device=v.device)


#: a kernel's and its constants' positions in torch's side table, in a graph's code
_SIDE_TABLE_INDEX = re.compile(r"\b(kernel_idx|constant_args_idx) = \d+")


def _hashed_without_kernel_indices(gm: Any) -> None:
    """Pickles ``gm`` (its class is its own: ``GraphModule.__new__``) with the side-table
    positions of its kernels and their constants left out of its code (``kernel_idx = None``:
    unpickled, it cannot launch a wrong kernel). AOTAutograd's cache key pickles Dynamo's
    graph; the positions depend on the order kernels were traced in this process (the
    search's timings trace theirs first), so the same graph got another key at every
    compilation. The key holds each kernel's source and constants besides (Inductor's
    ``FxGraphHashDetails``), as Inductor's own cache of compiled graphs keys on them."""

    def reduce(self: Any) -> Any:
        fn, (data, imports) = torch.fx.GraphModule.__reduce__(self)
        data = {**data, "_code": _SIDE_TABLE_INDEX.sub(r"\1 = None", data["_code"])}
        return fn, (data, imports)

    type(gm).__reduce__ = reduce


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


def as_dynamo_s(module: Any, dynamo: Any, own: Sequence[str] = ()) -> Any:
    """``module`` with the metadata by which Inductor knows a graph of Dynamo's (``dynamo``'s
    ``meta``, its parameters' sources, each input's source and recorded tensor attributes, by
    position), where both have as many inputs. From these Inductor reads which inputs have
    static addresses (parameters, and buffers marked so, as transformers' static cache is):
    without them a graph that writes such an input in place runs without CUDA graphs under
    ``mode="reduce-overhead"`` ("skipping cudagraphs due to mutated inputs"). The pieces' own
    buffers (``PieceCall.counters``, and ``own``: the module's own buffers that hold them,
    ``inlined``), which no source of Dynamo's names, get a source each (``ConstantSource``),
    so that Inductor takes them as the static inputs they are."""
    from torch._dynamo.source import ConstantSource

    ours = [n for n in module.graph.nodes if n.op == "placeholder"]
    theirs = [n for n in dynamo.graph.nodes if n.op == "placeholder"]
    if len(ours) != len(theirs):
        return module
    for key, value in dynamo.meta.items():
        module.meta.setdefault(key, value)
    sources = getattr(dynamo, "_param_name_to_source", None)
    pieces = {f"{name}.counters" for name, m in module.named_modules()
              if isinstance(m, PieceCall) and m.counters is not None} | set(own)
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


__all__ = ["as_dynamo_s", "compile_rest", "flat_graph", "inlined"]
