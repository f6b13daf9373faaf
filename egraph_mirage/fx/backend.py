"""``torch.compile(model, backend="egraph_mirage")``: superoptimized pieces inside Inductor's code.

Scope: **inference only** (call the compiled model under ``torch.no_grad()``; a graph whose
inputs require gradients runs wholly through the rest, with a warning) and **static shapes**: each
new shape is a new graph that Dynamo compiles again (``torch.compile(..., dynamic=False)``
makes that explicit); ``dynamic=True`` raises ``DynamicShapesError``, and a graph that Dynamo's
automatic dynamic shapes made symbolic (``dynamic=None``, the second shape seen) runs wholly
through the rest, with a warning.

What the backend does with the FX graph Dynamo hands it (``Backend.__call__``):

1. **partition** (``fx.partition``): the graph is brought to aten operators and cut into pieces
   the search can take (submodules ``egm_0``, ``egm_1``, ... of the rewritten module);
2. for each piece: **trace** it (``fx.trace_fx``) to a ``KernelGraph``; **look the cache up**
   (``fx.cache.piece_key``: the program's canonical JSON, rules digest, lowering, device,
   search settings); on a miss **search** (``em.superoptimize``) and **decide**
   (``fx.decision.PieceDecision``): the winner is compiled (``em.compile``), checked against
   the piece's eager outputs on the example inputs, and, on a CUDA GPU with ``profile`` on,
   timed against Inductor's code for the same piece (``fx.inductor_timing``: CUDA-graph
   replay and plain launches, ours as the compiled graph launches it) and used only when
   faster as the ``timing`` option asks (``fx.decision.slower_alone``: replayed under "graph";
   replayed or launched plainly under "plain" and "both", the default, the graph then judged
   whole, step 4); the times are cached, the decision is made from them at each compile;
   **refine**: once every piece has been decided whole, a piece the search found nothing for
   is cut after its matmuls (``partition(..., levels=AFTER_MATMULS)``: an RMSNorm with the
   query, key and value projections it feeds becomes a piece of several outputs apart from
   their RoPE rotations) and each of its parts goes through step 2; a part with nothing
   found is cut once more, at its matmuls' inputs (``levels=True``: the norm apart from the
   projections), and then at both (``levels=EPILOGUES``) (``CUTS``; ``refine=False``: none);
3. **replace** each chosen piece by a call of a ``torch.library`` custom op that applies the
   ``TracedProgram``'s input views, launches the compiled kernels and reshapes the outputs
   (opaque to Dynamo and Inductor, capturable in a CUDA graph); on a GPU, by default, the
   piece is traced into Inductor's graph instead (``_launched_by_inductor``: its views as
   torch operators and its kernels through ``torch.library.wrap_triton``), so that Inductor
   launches the kernels itself, where the graph so compiled matches Dynamo's;
4. **the rest**: the rewritten module (everything not replaced) is compiled by Inductor
   (``torch._inductor.compile_fx.compile_fx``, ``rest="inductor"``, the default) or run as is
   (``rest="eager"``, for tests); on a CUDA GPU with ``profile`` on, the graph with its
   replaced pieces is timed against Inductor's code for Dynamo's graph, and where it is
   slower under ``timing`` the piece that gains least alone is kept and the graph timed again,
   a few times at most, then every piece is kept (``fx.whole``; the times are cached as a
   piece's are, under ``fx.cache.whole_key``). Dynamo gets that callable (a function of the graph's
   flat inputs returning its outputs), with the ``CompileReport`` attached as
   ``egraph_mirage_report``.

The time budget (``fx.budget``): the ``budget`` option bounds the searches of the whole
compilation, ``refine`` included; every piece is searched whole before any is refined, those
that move the most bytes first, each with a share of the seconds left by its weight (on a GPU
its room: Inductor's µs less its copy floor's). A piece whose Inductor code runs at its floor,
or reached once no time is left, is not searched; a cache hit costs nothing.

Options: ``torch.compile(..., options={...})`` or ``Backend(**options)``, listed and checked in
``fx.options`` (``BackendOptions``). Every compilation is logged at INFO on the
``egraph_mirage.fx`` logger and kept in ``fx.report.RECENT``; ``fx.report.torch_report(
compiled_model)`` prints it.

Registration: the package's entry point (group ``torch_dynamo_backends`` in pyproject.toml)
names ``egraph_mirage_backend``, so an installed package needs no import; importing this module
also registers it (``register``) where the installed metadata predates the entry point.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from .. import processes
from ..errors import EMError
from ..gpu.floor import io_bytes
from ..graph import KernelGraph
from ..lower import graph_knobs
from ..mugraph.serialize import loads
from ..pipeline.scaled import scaled_program
from ..verify import checks_that_fit
from . import inductor_timing as timing
from . import report as rep
from .budget import SPENT, CompileBudget, Room
from .cache import SearchCache, graph_key, piece_key
from .checks import graph_error, graph_tolerance, piece_error
from .decision import KEEP, REPLACE, PieceDecision, slower
from .mutation import preserved
from .options import BackendError, BackendOptions, DynamicShapesError
from .pieces import AFTER_MATMULS, EPILOGUES, Piece, partition
from .rest import compile_rest
from .runtime import (
    PieceCall,
    Runner,
    define_piece_op,
    inductor_launches,
    input_layout,
    make_inductor_launch,
    make_runner,
    piece_calls,
)
from .trace import TracedProgram, trace_fx
from .whole import WholeGraph

#: the name ``torch.compile(backend=...)`` knows the backend by
NAME = "egraph_mirage"
LOG = logging.getLogger("egraph_mirage.fx")
#: how ``Backend._refine`` cuts a piece the search found nothing for, in turn: after its
#: matmuls (where a norm then stays with its projections), at their inputs, at both
#: (``partition``'s ``levels``)
CUTS: tuple[bool | str, ...] = (AFTER_MATMULS, True, EPILOGUES)


class Backend:
    """The backend with fixed options; ``reports`` lists every graph it compiled and
    ``searches`` counts the searches it ran. ``torch.compile(model, backend=Backend(...))``."""

    _graphs = itertools.count()

    def __init__(self, **options: Any) -> None:
        self.options = BackendOptions.of(options)
        self.cache = SearchCache(self.options.cache_dir) if self.options.cache else None
        self.reports: list[rep.CompileReport] = []
        self.searches = 0
        #: the worker pool of the compilation under way (``_search_workers``)
        self._pool: cf.ProcessPoolExecutor | None = None
        #: the time budget of the compilation under way (``fx.budget``)
        self._budget = CompileBudget()
        #: the GPU's copy bandwidth, bytes/s, once measured (``_bandwidth``)
        self._copy_bandwidth: float | None = None
        #: the keys (digests) of the pieces an earlier compilation of the graph under way left
        #: unsearched for want of time (its record in the cache), and of those this one leaves
        self._unsearched: set[str] = set()
        self._spent: set[str] = set()
        #: the graph under way's inputs by the names Dynamo gave them (``report.input_names``)
        self._input_names: dict[str, str] = {}

    def __call__(self, gm: Any, example_inputs: Sequence[Any], mode: str | None = None,
                 options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
        """Compile Dynamo's graph ``gm`` (module docstring); ``mode`` is ``torch.compile``'s,
        passed to Inductor."""
        if options:
            raise BackendError("egraph_mirage backend: give the options to Backend(...), not "
                               "to torch.compile(options=...), when passing a Backend object")
        t0 = time.perf_counter()
        self._budget = CompileBudget.start(self.options.budget)
        modes = self.options.inductor_modes(mode)
        mode = modes[0]
        rest = self.options.rest + (f" ({mode})" if self.options.rest == "inductor" and mode
                                    not in (None, "default") else "")
        report = rep.CompileReport(next(self._graphs), len(example_inputs), rest=rest)
        dynamic = _dynamic(example_inputs)
        if dynamic == "requested":
            raise DynamicShapesError(
                "the egraph_mirage backend compiles static shapes only: torch.compile(..., "
                "dynamic=True) is not supported; use dynamic=False (each new shape compiles "
                "again)")
        if dynamic:
            report.note = ("symbolic shapes (Dynamo's automatic dynamic shapes): the whole graph "
                           "runs in the rest; compile with dynamic=False to specialise each shape")
        elif torch.is_grad_enabled() and any(getattr(x, "requires_grad", False)
                                             for x in example_inputs):
            report.note = ("inputs require gradients: the backend is inference only; the whole "
                           "graph runs in the rest (call the model under torch.no_grad())")
        if report.note:
            LOG.warning("egraph-mirage: %s", report.note)
            compiled = compile_rest(gm, example_inputs, self.options.rest, mode)
        else:
            try:
                # the model's state among the inputs (a static cache, a step counter) as the
                # compiled call will find it, however often compiling runs the graph on it
                with preserved(gm, example_inputs):
                    compiled = self._compile(gm, example_inputs, report, modes)
            finally:
                self._close_pool()
        report.seconds = time.perf_counter() - t0
        return self._finish(compiled, report)

    def _compile(self, gm: Any, example_inputs: Sequence[Any], report: rep.CompileReport,
                 modes: Sequence[str | None]) -> Callable[..., Any]:
        """Dynamo's graph with its pieces searched and the winners that make it faster replaced,
        compiled by Inductor in the first of ``modes`` (``BackendOptions.inductor_modes``) or,
        where its code for the graph is faster, in the other (``fx.whole``)."""
        mode = modes[0]
        try:
            with report.stage("partition"):
                parts = partition(gm, example_inputs, max_matmuls=self.options.max_matmuls,
                                  max_reductions=self.options.max_reductions)
                traced = [self._trace(piece) for piece in parts.pieces]
        except EMError as e:
            report.note = f"the graph could not be partitioned ({e}); it runs in the rest"
            LOG.warning("egraph-mirage: %s", report.note)
            return compile_rest(gm, example_inputs, self.options.rest, mode)
        chosen: dict[str, Any] = {}  # piece name -> its replacement
        # with a cache, a piece equal to an earlier one (a model's identical layers) is a hit:
        # the budget is shared by the distinct pieces only (``fx.budget``)
        keys = ([self._key(t, mode).digest() if isinstance(t, TracedProgram) else f"refused {i}"
                 for i, t in enumerate(traced)] if self.cache is not None
                else [str(i) for i in range(len(traced))])
        # an earlier compilation of this graph with these settings: what it left unsearched
        # for want of time is not searched now either, so that a second compile of a model
        # comes from the cache, whatever its first left unsearched
        record_key = (graph_key(gm, example_inputs, self.options.search_settings(),
                                timing.key_settings(mode, self._launch()))
                      if self.cache is not None else None)
        record = (self.cache.get(record_key)
                  if self.cache is not None and record_key is not None else None)
        self._unsearched, self._spent = set((record or {}).get("unsearched", ())), set()
        self._input_names = rep.input_names(gm, parts.module)
        # each distinct piece weighs what its search can gain (``_gains``); with ``refine``, one
        # share more is held back, in seconds, for the parts of the pieces found nothing for,
        # which are searched after every piece was searched whole (``fx.budget``)
        moved = [_moved(t) for t in traced]
        with report.stage("rooms"), self._budget.uncharged():  # the searches start after them
            gains, rooms = self._gains(parts.pieces, traced, moved, keys, mode)
        # a program that comes several times (a model's identical layers) is searched once and
        # weighs its gain in every place: a faster form of it gains there all
        times = Counter(keys)
        distinct = {k: m * times[k] for k, m in zip(keys, gains, strict=True)}
        self._budget.pieces(list(distinct.values()), self.options.refine)
        reached: set[str] = set()
        unfound: list[tuple[int, Piece, rep.PieceReport, float, int, float]] = []
        # every piece whole first, those that move the most bytes first: where the time is
        for i in sorted(range(len(traced)), key=lambda k: -moved[k]):
            piece = parts.pieces[i]
            weight, self._budget.handed = self._budget.weigh(distinct[keys[i]]), None
            with report.stage("pieces"):
                piece_report, replacement = self._piece(i, piece, weight, mode, traced[i],
                                                        rooms.get(i))
            if keys[i] not in reached:
                reached.add(keys[i])
                self._budget.reached(weight)
            report.pieces.append(piece_report)
            if replacement is None and self.options.refine and piece_report.nothing_found():
                unfound.append((i, piece, piece_report, gains[i] / max(moved[i], 1),
                                times[keys[i]], weight))
                self._budget.hold_rest()  # the rest of its share goes to its parts
            if replacement is not None:
                chosen[piece.name] = replacement
        if self.options.refine:
            self._budget.release()  # the seconds held for the parts, overruns or not
            self._budget.add(sum(w for *_, w in unfound))  # each weighs in until its parts do
        for i, piece, piece_report, per_byte, n, w in unfound:  # then the parts
            with report.stage("refine"):
                self._budget.reached(w)  # its parts' weights take its place (``_refine``)
                replacement = self._refine(i, piece, piece_report, report, mode, per_byte, n)
            if replacement is not None:
                chosen[piece.name] = replacement
        report.searches = sum(p.search_seconds is not None for p in report.pieces)
        report.left_out = dict(parts.left_out)
        if self.cache is not None and record_key is not None:
            self.cache.put(record_key, {"unsearched": sorted(self._spent)})

        def build(names: Sequence[str], mode: str | None = mode) -> Callable[..., Any]:
            """The graph with the pieces ``names`` replaced (by ``chosen``), the others as
            they were, compiled in ``mode``; none replaced: the whole graph as Dynamo gave it,
            compiled as torch.compile would without the backend (``rest.compile_rest``)."""
            for p in parts.pieces:
                setattr(parts.module, p.name, chosen[p.name] if p.name in names else p.module)
            with report.stage("Inductor"):
                compiled = (self._launched_by_inductor(parts.module, gm, example_inputs, report,
                                                       mode) if names else None)
                return compiled if compiled is not None else compile_rest(
                    parts.module if names else gm, example_inputs, self.options.rest, mode, gm)

        def launched(names: Sequence[str]) -> str:
            """Who launches the kernels of the graph ``build(names)`` would compile, where its
            compilation and check go well (``report.launch``)."""
            return ("inductor" if inductor_launches(piece_calls(chosen[p] for p in names))
                    else "op")

        if (chosen or len(modes) > 1) and self.options.profiling() and _on_gpu():
            whole = WholeGraph(gm, example_inputs, report, mode, self.options, self.cache, build,
                               launched, tuple(modes[1:]))
            return whole.never_slower(list(chosen))
        return build(list(chosen))

    def _launched_by_inductor(self, module: Any, gm: Any, example_inputs: Sequence[Any],
                              report: rep.CompileReport, mode: str | None
                              ) -> Callable[..., Any] | None:
        """``module`` compiled with its replaced pieces traced into Inductor's graph
        (``PieceCall.by_inductor``: Inductor launches their kernels itself), where every one
        has an Inductor launch, that compiles and its outputs on the example inputs match
        Dynamo's graph within ``_graph_tolerance``; else None (the pieces' custom ops launch them).
        ``report.launch`` says which."""
        calls = piece_calls([module])
        report.launch = "op"
        if not inductor_launches(calls):
            return None
        for c in calls:
            c.by_inductor = True
        try:
            ours = compile_rest(module, example_inputs, self.options.rest, mode, gm)
            error, want = graph_error(ours, gm, example_inputs)
            tolerance = graph_tolerance(want)
        except Exception as e:
            error, tolerance, why = float("inf"), 0.0, f"{type(e).__name__}: {e}"
        else:
            why = (f"outputs or inputs written differ from Dynamo's graph (relative error "
                   f"{error:.1e}, tolerance {tolerance:.0e})")
        if error <= tolerance:
            report.launch = "inductor"
            return ours
        for c in calls:
            c.by_inductor = False
        LOG.warning("egraph-mirage: the replaced pieces' kernels stay launched by their ops: "
                    "Inductor's launch of them failed: %s", why)
        report.launch_note = f"launched by their ops: Inductor's launch of them failed: {why}"
        return None

    def _gains(self, pieces: Sequence[Piece], traced: Sequence[TracedProgram | EMError],
               moved: Sequence[int], keys: Sequence[str], mode: str | None
               ) -> tuple[list[float], dict[int, Room]]:
        """What each piece's search can gain (its weight in the budget, ``fx.budget``) and the
        rooms measured. On a GPU under a budget, each distinct piece the cache does not decide
        has Inductor's code timed now (``time_inductor``, in ``mode``) against its copy floor
        and gains its room (its floor's µs if Inductor's code cannot be timed; 0 for a cached
        or refused piece). Elsewhere (no time left, no bandwidth measured): ``moved``, bytes."""
        bandwidth = None
        if (self.options.profiling() and _on_gpu() and self._budget.deadline is not None
                and not self._budget.spent()):  # no time left: none searched, none timed
            try:
                bandwidth = self._bandwidth()
            except Exception as e:  # no copy to time: the bytes weigh
                LOG.info("egraph-mirage: the copy bandwidth not measured: %s", e)
        if bandwidth is None:
            return [float(m) for m in moved], {}
        gains: list[float] = []
        rooms: dict[int, Room] = {}
        first: dict[str, int] = {}
        for i, (piece, t) in enumerate(zip(pieces, traced, strict=True)):
            j = first.setdefault(keys[i], i)
            if j != i:  # the same program as piece j: searched once
                gains.append(gains[j])
                if j in rooms:
                    rooms[i] = rooms[j]
                continue
            key = self._key(t, mode) if isinstance(t, TracedProgram) else None
            if key is None or (self.cache is not None and (
                    self.cache.path(key).exists() or key.digest() in self._unsearched)):
                gains.append(0.0)
                continue
            floor_us = moved[i] / bandwidth * 1e6
            try:
                us = timing.time_inductor(piece, mode)
            except Exception as e:  # Inductor's code does not compile or run alone
                LOG.info("egraph-mirage: %s: Inductor's code not timed: %s", piece.name, e)
                us = None
            if us is not None:
                rooms[i] = Room(us, floor_us)
            gains.append(floor_us if us is None else rooms[i].us)
            LOG.info("egraph-mirage: %s: Inductor %s µs, floor %.1f µs: gains %.1f µs",
                     piece.name, "-" if us is None else f"{us:.1f}", floor_us, gains[-1])
        return gains, rooms

    def _bandwidth(self) -> float:
        """The GPU's copy bandwidth in bytes/s (``gpu.floor``), measured once per backend."""
        from ..gpu.floor import measure_copy_bandwidth

        self._copy_bandwidth = self._copy_bandwidth or measure_copy_bandwidth()
        return self._copy_bandwidth

    @staticmethod
    def _trace(piece: Piece) -> TracedProgram | EMError:
        """The piece traced into a program, or why it does not trace."""
        try:
            return trace_fx(piece.module, piece.example_inputs)
        except EMError as e:
            return e

    def _key(self, traced: TracedProgram, mode: str | None) -> Any:
        """The cache key of a traced piece: its program, the search settings and, where
        timed, what the times of a cached decision were measured by."""
        timed = (timing.key_settings(mode, self._launch()) if self.options.profiling()
                 else None)
        return piece_key(traced.graph, self.options.search_settings(), timed)

    def _piece(self, index: int, piece: Piece, weight: float, mode: str | None = None,
               traced: TracedProgram | EMError | None = None, room: Room | None = None
               ) -> tuple[rep.PieceReport, Any]:
        """The piece's report, and its replacement module (None: it stays). ``weight``: the
        piece's weight in the compilation's time budget (``fx.budget``). ``mode``:
        ``torch.compile``'s, which Inductor's code for the piece is compiled with when the
        winner is timed against it (part of the cache key when timing). ``traced``: the piece
        already traced (``_trace``; None: traced here). ``room``: Inductor's time for it and
        its floor, where timed before the search (``_gains``)."""
        out = rep.PieceReport(index, piece.name)
        traced = self._trace(piece) if traced is None else traced
        if isinstance(traced, EMError):
            out.status, out.reason = rep.UNSUPPORTED, str(traced)
            return out, None
        g = traced.graph
        out.operators = tuple(t.op for t in g.operators)
        out.shapes = tuple(tuple(t.dims) for t in g.inputs)
        out.dtypes = tuple(t.dtype.value for t in g.inputs)
        key = self._key(traced, mode)
        record = self.cache.get(key) if self.cache is not None else None
        out.cache = "off" if self.cache is None else ("miss" if record is None else "hit")
        runner = None
        if record is None:
            decision, runner, lasting = self._decide(piece, traced, out, weight, mode, room,
                                                     key.digest())
            if self.cache is not None and lasting:
                self.cache.put(key, decision.to_record())
        else:
            decision = PieceDecision.from_record(record)
        decision.fill(out)
        why_not = decision.why_not_used(self.options.timing)
        if why_not:
            out.status, out.reason = rep.KEPT, why_not
        if not decision.replaces() or why_not:
            return out, None
        mugraph = decision.mugraph or ""  # a decision to replace has its winner
        if runner is None:  # a cached decision: its winner checked again, as a new one is
            try:
                runner = make_runner(traced, loads(mugraph), decision.knobs or {},
                                     piece.example_inputs)
                error = piece_error(runner, piece, traced)
            except Exception as e:  # e.g. the cached winner no longer lowers
                out.status, out.reason = rep.KEPT, f"the cached μGraph failed to compile: {e}"
                return out, None
            if error > _tolerance(g):
                out.status, out.reason = rep.KEPT, (f"the cached μGraph differs from eager "
                                                    f"(relative error {error:.1e})")
                return out, None
        launch = None
        if self.options.launch == "inductor" and self.options.rest == "inductor" and _on_gpu():
            try:
                launch = make_inductor_launch(traced, loads(mugraph),
                                              decision.knobs or {}, piece.example_inputs)
            except Exception as e:  # e.g. a layout the lowering refuses: the op launches it
                LOG.info("egraph-mirage: %s: launched by its op: %s", piece.name, e)
        device = next((x.device for x in piece.example_inputs if isinstance(x, torch.Tensor)),
                      None)
        if traced.writes:
            names = [traced.placeholders[w.dest] for w in traced.writes]
            out.writes = (", ".join(self._input_names.get(n, n) for n in names)
                          + f" by {getattr(runner, 'writes_by', 'torch')}")
        return out, PieceCall(define_piece_op(runner, traced, piece.name), launch, device,
                              traced.writes)

    def _refine(self, index: int, piece: Piece, piece_report: rep.PieceReport,
                report: rep.CompileReport, mode: str | None = None, per_byte: float = 1.0,
                times: int = 1, depth: int = 0, label: str | None = None, first: int = 0
                ) -> Any:
        """Piece ``index``, which the search found nothing for, cut by the first of ``CUTS``
        from ``depth`` on that gives it two parts or more, into parts decided one by one
        (``_piece``; their reports follow the piece's in ``report``, numbered from ``first``):

        - after its matmuls (``AFTER_MATMULS``), where a part then holds a norm with the
          projections it feeds (a reduction with a matmul): the RMSNorm with the query, key
          and value projections, apart from their RoPE rotations, or with a gated MLP's
          gate and up projections, apart from ``silu(g) * u``. Those parts are decided first;
          where one has nothing found, the cut is given up and the piece cut by the next;
        - at its matmuls' inputs (``True``: the norm apart from the projections, LoRA's
          ``lora_B`` with its scaling and sum apart from ``lora_A``);
        - at both (``EPILOGUES``: a projection apart from its RoPE rotation).

        A part the search finds nothing for either is cut by the cuts after that one. Returns
        the piece's module with the chosen parts replaced, or None. On a GPU each part weighs
        its own room (``_gains``); elsewhere the bytes it moves times ``per_byte`` (the piece's
        gain per byte); either times ``times``, how often the piece comes in the graph."""
        parts, levels = None, None
        while depth < len(CUTS):
            levels = CUTS[depth]
            try:
                parts = partition(piece.module, piece.example_inputs,
                                  max_matmuls=self.options.max_matmuls,
                                  max_reductions=self.options.max_reductions, levels=levels)
            except EMError:
                return None
            depth += 1  # the parts are cut by the cuts after this one
            if len(parts.pieces) >= 2 and (levels != AFTER_MATMULS or any(
                    _norm_with_projection(p) for p in parts.pieces)):
                break
        if parts is None or len(parts.pieces) < 2:
            return None
        label = str(index) if label is None else label
        head = f"{label.split('.', 1)[1]}." if "." in label else ""
        n = len(parts.pieces)
        where = "after its matmuls " if levels == AFTER_MATMULS else ""
        piece_report.reason += (f"; searched in {n} parts {where}({label}.{first}–"
                                f"{label}.{first + n - 1})")
        replaced = 0
        traced = [self._trace(part) for part in parts.pieces]
        # on a GPU each part weighs its own room; elsewhere its share of the piece's weight
        moved = [_moved(t) for t in traced]
        with self._budget.uncharged():  # timing the parts' rooms is not the searches' time
            gains, rooms = self._gains(parts.pieces, traced, moved,
                                       [str(j) for j in range(len(traced))], mode)
        weights = [self._budget.weigh((g if rooms else m * per_byte) * times)
                   for g, m in zip(gains, moved, strict=True)]
        self._budget.add(sum(weights))  # the parts share what is left with the pieces
        order = sorted(range(n), key=lambda j: levels == AFTER_MATMULS
                       and not _norm_with_projection(parts.pieces[j]))  # the norms first
        decided: list[rep.PieceReport] = []
        for k, j in enumerate(order):
            part = parts.pieces[j]
            part_report, replacement = self._piece(index, part, weights[j], mode, traced[j],
                                                   rooms.get(j))
            self._budget.reached(weights[j])
            part_report.name = f"{piece.name}.{part.name}"
            part_report.part = f"{head}{first + j}" if head else first + j
            report.pieces.append(part_report)
            decided.append(part_report)
            if replacement is None and levels == AFTER_MATMULS and _norm_with_projection(part) \
                    and part_report.nothing_found():  # given up: cut the piece by the next
                for rest in order[k + 1:]:
                    self._budget.reached(weights[rest])
                for r in decided:
                    if r.status == rep.REPLACED:
                        r.status, r.reason = rep.KEPT, "its piece's cut was given up"
                piece_report.reason += (f", {label}.{first + j} not found: given up")
                return self._refine(index, piece, piece_report, report, mode, per_byte, times,
                                    depth, label, first + n)
            if replacement is None and depth < len(CUTS) and part_report.nothing_found():
                part_piece = replace(part, name=part_report.name)
                replacement = self._refine(index, part_piece, part_report, report, mode,
                                           per_byte, times, depth, f"{label}.{first + j}")
            if replacement is not None:
                setattr(parts.module, part.name, replacement)
                replaced += 1
        return parts.module if replaced else None

    def _decide(self, piece: Piece, traced: TracedProgram, out: rep.PieceReport,
                weight: float, mode: str | None, room: Room | None, digest: str
                ) -> tuple[PieceDecision, Runner | None, bool]:
        """Search (with the piece's share of the compilation's time budget, ``fx.budget``; not
        where ``room`` says Inductor's code is at the floor, nor where ``digest``, the piece's
        cache key's, is one an earlier compilation of the graph left unsearched), compile, check
        and (on a GPU) time. Returns the decision, the compiled runner when the decision is to
        replace, and whether the decision may be cached (not when the piece was refused or left
        unsearched before any search, nor after an unexpected failure)."""
        from ..rank.measured import keep_jax_off_the_gpu

        keep_jax_off_the_gpu()  # the verifier's JAX on the CPU, in this process and the workers
        o = self.options
        g = traced.graph
        skey = self._search_key(traced)
        searched = self.cache.get(skey) if self.cache is not None and skey is not None else None
        if searched is not None:  # this piece's search, run by a compilation of another mode
            decision = PieceDecision.from_record(searched)
            decision.search_seconds = None  # no search ran in this compilation
            out.search_cache = "hit"
            lasting = True
        elif room is not None and room.at_floor():  # no form can gain: nothing to search
            decision = PieceDecision(reason=room.reason())
            decision.times = {"inductor_us": room.inductor_us}
            return decision, None, True
        elif digest in self._unsearched:  # so in this graph's earlier compilation: not now
            self._spent.add(digest)
            why = f"{SPENT} (in this graph's first compilation with these settings)"
            return PieceDecision(reason=why), None, False
        else:
            decision, lasting = self._search(piece, traced, out, weight)
            if self.cache is not None and skey is not None and lasting:
                self.cache.put(skey, decision.to_record())
            if decision.reason == SPENT:
                self._spent.add(digest)
        if not decision.mugraph:
            return decision, None, lasting
        winner, knobs = loads(decision.mugraph), decision.knobs
        try:
            runner = make_runner(traced, winner, knobs or {}, piece.example_inputs)
            error = piece_error(runner, piece, traced)
        except Exception as e:
            decision.reason = f"the winner failed to compile or run: {type(e).__name__}: {e}"
            LOG.warning("egraph-mirage: %s: %s", piece.name, decision.reason)
            return decision, None, isinstance(e, EMError)
        if error > _tolerance(g):
            decision.reason = f"the winner differs from eager (relative error {error:.1e})"
            return decision, None, True
        decision.decision = REPLACE  # where timed, ``why_not_used`` decides with the times
        if o.profiling() and _on_gpu():
            # timing a winner, as timing a room, is not the searches' time (``fx.budget``)
            try:
                with self._budget.uncharged():
                    decision.times = dict(timing.time_against_inductor(
                        runner, traced, piece, mode,
                        launch=self._timed_launch(traced, winner, knobs, piece)))
                    runner = self._fewer_launches(piece, traced, winner, decision, runner, mode)
            except Exception as e:
                decision.decision = KEEP
                decision.reason = f"timing failed: {type(e).__name__}: {e}"
                LOG.warning("egraph-mirage: %s: %s", piece.name, decision.reason)
                return decision, None, False
        return decision, runner, True

    def _fewer_launches(self, piece: Piece, traced: TracedProgram, winner: KernelGraph,
                        decision: PieceDecision, runner: Runner, mode: str | None) -> Runner:
        """Where the winner, timed, is not faster under every kind of timing the option asks
        for (``slower``: it loses its plain launches) and its knobs leave a combine unfused (the
        search's tuner ranks knobs by the kernels' time, in which a launch costs nothing), the
        same μGraph with its combines fused, one launch fewer each, is checked and timed too;
        it takes the winner's place in ``decision`` (knobs, times) where it is faster under
        all of them. Returns the runner of the knobs kept."""
        knobs = dict(decision.knobs or {})
        if (knobs.get("fuse_combines", True) or "fuse_combines" not in graph_knobs(winner)
                or not slower(decision.times, self.options.timing)):
            return runner
        fused = {**knobs, "fuse_combines": True}
        try:
            fused_runner = make_runner(traced, winner, fused, piece.example_inputs)
            if piece_error(fused_runner, piece, traced) > _tolerance(traced.graph):
                return runner
            times = dict(timing.time_against_inductor(
                fused_runner, traced, piece, mode,
                launch=self._timed_launch(traced, winner, fused, piece)))
        except Exception as e:  # the fused form does not lower, run or time: the winner stays
            LOG.info("egraph-mirage: %s: its combines fused: %s", piece.name, e)
            return runner
        if slower(times, self.options.timing):
            return runner
        decision.knobs, decision.times = fused, times
        return fused_runner

    def _search(self, piece: Piece, traced: TracedProgram, out: rep.PieceReport,
                weight: float) -> tuple[PieceDecision, bool]:
        """The piece's search, with its share of the compilation's time budget (``fx.budget``:
        ``weight`` its weight there): a decision holding the winner (not yet checked) or why
        there is none, and whether that outcome may be cached (not when no search ran for want
        of time, nor after the search failed unexpectedly)."""
        from ..pipeline import superoptimize

        o = self.options
        decision = PieceDecision()
        workers = None if self._budget.spent() else self._search_workers(traced.graph)
        share = self._budget.share(weight)  # after the pool's start, which is not the search's time
        if share is not None and share <= 0:
            decision.reason = SPENT
            LOG.info("egraph-mirage: %s: %s", piece.name, SPENT)
            return decision, False
        self.searches += 1
        out.search_share = share
        t0 = time.perf_counter()
        try:
            results = (o.search or superoptimize)(
                traced.graph, o.config, time_budget=share, workers=workers,
                max_tasks=o.max_tasks, progress=o.verbose, profile=o.profiling(),
                profiler=self._profiler(traced, piece))
        except Exception as e:
            decision.reason = f"the search failed: {type(e).__name__}: {e}"
            LOG.warning("egraph-mirage: %s: %s", piece.name, decision.reason)
            return decision, isinstance(e, EMError)
        finally:
            out.search_seconds = decision.search_seconds = time.perf_counter() - t0
        best = results.best
        if best is None:
            why = results.stats.no_result_reasons or [results.stats.stopped_by or "none found"]
            decision.reason = f"{rep.NOTHING_FOUND}: {why[0]}"
        else:
            decision.set_winner(best.graph, best.knobs, best.num_kernels, best.estimated_seconds)
        return decision, True

    def _search_key(self, traced: TracedProgram) -> Any:
        """The cache key of the piece's search alone (its winner, or why there is none), which
        every ``torch.compile`` mode shares; None where the search's results are not cached
        apart from the decision (no GPU timing: the decision's key is the same)."""
        if not self.options.profiling():
            return None
        return piece_key(traced.graph, self.options.search_settings(),
                         {"record": "search", "launch": self._launch()})

    def _profiler(self, traced: TracedProgram, piece: Piece) -> Any:
        """The search's GPU profiler for this piece: its results timed with the piece's inputs
        in the layout they have in the model (``runtime.input_layout``: a linear layer's weight
        read as Wᵀ, a slice), where it is profiled on a GPU; else None (the search's default)."""
        if not (self.options.profiling() and _on_gpu()):
            return None
        from ..rank.measured import GpuProfiler

        return GpuProfiler(strides=input_layout(traced, piece.example_inputs))

    def _launch(self) -> str:
        """How the replaced pieces' kernels are launched in the compiled graph on a GPU:
        "inductor" (from Inductor's code, ``launch`` and ``rest`` both "inductor") or "op"."""
        o = self.options
        return "inductor" if o.launch == "inductor" and o.rest == "inductor" else "op"

    def _timed_launch(self, traced: TracedProgram, winner: KernelGraph,
                      knobs: Mapping[str, Any] | None, piece: Piece) -> Callable[..., Any] | None:
        """The winner as Inductor would launch it (``make_inductor_launch``), for timing it the
        way the compiled graph runs it; None where it is launched by its op, or the lowering
        refuses that path (then the op is timed)."""
        if self._launch() != "inductor":
            return None
        try:
            return make_inductor_launch(traced, winner, knobs or {}, piece.example_inputs)
        except Exception as e:
            LOG.info("egraph-mirage: %s: timed through its op: %s", piece.name, e)
            return None

    def _search_workers(self, g: KernelGraph) -> int | cf.Executor | None:
        """What a piece's search gets as ``workers``: the caller's Executor, or 1, or the pool
        of this compilation, started (and warmed: the search imported in each worker) at the
        first search, before its share of the time budget is reckoned, so that no search's
        share is spent starting processes and a compilation whose pieces all hit the cache
        starts none. A piece whose candidates' checks take so much memory that fewer processes
        than the pool's fit side by side (``verify.checks_that_fit``: a program at a real
        model's sizes, where it is not searched as a scaled copy: ``pipeline.scaled``) gets
        that many processes of its own instead, so that no worker is killed for memory. A pool
        one of whose workers died during a search (that search loses the tasks it had in
        flight, ``stats.tasks_lost``) is replaced before the next."""
        w = self.options.workers
        n = (os.cpu_count() or 1) if w is None else w
        if not isinstance(n, int) or n == 1:
            return w
        searched = scaled_program(g) if self.options.search is None else None
        fit = checks_that_fit(g if searched is None else searched)
        if fit is not None and fit < n:  # checks of this piece at its sizes take gigabytes
            return fit  # each: as many processes as fit in memory, in a pool of its own
        if self._pool is not None and processes.broken(self._pool):  # a worker died: anew
            processes.stop(self._pool)
            self._pool = None
        if self._pool is None:
            self._pool = processes.worker_pool(n)
            processes.warm(self._pool, n)
        return self._pool

    def _close_pool(self) -> None:
        executor, self._pool = self._pool, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)

    def _finish(self, compiled: Callable[..., Any], report: rep.CompileReport
                ) -> Callable[..., Any]:
        self.reports.append(report)
        rep.RECENT.append(report)
        LOG.info("%s", report.text())
        if self.options.verbose:
            print(report.text(), file=sys.stderr)

        def run(*args: Any) -> Any:
            return compiled(*args)

        run.egraph_mirage_report = report  # type: ignore[attr-defined]
        return run


