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
   (``fx.cache``: the program's canonical JSON, rules digest, lowering, device, search
   settings); on a miss **search** (``em.superoptimize``) and **decide**: the winner is compiled
   (``em.compile``), checked against the piece's eager outputs on the example inputs, and, on a
   CUDA GPU with ``profile`` on, timed against Inductor's code for the same piece (CUDA-graph
   replay and plain launches, ours through its custom op) and used only when faster as the
   ``timing`` option asks (both, by default); the times are cached, the decision is made
   from them at each compile;
   **refine**: a piece the search found nothing for is cut at its matmuls' inputs
   (``partition(..., levels=True)``: an RMSNorm before a gated MLP's projections becomes a
   piece apart from them) and each of its parts goes through step 2 (``refine=False``: not);
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
   slower under ``timing`` every piece is kept (``_whole``; the times are cached as a piece's
   are). Dynamo gets that callable (a function of the graph's flat
   inputs returning its outputs), with the ``CompileReport`` attached as
   ``egraph_mirage_report``.

Options (``torch.compile(..., options={...})`` or ``Backend(**options)``): ``budget`` search
seconds per piece (60), ``max_tasks`` search tasks per piece (None: all), ``workers`` search
processes (None: every core; one pool serves every piece of a compilation) or an Executor,
``config`` a ``SearchConfig`` or a mapping of its fields,
``cache_dir`` (default ``fx.cache.default_cache_dir()``), ``cache`` (False: neither read nor
write), ``profile`` GPU timing against Inductor (default: on where CUDA is), ``rest``,
``max_matmuls`` / ``max_reductions`` (the partitioner's caps per piece), ``timing`` ("both",
"graph" or "plain": how a winner must beat Inductor's code), ``launch`` ("inductor": on a
GPU, Inductor launches the replaced pieces' kernels from its own code, where that matches
Dynamo's graph; "op": each piece a call of its custom op), ``refine`` (True:
cut a piece with nothing found at its matmuls and search the parts), ``verbose`` (print the
report to stderr), ``search`` (a function standing in for ``em.superoptimize``, for tests).
Every compilation is logged at INFO on the ``egraph_mirage.fx`` logger and kept in
``fx.report.RECENT``; ``fx.report.torch_report(compiled_model)`` prints it.

Registration: the package's entry point (group ``torch_dynamo_backends`` in pyproject.toml)
names ``egraph_mirage_backend``, so an installed package needs no import; importing this module
also registers it (``register``) where the installed metadata predates the entry point.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import itertools
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from .. import processes
from ..errors import EMError
from ..graph import KernelGraph
from ..mugraph.serialize import dumps, loads
from ..search.config import SearchConfig
from . import report as rep
from .cache import CacheKey, SearchCache
from .pieces import Piece, partition
from .runtime import PieceCall, PieceOp, Runner, define_piece_op, make_inductor_launch, make_runner
from .trace import TracedProgram, trace_fx

#: the name ``torch.compile(backend=...)`` knows the backend by
NAME = "egraph_mirage"
LOG = logging.getLogger("egraph_mirage.fx")


#: the ``timing`` option's values
TIMINGS = ("both", "graph", "plain")


class BackendError(EMError, ValueError):
    """The backend was given an unknown or malformed option."""


class DynamicShapesError(BackendError):
    """``torch.compile(..., dynamic=True)``: the backend compiles static shapes only."""


