"""GPU probe behind docs/lowering.md's §3b figures (hand-written forms): RMSNorm + Linear's split-K
products kernel (the products and each piece's sum of squares of X, no combine), written by hand
in several formulations; each configuration is checked against torch (worst element, relative to
the largest, <= 1e-3) and timed under CUDA-graph replay with rotated inputs. Prints, per form,
how many configurations were right, wrong, or failed to compile, and the five fastest right
ones; writes every figure to $OUT/p13_b<batch>.txt.

Forms:
  plain   acc[MP,BN] += dot(x, w), pointer loads (the generated code's shape)
  plain64 the same with X padded to 64 rows (so Triton uses Hopper's wgmma)
  nosq/nosq64  plain / plain64 with the sum of squares in a second loop (no shared X tile)
  swapT   acc[BN,MP] = dot(trans(w), trans(x), acc)
  swapD   W^T and X^T loaded directly as [BN,BK] / [BK,MP] tiles
  swapC   swapT with a second .cg load of X for the sum of squares, transposed accumulator
  swapE   swapT with a second .cg load, each step's product transposed back (the lowering's
          swap_dots)
  tma / tmap / tmap64  tensor descriptors (TMA), swapped / plain / plain at 64 rows

Usage, on the GPU machine from the repository root:
  python scripts/gpu_probes/split_k_forms.py BATCHES FORMS KNOBS
e.g. ``16,8 plain,plain64,tmap,tmap64 4/3,4/4,8/3,8/2,8/1`` (KNOBS: warps/stages; default
4/3,4/4,8/3). The runs behind the figures (H200, Triton 3.6, 2026-11-22):
  16 plain,swapT,swapD,tma,tmap ; 16,8 plain,plain64,tmap,tmap64 4/3,4/4,8/3,8/2,8/1 ;
  16 nosq64,plain64 ; 16,1 swapC,swapE,plain 4/3,4/4,8/3,8/1
"""
import itertools
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
import egraph_mirage as em
from egraph_mirage.gpu.timing import (
    CudaTimer,
    TimingConfig,
    graph_bytes,
    input_sets,
    l2_bytes,
    rotation_count,
)

T = CudaTimer(TimingConfig(graph_replay_ms=6.0, graph_replays=7))
print(torch.cuda.get_device_name(), triton.__version__, flush=True)
triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))


