"""The bandwidth floor: the time the bytes that must cross device memory take at copy speed.

At the benchmarks' batch sizes every program is memory-bound, so no version can run much faster
than reading each input once and writing each output once at the device's copy bandwidth.
The bandwidth is measured once per run (``measure_copy_bandwidth``) and handed around in a
``Floor``; nothing is cached behind the caller's back.

The floor of a whole torch module's call (``module_call_bytes``: what it reads of its
parameters and buffers, its inputs and its outputs) serves ``bench torch``'s decode steps.

What a particular μGraph moves (intermediates, re-read tiles) is the cost model's business:
``lower.cost_model.ProgramCost.traffic_bytes``, the one no-GPU estimate of traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..graph import KernelGraph, Tensor


def tensor_bytes(t: Tensor) -> int:
    return math.prod(t.dims) * t.dtype.itemsize


def io_bytes(g: KernelGraph) -> int:
    """Bytes that must cross device memory: every input read once, every output written once."""
    return sum(tensor_bytes(t) for t in g.inputs) + sum(tensor_bytes(t) for t in g.outputs)


def module_call_bytes(module: Any, inputs: Sequence[Any]) -> int:
    """Bytes that must cross device memory for one call ``module(*inputs)`` (run here once,
    eagerly, without gradients), each tensor counted whole and once (by its storage):

    * every parameter and buffer of ``module`` the call reads: those passed to some operator
      (recorded at the dispatcher); one the call never touches (a buffer only another
      configuration uses) is not counted;
    * every tensor of ``inputs``, read;
    * every tensor the call returns, written.

    Not counted: intermediates (a perfect program keeps them on chip), and a tensor written in
    place (a static KV cache's new slot) beyond the output that holds the same values. For a
    decode step (``bench torch``): the layer's weights, the KV cache the step attends over (the
    past keys and values passed in), the new token's activations, and its output and new keys
    and values."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    touched: set[int] = set()

    class _Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            touched.update(t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                           if isinstance(t, torch.Tensor))
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Reads():
        outputs = module(*inputs)
    state = [t for t in (*module.parameters(), *module.buffers())
             if t.untyped_storage().data_ptr() in touched]
    counted: dict[int, int] = {}
    for t in (*state, *tree_leaves(tuple(inputs)), *tree_leaves(outputs)):
        if isinstance(t, torch.Tensor):
            counted.setdefault(t.untyped_storage().data_ptr(), t.numel() * t.element_size())
    return sum(counted.values())


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
