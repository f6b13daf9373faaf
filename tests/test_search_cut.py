"""Tasks cut short by the time budget keep their progress: the checkpoint holds each one's
results so far and the units (``tasks.Units``) it finished, and a rerun resumes it from there
instead of from its start.

The cut is simulated deterministically: ``_Run.stopped`` (what a task asks to know whether
its deadline has passed) answers yes once the task has walked a number of states."""

from __future__ import annotations

import json
from typing import Any

import pytest
from search_space import TINY, texts

from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import tasks
from egraph_mirage.search.prepare import prepare_with_rules as _prepare
from egraph_mirage.search.tasks import Units, context, list_tasks, run_task

#: states after which a task is "out of time"
CUT = 12


def cut_after(states: int) -> Any:
    return lambda run: run.counters.states >= states


def test_units_count_what_was_finished_and_skip_it() -> None:
    stop = [False]
    units = Units(2, lambda: stop[0])
    seen = []
    for x in units(range(10)):
        seen.append(x)
        stop[0] = x == 4  # the deadline passes while unit 4 runs
    assert seen == [2, 3, 4] and units.done == 4 and units.offered == 5


def test_a_cut_task_resumed_finds_what_the_whole_task_finds(rmsnorm: Any,
                                                            monkeypatch: Any) -> None:
    payload, _ = _prepare(rmsnorm, TINY, 0, None, ())
    ctx = context(payload)
    runs = {t.name: run_task(payload, t, None, ctx) for t in list_tasks(payload, ctx)}
    name = max(runs, key=lambda n: runs[n].counts["states"])  # the longest task
    task = next(t for t in list_tasks(payload, ctx) if t.name == name)
    whole = runs[name]
    assert not whole.stopped and whole.progress >= 3
    with monkeypatch.context() as m:  # out of time halfway through
        m.setattr(tasks._Run, "stopped", cut_after(whole.counts["states"] // 2))
        cut = run_task(payload, task, None, ctx)
    assert cut.stopped and 0 < cut.progress < whole.progress
    rest = run_task(payload, task, None, ctx, skip=cut.progress)
    assert not rest.stopped and rest.progress == whole.progress
    assert {f[0] for f in whole.found} <= {f[0] for f in [*cut.found, *rest.found]}
    # the walks of the units done before are not walked again
    assert rest.counts["states"] < whole.counts["states"]


def test_a_rerun_resumes_cut_tasks_where_they_stopped(rmsnorm: Any, tmp_path: Any,
                                                      monkeypatch: Any) -> None:
    full = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    path = tmp_path / "search.ckpt"
    with monkeypatch.context() as m:
        m.setattr(tasks._Run, "stopped", cut_after(CUT))
        first = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    data = json.loads(path.read_text())
    partial = {e["task"]: e["progress"] for e in data["partial"]}
    assert partial and any(p > 0 for p in partial.values())
    assert first.stats.tasks_done == full.stats.tasks_total - len(partial)

    again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    st = again.stats
    assert st.resumed_partial == len(partial) and st.resumed_tasks == first.stats.tasks_done
    assert st.tasks_done == st.tasks_total
    assert set(texts(again)) >= set(texts(full))
    assert again.best.estimated_seconds == pytest.approx(full.best.estimated_seconds)
    assert not json.loads(path.read_text())["partial"], "every task is done now"
