"""``em.superoptimize``: the pipeline as named stages (``STAGES``).

    prepare  — the oracle saturates the target's expressions; dimension classes
    tasks    — the task list in search order; a checkpoint's finished tasks
    search   — tasks run in worker processes (or any ``concurrent.futures.Executor``), each
               enumerating kernels under e-graph pruning and verifying what it completes
    rank     — verified μGraphs sorted by the cost model (estimated time), ties broken by text
    profile  — only with ``profile=True``: on a CUDA GPU, each result is tuned and timed
               (``rank.measured``, through ``gpu.tune``) and the results are re-ranked by
               measured time; results that fail to lower or fail the GPU's numeric check are
               dropped and counted. Without a GPU the cost model's ranking stands
               (``stats.ranked_by`` says which ranking the results are in). The time budget
               covers this stage too: results not measured by then keep the cost model's order

A checkpoint file, when given, records every finished task and its results as they arrive; a
rerun with the same file skips those tasks and verifies their results again. Ctrl-C, the time
budget, the task budget and ``max_results`` end the search early with what was found
(``stats.stopped_by`` says which); worker processes are stopped at once (``processes.stop``). When
nothing is found, ``stats.no_result_reasons`` says why (``explain``).
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import processes
from ..graph import KernelGraph
from ..mugraph.serialize import dumps, loads
from ..rank import by_cost
from ..rank.measured import PROFILE_SIZES, SEARCH_SHARE, Profiler, cuda_available, profile_stage
from ..search.checkpoint import Checkpoint, verify_stored
from ..search.config import SearchConfig, SearchError
from ..search.dims import LinkProbe, dim_classes
from ..search.explain import INTERRUPTED, MAX_RESULTS, TASK_BUDGET, TIME_BUDGET, no_result_reasons
from ..search.progress import LOG_INTERVAL_S, Progress, mode
from ..search.reach import ReachIndex
from ..search.results import SearchResult, SearchResults, SearchStats
from ..search.tasks import Context, Payload, TaskResult, list_tasks, run_task
from ..search.tiling import DTensor

#: rule files or folders, as ``Oracle(rules=, extra_rules=)`` takes them; one path is a list of one
RulePaths = Sequence[str | os.PathLike[str]] | str | os.PathLike[str]


def _paths(value: RulePaths | None, name: str) -> list[Path] | None:
    if value is None:
        return None
    items = [value] if isinstance(value, (str, os.PathLike)) else value
    try:
        return [Path(p) for p in items]
    except TypeError:
        raise SearchError(f"superoptimize: {name} must be rule files or folders, got "
                          f"{value!r}") from None


def prepare(g: KernelGraph, config: SearchConfig, seed: int = 0, rules: RulePaths | None = None,
            extra_rules: RulePaths = ()) -> Payload:
    """Stage ``prepare``: saturate the target's e-graph and describe its inputs.

    ``rules`` replaces the shipped rule files, ``extra_rules`` are loaded after them (both as
    in ``Oracle``); the payload records a digest of the files' contents."""
    return _prepare(g, config, seed, rules, extra_rules)[0]


