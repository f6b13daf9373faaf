"""`bench search` reports when the search reached the structure that won on the GPU.

The GPU's winner comes from `bench gpu` rows (``winner_mugraph``); the search benchmark compares
structures (sizes erased), so a winner timed at another batch still counts. The searches here are
bounded by tasks, not seconds."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import egraph_mirage as em
from egraph_mirage.bench.search_bench import bench_search, format_table, load_winners
from egraph_mirage.cli import main
from egraph_mirage.mugraph.serialize import dumps
from egraph_mirage.mugraph.sizes import retarget, structure_of
from egraph_mirage.pipeline import Request, superoptimize
from egraph_mirage.search import SearchConfig

#: lora's small search finds its first μGraph at task 19 (its tasks of 7 and more operators take
#: seconds each)
TASKS = 24
#: the searches here: the first TASKS tasks, in this process, silent
SMALL = Request(max_tasks=TASKS, workers=1, progress=False)


@pytest.fixture(scope="module")
def lora_results():
    g = em.benchmarks.get("lora", small=True)
    return superoptimize(g, SearchConfig(), max_tasks=TASKS, workers=1, progress=False)


def test_results_record_the_task_they_were_found_in(lora_results) -> None:
    assert lora_results
    tasks = [r.found_at_task for r in lora_results]
    assert all(isinstance(t, int) and 1 <= t <= TASKS for t in tasks)
    by_time = sorted(lora_results, key=lambda r: r.found_after)
    assert [r.found_at_task for r in by_time] == sorted(r.found_at_task for r in by_time)


def test_the_winners_structure_is_found_and_timed(lora_results, tmp_path) -> None:
    last = max(lora_results, key=lambda r: r.found_after)
    first_of_it = min((r for r in lora_results
                       if structure_of(r.graph) == structure_of(last.graph)),
                      key=lambda r: r.found_after)
    # a winner timed at batch 2: the same structure at another size, the batch (one index
    # at batch 1) perhaps on a grid axis of its own; it counts as found where the search found
    # that structure
    big = em.benchmarks.get("lora", small=True, batch=2)
    winner = retarget(last.graph, big)
    assert [t.dims for t in winner.inputs] == [t.dims for t in big.inputs]
    rows = [{"benchmark": "lora", "batch": 2, "winner_mugraph": dumps(winner)},
            {"benchmark": "ntrans", "batch": 1, "winner_mugraph": None}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    winners = load_winners(path)
    assert set(winners) == {"lora"}

    row, = bench_search(["lora"], small=True, request=SMALL,
                        winners=winners)
    assert row["winner_found"] is True
    assert row["tasks_to_winner"] == first_of_it.found_at_task
    assert row["tasks_to_first"] <= row["tasks_to_winner"]
    assert 0 < row["seconds_to_winner"] <= row["seconds_total"]
    assert f"({row['tasks_to_winner']})" in format_table([row])


def test_a_structure_the_search_never_made_is_reported_as_not_found(tmp_path) -> None:
    other = em.benchmarks.get("ntrans", small=True)  # the input program: library operators only
    row, = bench_search(["lora"], small=True, request=SMALL,
                        winners={"lora": other})
    assert row["winner_found"] is False and row["seconds_to_winner"] is None
    assert "not found" in format_table([row])
    row, = bench_search(["lora"], small=True,
                        request=replace(SMALL, max_tasks=1))
    assert row["winner_found"] is None and row["tasks_to_winner"] is None


def test_winners_from_a_file_that_is_not_gpu_rows_are_a_usage_error(
        tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "rows.json"
    bad.write_text('{"benchmark": "lora"}')
    with pytest.raises(ValueError, match=r"rows\.json"):
        load_winners(bad)
    code = main(["bench", "search", "--small", "--programs", "lora", "--max-tasks", "1",
                 "--winners", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --winners") and "Traceback" not in err
    with pytest.raises(ValueError, match=r"missing\.json"):
        load_winners(tmp_path / "missing.json")


#: rmsnorm_linear's small search finds its first μGraph at task 25 (in float16 and bfloat16)
BF16_TASKS = 30


def test_bench_search_in_bfloat16_writes_a_bf16_folder(tmp_path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``--dtype bfloat16`` builds the program in bf16 and writes ``<name>_b<batch>_bf16/`` (the
    float16 layout, ``<name>_b<batch>/``, stays float16's); the row records its dtype."""
    code = main(["bench", "search", "--small", "--programs", "rmsnorm_linear", "--dtype",
                 "bfloat16", "--max-tasks", str(BF16_TASKS), "--workers", "1", "--json",
                 "--out", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    (row,) = json.loads(out)
    assert row["dtype"] == "bfloat16" and row["found"] >= 1
    assert [p.name for p in tmp_path.iterdir()] == ["rmsnorm_linear_b1_bf16"]
    folder = tmp_path / "rmsnorm_linear_b1_bf16"
    files = sorted(folder.glob("result_*.json"))
    assert files and (folder / "best.json").is_file()
    for f in [*files, folder / "best.json"]:
        h = em.load(f)
        assert {t.dtype for t in (*h.inputs, *h.outputs)} == {em.bfloat16}, f
    summary = json.loads((folder / "results.json").read_text())
    assert summary["program"]["dtype"] == "bfloat16"


def test_winners_are_read_from_the_rows_of_the_searched_dtype(tmp_path) -> None:
    """A rows file may hold float16 and bfloat16 rows; a row without ``dtype`` (written before
    ``--dtype``) is float16's."""
    from egraph_mirage.bench import handwritten_fixtures as fixtures

    fp16 = fixtures.lora(em.benchmarks.get("lora", small=True))
    bf16 = fixtures.lora(em.benchmarks.get("lora", small=True, dtype=em.bfloat16))
    rows = [{"benchmark": "lora", "batch": 1, "dtype": "bfloat16", "winner_mugraph": dumps(bf16)},
            {"benchmark": "lora", "batch": 1, "winner_mugraph": dumps(fp16)}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    assert dumps(load_winners(path)["lora"]) == dumps(fp16)
    assert dumps(load_winners(path, em.bfloat16)["lora"]) == dumps(bf16)
    assert load_winners(path, em.float32) == {}
