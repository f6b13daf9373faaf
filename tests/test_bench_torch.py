"""``egraph-mirage bench torch`` without a GPU: the refusal, the ``--cpu-smoke`` run of the small
Llama layer (kernels in Triton's interpreter) with its JSON rows and table, a replaced piece
through a stand-in search, speedups and the table's format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import egraph_mirage as em  # noqa: E402
from egraph_mirage.bench import torch_bench as tb  # noqa: E402
from egraph_mirage.cli import main  # noqa: E402
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats  # noqa: E402

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="--cpu-smoke runs without a GPU")


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Any:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@CPU_ONLY
def test_without_a_gpu_it_refuses_unless_cpu_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "bench", "torch")
    assert code == 2 and not out
    assert err.startswith("error: bench torch needs a CUDA GPU") and "--cpu-smoke" in err
    code, _, err = _run(capsys, "bench", "torch", "--cpu-smoke", "--preset", "llama3_8b")
    assert code == 2 and "small preset only" in err
    code, _, err = _run(capsys, "bench", "torch", "--cpu-smoke", "--example", "/no/such.py")
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1


@CPU_ONLY
def test_the_cpu_smoke_run_writes_json_rows_and_prints_the_table(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    code, out, err = _run(capsys, "bench", "torch", "--cpu-smoke", "--models", "llama",
                          "--batch", "1", "--max-tasks", "1", "--workers", "1",
                          "--cache-dir", str(tmp_path / "cache"), "--out", str(rows_file))
    assert code == 0, err
    rows = json.loads(rows_file.read_text())
    assert [(r["model"], r["batch"], r["mode"]) for r in rows] == [
        ("llama", 1, "eager"), ("llama", 1, "egraph_mirage")]
    assert all(tuple(r) == tb.KEYS for r in rows)
    eager, ours = rows
    assert eager["max_error"] == 0.0 and eager["speedup_vs_eager"] == 1.0
    assert ours["preset"] == "small" and ours["sizes"]["hidden"] == 64
    assert ours["device"] == "cpu" and ours["timing"].startswith("cpu wall clock")
    assert ours["plain_us"] > 0 and ours["graph_us"] is None and ours["compile_s"] > 0
    assert ours["matches_eager"] and ours["error"] is None
    # the pieces have one output each (RMSNorm computed again before each projection), all
    # searched; with one task each nothing is found, so the three pieces holding a matmul and
    # what comes before it are searched again in parts (2 + 3 + 2), two of them programs
    # searched before (RMSNorm, the value projection's shape): found in the cache
    assert ours["pieces"] == 9 + 7 and ours["searches"] == 14 and ours["cache_hits"] == 2
    assert ours["report"].startswith("egraph-mirage: graph")
    assert ours["speedup_vs_best"] == pytest.approx(eager["plain_us"] / ours["plain_us"])
    head, line = out.splitlines()[:2]
    assert head.split()[:4] == ["model", "b", "eager", "µs"] and "ours vs best" in head
    assert line.split()[:2] == ["llama", "1"] and line.split()[-2:] == ["0/16", "0.0e+00"]
    assert "µs: cpu wall clock (Triton interpreter)" in out
    assert f"wrote {rows_file}" in err


class _Same:
    """A search whose one result is the piece's own program (lowered as is); an object without
    a ``__qualname__`` of its own (the cache key names its class)."""

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        return SearchResults([SearchResult(g, 0, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats())


@CPU_ONLY
def test_a_replaced_piece_is_counted_and_checked_against_eager(tmp_path: Path) -> None:
    cfg = tb.TorchBenchConfig(models=("llama",), batches=(1,), preset="small",
                              modes=("eager", "egraph_mirage"), cache_dir=str(tmp_path),
                              workers=1, rest="eager", device="cpu",
                              backend_options={"search": _Same()})
    rows = tb.bench_torch(cfg, timer=tb.CpuTimer(repeats=1), log=lambda _: None)
    ours = rows[-1]
    assert ours["mode"] == "egraph_mirage" and ours["error"] is None
    # one output each, so every piece can be replaced (the program itself, lowered as is)
    assert ours["replaced"] == ours["pieces"] == 9 and ours["matches_eager"]
    assert ours["report"].count(" | replaced: ") == 9


def test_the_hf_layer_where_transformers_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    cfg = tb.TorchBenchConfig(models=("hf",), batches=(2,), preset="small",
                              modes=("eager", "egraph_mirage"), cache_dir=str(tmp_path),
                              max_tasks=1, workers=1, rest="eager", device="cpu")
    rows = tb.bench_torch(cfg, timer=tb.CpuTimer(repeats=1), log=lambda _: None)
    assert [r["mode"] for r in rows] == ["eager", "egraph_mirage"]
    assert rows[-1]["matches_eager"] and rows[-1]["pieces"]


def _row(mode: str, plain: float | None, graph: float | None, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(tb.KEYS)
    row.update({"model": "llama", "batch": 8, "mode": mode, "plain_us": plain,
                "graph_us": graph, "timing": "cuda", "max_error": 1e-3, "matches_eager": True,
                "tolerance": 1e-2, **more})
    return row


def test_speedups_and_the_table() -> None:
    rows = [_row("eager", 20.0, 10.0, max_error=0.0), _row("compile", 16.0, 8.0),
            _row("max-autotune", 15.0, 9.0),
            _row("egraph_mirage", 12.0, 8.0, pieces=4, replaced=2, max_error=2.5e-3)]
    tb._speedups(rows)
    ours = rows[-1]
    assert ours["speedup_vs_eager"] == pytest.approx(20 / 12)
    assert ours["speedup_vs_best"] == pytest.approx(15 / 12)
    assert ours["speedup_vs_best_graph"] == pytest.approx(1.0)
    assert rows[1]["speedup_vs_best"] is None  # only the backend's rows
    hf = [_row("eager", 30.0, 20.0), _row("compile", None, None, error="RuntimeError: boom"),
          _row("egraph_mirage", 40.0, 25.0, pieces=7, replaced=1, max_error=0.5,
               matches_eager=False)]
    for r in hf:
        r["model"] = "hf"
    tb._speedups(hf)
    lines = tb.format_table(rows + hf).splitlines()
    assert lines[0].split() == ["model", "b", "eager", "µs", "compile", "µs", "max-autotune",
                                "µs", "egraph_mirage", "µs", "ours", "vs", "best", "replaced",
                                "ours", "error"]
    assert lines[1].split() == ["llama", "8", "20.0", "/", "10.0", "16.0", "/", "8.0", "15.0",
                                "/", "9.0", "12.0", "/", "8.0", "1.25×", "/", "1.00×", "2/4",
                                "2.5e-03"]
    assert lines[2].split() == ["hf", "8", "30.0", "/", "20.0", "failed", "–", "40.0", "/",
                                "25.0", "(WRONG)", "0.75×", "/", "0.80×", "1/7", "5.0e-01",
                                "WRONG"]
    assert lines[3] == "µs: plain launches / CUDA-graph replay"


def test_the_backend_over_max_autotune_is_compared_with_the_modes_that_are_not_ours() -> None:
    """``egraph_mirage-max-autotune`` (the rest by Inductor's max-autotune) is measured against
    the fastest mode that is not the backend's, never against the backend's other row."""
    rows = [_row("eager", 20.0, 10.0, max_error=0.0), _row("compile", 16.0, 8.0),
            _row("max-autotune", 15.0, 7.5),
            _row("egraph_mirage", 10.0, 6.0, pieces=4, replaced=2),
            _row("egraph_mirage-max-autotune", 14.0, 7.5, pieces=4, replaced=0,
                 max_error=4e-3)]
    tb._speedups(rows)
    assert rows[-1]["speedup_vs_best"] == pytest.approx(15 / 14)
    assert rows[-1]["speedup_vs_best_graph"] == pytest.approx(1.0)
    head, line = tb.format_table(rows).splitlines()[:2]
    assert head.split()[-9:] == ["ours", "vs", "best", "ours-max-autotune", "vs", "best",
                                 "replaced", "ours", "error"]
    assert line.split()[-9:] == ["1.50×", "/", "1.25×", "1.07×", "/", "1.00×", "2/4", "0/4",
                                 "4.0e-03"]


def test_modes_are_timed_in_rounds_the_fastest_plain_round_and_the_median_graph_counting() -> None:
    """Each round times every mode once, one after the other, so a drift of the host's speed
    falls on all modes alike; a mode's plain figure is its fastest round (the host's noise only
    adds time), every round kept, and its graph figure the median."""
    calls: list[str] = []
    plain = {"a": iter([10.0, 30.0, 20.0]), "b": iter([5.0, 1.0, 3.0])}

    class Recording:
        def plain(self, fn: Any, sets: Any) -> float:
            calls.append(fn)
            return next(plain[fn])

        def graph(self, fn: Any, sets: Any) -> float:
            return 2.0

    rows = [_row("compile", None, None, error=None), _row("eager", None, None, error=None)]
    tb._time([(rows[0], "a"), (rows[1], "b")], [], Recording(), graphs=True, rounds=3)
    assert calls == ["a", "b"] * 3
    assert [r["plain_us"] for r in rows] == [10.0, 1.0] and rows[0]["graph_us"] == 2.0
    assert rows[0]["plain_rounds"] == [10.0, 30.0, 20.0]
