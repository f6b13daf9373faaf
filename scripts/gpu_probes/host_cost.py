"""Where a replaced piece's host time goes under plain launches (GPU only).

Compiles a module with ``torch.compile`` (Inductor) and with the egraph_mirage backend
(``timing="graph"``, so that every winner replaces its piece), then times one call on the host
(``perf_counter`` over back-to-back calls: host issue rate), with ``do_bench`` (plain launches)
and under CUDA-graph replay, and breaks a replaced piece's host time into its layers: the custom
op, the runner (views in and out), the compiled μGraph (input checks), the generated program's
``launch``. Prints cProfile's top functions and torch.profiler's CPU-side operators of the
backend's call, and whether each kernel launch took the direct path (``lower.triton_program``).

Usage: python scripts/gpu_probes/host_cost.py OUT [--model rms|layer] [--batch B] [--budget S]
[--force] [--stand-in] [--noop] [--cache DIR] [--partitioned] [--launch inductor|op]

With ``--partitioned``, first: Dynamo's graph of the module compiled by Inductor as it is and as
the partitioner's rewritten module with nothing replaced, each timed back to back (plain
launches) and under CUDA-graph replay: what the partitioning alone costs Inductor's code.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import egraph_mirage.api as api
from egraph_mirage.fx import backend as fxb
from egraph_mirage.gpu.timing import CudaTimer, TimingConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_timing import host_us

COMPILED: list[Any] = []  # every CompiledGraph the backend made
RUNNERS: list[Any] = []
_compile = api.compile
_runner = fxb.make_runner


def _recording_compile(g: Any, **options: Any) -> Any:
    cg = _compile(g, **options)
    COMPILED.append(cg)
    return cg


def _recording_runner(*a: Any, **k: Any) -> Any:
    api.compile = _recording_compile  # only the backend's runners: not the profile stage's
    try:
        r = _runner(*a, **k)
    finally:
        api.compile = _compile
    RUNNERS.append(r)
    return r


fxb.make_runner = _recording_runner


def partitioned_cost(module: Any, xs: Any, timer: CudaTimer) -> dict[str, Any]:
    """Inductor's code for Dynamo's graph of ``module``, and for the partitioner's rewritten
    module of that graph with nothing replaced: µs back to back and under graph replay."""
    from egraph_mirage.fx.backend import _rest
    from egraph_mirage.fx.pieces import partition

    captured: dict[str, Any] = {}

    def grab(gm: Any, example_inputs: Any) -> Any:
        captured["gm"], captured["xs"] = gm, list(example_inputs)
        return gm.forward

    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(module, backend=grab, dynamic=False)(*xs)
        gm, ins = captured["gm"], captured["xs"]
        parts = partition(gm, ins)
        made = {"as is": _rest(gm, ins, "inductor", None),
                "partitioned": _rest(parts.module, ins, "inductor", None)}
    res: dict[str, Any] = {"pieces": len(parts.pieces)}
    for _ in range(2):  # two rounds, the two one after the other in each
        for name, fn in made.items():
            res.setdefault(name, []).append({"back_to_back_us": timer.back_to_back(fn, [ins]),
                                             "graph_us": timer.graph(fn, [ins])})
    print("partitioned", res, flush=True)
    return res


def rms_module(hidden: int) -> Any:
    class RMS(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.g = torch.nn.Parameter(torch.randn(hidden, dtype=torch.float16, device="cuda"))

        def forward(self, x: Any) -> Any:
            v = x.float().pow(2).mean(-1, keepdim=True)
            return (x.float() * torch.rsqrt(v + 1e-5)).half() * self.g

    return RMS().eval().requires_grad_(False)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--model", default="rms")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--budget", type=float, default=15)
    p.add_argument("--workers", type=int, default=14)
    p.add_argument("--force", action="store_true",
                   help="replace every piece the search found a winner for, faster or not")
    p.add_argument("--stand-in", action="store_true",
                   help="no search: every piece's own program is its winner (lowered as is)")
    p.add_argument("--noop", action="store_true",
                   help="a replaced piece's op returns empty outputs without launching: what "
                        "the custom-op call costs inside Inductor's graph by itself")
    p.add_argument("--cache", default=None,
                   help="the backend's cache folder (default OUT/cache): decisions of an earlier "
                        "run (bench torch's, with the same --budget) are used without searching")
    p.add_argument("--launch", default="inductor", choices=("inductor", "op"),
                   help="the backend's launch option (--noop implies op)")
    p.add_argument("--partitioned", action="store_true",
                   help="also time Inductor's code for the partitioned graph, nothing replaced")
    a = p.parse_args()
    if a.noop:
        def noop_runner(traced: Any, mugraph: Any, knobs: Any, *rest: Any) -> Any:
            outs = [(o.shape, getattr(torch, o.dtype)) for o in traced.outputs]
            return lambda xs: [torch.empty(s, dtype=d, device="cuda") for s, d in outs]

        fxb.make_runner = noop_runner
        fxb._check = lambda runner, piece: 0.0
    if a.force:
        from egraph_mirage.fx import decision

        decision.PieceDecision.why_not_used = lambda self, timing: ""
        fxb.slower = lambda times, timing: ""
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.model == "rms":
        module = rms_module(4096)
        sets = [(torch.randn(a.batch, 4096, dtype=torch.float16, device="cuda"),)]
    else:
        from egraph_mirage.bench.torch_bench import load_example

        ex = load_example()
        sizes = ex.LlamaSizes.llama3_8b()
        module = ex.LlamaLayer(sizes, dtype=torch.float16, device="cuda").eval()
        module.requires_grad_(False)
        sets = [ex.decode_inputs(sizes, a.batch, 0, "cuda", torch.float16)]
    xs = sets[0]
    timer = CudaTimer(TimingConfig())
    rows: dict[str, Any] = {"device": torch.cuda.get_device_name(), "model": a.model,
                            "batch": a.batch}
    if a.partitioned:
        rows["partitioned"] = partitioned_cost(module, xs, timer)
        (out / f"partitioned_{a.model}_b{a.batch}.json").write_text(json.dumps(rows, indent=1))
    torch._dynamo.reset()
    comp = torch.compile(module, dynamic=False)
    more: dict[str, Any] = {}
    if a.stand_in:
        from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats

        def same(g: Any, config: Any, **options: Any) -> Any:
            return SearchResults([SearchResult(g, 0, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats())

        more = {"search": same, "cache": False, "profile": False}
    backend = fxb.Backend(budget=a.budget, workers=a.workers, timing="graph",
                          launch="op" if a.noop else a.launch,
                          cache_dir=a.cache or str(out / "cache"), **more)
    with torch.no_grad():
        comp(*xs)
    ours = torch.compile(module, backend=backend, dynamic=False)
    with torch.no_grad():
        ours(*xs)
        torch.cuda.synchronize()
    from egraph_mirage.fx.report import torch_report

    (out / f"report_{a.model}.txt").write_text(torch_report(backend))
    for name, fn in (("eager", module), ("compile", comp), ("ours", ours)):
        issue, total = host_us(fn, xs)
        rows[name] = {"host_issue_us": issue, "host_total_us": total,
                      "plain_us": timer.plain(fn, sets), "graph_us": timer.graph(fn, sets)}
        print(name, rows[name], flush=True)
    # the layers of each replaced piece (their own inputs: from its example inputs)
    layers = []
    for cg in COMPILED:
        ins = [torch.randn(d, device="cuda").to(getattr(torch, t.value)) for d, t in cg.inputs]
        launch = cg.module.launch
        entry = {"path": str(cg.path), "compiled_graph_us": host_us(cg, ins),
                 "launch_us": host_us(launch, ins)}
        entry["direct"] = {str(k[0].fn.__name__ if hasattr(k[0], "fn") else k[0]): v is not None
                           for k, v in getattr(cg.module, "_COMPILED", {}).items()}
        entry["unhooked"] = cg.module._unhooked() if hasattr(cg.module, "_unhooked") else None
        layers.append(entry)
        print("layer", entry, flush=True)
    rows["compiled_graphs"] = layers
    (out / f"host_{a.model}_b{a.batch}.json").write_text(json.dumps(rows, indent=1))
    # cProfile of the backend's calls
    prof = cProfile.Profile()
    with torch.no_grad():
        prof.enable()
        for _ in range(200):
            ours(*xs)
        prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    (out / f"cprofile_{a.model}.txt").write_text(s.getvalue())
    print(s.getvalue()[:6000], flush=True)
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        for _ in range(20):
            ours(*xs)
        torch.cuda.synchronize()
    table = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    for e in tp.key_averages():
        if any(w in e.key for w in ("ynchronize", "emcpy", "Memset", "Query")):
            print("sync-like", e.key, e.count, flush=True)
    (out / f"profiler_{a.model}.txt").write_text(table)
    print(table[:8000], flush=True)


if __name__ == "__main__":
    main()
