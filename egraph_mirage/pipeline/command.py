"""``egraph-mirage optimize NAME|FILE``: superoptimize a benchmark or a program from a file.

A FILE is a Python file that builds a kernel graph: it must define ``graph`` (a ``KernelGraph``)
or a function ``build()`` returning one. The best μGraph is printed and written to
``OUT/best.json``, every result to ``OUT/result_<k>.json`` (k = 0 is the best; files of an earlier
run beyond the new count are removed), their figures and the statistics to ``OUT/results.json``;
the checkpoint ``OUT/search.ckpt`` lets a rerun resume. ``egraph-mirage bench gpu --mugraph-dir``
reads such folders (``DIR/<name>_b<batch>/`` or ``DIR/<name>/``). ``--profile`` ranks by time
measured on the CUDA GPU where there is one (``superoptimize(..., profile=True)``). ``--rules``
replaces the shipped rule files and ``--extra-rules`` adds to them (``superoptimize(...,
rules=, extra_rules=)``); ``--max-tasks`` bounds the search by work, the same on any machine.
``--emit-triton PATH`` also writes the best μGraph as a Triton program
(``em.generate_triton_program``).

Progress goes to stderr: a status line on a terminal, else a log line every
``--progress-interval`` seconds (``--no-progress``: none). The summary says what ended the search
early (time budget, task budget, ``--max-results``, Ctrl-C) and, when nothing was found, why.
Exit status: 0 with a result, 1 without, 2 for a usage error, 130 after Ctrl-C (with what was
found so far written).
"""

from __future__ import annotations

import argparse
import runpy
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import benchmarks
from ..errors import EMError
from ..graph import KernelGraph
from ..rank import keep_jax_off_the_gpu
from ..search import SearchConfig, SearchError, SearchResults
from ..search.explain import (
    INTERRUPTED,
    MAX_RESULTS,
    TASK_BUDGET,
    TASKS_LOST,
    TIME_BUDGET,
    lost_names,
)
from ..search.progress import LOG_INTERVAL_S
from .request import DEFAULT_BUDGETS, Request, RequestError
from .stages import run as pipeline_run

#: the exit status after Ctrl-C (128 + SIGINT, as shells report it)
EXIT_INTERRUPTED = 130
#: how the summary names what ended a search early
STOPPED = {TIME_BUDGET: "time budget reached", TASK_BUDGET: "task budget reached",
           MAX_RESULTS: "--max-results reached", INTERRUPTED: "interrupted",
           TASKS_LOST: "tasks lost with worker processes that died"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="NAME|FILE",
                   help="a benchmark name (see `list`) or a Python file that builds a graph")
    p.add_argument("--batch", type=int, default=1, help="batch size of a benchmark")
    p.add_argument("--small", action="store_true", help="the benchmark's reduced shapes")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGETS["optimize"], metavar="S",
                   help="stop after S seconds with what was found (default: no time limit; "
                        "without --max-tasks either, the whole space is searched)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="worker processes (default: every core)")
    p.add_argument("--out", default="egraph-mirage-out", metavar="DIR",
                   help="folder for the results and the checkpoint (default: "
                        "egraph-mirage-out in the current folder; a rerun with the same folder "
                        "resumes)")
    p.add_argument("--max-tasks", type=int, default=None, metavar="N",
                   help="search only the first N tasks of the task list (a budget counted in "
                   "work: the same search on any machine)")
    p.add_argument("--max-results", type=int, default=None,
                   help="stop after this many verified μGraphs")
    p.add_argument("--rules", action="append", default=None, metavar="PATH",
                   help="a rule file or folder of *.egg files to use instead of the shipped "
                   "rules (repeatable: loaded in the order given)")
    p.add_argument("--extra-rules", nargs="+", action="extend", default=[], metavar="PATH",
                   help="rule files or folders loaded after the rules (repeatable)")
    p.add_argument("--profile", action="store_true",
                   help="rank the results by time measured on the CUDA GPU (tuned, checked and "
                   "timed through the Triton lowering); without a GPU, by the cost model")
    p.add_argument("--emit-triton", metavar="PATH", default=None,
                   help="also write the best μGraph as a standalone Triton program to PATH")
    p.add_argument("--progress-interval", type=float, default=LOG_INTERVAL_S, metavar="S",
                   help="seconds between progress lines when stderr is not a terminal "
                   f"(default {LOG_INTERVAL_S:g}; 0: after every task)")
    p.add_argument("--no-progress", action="store_true", help="no progress on stderr")


