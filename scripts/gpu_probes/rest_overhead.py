"""Does the backend cost host time when it replaces nothing? (GPU only)

Compiles the Llama-3-8B decoder layer of ``examples/llama_layer.py`` (one decode step) with
``torch.compile`` (Inductor, default mode) and with the egraph_mirage backend whose search finds
nothing (a stand-in: every piece is kept, so the whole graph is Inductor's code, compiled by
the backend's ``_rest``), then times both in alternation, 7 rounds, the fastest round of
each: the host's time to issue a call (300 back to back), plain launches back to back
(``CudaTimer.back_to_back``), plain launches after an L2 flush (``CudaTimer.plain``) and
CUDA-graph replay. A third compile passes Inductor's ``compile_fx`` itself as a custom backend:
if it costs what the egraph_mirage backend costs, the difference is Dynamo's path for a custom
backend, not the backend's.

Usage: python scripts/gpu_probes/rest_overhead.py OUT [--batch B]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from egraph_mirage.bench.torch_bench import load_example
from egraph_mirage.fx.backend import Backend
from egraph_mirage.gpu.timing import CudaTimer, TimingConfig
from egraph_mirage.search.results import SearchResults, SearchStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import host_us

ROUNDS = 7


def nothing(g: Any, config: Any, **options: Any) -> SearchResults:
    """A search that finds nothing."""
    return SearchResults([], SearchStats())


def measure(fns: dict[str, Any], xs: Any) -> dict[str, dict[str, float]]:
    """Each function's fastest round of each measure, the functions in alternation."""
    timer = CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5, graph_replays=7))
    got: dict[str, dict[str, list[float]]] = {n: {} for n in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            with torch.no_grad():
                for kind, us in (("host", host_us(fn, xs)[0]),
                                 ("back_to_back", timer.back_to_back(fn, [xs], repeats=1)),
                                 ("flushed", timer.plain(fn, [xs]))):
                    got[name].setdefault(kind, []).append(us)
    for name, fn in fns.items():
        try:
            got[name]["graph"] = [timer.graph(fn, [xs])]
        except Exception as e:  # a probe reports, it does not stop
            print(f"{name}: graph replay failed: {e}", file=sys.stderr)
    return {n: {k: min(v) for k, v in kinds.items()} for n, kinds in got.items()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--batch", type=int, default=1)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    ex = load_example()
    sizes = ex.LlamaSizes.llama3_8b()
    module = ex.LlamaLayer(sizes, dtype=torch.float16, device="cuda").eval()
    module.requires_grad_(False)
    xs = ex.decode_inputs(sizes, a.batch, 0, "cuda", torch.float16)
    from torch._inductor.compile_fx import compile_fx

    torch._dynamo.reset()
    inductor = torch.compile(module, backend=compile_fx, dynamic=False)
    ours = torch.compile(module, backend=Backend(search=nothing, refine=False, cache=False,
                                                 workers=1),
                         dynamic=False)
    plain = torch.compile(module, dynamic=False)
    with torch.no_grad():
        for fn in (inductor, ours, plain):
            fn(*xs)
    rows = {"device": torch.cuda.get_device_name(), "batch": a.batch,
            "us": measure({"compile": plain, "compile_fx as a backend": inductor,
                           "egraph_mirage": ours}, xs)}
    (out / f"rest_overhead_b{a.batch}.json").write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
