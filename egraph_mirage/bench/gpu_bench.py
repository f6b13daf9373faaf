"""``egraph-mirage bench gpu``: our best μGraph against what users run today, on a CUDA GPU.

For each benchmark program and batch size, in fp16:

* ours: the μGraphs the search wrote under ``--mugraph-dir DIR`` (``candidates``: an
  ``egraph-mirage optimize --out`` folder ``DIR/<name>_b<batch>/`` or ``DIR/<name>/``, or single
  files ``DIR/<name>_b<batch>[_*].json``), else the hand-written fused μGraphs
  (``handwritten.variants``: each form under a few tile sizes); the row's ``source`` says which
  ("search" / "handwritten") and
  ``mugraph_file`` which file won. Every candidate is lowered, tuned over the lowering's knobs
  and numerically checked against PyTorch in float32 (``rank.measured.rank``); the fastest is
  checked again on fresh inputs and timed; None while no lowering exists. ``--from-search`` first
  runs the search for each program and batch (``superoptimize`` with ``--search-budget``) into
  ``DIR/<name>_b<batch>/``;
* the baselines of ``gpu.baselines`` (eager, torch.compile, SDPA where the program is attention);
* each timed with plain launches and under CUDA-graph replay (``gpu.timing``), with the bandwidth
  floor (``gpu.floor``); speedups compare like with like (plain with plain, graph with graph).

Nothing here imports egglog or JAX: μGraphs arrive as JSON.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import benchmarks, handwritten
from ..errors import GraphError
from ..graph import KernelGraph
from ..mugraph.serialize import load
from .table import aligned

#: the keys of every row ``bench_gpu`` returns
KEYS = ("benchmark", "batch", "device", "source", "mugraph_file", "candidates",
        "candidates_us", "ours_us", "ours_graph_us", "baselines_us", "baselines_graph_us",
        "speedup_vs_best", "speedup_vs_best_graph", "floor_us", "floor_fraction",
        "floor_fraction_graph", "knobs", "notes")
#: where ``--from-search`` writes the search's folders when no ``--mugraph-dir`` is given
DEFAULT_SEARCH_DIR = "egraph-mirage-out/search"

Log = Callable[[str], None]
#: the knob settings at which many candidates are pre-ranked before tuning (the faster counts)
QUICK_KNOBS: dict[str, tuple[int, ...]] = {"num_stages": (3,), "num_warps": (4, 8)}


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class GpuBenchConfig:
    programs: Sequence[str] = field(default_factory=benchmarks.names)
    batches: Sequence[int] = (1, 8, 16)
    mugraph_dir: str | None = None
    use_compile: bool = True
    max_autotune: bool = False
    tune: bool = True
    cache_dir: str | None = None  # None: trials are not cached
    small: bool = False  # reduced shapes (for tests)
    device: str = "cuda"
    seed: int = 0
    std: float = 0.1
    #: time at most this many of a folder's μGraphs, the search's best first (None: all)
    max_candidates: int | None = None
    #: run the search first, writing ``mugraph_dir/<name>_b<batch>/`` (``search_into``)
    from_search: bool = False
    search_budget: float = 300.0
    search_config: Any = None  # a ``SearchConfig``; None: the default one
    search_workers: int | None = None  # None: every core
    #: with more candidates than this, all are first timed at ``QUICK_KNOBS`` and only this many
    #: of the fastest are tuned over the whole knob space
    tune_top: int = 4
    #: with search results, also time the hand-written variants; ``source`` says who won
    and_handwritten: bool = False


@dataclass
class Candidates:
    """The μGraphs to try for one program and batch, and where they came from."""

    graphs: list[KernelGraph]
    files: list[str | None]  # the file of each; None for the hand-written one
    source: str  # "search" or "handwritten"
    notes: list[str] = field(default_factory=list)


def _signature(g: KernelGraph) -> list[tuple[Any, Any]]:
    return [(t.dims, t.dtype) for t in g.inputs]


def _load_all(files: Sequence[Path], name: str, batch: int, g: KernelGraph, strict: bool
              ) -> tuple[list[KernelGraph], list[str | None]]:
    """The files' μGraphs that take ``g``'s inputs; any other is an error where ``strict`` (the
    file names the batch), else left out (a folder named after the program alone)."""
    graphs: list[KernelGraph] = []
    kept: list[str | None] = []
    for f in files:
        h = load(f)
        if _signature(h) == _signature(g):
            graphs.append(h)
            kept.append(str(f))
        elif strict:
            raise GraphError(f"{f}: the μGraph's inputs {_signature(h)} differ from {name} at "
                             f"batch {batch}: {_signature(g)}")
    return graphs, kept


def candidates(name: str, batch: int, g: KernelGraph, mugraph_dir: str | None,
               max_candidates: int | None = None) -> Candidates:
    """The μGraphs to try for program ``name`` at ``batch`` (``g``), first found of:

    1. ``DIR/<name>_b<batch>/``: an ``egraph-mirage optimize --out`` folder (``result_<k>.json``
       best first, else ``best.json``; ``search.outdir``); every μGraph must take ``g``'s inputs;
    2. ``DIR/<name>/``: the same, for a search run at one batch: μGraphs for other shapes are
       left out (with a note when none is left);
    3. ``DIR/<name>_b<batch>.json`` and ``DIR/<name>_b<batch>_*.json``: single μGraph files;
    4. the hand-written fused μGraph, under each of its tilings (``handwritten.variants``).

    ``max_candidates`` keeps the first that many of a folder (the search's best by its cost
    model)."""
    from ..search.outdir import mugraph_files

    notes: list[str] = []
    if mugraph_dir is not None:
        root = Path(mugraph_dir)
        flat = (sorted(root.glob(f"{name}_b{batch}.json"))
                + sorted(root.glob(f"{name}_b{batch}_*.json")))
        for files, strict in ((mugraph_files(root / f"{name}_b{batch}"), True),
                              (mugraph_files(root / name), False), (flat, True)):
            graphs, kept = _load_all(files, name, batch, g, strict)
            if graphs:
                n = len(graphs) if max_candidates is None else max(1, max_candidates)
                if n < len(graphs):
                    notes.append(f"timed the first {n} of {len(graphs)} μGraphs")
                return Candidates(graphs[:n], kept[:n], "search", notes)
            if files:
                notes.append(f"{files[0].parent}: no μGraph for batch {batch} (other shapes)")
    graphs = handwritten.variants(name, g)
    return Candidates(graphs, [None] * len(graphs), "handwritten", notes)


def search_into(name: str, batch: int, g: KernelGraph, cfg: GpuBenchConfig,
                log: Log = _stderr) -> Path:
    """Run the search for ``g`` (``name`` at ``batch``) and write its folder
    ``cfg.mugraph_dir/<name>_b<batch>/`` (``search.outdir``); its checkpoint lets a rerun resume
    rather than search again. Imports the search (egglog, JAX) only here."""
    from ..rank.measured import keep_jax_off_the_gpu
    from ..search import SearchConfig, superoptimize
    from ..search.outdir import write_results

    keep_jax_off_the_gpu()
    folder = Path(cfg.mugraph_dir or DEFAULT_SEARCH_DIR) / f"{name}_b{batch}"
    folder.mkdir(parents=True, exist_ok=True)
    results = superoptimize(g, cfg.search_config or SearchConfig(),
                            time_budget=cfg.search_budget, workers=cfg.search_workers,
                            checkpoint=folder / "search.ckpt", progress=False)
    write_results(folder, results, {"name": name, "batch": batch, "small": cfg.small})
    st = results.stats
    log(f"{name} b={batch}: search found {len(results)} μGraph(s), {st.tasks_done}/"
        f"{st.tasks_total} tasks{' (budget reached)' if st.budget_exhausted else ''}, "
        f"written to {folder}")
    return folder


def _best(times: Mapping[str, float | None]) -> float | None:
    vals = [v for v in times.values() if v is not None]
    return min(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def bench_one(name: str, batch: int, cfg: GpuBenchConfig, *, timer: Any, floor: Any,
              compiler: Any, device_name: str, log: Log = _stderr,
              tune_timer: Any = None) -> dict[str, Any]:
    """One row (see ``KEYS``); ``timer`` is a ``gpu.timing.Timer``, ``floor`` a ``gpu.floor.Floor``,
    ``compiler`` a ``gpu.tune.Compiler`` or None (no lowering yet). ``tune_timer`` (default
    ``timer``) ranks the knob settings; the reported figures are ``timer``'s."""
    from ..gpu import baselines as bl
    from ..gpu.timing import graph_bytes, input_sets, l2_bytes, random_inputs, rotation_count
    from ..gpu.tune import Trial, TuneCache, TuneResult, check, tolerance, tune
    from ..rank.measured import rank

    g = benchmarks.get(name, batch=batch, small=cfg.small)
    if cfg.from_search:
        search_into(name, batch, g, cfg, log)
    count = rotation_count(graph_bytes(g), l2_bytes() if cfg.device == "cuda" else 64 << 20)
    sets = input_sets(g, count, cfg.device, cfg.seed, cfg.std)
    check_inputs = random_inputs(g, cfg.device, cfg.seed + 10_000, cfg.std)
    notes: list[str] = []
    row: dict[str, Any] = {"benchmark": name, "batch": batch, "device": device_name,
                           "floor_us": floor.us(g), "input_sets": count}

    found = candidates(name, batch, g, cfg.mugraph_dir, cfg.max_candidates)
    if cfg.and_handwritten and found.source == "search":
        extra = handwritten.variants(name, g)
        found = Candidates(found.graphs + extra, found.files + [None] * len(extra), "search",
                           found.notes)
    notes += found.notes
    if cfg.from_search and found.source == "handwritten":
        notes.append("the search found no μGraph: the hand-written one is ours")
    where = {id(h): f for h, f in zip(found.graphs, found.files)}
    row.update(source=found.source, mugraph_file=None, candidates=len(found.graphs),
               candidates_us={})
    ours = ours_graph = None
    knobs: dict[str, Any] | None = None
    if compiler is None:
        notes.append("no lowering yet: ours not measured")
    else:
        cache = TuneCache(cfg.cache_dir)
        space = None if cfg.tune else {}

        def _tune_safely(h: KernelGraph, space: Any) -> Any:
            try:
                return tune(h, g, compiler=compiler, timer=tune_timer or timer,
                            input_sets=sets, check_inputs=check_inputs, device=device_name,
                            cache=cache, space=space)
            except Exception as exc:  # one broken candidate must not end the benchmark
                return TuneResult([Trial({}, "failed", message=f"{type(exc).__name__}: {exc}")])

        def tuner(h: KernelGraph) -> Any:
            return _tune_safely(h, space)

        graphs = found.graphs
        if cfg.tune and len(graphs) > cfg.tune_top:  # pre-rank at a few knob settings
            pre = rank(graphs, lambda h: _tune_safely(h, QUICK_KNOBS))
            graphs = [r.mugraph for r in pre[:cfg.tune_top] if r.us is not None] or graphs
            notes.append(f"ours: {len(found.graphs)} μGraphs pre-ranked at {QUICK_KNOBS}, "
                         f"the fastest {len(graphs)} tuned")
        ranked = rank(graphs, tuner)
        hand = [h for h, f in zip(found.graphs, found.files) if f is None]
        label = {id(h): f or f"handwritten[{hand.index(h)}]" for h, f in
                 zip(found.graphs, found.files)}
        row["candidates_us"] = {label[id(r.mugraph)]: r.us for r in ranked}
        top = ranked[0]
        if top.us is None or top.tuned is None or top.tuned.fn is None:
            msgs = {f"{t.status}: {t.message or t.error}" for r in ranked if r.tuned
                    for t in r.tuned.trials}
            notes.append("ours: no setting compiled and passed the check (" +
                         "; ".join(sorted(msgs))[:300] + ")")
        else:
            knobs = top.tuned.best.knobs if top.tuned.best else None
            row["mugraph_file"] = where[id(top.mugraph)]
            row["source"] = "handwritten" if row["mugraph_file"] is None else "search"
            failed = sum(r.us is None for r in ranked)
            if failed:
                notes.append(f"ours: {failed} of {len(ranked)} μGraphs failed to lower or "
                             "failed the check")
            ok, err = check(top.tuned.fn, g, random_inputs(g, cfg.device, cfg.seed + 20_000,
                                                           cfg.std))
            if not ok:
                notes.append(f"ours: relative error {err:.2e} on fresh inputs (> {tolerance(g)})")
            else:
                ours = timer.plain(top.tuned.fn, sets)
                ours_graph = timer.graph(top.tuned.fn, sets)
                if callable(getattr(timer, "kernels", None)):  # where our time goes
                    row["kernel_us"] = timer.kernels(top.tuned.fn, sets)
    row.update(ours_us=ours, ours_graph_us=ours_graph, knobs=knobs)

    plain: dict[str, float | None] = {}
    graph: dict[str, float | None] = {}
    for b in bl.baselines_for(g, cfg.use_compile, cfg.max_autotune):
        try:
            ok, err = check(b.fn, g, check_inputs, fn_inputs=b.prepare(check_inputs))
            if not ok:
                notes.append(f"{b.name}: relative error {err:.2e}, left out")
                continue
            prepared = [b.prepare(s) for s in sets]
            plain[b.name] = timer.plain(b.fn, prepared)
            graph[b.name] = timer.graph(b.fn, prepared)
        except Exception as exc:  # e.g. a baseline that cannot be captured in a graph
            notes.append(f"{b.name}: {type(exc).__name__}: {exc}"[:200])
            plain.setdefault(b.name, None)
            graph.setdefault(b.name, None)
    row.update(baselines_us=plain, baselines_graph_us=graph,
               speedup_vs_best=_ratio(_best(plain), ours),
               speedup_vs_best_graph=_ratio(_best(graph), ours_graph),
               floor_fraction=_ratio(row["floor_us"], ours),
               floor_fraction_graph=_ratio(row["floor_us"], ours_graph),
               notes=notes)
    log(f"{name} b={batch}: ours ({row['source']}"
        + (f" {row['mugraph_file']}" if row["mugraph_file"] else "")
        + f", best of {len(found.graphs)}) {_fmt(ours)} / {_fmt(ours_graph)} µs (graph), baselines "
        + ", ".join(f"{k} {_fmt(plain[k])} / {_fmt(graph.get(k))}" for k in plain)
        + (f"; {'; '.join(notes)}" if notes else ""))
    extra = {k: row[k] for k in ("kernel_us",) if k in row}
    return {k: row[k] for k in KEYS} | extra | {"input_sets": count}


