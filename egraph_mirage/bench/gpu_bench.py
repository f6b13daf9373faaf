"""``egraph-mirage bench gpu``: our best μGraph against what users run today, on a CUDA GPU.

For each benchmark program and batch size, in fp16:

* ours: the μGraphs the search wrote (``DIR/<name>_b<batch>.json`` and ``..._b<batch>_*.json``
  under ``--mugraph-dir``), else the hand-written fused μGraph (``handwritten.fused``; the row's
  ``source`` says which), lowered, tuned over the lowering's knobs, numerically checked against
  PyTorch in float32, and timed; None while no lowering exists;
* the baselines of ``gpu.baselines`` (eager, torch.compile, SDPA where the program is attention);
* each timed with plain launches and under CUDA-graph replay (``gpu.timing``), with the bandwidth
  floor (``gpu.floor``); speedups compare like with like (plain with plain, graph with graph).

Nothing here imports egglog or JAX: μGraphs arrive as JSON.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import benchmarks, handwritten
from ..errors import GraphError
from ..graph import KernelGraph
from ..mugraph.serialize import load

#: the keys of every row ``bench_gpu`` returns
KEYS = ("benchmark", "batch", "device", "source", "ours_us", "ours_graph_us", "baselines_us",
        "baselines_graph_us", "speedup_vs_best", "speedup_vs_best_graph", "floor_us",
        "floor_fraction", "floor_fraction_graph", "knobs", "notes")

Log = Callable[[str], None]


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


def candidates(name: str, batch: int, g: KernelGraph, mugraph_dir: str | None
               ) -> tuple[list[KernelGraph], str]:
    """The μGraphs to try for one program and batch, and where they came from."""
    files: list[Path] = []
    if mugraph_dir is not None:
        d = Path(mugraph_dir)
        files = sorted(d.glob(f"{name}_b{batch}.json")) + sorted(d.glob(f"{name}_b{batch}_*.json"))
    if not files:
        return [handwritten.fused(name, g)], "handwritten"
    graphs = []
    for f in files:
        h = load(f)
        want = [(t.dims, t.dtype) for t in g.inputs]
        got = [(t.dims, t.dtype) for t in h.inputs]
        if got != want:
            raise GraphError(f"{f}: the μGraph's inputs {got} differ from {name} at batch "
                             f"{batch}: {want}")
        graphs.append(h)
    return graphs, f"search ({len(files)} file{'s' if len(files) > 1 else ''})"


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
    from ..gpu.tune import FP16_TOL, TuneCache, check, rank, tune

    g = benchmarks.get(name, batch=batch, small=cfg.small)
    count = rotation_count(graph_bytes(g), l2_bytes() if cfg.device == "cuda" else 64 << 20)
    sets = input_sets(g, count, cfg.device, cfg.seed, cfg.std)
    check_inputs = random_inputs(g, cfg.device, cfg.seed + 10_000, cfg.std)
    notes: list[str] = []
    row: dict[str, Any] = {"benchmark": name, "batch": batch, "device": device_name,
                           "floor_us": floor.us(g), "input_sets": count}

    graphs, source = candidates(name, batch, g, cfg.mugraph_dir)
    row["source"] = source
    ours = ours_graph = None
    knobs: dict[str, Any] | None = None
    if compiler is None:
        notes.append("no lowering yet: ours not measured")
    else:
        cache = TuneCache(cfg.cache_dir)
        space = None if cfg.tune else {}

        def tuner(h: KernelGraph) -> Any:
            return tune(h, g, compiler=compiler, timer=tune_timer or timer, input_sets=sets,
                        check_inputs=check_inputs, device=device_name, cache=cache, space=space)

        ranked = rank(graphs, tuner)
        top = ranked[0]
        if top.us is None or top.tuned is None or top.tuned.fn is None:
            msgs = {f"{t.status}: {t.message or t.error}" for r in ranked if r.tuned
                    for t in r.tuned.trials}
            notes.append("ours: no setting compiled and passed the check (" +
                         "; ".join(sorted(msgs))[:300] + ")")
        else:
            knobs = top.tuned.best.knobs if top.tuned.best else None
            ok, err = check(top.tuned.fn, g, random_inputs(g, cfg.device, cfg.seed + 20_000,
                                                           cfg.std))
            if not ok:
                notes.append(f"ours: relative error {err:.2e} on fresh inputs (> {FP16_TOL})")
            else:
                ours = timer.plain(top.tuned.fn, sets)
                ours_graph = timer.graph(top.tuned.fn, sets)
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
    log(f"{name} b={batch}: ours {_fmt(ours)} / {_fmt(ours_graph)} µs (graph), baselines "
        + ", ".join(f"{k} {_fmt(plain[k])} / {_fmt(graph.get(k))}" for k in plain)
        + (f"; {'; '.join(notes)}" if notes else ""))
    return {k: row[k] for k in KEYS} | {"input_sets": count}


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
        cells = [r["benchmark"], str(r["batch"]), r["source"].split(" ")[0], _fmt(r["floor_us"]),
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
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    lines = []
    for row in (head, *body):
        cells = [c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(cells))
    return "\n".join(lines)


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
              "from (the search's μGraph files, or the hand-written fused μGraph).", "",
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
    cfg = GpuBenchConfig(programs=args.programs or benchmarks.names(), batches=args.batch,
                         mugraph_dir=args.mugraph_dir, use_compile=not args.no_compile,
                         max_autotune=args.max_autotune, tune=not args.no_tune, cache_dir=cache)
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
