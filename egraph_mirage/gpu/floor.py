"""The bandwidth floor: the time the bytes that must cross device memory take at copy speed.

At the benchmarks' batch sizes every program is memory-bound, so no version can run much faster
than reading each input once and writing each output once at the device's copy bandwidth.
The bandwidth is measured once per run (``measure_copy_bandwidth``) and handed around in a
``Floor``; nothing is cached behind the caller's back.

What a particular μGraph moves (intermediates, re-read tiles) is the cost model's business:
``lower.cost_model.ProgramCost.traffic_bytes``, the one no-GPU estimate of traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..graph import KernelGraph, Tensor


def tensor_bytes(t: Tensor) -> int:
    return math.prod(t.dims) * t.dtype.itemsize


def io_bytes(g: KernelGraph) -> int:
    """Bytes that must cross device memory: every input read once, every output written once."""
    return sum(tensor_bytes(t) for t in g.inputs) + sum(tensor_bytes(t) for t in g.outputs)


def measure_copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), median of runs."""
    import torch
    import triton.testing

    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * nbytes / (float(ms) * 1e-3)


@dataclass(frozen=True)
class Floor:
    """The floor of programs at one measured bandwidth (bytes/s)."""

    bandwidth: float

    def us(self, g: KernelGraph) -> float:
        return io_bytes(g) / self.bandwidth * 1e6
