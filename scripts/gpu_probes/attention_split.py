"""GPU probe: the decode step's attention core at 8B sizes, searched as the backend searches it,
against PyTorch's SDPA and Inductor's code for it, and the copy floor.

The piece is ``F.scaled_dot_product_attention(q, k, v, enable_gqa=True)`` at decode: one query
token, 32 query heads sharing 8 KV heads, head dim 128, ``KEYS`` cached keys (4,096), fp16;
its softmax traced with the row max subtracted. The search's split-KV form writes each key
piece's max beside its partial sums (``tests/test_split_kv_max.py``). This runs
``superoptimize`` with ``profile=True`` within a time budget (the worker pool started first, as
the backend's is) and prints every timed result, then SDPA eager, ``torch.compile`` default and
max-autotune (CUDA-graph replay), and the floor (bytes over the copy bandwidth).

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  python3 scripts/gpu_probes/attention_split.py [BUDGET_S] [WORKERS] [KEYS]   (60 15 4096)
"""
from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

sys.path[:0] = [".", "scripts/gpu_probes"]
from piece_search import search_as_the_backend

from egraph_mirage.fx.runtime import input_layout
from egraph_mirage.fx.trace import trace
from egraph_mirage.gpu.floor import io_bytes, measure_copy_bandwidth
from egraph_mirage.gpu.timing import CudaTimer, TimingConfig
from egraph_mirage.mugraph.sizes import sizes_of
from egraph_mirage.rank.measured import keep_jax_off_the_gpu


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    keys = int(sys.argv[3]) if len(sys.argv) > 3 else 4096
    keep_jax_off_the_gpu()
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(*s, generator=gen, dtype=torch.float16)
          for s in ((1, 32, 1, 128), (1, 8, keys, 128), (1, 8, keys, 128))]
    traced = trace(sdpa, *xs)
    g = traced.graph
    print(f"{torch.cuda.get_device_name()}: program {[t.op for t in g.operators]} on "
          f"{[t.dims for t in g.inputs]}", flush=True)
    bw = measure_copy_bandwidth()
    floor = io_bytes(g) / bw * 1e6
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s, floor {floor:.2f} µs", flush=True)
    res, seconds = search_as_the_backend(g, input_layout(traced, xs), budget, workers)
    st = res.stats
    print(f"== search: {len(res)} results in {seconds:.0f} s (budget {budget:.0f}), "
          f"tasks {st.tasks_done}/{st.tasks_total}, first at {st.seconds_to_first}", flush=True)
    print(f"  stages (s): {dict((k, round(v, 1)) for k, v in st.seconds.items())}")
    print(f"  profile: {st.profile_note}; reasons {st.no_result_reasons[:2]}")
    print(f"  searched sizes {st.searched_sizes}, resize unfit {st.resize_unfit}, rejected "
          f"{st.resize_rejected}, stopped by {st.stopped_by}")
    for r in list(res)[:12]:
        sz = sizes_of(r.graph)
        us = "-" if r.measured_us is None else f"{r.measured_us:.1f}"
        print(f"  {us:>6} µs kernels {r.num_kernels} blocks {[math.prod(k.grid) for k in sz]} "
              f"loop {[k.frange for k in sz]} knobs {r.knobs}", flush=True)
        ops = {b.op for op in r.graph.operators if op.op == "customized"
               for b in op.params["kernel"].tb.tensors}
        print(f"         max: {'amax' in ops or 'forloop_max' in ops}, rescaled: "
              f"{'forloop_accum_rescale' in ops}")
    timer = CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5, graph_replays=7))
    cuda = [x.cuda() for x in xs]
    rows = [("SDPA eager", sdpa)]
    for mode in ("default", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        rows.append((f"compile {mode}", torch.compile(sdpa, mode=mode)))
    print(f"{'baseline':<40} {'µs':>7} {'of floor':>8}")
    for name, fn in rows:
        us = timer.graph(fn, [cuda])
        print(f"{name:<40} {us:7.2f} {floor / us:8.2f}", flush=True)
    best = next((r for r in res if r.measured_us is not None), None)
    if best is not None:
        print(f"{'search winner':<40} {best.measured_us:7.2f} {floor / best.measured_us:8.2f}")


if __name__ == "__main__":
    main()
