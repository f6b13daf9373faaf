"""μGraphs: kernel graphs whose operators may be graph-defined kernels (thread-block graphs)."""

from typing import Any

from .accumulators import ACCUMULATORS, Accumulator, lookup_accumulator
from .kernel import GraphDefinedKernel
from .threadblock import BlockTensor, ThreadBlockGraph, new_threadblock_graph

__all__ = [
           "ACCUMULATORS",
           "Accumulator",
           "BlockTensor",
           "GraphDefinedKernel",
           "ThreadBlockGraph",
           "lookup_accumulator",
           "new_threadblock_graph",
]


def __getattr__(name: str) -> Any:
    """``GraphKernel``: the former name of ``GraphDefinedKernel`` (deprecated)."""
    from . import kernel

    return getattr(kernel, name)
