"""GPU probe behind docs/lowering.md's exponential figures (section 4): the generated attention
kernels with their exp written in other forms, each checked against float32 (inputs of std 0.1,
and of std 0.35: the "big" column) and timed under CUDA-graph replay with rotated inputs.

Forms (text transforms of the generated source; they look for ``tl.exp(``, so they apply to
sources generated before commit 8f2e592, which made the lowering write exp2 itself):
  orig  the source as generated
  h     exp2 in half precision: ex2.approx.f16x2 of (x * log2 e) rounded to fp16
  hq    as h, with the loop-invariant Q tile scaled by log2 e once (rounded to fp16)
  q2    fp32 exp2, Q tile scaled by log2 e once (no multiply in the loop)
  e2    fp32 exp2 of x * log2 e (what the lowering writes since 8f2e592)

Usage, on the GPU machine from the repository root: ``python scripts/gpu_probes/exp_forms.py
GROUPS`` (LIMIT=seconds in the environment stops timing early). The runs behind the figures
(H200, Triton 3.6, 2026-11-23): ``mqa16 gqa1`` at 5bd867a (an earlier version of this script:
forms orig, h, hq and q2 for mqa16, orig and hq for gqa1, other tilings), ``mqa16 gqa1 more`` at 5bd867a, and ``gqa1new`` with 8c8f93b's
handwritten.py, now bench/handwritten_fixtures.py (the split-KV tilings under the Hopper budget; ``orig`` is exp2 there).
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

T0 = time.time()
LIMIT = float(os.environ.get("LIMIT", "520"))
which = sys.argv[1:]

HELPER = '''
@triton.jit
def _ex2h(x):
    return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [x], dtype=tl.float16, is_pure=True, pack=2)

'''

def transform(src, kind):
    if kind == "orig":
        return src
    m = re.search(r"^(\s*)(\w+) = tl\.exp\((\w+)\)$", src, re.M)
    assert m, "no exp"
    ind, e, a = m.groups()
    if kind == "h":     # scale in fp32, round to fp16, ex2 f16x2
        new = f"{ind}{e} = _ex2h(({a} * 1.4426950408889634).to(tl.float16))"
    elif kind == "hq":  # Q prescaled by log2 e (rounded to fp16 once)
        new = f"{ind}{e} = _ex2h({a}.to(tl.float16))"
    elif kind == "q2":  # Q prescaled, fp32 exp2
        new = f"{ind}{e} = tl.math.exp2({a})"
    elif kind == "e2":  # fp32 exp2 of the scaled product
        new = f"{ind}{e} = tl.math.exp2({a} * 1.4426950408889634)"
    src = src[:m.start()] + new + src[m.end():]
    src = re.sub(rf"tl\.sum\({e}, ", f"tl.sum({e}.to(tl.float32), ", src)
    if kind in ("hq", "q2"):
        # the loop-invariant Q tile b0 (first load) scaled once
        m2 = re.search(r"^(\s*)(b0) = tl\.load\((.*)\)$", src, re.M)
        assert m2
        src = src[:m2.end()] + f"\n{m2.group(1)}b0 = (b0.to(tl.float32) * 1.4426950408889634).to(tl.float16)" + src[m2.end():]
    src = src.replace("\n@triton.jit\ndef kernel_0", HELPER + "\n@triton.jit\ndef kernel_0", 1)
    return src

def load(src, tag):
    d = tempfile.mkdtemp()
    p = os.path.join(d, f"m_{tag}.py")
    open(p, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"m_{tag}", p)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m

timer = timing.CudaTimer()
rows = []
def bench(name, b, cands, transforms, knobs):
    g = bm.get(name, b)
    sets = timing.input_sets(g, timing.rotation_count(timing.graph_bytes(g), timing.l2_bytes()))
    ref = torch_eval.evaluate(g, sets[0])[0]
    big = timing.random_inputs(g, seed=99, std=0.35)
    refbig = torch_eval.evaluate(g, big)[0]
    sd = baselines.sdpa(g)
    if sd is not None:
        prep = sd.prepare if getattr(sd, "prepare", None) else (lambda xs: xs)
        ss = [prep(x) for x in sets]
        print(f"{name} b={b} sdpa graph {timer.graph(sd.fn, ss):.1f}", flush=True)
    for label, mg, opts in cands:
        base = mg.generate_triton_program(tempfile.mktemp(suffix=".py"), **opts)
        for kind in transforms:
            try:
                mod = load(transform(base, kind), f"{name}{b}{label}{kind}".replace("-", "_"))
            except Exception as ex:
                print("transform fail", label, kind, ex); continue
            for w, s in knobs:
                if time.time() - T0 > LIMIT:
                    return
                try:
                    fn = lambda *xs: mod.launch(*xs, num_warps=w, num_stages=s)
                    out = fn(*sets[0])[0]
                    err = torch_eval.relative_error(out, ref)
                    errbig = torch_eval.relative_error(fn(*big)[0], refbig)
                    us = timer.graph(fn, sets) if err < 5e-3 else float("nan")
                except Exception as ex:
                    print("fail", label, kind, w, s, type(ex).__name__, str(ex)[:200], flush=True); continue
                rows.append((name, b, label, kind, w, s, us, err, errbig))
                print(f"{name} b={b} {label:14s} {kind:5s} w{w} s{s} {us:7.2f} us err {err:.1e} big {errbig:.1e}", flush=True)


def cands_of(name, b, idx, fuses=(None,)):
    g = bm.get(name, b); vs = hw.variants(name, g)
    out = []
    for i in idx:
        for f in fuses:
            out.append((f"v{i}" + ("" if f is None else ("f" if f else "n")), vs[i], {} if f is None else {"fuse_combines": f}))
    return out
K = ["orig", "q2", "e2"]
if "gqa1new" in which:
    g = bm.get("gqa", 1)
    bench("gqa", 1, cands_of("gqa", 1, [3, 6, 7, 8], (False, True)), ["orig"], [(4, 3), (8, 3), (4, 2), (4, 4)])
    bench("mqa", 1, cands_of("mqa", 1, [0, 7, 8], (True,)), ["orig"], [(4, 3), (8, 3), (4, 4)])
if "mqa16" in which:
    bench("mqa", 16, cands_of("mqa", 16, [18, 12]), K, [(4, 3), (4, 4)])
if "gqa1" in which:
    g = bm.get("gqa", 1)
    from egraph_mirage.gpu import baselines as bl
    c = bl.compiled(g)
    sets = timing.input_sets(g, timing.rotation_count(timing.graph_bytes(g), timing.l2_bytes()))
    ss = [c.prepare(x) if getattr(c, "prepare", None) else x for x in sets]
    print("gqa b=1 compile graph", timer.graph(c.fn, ss), flush=True)
    cs = cands_of("gqa", 1, [0, 1, 2, 3, 4], (False, True))
    cs.append(("s16q32n", hw.attention(g, hw.Tiles(grid=32, loop=128, splits=16)), {"fuse_combines": False}))
    cs.append(("s4q32n", hw.attention(g, hw.Tiles(grid=32, loop=128, splits=4)), {"fuse_combines": False}))
    bench("gqa", 1, cs, K, [(4, 3), (4, 4), (2, 3)])
if "more" in which:
    bench("gqa", 16, cands_of("gqa", 16, [18]), K, [(4, 3), (4, 4)])
    bench("mqa", 8, cands_of("mqa", 8, [18]), K, [(4, 3), (4, 4)])
    bench("mha", 16, cands_of("mha", 16, [15]), K, [(2, 3), (4, 3)])
    bench("qknorm", 16, cands_of("qknorm", 16, [9]), K, [(4, 3)])

print("\nTABLE")
for r in sorted(rows, key=lambda r: (r[0], r[1], r[6])):
    print(*r[:6], f"{r[6]:.2f}", f"{r[7]:.1e}", f"{r[8]:.1e}")
