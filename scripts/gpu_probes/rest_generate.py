"""GPU probe: does the backend's code for what it does not replace run generate() as fast as
``torch.compile``? In `bench generate` (8-layer Llama at 8B sizes, b = 1, H200) the backend
with nothing replaced decoded at 3.24 ms per token against 2.65 for torch.compile's
reduce-overhead. This times generate()'s decode with three compile configurations, each in
mode "reduce-overhead", in alternating rounds:

- ``inductor``: torch.compile's own backend;
- ``compile_fx``: a backend that hands Dynamo's graph to Inductor's ``compile_fx`` with
  reduce-overhead's options (what the backend does with a graph it replaces nothing in);
- ``backend``: the egraph_mirage ``Backend`` whose search finds nothing (no search time);
- ``timed``: the same with ``profile=True``, as the default options run it on a GPU: Inductor's
  code for the graph compiled in each of its modes and timed (``fx.whole``) before the faster
  is returned. In `bench generate` on H200s (2026-11-28, 8-layer Llama at 8B sizes, b = 1)
  what a step spends around the compiled call varied by mode and run from 0.59 to 0.92 ms,
  the backend's mode 0.14 ms above max-autotune's where it kept every piece (the same
  Inductor code) and 0.2 ms below it on another host: this tells whether compiling and timing
  the graph's code in the backend changes it.

Usage, on the GPU machine from the repository root (MODE: "reduce-overhead", the default, or
"max-autotune"):
  python3 scripts/gpu_probes/rest_generate.py [LAYERS] [NEW_TOKENS] [ROUNDS] [MODE]
"""
from __future__ import annotations

import statistics
import sys

import torch

sys.path.insert(0, ".")
from egraph_mirage.bench.generate_bench import (
    PRESETS,
    GenerateBenchConfig,
    SharedBackend,
    build_model,
    timed_generate,
)
from egraph_mirage.fx.backend import Backend
from egraph_mirage.search.results import SearchResults, SearchStats


def via_compile_fx(gm, example_inputs, mode=None, options=None):
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=dict(list_mode_options(mode)))


via_compile_fx.__name__ = "compile_fx"


def main() -> None:
    from transformers import CompileConfig

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    mode = sys.argv[4] if len(sys.argv) > 4 else "reduce-overhead"
    model = build_model("llama", PRESETS["llama3_8b"], layers, 128256, torch.float16, "cuda", 1)
    prompt = torch.randint(1, 1000, (1, 128), device="cuda")
    nothing = Backend(search=lambda g, config, **o: SearchResults([], SearchStats()),
                      cache=False, profile=False, workers=1)
    timed = Backend(search=lambda g, config, **o: SearchResults([], SearchStats()),
                    cache=False, profile=True, workers=1)
    backends = {"inductor": "inductor", "compile_fx": via_compile_fx,
                "backend": SharedBackend(nothing), "timed": SharedBackend(timed)}
    configs = {k: CompileConfig(backend=b, mode=mode, dynamic=False,
                                fullgraph=False) for k, b in backends.items()}

    def gen(name: str, n: int) -> float:
        torch._dynamo.reset()  # each configuration compiles its own code
        cfg = GenerateBenchConfig()
        timed_generate(model, prompt, 2, configs[name], cfg)  # compile, warm
        out = [timed_generate(model, prompt, k, configs[name], cfg)[1] for k in (1, n + 1)]
        return (out[1] - out[0]) / n * 1e3

    got: dict[str, list[float]] = {k: [] for k in configs}
    for r in range(rounds):
        for name in configs:
            ms = gen(name, new)
            got[name].append(ms)
            print(f"round {r} {name}: {ms:.3f} ms per token", flush=True)
    print(f"\n{torch.cuda.get_device_name()}: decode ms per token, median of {rounds} rounds "
          f"({layers} layers, b = 1, fp16, mode {mode})")
    if timed.reports:
        print(timed.reports[-1].text().splitlines()[0])
    for name, v in got.items():
        print(f"  {name:10} {statistics.median(v):.3f}  {[round(x, 3) for x in v]}")


if __name__ == "__main__":
    main()
