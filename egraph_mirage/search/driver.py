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
               (``stats.ranked_by`` says which ranking the results are in)

A checkpoint file, when given, records every finished task and its results as they arrive; a
rerun with the same file skips those tasks. Ctrl-C, the time budget and the task budget end the
search early with what was found.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..graph import KernelGraph
from ..mugraph.serialize import dumps, loads
from ..rank import by_cost
from ..rank.measured import Profiler, profile_stage
from .checkpoint import Checkpoint
from .config import SearchConfig, SearchError
from .dims import LinkProbe, dim_classes
from .reach import ReachIndex
from .results import SearchResult, SearchResults, SearchStats
from .tasks import Context, Payload, TaskResult, list_tasks, run_task
from .tiling import DTensor

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
    from ..graph import abstract_term
    from ..oracle import Oracle
    from ..oracle.rules import rules_digest

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
    scalars = sorted({float(t.params["scalar"]) for t in g.operators if "scalar" in t.params}
                     | set(config.scalars))
    # the generated prelude (from the op table) is part of the rules the e-graph was built with
    digest = rules_digest(oracle.rule_paths, oracle.prelude)
    return Payload(dumps(g), reach, config, tuple(inputs), tuple(scalars), out_classes[0], seed,
                   digest)


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


def _executor(workers: Any) -> tuple[cf.Executor | None, bool]:
    """(executor, whether we own it). ``workers``: None (all cores), an int, or an Executor."""
    if isinstance(workers, cf.Executor):
        return workers, False
    n = (os.cpu_count() or 1) if workers is None else workers
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SearchError(f"superoptimize: workers must be a positive integer or an Executor, "
                          f"got {workers!r}")
    if n == 1:
        return None, False
    import multiprocessing

    return cf.ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")), True


@dataclass
class Run:
    """What the stages of one search share: the request, and what each stage adds."""

    g: KernelGraph
    config: SearchConfig
    options: dict[str, Any]
    stats: SearchStats = field(default_factory=SearchStats)
    t_start: float = field(default_factory=time.perf_counter)
    payload: Payload | None = None
    ctx: Context | None = None
    tasks: list[Any] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
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
    run.payload = prepare(run.g, run.config, o["seed"], o["rules"], o["extra_rules"])
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
    """Run the tasks (in this process, worker processes or the caller's executor)."""
    o, stats, config, payload, ck = run.options, run.stats, run.config, run.payload, run.checkpoint
    done: dict[str, TaskResult] = dict(ck.done) if ck else {}
    stats.resumed_tasks = len(done)
    todo = [t for t in run.tasks[:o["max_tasks"]] if t.name not in done]
    deadline = None if o["time_budget"] is None else time.time() + o["time_budget"]
    show = sys.stderr.isatty() if o["progress"] is None else o["progress"]
    results = run.results
    enough = [False]  # set once max_results are found

    def absorb(res: TaskResult, fresh: bool) -> None:
        stats.add(res.counts)
        if not res.stopped:  # a task cut short by the time budget is not done
            stats.tasks_done += 1
        for name, secs in res.seconds.items():
            stats.seconds[name] = stats.seconds.get(name, 0.0) + secs
        for text, kernels, est, bound, tests, err, _ in res.found:
            if text not in results:
                r = SearchResult(loads(text), kernels, est, bound, tests, err,
                                 time.perf_counter() - run.t_start)
                results[text] = r
                if stats.seconds_to_first is None:
                    stats.seconds_to_first = r.found_after
                if o["on_result"] is not None:
                    o["on_result"](r)
        if config.max_results is not None and len(results) >= config.max_results:
            enough[0] = True
        if fresh and ck is not None and not res.stopped:
            ck.record(res)
        if show:
            _status(stats, results)

    for res in done.values():
        absorb(res, fresh=False)
    executor, owned = _executor(o["workers"])
    t_search = time.perf_counter()
    try:
        if executor is None:
            for task in todo:
                if enough[0]:
                    break
                if deadline is not None and time.time() > deadline:
                    stats.budget_exhausted = True
                    break
                absorb(run_task(payload, task, deadline, run.ctx), fresh=True)
        else:
            # threads of this process share its context; other processes build their own
            shared = run.ctx if isinstance(executor, cf.ThreadPoolExecutor) else None
            futures = [executor.submit(run_task, payload, task, deadline, shared)
                       for task in todo]
            try:
                for fut in cf.as_completed(futures):
                    absorb(fut.result(), fresh=True)
                    if enough[0]:
                        break
            finally:
                for fut in futures:
                    fut.cancel()
    except KeyboardInterrupt:
        stats.interrupted = True
    finally:
        if owned and executor is not None:
            executor.shutdown(wait=not stats.interrupted, cancel_futures=True)
        if show:
            sys.stderr.write("\n")
    stats.seconds["wall"] = time.perf_counter() - t_search
    max_tasks = o["max_tasks"]
    if stats.tasks_done < stats.tasks_total and (
            deadline is not None
            or (max_tasks is not None and max_tasks < stats.tasks_total and not enough[0])):
        stats.budget_exhausted = True


