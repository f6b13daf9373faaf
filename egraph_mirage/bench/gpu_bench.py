"""``egraph-mirage bench gpu``: the search's best μGraph against what users run today, on a GPU.

For each benchmark program and batch size, in fp16 (or the dtype of ``--dtype``: every row
records it in ``dtype``; the program, its inputs, the baselines and the reference are all built in
it):

* ours: only what the search found. The μGraphs under ``--mugraph-dir DIR`` (``candidates``: an
  ``egraph-mirage optimize --out`` folder ``DIR/<name>_b<batch>/`` or ``DIR/<name>/``, or single
  files ``DIR/<name>_b<batch>[_*].json``); ``--from-search`` first runs the search for each
  program and batch (``superoptimize`` with ``--budget``) into ``DIR/<name>_b<batch>/``. For
  bfloat16 every one of these names ends in ``_bf16`` (``DIR/<name>_b<batch>_bf16/``,
  ``DIR/<name>_bf16/``, ...: ``search_bench.results_dir_name``); a μGraph of another dtype
  found there is refused (``DTypeError``, naming the file), never timed.
  Each result is expanded into its size variants (``rank.size_variants.size_variants``: the same
  structure at other grid, loop and split sizes, each verified against the program); every
  candidate is lowered, tuned over the lowering's knobs and numerically checked against PyTorch
  in float32 (``rank.measured.rank``); the fastest is checked again on fresh inputs and timed.
  ``source`` is always ``"search"``, ``mugraph_file`` names the file and ``size_variant`` the
  variant that won (0: the file's own sizes). Without a search result ours is empty (None) and
  the row says so in its notes;
* the reference: the hand-written fused μGraphs (``bench.handwritten_fixtures.variants``), measured
the
  same way in the same run, in a column of their own (``reference_*``); never ours;
* the baselines of ``gpu.baselines`` (eager, torch.compile, SDPA where the program is attention);
* each timed with plain launches and under CUDA-graph replay (``gpu.timing``), with the bandwidth
  floor (``gpu.floor``); speedups compare like with like (plain with plain, graph with graph).

Nothing here imports egglog, and JAX only where size variants are verified: μGraphs arrive as
JSON.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import benchmarks
from ..dtypes import DType, float16
from ..errors import DTypeError, EMError, GraphError
from ..graph import KernelGraph
from ..lower.cost_model import ProgramCost
from ..mugraph.serialize import dumps, load
from ..mugraph.sizes import retarget
from ..pipeline import DEFAULT_BUDGETS, Request
from ..pipeline.command import request_from_flags
from ..rank.forms import FORM_SLACK, form_label, rank_correlation, spread, to_tune
from . import handwritten_fixtures as fixtures
from .gpu_report import best, fmt, format_table, markdown, plot, ratio, short_dtype, table_cells
from .search_bench import dtype_suffix, results_dir_name

__all__ = ["KEYS", "BenchContext", "Candidates", "GpuBenchConfig", "bench_gpu", "bench_one",
           "candidates", "expand_sizes", "format_table", "markdown", "measure", "plot",
           "run_command", "search_into", "table_cells"]

#: the keys of every row ``bench_gpu`` returns
KEYS = ("benchmark", "batch", "dtype", "device", "source", "mugraph_file", "size_variant",
        "search_results", "candidates", "candidates_us", "ours_us", "ours_graph_us",
        "reference_candidate", "reference_candidates", "reference_candidates_us",
        "reference_us", "reference_graph_us", "baselines_us", "baselines_graph_us",
        "speedup_vs_best", "speedup_vs_best_graph", "ours_vs_reference",
        "ours_vs_reference_graph", "floor_us", "floor_fraction", "floor_fraction_graph",
        "knobs", "reference_knobs", "winner_form", "winner_mugraph", "forms_timed",
        "form_us", "first_us", "cost_model_rank_corr", "notes")
#: where ``--from-search`` writes the search's folders when no ``--mugraph-dir`` is given
DEFAULT_SEARCH_DIR = "egraph-mirage-out/search"
#: the note of a row whose search gave nothing to time
NO_SEARCH_RESULT = "no search result: ours not measured"

Log = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _label(name: str, batch: int, dtype: DType) -> str:
    """How the log names a program at a batch: ``gqa b=1``, ``gqa b=1 bf16``."""
    return f"{name} b={batch}" + ("" if dtype is float16 else f" {short_dtype(dtype.value)}")


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
    #: time at most this many of a folder's μGraphs, the search's best of each form first
    #: (``rank.forms.spread``; None: all)
    max_candidates: int | None = None
    #: run the search first, writing ``mugraph_dir/<name>_b<batch>/`` (``search_into``)
    from_search: bool = False
    #: what the search is asked with ``from_search``: five minutes per program and batch, on
    #: every core, silent (its checkpoint is the program's folder's)
    search: Request = field(default_factory=lambda: Request(
        time_budget=DEFAULT_BUDGETS["bench gpu"], progress=False))
    #: with more candidates than this, all are first timed at ``QUICK_KNOBS`` and only this many
    #: of the fastest are tuned over the whole knob space
    tune_top: int = 4
    #: at most this many sizes of each search result, its own first (``size_variants``'s
    #: ``limit``; None: its default, ``rank.size_variants.DEFAULT_LIMIT``; 1: the search's own only)
    size_limit: int | None = None
    #: processes that check the size variants against the program where one check is long (a
    #: large program at its real sizes; ``rank.size_variants.size_variants``); None: every core but
    #: one
    check_workers: int | None = None
    #: also time the hand-written reference μGraphs (``reference_*``; never ours)
    reference: bool = True
    #: the element type every program is built and timed in (its search folders:
    #: ``search_bench.results_dir_name``)
    dtype: DType = float16


@dataclass
class Candidates:
    """The search's μGraphs for one program and batch, and the file each came from."""

    graphs: list[KernelGraph]
    files: list[str]
    notes: list[str] = field(default_factory=list)
    source: str = "search"  # ours comes from the search alone