def _prepare(g: KernelGraph, config: SearchConfig, seed: int, rules: RulePaths | None,
             extra_rules: RulePaths) -> tuple[Payload, list[Path]]:
    """``prepare``, and the rule files the oracle loaded (in order)."""
    from ..graph import abstract_term
    from ..oracle import Oracle
    from ..oracle.rules import rule_files, rules_digest

    if not isinstance(g, KernelGraph):
        raise SearchError(f"superoptimize: expected a KernelGraph, got {type(g).__name__}")
    if len(g.outputs) != 1:
        raise SearchError(f"superoptimize: the program must have exactly one output, it has "
                          f"{len(g.outputs)}")
    if any(t.op == "customized" for t in g.operators):
        raise SearchError("superoptimize: the input program already has graph-defined kernels;"
                          " give it as library operators")
    oracle = Oracle(g, rules=_paths(rules, "rules"),
                    extra_rules=_paths(extra_rules, "extra_rules") or (), warn_incomplete=False)
    reach = ReachIndex.from_oracle(oracle)
    classes, out_classes = dim_classes(g, LinkProbe())
    inputs = []
    for i, (t, dcls) in enumerate(zip(g.inputs, classes)):
        cls = reach.classify(abstract_term(t))
        inputs.append(DTensor(i, t.dims, t.dtype, cls, dcls, cls if cls is not None else ("v", i)))
    scalars = sorted(program_scalars(g) | set(config.scalars))
    # the generated prelude (from the op table) is part of the rules the e-graph was built with
    digest = rules_digest(oracle.rule_paths, oracle.prelude)
    payload = Payload(dumps(g), reach, config, tuple(inputs), tuple(scalars), out_classes[0],
                      seed, digest)
    return payload, rule_files(oracle.rule_paths)


def check_budgets(time_budget: Any, max_tasks: Any) -> None:
    """A ``SearchError`` naming the argument unless ``time_budget`` is None or a positive number
    of seconds (``inf``: no limit) and ``max_tasks`` None or a positive integer."""
    if time_budget is not None:
        ok = isinstance(time_budget, (int, float)) and not isinstance(time_budget, bool)
        if not ok or math.isnan(time_budget) or time_budget <= 0:
            raise SearchError(f"superoptimize: time_budget must be a positive number of seconds "
                              f"or None, got {time_budget!r}")
    if max_tasks is not None and (not isinstance(max_tasks, int) or isinstance(max_tasks, bool)
                                  or max_tasks < 1):
        raise SearchError(f"superoptimize: max_tasks must be a positive integer or None, got "
                          f"{max_tasks!r}")


def _workers(workers: Any) -> int | cf.Executor:
    """``workers`` checked: a process count (None: every core) or the caller's Executor."""
    if isinstance(workers, cf.Executor):
        return workers
    n = (os.cpu_count() or 1) if workers is None else workers
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SearchError(f"superoptimize: workers must be a positive integer or an Executor, "
                          f"got {workers!r}")
    return n


@dataclass
class Run:
    """What the stages of one search share: the request, and what each stage adds."""

    g: KernelGraph
    config: SearchConfig
    options: dict[str, Any]
    stats: SearchStats = field(default_factory=SearchStats)
    t_start: float = field(default_factory=time.perf_counter)
    #: when the search must stop (a ``time.time()`` time; None: no budget): the end of the
    #: time budget, or, when results will be timed on a GPU, ``SEARCH_SHARE`` of it
    deadline: float | None = None
    #: when the time budget runs out: it bounds the profiling after the search
    end: float | None = None
    payload: Payload | None = None
    ctx: Context | None = None
    tasks: list[Any] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    #: the rule files the oracle loaded, in order
    rule_files: list[Path] = field(default_factory=list)
    #: verified results by μGraph text, as found
    results: dict[str, SearchResult] = field(default_factory=dict)
    ranked: list[SearchResult] = field(default_factory=list)

    def artefact(self, stage: str) -> Any:
        """What ``stage`` made: "prepare" the payload (reach index, inputs' classes, the
        configuration) and "tasks" the task list; "search" the verified results as found;
        "rank" and "profile" the results best first."""
        return {"prepare": self.payload, "tasks": self.tasks, "search": self.results,
                "rank": self.ranked, "profile": self.ranked}[stage]


def _stage_prepare(run: Run) -> None:
    """Saturate the target's e-graph (``prepare``) and build this process's context."""
    o = run.options
    run.payload, run.rule_files = _prepare(run.g, run.config, o["seed"], o["rules"],
                                           o["extra_rules"])
    run.stats.seconds["prepare"] = time.perf_counter() - run.t_start
    run.ctx = Context(run.payload)  # this process's tasks share it; other processes build theirs


