"""A search survives a worker's death (``search.run``): the pool is replaced, the tasks in flight
run again (one that was in a worker when it died at most once more), and the statistics say
what happened. The killing is done by the test itself, at a result (never after a wait).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import sys
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import pytest

import egraph_mirage as em
from egraph_mirage import processes
from egraph_mirage.mugraph.serialize import dumps
from egraph_mirage.search import SearchConfig, SearchResult
from egraph_mirage.search.explain import TASKS_LOST
from egraph_mirage.search.progress import Progress
from egraph_mirage.search.run import Retries, _collect
from egraph_mirage.search.tasks import TaskResult

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

#: rmsnorm_linear's small search: its first result comes at task 29 of these 60, so that tasks
#: are still out when the first result kills a worker
TASKS = 60
CONFIG = SearchConfig()


def test_a_task_in_a_worker_when_it_died_runs_once_more_a_queued_one_freely() -> None:
    r = Retries()
    again, retried, lost = r.after_break(["a", "b", "c"], running={"a"})
    assert (again, retried, lost) == (["a", "b", "c"], ["a"], [])
    again, retried, lost = r.after_break(["a", "c"], running={"a", "c"})
    assert (again, retried, lost) == (["c"], ["c"], ["a"])  # a: in a worker twice
    # no failed task was seen running (a worker died as it took one): every one is struck
    again, retried, lost = Retries().after_break(["x", "y"], running=set())
    assert (again, retried, lost) == (["x", "y"], ["x", "y"], [])


def test_collect_hands_the_tasks_of_a_broken_pool_to_rerun_and_waits_for_their_new_runs(
) -> None:
    """Stand-in futures: one came back, two failed with the pool (one of them seen running);
    ``rerun`` gets both failed ones at once and its new futures are absorbed in their place."""
    done: cf.Future = cf.Future()
    done.set_result(TaskResult("done"))
    ran: cf.Future = cf.Future()
    assert ran.set_running_or_notify_cancel()
    ran.set_exception(BrokenProcessPool("a worker died"))
    queued: cf.Future = cf.Future()
    queued.set_exception(BrokenProcessPool("a worker died"))
    seen: list[Any] = []

    def rerun(failed: list[cf.Future], running: set[cf.Future]) -> list[cf.Future]:
        seen.append((failed, running))
        out = []
        for name in ("ran again", "queued again"):
            f: cf.Future = cf.Future()
            f.set_result(TaskResult(name))
            out.append(f)
        return out

    absorbed: list[str] = []
    assert _collect([done, ran, queued], None, lambda res, fresh: absorbed.append(res.task),
                    [False], Progress("off", 1.0, 0.0), lambda: None, None, rerun)
    assert seen == [([ran, queued], set())]  # finished before the first look: none seen running
    assert absorbed == ["done", "ran again", "queued again"]
    with pytest.raises(BrokenProcessPool):  # without ``rerun``, the failure is the caller's
        _collect([queued], None, lambda res, fresh: None, [False],
                 Progress("off", 1.0, 0.0), lambda: None)


def _kill_a_worker_at_the_first_result(pools: list[Any]) -> Any:
    """An ``on_result`` that kills one worker of the first pool (SIGKILL, as the kernel's
    out-of-memory killer does) when the first result comes."""
    killed: list[int] = []

    def on_result(r: SearchResult) -> None:
        if not killed:
            pid = sorted(pools[0]._processes)[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    return on_result


def test_a_search_whose_worker_is_killed_finishes_with_every_result_and_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    pools: list[Any] = []
    real = processes.worker_pool
    monkeypatch.setattr(processes, "worker_pool", lambda n: pools.append(real(n)) or pools[-1])
    got = em.superoptimize(g, CONFIG, workers=2, max_tasks=TASKS, progress=False,
                           on_result=_kill_a_worker_at_the_first_result(pools))
    calm = em.superoptimize(g, CONFIG, workers=1, max_tasks=TASKS, progress=False)
    st = got.stats
    assert st.workers_lost == 1 and len(pools) == 2  # the pool was replaced once
    assert st.tasks_retried and not st.tasks_lost
    assert st.tasks_done == calm.stats.tasks_done == TASKS and st.stopped_by != TASKS_LOST
    assert [dumps(r.graph) for r in got] == [dumps(r.graph) for r in calm]


def test_on_a_callers_pool_the_tasks_in_flight_are_lost_and_reported() -> None:
    """A caller's executor is not the search's to replace: the tasks in flight on it when a
    worker dies are lost, the search ends with what it found, and says so."""
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    pool = processes.worker_pool(2)
    try:
        got = em.superoptimize(g, CONFIG, workers=pool, max_tasks=TASKS, progress=False,
                               on_result=_kill_a_worker_at_the_first_result([pool]))
    finally:
        processes.stop(pool)
    st = got.stats
    assert st.workers_lost == 1 and st.tasks_lost and len(got) >= 1
    assert st.tasks_done + len(st.tasks_lost) == TASKS and st.stopped_by == TASKS_LOST
