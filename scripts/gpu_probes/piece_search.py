"""GPU probe: one GEMV piece searched as the backend searches it, and what its profile timed.

In `bench torch` (hf-static, 8B sizes, b = 1, H200) the backend's winner for the gated MLP's
gate/up products with SiLU·mul ran 73.9 µs, while the same kind of structures reach 55–58 µs
at their best sizes in the model's layout (``gemv_variants.py``). This runs the piece's search
the backend's way (``superoptimize`` with ``profile=True`` and a ``GpuProfiler`` reading the
weights as Wᵀ, within a time budget) and prints the profile stage's note and every timed
result: blocks, loop steps, measured µs and knobs, fastest first.

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  python3 scripts/gpu_probes/piece_search.py [BUDGET_S] [WORKERS] [PROGRAM]   (54 15 gate_up)
"""
from __future__ import annotations

import math
import sys
import time
from typing import Any

sys.path.insert(0, ".")
sys.path.insert(0, "scripts/gpu_probes")
from gemv_variants import programs

from egraph_mirage import processes
from egraph_mirage.mugraph.sizes import sizes_of
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.rank.measured import GpuProfiler, keep_jax_off_the_gpu


def search_as_the_backend(g: Any, strides: tuple[Any, ...], budget: float, workers: int
                          ) -> tuple[Any, float]:
    """``g`` searched as the backend searches a piece: the worker pool started and warmed
    before the budget, as the backend's is, and the results profiled on the GPU with the
    piece's inputs in the layout ``strides`` (``fx.runtime.input_layout``). Returns the results
    and the seconds the search took (the probes ``attention_split.py`` and
    ``joined_outputs.py`` call it too)."""
    pool = processes.worker_pool(workers)
    processes.warm(pool, workers)
    t0 = time.time()
    try:
        res = superoptimize(g, time_budget=budget, workers=pool, profile=True,
                            profiler=GpuProfiler(strides=strides))
    finally:
        pool.shutdown()
    return res, time.time() - t0


def main() -> None:
    budget = float(sys.argv[1]) if len(sys.argv) > 1 else 54.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    name = sys.argv[3] if len(sys.argv) > 3 else "gate_up"
    keep_jax_off_the_gpu()
    g, strides = programs([name])[name]
    res, seconds = search_as_the_backend(g, strides, budget, workers)
    st = res.stats
    print(f"== {name}: {len(res)} results in {seconds:.0f} s (budget {budget:.0f})")
    print(f"  stages (s): {dict((k, round(v, 1)) for k, v in st.seconds.items())}")
    print(f"  profile: {st.profile_note}")
    for m in st.profile_messages[:5]:
        print(f"    {m[:160]}")
    for r in list(res)[:20]:
        sz = sizes_of(r.graph)
        us = "-" if r.measured_us is None else f"{r.measured_us:.1f}"
        print(f"  {us:>6} µs "
              f"est {r.estimated_seconds * 1e6:6.1f} blocks {[math.prod(k.grid) for k in sz]} "
              f"loop {[k.frange for k in sz]} knobs {r.knobs}")


if __name__ == "__main__":
    main()