def _stage_tasks(run: Run) -> None:
    """The task list, in search order; a checkpoint's finished tasks are taken as done."""
    assert run.payload is not None
    run.tasks = list_tasks(run.payload, run.ctx)
    run.stats.tasks_total = len(run.tasks)
    if run.options["checkpoint"] is not None:
        run.checkpoint = Checkpoint.open(run.options["checkpoint"], run.payload,
                                         run.options["seed"])


def _stage_search(run: Run) -> None:
    """Run the tasks (in this process, worker processes or the caller's executor). A
    checkpoint's finished tasks are taken as done, their results verified again first."""
    from ..verify import checks_that_fit

    o, stats, payload, ck = run.options, run.stats, run.payload, run.checkpoint
    assert payload is not None and run.ctx is not None
    report = Progress(mode(o["progress"]), o["progress_interval"], run.t_start)
    if ck is not None and (ck.done or ck.partial):
        stored = sum(len(r.found) for r in [*ck.done.values(), *ck.partial.values()])
        if stored:
            report.verifying(ck.path, stored)
        stats.dropped_results = len(verify_stored(ck, run.ctx))
    done: dict[str, TaskResult] = dict(ck.done) if ck else {}
    cut: dict[str, TaskResult] = dict(ck.partial) if ck else {}  # resumed where they stopped
    stats.resumed_tasks, stats.resumed_partial = len(done), len(cut)
    stats.resumed_results = sum(len(r.found) for r in [*done.values(), *cut.values()])
    if ck is not None and (done or cut or stats.dropped_results):
        report.resumed(ck.path, len(done), len(run.tasks), stats.resumed_results,
                       stats.dropped_results, len(cut))
    todo = [t for t in run.tasks[:o["max_tasks"]] if t.name not in done]
    skip = {name: r.progress for name, r in cut.items()}
    deadline = run.deadline
    results = run.results
    enough = [False]  # set once max_results are found

    def absorb(res: TaskResult, fresh: bool) -> None:
        with processes.sigint_deferred():  # a task is recorded whole, or not at all
            new = record(res, fresh)
        for r in new:
            if o["on_result"] is not None:
                o["on_result"](r)
        report.update(stats, results)

    def record(res: TaskResult, fresh: bool) -> list[SearchResult]:
        new = []
        if fresh and ck is not None:
            ck.record(res)  # a task cut short is kept with its progress
        stats.add(res.counts)
        if not res.stopped:  # a task cut short by the time budget is not done
            stats.tasks_done += 1
        for name, secs in res.seconds.items():
            stats.seconds[name] = stats.seconds.get(name, 0.0) + secs
        for text, kernels, est, bound, tests, err, _ in res.found:
            if text not in results:
                r = SearchResult(loads(text), kernels, est, bound, tests, err,
                                 time.perf_counter() - run.t_start,
                                 found_at_task=stats.tasks_done)
                results[text] = r
                if stats.seconds_to_first is None:
                    stats.seconds_to_first = r.found_after
                new.append(r)
                if fresh:
                    report.found(r, len(results))
        if run.config.max_results is not None and len(results) >= run.config.max_results:
            enough[0] = True
        return new

    for res in [*done.values(), *cut.values()]:
        absorb(res, fresh=False)
    workers = _workers(o["workers"])
    asked = workers
    if isinstance(workers, int) and workers > 1:  # a process checking candidates of a large
        workers = min(workers, checks_that_fit(run.g) or workers)  # program takes gigabytes
    stats.workers = workers if isinstance(workers, int) else None
    t_search = time.perf_counter()
    executor: cf.Executor | None = None
    owned = isinstance(workers, int)
    futures: list[cf.Future[TaskResult]] = []
    complete = False  # every submitted task came back
    try:
        if not todo or enough[0]:
            complete = True
        elif workers == 1:
            report.started(len(todo), stats.tasks_total, "in this process")
            for task in todo:
                if enough[0] or (deadline is not None and time.time() > deadline):
                    break
                absorb(run_task(payload, task, deadline, run.ctx, skip.get(task.name, 0)),
                       fresh=True)
            complete = True
        else:
            executor = processes.worker_pool(workers) if isinstance(workers, int) else workers
            fewer = (f" of {asked} asked: more do not fit in memory" if asked != workers
                     else "")
            report.started(len(todo), stats.tasks_total,
                           f"{workers} worker processes{fewer}" if owned
                           else type(executor).__name__)
            # threads of this process share its context; other processes build their own
            shared = run.ctx if isinstance(executor, cf.ThreadPoolExecutor) else None
            futures = [executor.submit(run_task, payload, task, deadline, shared,
                                       skip.get(task.name, 0))
                       for task in todo]
            behind = [0]
            complete = _collect(futures, deadline, absorb, enough, report,
                                lambda: report.update(stats, results, idle=True), behind)
            stats.tasks_left_behind = behind[0]
    except KeyboardInterrupt:
        stats.interrupted = True
    finally:
        with processes.sigint_ignored():  # a second Ctrl-C must not cut the cleanup short
            if executor is not None and owned:
                if complete:
                    executor.shutdown(wait=True)
                else:
                    processes.stop(executor)  # type: ignore[arg-type]
            for fut in futures:
                fut.cancel()
            report.close(stats, results)
    stats.seconds["wall"] = time.perf_counter() - t_search
    limit = len(run.tasks) if o["max_tasks"] is None else min(o["max_tasks"], len(run.tasks))
    if stats.interrupted:
        stats.stopped_by = INTERRUPTED
    elif enough[0]:
        stats.stopped_by = MAX_RESULTS
    elif stats.tasks_done < limit and deadline is not None and time.time() > deadline:
        stats.stopped_by = TIME_BUDGET
    elif stats.tasks_done < stats.tasks_total and limit < stats.tasks_total:
        stats.stopped_by = TASK_BUDGET
    stats.budget_exhausted = stats.stopped_by in (TIME_BUDGET, TASK_BUDGET)


