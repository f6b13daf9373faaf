"""The pipeline: one search request run as named stages (``STAGES``), for every entry point.

    scale    — a program too large to check candidates of quickly is searched as a scaled
               copy: the same operators with its large dimensions divided (``pipeline.scaled``)
    prepare  — the oracle saturates the target's expressions (inside the time budget);
               dimension classes (``search.prepare``)
    tasks    — the task list in search order; a checkpoint's finished tasks (``search.tasks``)
    search   — tasks run in worker processes (or any ``concurrent.futures.Executor``), each
               enumerating kernels under e-graph pruning and verifying what it completes
               (``search.run``); where results will be timed on a GPU, the search stops at
               the request's ``search_share`` of the budget if it has a result, and goes on
               while it has none to ``LATE_SHARE`` of the budget before its end (its results,
               if any, then have that long to be profiled)
    resize   — after a scaled search: each structure found re-sized to the program's own
               sizes and verified there; the first ``scaled.KEEP`` that pass are the results
    rank     — verified μGraphs sorted by the cost model (estimated time), ties broken by text
               (``rank.by_cost``)
    profile  — only with ``profile=True``: on a CUDA GPU, each result is tuned and timed and the
               results are re-ranked by measured time (``rank.profile_stage``); results that
               fail to lower or fail the GPU's numeric check are dropped and counted. Without a
               GPU the cost model's ranking stands (``stats.ranked_by`` says which ranking the
               results are in). The time budget covers this stage too
    write    — only with an output folder: every result, the best one and the statistics
               (``pipeline.results_folder``)

A program of several outputs is searched one output at a time and the winners joined
(``pipeline.outputs``).

``em.superoptimize`` (the library), ``egraph-mirage optimize`` (``pipeline.command``), the
``bench`` commands and the torch backend all come here with a ``Request`` (``pipeline.request``):
the stages below this layer import nothing of it, and nothing of each other's orchestration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..graph import KernelGraph
from ..mugraph.serialize import dumps
from ..processes import sigint_deferred
from ..rank import PROFILE_SIZES, Profiler, by_cost, cuda_available, profile_stage
from ..search import SearchConfig, SearchResult, SearchResults, SearchStats
from ..search.checkpoint import Checkpoint
from ..search.explain import no_result_reasons
from ..search.prepare import RulePaths, prepare_with_rules
from ..search.progress import LOG_INTERVAL_S
from ..search.run import search_tasks
from ..search.tasks import Context, Payload, Task, list_tasks
from .outputs import run_outputs
from .request import Request, RequestError
from .results_folder import write_results
from .scaled import resize_reserve, resized, scaled_program

#: where results are timed on a GPU, a search with no result at its share of the budget goes on
#: to this share of the budget before its end (the profiling's time, which it would not need)
LATE_SHARE = 0.1


@dataclass
class Run:
    """What the stages of one search share: the program, the request, and what each stage
    adds."""

    g: KernelGraph
    request: Request
    on_result: Callable[[SearchResult], None] | None = None
    #: the results folder of the ``write`` stage, and what it records of the program
    out: Path | None = None
    program_info: Mapping[str, Any] = field(default_factory=dict)
    stats: SearchStats = field(default_factory=SearchStats)
    t_start: float = field(default_factory=time.perf_counter)
    #: when the time budget runs out (a ``time.time()`` time; None: no budget)
    end: float | None = None
    #: when the search must stop: ``end``, or, when results will be timed on a GPU, the
    #: request's ``search_share`` of the budget
    deadline: float | None = None
    #: a scaled search's own stop, before ``deadline`` (the resize stage's time after it)
    search_deadline: float | None = None
    #: where results will be timed on a GPU: how far a search with no result by its stop goes
    #: on (``search.run.search_tasks``' ``deadline``; its stop is the soft one): to
    #: ``LATE_SHARE`` of the budget before ``end``, less a scaled search's resize reserve
    late_deadline: float | None = None
    payload: Payload | None = None
    ctx: Context | None = None
    tasks: list[Task] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    #: the rule files the oracle loaded, in order
    rule_files: list[Path] = field(default_factory=list)
    #: verified results by μGraph text, as found
    results: dict[str, SearchResult] = field(default_factory=dict)
    ranked: list[SearchResult] = field(default_factory=list)
    #: the program the search stage searches: ``g``, or its scaled copy (``scale`` stage)
    searched: KernelGraph | None = None

    def artefact(self, stage: str) -> Any:
        """What ``stage`` made: "scale" the program searched; "prepare" the payload (reach
        index, inputs' classes, the configuration) and "tasks" the task list; "search" the
        verified results as found (at the sizes searched); "resize" the results at the
        program's sizes; "rank" and "profile" the results best first; "write" the folder (or
        None)."""
        return {"scale": self.searched, "prepare": self.payload, "tasks": self.tasks,
                "search": self.results, "resize": self.results, "rank": self.ranked,
                "profile": self.ranked, "write": self.out}[stage]


def _stage_scale(run: Run) -> None:
    """The program to search: ``g``, or, where the request allows and ``g`` is large, its
    scaled copy (``pipeline.scaled``); the search then stops early enough to leave the resize
    stage its time (``scaled.resize_reserve``)."""
    # anything but a KernelGraph is refused by the prepare stage, with the error it gives
    scaled = (scaled_program(run.g) if run.request.scale and isinstance(run.g, KernelGraph)
              else None)
    run.searched = run.g if scaled is None else scaled
    if scaled is not None:
        run.stats.searched_sizes = [t.dims for t in scaled.inputs]
        if run.deadline is not None:
            left = max(0.0, run.deadline - time.time())
            run.search_deadline = run.deadline - resize_reserve(run.g, left)
            if run.late_deadline is not None:
                run.late_deadline -= resize_reserve(run.g, left)


def _stage_prepare(run: Run) -> None:
    """Saturate the target's e-graph (``search.prepare``, inside the time budget) and build
    this process's context."""
    r = run.request
    assert run.searched is not None
    left = None if run.end is None else max(0.0, run.end - time.time())
    own = run.g if run.searched is not run.g else None  # a scaled copy's own sizes
    run.payload, run.rule_files = prepare_with_rules(run.searched, r.config, r.seed, r.rules,
                                                     r.extra_rules, saturation_seconds=left,
                                                     own=own)
    run.stats.seconds["prepare"] = time.perf_counter() - run.t_start
    run.ctx = Context(run.payload)  # this process's tasks share it; other processes build theirs


