"""Run a program's search tasks one by one in task order, in this process, and print how long each
kind and size of task took and where the first results (of each number of kernels, and of each
kind of task) came from.

    python3 scripts/task_times.py PROGRAM [--small] [--max-tasks N]
    python3 scripts/task_times.py PROGRAM --task NAME [--task NAME ...]   (those tasks alone)
    python3 scripts/task_times.py norm-decode --eps EPS [--max-tasks N]
    python3 scripts/task_times.py norm-decode-hf --eps EPS [--max-tasks N]
    python3 scripts/task_times.py decode-attention --batch B --keys K [--max-tasks N]

One process, no time budget: the figures are seconds on this machine, to compare task orders.
``norm-decode`` is the program of an 8B model's RMSNorm with its value projection at decode, at
the sizes the backend searches it (scaled by 16): ``rms_norm(x, w, eps) @ W``, x and w
(1, 1, 256), W (1, 256, 64), fp16; ``--eps 0`` against ``--eps 1e-5`` shows what the norm's eps
costs the search (block graphs of about 7 operators against 3, before the "rms+EPS"
accumulator). ``norm-decode-hf`` is the same function written as ``transformers``' RMSNorm
traces: ``w * (x32 * rsqrt(mean(x32²) + eps)).to(fp16)``, x32 = x in float32.
``decode-attention`` is an 8B model's grouped-query decode attention core as the backend's
pieces have it (8 KV heads of 4 queries, head dim 128, a mask over K keys, fp16; a leading
batch dimension when B > 1): ``softmax(q @ kᵀ / sqrt(128) + mask) @ v``. At 1,024 keys the
backend searches it at 64 keys once it is scaled (B = 8); ``--keys 64`` against ``--keys 256``
shows what that scaling costs the search.
"""

from __future__ import annotations

import argparse
import collections
import time

import egraph_mirage as em
from egraph_mirage.search import SearchConfig
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.tasks import Context, list_tasks, run_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("--small", action="store_true", help="the program at its small shapes")
    ap.add_argument("--max-tasks", type=int, default=1000)
    ap.add_argument("--task", action="append", default=[],
                    help="run only this task (e.g. split:82:7-7) and print its figures")
    ap.add_argument("--eps", type=float, default=1e-5, help="norm-decode's eps")
    ap.add_argument("--batch", type=int, default=1, help="decode-attention's batch")
    ap.add_argument("--keys", type=int, default=1024, help="decode-attention's keys")
    ap.add_argument("--folded", action="store_true",
                    help="decode-attention with its batch folded into the KV heads")
    args = ap.parse_args()
    g = _norm_decode(args.eps) if args.program == "norm-decode" else \
        _norm_decode_hf(args.eps) if args.program == "norm-decode-hf" else \
        _decode_attention(args.batch, args.keys, args.folded) \
        if args.program == "decode-attention" else \
        em.benchmarks.get(args.program, small=args.small)
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    tasks = list_tasks(payload, ctx)[: args.max_tasks]
    if args.task:
        by_name = {t.name: t for t in list_tasks(payload, ctx)}
        for name in args.task:
            if name not in by_name:
                ap.error(f"no task {name!r} in {args.program}'s task list")
            t0 = time.perf_counter()
            res = run_task(payload, by_name[name], ctx=ctx)
            print(f"{name}: {time.perf_counter() - t0:.1f} s, {res.progress} units (first "
                  f"kernels, first moves or shapes), {res.counts.get('states', 0):,} states, "
                  f"{len(res.found)} result(s)")
        return
    per_kind: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    firsts: dict[int, tuple[int, str, float, float]] = {}
    first_of_kind: dict[str, tuple[int, str, float]] = {}
    elapsed = 0.0
    for i, task in enumerate(tasks):
        t0 = time.perf_counter()
        res = run_task(payload, task, ctx=ctx)
        elapsed += time.perf_counter() - t0
        kind = f"{task.kind} {task.ops[0]}-{task.ops[1]}"
        per_kind[kind][0] += 1
        per_kind[kind][1] += time.perf_counter() - t0
        for _, kernels, seconds, *_ in res.found:
            if kernels not in firsts:
                firsts[kernels] = (i, task.name, elapsed, seconds * 1e6)
                print(f"  ... {kernels} kernel(s) at task {i} ({task.name}), {elapsed:.1f} s",
                      flush=True)
        if res.found and task.kind not in first_of_kind:
            first_of_kind[task.kind] = (i, task.name, elapsed)
    print(f"{args.program}: {len(tasks)} tasks in {elapsed:.1f} s")
    for kind, (n, s) in per_kind.items():
        print(f"  {kind:<20} {n:>5} tasks {s:8.1f} s")
    for kernels, (i, name, at, us) in sorted(firsts.items()):
        print(f"  first result of {kernels} kernel(s): task {i} ({name}) at {at:.1f} s, "
              f"estimated {us:.1f} us")
    for kind, (i, name, at) in first_of_kind.items():
        print(f"  first result of a {kind} task: task {i} ({name}) at {at:.1f} s")


def _norm_decode(eps: float) -> em.KernelGraph:
    g = em.new_kernel_graph()
    x, w = (g.new_input((1, 1, 256), em.float16) for _ in range(2))
    proj = g.new_input((1, 256, 64), em.float16)
    g.mark_output(g.matmul(g.rms_norm(x, (256,), w, eps=eps), proj))
    return g


def _norm_decode_hf(eps: float) -> em.KernelGraph:
    g = em.new_kernel_graph()
    x, w = (g.new_input((1, 1, 256), em.float16) for _ in range(2))
    proj = g.new_input((1, 256, 64), em.float16)
    x32 = g.cast(x, em.float32)
    ms = g.mean(g.square(x32), 2)
    normed = g.cast(g.mul(x32, g.rsqrt(g.add_scalar(ms, eps))), em.float16)
    g.mark_output(g.matmul(g.mul(w, normed), proj))
    return g


def _decode_attention(batch: int, keys: int, folded: bool = False) -> em.KernelGraph:
    g = em.new_kernel_graph()
    if folded:
        q = g.new_input((batch * 8, 4, 128), em.float16)
        kt = g.new_input((batch * 8, 128, keys), em.float16)
        mask = g.new_input((batch * 8 if batch > 1 else 1, 1, keys), em.float16)
        v = g.new_input((batch * 8, keys, 128), em.float16)
        return _attention_core(g, q, kt, mask, v)
    lead = (batch,) if batch > 1 else ()
    q = g.new_input((*lead, 8, 4, 128), em.float16)
    kt = g.new_input((*lead, 8, 128, keys), em.float16)
    mask = g.new_input((*lead, 1, 1, keys) if batch > 1 else (1, 1, keys), em.float16)
    v = g.new_input((*lead, 8, keys, 128), em.float16)
    return _attention_core(g, q, kt, mask, v)


def _attention_core(g: em.KernelGraph, q: em.Tensor, kt: em.Tensor, mask: em.Tensor,
                    v: em.Tensor) -> em.KernelGraph:
    s = g.add(g.mul_scalar(g.matmul(q, kt), 128 ** -0.5), mask)
    last = len(s.dims) - 1
    e = g.exp(g.sub(s, g.amax(s, last)))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, last)), v))
    return g


if __name__ == "__main__":
    main()