def _signature(g: KernelGraph) -> list[tuple[Any, Any]]:
    return [(t.dims, t.dtype) for t in g.inputs]


def _dtypes(g: KernelGraph) -> list[str]:
    """The dtypes of ``g``'s inputs and outputs, sorted (one for every benchmark program)."""
    return sorted({t.dtype.value for t in (*g.inputs, *g.outputs)})


def _same_dtypes(f: Path, h: KernelGraph, name: str, batch: int, g: KernelGraph) -> None:
    """Refuse μGraph ``h`` (file ``f``) where its dtypes are not program ``g``'s: a search of
    one dtype is never timed as another's (``DTypeError``, naming the file)."""
    if _dtypes(h) != _dtypes(g):
        want = "/".join(_dtypes(g))
        raise DTypeError(
            f"{f}: a μGraph in {'/'.join(_dtypes(h))}, but {name} is timed in {want} (--dtype); "
            f"a search of one dtype is never timed as another's (the {want} search of {name} "
            f"at batch {batch} is read from {results_dir_name(name, batch, g.inputs[0].dtype)}/)")


def _load_all(files: Sequence[Path], name: str, batch: int, g: KernelGraph, strict: bool,
              notes: list[str]) -> tuple[list[KernelGraph], list[str]]:
    """The files' μGraphs on ``g``'s inputs. Any other is an error where ``strict`` (the file
    names the batch); else (a folder of the program alone, or of another batch) its structure
    is retargeted to ``g``'s shapes (``mugraph.sizes.retarget``; verified later with the size
    variants), labelled ``<file>@b<batch>``, or left out with a note where it does not fit."""
    graphs: list[KernelGraph] = []
    kept: list[str] = []
    misfits = 0
    for f in files:
        h = load(f)
        _same_dtypes(f, h, name, batch, g)
        if _signature(h) == _signature(g):
            graphs.append(h)
            kept.append(str(f))
        elif strict:
            raise GraphError(f"{f}: the μGraph's inputs {_signature(h)} differ from {name} at "
                             f"batch {batch}: {_signature(g)}")
        else:
            try:
                graphs.append(retarget(h, g))
                kept.append(f"{f}@b{batch}")
            except EMError:
                misfits += 1
    if misfits:
        notes.append(f"{misfits} of {len(files)} μGraphs in {files[0].parent} do not fit "
                     f"batch {batch}'s shapes")
    return graphs, kept


