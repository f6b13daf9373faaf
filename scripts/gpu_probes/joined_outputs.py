"""GPU probe: a piece of several outputs searched as the backend searches it, the joined result
timed. ``transformers``' float32 RMSNorm feeding the query, key and value projections of an 8B
model at decode (x (1, 4096), Wq 4096 x 4096, Wk and Wv 1024 x 4096, read as ``nn.Linear``'s
Wᵀ), searched with ``profile=True`` and a ``GpuProfiler`` in that layout within a time budget:
each output's search is timed with its own inputs' layout and the joined program is profiled
whole (``pipeline.outputs``). Prints the floor (bytes at the copy bandwidth), the joined
results' measured µs, kernels and knobs, then the best joined result timed at every setting of
its own knobs (fused combines, swapped dots, PDL, sibling kernels as one grid) at the warps and
stages it won with: what its tuning would find given the time; and, with ``SAVE_DIR``, writes
the best's μGraph (``best.json``) and Triton source (``best.py``) there and prints its kernels'
times in one call (``torch.profiler``).

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  python3 scripts/gpu_probes/joined_outputs.py [BUDGET_S] [WORKERS] [SAVE_DIR]   (60 15)
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [".", "scripts/gpu_probes"]
from gemv_variants import _hf_norm
from piece_search import search_as_the_backend

from egraph_mirage.fx.runtime import input_layout
from egraph_mirage.fx.trace import trace
from egraph_mirage.gpu.floor import io_bytes, measure_copy_bandwidth
from egraph_mirage.gpu.tune import knob_space
from egraph_mirage.graph import KernelGraph
from egraph_mirage.lower import compile_graph, generate_source
from egraph_mirage.lower.triton_program import LowerOptions
from egraph_mirage.mugraph.serialize import dumps
from egraph_mirage.rank.measured import GpuProfiler, _laid, keep_jax_off_the_gpu

F = torch.nn.functional


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    keep_jax_off_the_gpu()
    h = 4096
    r = lambda *s: torch.randn(*s, dtype=torch.float16) * 0.02  # noqa: E731
    xs = (r(1, h), r(h) + 1, r(h, h), r(1024, h), r(1024, h))

    def qkv(x, g, wq, wk, wv):  # type: ignore[no-untyped-def]
        n = _hf_norm(x, g)
        return F.linear(n, wq), F.linear(n, wk), F.linear(n, wv)

    traced = trace(qkv, *xs)
    g = traced.graph
    bw = measure_copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s; floor "
          f"{io_bytes(g) / bw * 1e6:.1f} µs", flush=True)
    res, seconds = search_as_the_backend(g, input_layout(traced, xs), budget, workers)
    st = res.stats
    print(f"== {len(res)} joined results in {seconds:.0f} s; ranked by {st.ranked_by}; "
          f"profile: {st.profile_note}")
    for r_ in list(res)[:6]:
        us = "-" if r_.measured_us is None else f"{r_.measured_us:.1f}"
        print(f"  {us:>6} µs  {r_.num_kernels} kernel(s)  knobs {r_.knobs}")
    best = next((r_ for r_ in res if r_.knobs), None)
    if best is None:
        return
    strides = input_layout(traced, xs)
    if len(sys.argv) > 3:
        save(best.graph, {**best.knobs, "input_strides": strides}, xs, sys.argv[3])
    base = {k: (best.knobs[k],) for k in ("num_warps", "num_stages") if k in best.knobs}
    print(f"== the best's own knobs at {base}:")
    for knobs in knob_space(base, best.graph):
        (m,) = replace(GpuProfiler(strides=strides), space={k: (v,) for k, v in knobs.items()}
                       ).measure(g, [best.graph])
        us = "-" if m.us is None else f"{m.us:.1f}"
        print(f"  {us:>6} µs  {m.status}  {knobs}  {m.message[:80]}", flush=True)


def save(graph: KernelGraph, options: dict[str, Any], xs: tuple[torch.Tensor, ...],
         folder: str) -> None:
    """``graph`` (a μGraph) and its Triton source at ``options`` written to ``folder``; its
    kernels' CUDA times in one call printed, from ``torch.profiler``."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, "best.json").write_text(dumps(graph))
    Path(folder, "best.py").write_text(generate_source(graph, LowerOptions(**options)))
    fn = compile_graph(graph, **options)
    ins = _laid([x.reshape(t.dims).cuda() for x, t in zip(xs, graph.inputs)],
                options["input_strides"])
    for _ in range(20):
        fn(*ins)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            fn(*ins)
        torch.cuda.synchronize()
    print("== the best's kernels (µs per call, torch.profiler):")
    for e in prof.key_averages():
        if e.device_time_total > 0:
            print(f"  {e.device_time_total / 10:8.2f}  {e.key[:90]}")


if __name__ == "__main__":
    main()
