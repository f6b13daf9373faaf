"""GPU probe: how rmsnorm_linear's split-K products kernel (grid: K splits x column tiles; the
loop walks the split's K tiles; fp32 partials) loads W's tiles:

  ptr    ``tl.load`` of a pointer block (what the lowering writes today)
  tma    a tensor descriptor made on the host (``TensorDescriptor.from_tensor``): Hopper's bulk
         tensor copy engine moves each tile into shared memory
  bptr   ``tl.make_block_ptr`` / ``tl.load`` of a block pointer (``LOAD=2``; not timed by
         ``main``: Triton 3.9 removed block pointers)

X's tile (2 rows) is a pointer load in each; the dot is ``tl.dot`` with X padded to 16 rows
(or swapped: W's columns as the dot's rows). Each is checked against float32 and timed under
CUDA-graph replay with rotated inputs, the products kernel alone and with a combine kernel that
sums the pieces, takes X's rms and divides (``register_dots.timed``); beside torch.compile and
the copy floor.

Usage, on the GPU machine from the repository root: ``python scripts/gpu_probes/tma_loads.py``
(LIMIT=seconds in the environment stops timing early).
"""
import os
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from egraph_mirage.gpu import timing
from egraph_mirage.gpu.floor import Floor, measure_copy_bandwidth

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from register_dots import setup, timed  # the probe beside this one

T0 = time.time()
LIMIT = float(os.environ.get("LIMIT", "420"))


@triton.jit
def partials(x, w, wdesc, part, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
             BK: tl.constexpr, BN: tl.constexpr, KS: tl.constexpr, LOAD: tl.constexpr,
             SWAP: tl.constexpr):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = tl.arange(0, 16)
    cols = pid_n * BN + tl.arange(0, BN)
    base = pid_k * (K // KS)
    if LOAD == 2:
        wp = tl.make_block_ptr(w, shape=(K, N), strides=(N, 1), offsets=(base, pid_n * BN),
                               block_shape=(BK, BN), order=(1, 0))
    if SWAP:
        acc = tl.zeros((BN, 16), tl.float32)
    else:
        acc = tl.zeros((16, BN), tl.float32)
    for i in range(K // KS // BK):
        kk = base + i * BK + tl.arange(0, BK)
        a = tl.load(x + rows[:, None] * K + kk[None, :], mask=rows[:, None] < M, other=0.0)
        if LOAD == 1:
            b = wdesc.load([base + i * BK, pid_n * BN])
        elif LOAD == 2:
            b = tl.load(wp)
            wp = tl.advance(wp, (BK, 0))
        else:
            b = tl.load(w + kk[:, None] * N + cols[None, :])
        if SWAP:
            acc += tl.dot(tl.trans(b), tl.trans(a))
        else:
            acc += tl.dot(a, b)
    if SWAP:
        acc = tl.trans(acc)
    tl.store(part + pid_k * M * N + rows[:, None] * N + cols[None, :], acc,
             mask=rows[:, None] < M)


TILINGS = [(64, 128, 8), (32, 128, 8), (64, 64, 4), (128, 128, 8), (64, 256, 8), (128, 64, 8)]
KNOBS = [(4, 3), (2, 3), (4, 4), (8, 3)]


def main() -> None:
    timer = timing.CudaTimer()
    (m, k, n), sets, ref, fl, comp = setup(1, timer, Floor(measure_copy_bandwidth()))
    rows = []
    for bk, bn, ks in TILINGS:
        for w, s in KNOBS:
            for load in (0, 1):
                for swap in (False, True):
                    if time.time() - T0 > LIMIT:
                        break
                    part = torch.empty((ks, m, n), dtype=torch.float32, device="cuda")
                    out = torch.empty((m, n), dtype=torch.float16, device="cuda")

                    def first(x, wt, _a=(bk, bn, ks, w, s, load, swap)):
                        bk_, bn_, ks_, w_, s_, load_, swap_ = _a
                        desc = TensorDescriptor.from_tensor(wt, [bk_, bn_]) if load_ == 1 else wt
                        partials[(ks_, n // bn_)](x, wt, desc, part, m, k, n, bk_, bn_, ks_, load_,
                                                  swap_, num_warps=w_, num_stages=s_)
                        return part

                    label = ("ptr", "tma", "bptr")[load] + ("-swap" if swap else "")
                    times = timed(first, part, out, ks, (m, k, n), sets, ref, timer,
                                  (label, bk, bn, ks, w, s))
                    if times is None:
                        continue
                    t1, t2 = times
                    rows.append((label, bk, bn, ks, w, s, t1, t2, fl / t1, comp))
    print("TABLE form BK BN KS warps stages products_us both_us floor/products compile_us")
    for form in ("ptr", "ptr-swap", "tma", "tma-swap", "bptr", "bptr-swap"):
        for r in sorted((r for r in rows if r[0] == form), key=lambda r: r[6])[:5]:
            print(*r[:6], f"{r[6]:.2f}", f"{r[7]:.2f}", f"{r[8]:.3f}", f"{r[9]:.2f}")


if __name__ == "__main__":
    main()