def _stage_rank(run: Run) -> None:
    """The verified results best first by the cost model (``rank.by_cost``)."""
    run.ranked = by_cost(list(run.results.values()))


def _stage_profile(run: Run) -> None:
    """With ``profile=True``: re-rank by time measured on the GPU (``rank.measured``)."""
    if run.options["profile"]:
        run.ranked = profile_stage(run.ranked, run.g, run.stats, run.options["profiler"])


#: The search as named stages, in order: each reads and extends the ``Run``.
STAGES: tuple[tuple[str, Callable[[Run], None]], ...] = (
    ("prepare", _stage_prepare),
    ("tasks", _stage_tasks),
    ("search", _stage_search),
    ("rank", _stage_rank),
    ("profile", _stage_profile),
)


def superoptimize(g: KernelGraph, config: SearchConfig | None = None,
                  time_budget: float | None = None, workers: Any = None,
                  checkpoint: Any = None, seed: int = 0, progress: bool | None = None,
                  on_result: Callable[[SearchResult], None] | None = None,
                  profile: bool = False, profiler: Profiler | None = None,
                  max_tasks: int | None = None, rules: RulePaths | None = None,
                  extra_rules: RulePaths = (),
                  on_stage: Callable[[str, Any], None] | None = None) -> SearchResults:
    """Search for μGraphs equal to program ``g``; returns them verified, best first.

    ``time_budget`` (seconds) ends the search early; ``max_tasks`` bounds it by work instead:
    only the first ``max_tasks`` tasks of the task list are searched (in the list's order, so
    the same tasks on any machine and with any number of workers; those the checkpoint holds
    are not run again). ``workers`` is a process count (default: every core) or a
    ``concurrent.futures.Executor`` (a Dask ``Client.get_executor()`` runs the search on a
    cluster); ``checkpoint`` names a file that records progress and lets a rerun resume (a
    checkpoint of another program, configuration, seed or rule set is refused); ``seed`` seeds
    the finite-field tests; ``progress`` prints a live status line (default: when stderr is a
    terminal). ``rules`` (rule files or folders) replaces the shipped rules and
    ``extra_rules`` adds to them, as in ``Oracle(rules=, extra_rules=)``; the workers search
    the e-graph saturated under them.

    ``profile=True`` ranks the verified results by time measured on the CUDA GPU where torch
    sees one: each is lowered, tuned over the lowering's knobs, checked against PyTorch and
    timed (CUDA-graph replay; trials cached under ``~/.cache/egraph-mirage``); each result gets
    ``measured_us`` and ``knobs``, and results that fail to lower or fail the numeric check are
    dropped (``stats.profile_failed``, ``stats.profile_wrong``). Without a GPU the results keep
    the cost model's order and ``stats.ranked_by`` is "cost model", with the reason in
    ``stats.profile_note``; ``time_budget`` bounds the search, not the profiling after it.
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
    run = Run(g, config, dict(time_budget=time_budget, workers=workers, checkpoint=checkpoint,
                              seed=seed, progress=progress, on_result=on_result, profile=profile,
                              profiler=profiler, max_tasks=max_tasks, rules=rules,
                              extra_rules=extra_rules))
    for name, stage in STAGES:
        stage(run)
        if on_stage is not None:
            on_stage(name, run.artefact(name))
    if run.ranked:
        run.stats.seconds_to_best = run.ranked[0].found_after
    return SearchResults(run.ranked, run.stats)


def _status(stats: SearchStats, results: dict[str, SearchResult]) -> None:
    best = min(results.values(), key=lambda r: r.estimated_seconds, default=None)
    line = (f"\rtasks {stats.tasks_done}/{stats.tasks_total} | states {stats.states:,} | "
            f"pruned {stats.pruned_by_oracle:,} by e-graph, {stats.pruned_otherwise:,} other | "
            f"verified {stats.candidates_verified} ({stats.candidates_rejected} rejected) | "
            f"found {len(results)}")
    if best is not None:
        line += f" | best {best.num_kernels} kernel(s) ~{best.estimated_seconds * 1e6:.1f} µs"
    sys.stderr.write(line[:200])
    sys.stderr.flush()