def _stage_tasks(run: Run) -> None:
    """The task list, in search order; a checkpoint's finished tasks are taken as done."""
    assert run.payload is not None
    run.tasks = list_tasks(run.payload, run.ctx)
    run.stats.tasks_total = len(run.tasks)
    if run.request.checkpoint is not None:
        run.checkpoint = Checkpoint.open(run.request.checkpoint, run.payload, run.request.seed)


def _stage_search(run: Run) -> None:
    """Run the tasks (``search.run``) until they are done or the search's deadline."""
    r = run.request
    assert run.payload is not None and run.ctx is not None
    assert run.searched is not None
    stop = run.search_deadline or run.deadline
    late = run.late_deadline if run.late_deadline is not None and stop is not None \
        and run.late_deadline > stop else None
    ran_to = search_tasks(run.searched, r.config, run.payload, run.ctx, run.tasks,
                          run.checkpoint, run.stats, run.results, workers=r.process_count(),
                          max_tasks=r.max_tasks, deadline=late or stop,
                          soft_deadline=stop if late else None, on_result=run.on_result,
                          progress=r.progress, progress_interval=r.progress_interval,
                          t_start=run.t_start)
    if late is not None and ran_to == late and run.deadline is not None:
        # the search went on past its stop, having found nothing by then: the resize stage
        # keeps its reserve after the late stop
        run.deadline = max(run.deadline, late + (run.deadline - stop))  # type: ignore[operator]


def _stage_resize(run: Run) -> None:
    """After a scaled search: its results re-sized to the program's own sizes and verified
    there (``scaled.resized``); otherwise nothing."""
    if run.searched is run.g:
        return
    req = run.request
    kept = resized(list(run.results.values()), run.g, run.stats, run.deadline,
                   req.config.numeric_tolerance, req.config.verify_tests, req.seed)
    run.results = {dumps(result.graph): result for result in kept}