@dataclass(frozen=True)
class BackendOptions:
    """The backend's options (module docstring), checked."""

    budget: float | None = 60.0
    max_tasks: int | None = None
    #: a process count (None: every core) or a ``concurrent.futures.Executor`` (a Dask
    #: ``Client.get_executor()``); a count starts one pool per compilation, shared by its pieces
    workers: int | cf.Executor | None = None
    config: SearchConfig = field(default_factory=SearchConfig)
    cache_dir: str | None = None
    cache: bool = True
    profile: bool | None = None
    rest: str = "inductor"
    max_matmuls: int = 2
    max_reductions: int = 4
    #: cut a piece the search found nothing for at its matmuls' inputs, and search the parts
    refine: bool = True
    #: on a GPU, how a winner must beat Inductor's code for its piece to replace it: under
    #: "graph" (CUDA-graph replay), "plain" launches, or "both"
    timing: str = "both"
    #: how the replaced pieces' kernels are launched on a GPU: "inductor" (Inductor launches
    #: them itself, from its own code, where it compiles them and the graph's outputs match
    #: Dynamo's graph; else as "op"), or "op" (each piece a call of its custom op)
    launch: str = "inductor"
    verbose: bool = False
    #: the search (default ``em.superoptimize``): any function taking ``(graph, config,
    #: time_budget=, workers=, max_tasks=, progress=, profile=)`` and returning its results
    search: Callable[..., Any] | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any] | None) -> BackendOptions:
        options = dict(options or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise BackendError(f"egraph_mirage backend: unknown option(s) {unknown}; known: "
                               f"{sorted(known)}")
        config = options.get("config")
        if isinstance(config, Mapping):
            try:
                options["config"] = SearchConfig(**config)
            except TypeError as e:
                raise BackendError(f"egraph_mirage backend: config: {e}") from None
        elif config is None:
            options.pop("config", None)
        elif not isinstance(config, SearchConfig):
            raise BackendError(f"egraph_mirage backend: config must be a SearchConfig or a "
                               f"mapping of its fields, got {config!r}")
        if options.get("timing", "both") not in TIMINGS:
            raise BackendError(f"egraph_mirage backend: timing must be one of {TIMINGS}, got "
                               f"{options['timing']!r}")
        if options.get("launch", "inductor") not in ("inductor", "op"):
            raise BackendError(f"egraph_mirage backend: launch must be 'inductor' or 'op', got "
                               f"{options['launch']!r}")
        if options.get("rest", "inductor") not in ("inductor", "eager"):
            raise BackendError(f"egraph_mirage backend: rest must be 'inductor' or 'eager', got "
                               f"{options['rest']!r}")
        budget = options.get("budget", 60.0)
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                                   or not budget > 0):
            raise BackendError(f"egraph_mirage backend: budget must be a positive number of "
                               f"seconds or None, got {budget!r}")
        for name in ("max_tasks", "workers"):
            v = options.get(name)
            if name == "workers" and isinstance(v, cf.Executor):
                continue
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise BackendError(f"egraph_mirage backend: {name} must be a positive integer "
                                   f"or None, got {v!r}")
        if options.get("search") is not None and not callable(options["search"]):
            raise BackendError(f"egraph_mirage backend: search must be a function, got "
                               f"{options['search']!r}")
        return cls(**options)

    def search_settings(self) -> dict[str, Any]:
        """What the cache key records of the search: what changes what it finds."""
        search = self.search
        qualname = getattr(search, "__qualname__", type(search).__qualname__)
        name = "" if search is None else f"{getattr(search, '__module__', '')}.{qualname}"
        return {"budget": self.budget, "max_tasks": self.max_tasks, "search": name,
                "profile": self.profiling(), "config": repr(asdict(self.config))}

    def profiling(self) -> bool:
        return bool(torch.cuda.is_available()) if self.profile is None else bool(self.profile)


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

    def __call__(self, gm: Any, example_inputs: Sequence[Any], mode: str | None = None,
                 options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
        """Compile Dynamo's graph ``gm`` (module docstring); ``mode`` is ``torch.compile``'s,
        passed to Inductor."""
        if options:
            raise BackendError("egraph_mirage backend: give the options to Backend(...), not "
                               "to torch.compile(options=...), when passing a Backend object")
        t0 = time.perf_counter()
        report = rep.CompileReport(next(self._graphs), len(example_inputs),
                                   rest=self.options.rest)
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
            compiled = _rest(gm, example_inputs, self.options.rest, mode)
        else:
            try:
                compiled = self._compile(gm, example_inputs, report, mode)
            finally:
                self._close_pool()
        report.seconds = time.perf_counter() - t0
        return self._finish(compiled, report)

    def _compile(self, gm: Any, example_inputs: Sequence[Any], report: rep.CompileReport,
                 mode: str | None) -> Callable[..., Any]:
        try:
            parts = partition(gm, example_inputs, max_matmuls=self.options.max_matmuls,
                              max_reductions=self.options.max_reductions)
        except EMError as e:
            report.note = f"the graph could not be partitioned ({e}); it runs in the rest"
            LOG.warning("egraph-mirage: %s", report.note)
            return _rest(gm, example_inputs, self.options.rest, mode)
        replaced = 0
        for i, piece in enumerate(parts.pieces):
            piece_report, replacement = self._piece(i, piece, mode)
            report.pieces.append(piece_report)
            if replacement is None and self.options.refine and piece_report.nothing_found():
                replacement = self._refine(i, piece, piece_report, report, mode)
            if replacement is not None:
                setattr(parts.module, piece.name, replacement)
                replaced += 1
        report.searches = sum(p.search_seconds is not None for p in report.pieces)
        report.left_out = dict(parts.left_out)
        # nothing replaced: the rest is the whole graph as Dynamo gave it, compiled exactly as
        # torch.compile would without the backend
        compiled = (self._launched_by_inductor(parts.module, gm, example_inputs, report, mode)
                    if replaced else None)
        if compiled is None:
            compiled = _rest(parts.module if replaced else gm, example_inputs, self.options.rest,
                             mode)
        if replaced and self.options.profiling() and _on_gpu():
            return self._whole(compiled, gm, example_inputs, report, mode)
        return compiled

    def _launched_by_inductor(self, module: Any, gm: Any, example_inputs: Sequence[Any],
                              report: rep.CompileReport, mode: str | None
                              ) -> Callable[..., Any] | None:
        """``module`` compiled with its replaced pieces traced into Inductor's graph
        (``PieceCall.by_inductor``: Inductor launches their kernels itself), where every one
        has an Inductor launch, that compiles and its outputs on the example inputs match
        Dynamo's graph within ``TOLERANCE``; else None (the pieces' custom ops launch them).
        ``report.launch`` says which."""
        calls = [m for m in module.modules() if isinstance(m, PieceCall)]
        report.launch = "op"
        if not calls or any(c.inductor_launch is None for c in calls):
            return None
        for c in calls:
            c.by_inductor = True
        try:
            ours = _rest(module, example_inputs, self.options.rest, mode)
            with torch.no_grad():
                got, want = ours(*example_inputs), gm(*example_inputs)
            error = _outputs_error(got, want)
        except Exception as e:
            error, why = float("inf"), f"{type(e).__name__}: {e}"
        else:
            why = f"outputs differ from Dynamo's graph (relative error {error:.1e})"
        if error <= TOLERANCE:
            report.launch = "inductor"
            return ours
        for c in calls:
            c.by_inductor = False
        LOG.warning("egraph-mirage: the replaced pieces' kernels stay launched by their ops: "
                    "Inductor's launch of them failed: %s", why)
        report.launch_note = f"launched by their ops: Inductor's launch of them failed: {why}"
        return None

    def _whole(self, compiled: Callable[..., Any], gm: Any, example_inputs: Sequence[Any],
               report: rep.CompileReport, mode: str | None) -> Callable[..., Any]:
        """Never slower, for the graph as a whole: ``compiled`` (with the replaced pieces) is
        timed against Inductor's code for Dynamo's graph (both kinds of timing), and where it
        is slower under the ``timing`` option, every piece is kept and Inductor's code is
        returned. A piece faster alone can make the graph slower: its call costs host time
        that Inductor's code for it, fused into the graph's, does not. The times are cached
        (``_whole_key``: the graph, its inputs' layout and the replaced pieces' winners), and
        the decision is made from them at each compile, as for a piece."""
        key = _whole_key(gm, example_inputs, report, mode, self.options.search_settings())
        record = self.cache.get(key) if self.cache is not None else None
        report.whole_cache = "off" if self.cache is None else ("miss" if record is None else "hit")
        inductor = None
        if record is None:
            inductor = _rest(gm, example_inputs, self.options.rest, mode)
            try:
                record = _time_graphs(compiled, inductor, example_inputs)
            except Exception as e:  # not measurable: Inductor's code, which is never slower
                why = f"could not be timed ({type(e).__name__}: {e})"
                record = None
            else:
                if self.cache is not None:
                    self.cache.put(key, record)
        if record is not None:
            report.whole_times = _fmt_times(record)
            why = _slower(record, self.options.timing)
            why = why and f"{why}: {report.whole_times}"
        if not why:
            return compiled
        replaced = [p for p in report.pieces if p.status == rep.REPLACED]
        report.note = (f"the graph with its {len(replaced)} replaced piece(s): {why}; every "
                       "piece kept")
        for p in replaced:
            p.status, p.reason = rep.KEPT, "the whole graph was slower with it replaced"
        return inductor if inductor is not None else _rest(gm, example_inputs,
                                                           self.options.rest, mode)

    def _piece(self, index: int, piece: Piece, mode: str | None = None
               ) -> tuple[rep.PieceReport, Any]:
        """The piece's report, and its replacement module (None: it stays). ``mode``:
        ``torch.compile``'s, which Inductor's code for the piece is compiled with when the
        winner is timed against it (part of the cache key when timing)."""
        out = rep.PieceReport(index, piece.name)
        try:
            traced = trace_fx(piece.module, piece.example_inputs)
        except EMError as e:
            out.status, out.reason = rep.UNSUPPORTED, str(e)
            return out, None
        g = traced.graph
        out.operators = tuple(t.op for t in g.operators)
        out.shapes = tuple(tuple(t.dims) for t in g.inputs)
        out.dtypes = tuple(t.dtype.value for t in g.inputs)
        settings = self.options.search_settings()
        if self.options.profiling():  # what the times of a cached decision were measured by
            settings.update(inductor_mode=mode or "default", plain_timing=PLAIN_TIMING)
        key = CacheKey.of(g, search=settings)
        record = self.cache.get(key) if self.cache is not None else None
        out.cache = "off" if self.cache is None else ("miss" if record is None else "hit")
        runner = None
        if record is None:
            record, runner, lasting = self._decide(piece, traced, out, mode)
            if self.cache is not None and lasting:
                self.cache.put(key, record)
        _fill(out, record)
        slower = _slower(record, self.options.timing) if record["decision"] == "replace" else ""
        if slower:
            out.status, out.reason = rep.KEPT, slower
        if record["decision"] != "replace" or slower:
            return out, None
        if runner is None:
            try:
                runner = make_runner(traced, loads(record["mugraph"]), record.get("knobs") or {},
                                 piece.example_inputs)
            except Exception as e:  # e.g. the cached winner no longer lowers
                out.status, out.reason = rep.KEPT, f"the cached μGraph failed to compile: {e}"
                return out, None
        launch = None
        if self.options.launch == "inductor" and self.options.rest == "inductor" and _on_gpu():
            try:
                launch = make_inductor_launch(traced, loads(record["mugraph"]),
                                              record.get("knobs") or {}, piece.example_inputs)
            except Exception as e:  # e.g. a layout the lowering refuses: the op launches it
                LOG.info("egraph-mirage: %s: launched by its op: %s", piece.name, e)
        return out, PieceCall(define_piece_op(runner, traced, piece.name), launch)

    def _refine(self, index: int, piece: Piece, piece_report: rep.PieceReport,
                report: rep.CompileReport, mode: str | None = None) -> Any:
        """Piece ``index``, which the search found nothing for, cut at its matmuls' inputs
        (``partition(..., levels=True)``) into parts decided one by one (``_piece``; their
        reports follow the piece's in ``report``). Returns the piece's module with the chosen
        parts replaced, or None (fewer than two parts, or none replaced)."""
        try:
            parts = partition(piece.module, piece.example_inputs,
                              max_matmuls=self.options.max_matmuls,
                              max_reductions=self.options.max_reductions, levels=True)
        except EMError:
            return None
        if len(parts.pieces) < 2:
            return None
        last = f"{index}.{len(parts.pieces) - 1}"
        piece_report.reason += f"; searched in {len(parts.pieces)} parts ({index}.0–{last})"
        replaced = 0
        for j, part in enumerate(parts.pieces):
            part_report, replacement = self._piece(index, part, mode)
            part_report.name, part_report.part = f"{piece.name}.{part.name}", j
            report.pieces.append(part_report)
            if replacement is not None:
                setattr(parts.module, part.name, replacement)
                replaced += 1
        return parts.module if replaced else None

    def _decide(self, piece: Piece, traced: TracedProgram, out: rep.PieceReport,
                mode: str | None = None) -> tuple[dict[str, Any], Runner | None, bool]:
        """Search, compile, check and (on a GPU) time. Returns the record, the compiled runner
        when the decision is to replace, and whether the record may be cached (not when the
        piece was refused before any search, nor after an unexpected failure)."""
        from ..pipeline.stages import superoptimize
        from ..rank.measured import keep_jax_off_the_gpu

        keep_jax_off_the_gpu()  # the verifier's JAX on the CPU, in this process and the workers
        o = self.options
        g = traced.graph
        record: dict[str, Any] = {"decision": "keep", "reason": "", "mugraph": None,
                                  "knobs": None, "created": time.time()}
        if len(g.outputs) != 1:
            record["reason"] = (f"{len(g.outputs)} outputs (the search takes programs of one "
                                "output)")
            return record, None, False
        self.searches += 1
        t0 = time.perf_counter()
        try:
            results = (o.search or superoptimize)(
                g, o.config, time_budget=o.budget, workers=self._search_workers(),
                max_tasks=o.max_tasks,
                progress=o.verbose, profile=o.profiling())
        except Exception as e:
            record["reason"] = f"the search failed: {type(e).__name__}: {e}"
            LOG.warning("egraph-mirage: %s: %s", piece.name, record["reason"])
            return record, None, isinstance(e, EMError)
        finally:
            out.search_seconds = record["search_seconds"] = time.perf_counter() - t0
        best = results.best
        if best is None:
            why = results.stats.no_result_reasons or [results.stats.stopped_by or "none found"]
            record["reason"] = f"{rep.NOTHING_FOUND}: {why[0]}"
            return record, None, True
        record.update(mugraph=dumps(best.graph), knobs=best.knobs, num_kernels=best.num_kernels,
                      grids=_grids(best.graph), estimated_us=best.estimated_seconds * 1e6)
        try:
            runner = make_runner(traced, best.graph, best.knobs or {}, piece.example_inputs)
            error = _check(runner, piece)
        except Exception as e:
            record["reason"] = f"the winner failed to compile or run: {type(e).__name__}: {e}"
            LOG.warning("egraph-mirage: %s: %s", piece.name, record["reason"])
            return record, None, isinstance(e, EMError)
        if error > _tolerance(g):
            record["reason"] = f"the winner differs from eager (relative error {error:.1e})"
            return record, None, True
        record["decision"] = "replace"  # where timed, ``_slower`` decides with the times
        if o.profiling() and _on_gpu():
            try:
                record.update(_time_against_inductor(runner, traced, piece, mode))
            except Exception as e:
                record.update(decision="keep", reason=f"timing failed: {type(e).__name__}: {e}")
                LOG.warning("egraph-mirage: %s: %s", piece.name, record["reason"])
                return record, None, False
        return record, runner, True

    def _search_workers(self) -> int | cf.Executor | None:
        """What a piece's search gets as ``workers``: the caller's Executor, or 1, or the pool
        of this compilation, started (and warmed: the search imported in each worker) at the
        first search, so that every piece's budget is spent searching rather than starting
        processes and a compilation whose pieces all hit the cache starts none."""
        w = self.options.workers
        n = (os.cpu_count() or 1) if w is None else w
        if not isinstance(n, int) or n == 1:
            return w
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


def _rest(module: Any, example_inputs: Sequence[Any], rest: str, mode: str | None
          ) -> Callable[..., Any]:
    """``module`` compiled by Inductor, or as is for ``rest="eager"``."""
    if rest == "eager":
        return module
    # a plain GraphModule: torch.export's module carries a lambda that Inductor's cache of
    # compiled graphs cannot pickle
    module = torch.fx.GraphModule(module, module.graph)
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = dict(list_mode_options(mode)) if mode not in (None, "default") else {}
    if any(isinstance(m, PieceCall) for m in module.modules()):
        # Inductor's on-disk cache of compiled graphs would key on our ops by name only (and
        # cannot pickle their implementations): off for graphs that call them
        patches["fx_graph_cache"] = False
    return compile_fx(module, list(example_inputs), config_patches=patches or None)


def _check(runner: Runner, piece: Piece) -> float:
    """The largest relative error of ``runner``'s outputs against the piece's eager outputs on
    its example inputs."""
    from ..gpu.torch_eval import relative_error

    with torch.no_grad():
        ref = piece.module(*piece.example_inputs)
        got = runner(list(piece.example_inputs))
    return max((relative_error(a, b) for a, b in zip(got, ref, strict=True)), default=0.0)


#: relative error (``gpu.torch_eval.relative_error``) of a graph's outputs with Inductor
#: launching the pieces' kernels, against Dynamo's graph run as is (fp16's tolerance)
TOLERANCE = 1e-2


def _outputs_error(got: Any, want: Any) -> float:
    """The largest relative error between two graphs' outputs (tuples or lists of tensors)."""
    from ..gpu.torch_eval import relative_error

    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    if len(got) != len(want):
        return float("inf")
    return max((relative_error(a, b) for a, b in zip(got, want) if isinstance(b, torch.Tensor)),
               default=0.0)


def _tolerance(g: KernelGraph) -> float:
    from ..gpu.tune import tolerance

    return tolerance(g)


def _on_gpu() -> bool:
    """Whether winners are timed against Inductor here (a CUDA GPU)."""
    return bool(torch.cuda.is_available())


def _slower(record: Mapping[str, Any], timing: str) -> str:
    """Why a timed winner is not used under the ``timing`` option ("" when it is faster, or was
    not timed: no GPU)."""
    if "ours_us" not in record and "ours_plain_us" not in record:
        return ""
    for kind in _kinds(timing):
        ours, theirs = _TIMES[kind]
        if ours not in record or theirs not in record:
            return f"not timed under {_TIMED[kind]} (a decision cached by an earlier version)"
        if record[ours] is None or record[theirs] is None:  # a CUDA graph could not be captured
            return f"could not be timed under {_TIMED[kind]}"
        if record[ours] >= record[theirs]:
            return f"not faster than Inductor's code ({_TIMED[kind]})"
    return ""


#: the record's fields of each kind of timing: ours, Inductor's. Plain launches are timed two
#: ways, back to back (a loop of calls) and each call after an L2 flush (``triton``'s
#: ``do_bench``, as ``bench torch`` reports them): the flush hides part of a call's host time,
#: back to back none, and a replacement must be faster both ways
_TIMES = {"graph": ("ours_us", "inductor_us"), "plain": ("ours_plain_us", "inductor_plain_us"),
          "flushed": ("ours_flushed_us", "inductor_flushed_us")}
_TIMED = {"graph": "CUDA-graph replay", "plain": "plain launches",
          "flushed": "plain launches, each after an L2 flush"}


def _kinds(timing: str) -> tuple[str, ...]:
    """The kinds of timing (``_TIMES``' keys) the ``timing`` option asks for."""
    plain = ("plain", "flushed")
    return ("graph", *plain) if timing == "both" else plain if timing == "plain" else (timing,)


def _time_pair(ours: Callable[..., Any], inductor: Callable[..., Any], xs: list[Any],
               kinds: Sequence[str]) -> dict[str, float | None]:
    """Ours and Inductor's µs per call on inputs ``xs`` under each of ``kinds``: CUDA-graph
    replay (None where a graph cannot be captured) and plain launches, issued back to back
    (``CudaTimer.back_to_back``, so that a call's host time counts) and each after an L2 flush
    (``CudaTimer.plain``); keys from ``_TIMES``.
    Plain launches are bound by the host, whose speed drifts between measurements (the same
    compiled graph measured half as long again a few seconds later on a GPU host): ours and
    Inductor's are timed in alternation, ``PLAIN_ROUNDS`` times each, and the fastest of each
    counts (a busy host only ever adds time)."""
    from ..gpu.timing import CudaTimer, TimingConfig

    timer = CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5, graph_replays=7))
    times: dict[str, float | None] = {}
    fns = ((0, ours), (1, inductor))
    if "graph" in kinds:
        for who, fn in fns:
            try:
                times[_TIMES["graph"][who]] = timer.graph(fn, [xs])
            except Exception:  # not capturable
                times[_TIMES["graph"][who]] = None
    if "plain" in kinds:
        plain: dict[str, dict[int, list[float]]] = {k: {0: [], 1: []} for k in ("plain",
                                                                                 "flushed")}
        for _ in range(PLAIN_ROUNDS):
            for who, fn in fns:
                plain["plain"][who].append(timer.back_to_back(fn, [xs], repeats=1))
                plain["flushed"][who].append(timer.plain(fn, [xs]))
        for kind, by in plain.items():
            for who, _ in fns:
                times[_TIMES[kind][who]] = min(by[who])
    return times