def _by_cost_here(graphs: list[KernelGraph], kept: list[str]
                  ) -> tuple[list[KernelGraph], list[str]]:
    """Retargeted μGraphs, cheapest first by the cost model at their new shapes (ties keep the
    search's order). The search ranked them at the shapes it searched: a one-kernel form
    whose grid holds only the heads is last at b = 1 (too few blocks) and first at b = 16."""
    cost = ProgramCost()
    order = sorted(range(len(graphs)), key=lambda i: cost.seconds(graphs[i]))
    return [graphs[i] for i in order], [kept[i] for i in order]


def candidates(name: str, batch: int, g: KernelGraph, mugraph_dir: str | None,
               max_candidates: int | None = None) -> Candidates:
    """The search's μGraphs for program ``name`` at ``batch`` (``g``), first found of (each
    name with ``_bf16`` appended where ``g`` is bfloat16: ``search_bench.dtype_suffix``):

    1. ``DIR/<name>_b<batch>/``: an ``egraph-mirage optimize --out`` folder (``result_<k>.json``
       best first, else ``best.json``; ``pipeline.results_folder``); every μGraph must take ``g``'s
       inputs;
    2. ``DIR/<name>/``: the same, for a search run at one batch: μGraphs for other shapes are
       retargeted to this batch's (``mugraph.sizes.retarget``: one search serves every batch;
       the size variants verify them against ``g``);
    3. ``DIR/<name>_b<batch>.json`` and ``DIR/<name>_b<batch>_*.json``: single μGraph files;
    4. ``DIR/<name>_b<k>/`` for another batch ``k`` (the smallest first), retargeted.

    None of them (or no ``mugraph_dir``): no candidate; the hand-written μGraphs are never
    ours. Retargeted μGraphs are ordered again by the cost model at this batch's shapes
    (``_by_cost_here``); the others keep the search's order. ``max_candidates`` keeps that many
    of a folder: the best (by the cost model) of each form first (``rank.forms.spread``), then
    the next best. A μGraph of another dtype in any of them is refused (``DTypeError``). Loads
    JSON only (no egglog, no JAX)."""
    from ..pipeline.results_folder import mugraph_files

    notes: list[str] = []
    if mugraph_dir is None:
        return Candidates([], [], notes)
    root = Path(mugraph_dir)
    dtype = g.inputs[0].dtype
    sfx = dtype_suffix(dtype)
    own = f"{name}_b{batch}{sfx}"
    flat = sorted(root.glob(f"{own}.json")) + sorted(
        p for p in root.glob(f"{own}_*.json") if not _other_dtypes_file(p.stem[len(own):]))
    batches = {p: p.name[len(name) + 2:len(p.name) - len(sfx)]
               for p in root.glob(f"{name}_b*{sfx}") if p.is_dir() and p.name != own}
    others = sorted((p for p, k in batches.items() if k.isdigit()),
                    key=lambda p: int(batches[p]))
    for files, strict in ((mugraph_files(root / own), True),
                          (mugraph_files(root / f"{name}{sfx}"), False), (flat, True),
                          *((mugraph_files(p), False) for p in others)):
        graphs, kept = _load_all(files, name, batch, g, strict, notes)
        if graphs and not strict and any(k.endswith(f"@b{batch}") for k in kept):
            graphs, kept = _by_cost_here(graphs, kept)
            notes.append(f"{len(graphs)} μGraphs of the search in {files[0].parent}, retargeted "
                         f"to batch {batch} where searched at another, ordered by the cost "
                         f"model at these shapes")
        if graphs:
            n = len(graphs) if max_candidates is None else max(1, max_candidates)
            if n < len(graphs):
                notes.append(f"timed {n} of {len(graphs)} μGraphs, the best of each form first")
                order = spread(list(range(len(graphs))), lambda i: graphs[i])[:n]
                graphs, kept = [graphs[i] for i in order], [kept[i] for i in order]
            return Candidates(graphs[:n], kept[:n], notes)
        if files:
            notes.append(f"{files[0].parent}: no μGraph for batch {batch} (other shapes)")
    for other in DType:  # say where a search of another dtype lies unread
        there = root / results_dir_name(name, batch, other)
        if other is not dtype and mugraph_files(there):
            notes.append(f"{there} holds {other.value} results, not read for {dtype.value} "
                         f"(those are read from {root / own})")
    return Candidates([], [], notes)