def bench_gpu(cfg: GpuBenchConfig, *, timer: Any = None, floor: Any = None, compiler: Any = "auto",
              device_name: str | None = None, log: Log = _stderr) -> list[dict[str, Any]]:
    """Every program at every batch size; the defaults measure on the current CUDA device."""
    import torch

    from ..gpu.floor import Floor, measure_copy_bandwidth
    from ..gpu.timing import CudaTimer, TimingConfig
    from ..gpu.timing import device_name as cuda_name
    from ..gpu.tune import default_compiler

    for name in cfg.programs:
        benchmarks.describe(name)  # unknown names fail before any measurement
    if cfg.from_search and cfg.mugraph_dir is None:
        cfg = replace(cfg, mugraph_dir=DEFAULT_SEARCH_DIR)
    tune_timer = timer or CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5, graph_replays=7))
    timer = timer or CudaTimer(TimingConfig())
    if floor is None:
        floor = Floor(measure_copy_bandwidth())
        log(f"copy bandwidth {floor.bandwidth / 1e12:.2f} TB/s (read + write)")
    compiler = default_compiler() if compiler == "auto" else compiler
    name = device_name or cuda_name()
    rows = []
    for b in cfg.batches:
        for p in cfg.programs:
            rows.append(bench_one(p, b, cfg, timer=timer, floor=floor, compiler=compiler,
                                  device_name=name, log=log, tune_timer=tune_timer))
            if cfg.device == "cuda":
                torch.cuda.empty_cache()  # the program's inputs and graphs are gone
    return rows


