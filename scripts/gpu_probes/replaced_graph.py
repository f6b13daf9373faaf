"""GPU probe: why is a decode graph with a piece replaced slower than Inductor's code for it,
when the piece alone is not?

In `bench generate` (8-layer Llama at 8B sizes, b = 1, H200, commit 502779f) the graph with the
8 output projections (`matmul add`, 11.4 against Inductor's 11.9 µs alone) replaced ran
1,484.2 µs against 1,438.5, and with the first layer's key RoPE (1.1 against 1.1 µs alone)
replaced too, 1,580.9. This compiles a decode step of `generate()` through the backend in
Inductor's mode MODE (default max-autotune-no-cudagraphs, so that the timer's CUDA graphs and
the profiler see every kernel), and where the backend judges the whole graph
(`fx.whole.WholeGraph.never_slower`), first builds and times, against Inductor's code for
Dynamo's graph: the graph with every chosen piece replaced, and with PER_WINNER=1 with each
kind of chosen piece alone (the pieces of one winner); for each, the GPU kernels whose µs per
call differ most from Inductor's code's.

Each graph is compiled twice: in MODE, and in MODE without coordinate descent tuning (Inductor's
benchmarking of each reduction kernel's block sizes at compile time), to tell its choices from
the graph's structure. The kernels are listed with their launches per call, µs per launch and
the launch config Inductor chose. Besides the sets of chosen pieces, the partitioned module
with nothing replaced is timed too (Inductor's code for the module the partition gives).

With FORCE=1 every winner the search timed is tried in the graph whether or not it was faster
alone (so that the probe does not depend on a close call: at 4 layers, budget 60, the first
layer's key RoPE won 1.09 against 1.11 µs in one run and lost in the next two).

Usage, on the GPU machine from the repository root (JAX on the CPU, egglog on the path):
  [FORCE=1] [PER_WINNER=1] [FAMILY=qwen3] [LAYER=hf-static] [ONE_TUNING=1] [CD_LOG=FILE] \
    python3 scripts/gpu_probes/replaced_graph.py OUT [LAYERS] [BUDGET] [MODE]
(FAMILY: the model family of ``bench generate``, default llama; LAYER: `bench torch`'s decode
layer at b = 1 in fp16 instead of a `generate()` step, LAYERS unused; ONE_TUNING: the graphs
compiled in MODE alone, not also without coordinate descent tuning; CD_LOG: a file for
Inductor's coordinate descent log, each config it benchmarked and its time.)

Seen (H200, 4 layers, budget 60, commit 502779f, MODE max-autotune-no-cudagraphs): with the
key RoPE replaced the graph took 1,046.6 µs against 878.4 (twice the same): Inductor's kernels
for the rest summed to 1,010.2 against 840.3 µs, 28 kinds against 25; its gate/up, QKV and
down projection kernels (reductions: Inductor turns the M = 1 matmuls into them) were the ones
slower, and the partitioned module writes the cache with `index_put` (torch.export's
decomposition of `index_copy_`) fused into the projections' reductions.

Seen (H200, LAYER=hf-static, budget 150, FORCE=1 PER_WINNER=1 ONE_TUNING=1, commit 31e1046):
each kind of replaced piece moved Inductor's kernels for the rest by more than it gained (the
down projection 31.4–40.6 µs against 31.7, coordinate descent's block sizes drawn anew); the
table is in docs/torch.md, section 5.

Seen (H200, LAYER=hf-static, budget 120 and 60, FORCE=1 PER_WINNER=1 ONE_TUNING=1, commit
b136627): Inductor's kernels for the rest came out with other block sizes in each graph, some
several times slower (the V projection with its cache write 29.9 against 6.6 µs, a norm 13.3
against 1.5), and Inductor's code for the graph itself at 134.8-139.1 µs in one run and
164.4-166.5 in the next; with CD_LOG its tuner is seen timing the host (17-40 µs for kernels of
1-12 µs). Since 5837f09 the backend's Inductor compilations tune by GPU time
(``fx.inductor_tuning``; ``scripts/gpu_probes/inductor_tuning.py``).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch

sys.path.insert(0, ".")


def main() -> None:
    from transformers import CompileConfig, GenerationConfig

    from egraph_mirage.bench.generate_bench import PRESETS, SharedBackend, build_model
    from egraph_mirage.fx import decision
    from egraph_mirage.fx import report as rep
    from egraph_mirage.fx.backend import Backend
    from egraph_mirage.fx.inductor_timing import time_graphs
    from egraph_mirage.fx.mutation import preserved, written
    from egraph_mirage.fx.whole import WholeGraph
    from egraph_mirage.rank.measured import keep_jax_off_the_gpu

    keep_jax_off_the_gpu()
    if os.environ.get("CD_LOG"):  # Inductor's coordinate descent: every config it benchmarks
        import logging

        handler = logging.FileHandler(os.environ["CD_LOG"])
        for name in ("torch._inductor.runtime.coordinate_descent_tuner",
                     "torch._inductor.runtime.triton_heuristics"):
            logging.getLogger(name).setLevel(logging.DEBUG)
            logging.getLogger(name).addHandler(handler)
    out = sys.argv[1]
    layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    budget = float(sys.argv[3]) if len(sys.argv) > 3 else 60.0
    mode = sys.argv[4] if len(sys.argv) > 4 else "max-autotune-no-cudagraphs"
    original = WholeGraph.never_slower
    # ONE_TUNING: only Inductor's mode as it is (half the compilations)
    tunings = (True,) if os.environ.get("ONE_TUNING") else (True, False)

    def probed(self: WholeGraph, names: list[str]) -> Any:
        xs = list(self.example_inputs)
        # a piece is built replaced with every replaced part of it (a refined piece's parts
        # cannot be chosen one by one): each set is a kind of top-level piece, named by what
        # its replaced parts compute (a model's identical layers: one set)
        parts: dict[str, list[str]] = {}
        for p in self.report.pieces:
            if p.status == rep.REPLACED and p.name.split(".")[0] in names:
                shapes = " ".join("x".join(map(str, s)) for s in p.shapes)
                what = f"{' '.join(p.operators)} on {shapes}"
                parts.setdefault(p.name.split(".")[0], []).append(what)
                print(f"chosen {p.name}: {what}: ours {p.ours_us} / {p.ours_plain_us}, Inductor "
                      f"{p.inductor_us} / {p.inductor_plain_us} µs", flush=True)
        by_winner: dict[str, list[str]] = {}
        for top, whats in parts.items():
            by_winner.setdefault(" + ".join(sorted(whats)), []).append(top)
        with preserved(self.gm, xs):
            # a name no piece has: the partitioned module with every piece as it was
            sets = ([("partitioned, none replaced", ["-"]), ("all", names)]
                    + (list(by_winner.items()) if len(by_winner) > 1 and
                       os.environ.get("PER_WINNER") else []))
            modes = torch._inductor.list_mode_options
            for tuned in tunings:
                # the mode's options without coordinate descent, where not tuned
                torch._inductor.list_mode_options = (modes if tuned else lambda *a, **k: {
                    o: v for o, v in modes(*a, **k).items() if o != "coordinate_descent_tuning"})
                with torch._inductor.config.patch(coordinate_descent_tuning=False,
                                                  fx_graph_cache=False):
                    inductor = self._inductor(self.mode)
                    k_ind = _kernels(inductor, xs)
                    for label, chosen in sets:
                        compiled = self.build(chosen, self.mode)
                        t = time_graphs(compiled, inductor, xs, written(self.gm))
                        print(f"== coordinate descent {tuned}: {label} ({len(chosen)} replaced, "
                              f"launch {self.report.launch}): ours {t['ours_us']:.1f} / "
                              f"{t.get('ours_plain_us') or 0:.1f}, Inductor "
                              f"{t['inductor_us']:.1f} / {t.get('inductor_plain_us') or 0:.1f} "
                              "µs (graph replay / plain)", flush=True)
                        _diff(k_ind, _kernels(compiled, xs))
            torch._inductor.list_mode_options = modes
        return original(self, names)

    def _kernels(fn: Any, xs: list[Any]) -> dict[str, tuple[float, float, str]]:
        """Each GPU kernel's (launches per call, µs per launch, its launch config)."""
        from torch.profiler import ProfilerActivity, profile

        calls = 10
        with torch.no_grad():
            for _ in range(3):
                fn(*xs)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn(*xs)
                torch.cuda.synchronize()
        configs = _configs()
        out = {}
        for e in prof.key_averages():
            us = float(getattr(e, "device_time_total", 0.0) or 0.0)
            if us > 0 and e.count:
                out[e.key[:90]] = (e.count / calls, us / e.count, configs.get(e.key, ""))
        return out

    def _configs() -> dict[str, str]:
        """Inductor's kernels in this process by name: the config each launched with."""
        import gc

        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        got = {}
        for o in gc.get_objects():
            if isinstance(o, CachingAutotuner) and getattr(o, "launchers", None):
                name = getattr(o.fn, "__name__", "?")
                got[name] = " ".join(str(getattr(l, "config", "?")) for l in o.launchers)[:110]
        return got

    def _diff(a: dict[str, Any], b: dict[str, Any]) -> None:
        total = {k: v[0] * v[1] for k, v in a.items()}
        total_b = {k: v[0] * v[1] for k, v in b.items()}
        keys = set(a) | set(b)
        for k in sorted(keys, key=lambda k: -abs(total_b.get(k, 0) - total.get(k, 0)))[:14]:
            print(f"   {k}", flush=True)
            for side, d in (("Inductor", a), ("ours", b)):
                if k in d:
                    n, us, cfg = d[k]
                    print(f"      {side}: {n:.0f} x {us:.1f} µs {cfg}", flush=True)
        print(f"   kernels: Inductor {len(a)} kinds {sum(total.values()):.1f} µs | ours "
              f"{len(b)} kinds {sum(total_b.values()):.1f} µs", flush=True)


    WholeGraph.never_slower = probed  # type: ignore[method-assign]
    if os.environ.get("FORCE"):  # every timed winner tried in the graph, faster alone or not
        decision.slower_alone = lambda times, timing: ""
    backend = Backend(budget=budget, workers=max(1, len(os.sched_getaffinity(0)) - 1),
                      cache_dir=os.path.join(out, "cache"))
    if os.environ.get("LAYER"):  # bench torch's decode layer instead of a generate() step
        _layer(os.environ["LAYER"], backend, mode)
        return
    model = build_model(os.environ.get("FAMILY", "llama"), PRESETS["llama3_8b"], layers, 128256,
                        torch.float16, "cuda", 1)
    prompt = torch.randint(1, 1000, (1, 128), device="cuda")
    config = GenerationConfig(
        max_new_tokens=3, do_sample=False, cache_implementation="static", max_cache_len=1024,
        eos_token_id=None, pad_token_id=0,
        compile_config=CompileConfig(backend=SharedBackend(backend), mode=mode, dynamic=False,
                                     fullgraph=False))
    with torch.no_grad():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    for r in backend.reports:
        print(r.text().splitlines()[0])
        if r.note:
            print("  note:", r.note)


def _layer(name: str, backend: Any, mode: str) -> None:
    """`bench torch`'s layer NAME (hf-static, hf-qwen3-static) at 8B sizes, b = 1, fp16,
    compiled through ``backend`` in Inductor's ``mode`` and called once."""
    from egraph_mirage.bench.torch_bench import (
        TorchBenchConfig,
        _input_sets,
        _module,
        _sizes,
        load_example,
    )

    cfg = TorchBenchConfig(models=(name,), preset="llama3_8b", device="cuda")
    example = load_example()
    module = _module(example, name, _sizes(example, cfg), torch.float16, "cuda")
    xs = _input_sets(module, 1, cfg)[0]
    fn = torch.compile(module, backend=backend, mode=mode, dynamic=False)
    with torch.no_grad():
        fn(*xs)
    for r in backend.reports:
        print(r.text())


if __name__ == "__main__":
    main()
