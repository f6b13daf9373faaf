"""GPU probe: why a second compilation from the backend's cache misses AOTAutograd's cache, and
where its time goes.

`bench generate --again` compiles the backend's mode a second time after a Dynamo reset, from
its cache: no search runs, Inductor's cache of compiled graphs hits, yet AOTAutograd's cache
misses (``again_torch_caches``) and the "Inductor" stage takes 23-28 s on an 8-layer Llama at
b = 1 (H200). This compiles a ``LAYERS``-layer Llama at 8B sizes through ``generate()`` with
the backend three times on one cache (the first searches, the others come from the cache),
records every AOTAutograd cache key computed (with its debug lines: what each part of the key
hashes to) and, per compilation, the kernels Inductor's coordinate-descent tuning runs on at
the first call, with their autotune-cache state (for a hit, the ``.best_config`` files of the
kernel's folder, which other kernels may share); it prints the second compilation's cProfile,
by cumulative and by own time, and for the last graph's keys of the first and second
compilations, and of the second and third, the debug lines that differ. Each compilation's
last key's lines are written to ``$OUT/key_<compilation>.txt``.
(``aot_cache_key.py`` compares the keys of one stand-in winner compiled twice, both from its
decision; this one a model whose first compilation searched.)

Usage, on the GPU machine from the repository root, egglog on the path (``pip install
--no-deps --target /tmp/egg .whl/*.whl`` and ``PYTHONPATH=/tmp/egg``, as ``gpu_host.sh`` does):
  python3 scripts/gpu_probes/recompile_keys.py [LAYERS] [BUDGET] [WORKERS]

Figures (H200, 2 layers, budget 75 s, 15 workers, 2026-11-29): the first compilation 300.4 s
(6 pieces replaced); the second, from the cache, 17.5 s, its AOTAutograd key differing from the
first's in the pickled module only (``gm``: its code is the same but for the kernels'
side-table indices, which the key leaves out, so the difference is in the module's state); the
third, from the cache again, 20.4 s, hitting the second's key (no faster for it). Each cached
compilation ran Inductor's coordinate-descent tuning again at its first call (19 and 20
kernels; 7 with nothing replaced, where it took about 64 benchmarks and 41 Triton compilations
of a 21.8 s compilation whose backend stages took 4.8 s), among them kernels whose
autotune-cache entry was found.
"""
from __future__ import annotations

import cProfile
import glob
import io
import os
import pstats
import sys
import tempfile
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


def main() -> None:
    from torch._dynamo.utils import counters
    from torch._functorch._aot_autograd import autograd_cache
    from transformers import CompileConfig

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    budget = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    cache = tempfile.mkdtemp(prefix="em_cache_")
    model = build_model("llama", PRESETS["llama3_8b"], layers, 128256, torch.float16, "cuda", 1)
    prompt = torch.randint(1, 1000, (1, 128), device="cuda")
    keys: list[tuple[str, list[str]]] = []
    original = autograd_cache.autograd_cache_key

    def recording(*args: Any, **kwargs: Any) -> Any:
        key, lines = original(*args, **kwargs)
        keys.append((key, list(lines)))
        return key, lines

    autograd_cache.autograd_cache_key = recording
    from torch._inductor.runtime import triton_heuristics as th

    tuned: list[str] = []
    coordesc = th.CachingAutotuner.coordinate_descent_tuning

    def tuning(self: Any, *args: Any, **kwargs: Any) -> Any:
        info = getattr(self, "autotune_cache_info", None) or {}
        state = info.get("autotune_cache_state")
        saved = ""
        if state == "hit":  # what the autotune cache held for it: why tune again
            folder = os.path.dirname(getattr(self, "filename", "") or ".")
            saved = " ".join(open(f).read() for f in glob.glob(f"{folder}/*.best_config"))
        tuned.append(f"{self.fn.__name__}: {state} {saved}")
        return coordesc(self, *args, **kwargs)

    th.CachingAutotuner.coordinate_descent_tuning = tuning

    def compiled(label: str, profile: bool) -> list[tuple[str, list[str]]]:
        torch._dynamo.reset()
        counters.clear()
        start = len(keys)
        tuned.clear()
        backend = Backend(budget=budget, workers=workers, cache_dir=cache)
        config = CompileConfig(backend=SharedBackend(backend), mode="reduce-overhead",
                               dynamic=False, fullgraph=False)
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        seconds = timed_generate(model, prompt, 3, config, GenerateBenchConfig())[1]
        if prof:
            prof.disable()
        print(f"== {label}: {seconds:.1f} s; aot {dict(counters['aot_autograd'])}; "
              f"inductor {dict(counters['inductor']).get('fxgraph_cache_hit', 0)} hit(s) "
              f"{dict(counters['inductor']).get('fxgraph_cache_miss', 0)} miss(es); "
              f"{len(keys) - start} AOT key(s)", flush=True)
        print(f"   coordinate descent tuning of {len(tuned)} kernel(s): {tuned[:8]}")
        for r in backend.reports:
            print("   ", r.text().splitlines()[0][:200])
            print("   ", [ln for ln in r.text().splitlines() if "time:" in ln][:1])
        if prof:
            for order in ("cumulative", "tottime"):
                text = io.StringIO()
                pstats.Stats(prof, stream=text).sort_stats(order).print_stats(30)
                print(f"-- by {order}")
                print("\n".join(text.getvalue().splitlines()[-36:]), flush=True)
        return keys[start:]

    runs = {"first": compiled("first", False)}
    runs["again"] = compiled("again", True)
    runs["again 2"] = compiled("again 2", False)
    out = os.environ.get("OUT", ".")
    for name, got in runs.items():  # the last graph's key: the one with the pieces replaced
        with open(f"{out}/key_{name.replace(' ', '_')}.txt", "w") as f:
            f.write("\n".join(got[-1][1]) if got else "")
    for a, b in (("first", "again"), ("again", "again 2")):
        (k1, l1), (k2, l2) = runs[a][-1], runs[b][-1]
        print(f"{a} / {b}, last key: {'same' if k1 == k2 else 'differs'} "
              f"({len(l1)} / {len(l2)} lines)")
        for ln in [x for x in l1 if x not in set(l2)][:12]:
            print(f"   {a}:", ln[:400])
        for ln in [x for x in l2 if x not in set(l1)][:12]:
            print(f"   {b}:", ln[:400])


if __name__ == "__main__":
    main()