def load_program(spec: str, batch: int, small: bool) -> KernelGraph:
    if spec in benchmarks.names():
        return benchmarks.get(spec, batch=batch, small=small)
    path = Path(spec)
    if not path.is_file():
        raise SearchError(f"{spec}: neither a benchmark ({', '.join(benchmarks.names())}) nor a "
                          "file")
    try:
        ns = runpy.run_path(str(path))
    except EMError:
        raise
    except Exception as exc:  # the user's file failed: say where, not a deep trace
        raise SearchError(f"{path}: building the program failed: "
                          f"{type(exc).__name__}: {exc}") from None
    g = ns.get("graph")
    if g is None and callable(ns.get("build")):
        try:
            g = ns["build"]()
        except EMError:
            raise
        except Exception as exc:  # the user's build() failed: say where, not a deep trace
            raise SearchError(f"{path}: build() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(g, KernelGraph):
        raise SearchError(f"{path}: define `graph` (a KernelGraph) or `build()` returning one")
    return g


#: the flag that sets each ``Request`` field, for error messages
FLAGS = {"time_budget": "--budget", "max_tasks": "--max-tasks", "workers": "--workers",
         "progress_interval": "--progress-interval", "rules": "--rules",
         "extra_rules": "--extra-rules"}


def request_from_flags(**fields: Any) -> Request:
    """``Request.of(**fields)`` for a command line: a value that cannot be meant is a
    ``SearchError`` naming the flag that gave it (``FLAGS``), validated in ``Request`` only."""
    try:
        return Request.of(**fields)
    except RequestError as e:
        raise SearchError(f"{FLAGS.get(e.field, e.field)} {e.detail}") from None


def request_of(args: argparse.Namespace) -> Request:
    """The ``Request`` ``optimize``'s flags ask for."""
    for option, value in (("--max-results", args.max_results), ("--batch", args.batch)):
        if value is not None and value < 1:
            raise SearchError(f"{option} must be a positive integer, got {value}")
    return request_from_flags(config=SearchConfig(max_results=args.max_results),
                              time_budget=args.budget, workers=args.workers,
                              profile=args.profile, max_tasks=args.max_tasks, rules=args.rules,
                              extra_rules=args.extra_rules,
                              progress=False if args.no_progress else None,
                              progress_interval=args.progress_interval)


def output_folder(path: str) -> Path:
    """``--out``: created if missing; a ``SearchError`` naming it when it cannot be (a file, a
    folder under a file, no permission, a read-only filesystem) or cannot be written to."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".egraph-mirage-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise SearchError(f"--out {path}: cannot write there ({exc.strerror or exc})") from None
    return out


def run(args: argparse.Namespace) -> int:
    request = request_of(args)
    g = load_program(args.program, args.batch, args.small)
    out = output_folder(args.out)
    request = replace(request, checkpoint=out / "search.ckpt")
    if args.profile:
        keep_jax_off_the_gpu()
    try:
        results = pipeline_run(g, request, out=out, program_info={
            "name": args.program, "batch": args.batch, "small": args.small})
        return report(results, out, args)
    except KeyboardInterrupt:  # before the search had results, or a second Ctrl-C
        print("(interrupted)", flush=True)
        return EXIT_INTERRUPTED


def report(results: SearchResults, out: Path, args: argparse.Namespace) -> int:
    """Print the summary and the best μGraph (and write its Triton program with
    ``--emit-triton``); returns the exit status."""
    st = results.stats
    stopped = f" ({STOPPED[st.stopped_by]})" if st.stopped_by else ""
    print(f"{len(results)} verified μGraph(s); {st.states:,} states, "
          f"{st.pruned_by_oracle:,} pruned by the e-graph, {st.pruned_otherwise:,} otherwise; "
          f"{st.candidates_verified} candidates verified, {st.candidates_rejected} rejected; "
          f"{st.tasks_done}/{st.tasks_total} tasks{stopped}")
    if st.resumed_tasks or st.resumed_partial or st.dropped_results:
        dropped = (f", {st.dropped_results} dropped: they failed verification again"
                   if st.dropped_results else "")
        cut = (f" and {st.resumed_partial} cut short, resumed where they stopped"
               if st.resumed_partial else "")
        print(f"resumed {st.resumed_tasks} task(s){cut} from {out / 'search.ckpt'} "
              f"({st.resumed_results} result(s), verified again{dropped})")
    if st.workers_lost:
        lost = f", {len(st.tasks_lost)} lost: {lost_names(st)}" if st.tasks_lost else ""
        print(f"{st.workers_lost} worker process(es) died (killed by memory, a signal or a "
              f"crash): {len(st.tasks_retried)} task(s) they were running run again{lost}")
    secs = ", ".join(f"{k} {v:.1f} s" for k, v in st.seconds.items())
    print(f"seconds: {secs}")
    if args.profile:
        print(f"ranked by: {st.ranked_by} ({st.profile_note})")
        for msg in st.profile_messages:
            print(f"  dropped: {msg}")
    code = EXIT_INTERRUPTED if st.interrupted else 0
    best = results.best
    if best is None:
        print("no μGraph found:" if st.no_result_reasons else "no μGraph found")
        for reason in st.no_result_reasons:
            print(f"  - {reason}")
        if args.emit_triton:
            print(f"no Triton program written to {args.emit_triton}: there is no result",
                  file=sys.stderr)
        return code or 1
    print(f"best: {best.summary()}, found after {best.found_after:.1f} s")
    print(best.graph)
    for t in best.graph.operators:
        if t.op == "customized" and t.params["output"] == 0:
            print(t.params["kernel"].tb)
    print(f"written: {out / 'best.json'}, {len(results)} result file(s), {out / 'results.json'}, "
          f"checkpoint {out / 'search.ckpt'}")
    if args.emit_triton:
        from ..api import generate_triton_program

        generate_triton_program(best.graph, args.emit_triton)
        print(f"written: Triton program {args.emit_triton}")
    return code
