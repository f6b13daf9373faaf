"""Run a program's search tasks one by one in task order, in this process, and print how long each
kind and size of task took and where the first results (and the first of two kernels) came from.

    python3 scripts/task_times.py PROGRAM [--small] [--max-tasks N]
    python3 scripts/task_times.py PROGRAM --task NAME [--task NAME ...]   (those tasks alone)

One process, no time budget: the figures are seconds on this machine, to compare task orders.
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
    args = ap.parse_args()
    g = em.benchmarks.get(args.program, small=args.small)
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
    print(f"{args.program}: {len(tasks)} tasks in {elapsed:.1f} s")
    for kind, (n, s) in per_kind.items():
        print(f"  {kind:<20} {n:>5} tasks {s:8.1f} s")
    for kernels, (i, name, at, us) in sorted(firsts.items()):
        print(f"  first result of {kernels} kernel(s): task {i} ({name}) at {at:.1f} s, "
              f"estimated {us:.1f} us")


if __name__ == "__main__":
    main()