def _other_dtypes_file(tail: str) -> bool:
    """Whether ``<name>_b<batch><tail>.json`` belongs to another dtype's results (its tail is
    ``_bf16`` or starts with ``_bf16_``, and so on), read only for that dtype."""
    return any(s and (tail == s or tail.startswith(s + "_")) for s in map(dtype_suffix, DType))


@dataclass
class Expanded:
    """The search's μGraphs with their size variants: what is timed as ours."""

    graphs: list[KernelGraph]
    files: list[str]  # the search's file each came from
    variants: list[int]  # its index among that file's size variants (0: the file's own)
    notes: list[str] = field(default_factory=list)

    def label(self, i: int) -> str:
        return self.files[i] if self.variants[i] == 0 else f"{self.files[i]}#{self.variants[i]}"


def expand_sizes(found: Candidates, g: KernelGraph, limit: int | None = None,
                 workers: int = 1, smem: int | None = None) -> Expanded:
    """Each of the search's μGraphs followed by its size variants
    (``rank.size_variants.size_variants``, verified against ``g``, in ``workers`` processes where
    one
    check is long), their tiles within ``smem`` bytes of shared memory per block where given
    (the GPU's; else the search's budget); a μGraph met twice is kept once, the first time. A
    result whose variants cannot be made is kept at its own sizes (a note)."""
    from ..mugraph.sizes import DEFAULT_CAPS, with_smem
    from ..rank.size_variants import size_variants

    caps = with_smem(DEFAULT_CAPS, smem)
    out = Expanded([], [], [])
    seen: set[str] = set()
    for h, f in zip(found.graphs, found.files):
        try:
            sized = size_variants(h, target=g, limit=limit, caps=caps, workers=workers)
        except EMError as exc:  # one result's sizes must not end the benchmark
            out.notes.append(f"ours: no size variants of {f}: {exc}"[:200])
            sized = [h]
        for k, v in enumerate(sized):
            key = dumps(v)
            if key not in seen:
                seen.add(key)
                out.graphs.append(v)
                out.files.append(f)
                out.variants.append(k)
    return out


def search_into(name: str, batch: int, g: KernelGraph, cfg: GpuBenchConfig,
                log: Log = _stderr) -> Path:
    """Run the search for ``g`` (``name`` at ``batch``) and write its folder
    ``cfg.mugraph_dir/<name>_b<batch>/`` (the pipeline's ``write`` stage); its checkpoint lets
    a rerun resume rather than search again. Imports the search (egglog, JAX) only here."""
    from ..pipeline import run
    from ..rank import keep_jax_off_the_gpu

    keep_jax_off_the_gpu()
    folder = Path(cfg.mugraph_dir or DEFAULT_SEARCH_DIR) / results_dir_name(name, batch,
                                                                             cfg.dtype)
    folder.mkdir(parents=True, exist_ok=True)
    results = run(g, replace(cfg.search, checkpoint=folder / "search.ckpt"), out=folder,
                  program_info={"name": name, "batch": batch, "small": cfg.small,
                                "dtype": cfg.dtype.value})
    st = results.stats
    log(f"{_label(name, batch, cfg.dtype)}: search found {len(results)} μGraph(s), "
        f"{st.tasks_done}/{st.tasks_total} tasks"
        f"{' (budget reached)' if st.budget_exhausted else ''}, written to {folder}")
    return folder


