"""The search stage's mechanics: run the task list in this process, in worker processes or on
the caller's executor, absorbing each task's results as they come.

A checkpoint's finished tasks are taken as done (their results verified again first), and tasks
a time budget had cut short resume where they stopped. Ctrl-C, the time budget, the task budget
and ``max_results`` end the search early with what was found (``stats.stopped_by`` says which);
worker processes are stopped at once (``processes.stop``).

A worker process that dies (killed for memory, by a signal, or crashed) breaks its pool, and
every task in flight on it fails. The search replaces the pool (``MAX_POOL_RESTARTS`` times at
most) and runs those tasks again: a task that was in a worker when it died is run once more
(``TASK_ATTEMPTS``) and then given up, a task that was only queued is run again freely
(``Retries``). ``stats.workers_lost``, ``tasks_retried`` and ``tasks_lost`` say what happened;
the search goes on with the other tasks. A caller's executor is not ours to replace: the tasks
in flight on it when it breaks are lost.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool

from .. import processes
from ..graph import KernelGraph
from ..mugraph.serialize import loads
from ..verify import checks_that_fit
from .checkpoint import Checkpoint, verify_stored
from .config import SearchConfig
from .explain import INTERRUPTED, MAX_RESULTS, TASK_BUDGET, TASKS_LOST, TIME_BUDGET
from .progress import Progress, mode
from .results import SearchResult, SearchStats
from .tasks import Context, Payload, Task, TaskResult, dispatch_order, run_task


def search_tasks(g: KernelGraph, config: SearchConfig, payload: Payload, ctx: Context,
                 tasks: list[Task], checkpoint: Checkpoint | None, stats: SearchStats,
                 results: dict[str, SearchResult], *, workers: int | cf.Executor,
                 max_tasks: int | None, deadline: float | None,
                 on_result: Callable[[SearchResult], None] | None, progress: bool | None,
                 progress_interval: float, t_start: float,
                 soft_deadline: float | None = None) -> float | None:
    """Run ``tasks`` (the first ``max_tasks``; those ``checkpoint`` finished are taken as
    done), adding each new verified result to ``results`` (by μGraph text) and the counts to
    ``stats``, until they are done, ``deadline`` (a ``time.time()`` time) passes,
    ``config.max_results`` are found or Ctrl-C. ``workers``: a process count (1: this process)
    or the caller's executor. ``soft_deadline`` (before ``deadline``): the tasks first run to
    it; a search that has a result by then stops there (what is left of the time is its
    results' profiling), and one that has none goes on to ``deadline`` (it has nothing to
    profile), its tasks cut at the first resumed where they stopped. Returns the deadline the
    search last ran to (``soft_deadline`` or ``deadline``)."""
    ck = checkpoint
    report = Progress(mode(progress), progress_interval, t_start)
    if ck is not None and (ck.done or ck.partial):
        stored = sum(len(r.found) for r in [*ck.done.values(), *ck.partial.values()])
        if stored:
            report.verifying(ck.path, stored)
        stats.dropped_results = len(verify_stored(ck, ctx))
    done: dict[str, TaskResult] = dict(ck.done) if ck else {}
    cut: dict[str, TaskResult] = dict(ck.partial) if ck else {}  # resumed where they stopped
    stats.resumed_tasks, stats.resumed_partial = len(done), len(cut)
    stats.resumed_results = sum(len(r.found) for r in [*done.values(), *cut.values()])
    if ck is not None and (done or cut or stats.dropped_results):
        report.resumed(ck.path, len(done), len(tasks), stats.resumed_results,
                       stats.dropped_results, len(cut))
    todo = [t for t in tasks[:max_tasks] if t.name not in done]
    skip = {name: r.progress for name, r in cut.items()}
    finished: set[str] = set()  # the tasks run to their end here
    enough = [False]  # set once max_results are found
    rounds = [deadline] if soft_deadline is None or deadline is None or \
        soft_deadline >= deadline else [soft_deadline, deadline]
    stop = rounds[0]  # the deadline of the round running

    def unfinished() -> list[Task]:
        """The tasks a round runs: those not run to their end (a cut one resumes at ``skip``)."""
        return [t for t in todo if t.name not in finished]

    def absorb(res: TaskResult, fresh: bool) -> None:
        with processes.sigint_deferred():  # a task is recorded whole, or not at all
            new = record(res, fresh)
        for r in new:
            if on_result is not None:
                on_result(r)
        report.update(stats, results)

    def record(res: TaskResult, fresh: bool) -> list[SearchResult]:
        new = []
        if fresh and ck is not None:
            ck.record(res)  # a task cut short is kept with its progress
        stats.add(res.counts)
        if not res.stopped:  # a task cut short by the time budget is not done
            stats.tasks_done += 1
            finished.add(res.task)
        else:
            skip[res.task] = res.progress
        for name, secs in res.seconds.items():
            stats.seconds[name] = stats.seconds.get(name, 0.0) + secs
        for text, kernels, est, bound, tests, err, _ in res.found:
            if text not in results:
                r = SearchResult(loads(text), kernels, est, bound, tests, err,
                                 time.perf_counter() - t_start,
                                 found_at_task=stats.tasks_done)
                results[text] = r
                if stats.seconds_to_first is None:
                    stats.seconds_to_first = r.found_after
                new.append(r)
                if fresh:
                    report.found(r, len(results))
        if config.max_results is not None and len(results) >= config.max_results:
            enough[0] = True
        return new

    for res in [*done.values(), *cut.values()]:
        absorb(res, fresh=False)
    asked = workers
    if isinstance(workers, int) and workers > 1:  # a process checking candidates of a large
        workers = min(workers, checks_that_fit(g) or workers)  # program takes gigabytes
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
            for stop in rounds:
                for task in unfinished():
                    if enough[0] or (stop is not None and time.time() > stop):
                        break
                    absorb(run_task(payload, task, stop, ctx, skip.get(task.name, 0)),
                           fresh=True)
                if results or enough[0]:
                    break
            complete = True
        else:
            executor = processes.worker_pool(workers) if isinstance(workers, int) else workers
            fewer = (f" of {asked} asked: more do not fit in memory" if asked != workers
                     else "")
            report.started(len(todo), stats.tasks_total,
                           f"{workers} worker processes{fewer}" if owned
                           else type(executor).__name__)
            # threads of this process share its context; other processes build their own
            shared = ctx if isinstance(executor, cf.ThreadPoolExecutor) else None
            task_of: dict[cf.Future[TaskResult], Task] = {}

            def submit(task: Task) -> cf.Future[TaskResult]:
                assert executor is not None
                fut = executor.submit(run_task, payload, task, stop, shared,
                                      skip.get(task.name, 0))
                task_of[fut] = task
                return fut

            retries, restarts = Retries(), [0]

            def rerun(failed: list[cf.Future[TaskResult]], running: set[cf.Future[TaskResult]]
                      ) -> list[cf.Future[TaskResult]]:
                """A worker died: a new pool for the tasks in flight (``Retries``)."""
                nonlocal executor
                was_running = {task_of[f].name for f in running}
                by_name = {task_of[f].name: task_of.pop(f) for f in failed}
                again, retried, lost = retries.after_break(list(by_name), was_running)
                stats.workers_lost += 1
                can = owned and restarts[0] < MAX_POOL_RESTARTS
                report.worker_lost(len(again), len(retried), len(lost), can)
                if not can:  # a caller's executor, or too many deaths: every one is lost
                    stats.tasks_lost += list(by_name)
                    return []
                stats.tasks_retried += retried
                stats.tasks_lost += lost
                restarts[0] += 1
                processes.stop(executor)  # type: ignore[arg-type]
                executor = processes.worker_pool(workers)  # type: ignore[arg-type]
                return [submit(by_name[n]) for n in again]

            # handed out in the pool's order (the lead split tasks first where each gets a
            # worker), absorbed as the list orders those that come back together; a caller's
            # executor of the standard library's kinds (the backend's pool) says its size,
            # another is taken as one worker
            size = workers if isinstance(workers, int) else getattr(workers, "_max_workers", 1)
            for stop in rounds:
                left = unfinished()
                handed = {t.name: submit(t) for t in dispatch_order(left, ctx, int(size))}
                futures = [handed[t.name] for t in left]
                behind = [0]
                complete = _collect(futures, stop, absorb, enough, report,
                                    lambda: report.update(stats, results, idle=True), behind,
                                    rerun)
                stats.tasks_left_behind = behind[0]
                if results or enough[0] or not complete:
                    break
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
    limit = len(tasks) if max_tasks is None else min(max_tasks, len(tasks))
    if stats.interrupted:
        stats.stopped_by = INTERRUPTED
    elif enough[0]:
        stats.stopped_by = MAX_RESULTS
    elif stats.tasks_done < limit and stop is not None and time.time() > stop:
        stats.stopped_by = TIME_BUDGET
    elif stats.tasks_lost:
        stats.stopped_by = TASKS_LOST
    elif stats.tasks_done < stats.tasks_total and limit < stats.tasks_total:
        stats.stopped_by = TASK_BUDGET
    stats.budget_exhausted = stats.stopped_by in (TIME_BUDGET, TASK_BUDGET)
    return stop


#: seconds one wait for finished tasks lasts at most: a Ctrl-C waits for its end (``_collect``)
WAIT_SLICE_S = 0.5
#: seconds the tasks still running at the deadline have to come back before the search stops
#: without them (their workers are ended): a task stops at its next check of the deadline, but
#: one step of it, the check of a candidate at a large program's real sizes, can take a minute
OVERRUN_S = 15.0
#: times a search replaces its pool of workers after one died before it gives up the tasks out
MAX_POOL_RESTARTS = 3
#: times a task may be in a worker when one dies before it is given up
TASK_ATTEMPTS = 2


class Retries:
    """Which tasks run again after a worker died: a task that was running (in a worker, or
    handed to one) gets a strike, and at ``TASK_ATTEMPTS`` strikes it is given up; a task that
    was only queued runs again without one. Where none of the failed tasks was seen running (a
    worker died as it took its task), all of them get a strike."""

    def __init__(self, attempts: int = TASK_ATTEMPTS) -> None:
        self.attempts = attempts
        self.strikes: dict[str, int] = {}

    def after_break(self, failed: Sequence[str], running: set[str]
                    ) -> tuple[list[str], list[str], list[str]]:
        """The failed tasks (by name, in order) split into those to run again, those of them
        that were running (retried), and those given up."""
        struck = {n for n in failed if n in running} or set(failed)
        again, retried, lost = [], [], []
        for name in failed:
            if name in struck:
                self.strikes[name] = self.strikes.get(name, 0) + 1
            if self.strikes.get(name, 0) >= self.attempts:
                lost.append(name)
                continue
            again.append(name)
            if name in struck:
                retried.append(name)
        return again, retried, lost


Rerun = Callable[[list[cf.Future[TaskResult]], set[cf.Future[TaskResult]]],
                 list[cf.Future[TaskResult]]]


def _collect(futures: list[cf.Future[TaskResult]], deadline: float | None,
             absorb: Callable[[TaskResult, bool], None], enough: list[bool],
             report: Progress, tick: Callable[[], None],
             left_behind: list[int] | None = None, rerun: Rerun | None = None) -> bool:
    """Absorb the tasks' results as they come (in the order submitted among those that come
    together); queued tasks are cancelled once the time budget is spent (running ones stop at
    it by themselves, or are left behind ``OVERRUN_S`` seconds later). Wakes every
    ``WAIT_SLICE_S`` seconds for the progress log (which writes at its own interval). Returns
    False when it stopped with tasks still out (``max_results``, or tasks left behind: their
    number in ``left_behind[0]``).

    Tasks that fail because a worker died (``BrokenProcessPool``) are handed to
    ``rerun(failed, seen_running)``, with those of them seen running, once every task in
    flight on the broken pool has come back; what it returns (the same tasks submitted again)
    is waited for in their place. Without ``rerun`` the failure is raised."""
    left_behind = [0] if left_behind is None else left_behind
    order = {fut: i for i, fut in enumerate(futures)}
    pending = set(futures)
    running: set[cf.Future[TaskResult]] = set()  # seen running, not yet back
    while pending:
        running = {f for f in pending if f in running or f.running()}
        # a Ctrl-C is held back while waiting: raised inside ``cf.wait``, it can leave the
        # locks of futures it was taking held, and the pool's manager thread, setting their
        # results, then blocks for ever (and with it the clean-up and the interpreter's exit)
        with processes.sigint_deferred():
            finished, pending = cf.wait(pending, timeout=WAIT_SLICE_S,
                                        return_when=cf.FIRST_COMPLETED)
        broken = [f for f in finished if not f.cancelled() and rerun is not None
                  and isinstance(f.exception(), BrokenProcessPool)]
        if broken:  # every task in flight on the pool fails now: wait for all of them
            with processes.sigint_deferred():
                more, pending = cf.wait(pending, timeout=OVERRUN_S)
            finished |= more
            broken = [f for f in finished if not f.cancelled()
                      and isinstance(f.exception(), BrokenProcessPool)]
            finished -= set(broken)
        for fut in sorted(finished, key=order.__getitem__):
            if not fut.cancelled():
                absorb(fut.result(), True)
            if enough[0]:
                return not pending
        if broken and rerun is not None:
            again = rerun(sorted(broken, key=order.__getitem__), running & set(broken))
            order.update((f, len(order) + i) for i, f in enumerate(again))
            pending |= set(again)
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