def _stage_rank(run: Run) -> None:
    """The verified results best first by the cost model (``rank.by_cost``)."""
    run.ranked = by_cost(list(run.results.values()))


def _stage_profile(run: Run) -> None:
    """With ``profile=True``: re-rank by time measured on the GPU (``rank.profile_stage``).
    Then, in the final order, the statistics that need the whole search (``_finish``)."""
    if run.request.profile:
        run.ranked = profile_stage(run.ranked, run.g, run.stats, run.request.profiler,
                                   deadline=run.end, sizes=PROFILE_SIZES)
    _finish(run)


def _stage_write(run: Run) -> None:
    """With an output folder: the results, the best one and the statistics
    (``pipeline.results_folder``)."""
    if run.out is not None:
        with sigint_deferred():  # the folder is written whole, even on a second Ctrl-C
            write_results(run.out, SearchResults(run.ranked, run.stats), run.program_info)


#: The pipeline as named stages, in order: each reads and extends the ``Run``.
STAGES: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("scale", _stage_scale),
    ("prepare", _stage_prepare),
    ("tasks", _stage_tasks),
    ("search", _stage_search),
    ("resize", _stage_resize),
    ("rank", _stage_rank),
    ("profile", _stage_profile),
    ("write", _stage_write),
)


def run(g: KernelGraph, request: Request,
        on_result: Callable[[SearchResult], None] | None = None,
        on_stage: Callable[[str, Any], None] | None = None, out: Path | None = None,
        program_info: Mapping[str, Any] | None = None) -> SearchResults:
    """Run ``request`` on program ``g`` through ``STAGES``; returns the verified results, best
    first. ``on_result`` is called with each new result as it is found, ``on_stage(name,
    artefact)`` after each stage with what it made (``Run.artefact``); ``out``: the folder the
    ``write`` stage writes (with ``program_info``, e.g. the benchmark's name and batch)."""
    if not isinstance(request, Request):
        raise RequestError("request", f"must be a Request, got {type(request).__name__}")
    if isinstance(g, KernelGraph) and len(g.outputs) > 1:
        # one search per output, the winners joined (``pipeline.outputs``)
        results, _ = run_outputs(g, request, run, on_result=on_result, on_stage=on_stage,
                                 program_info=program_info)
        if out is not None:
            with sigint_deferred():
                write_results(out, results, dict(program_info or {}))
        return results
    end = time.time() + request.time_budget if request.limited() else None
    deadline = end
    timed = request.profile and (request.profiler is not None or cuda_available()[0])
    late = None
    if end is not None and timed:
        deadline = end - (1 - request.search_share) * request.time_budget  # type: ignore[operator]
        late = end - LATE_SHARE * request.time_budget  # type: ignore[operator]
    state = Run(g, request, on_result, out, dict(program_info or {}), end=end,
                deadline=deadline, late_deadline=late)
    for name, stage in STAGES:
        stage(state)
        if on_stage is not None:
            on_stage(name, state.artefact(name))
    return SearchResults(state.ranked, state.stats)


def _finish(run: Run) -> None:
    """The statistics that need the whole search: when the best was found, or why nothing
    was."""
    st = run.stats
    if run.ranked:
        st.seconds_to_best = run.ranked[0].found_after
    else:
        assert run.payload is not None
        searched = run.searched or run.g
        st.no_result_reasons = no_result_reasons(st, searched, run.request.config,
                                                 run.payload.reach.complete, run.rule_files,
                                                 run.request.max_tasks, len(run.results))
        if st.resize_unfit or st.resize_rejected:
            st.no_result_reasons.insert(0, (
                f"the search ran at the scaled sizes {st.searched_sizes}: of what it found, "
                f"{st.resize_unfit} structure(s) do not fit the program's sizes and "
                f"{st.resize_rejected} failed the checks there"))


