"""GPU probe: where a decode layer with replaced pieces spends its plain-launch time.

In `bench torch` (hf-static, 8B sizes, b = 1, H200) the pieces the backend replaced were each
faster than Inductor's code alone, under CUDA-graph replay and plain launches, yet the whole
graph with them was slower under plain launches (300 vs 272 µs) while faster under replay
(157 vs 162 µs). This compiles the layer through the backend with ``timing="graph"`` (so that
the pieces faster under replay are replaced), then for it and for Inductor's code: one plain
call under ``torch.profiler`` (the CUDA kernels launched, in order, and the CPU time of each
kind of call), and the plain / replayed µs. Inductor's output code for the graph with the
pieces is written with TORCH_LOGS=output_code by the caller.

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  TORCH_LOGS=output_code python3 scripts/gpu_probes/whole_graph_host.py BUDGET CACHE_DIR \
    2> $OUT/output_code.txt
"""
from __future__ import annotations

import collections
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
from egraph_mirage.fx.report import torch_report
from egraph_mirage.gpu.timing import CudaTimer, TimingConfig


def profile(name: str, fn, xs) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    with torch.no_grad():
        for _ in range(3):
            fn(*xs)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            fn(*xs)
            torch.cuda.synchronize()
    kernels = [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    print(f"== {name}: {len(kernels)} CUDA kernels")
    for k in kernels:
        print("   ", k[:110])
    cpu = collections.Counter()
    for e in p.key_averages():
        if e.self_cpu_time_total > 0:
            cpu[e.key] += e.self_cpu_time_total
    print(f"  CPU self time by call (µs), top 25 of {sum(cpu.values()):.0f}:")
    for k, v in cpu.most_common(25):
        print(f"    {v:8.1f}  {k[:100]}")


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 240.0
    cache = sys.argv[2] if len(sys.argv) > 2 else "/tmp/em_work/cache"
    cfg = TorchBenchConfig(models=("hf-static",), preset="llama3_8b", device="cuda",
                           budget=budget, cache_dir=cache, workers=15,
                           backend_options={"timing": "graph"})
    example = load_example()
    module = _module(example, "hf-static", _sizes(example, cfg), torch.float16, "cuda")
    sets = _input_sets(module, 1, cfg)
    from egraph_mirage.fx.backend import Backend

    ours = torch.compile(module, backend=Backend(**cfg.backend()), dynamic=False)
    theirs = torch.compile(module, dynamic=False)
    with torch.no_grad():
        ours(*sets[0])
        theirs(*sets[0])
    print(torch_report(ours))
    timer = CudaTimer(TimingConfig(rep_ms=200, graph_replay_ms=20, graph_replays=7))
    for name, fn in (("inductor", theirs), ("ours", ours)):
        profile(name, fn, sets[0])
    for name, fn in (("inductor", theirs), ("ours", ours), ("inductor", theirs), ("ours", ours)):
        plain, replay = timer.plain(fn, sets), timer.graph(fn, sets)
        print(f"{name}: plain {plain:.1f} µs, replay {replay:.1f} µs", flush=True)


if __name__ == "__main__":
    main()
