"""μGraphs: kernel graphs whose operators may be graph-defined kernels (thread-block graphs)."""

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

