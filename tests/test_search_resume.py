"""Resuming a search: results read back from a checkpoint are verified again, and the run says
what it resumed."""

from __future__ import annotations

import json
import re

import pytest
from search_space import TINY
from search_space import texts as _texts

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search.checkpoint import CheckpointWarning


def test_an_edited_stored_result_is_verified_again_and_dropped(rmsnorm, tmp_path) -> None:
    """A division turned into a multiplication in a stored μGraph keeps the file's fingerprint;
    the resumed search does not return it, warns naming its task, and searches the task again
    (its true results come back)."""
    path = tmp_path / "search.ckpt"
    first = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    data = json.loads(path.read_text())
    task, k = next((t, i) for t in data["tasks"] for i, f in enumerate(t["found"])
                   if '"op": "div"' in f[0])
    edited = task["found"][k][0].replace('"op": "div"', '"op": "mul"', 1)
    task["found"][k][0] = edited
    path.write_text(json.dumps(data))

    with pytest.warns(CheckpointWarning) as caught:
        again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    (warning,) = [str(w.message) for w in caught if w.category is CheckpointWarning]
    assert f"task {task['task']}:" in warning and "mul" in warning, warning
    assert "fails the finite-field test" in warning and "dropped" in warning
    assert edited not in _texts(again)
    assert _texts(again) == _texts(first)
    st = again.stats
    assert st.dropped_results == 1 and st.resumed_tasks == first.stats.tasks_total - 1
    assert st.tasks_done == first.stats.tasks_total
    assert edited not in path.read_text(), "the checkpoint no longer holds the edited result"


def test_stored_figures_are_computed_again(rmsnorm, tmp_path) -> None:
    """The figures of a stored result that passes (kernels, estimate, error) are not taken from
    the file."""
    path = tmp_path / "search.ckpt"
    first = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                          max_tasks=40)
    assert first, "the first 40 tasks find results"
    data = json.loads(path.read_text())
    for t in data["tasks"]:
        for f in t["found"]:
            f[1], f[2], f[5] = 99, 1e-12, 0.5  # kernels, estimated seconds, numeric error
    path.write_text(json.dumps(data))
    again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                          max_tasks=40)
    assert again.stats.resumed_tasks == 40 and again.stats.dropped_results == 0
    assert [(r.to_json(), r.num_kernels, r.estimated_seconds, r.numeric_error) for r in again] \
        == [(r.to_json(), r.num_kernels, r.estimated_seconds, r.numeric_error) for r in first]


def test_a_resumed_run_says_so(rmsnorm, tmp_path, capsys) -> None:
    path = tmp_path / "search.ckpt"
    superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False, max_tasks=5)
    capsys.readouterr()
    again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, max_tasks=8)
    err = capsys.readouterr().err
    total = again.stats.tasks_total
    assert re.search(rf"resumed from .*search\.ckpt: 5 of {total} tasks done before", err), err
    assert again.stats.resumed_tasks == 5 and again.stats.tasks_done == 8


def test_a_stored_result_of_another_program_is_dropped_not_fatal(rmsnorm, tmp_path) -> None:
    """A stored μGraph whose inputs are not the program's cannot be checked: it is dropped
    with a warning, and the resume goes on."""
    path = tmp_path / "search.ckpt"
    first = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                          max_tasks=40)
    assert first
    other = em.to_json(fixtures.fused("lora", em.benchmarks.get("lora", small=True)))
    data = json.loads(path.read_text())
    task = next(t for t in data["tasks"] if t["found"])
    task["found"][0][0] = other
    path.write_text(json.dumps(data))
    with pytest.warns(CheckpointWarning, match="cannot be checked"):
        again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False,
                              max_tasks=40)
    assert other not in _texts(again) and _texts(again) == _texts(first)
