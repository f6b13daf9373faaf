"""GPU probe: where a decode layer's time goes, kernel by kernel, under each baseline.

For `bench torch`'s transformers layer (``hf-static`` or ``hf-qwen3-static``, 8B sizes), each
``torch.compile`` mode (default and ``max-autotune-no-cudagraphs``, so that the profiler sees
the kernels) is profiled over a few plain calls: the CUDA kernels of one call, in launch order,
with their mean GPU time, and the bytes the layer must move at the copy bandwidth beside them.
The sum of a mode's kernel times is its time with no launch gaps, what CUDA-graph replay tends
to; the per-kernel times say which kernels hold the layer above its copy floor.

Usage, on the GPU machine from the repository root:
  python3 scripts/gpu_probes/layer_kernels.py [MODEL] [BATCH] [DTYPE]   (hf-static 1 float16)
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, ".")
from egraph_mirage.bench.torch_bench import (
    TorchBenchConfig,
    _input_sets,
    _module,
    _sizes,
    load_example,
)

CALLS = 20


def kernels(fn, xs) -> list[tuple[str, float]]:
    """The kernels of one call of ``fn`` in launch order, each with its mean µs over CALLS."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(5):
            fn(*xs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(CALLS):
                fn(*xs)
            torch.cuda.synchronize()
    events = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_call = len(events) // CALLS
    rows = []
    for i in range(per_call):
        same = events[i::per_call]
        us = sum(getattr(e, "device_time", None) or e.cuda_time for e in same)
        rows.append((same[0].name, us / len(same)))
    return rows


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "hf-static"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "float16")
    cfg = TorchBenchConfig(models=(model,), preset="llama3_8b", device="cuda")
    example = load_example()
    module = _module(example, model, _sizes(example, cfg), dtype, "cuda")
    xs = _input_sets(module, batch, cfg)[0]
    totals = {}
    for mode in (None, "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        fn = torch.compile(module, mode=mode, dynamic=False)
        rows = kernels(fn, xs)
        name = mode or "default"
        totals[name] = sum(t for _, t in rows)
        print(f"== {model} b={batch} {dtype} {name}: {len(rows)} kernels, "
              f"{totals[name]:.1f} µs of kernel time", flush=True)
        for k, t in rows:
            print(f"  {t:8.2f}  {k[:120]}")
    print("\n| mode | kernel µs |")
    print("|---|---|")
    for k, v in totals.items():
        print(f"| {k} | {v:.1f} |")


if __name__ == "__main__":
    main()