#: seconds one wait for finished tasks lasts at most: a Ctrl-C waits for its end (``_collect``)
WAIT_SLICE_S = 0.5
#: seconds the tasks still running at the deadline have to come back before the search stops
#: without them (their workers are ended): a task stops at its next check of the deadline, but
#: one step of it, the check of a candidate at a large program's real sizes, can take a minute
OVERRUN_S = 15.0


def _collect(futures: list[cf.Future[TaskResult]], deadline: float | None,
             absorb: Callable[[TaskResult, bool], None], enough: list[bool],
             report: Progress, tick: Callable[[], None],
             left_behind: list[int] | None = None) -> bool:
    """Absorb the tasks' results as they come (in the order submitted among those that come
    together); queued tasks are cancelled once the time budget is spent (running ones stop at
    it by themselves, or are left behind ``OVERRUN_S`` seconds later). Wakes every
    ``WAIT_SLICE_S`` seconds for the progress log (which writes at its own interval). Returns
    False when it stopped with tasks still out (``max_results``, or tasks left behind: their
    number in ``left_behind[0]``)."""
    left_behind = [0] if left_behind is None else left_behind
    order = {fut: i for i, fut in enumerate(futures)}
    pending = set(futures)
    while pending:
        # a Ctrl-C is held back while waiting: raised inside ``cf.wait``, it can leave the
        # locks of futures it was taking held, and the pool's manager thread, setting their
        # results, then blocks for ever (and with it the clean-up and the interpreter's exit)
        with processes.sigint_deferred():
            finished, pending = cf.wait(pending, timeout=WAIT_SLICE_S,
                                        return_when=cf.FIRST_COMPLETED)
        for fut in sorted(finished, key=order.__getitem__):
            if not fut.cancelled():
                absorb(fut.result(), True)
            if enough[0]:
                return not pending
        if deadline is not None and time.time() > deadline:
            for fut in pending:
                fut.cancel()
            pending = {fut for fut in pending if not fut.cancelled()}
            if pending and time.time() > deadline + OVERRUN_S:
                left_behind[0] = len(pending)
                report.left_behind(len(pending))
                return False
        tick()
    return True


