"""GPU probe: is the partitioned graph, with nothing replaced, slower than Dynamo's graph?

In `bench generate` (8-layer Llama at 8B sizes, b = 1, H200, commit 5f10265) the graph with one
1-µs piece replaced (the first layer's key RoPE) ran 1,729.5 µs against 1,480.8 for Inductor's
code for Dynamo's graph. The graph with pieces is the partitioned module compiled again, in
which every SDPA takes the additive mask the partition made of the boolean one
(``fx.pieces._additive_masks``), and Inductor's max-autotune picks its kernels anew. This
captures a decode step's graph from ``generate()`` and times, under CUDA-graph replay (modes
without CUDA graphs of their own, so that the timer captures each):

- ``dynamo``: Inductor's code for Dynamo's graph;
- ``dynamo again``: the same compiled a second time (what a new compile's choices move);
- ``partitioned``: Inductor's code for the partitioned module, nothing replaced;

then the GPU kernels of ``dynamo`` and ``partitioned`` whose µs per call differ most.

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  python3 scripts/gpu_probes/partitioned_graph.py [LAYERS] [MODE]
(MODE: Inductor's, default max-autotune-no-cudagraphs)
"""

from __future__ import annotations

import sys
from typing import Any

import torch

sys.path.insert(0, ".")
from egraph_mirage.bench.generate_bench import PRESETS, build_model
from egraph_mirage.fx.inductor_timing import time_graphs
from egraph_mirage.fx.mutation import preserved, written
from egraph_mirage.fx.pieces import partition
from egraph_mirage.fx.rest import compile_rest
from egraph_mirage.gpu.timing import CudaTimer


def main() -> None:
    from transformers import CompileConfig, GenerationConfig

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    mode = sys.argv[2] if len(sys.argv) > 2 else "max-autotune-no-cudagraphs"
    model = build_model("llama", PRESETS["llama3_8b"], layers, 128256, torch.float16, "cuda", 1)
    captured: dict[str, Any] = {}
    results: dict[str, float | None] = {}

    def backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        if "gm" in captured:
            return gm.forward
        captured["gm"] = gm
        xs = list(example_inputs)
        with preserved(gm, xs):
            dynamo = compile_rest(gm, xs, "inductor", mode)
            again = compile_rest(gm, xs, "inductor", mode)
            parts = partition(gm, xs)
            part = compile_rest(parts.module, xs, "inductor", mode, gm)
            print(f"{len(parts.pieces)} pieces", flush=True)
            w = written(gm)
            for name, fn in (("dynamo again", again), ("partitioned", part)):
                t = time_graphs(fn, dynamo, xs, w)
                results[name] = t["ours_us"]
                results["dynamo"] = t["inductor_us"]
                print(f"{name}: {t['ours_us']:.1f} µs against dynamo {t['inductor_us']:.1f} "
                      f"(graph replay)", flush=True)
            timer = CudaTimer()
            k_dyn = timer.kernels(lambda *a: dynamo(*a), [xs])
            k_part = timer.kernels(lambda *a: part(*a), [xs])
        keys = set(k_dyn) | set(k_part)
        diff = sorted(keys, key=lambda k: -abs(k_part.get(k, 0.0) - k_dyn.get(k, 0.0)))
        print("kernel | dynamo µs | partitioned µs", flush=True)
        for k in diff[:25]:
            print(f"{k} | {k_dyn.get(k, 0.0):.1f} | {k_part.get(k, 0.0):.1f}", flush=True)
        print(f"sum | {sum(k_dyn.values()):.1f} | {sum(k_part.values()):.1f}", flush=True)
        return gm.forward

    prompt = torch.randint(1, 1000, (1, 16), device="cuda")
    config = GenerationConfig(max_new_tokens=2, do_sample=False, cache_implementation="static",
                              max_cache_len=1024, eos_token_id=None, pad_token_id=0,
                              compile_config=CompileConfig(backend=backend, dynamic=False,
                                                           fullgraph=False))
    with torch.no_grad():
        model.generate(prompt, generation_config=config)
    print("layers", layers, "mode", mode, {k: round(v, 1) for k, v in results.items() if v})


if __name__ == "__main__":
    main()
