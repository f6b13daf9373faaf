"""A cost model for μGraphs: estimated time from bytes through device memory and launches.

This is the one no-GPU model of a μGraph's device-memory traffic and time: the search ranks its
results with it, and ``rank.measured.rank`` orders candidates by it where no GPU times them. (The
bandwidth floor, ``gpu.floor.io_bytes``, is another quantity: the bytes any version must move,
each input read once and each output written once.)

Every kernel pays a launch, except a combine the lowering runs inside the kernel before it
(``lower.fuse``, the default: ``fused_combines``); a graph-defined kernel reads each loader's
tiles once per block and
loop iteration (a replicated input is read by every block) and writes its outputs once; a library
operator reads its operands and writes its result. A grid of fewer blocks than the GPU has
multiprocessors reaches only that fraction of the bandwidth, which is why small-batch programs
gain from splitting a reduction across the grid. A kernel also computes: its block operators run
once per block (and per loop iteration on the loop's side), matmuls on tensor cores with each
matrix dimension padded to 16 (batch dimensions are not padded: they run one after another), the
rest element by element; a library matmul computes the same way. A kernel takes the longer of its
memory and its compute time (a grid that recomputes a product in every block is not free). Rough
by design: measured GPU time replaces it where a GPU is present (``superoptimize(...,
profile=True)``, ``rank.measured.rank`` with a tuner).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..graph import KernelGraph
from ..mugraph.threadblock import LOOP_SIDE
from . import fuse


def _pad(d: int) -> int:
    """A matmul dimension as tensor cores take it: at least 16."""
    return max(16, d)


@dataclass(frozen=True)
class ProgramCost:
    """Constants of the estimate (defaults: about an H100/H200)."""

    bandwidth: float = 3.0e12  # bytes per second
    launch_seconds: float = 3.0e-6
    multiprocessors: int = 132
    matmul_flops: float = 4.0e14  # fp16 tensor-core FLOP/s, whole GPU
    vector_flops: float = 3.0e13  # element-wise operations per second, whole GPU
    #: price split plans as the lowering runs them by default: a combine fused into its
    #: producer (``lower.fuse``) is no launch of its own
    fused_combines: bool = True

    def compute_seconds(self, tb: Any) -> float:
        """Time the whole grid of block graph ``tb`` spends computing, at full occupancy."""
        blocks = math.prod(tb.grid_dim)
        mm = vec = 0.0
        for b in tb.tensors:
            if b.op == "input":
                continue
            times = blocks * (tb.forloop_range if b.side == LOOP_SIDE else 1)
            if b.op == "matmul":
                mm += times * self.matmul_flop(b.operands[0].dims, b.operands[1].dims)
            else:
                vec += times * math.prod(b.dims)
        return mm / self.matmul_flops + vec / self.vector_flops

    @staticmethod
    def matmul_flop(a: tuple[int, ...], w: tuple[int, ...]) -> int:
        """Tensor-core work of ``a @ w``: the batch dimensions run one after another, only the
        matrix dimensions (M, K, N) are padded to 16."""
        batch = math.prod(max(x, y) for x, y in zip(a[:-2], w[:-2]))
        return 2 * batch * math.prod(_pad(d) for d in (a[-2], a[-1], w[-1]))

    def kernels(self, g: KernelGraph) -> list[tuple[str, int, int]]:
        """(kind, bytes, blocks) per kernel launch, in order."""
        out: list[tuple[str, int, int]] = []
        for t in g.operators:
            if t.op == "customized":
                kernel = t.params["kernel"]
                if t.params["output"]:
                    continue  # one launch writes all outputs of a kernel
                tb = kernel.tb
                blocks = math.prod(tb.grid_dim)
                moved = 0
                for ld in tb.inputs:
                    reads = tb.forloop_range if ld.params["forloop_dim"] != -1 else 1
                    moved += math.prod(ld.dims) * ld.dtype.itemsize * blocks * reads
                for i in range(kernel.num_outputs):
                    moved += math.prod(kernel.output_dims(i)) * tb.outputs[i][0].dtype.itemsize
                out.append(("kernel", moved, blocks))
            else:
                moved = sum(math.prod(o.dims) * o.dtype.itemsize for o in t.operands)
                moved += math.prod(t.dims) * t.dtype.itemsize
                out.append((t.op, moved, self.multiprocessors))
        return out

    def traffic_bytes(self, g: KernelGraph) -> int:
        """Bytes all kernels of ``g`` move through device memory (the sum over ``kernels``)."""
        return sum(moved for _, moved, _ in self.kernels(g))

    def seconds(self, g: KernelGraph) -> float:
        """Estimated run time of ``g``: per launch, the longer of moving its bytes and computing,
        each at the share of the GPU its blocks occupy."""
        total = 0.0
        launches = [t for t in g.operators
                    if not (t.op == "customized" and t.params["output"])]
        fused = ({id(c.consumer) for c in fuse.plan(g).values()} if self.fused_combines
                 else set())
        for t, (_, moved, blocks) in zip(launches, self.kernels(g)):
            share = min(1.0, blocks / self.multiprocessors)
            if t.op == "customized":
                compute = self.compute_seconds(t.params["kernel"].tb)
            elif t.op == "matmul":  # a library matmul computes too
                compute = (self.matmul_flop(t.operands[0].dims, t.operands[1].dims)
                           / self.matmul_flops)
            else:
                compute = 0.0
            fused_here = t.op == "customized" and id(t.params["kernel"]) in fused
            launch = 0.0 if fused_here else self.launch_seconds
            total += launch + max(moved / self.bandwidth, compute) / share
        return total

    def launches(self, g: KernelGraph) -> int:
        """Kernels of ``g`` (a fused combine counts as a kernel of its own)."""
        return len(self.kernels(g))