@dataclass
class Measured:
    """The fastest of a set of μGraphs, tuned, checked again on fresh inputs and timed."""

    us: float | None = None  # plain launches; None: nothing compiled, passed and was timed
    graph_us: float | None = None  # CUDA-graph replay
    label: str | None = None  # the winner's label
    knobs: dict[str, Any] | None = None
    candidates_us: dict[str, float | None] = field(default_factory=dict)  # tuned time per label
    #: every candidate's first timing (at ``QUICK_KNOBS`` where pre-ranked, else tuned) by label
    first_us: dict[str, float | None] = field(default_factory=dict)
    kernel_us: dict[str, float] | None = None  # per kernel, where the timer profiles them
    notes: list[str] = field(default_factory=list)


@dataclass
class BenchContext:
    """What measuring μGraphs of one program at one batch needs (``bench_one`` builds it): the
    program, the configuration, the timers, the compiler and the inputs."""

    g: KernelGraph
    cfg: GpuBenchConfig
    timer: Any
    tune_timer: Any
    compiler: Any
    device_name: str
    sets: Any
    check_inputs: Any
    #: bytes of shared memory a block may take on the GPU (None: the search's budget)
    smem: int | None = None


def measure(graphs: Sequence[KernelGraph], labels: Sequence[str], who: str, b: BenchContext,
            profile: bool = False) -> Measured:
    """Tune every μGraph (many: pre-ranked at ``QUICK_KNOBS``, the fastest ``tune_top`` tuned,
    and the fastest of each other form close to them: ``rank.forms.to_tune``), check the
    fastest again on fresh inputs and time it; notes start with ``who``."""
    from ..gpu.timing import random_inputs
    from ..gpu.tune import (
        QUICK_KNOBS,
        Trial,
        TuneCache,
        TuneResult,
        check,
        staged_spaces,
        tolerance,
        tune,
        tune_staged,
    )
    from ..rank.measured import rank

    cfg, g, out = b.cfg, b.g, Measured()
    cache = TuneCache(cfg.cache_dir)

    def _tune_safely(h: KernelGraph, space: Any) -> Any:
        try:
            return tune(h, g, compiler=b.compiler, timer=b.tune_timer, input_sets=b.sets,
                        check_inputs=b.check_inputs, device=b.device_name, cache=cache,
                        space=space)
        except Exception as exc:  # one broken candidate must not end the benchmark
            return TuneResult([Trial({}, "failed", message=f"{type(exc).__name__}: {exc}")])

    label = {id(h): s for h, s in zip(graphs, labels)}
    todo = list(graphs)
    if cfg.tune and len(todo) > cfg.tune_top:  # pre-rank at a few knob settings
        pre = rank(todo, lambda h: _tune_safely(h, staged_spaces(h, QUICK_KNOBS)[0]))
        out.first_us = {label[id(r.mugraph)]: r.us for r in pre}
        timed = [r for r in pre if r.us is not None]
        picks, extra = to_tune([float(r.us) for r in timed if r.us is not None],
                               [r.mugraph for r in timed], cfg.tune_top)
        todo = [timed[i].mugraph for i in picks] or todo
        out.notes.append(f"{who}: {len(graphs)} μGraphs pre-ranked at {QUICK_KNOBS}, the "
                         f"fastest {len(todo) - len(extra)} tuned" + (
                             f", and the fastest of {len(extra)} more form(s) within "
                             f"{FORM_SLACK}× of them" if extra else ""))
    # tuned: the lowering's knobs first, then the μGraph's own at the best of them
    ranked = rank(todo, (lambda h: tune_staged(h, _tune_safely)) if cfg.tune
                  else (lambda h: _tune_safely(h, {})))
    out.candidates_us = {label[id(r.mugraph)]: r.us for r in ranked}
    out.first_us = out.first_us or dict(out.candidates_us)
    top = ranked[0]
    if top.us is None or top.tuned is None or top.tuned.fn is None:
        msgs = {f"{t.status}: {t.message or t.error}" for r in ranked if r.tuned
                for t in r.tuned.trials}
        out.notes.append(f"{who}: no setting compiled and passed the check ("
                         + "; ".join(sorted(msgs))[:300] + ")")
        return out
    out.knobs = top.tuned.best.knobs if top.tuned.best else None
    out.label = label[id(top.mugraph)]
    failed = sum(r.us is None for r in ranked)
    if failed:
        out.notes.append(f"{who}: {failed} of {len(ranked)} μGraphs failed to lower or failed "
                         "the check")
    ok, err = check(top.tuned.fn, g, random_inputs(g, cfg.device, cfg.seed + 20_000, cfg.std))
    if not ok:
        out.notes.append(f"{who}: relative error {err:.2e} on fresh inputs (> {tolerance(g)})")
        return out
    out.us = b.timer.plain(top.tuned.fn, b.sets)
    out.graph_us = b.timer.graph(top.tuned.fn, b.sets)
    if profile and callable(getattr(b.timer, "kernels", None)):  # where the time goes
        out.kernel_us = b.timer.kernels(top.tuned.fn, b.sets)
    return out


