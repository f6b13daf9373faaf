"""GPU probe: a skinny matmul (few rows of X against a wide W, the decode-time GEMV of
rmsnorm_linear and gated_mlp at b = 1) written two ways in the split-K kernel the search finds
for rmsnorm_linear (grid: K splits x column tiles; loop over the split's K tiles; fp32 partials):

  dot   X's tile padded to 16 rows and ``tl.dot`` (what the lowering writes today)
  reg   no tensor cores: ``tl.sum(x[:, :, None] * w[None, :, :], axis=1)`` in fp32 on the real
        rows, W's tile going from device memory to registers without a pass through shared memory

Each is checked against float32 and timed under CUDA-graph replay with rotated inputs (the
partials kernel alone, and with the combine kernel that sums the pieces, takes X's rms and
divides), beside torch.compile of the program and the copy floor.

Usage, on the GPU machine from the repository root: ``python scripts/gpu_probes/register_dots.py
[BATCH...]`` (default 1; LIMIT=seconds in the environment stops timing early).
"""
import os
import sys
import time

import torch
import triton
import triton.language as tl

from egraph_mirage import benchmarks as bm
from egraph_mirage.gpu import baselines, timing, torch_eval
from egraph_mirage.gpu.floor import Floor, measure_copy_bandwidth

T0 = time.time()
LIMIT = float(os.environ.get("LIMIT", "240"))


@triton.jit
def partials(x, w, part, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
             BK: tl.constexpr, BN: tl.constexpr, KS: tl.constexpr, REG: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = tl.arange(0, MP)
    cols = pid_n * BN + tl.arange(0, BN)
    base = pid_k * (K // KS)
    acc = tl.zeros((MP, BN), tl.float32)
    for i in range(K // KS // BK):
        kk = base + i * BK + tl.arange(0, BK)
        a = tl.load(x + rows[:, None] * K + kk[None, :], mask=rows[:, None] < M, other=0.0)
        b = tl.load(w + kk[:, None] * N + cols[None, :])
        if REG:
            acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        else:
            acc += tl.dot(a, b)
    tl.store(part + pid_k * M * N + rows[:, None] * N + cols[None, :], acc,
             mask=rows[:, None] < M)


@triton.jit
def combine(x, part, out, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, BN: tl.constexpr,
            KS: tl.constexpr, BX: tl.constexpr):
    pid_n = tl.program_id(0)
    rows = tl.arange(0, M)
    cols = pid_n * BN + tl.arange(0, BN)
    ss = tl.zeros((M, 1), tl.float32)
    for i in tl.static_range(K // BX):
        xx = tl.load(x + rows[:, None] * K + i * BX + tl.arange(0, BX)[None, :]).to(tl.float32)
        ss += tl.sum(xx * xx, axis=1, keep_dims=True)
    acc = tl.zeros((M, BN), tl.float32)
    for s in tl.static_range(KS):
        acc += tl.load(part + s * M * N + rows[:, None] * N + cols[None, :])
    tl.store(out + rows[:, None] * N + cols[None, :], (acc / tl.sqrt(ss / K)).to(tl.float16))


def forms(m: int, k: int, n: int):
    for bk, bn, ks in [(64, 64, 4), (128, 64, 4), (64, 128, 4), (128, 128, 4), (32, 64, 4),
                       (64, 64, 8), (128, 64, 8), (256, 64, 8), (64, 32, 4), (128, 32, 8),
                       (256, 32, 8), (64, 64, 16), (128, 128, 8), (32, 128, 8)]:
        for w, s in [(4, 3), (8, 3), (4, 4), (2, 3)]:
            for reg in (False, True):
                if reg and bk * bn * max(m, 2) > 16384 * w // 4:
                    continue  # the broadcast product would not fit the block's registers
                yield reg, bk, bn, ks, w, s


def setup(b: int, timer, floor: Floor):
    """rmsnorm_linear at batch b: (M, K, N), rotated input sets, the float32 reference, the
    copy floor and torch.compile's time under graph replay (µs), printed."""
    g = bm.get("rmsnorm_linear", b)
    m, k = g.inputs[0].dims
    n = g.inputs[1].dims[1]
    sets = timing.input_sets(g, timing.rotation_count(timing.graph_bytes(g), timing.l2_bytes()))
    ref = torch_eval.evaluate(g, sets[0])[0]
    fl = floor.us(g)
    comp = timer.graph(baselines.compiled(g).fn, sets)
    print(f"b={b} M={m} floor {fl:.2f} compile graph {comp:.2f}", flush=True)
    return (m, k, n), sets, ref, fl, comp


def timed(first, part, out, ks: int, mkn: tuple[int, int, int], sets, ref, timer, label):
    """(products kernel µs, with the combine µs) of ``first`` under graph replay; None, printed
    with ``label``, where the program is wrong or Triton cannot compile the setting."""
    m, k, n = mkn

    def both(x, wt):
        first(x, wt)
        combine[(n // 64,)](x, part, out, m, k, n, 64, ks, 1024, num_warps=4)
        return [out]

    try:
        err = torch_eval.relative_error(both(*sets[0])[0], ref)
        if err > 5e-3:
            print("wrong", *label, f"{err:.1e}", flush=True)
            return None
        return timer.graph(first, sets), timer.graph(both, sets)
    except Exception as ex:  # a setting Triton cannot compile: noted, skipped
        print("fail", *label, type(ex).__name__, str(ex)[:120], flush=True)
        return None


def main() -> None:
    timer = timing.CudaTimer()
    floor = Floor(measure_copy_bandwidth())
    rows = []
    for b in [int(a) for a in sys.argv[1:]] or [1]:
        (m, k, n), sets, ref, fl, comp = setup(b, timer, floor)
        for reg, bk, bn, ks, w, s in forms(m, k, n):
            if time.time() - T0 > LIMIT:
                break
            mp = max(m if reg else 16, 1)
            part = torch.empty((ks, m, n), dtype=torch.float32, device="cuda")
            out = torch.empty((m, n), dtype=torch.float16, device="cuda")

            def first(x, wt, _ks=ks, _bk=bk, _bn=bn, _w=w, _s=s, _mp=mp, _reg=reg):
                partials[(_ks, n // _bn)](x, wt, part, m, _mp, k, n, _bk, _bn, _ks, _reg,
                                         num_warps=_w, num_stages=_s)
                return part

            times = timed(first, part, out, ks, (m, k, n), sets, ref, timer,
                          (reg, bk, bn, ks, w, s))
            if times is None:
                continue
            t1, t2 = times
            rows.append((b, "reg" if reg else "dot", bk, bn, ks, w, s, t1, t2, fl / t2, comp))
    print("TABLE b form BK BN KS warps stages partials_us both_us floor_frac compile_us")
    for form in ("dot", "reg"):
        for r in sorted((r for r in rows if r[1] == form), key=lambda r: (r[0], r[8]))[:10]:
            print(*r[:7], f"{r[7]:.2f}", f"{r[8]:.2f}", f"{r[9]:.2f}", f"{r[10]:.2f}")


if __name__ == "__main__":
    main()
