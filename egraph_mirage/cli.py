"""The ``egraph-mirage`` command.

    egraph-mirage list
    egraph-mirage oracle NAME [--batch B] [--small] [--query SEXPR ...] [--svg PATH]
    egraph-mirage bench oracle [--json] [--small] [--targets NAME ...] [--seconds S] [--repeats N]
    egraph-mirage bench verify [--json] [--small] [--targets NAME ...] [--mutants N] [--seed S]
    egraph-mirage bench search [--json] [--small] [--programs NAME ...] [--budget S] [--no-oracle]
                               [--max-tasks N] [--winners ROWS.json] [--extra-rules PATH ...]
                               [--dtype float16|bfloat16]
    egraph-mirage optimize NAME|FILE [--batch B] [--small] [--budget S] [--max-tasks N]
                           [--out DIR] [--profile] [--rules PATH] [--extra-rules PATH ...]
    egraph-mirage bench gpu [--json] [--batch B ...] [--programs NAME ...] [--mugraph-dir DIR]
                            [--max-candidates K] [--from-search [--budget S]]
                            [--size-variants K] [--no-reference] [--dtype float16|bfloat16]
    egraph-mirage bench torch [--json] [--out PATH] [--batch B ...] [--preset small|llama3_8b]
                              [--models llama hf] [--modes MODE ...] [--budget S]
                              [--max-tasks N] [--workers N] [--cache-dir DIR] [--cpu-smoke]
    egraph-mirage bench generate [--json] [--out PATH] [--models llama qwen3] [--layers N]
                                 [--batch B ...] [--modes MODE ...] [--again] [--cpu-smoke]

Errors raised on purpose by egraph-mirage (``EMError``) print as one ``error: ...`` line on
stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from collections.abc import Sequence

from . import benchmarks
from .dtypes import DType
from .errors import EMError
from .expr import Term, parse
from .graph import KernelGraph, abstract_expr
from .oracle import Oracle
from .pipeline import DEFAULT_BUDGETS
from .rank.forms import FORM_SLACK

#: the dtypes ``bench search`` and ``bench gpu`` build the benchmark programs in (``--dtype``)
BENCH_DTYPES = ("float16", "bfloat16")


def _add_dtype(p: argparse.ArgumentParser, folders: str) -> None:
    p.add_argument("--dtype", choices=BENCH_DTYPES, default="float16",
                   help="element type the programs are built in (default float16); " + folders)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="egraph-mirage",
                                description="e-graph based superoptimizer for tensor programs")
    p.add_argument("--log", choices=("warning", "info", "debug"), default="warning",
                   help="what the egraph_mirage loggers print to stderr (default warning; info: "
                        "each step of the torch backend's compile stages that took 1 s or more)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("list", help="list the benchmark programs")

    o = sub.add_parser("oracle", help="build a benchmark's reachability oracle and query it")
    o.add_argument("name", help="benchmark name (see 'egraph-mirage list')")
    o.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    o.add_argument("--small", action="store_true", help="reduced shapes, same structure")
    o.add_argument("--query", nargs="+", action="extend", default=[], metavar="SEXPR",
                   help='s-expressions to ask about, e.g. \'(Sum 64 (Mul (Var "v0") (Var "v1")))\'')
    o.add_argument("--svg", metavar="PATH", help="also draw the saturated e-graph to PATH")

    r = sub.add_parser("rules", help="list the rule files in use, or print the generated prelude")
    r.add_argument("--prelude", action="store_true",
                   help="print the egglog text the oracle runs before the rule files (the Expr "
                        "datatype and reachability rules, written from the op table)")
    r.add_argument("--rules", nargs="+", action="extend", metavar="PATH",
                   help="rule files or folders in place of the shipped ones")

    from .pipeline import command as optimize

    optimize.add_arguments(sub.add_parser("optimize", help="superoptimize a program"))
    b = sub.add_parser("bench", help="benchmarks of egraph-mirage's own machinery")
    bsub = b.add_subparsers(dest="bench", required=True, metavar="WHAT")
    bo = bsub.add_parser("oracle", help="saturation time and query throughput of the oracle")
    bo.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    bo.add_argument("--small", action="store_true", help="reduced shapes")
    bo.add_argument("--targets", nargs="+", metavar="NAME", help="benchmarks (default: all)")
    bo.add_argument("--seconds", type=float, default=0.3, help="length of each timed loop")
    bo.add_argument("--repeats", type=int, default=5, help="oracle builds timed per target")
    bv = bsub.add_parser("verify", help="false accepts / rejects of the verifier on mutants")
    bv.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    bv.add_argument("--small", action="store_true", help="reduced shapes")
    bv.add_argument("--targets", nargs="+", metavar="NAME", help="benchmarks (default: all)")
    bv.add_argument("--mutants", type=int, default=1000, metavar="N",
                    help="non-equivalent mutants to check per benchmark (default 1000)")
    bv.add_argument("--seed", type=int, default=0, help="seed of mutants, inputs and tests")
    bv.add_argument("--mode", choices=("auto", "numpy", "jit"), default="auto",
                    help="how candidates are evaluated (same verdicts; default: numpy, or jit "
                    "for big inputs)")
    bs = bsub.add_parser("search", help="discovery time of the superoptimizer per program")
    bs.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    bs.add_argument("--small", action="store_true", help="reduced shapes")
    bs.add_argument("--programs", nargs="+", metavar="NAME", help="benchmarks (default: all)")
    bs.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    bs.add_argument("--budget", type=float, default=None, metavar="S",
                    help="seconds each search may take (default "
                    f"{DEFAULT_BUDGETS['bench search']:g})")
    bs.add_argument("--workers", type=int, default=None, metavar="N",
                    help="worker processes (default: every core)")
    bs.add_argument("--no-oracle", action="store_true",
                    help="switch e-graph pruning off, to measure what it buys")
    bs.add_argument("--max-block-ops", type=int, default=None, metavar="N",
                    help="most operators per block graph (default: SearchConfig's)")
    bs.add_argument("--out", metavar="DIR",
                    help="also write each program's results to DIR/<name>_b<batch>/ (the "
                    "layout `optimize --out` writes and `bench gpu --mugraph-dir` reads)")
    bs.add_argument("--max-tasks", type=int, default=None, metavar="N",
                    help="each search's work budget in tasks (with --budget, whichever ends "
                    "first)")
    bs.add_argument("--winners", metavar="ROWS.json",
                    help="`bench gpu --json` rows: report when each program's GPU-winning "
                    "structure was found (seconds and tasks)")
    bs.add_argument("--extra-rules", nargs="+", metavar="FILE",
                    help="rule files added to rules/ for every search")
    bs.add_argument("--progress", action="store_true",
                    help="each search's progress on stderr (a log line every few seconds and "
                    "one per result, when stderr is not a terminal)")
    _add_dtype(bs, "bfloat16 results go to DIR/<name>_b<batch>_bf16/ with --out")
    bg = bsub.add_parser("gpu", help="the search's best μGraphs against PyTorch baselines and "
                         "the hand-written reference on a CUDA GPU")
    bg.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    bg.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16], metavar="B",
                    help="batch sizes (default 1 8 16)")
    bg.add_argument("--programs", nargs="+", metavar="NAME", help="benchmarks (default: all)")
    bg.add_argument("--mugraph-dir", metavar="DIR",
                    help="ours: μGraphs from the search: `optimize --out` folders "
                    "DIR/<name>_b<batch>/ or DIR/<name>/ (result_*.json, else best.json), or "
                    "files DIR/<name>_b<batch>[_*].json; each with its size variants is timed, "
                    "the fastest reported (without it or --from-search ours stays empty)")
    bg.add_argument("--max-candidates", type=int, default=None, metavar="K",
                    help="time only K μGraphs of a folder: the search's best of each form "
                    "(kernels + library operators) first, then the next best")
    bg.add_argument("--size-variants", type=int, default=None, metavar="K",
                    help="at most K sizes of each search result, its own included (default "
                    "16, rank.size_variants.DEFAULT_LIMIT; 1: the search's sizes only)")
    bg.add_argument("--no-reference", action="store_true",
                    help="leave out the hand-written reference μGraphs (by default timed in a "
                    "column of their own, never as ours)")
    bg.add_argument("--from-search", action="store_true",
                    help="run the search for each program and batch first, into "
                    "DIR/<name>_b<batch>/ (DIR: --mugraph-dir, default "
                    "egraph-mirage-out/search; a rerun resumes from its checkpoint)")
    bg.add_argument("--budget", type=float, default=None, metavar="S",
                    help="seconds of search per program and batch with --from-search "
                    f"(default {DEFAULT_BUDGETS['bench gpu']:g})")
    bg.add_argument("--workers", type=int, default=None, metavar="N",
                    help="search processes with --from-search (default: every core)")
    bg.add_argument("--check-workers", type=int, default=None, metavar="N",
                    help="processes that check the size variants against the program when "
                    "one check is long (a large program at real sizes; default: every core "
                    "but one)")
    bg.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    bg.add_argument("--max-autotune", action="store_true",
                    help="also time torch.compile in max-autotune mode, as a second compiled "
                    "baseline (its compiles take seconds to minutes)")
    bg.add_argument("--no-tune", action="store_true", help="the lowering's default knobs only")
    bg.add_argument("--tune-top", type=int, default=4, metavar="K",
                    help="with more μGraphs than K, time each at a few knob settings first and "
                    "tune only the fastest K (default 4), and the fastest of each other form "
                    f"within {FORM_SLACK}x of them")
    bg.add_argument("--cache-dir", metavar="DIR",
                    help="tuning cache (default $EGRAPH_MIRAGE_CACHE or ~/.cache/egraph-mirage)")
    bg.add_argument("--no-cache", action="store_true", help="re-time every tuning trial")
    bg.add_argument("--markdown", metavar="PATH", help="also write a Markdown report to PATH")
    bg.add_argument("--rows", metavar="PATH",
                    help="also write each row to PATH as one JSON line as soon as it is measured "
                    "(what a run stopped part-way has done)")
    bg.add_argument("--plot", metavar="PATH", help="also draw a PNG of the results (matplotlib)")
    _add_dtype(bg, "the search's bfloat16 μGraphs are read from (and --from-search writes) "
               "DIR/<name>_b<batch>_bf16/, and a μGraph of another dtype is refused")
    from .bench import torch_bench

    torch_bench.add_arguments(bsub.add_parser(
        "torch", help="a Llama decoder layer's decode step: eager, torch.compile and the "
        "egraph_mirage backend on a CUDA GPU (docs/torch.md)"))
    from .bench import generate_bench

    generate_bench.add_arguments(bsub.add_parser(
        "generate", help="a whole transformers model's generate() with a static cache: decode "
        "tokens/s of eager, torch.compile and the egraph_mirage backend on a CUDA GPU "
        "(docs/torch.md)"))
    return p


def _log_to_stderr(level: str) -> None:
    """Print the package's log records of ``level`` and above to stderr."""
    import logging

    logger = logging.getLogger("egraph_mirage")
    logger.setLevel(level.upper())
    if not any(h.get_name() == "egraph-mirage --log" for h in logger.handlers):  # once
        handler = logging.StreamHandler()
        handler.set_name("egraph-mirage --log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    if args.log != "warning":
        _log_to_stderr(args.log)
    try:
        if args.command == "list":
            return _list()
        if args.command == "optimize":
            from .pipeline import command as optimize

            return optimize.run(args)
        if args.command == "oracle":
            return _oracle(args.name, args.batch, args.small, args.query, args.svg)
        if args.command == "rules":
            return _rules(args.prelude, args.rules)
        if args.bench == "verify":
            return _bench_verify(args)
        if args.bench == "search":
            return _bench_search(args)
        if args.bench == "gpu":
            from .bench.gpu_bench import run_command

            return run_command(args, argv)
        if args.bench == "torch":
            from .bench.torch_bench import run_command as run_torch

            return run_torch(args)
        if args.bench == "generate":
            from .bench.generate_bench import run_command as run_generate

            return run_generate(args)
        return _bench_oracle(args)
    except EMError as exc:
        print("error: " + " ".join(str(exc).split()), file=sys.stderr)  # always one line
        return 2


def _rules(prelude: bool, paths: Sequence[str] | None) -> int:
    from .oracle.prelude import prelude_text
    from .oracle.rules import DEFAULT_RULES_DIR, rule_files, rules_digest, split_forms

    if prelude:
        print(prelude_text(), end="")
        return 0
    files = rule_files(paths or [DEFAULT_RULES_DIR])
    for f in files:
        print(f"{f}  ({len(split_forms(f.read_text(), str(f)))} forms)")
    print(f"digest {rules_digest(files, prelude_text())}  (the generated prelude included)")
    return 0


def _list() -> int:
    names = benchmarks.names(unseen=True)
    width = max(map(len, names))
    for n in names:
        extra = "  (outside the paper's eight)" if n in benchmarks.UNSEEN else ""
        print(f"{n.ljust(width)}  {benchmarks.describe(n)}{extra}")
    return 0


def _bench_oracle(args: argparse.Namespace) -> int:
    from .bench import bench_oracle, format_table

    if args.seconds <= 0 or args.repeats < 1:
        print("error: --seconds must be positive and --repeats at least 1", file=sys.stderr)
        return 2
    rows = bench_oracle(args.targets, small=args.small, seconds=args.seconds,
                        repeats=args.repeats)
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0


def _bench_search(args: argparse.Namespace) -> int:
    from .bench.search_bench import BENCH_REQUEST, bench_search, format_table, load_winners
    from .pipeline.command import request_from_flags

    dtype = DType[args.dtype]
    try:
        budget = BENCH_REQUEST.time_budget if args.budget is None else args.budget
        request = request_from_flags(time_budget=budget, workers=args.workers,
                                     max_tasks=args.max_tasks, extra_rules=args.extra_rules or (),
                                     progress=args.progress)
        winners = load_winners(args.winners, dtype) if args.winners else None
    except EMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"error: --winners: {e}", file=sys.stderr)
        return 2
    rows = bench_search(args.programs, small=args.small, batch=args.batch, request=request,
                        use_oracle=not args.no_oracle, max_block_ops=args.max_block_ops,
                        out=args.out, winners=winners, dtype=dtype,
                        on_row=lambda r: print(json.dumps(r), file=sys.stderr, flush=True))
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 0


