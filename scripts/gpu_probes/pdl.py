"""GPU probe: programmatic dependent launch (PDL) between the kernels of one generated program.

Each multi-kernel winner of the benchmark table is generated as usual, then patched: every
kernel launched after the program's first is launched with ``launch_pdl=True`` and waits for
the kernels before it (``tl.extra.cuda.gdc_wait()``) before its first statement; every kernel
with a successor lets it launch early (``gdc_launch_dependents()``). The program's first
kernel does not wait, so a call never overlaps the call before it. Both forms are checked
against float32 and timed under CUDA-graph replay with rotated inputs.

With ``late`` the trigger
goes before the first output store instead.

Usage, on the GPU machine from the repository root: ``python scripts/gpu_probes/pdl.py``
(``PLAIN=1``: also plain launches; ``ONLY=rmsnorm_linear:8``: one case; ``GENERATED=1``: the
lowering's own ``pdl=True`` program against the plain one).
"""
import importlib.util
import os
import re
import tempfile

from egraph_mirage import benchmarks as bm
from egraph_mirage.bench import handwritten_fixtures as hw
from egraph_mirage.gpu import timing, torch_eval

timer = timing.CudaTimer(); rows = []
# (program, batch, variant index, generation knobs, warps, stages): the table's winners
CASES = [("rmsnorm_linear", 1, 8, dict(swap_dots=True, fuse_combines=False), 4, 2),
         ("rmsnorm_linear", 8, 15, dict(swap_dots=True, fuse_combines=False), 8, 3),
         ("rmsnorm_linear", 16, 15, dict(swap_dots=True, fuse_combines=False), 8, 3),
         ("gqa", 8, 6, dict(fuse_combines=False), 4, 3),
         ("qknorm", 8, 5, dict(fuse_combines=False), 4, 3),
         ("qknorm", 16, 5, dict(fuse_combines=False), 4, 4)]

PDL_LAUNCH = '''

def _launch_pdl(kernel, grid, args, num_warps, num_stages):
    kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, launch_pdl=True)
'''


def patch(src, late=False):
    """``late``: the trigger goes before the kernel's first output store, not at its start."""
    order = re.findall(r"_launch\((kernel_\d+),", src)
    for k, name in enumerate(order):
        head = []
        if k > 0:
            head.append("    tl.extra.cuda.gdc_wait()")
        if k < len(order) - 1 and not late:
            head.append("    tl.extra.cuda.gdc_launch_dependents()")
        if head:
            src = re.sub(rf"(def {name}\([^)]*\):\n)", lambda m: m.group(1) + "\n".join(head) + "\n", src)
        if k < len(order) - 1 and late:
            at = src.index(f"def {name}(")
            out = src.index("    # output 0:", at)
            src = src[:out] + "    tl.extra.cuda.gdc_launch_dependents()\n" + src[out:]
        if k > 0:
            src = src.replace(f"_launch({name},", f"_launch_pdl({name},")
    return src + PDL_LAUNCH, len(order)


def load(src, tag):
    d = tempfile.mkdtemp(); p = os.path.join(d, f"m_{tag}.py"); open(p, "w").write(src)
    spec = importlib.util.spec_from_file_location(f"m_{tag}", p)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m


PLAIN = os.environ.get("PLAIN") == "1"  # also time plain launches (do_bench, L2 flushed)
GENERATED = os.environ.get("GENERATED") == "1"  # the lowering's own pdl=True program instead
ONLY = os.environ.get("ONLY")  # e.g. "rmsnorm_linear:8": that case alone
for name, b, vi, knobs, w, s in CASES:
    if ONLY and ONLY != f"{name}:{b}":
        continue
    g = bm.get(name, b)
    sets = timing.input_sets(g, timing.rotation_count(timing.graph_bytes(g), timing.l2_bytes()))
    ref = torch_eval.evaluate(g, sets[0])[0]
    base = hw.variants(name, g)[vi].generate_triton_program(tempfile.mktemp(suffix=".py"), **knobs)
    patched, launches = patch(base)
    late, _ = patch(base, late=True)
    generated = hw.variants(name, g)[vi].generate_triton_program(tempfile.mktemp(suffix=".py"),
                                                                 pdl=True, **knobs)
    kinds = (("plain", base), ("pdl", patched), ("pdl_late", late), ("plain2", base),
             ("pdl2", patched), ("pdl_late2", late))
    if GENERATED:
        kinds = (("plain", base), ("generated_pdl", generated), ("plain2", base),
                 ("generated_pdl2", generated))
    for kind, src in kinds:
        try:
            mod = load(src, f"{name}{b}{kind}")
            fn = lambda *xs: mod.launch(*xs, num_warps=w, num_stages=s)
            err = torch_eval.relative_error(fn(*sets[0])[0], ref)
            us = timer.graph(fn, sets) if err < 5e-3 else float("nan")
            plain = timer.plain(fn, sets) if PLAIN else float("nan")
        except Exception as ex:
            print("fail", name, b, kind, type(ex).__name__, str(ex)[:300], flush=True); continue
        rows.append((name, b, vi, launches, kind, us, err, plain))
        print(*rows[-1], flush=True)
print("TABLE")
for r in rows:
    print(*r[:5], f"{r[5]:.2f}", f"{r[6]:.1e}", f"plain {r[7]:.2f}")
