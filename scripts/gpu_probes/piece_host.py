"""GPU probe: the host time of one replaced piece launched by Inductor, against Inductor's own
code for it.

In `bench torch` (hf-static, 8B sizes, b = 1, H200) a one-kernel RMSNorm winner took 1.6 µs
under CUDA-graph replay against Inductor's 1.8, but 26.7 µs with plain launches against 22.3,
so it was kept. This compiles small functions (transformers' float32 RMSNorm at 1 x 4096, the
output projection with its residual add) through the backend (``timing="graph"``, so that a
winner faster under replay replaces its piece; ``launch="inductor"``; the rest autotuned) and
through ``torch.compile(mode="max-autotune-no-cudagraphs")``, then for each: the host's µs to
issue a call (300 back to back), plain launches back to back, graph replay, and cProfile's top
functions of 2,000 calls. Inductor's output code is written by the caller with
TORCH_LOGS=output_code.

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  TORCH_LOGS=output_code python3 scripts/gpu_probes/piece_host.py OUT [BUDGET] \
    2> OUT/output_code.txt
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_timing import host_us

from egraph_mirage.fx.backend import Backend
from egraph_mirage.fx.report import reports_of
from egraph_mirage.gpu.timing import CudaTimer, TimingConfig


def hf_rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def o_proj(a: torch.Tensor, w: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    return r + torch.nn.functional.linear(a, w)


def cases(dtype: torch.dtype) -> dict[str, tuple[Any, tuple[torch.Tensor, ...]]]:
    d = dict(device="cuda", dtype=dtype)
    return {"rmsnorm": (hf_rms, (torch.randn(1, 4096, **d), torch.randn(4096, **d))),
            "o_proj": (o_proj, (torch.randn(1, 4096, **d), torch.randn(4096, 4096, **d) / 64,
                                torch.randn(1, 4096, **d)))}


def top(fn: Any, xs: Any, n: int = 2000, lines: int = 18) -> str:
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(n):
            fn(*xs)
        prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def main() -> None:
    out = Path(sys.argv[1])
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    timer = CudaTimer(TimingConfig())
    rows = []
    for name, (fn, xs) in cases(torch.bfloat16).items():
        torch._dynamo.reset()
        backend = Backend(budget=budget, timing="graph", launch="inductor",
                          cache_dir=tempfile.mkdtemp())
        with torch.no_grad():
            ours = torch.compile(fn, backend=backend, dynamic=False)
            want = fn(*xs)
            got = ours(*xs)
        (report,) = reports_of(ours)
        print(report.text(), flush=True)
        torch._dynamo.reset()
        with torch.no_grad():
            inductor = torch.compile(fn, mode="max-autotune-no-cudagraphs", dynamic=False)
            inductor(*xs)
        err = float((got.float() - want.float()).abs().max())
        for who, f in (("ours", ours), ("inductor", inductor)):
            issue, done = host_us(f, xs)
            plain = timer.back_to_back(f, [list(xs)])
            try:
                graph = timer.graph(f, [list(xs)])
            except Exception as e:  # a graph that cannot be captured
                print(f"{name} {who}: no graph: {e}", flush=True)
                graph = float("nan")
            rows.append((name, who, issue, done, plain, graph, err))
            text = top(f, xs)
            (out / f"profile_{name}_{who}.txt").write_text(text)
            print(f"== {name} {who}\n{text[:3000]}", flush=True)
    print(f"{'piece':10s} {'who':9s} {'issue µs':>9s} {'done µs':>9s} {'b2b µs':>9s} "
          f"{'graph µs':>9s} {'error':>8s}")
    for name, who, issue, done, plain, graph, err in rows:
        print(f"{name:10s} {who:9s} {issue:9.1f} {done:9.1f} {plain:9.1f} {graph:9.1f} "
              f"{err:8.1e}")


if __name__ == "__main__":
    main()