def _bench_verify(args: argparse.Namespace) -> int:
    from .bench.verify_bench import bench_verify, format_table

    if args.mutants < 1:
        print("error: --mutants must be at least 1", file=sys.stderr)
        return 2
    rows = bench_verify(args.targets, small=args.small, min_mutants=args.mutants,
                        seed=args.seed, mode=args.mode)
    print(json.dumps(rows, indent=2, default=str) if args.json else format_table(rows))
    return 1 if any(r["false_accepts"] or r["crashes"] for r in rows) else 0


# --- the oracle demo ---------------------------------------------------------------------------

def derived_queries(oracle: Oracle, seed: int = 0) -> list[tuple[str, Term]]:
    """Questions derived from the target alone (no per-model cases): a written subterm, a term
    only the rules produce, and near misses (inputs swapped, a sum size changed)."""
    from .bench.oracle_bench import random_terms, replace, swap_vars, var_names

    out: list[tuple[str, Term]] = []
    target = oracle.targets[0]
    written = {s for tt in oracle.targets for s in tt.walk()}
    inner = [s for s in target.walk() if s.children and s != target]
    if inner:
        out.append(("a subterm of the target", max(inner, key=lambda s: s.size())))
    sums = [s for s in target.walk() if s.op == "Sum"]
    if sums:
        s = sums[-1]  # the outermost sum (walk lists children first)
        n = s.args[0]
        p = next(d for d in range(2, n + 1) if n % d == 0)
        if p < n:
            out.append((f"a partial sum of the target's Sum {n}",
                        Term("Sum", (n // p, *s.args[1:]))))
    terms = random_terms(oracle, random.Random(seed))
    derived = [t for c, t in terms.items() if oracle.is_reachable_class(c) and t not in written
               and t.size() >= 5 and len(var_names(t)) > 1]
    if derived:
        out.append(("a form the rules derive", min(derived, key=lambda t: (t.size(), str(t)))))
    names = var_names(target)
    swaps = [(a, b) for a, b in ((names[0], names[-1]), *itertools.pairwise(names)) if a != b]
    for a, b in swaps:
        swapped = swap_vars(target, a, b)
        if swapped != target:
            out.append((f"the target with {a} and {b} swapped", swapped))
            break
    if sums:
        s = sums[-1]
        resized = replace(target, s, Term("Sum", (2 * s.args[0], *s.args[1:])))
        out.append((f"the target with Sum {s.args[0]} made Sum {2 * s.args[0]}", resized))
    return out


def _oracle(name: str, batch: int, small: bool, queries: Sequence[str],
            svg: str | None) -> int:
    asked = [(q, parse(q)) for q in queries]  # parse errors surface before the slow part
    g: KernelGraph = benchmarks.get(name, batch=batch, small=small)
    print(f"== program {name} (batch {batch}{', small shapes' if small else ''})")
    print(repr(g))
    print("\n== abstract expressions of the outputs")
    for t in g.outputs:
        print(f"  t{t.index} = {abstract_expr(t)}")
    oracle = Oracle(g)
    s = oracle.stats
    print("\n== saturation")
    print(f"  e-nodes {s.enodes}, e-classes {s.eclasses}, reachable classes "
          f"{s.reachable_classes}, iterations {s.iterations}, {s.seconds * 1e3:.1f} ms, "
          f"complete {s.complete}")

    print("\n== every tensor of the program is a subexpression of the target")
    missing = 0
    for t in g.operators:
        ok = oracle.is_subexpr(t)
        missing += not ok
        print(f"  t{t.index:<3} {t.op:<11} {'yes' if ok else 'NO'}")

    print("\n== queries")
    todo = [(q, term) for q, term in asked] or [
        (f"{what}: {term}", term) for what, term in derived_queries(oracle)]
    for label, term in todo:
        print(f"  {oracle.answer(term).value:<11} {label}")

    if svg is not None:
        try:
            from .viz import egraph_svg
        except ImportError as exc:
            print(f"error: --svg needs egraph_mirage.viz, which could not be imported: {exc}",
                  file=sys.stderr)
            return 2
        egraph_svg(oracle, svg)
        print(f"\nwrote {svg}")
    if missing:
        print(f"error: {missing} tensor(s) of the program were not found reachable",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