#: rounds of plain-launch timing in ``_time_pair`` (ours, then Inductor's, in each)
PLAIN_ROUNDS = 7
#: how plain launches are timed, as the cache keys record it (times measured otherwise miss)
PLAIN_TIMING = f"back to back and after an L2 flush, alternated, fastest of {PLAIN_ROUNDS}"


def _time_against_inductor(runner: Runner, traced: TracedProgram, piece: Piece,
                           mode: str | None = None) -> dict[str, float | None]:
    """Ours and Inductor's µs per call on the piece's example inputs, both kinds of timing
    (``_time_pair``); ours through the custom op the piece would become. Inductor compiles
    the piece in ``torch.compile``'s ``mode``."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    xs = list(piece.example_inputs)
    # outside Dynamo's tracing context: compiling the piece must not add guards (on symbols
    # of its own) to the shape environment of the graph being compiled
    with torch._guards.tracing(None):
        theirs = compile_fx(piece.module, xs, config_patches=dict(
            list_mode_options(mode)) if mode not in (None, "default") else None)
    op = define_piece_op(runner, traced, f"{piece.name}_timed")
    return _time_pair(lambda *a: op.op(list(a)), lambda *a: theirs(*a), xs, ("graph", "plain"))


def _time_graphs(ours: Callable[..., Any], inductor: Callable[..., Any],
                 example_inputs: Sequence[Any]) -> dict[str, float | None]:
    """The whole graph's µs per call with the pieces replaced (``ours``) and as Inductor
    compiled it, under both kinds of timing (``_time_pair``)."""
    return _time_pair(ours, inductor, list(example_inputs), ("graph", "plain"))


def _whole_key(gm: Any, example_inputs: Sequence[Any], report: rep.CompileReport,
               mode: str | None, settings: Mapping[str, Any]) -> CacheKey:
    """The cache key of a whole-graph check: Dynamo's graph (its code), its inputs' shapes,
    strides and dtypes, the replaced pieces, their winners and who launches their kernels,
    Inductor's mode, the rules, lowering and device (``CacheKey``'s defaults) and the search
    settings."""
    from .cache import default_rules_digest, device_name, lowering_fingerprint

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    layout = [[list(x.shape), list(x.stride()), str(x.dtype).removeprefix("torch.")]
              for x in tensors]
    replaced = [[p.name, p.winner] for p in report.pieces if p.status == rep.REPLACED]
    program = json.dumps({"code": gm.code, "inputs": layout, "replaced": replaced,
                          "launch": report.launch}, sort_keys=True)
    return CacheKey(program=hashlib.sha256(program.encode()).hexdigest(),
                    operators=("whole graph",), shapes=tuple(tuple(s) for s, _, _ in layout),
                    dtypes=tuple(d for _, _, d in layout), rules=default_rules_digest(),
                    device=device_name(), lowering=lowering_fingerprint(),
                    search=dict(settings, inductor_mode=mode or "default",
                                plain_timing=PLAIN_TIMING))


def _fmt_times(times: Mapping[str, float | None]) -> str:
    """``ours 1.0 / 2.0 µs, Inductor 1.5 / 2.5 µs (graph replay / plain launches)``: the kinds
    of timing in ``times``."""
    kinds = [k for k in ("graph", "plain", "flushed") if _TIMES[k][0] in times]
    say = {"graph": "graph replay", "plain": "plain launches", "flushed": "plain, L2 flushed"}

    def cell(who: int) -> str:
        vals = [times[_TIMES[k][who]] for k in kinds]
        return " / ".join("–" if v is None else f"{v:.1f}" for v in vals)

    return (f"ours {cell(0)} µs, Inductor {cell(1)} µs ({' / '.join(say[k] for k in kinds)})")


def _grids(mugraph: KernelGraph) -> list[list[int]]:
    """The grid of each graph-defined kernel, in order."""
    grids, seen = [], set()
    for t in mugraph.operators:
        kernel = t.params.get("kernel") if t.op == "customized" else None
        if kernel is not None and id(kernel) not in seen:
            seen.add(id(kernel))
            grids.append(list(kernel.tb.grid_dim))
    return grids


def _fill(out: rep.PieceReport, record: Mapping[str, Any]) -> None:
    """The report's fields from a cached or fresh record."""
    out.status = rep.REPLACED if record["decision"] == "replace" else rep.KEPT
    out.reason = record.get("reason", "")
    out.num_kernels = record.get("num_kernels")
    out.grids = [tuple(g) for g in record.get("grids") or []]
    out.ours_us, out.inductor_us = record.get("ours_us"), record.get("inductor_us")
    out.ours_plain_us = record.get("ours_plain_us")
    out.inductor_plain_us = record.get("inductor_plain_us")
    if record.get("mugraph"):
        text = json.dumps([record["mugraph"], record.get("knobs")], sort_keys=True)
        out.winner = hashlib.sha256(text.encode()).hexdigest()


register()

__all__ = ["NAME", "Backend", "BackendError", "BackendOptions", "DynamicShapesError",
           "PieceCall", "PieceOp", "define_piece_op", "egraph_mirage_backend", "register"]
