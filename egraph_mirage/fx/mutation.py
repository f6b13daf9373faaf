"""Inputs a graph writes in place, kept as they were while the backend compiles it.

Dynamo hands the backend a graph whose inputs include the model's own state: a static KV
cache (written with ``index_copy_`` or a slice assignment), a step counter (``add_``), and
``example_inputs`` are those very tensors. Compiling runs the graph on them more than once (the
partition records each piece's inputs, the pieces' checks, the check and timing of the graph
with its pieces replaced), and each run would write the model's state again: a cache position
written twice, a counter advanced by every timing. ``preserved(gm, example_inputs)`` copies the
inputs the graph may write (``written``) before and writes the copies back after, so that a
compilation leaves the model's state as the compiled call then finds it, the tensors themselves
unchanged (a CUDA graph recorded on them keeps their addresses).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import torch


def written(gm: torch.fx.GraphModule) -> set[int]:
    """Indices of ``gm``'s placeholders that an in-place operation of ``gm`` may write: the
    first operand of an in-place method (``add_``, ``index_copy_``, ``copy_``; a name ending in
    one ``_``), of an item assignment (``operator.setitem``) or of an operator whose schema
    writes it, or an operand a submodule writes (a piece's module writing a static cache, or
    its replacement: ``written_inputs``), followed back through whatever it was computed from
    to the placeholders (a view of an input writes the input; following every first operand
    is on the safe side)."""
    places = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    out: set[int] = set()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            sub = gm.get_submodule(node.target)
            inner = (written(sub) if isinstance(sub, torch.fx.GraphModule)
                     else getattr(sub, "written_inputs", ()))
            starts = [node.args[i] for i in inner if i < len(node.args)]
        elif node.op in ("call_method", "call_function") and node.args and _writes_first(node):
            starts = [node.args[0]]
        else:
            continue
        seen: set[Any] = set()
        todo = list(starts)
        while todo:
            n = todo.pop()
            if not isinstance(n, torch.fx.Node) or n in seen:
                continue
            seen.add(n)
            if n.op == "placeholder":
                out.add(places[n])
            elif n.op in ("call_method", "call_function") and n.args:
                todo.append(n.args[0])
    return out


def _writes_first(node: torch.fx.Node) -> bool:
    """Whether ``node`` writes its first operand in place."""
    target = node.target
    if target is operator.setitem:
        return True
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__"):
        return True
    schema = getattr(target, "_schema", None)
    if schema is not None and schema.arguments:
        alias = schema.arguments[0].alias_info
        return bool(alias is not None and alias.is_write)
    return False


Saved = list[tuple[torch.Tensor, torch.Tensor]]


def saved(inputs: Sequence[Any], writes: Collection[int], integers_only: bool = False) -> Saved:
    """(tensor, copy) of each of ``inputs`` at the positions ``writes`` (``written``); with
    ``integers_only``, of those of an integer dtype alone (a position counter, not a cache)."""
    return [(x, x.detach().clone()) for i, x in enumerate(inputs)
            if i in writes and isinstance(x, torch.Tensor)
            and not (integers_only and x.is_floating_point())]


def set_back(state: Saved) -> None:
    """Each tensor of ``state`` (``saved``) written back from its copy, in place."""
    with torch.no_grad():
        for x, copy in state:
            x.copy_(copy)


@contextlib.contextmanager
def preserved(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Iterator[None]:
    """The inputs ``gm`` may write (``written``) copied on entry and written back on exit."""
    state = saved(example_inputs, written(gm))
    try:
        yield
    finally:
        set_back(state)


__all__ = ["Saved", "preserved", "saved", "set_back", "written"]