def _ours(name: str, batch: int, b: BenchContext, row: dict[str, Any],
          notes: list[str]) -> Measured:
    """Ours: the search's μGraphs and their size variants; fills the row's search fields."""
    cfg = b.cfg
    found = candidates(name, batch, b.g, cfg.mugraph_dir, cfg.max_candidates)
    notes += found.notes
    row.update(search_results=len(found.graphs), candidates=0, candidates_us={})
    if not found.graphs:
        why = ("the search found no μGraph" if cfg.from_search
               else "no --mugraph-dir or --from-search" if cfg.mugraph_dir is None
               else "no " + ("" if cfg.dtype is float16 else f"{cfg.dtype.value} ")
               + f"μGraph for {name} at batch {batch} in {cfg.mugraph_dir}")
        notes.append(f"{NO_SEARCH_RESULT} ({why})")
        return Measured()
    row["candidates"] = len(found.graphs)
    if b.compiler is None:
        notes.append("no lowering yet: ours not measured")
        return Measured()
    workers = (cfg.check_workers if cfg.check_workers is not None
               else max(1, (os.cpu_count() or 1) - 1))
    ex = expand_sizes(found, b.g, cfg.size_limit, workers, b.smem)
    notes += ex.notes
    row["candidates"] = len(ex.graphs)
    labels = [ex.label(i) for i in range(len(ex.graphs))]
    m = measure(ex.graphs, labels, "ours", b, profile=True)
    notes += m.notes
    if m.label is not None:
        i = labels.index(m.label)
        row.update(mugraph_file=ex.files[i], size_variant=ex.variants[i],
                   winner_form=form_label(ex.graphs[i]), winner_mugraph=dumps(ex.graphs[i]))
    row["candidates_us"] = m.candidates_us
    # every candidate's first timing (file, and #k for its size variants), tuned or not
    row["first_us"] = {lab: us for lab, us in m.first_us.items() if us is not None}
    row.update(calibration(ex.graphs, labels, m.first_us))
    return m


def calibration(graphs: Sequence[KernelGraph], labels: Sequence[str],
                first_us: dict[str, float | None]) -> dict[str, Any]:
    """How well the cost model ranked the candidates that were timed: Spearman's rank
    correlation of its estimates with their first timings (``cost_model_rank_corr``; 1.0: the
    same order), the forms timed, and each form's best first timing (``form_us``)."""
    from ..lower.cost_model import ProgramCost

    cost = ProgramCost()
    est, got = [], []
    form_us: dict[str, float] = {}
    for h, lab in zip(graphs, labels):
        us = first_us.get(lab)
        if us is None:
            continue
        est.append(cost.seconds(h) * 1e6)
        got.append(us)
        f = form_label(h)
        form_us[f] = min(us, form_us.get(f, us))
    corr = rank_correlation(est, got) if len(est) >= 3 else None
    return {"cost_model_rank_corr": None if corr is None else round(corr, 3),
            "forms_timed": len(form_us), "form_us": form_us}


