"""Ranking by measured time: stage ``profile`` of ``superoptimize(..., profile=True)`` (verified
μGraphs timed on a GPU) and ``rank`` (candidates ordered by a tuner's times, ``bench gpu``).

Each verified μGraph is lowered, tuned over the lowering's knobs, checked against PyTorch in
float32 and timed by ``gpu.tune.tune`` (trials cached on disk, like ``bench gpu``'s); the results
are then ranked by measured time. A result that does not lower, compile or run at any setting,
or that fails the numeric check at every setting that ran, is dropped and counted in the search's
statistics (``profile_failed``, ``profile_wrong``): a measured ranking never returns a μGraph the
GPU got wrong. Under a time budget the results are measured best estimated first until the
budget's deadline, and those not reached follow the measured ones in the cost model's order.
Without a CUDA GPU (or without torch) nothing is measured: the ranking stays the cost model's
and ``stats.profile_note`` says why.

The GPU side is imported here only when a measurement is made, so the search runs where neither
torch nor triton is installed. ``GpuProfiler`` takes its compiler, timer and device as
arguments, which is how the CPU tests measure with fakes; any object with ``device_name`` and
``measure`` (``Profiler``) will do.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import LowerError
from ..graph import KernelGraph
from ..lower.cost_model import ProgramCost
from .forms import spread, to_tune

if TYPE_CHECKING:
    from ..gpu.tune import TuneResult
    from ..search.results import SearchResult, SearchStats

#: ``SearchStats.ranked_by`` values
BY_COST_MODEL = "cost model"
BY_GPU = "gpu"
#: at most this many messages of dropped results are kept in the statistics
MAX_MESSAGES = 20


@dataclass(frozen=True)
class Measurement:
    """The outcome of profiling one μGraph."""

    #: "ok"; "failed": no knob setting lowered, compiled and ran; "wrong": every setting that
    #: ran failed the numeric check against PyTorch
    status: str
    us: float | None = None
    knobs: Mapping[str, Any] | None = None
    message: str = ""


class Profiler(Protocol):
    """What the profile stage needs: a device name and a way to measure μGraphs of a program."""

    @property
    def device_name(self) -> str: ...

    def measure(self, program: KernelGraph, mugraphs: Sequence[KernelGraph]
                ) -> list[Measurement]:
        """One measurement per μGraph, in order; ``program`` is the reference."""
        ...


def keep_jax_off_the_gpu() -> None:
    """Make the verifier's JAX use the CPU unless the caller chose otherwise (``JAX_PLATFORMS``).

    Where JAX sees a GPU it takes 75% of its memory when first used, in every search process,
    leaving the GPU's measurements short of memory; the search needs JAX only on the CPU. Call
    before the search imports JAX (the ``optimize --profile`` and ``bench gpu --from-search``
    commands do); worker processes inherit the setting."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def cuda_available() -> tuple[bool, str]:
    """(whether torch sees a CUDA GPU, why not). Never raises; imports torch only here."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    try:
        if torch.cuda.is_available():
            return True, ""
    except Exception as exc:  # a broken driver counts as none
        return False, f"torch.cuda failed: {type(exc).__name__}: {exc}"
    return False, "torch.cuda.is_available() is False"


@dataclass
class GpuProfiler:
    """Tunes and times with ``gpu.tune``. Every field has a working default on a CUDA machine:

    ``compiler`` the lowering (``gpu.tune.default_compiler()``); ``timer`` a ``CudaTimer`` with
    short runs (the same settings ``bench gpu`` tunes with); ``device`` where inputs live;
    ``cache`` a ``gpu.tune.TuneCache`` (default: ``gpu.tune.default_cache_dir()``); ``space``
    the knob space (default: the lowering's); ``timing`` "graph" (CUDA-graph replay) or "plain".
    """

    compiler: Any = None
    timer: Any = None
    device: str = "cuda"
    name: str | None = None
    cache: Any = None
    space: Mapping[str, Sequence[Any]] | None = None
    timing: str = "graph"
    seed: int = 0
    std: float = 0.1
    #: a first timing: a few knob settings (``gpu.tune.QUICK_KNOBS``, the μGraph's own knobs at
    #: their first value) instead of tuning
    quick: bool = False
    #: a ``clock()`` time after which tuning a μGraph tries no further setting once one has a
    #: time (``until``; ``gpu.tune.tune``'s ``stop``)
    deadline: float | None = None
    clock: Callable[[], float] = time.time
    #: per program input, its strides where the program runs with inputs that are not
    #: row-major (None: that input row-major; (): every input): a view read in place, as the
    #: torch backend's pieces read a linear layer's weight (Wᵀ) or a slice. Inputs are then
    #: made in that layout and each μGraph compiled to read it (``LowerOptions.input_strides``;
    #: where the lowering refuses it, for row-major inputs, which the program then copies at
    #: every call, as the backend's runner does): the sizes and knobs that win are those of the
    #: layout that runs
    strides: tuple[tuple[int, ...] | None, ...] = ()

    @property
    def smem(self) -> int | None:
        """Bytes of shared memory a block may take on the GPU (the size variants' budget)."""
        from ..gpu.timing import smem_per_block

        return smem_per_block() if self.device == "cuda" else None

    def first_timing(self) -> GpuProfiler:
        """This profiler for the profile stage's first timings (``quick``)."""
        return replace(self, quick=True)

    def until(self, deadline: float, clock: Callable[[], float] = time.time) -> GpuProfiler:
        """This profiler tuning each μGraph until ``clock()`` reaches ``deadline`` (then with
        the best setting timed so far), not over its whole knob space."""
        return replace(self, deadline=deadline, clock=clock)

    @property
    def device_name(self) -> str:
        if self.name is None:
            from ..gpu.timing import device_name

            self.name = device_name() if self.device == "cuda" else self.device
        return self.name

    def measure(self, program: KernelGraph, mugraphs: Sequence[KernelGraph]
                ) -> list[Measurement]:
        from ..gpu.timing import (
            CudaTimer,
            TimingConfig,
            graph_bytes,
            input_sets,
            l2_bytes,
            random_inputs,
            rotation_count,
        )
        from ..gpu.tune import (
            QUICK_KNOBS,
            TuneCache,
            default_cache_dir,
            default_compiler,
            staged_spaces,
            tune,
            tune_staged,
        )

        compiler = self.compiler or default_compiler()
        if compiler is None:  # nothing can be measured: the stage keeps the cost model
            raise LowerError("profile: egraph_mirage.lower has no compile entry point")
        timer = self.timer or CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5,
                                                     graph_replays=7))
        cache = self.cache if self.cache is not None else TuneCache(default_cache_dir())
        # inputs rotate through more than the L2 holds; a CPU (tests) has no L2 to defeat
        count = (rotation_count(graph_bytes(program), l2_bytes()) if self.device == "cuda"
                 else 1)
        sets = input_sets(program, count, self.device, self.seed, self.std)
        check_inputs = random_inputs(program, self.device, self.seed + 10_000, self.std)
        layout = ""
        if any(self.strides):
            sets = [_laid(xs, self.strides) for xs in sets]
            check_inputs = _laid(check_inputs, self.strides)
            compiler = _reading(compiler, self.strides)
            layout = json.dumps([list(st) if st else None for st in self.strides])

        deadline, clock = self.deadline, self.clock
        stop = None if deadline is None else (lambda: clock() >= deadline)

        def tuner(h: KernelGraph, space: Any) -> Any:
            return tune(h, program, compiler=compiler, timer=timer, input_sets=sets,
                        check_inputs=check_inputs, device=self.device_name, cache=cache,
                        space=space, timing=self.timing, layout=layout, stop=stop)

        out = []
        for h in mugraphs:
            try:
                if self.quick:
                    res = tuner(h, staged_spaces(h, self.space or QUICK_KNOBS)[0])
                elif self.space is not None:
                    res = tuner(h, self.space)
                else:  # the lowering's knobs, then the μGraph's own at the best of them
                    res = tune_staged(h, tuner, stop=stop)
            except Exception as exc:  # e.g. the best setting no longer compiles
                out.append(Measurement("failed", message=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            if res.best is not None and res.best.us is not None:
                out.append(Measurement("ok", res.best.us, dict(res.best.knobs)))
                continue
            wrong = [t for t in res.trials if t.status == "wrong"]
            if wrong:
                errors = [t.error for t in wrong if t.error is not None]
                why = f"relative error {min(errors):.2e} at best" if errors else "wrong outputs"
                out.append(Measurement("wrong", message=why))
            else:
                msgs = sorted({t.message for t in res.trials if t.message})
                out.append(Measurement("failed", message="; ".join(msgs)[:300] or "no setting"))
        return out


def for_inputs(profiler: Profiler | None, positions: Sequence[int]) -> Profiler | None:
    """``profiler`` for a program over the inputs at ``positions`` of the one it was made for
    (an output's cone, ``pipeline.outputs``): a ``GpuProfiler``'s input layout (``strides``)
    cut to those inputs; any other profiler as it is."""
    if isinstance(profiler, GpuProfiler) and profiler.strides:
        return replace(profiler, strides=tuple(profiler.strides[k] for k in positions))
    return profiler


def _laid(xs: Sequence[Any], strides: Sequence[tuple[int, ...] | None]) -> list[Any]:
    """``xs`` with the same values, each in the strides ``strides`` gives it (a tensor of
    its own storage, gaps included)."""
    import torch

    out = []
    for x, st in zip(xs, strides, strict=True):
        if st and tuple(x.stride()) != tuple(st):
            y = torch.empty_strided(tuple(x.shape), tuple(st), dtype=x.dtype, device=x.device)
            x = y.copy_(x)
        out.append(x)
    return out


def _reading(compiler: Any, strides: tuple[tuple[int, ...] | None, ...]) -> Any:
    """``compiler`` compiling each μGraph to read its inputs in ``strides`` (``input_strides``),
    or, where the lowering refuses that layout, for row-major inputs (copied at every call)."""
    def compile_(g: KernelGraph, knobs: Mapping[str, Any]) -> Any:
        try:
            return compiler(g, {**knobs, "input_strides": strides})
        except LowerError:
            return compiler(g, knobs)
    return compile_


#: with results to time on a GPU, the share of ``superoptimize``'s time budget its search takes
#: (the profiling has the rest)
SEARCH_SHARE = 0.6
#: sizes timed for each of the first ``PROFILE_SIZES_FORMS`` results of the profiling order (the
#: best estimated of each form): its own and the μGraph optimizer's next best
#: (``rank.size_variants.size_variants``)
PROFILE_SIZES = 4
PROFILE_SIZES_FORMS = 3
#: results tuned in full after the first timings, the fastest first
PROFILE_TUNE_TOP = 3
#: with a deadline, the share of the profiling time left at its start that first timings may take
FIRST_TIMING_SHARE = 0.6
#: results given a first timing even once the deadline has passed (the first of the profiling
#: order: the best estimated form at its sizes): the cost model does not order a structure's
#: sizes as a GPU does (a gated GEMV pair at 8B sizes, H200: estimated 81.9-83.7 µs for sizes
#: measured 56-103 µs, ``scripts/gpu_probes/gemv_variants.py``), so a ranking with none timed
#: can pick one far from the floor
PROFILE_MIN_TIMED = 4
#: with a deadline, the share of the profiling time left at its start that making size variants
#: may take (each is verified at the program's sizes: seconds each for a real model's piece)
SIZES_SHARE = 0.4


def profile_stage(ranked: list[SearchResult], program: KernelGraph, stats: SearchStats,
                  profiler: Profiler | None = None, deadline: float | None = None,
                  clock: Callable[[], float] = time.time, sizes: int = 1,
                  sized_forms: int = PROFILE_SIZES_FORMS,
                  tune_top: int = PROFILE_TUNE_TOP,
                  min_timed: int = PROFILE_MIN_TIMED) -> list[SearchResult]:
    """Stage ``profile``: ``ranked`` (the cost model's order) re-ranked by measured time.

    ``profiler`` None measures on the CUDA GPU (``GpuProfiler()``) where torch sees one, and
    otherwise returns ``ranked`` as it is, with the reason in ``stats.profile_note``. Results
    that fail are dropped and counted (see the module docstring). If the profiler itself breaks
    (or Ctrl-C), the cost model's ranking is kept and the note says so: the search's results are
    never lost to the GPU.

    ``deadline`` (a ``clock()`` time, the end of the search's time budget) bounds the profiling:
    results are then measured one at a time until ``clock()`` reaches it, in ``forms.spread``'s
    order: the best estimated of each form (kernels, library operators) first, then the rest.
    The measured ones come first, by measured time, and the rest follow unmeasured in the cost
    model's order; the note says how many were measured. Without a deadline every result is
    measured, in one call to the profiler. The first ``min_timed`` results of that order get a
    first timing even when the deadline has passed (``PROFILE_MIN_TIMED``: the cost model is
    no guide among sizes).

    A profiler with ``first_timing()`` (``GpuProfiler``) times in two rounds, a cheap first
    timing of each result and full tuning of the best few: first every result at a few knob
    settings (``gpu.tune.QUICK_KNOBS``; under a deadline, for at most ``FIRST_TIMING_SHARE``
    of the time left), then the fastest ``tune_top`` of those, and the fastest of each other
    form within ``rank.forms.FORM_SLACK`` of them (``rank.forms.to_tune``), tuned over the
    lowering's knobs (``gpu.tune.tune_staged``; under a deadline, until it: ``until``, no
    further setting once one has a time), each keeping the faster of its two timings.
    Compiling every setting of every result would time one or two results in a budget.

    ``sizes`` > 1: each of the first ``sized_forms`` results of that order is followed by its
    structure at up to ``sizes - 1`` other sizes (``rank.size_variants.size_variants``, each
    verified
    against ``program``, for at most ``SIZES_SHARE`` of the time left under a deadline), timed
    like the search's own results.
    """
    stats.ranked_by = BY_COST_MODEL
    if stats.interrupted:  # Ctrl-C asked for what was found, now
        stats.profile_note = "search interrupted: not profiled, ranked by the cost model"
        return ranked
    if profiler is None:
        ok, why = cuda_available()
        if not ok:
            stats.profile_note = f"profile=True but no CUDA GPU ({why}): ranked by the cost model"
            return ranked
        profiler = GpuProfiler()
    if not ranked:
        stats.profile_note = "nothing to profile"
        return ranked
    order = spread(ranked, lambda r: r.graph)
    if sizes > 1:
        sizes_end = (None if deadline is None
                     else clock() + SIZES_SHARE * max(0.0, deadline - clock()))
        order = _with_sizes(order, program, sizes, sized_forms,
                            lambda: sizes_end is not None and clock() >= sizes_end,
                            getattr(profiler, "smem", None))
        ranked = ranked + [r for r in order if all(r is not q for q in ranked)]
    # first timings at a few knob settings where the profiler has them, then full tuning of
    # the fastest; a profiler without (tests' fakes) tunes every result at once
    first_timing = getattr(profiler, "first_timing", None)
    first = first_timing() if callable(first_timing) else profiler
    first_end = deadline
    if deadline is not None and first is not profiler:
        first_end = clock() + FIRST_TIMING_SHARE * max(0.0, deadline - clock())
    found: list[Measurement] = []
    tuned = tuned_extra = 0
    t0 = time.perf_counter()
    try:
        stats.profile_device = profiler.device_name
        found = _measure(first, program, [r.graph for r in order], first_end, clock,
                         least=min_timed)
        if first is not profiler:
            us = {i: m.us for i, m in enumerate(found) if m.status == "ok" and m.us is not None}
            ids = list(us)
            picks, close = to_tune([float(us[i]) for i in ids], [order[i].graph for i in ids],
                                   tune_top)
            top = [ids[k] for k in picks]
            extra = {ids[k] for k in close}
            # tuned until the deadline: a setting is a compile, and a result's whole knob
            # space took longer than its search's share (``GpuProfiler.until``)
            until = getattr(profiler, "until", None)
            tuning = until(deadline, clock) if deadline is not None and callable(until) \
                else profiler
            full = _measure(tuning, program, [order[i].graph for i in top], deadline, clock)
            for i, m in zip(top, full):
                tuned += 1
                tuned_extra += i in extra
                if m.status == "ok" and m.us is not None and m.us < us[i]:
                    found[i] = m
    except KeyboardInterrupt:
        stats.interrupted = True
        stats.profile_note = "profiling interrupted: ranked by the cost model"
        return ranked
    except Exception as exc:
        stats.profile_note = (f"profiling failed ({type(exc).__name__}: {exc}"[:300]
                              + "): ranked by the cost model")
        return ranked
    finally:
        stats.seconds["profile"] = time.perf_counter() - t0
    if not found:
        stats.profile_note = (f"time budget reached before profiling: none of {len(ranked)} "
                              "results measured, ranked by the cost model")
        return ranked
    kept: list[SearchResult] = []
    for r, m in zip(order, found):
        if m.status == "ok" and m.us is not None:
            kept.append(replace(r, measured_us=float(m.us), knobs=dict(m.knobs or {})))
            continue
        if m.status == "wrong":
            stats.profile_wrong += 1
        else:
            stats.profile_failed += 1
        if len(stats.profile_messages) < MAX_MESSAGES:
            stats.profile_messages.append(f"{m.status}: {m.message}")
    stats.ranked_by = BY_GPU
    stats.profile_note = (f"{len(kept)} of {len(found)} results timed on "
                          f"{stats.profile_device}"
                          + (f" (first timings, the fastest {tuned - tuned_extra} tuned"
                             + (f" and the fastest of {tuned_extra} more form(s) close to them"
                                if tuned_extra else "") + ")"
                             if first is not profiler else "")
                          + f"; {stats.profile_failed} failed to lower or run, "
                          f"{stats.profile_wrong} failed the numeric check (dropped)")
    measured = {id(r) for r in order[:len(found)]}
    rest = [r for r in ranked if id(r) not in measured]
    if rest:
        stats.profile_note = (f"time budget reached after profiling {len(found)} of "
                              f"{len(ranked)} results: the rest keep the cost model's order; "
                              + stats.profile_note)
    # the order before profiling breaks ties (it is deterministic: estimate, kernels, text)
    position = {id(r.graph): i for i, r in enumerate(ranked)}
    return sorted(kept, key=lambda r: (r.measured_us, position[id(r.graph)])) + rest


def _measure(profiler: Profiler, program: KernelGraph, graphs: list[KernelGraph],
             deadline: float | None, clock: Callable[[], float],
             least: int = 0) -> list[Measurement]:
    """``graphs`` measured in order: in one call without a deadline, else one at a time until
    ``clock()`` reaches it, the first ``least`` whatever the clock (the measurements of those
    done)."""
    if deadline is None:
        got = profiler.measure(program, graphs) if graphs else []
        if len(got) != len(graphs):
            raise LowerError(f"the profiler returned {len(got)} measurements for "
                             f"{len(graphs)} results")
        return list(got)
    found: list[Measurement] = []
    for h in graphs:
        if len(found) >= least and clock() >= deadline:
            break
        got = profiler.measure(program, [h])
        if len(got) != 1:
            raise LowerError(f"the profiler returned {len(got)} measurements for 1 result")
        found.extend(got)
    return found


def _with_sizes(order: list[SearchResult], program: KernelGraph, sizes: int, forms: int,
                late: Callable[[], bool], smem: int | None = None) -> list[SearchResult]:
    """``order`` with each of its first ``forms`` results followed by its size variants (none
    once ``late()``), their blocks within ``smem`` bytes of shared memory where given (the
    GPU's), checked in worker processes where one check is long."""
    from ..errors import EMError
    from ..mugraph.sizes import DEFAULT_CAPS, with_smem
    from .size_variants import size_variants

    caps = with_smem(DEFAULT_CAPS, smem)
    cost = ProgramCost()
    out: list[SearchResult] = []
    for i, r in enumerate(order):
        out.append(r)
        if i >= forms or late():
            continue
        try:
            variants = size_variants(r.graph, target=program, limit=sizes, caps=caps,
                                     workers=max(1, (os.cpu_count() or 1) - 1))[1:]
        except EMError:
            continue
        for v in variants:
            try:
                estimate = cost.seconds(v)
            except EMError:
                estimate = r.estimated_seconds
            out.append(replace(r, graph=v, estimated_seconds=estimate))
    return out


@dataclass
class Ranked:
    mugraph: KernelGraph
    us: float | None  # measured; None when not timed (no GPU) or every setting failed
    estimated_us: float  # the cost model's estimate (``ProgramCost.seconds``)
    traffic_bytes: int  # the cost model's device-memory traffic (``ProgramCost.traffic_bytes``)
    tuned: TuneResult | None = None


def rank(candidates: Sequence[KernelGraph],
         tuner: Callable[[KernelGraph], TuneResult] | None = None,
         cost: ProgramCost | None = None) -> list[Ranked]:
    """Candidates fastest first. ``tuner`` (e.g. ``lambda h: tune(h, program, compiler=...,
    timer=..., ...)``) is used where given; without it (no GPU, no lowering) the order is the
    cost model's (``cost``, default ``ProgramCost()``), the one the search ranks by. Candidates
    that failed every setting go last, in the cost model's order.
    """
    cost = cost or ProgramCost()
    out = []
    for g in candidates:
        tuned = tuner(g) if tuner is not None else None
        out.append(Ranked(g, None if tuned is None else tuned.us, cost.seconds(g) * 1e6,
                          cost.traffic_bytes(g), tuned))
    return sorted(out, key=lambda r: (r.us is None, r.us or 0.0, r.estimated_us,
                                      r.traffic_bytes))