@triton.jit
def plain(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    rm = tl.arange(0, MP); rk = tl.arange(0, BK); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((MP, BN), tl.float32); sq = tl.zeros((MP,), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xt = tl.load(x + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        wt = tl.load(w + (k0 + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(xt, wt, acc)
        xf = xt.to(tl.float32); sq += tl.sum(xf * xf, 1)
    tl.store(p + (ps * M + rm)[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)
    tl.store(s + (ps * M + rm) * (N // BN) + pn, sq, mask=rm < M)


@triton.jit
def swapT(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    rm = tl.arange(0, MP); rk = tl.arange(0, BK); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, MP), tl.float32); sq = tl.zeros((MP,), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xt = tl.load(x + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        wt = tl.load(w + (k0 + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(tl.trans(wt), tl.trans(xt), acc)
        xf = xt.to(tl.float32); sq += tl.sum(xf * xf, 1)
    tl.store(p + (ps * M + rm)[None, :] * N + rn[:, None], acc, mask=rm[None, :] < M)
    tl.store(s + (ps * M + rm) * (N // BN) + pn, sq, mask=rm < M)


@triton.jit
def swapD(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    rm = tl.arange(0, MP); rk = tl.arange(0, BK); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, MP), tl.float32); sq = tl.zeros((MP,), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xtt = tl.load(x + rm[None, :] * K + (k0 + rk)[:, None], mask=rm[None, :] < M, other=0.0)
        wtt = tl.load(w + (k0 + rk)[None, :] * N + rn[:, None])
        acc = tl.dot(wtt, xtt, acc)
        xf = xtt.to(tl.float32); sq += tl.sum(xf * xf, 0)
    tl.store(p + (ps * M + rm)[None, :] * N + rn[:, None], acc, mask=rm[None, :] < M)
    tl.store(s + (ps * M + rm) * (N // BN) + pn, sq, mask=rm < M)


@triton.jit
def tma(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
        BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    xd = tl.make_tensor_descriptor(x, shape=[M, K], strides=[K, 1], block_shape=[MP, BK])
    wd = tl.make_tensor_descriptor(w, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    rm = tl.arange(0, MP); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, MP), tl.float32); sq = tl.zeros((MP,), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xt = xd.load([0, k0])
        wt = wd.load([k0, pn * BN])
        acc = tl.dot(wt.T, xt.T, acc)
        xf = xt.to(tl.float32); sq += tl.sum(xf * xf, 1)
    tl.store(p + (ps * M + rm)[None, :] * N + rn[:, None], acc, mask=rm[None, :] < M)
    tl.store(s + (ps * M + rm) * (N // BN) + pn, sq, mask=rm < M)


@triton.jit
def tmap(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
         BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    xd = tl.make_tensor_descriptor(x, shape=[M, K], strides=[K, 1], block_shape=[MP, BK])
    wd = tl.make_tensor_descriptor(w, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    rm = tl.arange(0, MP); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((MP, BN), tl.float32); sq = tl.zeros((MP,), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xt = xd.load([0, k0])
        wt = wd.load([k0, pn * BN])
        acc = tl.dot(xt, wt, acc)
        xf = xt.to(tl.float32); sq += tl.sum(xf * xf, 1)
    tl.store(p + (ps * M + rm)[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)
    tl.store(s + (ps * M + rm) * (N // BN) + pn, sq, mask=rm < M)


@triton.jit
def nosq(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
         BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    rm = tl.arange(0, MP); rk = tl.arange(0, BK); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((MP, BN), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xt = tl.load(x + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        wt = tl.load(w + (k0 + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(xt, wt, acc)
    tl.store(p + (ps * M + rm)[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)
    sq = tl.zeros((MP,), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xt = tl.load(x + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
        xf = xt.to(tl.float32); sq += tl.sum(xf * xf, 1)
    tl.store(s + (ps * M + rm) * (N // BN) + pn, sq, mask=rm < M)


@triton.jit
def swapC(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    # transposed accumulator, the register code reads its own .cg load of X
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    rm = tl.arange(0, MP); rk = tl.arange(0, BK); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, MP), tl.float32); sq = tl.zeros((MP, 1), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xp = x + rm[:, None] * K + (k0 + rk)[None, :]
        xt = tl.load(xp, mask=rm[:, None] < M, other=0.0)
        xr = tl.load(xp, mask=rm[:, None] < M, other=0.0, cache_modifier=".cg")
        wt = tl.load(w + (k0 + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(tl.trans(wt), tl.trans(xt), acc)
        xf = xr.to(tl.float32); sq += tl.sum(xf * xf, 1, keep_dims=True)
    out = tl.trans(acc)
    tl.store(p + (ps * M + rm)[:, None] * N + rn[None, :], out, mask=rm[:, None] < M)
    tl.store(s + (ps * M + rm)[:, None] * (N // BN) + pn, sq, mask=rm[:, None] < M)


@triton.jit
def swapE(x, w, p, s, M: tl.constexpr, MP: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr):
    # each step's product transposed back into a row-major accumulator (no codegen change)
    pn = tl.program_id(0); ps = tl.program_id(1)
    PIECE: tl.constexpr = K // SPLIT
    rm = tl.arange(0, MP); rk = tl.arange(0, BK); rn = pn * BN + tl.arange(0, BN)
    acc = tl.zeros((MP, BN), tl.float32); sq = tl.zeros((MP, 1), tl.float32)
    for i in range(PIECE // BK):
        k0 = ps * PIECE + i * BK
        xp = x + rm[:, None] * K + (k0 + rk)[None, :]
        xt = tl.load(xp, mask=rm[:, None] < M, other=0.0)
        xr = tl.load(xp, mask=rm[:, None] < M, other=0.0, cache_modifier=".cg")
        wt = tl.load(w + (k0 + rk)[:, None] * N + rn[None, :])
        acc += tl.trans(tl.dot(tl.trans(wt), tl.trans(xt)))
        xf = xr.to(tl.float32); sq += tl.sum(xf * xf, 1, keep_dims=True)
    tl.store(p + (ps * M + rm)[:, None] * N + rn[None, :], acc, mask=rm[:, None] < M)
    tl.store(s + (ps * M + rm)[:, None] * (N // BN) + pn, sq, mask=rm[:, None] < M)


FORMS = {"swapC": swapC, "swapE": swapE, "nosq": nosq, "nosq64": nosq, "plain": plain, "swapT": swapT, "swapD": swapD, "tma": tma, "tmap": tmap,
         "plain64": plain, "tmap64": tmap}


def probe(b, forms, out):
    g = em.benchmarks.get("rmsnorm_linear", b)
    S = input_sets(g, rotation_count(graph_bytes(g), l2_bytes()))
    M, K = g.inputs[0].dims; N = g.inputs[1].dims[1]
    x, w = S[0]
    ref = x.float() @ w.float(); refsq = (x.float() ** 2).sum(1)
    res = []; wrong = []; fails = []
    for tag in forms:
        kern = FORMS[tag]
        MP = 64 if tag.endswith('64') else max(16, M)
        for BN, BK, SPLIT, (nw, ns) in itertools.product((64, 128, 256), (64, 128), (4, 8, 16),
                                                         KNOBS):
            if SPLIT == 16 and BN == 256: continue
            if SPLIT == 4 and BN == 64: continue
            def fn(x, w, BN=BN, BK=BK, SPLIT=SPLIT, nw=nw, ns=ns, kern=kern, MP=MP):
                p = torch.empty((SPLIT * M, N), device=x.device, dtype=torch.float32)
                s = torch.empty((SPLIT * M, N // BN), device=x.device, dtype=torch.float32)
                kern[(N // BN, SPLIT)](x, w, p, s, M, MP, K, N, BN, BK, SPLIT, num_warps=nw, num_stages=ns)
                return [p, s]
            cfg = f"{tag} BN{BN} BK{BK} split{SPLIT} w{nw} s{ns}"
            try:
                p, s = fn(x, w)
                torch.cuda.synchronize()
                pv = p.view(SPLIT, M, N).sum(0)
                pe = ((pv - ref).abs().max() / ref.abs().max()).item()
                ne = (torch.linalg.vector_norm(pv.double() - ref.double()) / torch.linalg.vector_norm(ref.double())).item()
                frac = ((pv - ref).abs() > 1e-2 * ref.abs().max()).float().mean().item()
                se = ((s.view(SPLIT, M, N // BN).sum(0)[:, 0] - refsq).abs().max() / refsq.abs().max()).item()
                if not (pe < 1e-3 and se < 1e-3):
                    wrong.append(f"{cfg} err {pe:.2g}/{se:.2g} norm {ne:.2g} bad-frac {frac:.2g}"); continue
                res.append((T.graph(fn, S), cfg))
            except Exception as e:
                fails.append(f"{cfg}: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}")
    print(f"== rmsnorm_linear products b={b} (M={M})", flush=True)
    for tag in forms:
        mine = sorted(r for r in res if r[1].startswith(tag + " "))
        nw_ = sum(1 for r in wrong if r.startswith(tag + " ")); nf = sum(1 for r in fails if r.startswith(tag + " "))
        print(f" {tag}: {len(mine)} ok, {nw_} WRONG, {nf} failed", flush=True)
        for t, k in mine[:5]:
            print(f"   {t:7.2f}  {k}", flush=True)
    with open(os.path.join(out, f"p13_b{b}.txt"), "w") as f:
        f.write("\n".join(f"{t:.3f} {k}" for t, k in sorted(res)) + "\n--wrong\n" + "\n".join(wrong)
                + "\n--fails\n" + "\n".join(fails) + "\n")


KNOBS = ((4, 3), (4, 4), (8, 3)) if len(sys.argv) < 4 else tuple(tuple(int(v) for v in k.split('/')) for k in sys.argv[3].split(','))
t0 = time.time()
out = os.environ.get("OUT", "/tmp")
bs = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [16]
forms = sys.argv[2].split(",") if len(sys.argv) > 2 else list(FORMS)
for b in bs:
    probe(b, forms, out)
    print("elapsed", round(time.time() - t0), flush=True)
