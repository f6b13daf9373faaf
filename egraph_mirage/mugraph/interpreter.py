"""The reference interpreter: a kernel graph or μGraph run by its literal semantics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import GraphError, ShapeError
from ..graph import KernelGraph
from ..ops import lookup


def run_reference(graph: KernelGraph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Float64 outputs of ``graph``: library operators by their numpy reference, graph-defined
    kernels block by block and iteration by iteration (``GraphDefinedKernel.run_blocks``)."""
    if len(inputs) != len(graph.inputs):
        raise GraphError(f"run_reference: graph has {len(graph.inputs)} inputs, got {len(inputs)}")
    vals: dict[int, np.ndarray] = {}
    for i, (t, x) in enumerate(zip(graph.inputs, inputs)):
        x = np.asarray(x, dtype=np.float64)
        if x.shape != t.dims:
            raise ShapeError(f"run_reference: input {i} has shape {x.shape}, expected {t.dims}")
        vals[t.index] = x
    done: dict[int, list[np.ndarray]] = {}  # kernel id -> its outputs, run once
    for t in graph.operators:
        args = [vals[o.index] for o in t.operands]
        if t.op == "customized":
            kernel = t.params["kernel"]
            if id(kernel) not in done:
                done[id(kernel)] = kernel.run_blocks(args)
            vals[t.index] = done[id(kernel)][t.params["output"]]
        else:
            vals[t.index] = lookup(t.op).reference(args, t.params)
    return [vals[t.index] for t in graph.outputs]