def _stage_rank(run: Run) -> None:
    """The verified results best first by the cost model (``rank.by_cost``)."""
    run.ranked = by_cost(list(run.results.values()))


def _stage_profile(run: Run) -> None:
    """With ``profile=True``: re-rank by time measured on the GPU (``rank.measured``)."""
    if run.options["profile"]:
        run.ranked = profile_stage(run.ranked, run.g, run.stats, run.options["profiler"],
                                   deadline=run.end, sizes=PROFILE_SIZES)


#: The search as named stages, in order: each reads and extends the ``Run``.
STAGES: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("prepare", _stage_prepare),
    ("tasks", _stage_tasks),
    ("search", _stage_search),
    ("rank", _stage_rank),
    ("profile", _stage_profile),
)


def program_scalars(g: KernelGraph) -> set[float]:
    """The constants of ``g``'s operators, which ``add_scalar`` and ``mul_scalar`` may use in a
    block: every ``scalar`` and every other float parameter (``rms_norm``'s ``eps``, so that
    ``sqrt(mean(x * x) + eps)`` can be built from an accumulated mean)."""
    return {float(v) for t in g.operators for k, v in t.params.items()
            if k == "scalar" or (isinstance(v, float) and math.isfinite(v))}


def superoptimize(g: KernelGraph, config: SearchConfig | None = None,
                  time_budget: float | None = None, workers: Any = None,
                  checkpoint: Any = None, seed: int = 0, progress: bool | None = None,
                  on_result: Callable[[SearchResult], None] | None = None,
                  profile: bool = False, profiler: Profiler | None = None,
                  max_tasks: int | None = None, rules: RulePaths | None = None,
                  extra_rules: RulePaths = (),
                  on_stage: Callable[[str, Any], None] | None = None,
                  progress_interval: float = LOG_INTERVAL_S) -> SearchResults:
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
    notebooks work; ``search.pool``) and ignore Ctrl-C: a Ctrl-C (``KeyboardInterrupt``) ends
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

    The search runs as the named stages of ``STAGES``; ``on_stage(name, artefact)``, when given,
    is called after each with what it made (``Run.artefact``), for inspection or dumping.
    """
    config = config or SearchConfig()
    if not isinstance(config, SearchConfig):
        raise SearchError(f"superoptimize: config must be a SearchConfig, got {config!r}")
    if profiler is not None and not profile:
        raise SearchError("superoptimize: profiler= is used only with profile=True")
    check_budgets(time_budget, max_tasks)
    _workers(workers)
    ok = (isinstance(progress_interval, (int, float)) and not isinstance(progress_interval, bool)
          and progress_interval >= 0)
    if not ok:
        raise SearchError(f"superoptimize: progress_interval must be a number of seconds >= 0, "
                          f"got {progress_interval!r}")
    end = (None if time_budget is None or math.isinf(time_budget)
           else time.time() + time_budget)
    deadline = end
    if end is not None and profile and (profiler is not None or cuda_available()[0]):
        deadline = end - (1 - SEARCH_SHARE) * time_budget  # type: ignore[operator]
    run = Run(g, config, dict(time_budget=time_budget, workers=workers, checkpoint=checkpoint,
                              seed=seed, progress=progress, on_result=on_result, profile=profile,
                              profiler=profiler, max_tasks=max_tasks, rules=rules,
                              extra_rules=extra_rules, progress_interval=progress_interval),
              deadline=deadline, end=end)
    for name, stage in STAGES:
        stage(run)
        if on_stage is not None:
            on_stage(name, run.artefact(name))
    st = run.stats
    if run.ranked:
        st.seconds_to_best = run.ranked[0].found_after
    else:
        assert run.payload is not None
        st.no_result_reasons = no_result_reasons(st, g, config, run.payload.reach.complete,
                                                 run.rule_files, max_tasks, len(run.results))
    return SearchResults(run.ranked, st)
