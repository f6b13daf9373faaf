"""Budgets of a search: ``max_tasks`` counts work (the same search on any machine), and budgets
or counts that cannot be meant are a ``SearchError`` naming the argument."""

from __future__ import annotations

import concurrent.futures as cf
import math

import pytest
from search_space import TINY
from search_space import texts as _texts

import egraph_mirage as em
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig, SearchError
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.tasks import list_tasks, run_task


@pytest.mark.parametrize("budget", [math.nan, -math.inf, 0, 0.0, -1.5, "60", True])
def test_bad_time_budgets(rmsnorm: em.KernelGraph, budget: object) -> None:
    with pytest.raises(SearchError, match="time_budget"):
        superoptimize(rmsnorm, TINY, time_budget=budget, workers=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("tasks", [0, -3, 2.5, True, "10"])
def test_bad_task_budgets(rmsnorm: em.KernelGraph, tasks: object) -> None:
    with pytest.raises(SearchError, match="max_tasks"):
        superoptimize(rmsnorm, TINY, max_tasks=tasks, workers=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("field, value", [
    ("max_results", 0), ("max_results", -1), ("max_results", 1.5),
    ("numeric_tolerance", -1e-9), ("numeric_tolerance", math.nan), ("numeric_tolerance", "0"),
])
def test_bad_config_values(field: str, value: object) -> None:
    with pytest.raises(SearchError, match=field):
        SearchConfig(**{field: value})  # type: ignore[arg-type]


def test_good_values_are_taken() -> None:
    SearchConfig(max_results=1, numeric_tolerance=0.0)
    SearchConfig(max_results=None, numeric_tolerance=1e-3)


def test_an_infinite_time_budget_is_no_limit(rmsnorm: em.KernelGraph) -> None:
    results = superoptimize(rmsnorm, TINY, time_budget=math.inf, workers=1, progress=False)
    assert results and results.stats.tasks_done == results.stats.tasks_total


def test_max_tasks_searches_the_first_tasks(rmsnorm: em.KernelGraph, tmp_path) -> None:
    """Only the first N tasks of the list run, on any number of workers; a rerun with a larger
    budget resumes them from the checkpoint."""
    payload = prepare(rmsnorm, TINY)
    tasks = list_tasks(payload)
    n = next(i for i, t in enumerate(tasks, 1) if run_task(payload, t).found) + 2
    assert n < len(tasks)
    expected = {f[0] for t in tasks[:n] for f in run_task(payload, t).found}
    path = tmp_path / "search.ckpt"
    one = superoptimize(rmsnorm, TINY, workers=1, max_tasks=n, progress=False, checkpoint=path)
    assert set(_texts(one)) == expected
    st = one.stats
    assert (st.tasks_done, st.tasks_total, st.budget_exhausted) == (n, len(tasks), True)
    with cf.ThreadPoolExecutor(2) as pool:
        threads = superoptimize(rmsnorm, TINY, workers=pool, max_tasks=n, progress=False)
    assert _texts(threads) == _texts(one)
    more = superoptimize(rmsnorm, TINY, workers=1, max_tasks=n + 3, progress=False,
                         checkpoint=path)
    assert more.stats.resumed_tasks == n and more.stats.tasks_done == n + 3
    every = superoptimize(rmsnorm, TINY, workers=1, max_tasks=10 * len(tasks), progress=False)
    assert not every.stats.budget_exhausted and every.stats.tasks_done == len(tasks)


def test_max_results_is_not_a_spent_budget(rmsnorm: em.KernelGraph) -> None:
    results = superoptimize(rmsnorm, SearchConfig(max_results=1), workers=1, max_tasks=10_000,
                            progress=False)
    assert results and not results.stats.budget_exhausted


def test_the_workers_are_as_many_as_fit_in_memory(rmsnorm: em.KernelGraph,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A process checking candidates of a program at its real sizes holds gigabytes: the
    search starts no more workers than fit in the available memory
    (``verify.checks_that_fit``), here none beside itself, and finds the same."""
    import importlib

    n = 6
    alone = superoptimize(rmsnorm, TINY, workers=1, max_tasks=n, progress=False)
    verify_module = importlib.import_module("egraph_mirage.verify.verify")  # not the function
    monkeypatch.setattr(verify_module, "_available_memory", lambda: 0)
    short = superoptimize(rmsnorm, TINY, workers=4, max_tasks=n, progress=False)
    assert short.stats.workers == 1 and alone.stats.workers == 1
    assert _texts(short) == _texts(alone)


@pytest.mark.parametrize("workers", ["this process", "a pool"])
def test_a_search_with_no_result_at_its_soft_deadline_goes_on_to_its_deadline(
        rmsnorm: em.KernelGraph, workers: str) -> None:
    """Where results will be timed on a GPU, a search stops at its share of the budget (the
    soft deadline) only if it has a result to time: one with none goes on to its deadline,
    its tasks resumed where the soft deadline cut them. Here the soft deadline has passed
    before the first task: every task is cut at once (in a pool) or not started, and the
    second round finds the results all the same."""
    import time

    from egraph_mirage.search import SearchStats
    from egraph_mirage.search.run import search_tasks
    from egraph_mirage.search.tasks import Context

    payload = prepare(rmsnorm, TINY)
    ctx = Context(payload)
    tasks = list_tasks(payload, ctx)
    stats, results = SearchStats(), {}  # type: ignore[var-annotated]
    now = time.time()
    pool = cf.ThreadPoolExecutor(2) if workers == "a pool" else None
    try:
        ran_to = search_tasks(rmsnorm, TINY, payload, ctx, tasks, None, stats, results,
                              workers=pool or 1, max_tasks=None, deadline=now + 3600,
                              soft_deadline=now - 1, on_result=None, progress=False,
                              progress_interval=60.0, t_start=time.perf_counter())
    finally:
        if pool is not None:
            pool.shutdown()
    assert results and stats.tasks_done == len(tasks) and not stats.stopped_by
    assert ran_to == now + 3600  # the second round's deadline
