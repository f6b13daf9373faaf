"""Lowering of μGraphs to Triton: every graph-defined kernel becomes one ``@triton.jit`` kernel,
library operators become torch calls, and a host function ``run`` launches them in order.

    source = generate_source(graph)                  # the program's Python source
    write_program(graph, "program.py")               # the same, written atomically
    fn = compile_graph(graph, num_warps=4, num_stages=2)
    outputs = fn(*torch_tensors)                     # a list of tensors
    lowering_stages(graph)                           # each named stage's artefact, in order

``em.generate_triton_program`` and ``em.compile`` delegate here. Nothing in this
package imports egglog or JAX, and triton / torch are imported only when a program is compiled.
See ``docs/lowering.md`` for the mapping.
"""

from __future__ import annotations

from .accumulate import ACCUMULATOR_EMISSIONS, AccumulatorEmission
from .compile import CompiledGraph, compile_graph, use_interpreter
from .kernel_codegen import DotConfig, kernel_source
from .tile_context import TileContext
from .triton_program import (
    KNOBS,
    LowerOptions,
    canonical_knobs,
    generate_source,
    graph_knobs,
    lowering_stages,
    options_from,
    write_program,
)

__all__ = [
    "ACCUMULATOR_EMISSIONS",
    "KNOBS",
    "AccumulatorEmission",
    "CompiledGraph",
    "DotConfig",
    "LowerOptions",
    "TileContext",
    "canonical_knobs",
    "compile_graph",
    "generate_source",
    "graph_knobs",
    "kernel_source",
    "lowering_stages",
    "options_from",
    "use_interpreter",
    "write_program",
]
