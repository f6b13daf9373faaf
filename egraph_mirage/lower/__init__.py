"""Lowering of μGraphs to Triton kernels.

This package is where every graph-defined kernel becomes one ``@triton.jit`` kernel; it is built on
top of the μGraph IR and is not populated yet. Nothing here imports egglog or JAX, so the GPU side
can run without them.
"""
