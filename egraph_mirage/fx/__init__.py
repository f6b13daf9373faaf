"""From PyTorch to kernel graphs: tracing (``trace.py``) and partitioning (``pieces.py``).

    import egraph_mirage.fx as emfx
    g = emfx.from_torch(fn, x, w)                 # a KernelGraph at these shapes
    traced = emfx.trace_fx(gm, example_inputs)    # a TracedProgram: graph, input views, outputs
    parts = emfx.partition(gm, example_inputs)    # pieces the search can take, the rest eager

PyTorch is imported when these run; importing this package does not need it.
"""

from __future__ import annotations

from ..errors import UnsupportedOpError
from .aten import RULES, Rule
from .pieces import Partitioned, Piece, partition
from .trace import (
    InputView,
    OutputView,
    TracedProgram,
    UnsupportedDTypeError,
    from_torch,
    trace,
    trace_fx,
)

__all__ = ["RULES", "InputView", "OutputView", "Partitioned", "Piece", "Rule", "TracedProgram",
           "UnsupportedDTypeError", "UnsupportedOpError", "from_torch", "partition", "trace",
           "trace_fx"]
