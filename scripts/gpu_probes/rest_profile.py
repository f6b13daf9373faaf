"""GPU probe: why a backend that hands Dynamo's graph to Inductor's ``compile_fx`` decodes
slower in ``generate()`` than ``torch.compile(backend="inductor")`` with the same mode
(``rest_generate.py``: 3.28 against 2.76 ms per token, 8 layers, b = 1, H200). For each of
the two, in mode "reduce-overhead": the decode ms per token, then a few decode steps under
``torch.profiler``: the GPU kernels and copies per step (name, count, µs), the CPU ops'
self time, and the kernels one has and the other lacks.

Usage, on the GPU machine from the repository root:
  python3 scripts/gpu_probes/rest_profile.py [LAYERS] [NEW_TOKENS] [ORDER] [ROUNDS]
(ORDER: a comma-separated list of inductor, compile_fx, wrapper (torch.compile's own
Inductor wrapper passed as a backend object); ROUNDS > 1: only the ms per token, alternating)
"""
from __future__ import annotations

import collections
import sys

import torch

sys.path.insert(0, ".")
from egraph_mirage.bench.generate_bench import (
    PRESETS,
    GenerateBenchConfig,
    build_model,
    timed_generate,
)


def via_compile_fx(gm, example_inputs, mode=None, options=None):
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    via_compile_fx.seen.append((len(example_inputs), type(gm).__name__))
    return compile_fx(gm, example_inputs, config_patches=dict(list_mode_options(mode)))


via_compile_fx.__name__ = "compile_fx"
via_compile_fx.seen = []


def main() -> None:
    from torch.profiler import ProfilerActivity, profile
    from transformers import CompileConfig

    layers = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    new = int(sys.argv[2]) if len(sys.argv) > 2 else 32
    model = build_model("llama", PRESETS["llama3_8b"], layers, 128256, torch.float16, "cuda", 1)
    prompt = torch.randint(1, 1000, (1, 128), device="cuda")
    order = (sys.argv[3] if len(sys.argv) > 3 else "inductor,compile_fx").split(",")
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    wrapper = torch._TorchCompileInductorWrapper("reduce-overhead", None, False)
    named = {"inductor": "inductor", "compile_fx": via_compile_fx, "wrapper": wrapper}
    backends = {k: named[k] for k in order}
    steps = 4
    tables = {}
    for name, b in [kv for _ in range(rounds) for kv in backends.items()]:
        cc = CompileConfig(backend=b, mode="reduce-overhead", dynamic=False, fullgraph=False)

        def gen(n: int) -> float:
            return timed_generate(model, prompt, n, cc, GenerateBenchConfig())[1]

        torch._dynamo.reset()
        gen(3)
        gen(3)
        ms = min((gen(new + 1) - gen(1)) / new * 1e3 for _ in range(2))
        print(f"{name}: {ms:.3f} ms per token", flush=True)
        if rounds > 1:
            continue
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     with_stack=True) as p:
            gen(steps + 1)
        gpu = collections.defaultdict(lambda: [0, 0.0])
        cpu = collections.defaultdict(float)
        for e in p.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                gpu[e.name[:90]][0] += 1
                gpu[e.name[:90]][1] += e.device_time
            else:
                cpu[e.name[:70]] += e.self_cpu_time_total
        tables[name] = gpu
        stacks = collections.Counter()
        for e in p.events():
            if e.name in ("cudaStreamSynchronize", "cudaMemcpyAsync", "cudaDeviceSynchronize"):
                frames = [f for f in (e.stack or []) if "site-packages/torch/" not in f
                          or "_inductor" in f or "_dynamo" in f][:8]
                stacks[(e.name, tuple(frames))] += 1
        print(f"--- {name}: synchronising calls by Python stack (count)")
        for (what, frames), c in stacks.most_common(8):
            print(f"  {c:5d} {what}")
            for f in frames:
                print(f"          {f}")
        print(f"--- {name}: GPU kernels over {steps} steps + prefill (count, µs), top 40")
        for k, (c, us) in sorted(gpu.items(), key=lambda kv: -kv[1][1])[:40]:
            print(f"  {c:6d} {us:10.1f}  {k}")
        print(f"--- {name}: CPU self time, top 25 (µs)")
        for k, us in sorted(cpu.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {us:10.1f}  {k}")
    if len(tables) < 2:
        return
    a, b = tables["inductor"], tables["compile_fx"]
    print("--- kernels whose counts differ (inductor, compile_fx)")
    for k in sorted(set(a) | set(b)):
        if a.get(k, [0])[0] != b.get(k, [0])[0]:
            print(f"  {a.get(k, [0, 0])[0]:6d} {b.get(k, [0, 0])[0]:6d}  "
                  f"{a.get(k, [0, 0.0])[1]:9.1f} {b.get(k, [0, 0.0])[1]:9.1f}  {k}")
    print("compile_fx saw graphs:", via_compile_fx.seen)


if __name__ == "__main__":
    main()
