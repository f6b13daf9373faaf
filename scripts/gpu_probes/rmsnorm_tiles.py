"""GPU probe behind the rmsnorm_linear b = 16 figures of the H200 runs (in docs/benchmarks.md
before 507cb26): split-K forms with wider W tiles (256 columns, 8 or 16 splits), 128-column
tiles in 16 splits, and the table's winners (variants 14 and 15), swapped, with and without the
fused combine, with W loaded as generated or with ``eviction_policy="evict_first"``, at several
warps / stages; each checked against float32 and timed under CUDA-graph replay with rotated
inputs, beside torch.compile.

Usage, on the GPU machine from the repository root: ``python scripts/gpu_probes/rmsnorm_tiles.py
BATCHES`` (LIMIT=seconds in the environment stops timing early). The runs behind the figures
(H200, Triton 3.6, 2026-11-23, at 8f2e592): ``16 1`` (its table printed b = 1 only) and ``16``.
"""
import importlib.util
import os
import re
import sys
import tempfile
import time

from egraph_mirage import benchmarks as bm
from egraph_mirage.bench import handwritten_fixtures as hw
from egraph_mirage.gpu import baselines, timing, torch_eval

T0 = time.time(); LIMIT = float(os.environ.get("LIMIT", "520"))
timer = timing.CudaTimer(); rows = []

def transform(src, kind):
    if kind == "orig":
        return src
    if kind == "evict":
        return re.sub(r"(= tl\.load\(in1 \+ b1_off \+ i \* \d+)\)", r'\1, eviction_policy="evict_first")', src)

def load(src, tag):
    d = tempfile.mkdtemp(); p = os.path.join(d, f"m_{tag}.py"); open(p, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"m_{tag}", p)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m

for b in [int(x) for x in sys.argv[1:]]:
    g = bm.get("rmsnorm_linear", b)
    sets = timing.input_sets(g, timing.rotation_count(timing.graph_bytes(g), timing.l2_bytes()))
    ref = torch_eval.evaluate(g, sets[0])[0]
    c = baselines.compiled(g)
    print(f"b={b} compile graph {timer.graph(c.fn, sets):.2f}", flush=True)
    vs = hw.variants("rmsnorm_linear", g)
    cands = [("v14", vs[14]), ("v15", vs[15]),
             ("n256s8", hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=256))),
             ("n256s16", hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=256, splits=16))),
             ("n128s16", hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=128, splits=16)))]
    for label, mg in cands:
        for fuse in (False, True):
            base = mg.generate_triton_program(tempfile.mktemp(suffix=".py"), swap_dots=True, fuse_combines=fuse)
            for kind in ("orig", "evict"):
                mod = load(transform(base, kind), f"r{b}{label}{fuse}{kind}")
                for w, s in [(4, 3), (8, 3), (4, 4), (8, 4), (8, 5)]:
                    if time.time() - T0 > LIMIT: break
                    try:
                        fn = lambda *xs: mod.launch(*xs, num_warps=w, num_stages=s)
                        err = torch_eval.relative_error(fn(*sets[0])[0], ref)
                        us = timer.graph(fn, sets) if err < 5e-3 else float("nan")
                    except Exception as ex:
                        print("fail", label, fuse, kind, w, s, type(ex).__name__, str(ex)[:150], flush=True); continue
                    rows.append((b, label, fuse, kind, w, s, us, err))
print("TABLE")
for r in sorted(rows, key=lambda r: (r[0], r[6]))[:60]:
    print(*r[:6], f"{r[6]:.2f}", f"{r[7]:.1e}")