def egraph_mirage_backend(gm: Any, example_inputs: Sequence[Any],
                          options: Mapping[str, Any] | None = None, mode: str | None = None,
                          **kwargs: Any) -> Callable[..., Any]:
    """The backend ``torch.compile(model, backend="egraph_mirage", options={...})`` calls
    (module docstring); ``kwargs`` are more options."""
    return Backend(**{**dict(options or {}), **kwargs})(gm, example_inputs, mode=mode)


def register() -> None:
    """Make ``backend="egraph_mirage"`` known to Dynamo where the package's entry point
    (``torch_dynamo_backends``) is not installed; nothing when it is (the entry point loads
    this module's ``egraph_mirage_backend``) or when already registered."""
    import torch._dynamo

    if NAME not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(egraph_mirage_backend, name=NAME)


def _dynamic(example_inputs: Sequence[Any]) -> str:
    """"requested" for ``dynamic=True``, "automatic" for symbolic inputs otherwise, else ""."""
    import torch._dynamo.config as dynamo_config

    symbolic = any(isinstance(x, torch.SymInt) or (isinstance(x, torch.Tensor) and any(
        isinstance(d, torch.SymInt) for d in x.shape)) for x in example_inputs)
    if not dynamo_config.assume_static_by_default:
        return "requested"
    return "automatic" if symbolic else ""


def _norm_with_projection(piece: Piece) -> bool:
    """Whether ``piece`` holds a reduction and a matmul (cut after its matmuls: a norm)."""
    return bool(piece.matmuls and piece.reductions)


def _moved(traced: TracedProgram | EMError) -> int:
    """Bytes a traced piece must move (its inputs read and outputs written once,
    ``gpu.floor.io_bytes``; 0 for a piece that does not trace): the order pieces are decided
    in, the largest first, so that the time budget goes first where the layer's time is."""
    return io_bytes(traced.graph) if isinstance(traced, TracedProgram) else 0


def _tolerance(g: KernelGraph) -> float:
    from ..gpu.tune import tolerance

    return tolerance(g)


def _on_gpu() -> bool:
    """Whether winners are timed against Inductor here (a CUDA GPU)."""
    return bool(torch.cuda.is_available())


register()

__all__ = ["NAME", "Backend", "egraph_mirage_backend", "register"]
