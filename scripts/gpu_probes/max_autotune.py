"""GPU probe: torch.compile's max-autotune mode (``max-autotune-no-cudagraphs``, Inductor's own
CUDA graphs off so that both modes are timed by the same graph replay) against the default mode,
baselines only, per program and batch, under CUDA-graph replay and plain launches with rotated
inputs (the timer of ``bench gpu``). Each compile is timed too; a program whose max-autotune
compile runs past ``BUDGET`` seconds of the whole run is left out.

Usage, on the GPU machine from the repository root:
  python scripts/gpu_probes/max_autotune.py rmsnorm_linear:1,8,16 gated_mlp:1 ...
(BUDGET=seconds in the environment, default 500).
"""
import os
import sys
import time

sys.path.insert(0, ".")
import torch

import egraph_mirage as em
from egraph_mirage.gpu import baselines, timing

T0 = time.time()
BUDGET = float(os.environ.get("BUDGET", "500"))
timer = timing.CudaTimer()
rows = []
for arg in sys.argv[1:]:
    name, batches = arg.split(":")
    for b in (int(x) for x in batches.split(",")):
        if time.time() - T0 > BUDGET:
            print(f"{name} b={b}: left out (budget)", flush=True)
            continue
        g = em.benchmarks.get(name, b)
        sets = timing.input_sets(g, timing.rotation_count(timing.graph_bytes(g), timing.l2_bytes()))
        out = {}
        for mode in (False, True):
            c = baselines.compiled(g, max_autotune=mode)
            t = time.time()
            with torch.no_grad():
                c.fn(*sets[0])
            torch.cuda.synchronize()
            compile_s = time.time() - t
            out[mode] = (timer.graph(c.fn, sets), timer.plain(c.fn, sets), compile_s)
            print(f"{name} b={b} {'max-autotune' if mode else 'default'}: graph "
                  f"{out[mode][0]:.1f} us, plain {out[mode][1]:.1f} us, compile {compile_s:.0f} s",
                  flush=True)
        rows.append((name, b, out))
print("\nprogram b | default graph / plain | max-autotune graph / plain | compile s")
for name, b, o in rows:
    print(f"{name} {b} | {o[False][0]:.1f} / {o[False][1]:.1f} | {o[True][0]:.1f} / {o[True][1]:.1f}"
          f" | {o[False][2]:.0f} / {o[True][2]:.0f}")