def superoptimize(g: KernelGraph, config: SearchConfig | None = None,
                  time_budget: float | None = None, workers: Any = None,
                  checkpoint: Any = None, seed: int = 0, progress: bool | None = None,
                  on_result: Callable[[SearchResult], None] | None = None,
                  profile: bool = False, profiler: Profiler | None = None,
                  max_tasks: int | None = None, rules: RulePaths | None = None,
                  extra_rules: RulePaths = (),
                  on_stage: Callable[[str, Any], None] | None = None,
                  progress_interval: float = LOG_INTERVAL_S, scale: bool = True
                  ) -> SearchResults:
    """Search for μGraphs equal to program ``g``; returns them verified, best first.

    ``time_budget`` (seconds, counted from this call; it bounds the profiling too) ends the
    search early; ``max_tasks`` bounds it by work instead: only the first ``max_tasks`` tasks
    of the task list are searched (in the list's order, so the same tasks on any machine and
    with any number of workers; those the checkpoint holds are not run again). ``workers`` is
    a process count (default: every core) or a
    ``concurrent.futures.Executor`` (a Dask ``Client.get_executor()`` runs the search on a
    cluster); ``checkpoint`` names a file that records progress and lets a rerun resume (a
    checkpoint of another program, configuration, seed or rule set is refused); ``seed`` seeds
    the finite-field tests. ``progress`` (default on; False: silent) reports on stderr: a live
    status line on a terminal, else a log line every ``progress_interval`` seconds and one per
    new result, and, first, what a checkpoint resumed (``search.progress``). ``rules`` (rule
    files or folders) replaces the shipped rules and ``extra_rules`` adds to them, as in
    ``Oracle(rules=, extra_rules=)``; the workers search the e-graph saturated under them.

    Results read back from a checkpoint are verified again (finite-field test and float check)
    before they are returned or written; one that fails is dropped with a
    ``checkpoint.CheckpointWarning`` naming its task, and the task is searched again. Worker
    processes need nothing from the caller's main module (``python -``, ``python -c`` and
    notebooks work; ``processes``) and ignore Ctrl-C: a Ctrl-C (``KeyboardInterrupt``) ends
    the search at once with what was found, its workers terminated (``stats.interrupted``).
    ``stats.stopped_by`` says what ended a search early, and when nothing is found
    ``stats.no_result_reasons`` says why (``search.explain``).

    ``profile=True`` ranks the verified results by time measured on the CUDA GPU where torch
    sees one: each is lowered, tuned over the lowering's knobs, checked against PyTorch and
    timed (CUDA-graph replay; trials cached under ``~/.cache/egraph-mirage``); each result gets
    ``measured_us`` and ``knobs``, and results that fail to lower or fail the numeric check are
    dropped (``stats.profile_failed``, ``stats.profile_wrong``). Without a GPU the results keep
    the cost model's order and ``stats.ranked_by`` is "cost model", with the reason in
    ``stats.profile_note``. ``time_budget`` covers the whole job, from the start of this call:
    where results will be timed, the search stops at ``SEARCH_SHARE`` of it, and the rest is
    the profiling's: the best estimated result of each form first, each of the first
    ``rank.measured.PROFILE_SIZES_FORMS`` of them followed by its structure at other sizes
    (the μGraph optimizer's size variants, verified: ``PROFILE_SIZES`` sizes in all), then the
    other results, until the budget runs out; those not reached follow the measured ones in the cost
    model's order (the note says how many were measured).
    ``profiler`` replaces the GPU measurement (a ``rank.measured.GpuProfiler`` with another
    compiler, timer or cache, or a fake in tests). On a GPU machine call
    ``rank.measured.keep_jax_off_the_gpu()`` first (``optimize --profile`` does): the
    verifier's JAX would otherwise take most of the GPU's memory.

    ``scale`` (default on): a program of a real model's sizes is searched as a scaled copy and
    what it finds is re-sized to the program's sizes and verified there (``pipeline.scaled``;
    ``stats.searched_sizes`` says at which sizes; ``on_result`` sees the results as found, at
    those sizes).

    The search runs as the named stages of ``STAGES``; ``on_stage(name, artefact)``, when given,
    is called after each with what it made (``Run.artefact``), for inspection or dumping.
    """
    request = Request.of(config=config, time_budget=time_budget, workers=workers,
                         checkpoint=checkpoint, seed=seed, progress=progress, profile=profile,
                         profiler=profiler, max_tasks=max_tasks, rules=rules,
                         extra_rules=extra_rules, progress_interval=progress_interval,
                         scale=scale)
    return run(g, request, on_result=on_result, on_stage=on_stage)