# --- reports -----------------------------------------------------------------------------------

def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _baseline_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        seen += [k for k in r["baselines_us"] if k not in seen]
    return seen


def table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    names = _baseline_names(rows)
    head = ["program", "b", "source", "floor", "ours", "ours+graph"]
    for n in names:
        head += [n, f"{n}+graph"]
    head += ["best", "best+graph", "speedup", "speedup+graph", "floor/ours+graph"]
    body = []
    for r in rows:
        cells = [r["benchmark"], str(r["batch"]), r["source"], _fmt(r["floor_us"]),
                 _fmt(r["ours_us"]), _fmt(r["ours_graph_us"])]
        for n in names:
            cells += [_fmt(r["baselines_us"].get(n)), _fmt(r["baselines_graph_us"].get(n))]
        cells += [_fmt(_best(r["baselines_us"])), _fmt(_best(r["baselines_graph_us"])),
                  _fmt(r["speedup_vs_best"], 2), _fmt(r["speedup_vs_best_graph"], 2),
                  _fmt(r["floor_fraction_graph"], 2)]
        body.append(cells)
    return head, body


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as an aligned text table (µs; speedups over the best baseline, like for like)."""
    head, body = table_cells(rows)
    return "\n".join(aligned(head, body, left=3))


def markdown(rows: Sequence[Mapping[str, Any]], date: str, command: str,
             bandwidth: float | None = None) -> str:
    """A Markdown report of the rows: device, date, command, then the table."""
    head, body = table_cells(rows)
    devices = sorted({r["device"] for r in rows})
    lines = ["# GPU benchmarks", "",
             f"Measured on {', '.join(devices)}, {date}, with `{command}`.", ""]
    if bandwidth:
        lines += [f"Copy bandwidth measured in the same run: {bandwidth / 1e12:.2f} TB/s "
                  "(bytes read + written); floor = input + output bytes at that rate.", ""]
    lines += ["fp16, µs, medians. Plain: `triton.testing.do_bench` (L2 flushed); +graph: replay "
              "of a captured CUDA graph, inputs rotated when they fit in L2. Speedup: best "
              "baseline over ours, plain vs plain and graph vs graph. `source`: where ours came "
              "from: `search` (the fastest of the search's μGraphs, each tuned; the JSON rows "
              "name its file) or `handwritten` (a hand-written fused μGraph).", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    where: dict[str, list[str]] = {}  # a note shared by several rows is written once
    for r in rows:
        for n in r["notes"]:
            where.setdefault(n, []).append(f"{r['benchmark']} b={r['batch']}")
    if where:
        lines += ["", "Notes:", ""]
        lines += [f"- {n} ({'every row' if len(w) == len(rows) > 1 else ', '.join(w)})"
                  for n, w in where.items()]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """A PNG of floor / time (graph replay) per program and system, and of ours' speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['benchmark']}\nb={r['batch']}" for r in rows]
    has_ours = any(r["ours_graph_us"] is not None for r in rows)
    systems = ["ours"] * has_ours + _baseline_names(rows)
    fig, axes = plt.subplots(2 if has_ours else 1, 1, figsize=(max(8, 0.9 * len(rows)), 8),
                             squeeze=False)
    ax = axes[0][0]
    width = 0.8 / len(systems)
    for i, s in enumerate(systems):
        vals = [_ratio(r["floor_us"], r["ours_graph_us"] if s == "ours"
                       else r["baselines_graph_us"].get(s)) or 0.0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], vals, width, label=s)
    ax.set_ylabel("floor / time (CUDA graph)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, fontsize=7)
    ax.legend(fontsize=7)
    ax.set_title(f"{rows[0]['device'] if rows else ''}: fraction of the bandwidth floor")
    if has_ours:
        ax2 = axes[1][0]
        for i, key in enumerate(("speedup_vs_best", "speedup_vs_best_graph")):
            ax2.bar([x + i * 0.4 for x in range(len(rows))], [r[key] or 0.0 for r in rows], 0.4,
                    label="plain" if i == 0 else "CUDA graph")
        ax2.axhline(1.0, color="k", linewidth=0.8)
        ax2.set_ylabel("speedup over best baseline")
        ax2.set_xticks([x + 0.2 for x in range(len(rows))], labels, fontsize=7)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --- the command -------------------------------------------------------------------------------

def run_command(args: Any, argv: Sequence[str] | None = None) -> int:
    """``egraph-mirage bench gpu``: measure, print (JSON or a table, last), write reports."""
    import datetime
    import json

    import torch

    from ..files import write_atomic
    from ..gpu.floor import Floor, measure_copy_bandwidth
    from ..gpu.tune import default_cache_dir

    if not torch.cuda.is_available():
        print("error: bench gpu needs a CUDA GPU, and torch sees none", file=sys.stderr)
        return 2
    if any(b < 1 for b in args.batch):
        print("error: --batch sizes must be positive", file=sys.stderr)
        return 2
    cache = None if args.no_cache else str(args.cache_dir or default_cache_dir())
    if args.max_candidates is not None and args.max_candidates < 1:
        print("error: --max-candidates must be at least 1", file=sys.stderr)
        return 2
    if args.tune_top < 1:
        print("error: --tune-top must be at least 1", file=sys.stderr)
        return 2
    if args.search_budget <= 0:
        print("error: --search-budget must be positive", file=sys.stderr)
        return 2
    cfg = GpuBenchConfig(programs=args.programs or benchmarks.names(), batches=args.batch,
                         mugraph_dir=args.mugraph_dir, use_compile=not args.no_compile,
                         max_autotune=args.max_autotune, tune=not args.no_tune, cache_dir=cache,
                         max_candidates=args.max_candidates, from_search=args.from_search,
                         search_budget=args.search_budget, search_workers=args.search_workers,
                         tune_top=args.tune_top, and_handwritten=args.and_handwritten)
    if cfg.from_search:
        from ..rank.measured import keep_jax_off_the_gpu

        keep_jax_off_the_gpu()  # before anything imports JAX
    floor = Floor(measure_copy_bandwidth())
    _stderr(f"copy bandwidth {floor.bandwidth / 1e12:.2f} TB/s (read + write)")
    rows = bench_gpu(cfg, floor=floor)
    command = "egraph-mirage " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.markdown:
        date = datetime.date.today().isoformat()
        write_atomic(args.markdown, markdown(rows, date, command, floor.bandwidth))
        _stderr(f"wrote {args.markdown}")
    if args.plot:
        try:
            plot(rows, args.plot)
            _stderr(f"wrote {args.plot}")
        except ImportError as exc:
            _stderr(f"no plot: {exc}")
    print(json.dumps(rows, indent=2) if args.json else format_table(rows))
    return 0