def _reference(name: str, b: BenchContext, row: dict[str, Any], notes: list[str]) -> Measured:
    """The hand-written reference μGraphs, in their own column: built on the program's
    inputs, so in its dtype; any that is not (a fixture built for one dtype only) is left out
    with a note, never timed as this dtype's reference."""
    if not b.cfg.reference:
        return Measured()
    try:
        built = fixtures.variants(name, b.g)
    except GraphError as exc:
        notes.append(f"reference: {exc}")
        return Measured()
    graphs = [h for h in built if _dtypes(h) == _dtypes(b.g)]
    if len(graphs) < len(built):
        notes.append(f"reference: {len(built) - len(graphs)} of {len(built)} hand-written "
                     f"μGraphs are not in {'/'.join(_dtypes(b.g))}: left out")
    if not graphs:
        return Measured()
    row["reference_candidates"] = len(graphs)
    if b.compiler is None:
        notes.append("no lowering yet: reference not measured")
        return Measured()
    m = measure(graphs, [f"reference[{i}]" for i in range(len(graphs))], "reference", b)
    notes += m.notes
    row.update(reference_candidate=m.label, reference_candidates_us=m.candidates_us)
    return m


def bench_one(name: str, batch: int, cfg: GpuBenchConfig, *, timer: Any, floor: Any,
              compiler: Any, device_name: str, log: Log = _stderr,
              tune_timer: Any = None) -> dict[str, Any]:
    """One row (see ``KEYS``); ``timer`` is a ``gpu.timing.Timer``, ``floor`` a ``gpu.floor.Floor``,
    ``compiler`` a ``gpu.tune.Compiler`` or None (no lowering yet). ``tune_timer`` (default
    ``timer``) ranks the knob settings; the reported figures are ``timer``'s."""
    from ..gpu import baselines as bl
    from ..gpu.timing import (
        graph_bytes,
        input_sets,
        l2_bytes,
        random_inputs,
        rotation_count,
        smem_per_block,
    )
    from ..gpu.tune import check

    g = benchmarks.get(name, batch=batch, small=cfg.small, dtype=cfg.dtype)
    if cfg.from_search:
        search_into(name, batch, g, cfg, log)
    count = rotation_count(graph_bytes(g), l2_bytes() if cfg.device == "cuda" else 64 << 20)
    b = BenchContext(g, cfg, timer, tune_timer or timer, compiler, device_name,
                     input_sets(g, count, cfg.device, cfg.seed, cfg.std),
                     random_inputs(g, cfg.device, cfg.seed + 10_000, cfg.std),
                     smem_per_block() if cfg.device == "cuda" else None)
    notes: list[str] = []
    row: dict[str, Any] = dict.fromkeys(KEYS) | {
        "benchmark": name, "batch": batch, "dtype": cfg.dtype.value, "device": device_name,
        "source": "search",
        "floor_us": floor.us(g), "reference_candidates": 0, "reference_candidates_us": {}}
    ours = _ours(name, batch, b, row, notes)
    ref = _reference(name, b, row, notes)
    row.update(ours_us=ours.us, ours_graph_us=ours.graph_us, knobs=ours.knobs,
               reference_us=ref.us, reference_graph_us=ref.graph_us, reference_knobs=ref.knobs)

    plain: dict[str, float | None] = {}
    graph: dict[str, float | None] = {}
    for base in bl.baselines_for(g, cfg.use_compile, cfg.max_autotune):
        try:
            ok, err = check(base.fn, g, b.check_inputs, fn_inputs=base.prepare(b.check_inputs))
            if not ok:
                notes.append(f"{base.name}: relative error {err:.2e}, left out")
                continue
            prepared = [base.prepare(s) for s in b.sets]
            plain[base.name] = timer.plain(base.fn, prepared)
            graph[base.name] = timer.graph(base.fn, prepared)
        except Exception as exc:  # e.g. a baseline that cannot be captured in a graph
            notes.append(f"{base.name}: {type(exc).__name__}: {exc}"[:200])
            plain.setdefault(base.name, None)
            graph.setdefault(base.name, None)
    row.update(baselines_us=plain, baselines_graph_us=graph,
               speedup_vs_best=ratio(best(plain), ours.us),
               speedup_vs_best_graph=ratio(best(graph), ours.graph_us),
               ours_vs_reference=ratio(ref.us, ours.us),
               ours_vs_reference_graph=ratio(ref.graph_us, ours.graph_us),
               floor_fraction=ratio(row["floor_us"], ours.us),
               floor_fraction_graph=ratio(row["floor_us"], ours.graph_us),
               notes=notes)
    log(f"{_label(name, batch, cfg.dtype)}: ours (search"
        + (f" {row['mugraph_file']}" if row["mugraph_file"] else "")
        + f", best of {row['candidates']}) {fmt(ours.us)} / {fmt(ours.graph_us)} µs (graph); "
        + f"reference (hand-written, best of {row['reference_candidates']}) {fmt(ref.us)} / "
        + f"{fmt(ref.graph_us)}; baselines "
        + ", ".join(f"{k} {fmt(plain[k])} / {fmt(graph.get(k))}" for k in plain)
        + (f"; {'; '.join(notes)}" if notes else ""))
    extra = {"kernel_us": ours.kernel_us} if ours.kernel_us is not None else {}
    return {k: row[k] for k in KEYS} | extra | {"input_sets": count}


