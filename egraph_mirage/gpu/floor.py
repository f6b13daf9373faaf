"""The bandwidth floor: the time the bytes that must cross device memory take at copy speed.

At the benchmarks' batch sizes every program is memory-bound, so no version can run much faster
than reading each input once and writing each output once at the device's copy bandwidth.
The bandwidth is measured once per run (``measure_copy_bandwidth``) and handed around in a
``Floor``; nothing is cached behind the caller's back.
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


def traffic_bytes(g: KernelGraph) -> int:
    """Bytes a program moves if each kernel reads its operands and writes its results once.

    Every operator of a plain kernel graph is one kernel; the outputs of one graph-defined kernel
    share their launch, so the kernel's operands count once. A static estimate for ranking
    μGraphs where no GPU can time them (fewer bytes first).
    """
    kernels: dict[int, tuple[set[int], set[int]]] = {}
    for t in g.operators:
        key = id(t.params["kernel"]) if "kernel" in t.params else id(t)
        reads, writes = kernels.setdefault(key, (set(), set()))
        reads.update(o.index for o in t.operands)
        writes.add(t.index)
    total = 0
    for reads, writes in kernels.values():
        total += sum(tensor_bytes(g.tensors[i]) for i in reads | writes)
    return total


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
