"""GPU probe: where a ``generate()`` decode step spends its host time, per compile configuration.

In `bench generate` (8-layer Llama at 8B sizes, b = 1, H200) a step of the backend's mode spent
more time around its compiled call than max-autotune's (2.299 ms a step against 2.237, with its
graph 0.10 ms faster replayed). This compiles the model's forward in each of these
configurations (``CONFIG``: a comma-separated choice, default all), all in ``torch.compile``
mode "max-autotune" (CUDA graphs), through transformers' own compiled path (a static cache):

- ``inductor``: ``torch.compile``'s own backend;
- ``compile_fx``: a custom backend that hands Dynamo's graph to Inductor's ``compile_fx``;
- ``backend``: the egraph_mirage ``Backend`` whose search finds nothing (every piece kept: the
  graph is Inductor's code, compiled through the backend's rest), ``profile=False``;
- ``named``: ``compile_fx``'s backend under the name "inductor" (``__name__``: the name
  ``torch.compile`` and Dynamo know a callable backend by);
- ``bare``: ``backend`` returning Inductor's compiled callable itself, not wrapped in a function
  of its own.

After each configuration's first call, the number of Dynamo cache entries on the compiled
frames' code (all configurations share them, each entry guarded by its backend).

Then, as `bench generate` does, it times each configuration's decode in alternating rounds
(``generate()`` of 1 and of ``NEW + 1`` tokens, the compiled forward put back on the model),
and last profiles one ``generate()`` of ``NEW + 1`` tokens per configuration under
``cProfile``: per configuration the Python calls per decode step and the functions with the
most own time, so that what one configuration does more per step shows.

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  python3 scripts/gpu_probes/step_profile.py [LAYERS] [NEW] [ROUNDS] [CONFIG,...]
Figures (docs/torch.md section 6): 8 64 3 on two H200 hosts, Inductor 2.347 / 2.366 ms a step,
``compile_fx`` 2.446 / 2.404, ``named`` 2.425, ``backend`` 2.540 / 2.458, ``bare`` 2.417.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
from typing import Any

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


def via_compile_fx(gm: Any, example_inputs: Any, mode: Any = None, options: Any = None) -> Any:
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, config_patches=dict(list_mode_options(mode)))


via_compile_fx.__name__ = "compile_fx"


def named_compile_fx(gm: Any, example_inputs: Any, mode: Any = None, options: Any = None) -> Any:
    return via_compile_fx(gm, example_inputs, mode, options)


named_compile_fx.__name__ = "inductor"


class Bare(Backend):
    """The backend returning what it compiled as it is (no function of its own around it)."""

    def _finish(self, compiled: Any, report: Any) -> Any:
        self.reports.append(report)
        return compiled


def entries(model: Any) -> dict[str, int]:
    """Dynamo's cache entries per code object of the model's call path that has any."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    codes = {"forward": type(model).forward.__code__,
             "_wrapped_call_impl": torch.nn.Module._wrapped_call_impl.__code__,
             "_call_impl": torch.nn.Module._call_impl.__code__}
    out = {k: len(_debug_get_cache_entry_list(c)) for k, c in codes.items()}
    return {k: n for k, n in out.items() if n}


def main() -> None:
    from transformers import CompileConfig

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    model = build_model("llama", PRESETS["llama3_8b"], layers, 128256, torch.float16, "cuda", 1)
    prompt = torch.randint(1, 1000, (1, 128), device="cuda")
    nothing = Backend(search=lambda g, config, **o: SearchResults([], SearchStats()),
                      cache=False, profile=False, workers=1)
    bare = Bare(search=lambda g, config, **o: SearchResults([], SearchStats()),
                cache=False, profile=False, workers=1)
    backends = {"inductor": "inductor", "compile_fx": via_compile_fx,
                "backend": SharedBackend(nothing),
                "named": named_compile_fx,
                "bare": SharedBackend(bare)}
    chosen = sys.argv[4].split(",") if len(sys.argv) > 4 else list(backends)
    configs = {k: CompileConfig(backend=backends[k], mode="max-autotune", dynamic=False,
                                fullgraph=False) for k in chosen}
    calls: dict[str, tuple[Any, Any]] = {}

    def gen(name: str, n: int) -> float:
        if name in calls:
            model._compiled_call, model._last_compile_config = calls[name]
        seconds = timed_generate(model, prompt, n, configs[name], GenerateBenchConfig())[1]
        calls[name] = (model._compiled_call, model._last_compile_config)
        return seconds

    for name in configs:
        print(f"{name}: first generate() {gen(name, 3):.1f} s; cache entries {entries(model)}",
              flush=True)
    got: dict[str, list[float]] = {k: [] for k in configs}
    names = list(configs)
    for r in range(rounds + 1):
        for name in names[r % len(names):] + names[:r % len(names)]:
            one = min(gen(name, 1) for _ in range(2))
            ms = (gen(name, new + 1) - one) / new * 1e3
            if r:
                got[name].append(ms)
            print(f"round {r} {name}: {ms:.3f} ms per step", flush=True)
    print(f"\n{torch.cuda.get_device_name()}: decode ms per step, median of {rounds} rounds "
          f"({layers} layers, b = 1, fp16, max-autotune)")
    for name, v in got.items():
        print(f"  {name:10} {statistics.median(v):.3f}  {[round(x, 3) for x in v]}")
    for name in configs:
        gen(name, new + 1)
        prof = cProfile.Profile()
        prof.enable()
        gen(name, new + 1)
        prof.disable()
        stats = pstats.Stats(prof)
        print(f"\n== {name}: {stats.total_calls / new:.0f} Python calls per step, "
              f"{stats.total_tt / new * 1e3:.3f} ms per step under cProfile")
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(22)
        print("\n".join(text.getvalue().splitlines()[-30:]))


if __name__ == "__main__":
    main()
