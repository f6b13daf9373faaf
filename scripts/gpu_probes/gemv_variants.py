"""GPU probe: the decode layer's large GEMV pieces at 8B sizes (b = 1), every size variant of the
search's best structures timed, beside Inductor (default and max-autotune) and the copy floor.

Why: in the layer benchmark the backend's winners for the gated MLP's gate/up products (4096 ->
2 x 14336) and the down projection (14336 -> 4096) were slower than Inductor's cuBLAS calls, and
the profile stage times only a few sizes of each structure (``rank.measured.PROFILE_SIZES``).
This shows which sizes (blocks, loop steps, split pieces) reach the floor, and how the cost model
orders them.

For each program: ``superoptimize`` (scaled search, resized and verified at the real sizes; no
GPU profile), then for its first ``FORMS`` structures every size variant under the default caps
with this GPU's shared memory (``rank.size_variants``), each timed at the quick knobs
(``GpuProfiler(quick=True)``), the fastest ``TUNE`` tuned in full. One line per variant: blocks
per kernel, loop steps, the cost model's µs, the measured µs (CUDA-graph replay, rotated inputs)
and its fraction of the floor; the baselines last.

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  python3 scripts/gpu_probes/gemv_variants.py [SEARCH_S] [WORKERS] [PROGRAMS]
PROGRAMS: comma-separated of gate_up, down, qkv, norm_q, norm_k (the last two: ``transformers``'
float32 RMSNorm before the query or key projection; default gate_up,down).
LAYOUT=rowmajor in the environment times every input row-major; by default the weights are read
as the model holds them (``nn.Linear``'s W, read as Wᵀ: ``fx.runtime.input_layout``), as the
backend's profile does (``GpuProfiler.strides``).
"""
from __future__ import annotations

import math
import os
import sys
import time

import torch

sys.path.insert(0, ".")
from egraph_mirage.fx.runtime import input_layout
from egraph_mirage.fx.trace import trace
from egraph_mirage.gpu.floor import io_bytes, measure_copy_bandwidth
from egraph_mirage.gpu.timing import (
    CudaTimer,
    TimingConfig,
    graph_bytes,
    input_sets,
    l2_bytes,
    rotation_count,
    smem_per_block,
)
from egraph_mirage.lower.cost_model import ProgramCost
from egraph_mirage.mugraph.sizes import DEFAULT_CAPS, sizes_of, structure_of, with_smem
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.rank.measured import GpuProfiler
from egraph_mirage.rank.size_variants import size_variants

F = torch.nn.functional
FORMS, VARIANTS, TUNE = 2, 16, 3


def _hf_norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``transformers``' RMSNorm: float32 inside, the weight after the cast back."""
    h = x.float()
    return g * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)


def programs(names: list[str]) -> dict[str, tuple[object, tuple]]:
    """Per program, its graph and its inputs' strides as the model reads them."""
    h, m = 4096, 14336
    r = lambda *s: torch.randn(*s, dtype=torch.float16) * 0.02  # noqa: E731
    fns = {"gate_up": (lambda x, w1, w3: F.silu(F.linear(x, w1)) * F.linear(x, w3),
                       (r(1, h), r(m, h), r(m, h))),
           "down": (lambda x, w, res: F.linear(x, w) + res, (r(1, m), r(h, m), r(1, h))),
           "qkv": (lambda x, w: F.linear(x, w), (r(1, h), r(6144, h))),
           "norm_q": (lambda x, g, w: F.linear(_hf_norm(x, g), w),
                      (r(1, h), r(h) + 1, r(h, h))),
           "norm_k": (lambda x, g, w: F.linear(_hf_norm(x, g), w),
                      (r(1, h), r(h) + 1, r(1024, h)))}
    out = {}
    for name in names:
        fn, xs = fns[name]
        traced = trace(fn, *xs)
        rowmajor = os.environ.get("LAYOUT") == "rowmajor"
        out[name] = (traced.graph, () if rowmajor else input_layout(traced, xs))
    return out


def baseline_us(g, fn_of, timer, sets) -> float:
    from egraph_mirage.gpu.torch_eval import torch_function

    torch._dynamo.reset()
    fn = fn_of(torch_function(g))
    return timer.graph(fn, sets)


def main() -> None:
    search_s = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else max(1, (os.cpu_count() or 2) - 1)
    names = (sys.argv[3] if len(sys.argv) > 3 else "gate_up,down").split(",")
    dev = torch.cuda.get_device_name()
    bw = measure_copy_bandwidth()
    print(f"{dev}: copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    timer = CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5, graph_replays=7))
    cost = ProgramCost()
    caps = with_smem(DEFAULT_CAPS, smem_per_block())
    table = []
    for name, (g, strides) in programs(names).items():
        quick = GpuProfiler(quick=True, strides=strides)
        full = GpuProfiler(strides=strides)
        print(f"{name}: input strides {strides}", flush=True)
        floor = io_bytes(g) / bw * 1e6
        t0 = time.time()
        res = superoptimize(g, time_budget=search_s, workers=workers, profile=False)
        print(f"== {name}: {len(res)} results in {time.time() - t0:.0f} s, floor {floor:.1f} µs",
              flush=True)
        seen, forms = set(), []
        for r in res:
            s = structure_of(r.graph)
            if s not in seen:
                seen.add(s)
                forms.append(r.graph)
        rows = []
        for f, h in enumerate(forms[:FORMS]):
            vs = size_variants(h, target=g, limit=VARIANTS, caps=caps, workers=workers)
            for v in vs:
                m = quick.measure(g, [v])[0]
                blocks = [math.prod(k.grid) for k in sizes_of(v)]
                loops = [k.frange for k in sizes_of(v)]
                rows.append([f, blocks, loops, cost.seconds(v) * 1e6, m.us, m.status, v])
                print(f"  form {f} blocks {blocks} loop {loops} est {cost.seconds(v) * 1e6:6.1f} "
                      f"quick {m.us if m.us is None else round(m.us, 1)} {m.status} "
                      f"{m.message[:80]}", flush=True)
        ok = sorted([r for r in rows if r[4] is not None], key=lambda r: r[4])
        best = None
        for r in ok[:TUNE]:
            m = full.measure(g, [r[6]])[0]
            print(f"  tuned form {r[0]} blocks {r[1]} loop {r[2]}: {m.us} {m.knobs}", flush=True)
            if m.us is not None and (best is None or m.us < best[0]):
                best = (m.us, r[1], r[2], m.knobs)
        count = rotation_count(graph_bytes(g), l2_bytes())
        sets = input_sets(g, count, "cuda", 0, 0.1)
        ind = baseline_us(g, lambda f: torch.compile(f, dynamic=False), timer, sets)
        mat = baseline_us(g, lambda f: torch.compile(f, dynamic=False,
                                                     mode="max-autotune-no-cudagraphs"),
                          timer, sets)
        table.append((name, floor, best, ind, mat))
    print(f"\n{dev}; µs under CUDA-graph replay; fraction of the copy floor in brackets")
    print(f"{'program':8} {'floor':>7} {'ours':>14} {'compile':>14} {'max-autotune':>14}  "
          "best sizes")
    for name, floor, best, ind, mat in table:
        ours = best[0] if best else float("nan")
        cell = lambda us: f"{us:6.1f} ({floor / us:.2f})"  # noqa: E731
        print(f"{name:8} {floor:7.1f} {cell(ours):>14} {cell(ind):>14} {cell(mat):>14}  "
              f"{best[1:] if best else '-'}")


if __name__ == "__main__":
    main()