def bench_gpu(cfg: GpuBenchConfig, *, timer: Any = None, floor: Any = None, compiler: Any = "auto",
              device_name: str | None = None, log: Log = _stderr,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every program at every batch size; the defaults measure on the current CUDA device.
    ``on_row`` is called with each row as soon as it is measured."""
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
            if on_row is not None:
                on_row(rows[-1])
            if cfg.device == "cuda":
                torch.cuda.empty_cache()  # the program's inputs and graphs are gone
    return rows


# --- the command -------------------------------------------------------------------------------

def run_command(args: Any, argv: Sequence[str] | None = None) -> int:
    """``egraph-mirage bench gpu``: measure, print (JSON or a table, last), write reports."""
    import datetime
    import json

    import torch

    from ..files import write_atomic
    from ..gpu.floor import Floor, measure_copy_bandwidth
    from ..gpu.tune import default_cache_dir
    from ..rank.measured import keep_jax_off_the_gpu

    if not torch.cuda.is_available():
        print("error: bench gpu needs a CUDA GPU, and torch sees none", file=sys.stderr)
        return 2
    if any(b < 1 for b in args.batch):
        print("error: --batch sizes must be positive", file=sys.stderr)
        return 2
    cache = None if args.no_cache else str(args.cache_dir or default_cache_dir())
    for flag, value in (("--max-candidates", args.max_candidates), ("--tune-top", args.tune_top),
                        ("--size-variants", args.size_variants),
                        ("--check-workers", args.check_workers)):
        if value is not None and value < 1:
            print(f"error: {flag} must be at least 1", file=sys.stderr)
            return 2
    try:
        budget = DEFAULT_BUDGETS["bench gpu"] if args.budget is None else args.budget
        search = request_from_flags(time_budget=budget, workers=args.workers, progress=False)
    except EMError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.mugraph_dir is None and not args.from_search:
        _stderr("note: no --mugraph-dir or --from-search: ours (the search's) stays empty; "
                "only the reference and the baselines are timed")
    cfg = GpuBenchConfig(programs=args.programs or benchmarks.names(), batches=args.batch,
                         mugraph_dir=args.mugraph_dir, use_compile=not args.no_compile,
                         max_autotune=args.max_autotune, tune=not args.no_tune, cache_dir=cache,
                         max_candidates=args.max_candidates, from_search=args.from_search,
                         search=search,
                         tune_top=args.tune_top, size_limit=args.size_variants,
                         check_workers=args.check_workers, reference=not args.no_reference,
                         dtype=DType[args.dtype])
    keep_jax_off_the_gpu()  # before the search or the size variants' verifier imports JAX
    floor = Floor(measure_copy_bandwidth())
    _stderr(f"copy bandwidth {floor.bandwidth / 1e12:.2f} TB/s (read + write)")
    on_row = None
    if args.rows:
        rows_path = Path(args.rows)
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        rows_path.write_text("")

        def on_row(row: dict[str, Any]) -> None:
            with rows_path.open("a") as f:  # one line per row, each complete when written
                f.write(json.dumps(row) + "\n")

    rows = bench_gpu(cfg, floor=floor, on_row=on_row)
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
