"""What tracing produces (``TracedProgram``) and the facts about fx nodes it reads.

A ``TracedProgram`` holds the kernel graph and how to call it in the fx program's place: for
each graph input, the program tensor it views and the torch views that make it (``InputView``);
for each program output, which graph output holds it (``OutputView``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..dtypes import DType
from ..errors import DTypeError, UnsupportedOpError
from ..graph import KernelGraph, Tensor
from .views import Shape, Step, apply_steps

#: torch dtype names and the graph dtypes they become
DTYPES = {"float16": DType.float16, "bfloat16": DType.bfloat16, "float32": DType.float32}
#: frames of these folders are not the user's source line
_NOT_USER = (str(Path(__file__).resolve().parent), "/torch/", "/torch_")


class UnsupportedDTypeError(UnsupportedOpError, DTypeError):
    """A program tensor has a dtype no kernel graph takes (float16, bfloat16, float32 only)."""


@dataclass(frozen=True)
class InputView:
    """One graph input: the fx program tensor it views and the torch views that make it."""

    source: str  # the placeholder's name, or the attribute's dotted path (``lin.weight``)
    kind: str  # "placeholder" | "attribute"
    position: int  # index among the fx graph's placeholders; -1 for an attribute
    steps: tuple[Step, ...]  # torch views applied in order (``views.apply_steps``)
    dims: tuple[int, ...]
    dtype: DType

    def apply(self, value: Any) -> Any:
        """The graph input from the source tensor ``value``: views, except a broadcast input
        of a batch fold (``trace.with_batch_folded``), copied."""
        return apply_steps(value, self.steps)


@dataclass(frozen=True)
class OutputView:
    """One output of the fx program: which graph output holds it, and its torch shape and dtype
    (the graph output reshaped, a view of a contiguous tensor, and cast)."""

    value: str  # the fx node's name
    index: int  # index into ``graph.outputs``
    shape: tuple[int, ...]
    dtype: str  # torch dtype name


@dataclass(frozen=True)
class CacheWrite:
    """A traced piece's write: graph output ``output`` (a value of ``shape``, in its torch
    layout) into placeholder ``dest`` along ``dim`` at the positions placeholder ``index``
    holds; the piece's module returns the written ``dest`` at ``returned_at`` among its
    outputs (None: it does not)."""

    output: int
    shape: tuple[int, ...]
    dest: int
    index: int
    dim: int
    returned_at: int | None


@dataclass(frozen=True)
class TracedProgram:
    """A kernel graph traced from an fx program, and how to call it in the program's place."""

    graph: KernelGraph
    placeholders: tuple[str, ...]  # the fx graph's placeholders, in order
    inputs: tuple[InputView, ...]  # one per graph input, in order
    outputs: tuple[OutputView, ...]  # one per fx output, in order
    attributes: Mapping[str, Any]  # values of attribute sources at trace time
    #: graph outputs the program also writes into its inputs (a static cache's new token:
    #: ``fx.cache_writes``); those not returned by the fx program are not among ``outputs``
    writes: tuple[CacheWrite, ...] = ()

    def graph_inputs(self, *args: Any, attributes: Mapping[str, Any] | None = None) -> list[Any]:
        """The graph's inputs (torch tensors) from the placeholders' values ``args`` and the
        attribute sources' (default: their values at trace time)."""
        attrs = self.attributes if attributes is None else attributes
        return [v.apply(args[v.position] if v.kind == "placeholder" else attrs[v.source])
                for v in self.inputs]

    def fx_outputs(self, results: Sequence[Any]) -> tuple[Any, ...]:
        """The fx program's outputs from the graph's outputs (torch tensors)."""
        import torch

        return tuple(results[o.index].reshape(o.shape).to(getattr(torch, o.dtype))
                     for o in self.outputs)

    def reference(self, *args: Any) -> tuple[Any, ...]:
        """The program's outputs computed by the kernel graph's float64 reference
        (``KernelGraph.evaluate``) from the placeholders' values ``args``."""
        import torch

        ins = [x.detach().cpu().double().numpy() for x in self.graph_inputs(*args)]
        return self.fx_outputs([torch.from_numpy(np.ascontiguousarray(o))
                                for o in self.graph.evaluate(ins)])


@dataclass(frozen=True)
class Computed:
    """An fx value held by a graph tensor: the tensor reshaped to torch shape ``shape``."""

    tensor: Tensor
    shape: Shape
    dtype: Any  # torch dtype


def aten_name(target: Any) -> str:
    """``aten.mm.default`` for ``torch.ops.aten.mm.default``; the target's name otherwise."""
    return str(target) if hasattr(target, "overloadpacket") else \
        getattr(target, "__name__", str(target))


def user_line(node: Any) -> str | None:
    """``file:line: code`` of the innermost user frame of fx node ``node``'s stack trace."""
    text = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n?([^\n]*)', text)
    for file, line, code in reversed(frames):
        if not any(part in file for part in _NOT_USER):
            return f"{file}:{line}: {code.strip()}" if code.strip() else f"{file}:{line}"
    return None


def meta_of(node: Any) -> Any:
    """The fake tensor (or value) fx recorded for ``node``; None when it recorded none."""
    return node.meta.get("val", node.meta.get("example_value"))
