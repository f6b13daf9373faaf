"""``egraph-mirage bench gpu`` without a GPU: argument parsing, the row schema with a fake timer,
μGraph files from the search (ours) beside the hand-written reference (never ours), the
reports, and imports with egglog and JAX hidden."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import egraph_mirage as em
from egraph_mirage.bench import gpu_bench as gb
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.cli import _parser, main
from egraph_mirage.errors import DTypeError, GraphError
from egraph_mirage.gpu.floor import Floor
from egraph_mirage.gpu.torch_eval import torch_function
from egraph_mirage.rank.forms import form_label
from egraph_mirage.rank.size_variants import size_variants as real_size_variants

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = {"benchmark", "batch", "device", "ours_us", "ours_graph_us", "baselines_us",
            "baselines_graph_us", "speedup_vs_best", "speedup_vs_best_graph", "floor_us",
            "reference_us", "reference_graph_us", "reference_candidate", "ours_vs_reference",
            "ours_vs_reference_graph"}
SIZES = "egraph_mirage.rank.size_variants"


def _sizes(monkeypatch: pytest.MonkeyPatch, fn: Any) -> None:
    """Stand ``fn`` in for ``rank.size_variants.size_variants`` (imported by the bench when
    called)."""
    monkeypatch.setitem(sys.modules, SIZES, types.SimpleNamespace(size_variants=fn))


@pytest.fixture
def one_size(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, Any, Any]]:
    """Each search result at its own sizes only; the calls are recorded."""
    calls: list[tuple[Any, Any, Any]] = []

    def size_variants(g: em.KernelGraph, target: Any = None, limit: Any = None,
                      workers: int = 1, caps: Any = None) -> list[Any]:
        calls.append((g, target, limit))
        return [g]

    _sizes(monkeypatch, size_variants)
    return calls


def _search_file(folder: Path, name: str, batch: int = 1, h: Any = None) -> Path:
    """A μGraph file in the layout the search's results are read from (``DIR/<name>_b<b>.json``);
    unless ``h`` is given, the reference's first form stands in for what the search found."""
    g = em.benchmarks.get(name, batch=batch, small=True)
    path = folder / f"{name}_b{batch}.json"
    em.save(fixtures.fused(name, g) if h is None else h, path)
    return path


class FakeTimer:
    """A figure per program: baselines are slower than ours by a known factor."""

    def plain(self, fn: Any, sets: Any) -> float:
        fn(*sets[0])
        return 20.0 if getattr(fn, "ours", False) else 40.0

    def graph(self, fn: Any, sets: Any) -> float:
        fn(*sets[0])
        return 10.0 if getattr(fn, "ours", False) else 15.0


def _compiler(h: em.KernelGraph, knobs: dict[str, Any]) -> Any:
    fn = torch_function(h)

    def ours(*xs: Any) -> Any:
        return fn(*xs)

    ours.ours = True  # type: ignore[attr-defined]
    return ours


def _cfg(**kw: Any) -> gb.GpuBenchConfig:
    base = dict(programs=["rmsnorm_linear", "mqa"], batches=[1, 2], use_compile=False,
                tune=False, small=True, device="cpu")
    return gb.GpuBenchConfig(**(base | kw))


def test_parse_bench_gpu_arguments() -> None:
    a = _parser().parse_args(["bench", "gpu"])
    assert a.batch == [1, 8, 16] and a.programs is None and a.mugraph_dir is None
    assert not (a.json or a.no_compile or a.max_autotune or a.no_tune or a.no_cache)
    assert not a.from_search and a.budget is None and a.max_candidates is None
    a = _parser().parse_args(["bench", "gpu", "--json", "--batch", "1", "8", "--programs", "gqa",
                              "lora", "--mugraph-dir", "d", "--no-compile", "--markdown", "m.md",
                              "--plot", "p.png", "--cache-dir", "c"])
    assert a.batch == [1, 8] and a.programs == ["gqa", "lora"] and a.mugraph_dir == "d"
    assert a.json and a.no_compile and (a.markdown, a.plot, a.cache_dir) == ("m.md", "p.png", "c")
    a = _parser().parse_args(["bench", "gpu", "--from-search", "--budget", "60",
                              "--workers", "2", "--max-candidates", "4"])
    assert a.from_search and (a.budget, a.workers, a.max_candidates) == (60, 2, 4)
    assert a.size_variants is None and not a.no_reference
    a = _parser().parse_args(["bench", "gpu", "--size-variants", "3", "--no-reference"])
    assert a.size_variants == 3 and a.no_reference


def test_bench_gpu_without_cuda_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["bench", "gpu", "--batch", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_rows_with_a_fake_timer(tmp_path: Path, one_size: list[Any]) -> None:
    for b in (1, 2):
        _search_file(tmp_path, "rmsnorm_linear", b)
        _search_file(tmp_path, "mqa", b)
    logs: list[str] = []
    rows = gb.bench_gpu(_cfg(mugraph_dir=str(tmp_path)), timer=FakeTimer(), floor=Floor(4e12),
                        compiler=_compiler, device_name="fake", log=logs.append)
    assert [(r["benchmark"], r["batch"]) for r in rows] == [
        ("rmsnorm_linear", 1), ("mqa", 1), ("rmsnorm_linear", 2), ("mqa", 2)]
    json.dumps(rows)  # plain data
    for r in rows:
        assert REQUIRED <= set(r) and set(gb.KEYS) <= set(r)
        assert r["device"] == "fake" and r["source"] == "search"
        assert r["mugraph_file"] == str(tmp_path / f"{r['benchmark']}_b{r['batch']}.json")
        assert r["size_variant"] == 0 and r["search_results"] == r["candidates"] == 1
        assert r["ours_us"] == 20.0 and r["ours_graph_us"] == 10.0
        assert r["reference_us"] == 20.0 and r["reference_graph_us"] == 10.0
        assert r["reference_candidate"].startswith("reference[")
        assert r["reference_candidates"] == len(r["reference_candidates_us"]) > 1
        assert r["speedup_vs_best"] == 2.0 and r["speedup_vs_best_graph"] == 1.5
        assert r["ours_vs_reference"] == r["ours_vs_reference_graph"] == 1.0
        assert r["floor_us"] > 0 and r["floor_fraction_graph"] == r["floor_us"] / 10.0
        assert r["knobs"] == r["reference_knobs"] == {} and r["notes"] == []
    assert [len(c) for c in one_size] == [3] * 4 and all(c[2] is None for c in one_size)
    assert [c[1].inputs[0].dims for c in one_size] == [  # each verified against its program
        em.benchmarks.get(r["benchmark"], batch=r["batch"], small=True).inputs[0].dims
        for r in rows]
    assert set(rows[0]["baselines_us"]) == {"eager"}
    assert set(rows[1]["baselines_us"]) == {"eager", "sdpa"}
    assert len(logs) == 4 and logs[0].startswith("rmsnorm_linear b=1: ours (search ")
    assert "reference (hand-written, best of" in logs[0]
    table = gb.format_table(rows)
    head = table.splitlines()[0].split()
    assert head[:7] == ["program", "b", "floor", "ours", "ours+graph", "ref", "ref+graph"]
    assert "sdpa+graph" in head and head[-3:] == ["ref/ours", "ref/ours+graph",
                                                  "floor/ours+graph"]
    lines = table.splitlines()
    assert len(lines) == 11 and lines[5] == ""  # 4 rows, then the candidates' table
    assert lines[6].split()[:5] == ["program", "b", "timed", "forms", "winner"]
    for r in rows:  # one candidate each: its form, no correlation from one timing
        assert r["winner_form"] == form_label(em.load(r["mugraph_file"]))
        assert r["forms_timed"] == 1 and r["cost_model_rank_corr"] is None
        assert r["form_us"] == {r["winner_form"]: r["candidates_us"][r["mugraph_file"]]}
        assert r["first_us"] and all(us > 0 for us in r["first_us"].values())


def test_a_row_without_search_results_still_times_baselines_and_reference() -> None:
    """No ``--mugraph-dir``: ours is empty, never filled from the reference; the row says so."""
    logs: list[str] = []
    seen: list[dict] = []
    rows = gb.bench_gpu(_cfg(batches=[1]), timer=FakeTimer(), floor=Floor(4e12),
                        compiler=_compiler, device_name="fake", log=logs.append,
                        on_row=seen.append)
    assert seen == rows  # each row handed on as it is measured (`bench gpu --rows`)
    for r in rows:
        assert REQUIRED <= set(r) and set(gb.KEYS) <= set(r)
        assert r["source"] == "search" and r["mugraph_file"] is None
        assert r["search_results"] == r["candidates"] == 0 and r["candidates_us"] == {}
        assert r["ours_us"] is r["ours_graph_us"] is r["knobs"] is None
        assert r["speedup_vs_best"] is r["speedup_vs_best_graph"] is None
        assert r["ours_vs_reference"] is r["floor_fraction_graph"] is None
        assert r["reference_us"] == 20.0 and r["reference_graph_us"] == 10.0
        assert r["baselines_us"]["eager"] == 40.0 and r["baselines_graph_us"]["eager"] == 15.0
        assert r["notes"] == [f"{gb.NO_SEARCH_RESULT} (no --mugraph-dir or --from-search)"]
    assert logs[0].startswith("rmsnorm_linear b=1: ours (search, best of 0) – / – µs")
    assert "–" in gb.format_table(rows)


def test_an_empty_search_folder_says_where_it_looked(tmp_path: Path) -> None:
    (r,) = gb.bench_gpu(_cfg(programs=["lora"], batches=[1], mugraph_dir=str(tmp_path)),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=lambda m: None)
    assert r["ours_us"] is None and r["reference_us"] == 20.0
    assert r["notes"] == [f"{gb.NO_SEARCH_RESULT} (no μGraph for lora at batch 1 in {tmp_path})"]


def test_the_reference_can_be_left_out(tmp_path: Path, one_size: list[Any]) -> None:
    _search_file(tmp_path, "ntrans")
    (r,) = gb.bench_gpu(_cfg(programs=["ntrans"], batches=[1], mugraph_dir=str(tmp_path),
                             reference=False),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=lambda m: None)
    assert r["ours_us"] == 20.0 and r["reference_us"] is None and r["reference_candidates"] == 0
    assert r["reference_candidate"] is None and r["ours_vs_reference"] is None


def test_a_timer_that_profiles_kernels_adds_our_per_kernel_times(tmp_path: Path,
                                                                 one_size: list[Any]) -> None:
    class ProfilingTimer(FakeTimer):
        profiled = 0

        def kernels(self, fn: Any, sets: Any) -> dict[str, float]:
            assert getattr(fn, "ours", False)  # only our lowering is profiled
            self.profiled += 1
            return {"kernel_0": 7.5, "kernel_1": 2.5}

    _search_file(tmp_path, "rmsnorm_linear")
    cfg = _cfg(programs=["rmsnorm_linear"], batches=[1], mugraph_dir=str(tmp_path))
    timer = ProfilingTimer()
    rows = gb.bench_gpu(cfg, timer=timer, floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=lambda m: None)
    assert rows[0]["kernel_us"] == {"kernel_0": 7.5, "kernel_1": 2.5}
    assert timer.profiled == 1  # ours, not the reference
    assert "kernel_us" not in gb.bench_gpu(cfg, timer=FakeTimer(), floor=Floor(4e12),
                                           compiler=_compiler, device_name="fake",
                                           log=lambda m: None)[0]
    assert "kernel_us" not in gb.bench_gpu(_cfg(programs=["rmsnorm_linear"], batches=[1]),
                                           timer=ProfilingTimer(), floor=Floor(4e12),
                                           compiler=_compiler, device_name="fake",
                                           log=lambda m: None)[0]  # no ours, nothing profiled


def test_rows_without_a_lowering(tmp_path: Path, one_size: list[Any]) -> None:
    _search_file(tmp_path, "rmsnorm_linear")
    rows = gb.bench_gpu(_cfg(batches=[1], mugraph_dir=str(tmp_path)), timer=FakeTimer(),
                        floor=Floor(4e12), compiler=None, device_name="fake", log=lambda m: None)
    for r in rows:
        assert r["ours_us"] is None and r["speedup_vs_best"] is None
        assert r["reference_us"] is None and r["ours_vs_reference"] is None
        assert r["baselines_us"]["eager"] == 40.0
        assert "no lowering yet: reference not measured" in r["notes"]
    assert "no lowering yet: ours not measured" in rows[0]["notes"]
    assert rows[0]["candidates"] == 1 and not one_size  # nothing to expand without a lowering
    assert "–" in gb.format_table(rows)


def test_rows_with_the_lowering_in_triton_s_interpreter(tmp_path: Path,
                                                         one_size: list[Any]) -> None:
    """``compiler="auto"`` finds ``KernelGraph.compile``; without CUDA it runs interpreted."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("with a GPU the lowering compiles for it; the GPU tests cover that")
    from egraph_mirage.gpu.tune import default_compiler

    if default_compiler() is None:
        pytest.skip("no lowering yet")
    _search_file(tmp_path, "ntrans")  # ours for ntrans; none for rmsnorm_linear
    rows = gb.bench_gpu(_cfg(programs=["rmsnorm_linear", "ntrans"], batches=[1],
                             mugraph_dir=str(tmp_path)),
                        timer=FakeTimer(), floor=Floor(4e12), device_name="fake",
                        log=lambda m: None)
    for r in rows:  # the fake times every program alike
        assert r["reference_us"] == 40.0
    assert rows[0]["ours_us"] is None and rows[0]["notes"][0].startswith(gb.NO_SEARCH_RESULT)
    assert rows[1]["ours_us"] == 40.0 and rows[1]["notes"] == []


def test_wrong_ours_is_not_timed(tmp_path: Path, one_size: list[Any]) -> None:
    def wrong(h: em.KernelGraph, knobs: dict[str, Any]) -> Any:
        fn = torch_function(h)
        return lambda *xs: [o * 2 for o in fn(*xs)]

    _search_file(tmp_path, "ntrans")
    (r,) = gb.bench_gpu(_cfg(programs=["ntrans"], batches=[1], mugraph_dir=str(tmp_path)),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=wrong,
                        device_name="fake", log=lambda m: None)
    assert r["ours_us"] is None and r["reference_us"] is None and r["mugraph_file"] is None
    for who in ("ours", "reference"):
        assert any(n.startswith(f"{who}: no setting") and "wrong" in n for n in r["notes"])


def test_single_mugraph_files(tmp_path: Path, one_size: list[Any]) -> None:
    """``DIR/<name>_b<batch>.json`` and ``DIR/<name>_b<batch>_*.json``: μGraphs saved by hand."""
    g = em.benchmarks.get("lora", batch=2, small=True)
    em.save(fixtures.lora(g), tmp_path / "lora_b2.json")
    em.save(fixtures.lora_concat(g), tmp_path / "lora_b2_1.json")
    em.save(fixtures.lora(em.benchmarks.get("lora", small=True)), tmp_path / "lora_b1.json")
    found = gb.candidates("lora", 2, g, str(tmp_path))
    assert len(found.graphs) == 2 and found.source == "search"
    assert found.files == [str(tmp_path / "lora_b2.json"), str(tmp_path / "lora_b2_1.json")]
    gm = em.benchmarks.get("gated_mlp", batch=2, small=True)
    found = gb.candidates("gated_mlp", 2, gm, str(tmp_path))  # none: never the reference
    assert found.graphs == [] and found.files == [] and found.source == "search"
    assert gb.candidates("lora", 2, g, None).graphs == []
    (tmp_path / "lora_b2_1.json").unlink()
    em.save(fixtures.lora(em.benchmarks.get("lora", small=True)), tmp_path / "lora_b2_2.json")
    with pytest.raises(GraphError, match="differ"):
        gb.candidates("lora", 2, g, str(tmp_path))
    (tmp_path / "lora_b2_2.json").unlink()
    (r,) = gb.bench_gpu(_cfg(programs=["lora"], batches=[2], mugraph_dir=str(tmp_path)),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=lambda m: None)
    assert r["source"] == "search" and r["ours_us"] == 20.0 and r["candidates"] == 1
    assert r["mugraph_file"] == str(tmp_path / "lora_b2.json")


class DtypeTimer(FakeTimer):
    """A ``FakeTimer`` that records the dtypes of every input it times."""

    def __init__(self) -> None:
        self.seen: set[Any] = set()

    def plain(self, fn: Any, sets: Any) -> float:
        self.seen |= {x.dtype for x in sets[0]}
        return super().plain(fn, sets)


def test_bf16_rows_time_bf16_programs_from_bf16_files(tmp_path: Path,
                                                      one_size: list[Any]) -> None:
    """``dtype=bfloat16``: ours comes from the ``_bf16`` files alone (and float16 from the
    others), ours, the reference and the baselines all run on bf16 inputs, and the row records
    its dtype; a table of rows of both dtypes gets a dtype column."""
    import torch

    gbf = em.benchmarks.get("rmsnorm_linear", small=True, dtype=em.bfloat16)
    bf_file = tmp_path / "rmsnorm_linear_b1_bf16.json"
    em.save(fixtures.fused("rmsnorm_linear", gbf), bf_file)
    fp_file = _search_file(tmp_path, "rmsnorm_linear")  # rmsnorm_linear_b1.json: float16's
    timer = DtypeTimer()
    cfg = _cfg(programs=["rmsnorm_linear"], batches=[1], mugraph_dir=str(tmp_path))
    (bf,) = gb.bench_gpu(replace(cfg, dtype=em.bfloat16), timer=timer, floor=Floor(4e12),
                         compiler=_compiler, device_name="fake", log=lambda m: None)
    assert bf["dtype"] == "bfloat16" and bf["notes"] == []
    assert bf["mugraph_file"] == str(bf_file) and bf["search_results"] == 1
    assert bf["ours_us"] == 20.0 and bf["reference_us"] == 20.0
    assert bf["baselines_us"] == {"eager": 40.0} and bf["reference_candidates"] > 1
    assert timer.seen == {torch.bfloat16}
    assert {t.dtype for t in em.load(bf["mugraph_file"]).inputs} == {em.bfloat16}
    (fp,) = gb.bench_gpu(cfg, timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                         device_name="fake", log=lambda m: None)
    assert fp["dtype"] == "float16" and fp["mugraph_file"] == str(fp_file)
    assert fp["search_results"] == 1  # rmsnorm_linear_b1_bf16.json is not one of float16's

    assert "dtype" not in gb.format_table([fp]).split()  # one dtype: the table as it was
    lines = gb.format_table([fp, bf]).splitlines()
    assert lines[0].split()[:4] == ["program", "b", "dtype", "floor"]
    assert lines[1].split()[:3] == ["rmsnorm_linear", "1", "fp16"]
    assert lines[2].split()[:3] == ["rmsnorm_linear", "1", "bf16"]
    assert lines[4].split()[:3] == ["program", "b", "dtype"]  # the candidates' table too
    text = gb.markdown([fp, bf], "2026-11-28", "egraph-mirage bench gpu")
    assert "bf16 and fp16 (the dtype column), µs" in text
    assert "| rmsnorm_linear | 1 | bf16 |" in text
    assert "bf16, µs" in gb.markdown([bf], "2026-11-28", "egraph-mirage bench gpu")
    old = {k: v for k, v in fp.items() if k != "dtype"}  # a row written before --dtype
    assert gb.format_table([old, bf]).splitlines()[1].split()[2] == "fp16"


def test_a_mugraph_of_the_other_dtype_is_refused(tmp_path: Path) -> None:
    """A search folder of one dtype is never timed as another's: found where the requested
    dtype's results are read, it is an error naming the file (never retargeted, never a
    misfit); where the other dtype's folder alone exists, the row's note says so."""
    g16 = em.benchmarks.get("rmsnorm_linear", small=True)
    gbf = em.benchmarks.get("rmsnorm_linear", small=True, dtype=em.bfloat16)
    folder = tmp_path / "rmsnorm_linear_b1_bf16"
    folder.mkdir()
    em.save(fixtures.fused("rmsnorm_linear", g16), folder / "result_0.json")  # float16 inside
    with pytest.raises(DTypeError, match=re.escape(str(folder / "result_0.json"))
                       + r": a μGraph in float16, but rmsnorm_linear is timed in bfloat16"):
        gb.candidates("rmsnorm_linear", 1, gbf, str(tmp_path))
    folder.rename(tmp_path / "rmsnorm_linear_bf16")  # a search at one batch: would retarget
    with pytest.raises(DTypeError, match="float16, but rmsnorm_linear is timed in bfloat16"):
        gb.candidates("rmsnorm_linear", 2, em.benchmarks.get(
            "rmsnorm_linear", batch=2, small=True, dtype=em.bfloat16), str(tmp_path))
    (tmp_path / "rmsnorm_linear_bf16").rename(tmp_path / "rmsnorm_linear_b1")  # float16's name
    assert gb.candidates("rmsnorm_linear", 1, g16, str(tmp_path)).graphs  # right for float16
    found = gb.candidates("rmsnorm_linear", 1, gbf, str(tmp_path))  # never read for bfloat16
    assert found.graphs == [] and found.notes == [
        f"{tmp_path / 'rmsnorm_linear_b1'} holds float16 results, not read for bfloat16 "
        f"(those are read from {tmp_path / 'rmsnorm_linear_b1_bf16'})"]
    (tmp_path / "rmsnorm_linear_b1" / "result_0.json").write_text(
        em.to_json(fixtures.fused("rmsnorm_linear", gbf)))  # bfloat16 under float16's name
    with pytest.raises(DTypeError, match="bfloat16, but rmsnorm_linear is timed in float16"):
        gb.candidates("rmsnorm_linear", 1, g16, str(tmp_path))


def test_bench_gpu_dtype_reaches_the_bench_and_a_folder_of_the_other_is_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        one_size: list[Any]) -> None:
    """``bench gpu --dtype bfloat16`` without a GPU: CUDA and the copy bandwidth faked, the
    configuration the command builds measured on the CPU with the fake timer."""
    import torch

    import egraph_mirage.gpu.floor as gpu_floor

    seen: list[gb.GpuBenchConfig] = []
    real = gb.bench_gpu

    def on_cpu(cfg: gb.GpuBenchConfig, **kw: Any) -> list[dict[str, Any]]:
        seen.append(cfg)
        return real(replace(cfg, device="cpu", small=True), timer=FakeTimer(),
                    floor=kw["floor"], compiler=_compiler, device_name="fake",
                    log=lambda m: None, on_row=kw.get("on_row"))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_floor, "measure_copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(gb, "bench_gpu", on_cpu)
    gbf = em.benchmarks.get("lora", small=True, dtype=em.bfloat16)
    em.save(fixtures.lora(gbf), tmp_path / "lora_b1_bf16.json")
    argv = ["bench", "gpu", "--batch", "1", "--programs", "lora", "--mugraph-dir",
            str(tmp_path), "--no-compile", "--no-tune", "--no-cache", "--json"]
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert seen[-1].dtype is em.bfloat16 and row["dtype"] == "bfloat16"
    assert row["mugraph_file"] == str(tmp_path / "lora_b1_bf16.json")
    assert main(argv) == 0  # float16: the bf16 file is not float16's
    (row,) = json.loads(capsys.readouterr().out)
    assert seen[-1].dtype is em.float16 and row["dtype"] == "float16" and row["ours_us"] is None

    (tmp_path / "lora_b1").mkdir()  # a bfloat16 search under float16's name
    em.save(fixtures.lora(gbf), tmp_path / "lora_b1" / "best.json")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]  # after the copy bandwidth's line: one error line
    assert last.startswith(f"error: {tmp_path / 'lora_b1' / 'best.json'}: a μGraph in bfloat16")


class TimesByMugraph:
    """A fake timer and compiler: each μGraph (by its JSON) runs in the time given for it."""

    def __init__(self, us: dict[str, float], default: float = 40.0) -> None:
        self.us, self.default = us, default

    def compiler(self, h: em.KernelGraph, knobs: dict[str, Any]) -> Any:
        fn = torch_function(h)

        def ours(*xs: Any) -> Any:
            return fn(*xs)

        ours.us = self.us.get(em.to_json(h), self.default)  # type: ignore[attr-defined]
        return ours

    def plain(self, fn: Any, sets: Any) -> float:
        fn(*sets[0])
        return getattr(fn, "us", self.default)

    graph = plain


def test_optimize_folders_are_what_bench_gpu_reads(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str],
                                                   one_size: list[Any]) -> None:
    """``optimize --out DIR/<name>_b<batch>`` (or ``DIR/<name>``) writes what ``bench gpu
    --mugraph-dir DIR`` reads: every result is timed, the fastest is reported with its file."""
    folder = tmp_path / "rmsnorm_linear_b1"
    assert main(["optimize", "rmsnorm_linear", "--small", "--workers", "1", "--max-results", "3",
                 "--out", str(folder)]) == 0
    capsys.readouterr()
    files = [str(folder / f"result_{k}.json") for k in range(3)]
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    found = gb.candidates("rmsnorm_linear", 1, g, str(tmp_path))
    assert found.source == "search" and found.files == files  # best.json is result_0 again
    texts = [em.to_json(h) for h in found.graphs]
    assert texts[0] == em.to_json(em.load(folder / "best.json"))

    fake = TimesByMugraph({texts[0]: 9.0, texts[1]: 12.0, texts[2]: 5.0})
    (r,) = gb.bench_gpu(_cfg(programs=["rmsnorm_linear"], batches=[1],
                             mugraph_dir=str(tmp_path)),
                        timer=fake, floor=Floor(4e12), compiler=fake.compiler,
                        device_name="fake", log=lambda m: None)
    assert r["source"] == "search" and r["candidates"] == 3
    assert r["candidates_us"] == dict(zip(files, (9.0, 12.0, 5.0)))
    assert r["mugraph_file"] == files[2] and r["ours_graph_us"] == 5.0  # not the cost model's
    assert r["speedup_vs_best_graph"] == 8.0 and r["notes"] == []

    # a faster hand-written reference fills its own column; ours stays the search's
    hand = fixtures.variants("rmsnorm_linear", g)
    fake.us[em.to_json(hand[-1])] = 2.5
    (r,) = gb.bench_gpu(_cfg(programs=["rmsnorm_linear"], batches=[1],
                             mugraph_dir=str(tmp_path)),
                        timer=fake, floor=Floor(4e12), compiler=fake.compiler,
                        device_name="fake", log=lambda m: None)
    assert r["source"] == "search" and r["mugraph_file"] == files[2]
    assert r["candidates"] == 3 and set(r["candidates_us"]) == set(files)
    assert r["ours_us"] == r["ours_graph_us"] == 5.0 and r["speedup_vs_best_graph"] == 8.0
    assert r["reference_us"] == r["reference_graph_us"] == 2.5
    assert r["reference_candidate"] == f"reference[{len(hand) - 1}]"
    assert r["reference_candidates"] == len(hand) == len(r["reference_candidates_us"])
    assert r["ours_vs_reference"] == r["ours_vs_reference_graph"] == 0.5

    few = gb.candidates("rmsnorm_linear", 1, g, str(tmp_path), max_candidates=2)
    assert few.files == files[:2] and few.notes == [
        "timed 2 of 3 μGraphs, the best of each form first"]
    for f in files:  # a folder with best.json alone
        Path(f).unlink()
    assert gb.candidates("rmsnorm_linear", 1, g, str(tmp_path)).files == [
        str(folder / "best.json")]

    folder.rename(tmp_path / "rmsnorm_linear")  # DIR/<name>/: a search at one batch
    assert len(gb.candidates("rmsnorm_linear", 1, g, str(tmp_path)).graphs) == 1
    g2 = em.benchmarks.get("rmsnorm_linear", batch=2, small=True)
    other = gb.candidates("rmsnorm_linear", 2, g2, str(tmp_path))  # one search, every batch
    assert [_sig(h) for h in other.graphs] == [_sig(g2)]
    assert other.files == [f"{tmp_path / 'rmsnorm_linear' / 'best.json'}@b2"]
    assert "retargeted to batch 2" in other.notes[0]
    assert em.verify(other.graphs[0], g2).equivalent
    (tmp_path / "rmsnorm_linear").rename(tmp_path / "rmsnorm_linear_b1")  # another batch's
    again = gb.candidates("rmsnorm_linear", 2, g2, str(tmp_path))
    assert again.files == [f"{tmp_path / 'rmsnorm_linear_b1' / 'best.json'}@b2"]
    (tmp_path / "rmsnorm_linear_b1").rename(tmp_path / "rmsnorm_linear_b2")  # named: must fit
    with pytest.raises(GraphError, match="differ"):
        gb.candidates("rmsnorm_linear", 2, g2, str(tmp_path))


def test_retargeted_results_are_ordered_by_the_cost_model_at_the_new_batch(
        tmp_path: Path) -> None:
    """A search at b = 1 ranks split-KV attention above the one-kernel form whose grid holds
    only the heads (too few blocks there); retargeted to b = 16, where the heads alone fill the
    GPU, the one-kernel form comes first, and a budget of one candidate times it."""
    g1 = em.benchmarks.get("mha", small=True)
    g16 = em.benchmarks.get("mha", batch=16, small=True)
    folder = tmp_path / "mha"
    folder.mkdir()
    split, one = fixtures.attention(g1), fixtures.attention_one_kernel(g1)
    for k, h in enumerate((split, one)):  # the search's order at b = 1
        (folder / f"result_{k}.json").write_text(em.to_json(h))
    files = [str(folder / f"result_{k}.json") for k in range(2)]
    assert gb.candidates("mha", 1, g1, str(tmp_path)).files == files  # its own batch: as found

    found = gb.candidates("mha", 16, g16, str(tmp_path))
    assert found.files == [f"{files[1]}@b16", f"{files[0]}@b16"]
    assert [form_label(h) for h in found.graphs] == ["1 kernel", "2 kernels"]
    assert "ordered by the cost model at these shapes" in found.notes[-1]
    first = gb.candidates("mha", 16, g16, str(tmp_path), max_candidates=1)
    assert first.files == [f"{files[1]}@b16"]


def test_tuning_takes_the_fastest_few_and_the_fastest_of_a_close_form(
        tmp_path: Path, one_size: list[Any]) -> None:
    """With more candidates than ``tune_top``, all are first timed and the fastest tuned,
    and the fastest of another form within ``FORM_SLACK`` of them too; a form further behind
    is only first-timed."""
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    one, split = fixtures.variants("rmsnorm_linear", g)
    ones = real_size_variants(one, target=g, limit=3)  # three sizes of the one-kernel form
    assert len({em.to_json(h) for h in ones}) == 3
    folder = tmp_path / "rmsnorm_linear_b1"
    folder.mkdir()
    for k, h in enumerate([*ones, split]):
        (folder / f"result_{k}.json").write_text(em.to_json(h))
    files = [str(folder / f"result_{k}.json") for k in range(4)]

    def run(split_us: float) -> dict[str, Any]:
        fake = TimesByMugraph({em.to_json(ones[0]): 20.0, em.to_json(ones[1]): 21.0,
                               em.to_json(ones[2]): 22.0, em.to_json(split): split_us})
        (r,) = gb.bench_gpu(_cfg(programs=["rmsnorm_linear"], batches=[1], tune=True,
                                 tune_top=2, reference=False, mugraph_dir=str(tmp_path)),
                            timer=fake, floor=Floor(4e12), compiler=fake.compiler,
                            device_name="fake", log=lambda m: None)
        return r

    close = run(26.0)  # within 1.35 × 20 µs: tuned beside the fastest two
    assert sorted(close["candidates_us"]) == [files[0], files[1], files[3]]
    assert any("the fastest 2 tuned, and the fastest of 1 more form(s) within 1.35×" in n
               for n in close["notes"])
    far = run(28.0)
    assert sorted(far["candidates_us"]) == files[:2] and len(far["first_us"]) == 4
    assert close["mugraph_file"] == far["mugraph_file"] == files[0]


def _sig(g: em.KernelGraph) -> list[tuple[int, ...]]:
    return [t.dims for t in g.inputs]


def test_size_variants_of_each_search_result_are_ours(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each search result is expanded by ``size_variants`` (against the program, with the
    configured limit); a variant met twice is timed once; the row names file and variant."""
    g = em.benchmarks.get("qknorm", small=True)
    forms = fixtures.variants("qknorm", g)[:3]  # stand-ins for sizes of one form
    texts = [em.to_json(h) for h in forms]
    assert len(set(texts)) == 3
    em.save(forms[0], tmp_path / "qknorm_b1.json")
    em.save(forms[1], tmp_path / "qknorm_b1_1.json")
    calls: list[tuple[str, Any, Any]] = []

    def size_variants(h: em.KernelGraph, target: Any = None, limit: Any = None,
                      workers: int = 1, caps: Any = None) -> list[Any]:
        calls.append((em.to_json(h), target, limit))
        return [h, *(f for f in forms if em.to_json(f) != em.to_json(h))][:limit]

    _sizes(monkeypatch, size_variants)
    fake = TimesByMugraph({texts[0]: 9.0, texts[1]: 7.0, texts[2]: 4.0})
    (r,) = gb.bench_gpu(_cfg(programs=["qknorm"], batches=[1], size_limit=3,
                             mugraph_dir=str(tmp_path)),
                        timer=fake, floor=Floor(4e12), compiler=fake.compiler,
                        device_name="fake", log=lambda m: None)
    assert [c[0] for c in calls] == texts[:2] and all(c[2] == 3 for c in calls)
    assert all(em.to_json(c[1]) == em.to_json(g) for c in calls)  # verified against the program
    first = str(tmp_path / "qknorm_b1.json")
    assert r["search_results"] == 2 and r["candidates"] == 3  # the second's variants: met before
    assert r["candidates_us"] == {first: 9.0, f"{first}#1": 7.0, f"{first}#2": 4.0}
    assert r["mugraph_file"] == first and r["size_variant"] == 2 and r["ours_us"] == 4.0
    assert r["source"] == "search"


def test_a_result_without_size_variants_is_timed_at_its_own(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def size_variants(h: em.KernelGraph, target: Any = None, limit: Any = None,
                      workers: int = 1, caps: Any = None) -> list[Any]:
        raise em.MapError("no other sizes fit")

    _sizes(monkeypatch, size_variants)
    path = _search_file(tmp_path, "ntrans")
    (r,) = gb.bench_gpu(_cfg(programs=["ntrans"], batches=[1], mugraph_dir=str(tmp_path)),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=lambda m: None)
    assert r["ours_us"] == 20.0 and r["mugraph_file"] == str(path) and r["size_variant"] == 0
    assert r["notes"] == [f"ours: no size variants of {path}: no other sizes fit"]


@pytest.mark.parametrize("dtype, folder_name, label", [
    (em.float16, "rmsnorm_linear_b1", "rmsnorm_linear b=1"),  # the layout of every earlier run
    (em.bfloat16, "rmsnorm_linear_b1_bf16", "rmsnorm_linear b=1 bf16"),
], ids=["float16", "bfloat16"])
def test_from_search_runs_the_search_first(tmp_path: Path, one_size: list[Any], dtype: em.DType,
                                           folder_name: str, label: str) -> None:
    from egraph_mirage.pipeline import Request
    from egraph_mirage.search import SearchConfig

    tiny = SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0, max_results=2)
    logs: list[str] = []
    (r,) = gb.bench_gpu(_cfg(programs=["rmsnorm_linear"], batches=[1], mugraph_dir=str(tmp_path),
                             from_search=True,  # tiny: no time limit needed
                             search=Request(config=tiny, workers=1, progress=False),
                             dtype=dtype),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=logs.append)
    assert [p.name for p in tmp_path.iterdir()] == [folder_name]
    folder = tmp_path / folder_name
    assert sorted(p.name for p in folder.iterdir()) == [
        "best.json", "result_0.json", "result_1.json", "results.json", "search.ckpt"]
    summary = json.loads((folder / "results.json").read_text())
    assert summary["program"] == {"name": "rmsnorm_linear", "batch": 1, "small": True,
                                  "dtype": dtype.value}
    assert {t.dtype for t in em.load(folder / "best.json").inputs} == {dtype}
    assert r["source"] == "search" and r["candidates"] == 2 and r["ours_us"] == 20.0
    assert r["dtype"] == dtype.value
    assert r["mugraph_file"] in {str(folder / "result_0.json"), str(folder / "result_1.json")}
    assert any("search found 2 μGraph(s)" in m for m in logs)
    assert any(m.startswith(f"{label}: ours (search ") for m in logs)


def test_markdown_and_plot(tmp_path: Path, one_size: list[Any]) -> None:
    _search_file(tmp_path, "mqa")
    rows = gb.bench_gpu(_cfg(batches=[1], mugraph_dir=str(tmp_path)), timer=FakeTimer(),
                        floor=Floor(4e12), compiler=_compiler, device_name="Fake GPU",
                        log=lambda m: None)
    text = gb.markdown(rows, "2026-11-21", "egraph-mirage bench gpu --batch 1", 4e12)
    assert "Fake GPU" in text and "2026-11-21" in text and "`egraph-mirage bench gpu" in text
    assert "| program | b | floor | ours | ours+graph | ref | ref+graph | eager |" in text
    assert "| rmsnorm_linear | 1 | " in text and "4.00 TB/s" in text
    assert "never counted as ours" in text
    assert f"- {gb.NO_SEARCH_RESULT} (no μGraph for rmsnorm_linear at batch 1" in text
    pytest.importorskip("matplotlib")
    gb.plot(rows, str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_rows_written_before_the_reference_column_still_render(tmp_path: Path) -> None:
    """The archived rows of ``docs/gpu_rows.json`` (``docs/results/archive.json``) predate the
    split of ours and the hand-written reference."""
    archive = json.loads((ROOT / "docs" / "results" / "archive.json").read_text())
    rows = [r for r in archive["gpu"] if r.get("origin") == "docs/gpu_rows.json"]
    assert rows
    table = gb.format_table(rows)
    assert len(table.splitlines()) == len(rows) + 1
    assert "| gqa | 1 |" in gb.markdown(rows, "2026-11-21", "egraph-mirage bench gpu")
    pytest.importorskip("matplotlib")
    gb.plot(rows, str(tmp_path / "p.png"))


def test_with_the_real_size_variants(tmp_path: Path) -> None:
    if not hasattr(pytest.importorskip(SIZES), "size_variants"):
        pytest.skip(f"{SIZES}.size_variants is not written yet")
    path = _search_file(tmp_path, "rmsnorm_linear")
    (r,) = gb.bench_gpu(_cfg(programs=["rmsnorm_linear"], batches=[1], size_limit=2,
                             mugraph_dir=str(tmp_path), reference=False),
                        timer=FakeTimer(), floor=Floor(4e12), compiler=_compiler,
                        device_name="fake", log=lambda m: None)
    assert r["search_results"] == 1 and 1 <= r["candidates"] <= 2
    assert r["mugraph_file"] == str(path) and r["size_variant"] in (0, 1)
    assert r["ours_us"] == 20.0


def test_gpu_side_imports_without_egglog_or_jax(tmp_path: Path) -> None:
    """The GPU machine has neither: the benchmark programs, em.load, the evaluator, the bench
    and the command must all work with both hidden."""
    g = em.benchmarks.get("gqa", small=True)
    (tmp_path / "gqa_b1").mkdir()
    em.save(fixtures.fused("gqa", g), tmp_path / "gqa_b1" / "result_0.json")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["egglog"] = None
        sys.modules["jax"] = None
        import egraph_mirage as em
        from egraph_mirage.bench import gpu_bench
        from egraph_mirage.gpu import baselines, floor, timing, torch_eval, tune
        from egraph_mirage.cli import main
        g = em.benchmarks.get("gqa", small=True)
        (h,) = gpu_bench.candidates("gqa", 1, g, {str(tmp_path)!r}).graphs
        xs = timing.random_inputs(g, "cpu")
        (a,) = torch_eval.evaluate(g, xs)
        (b,) = torch_eval.evaluate(h, xs)
        assert torch_eval.relative_error(b, a) < 1e-5
        assert main(["list"]) == 0
        assert "egglog" not in sys.modules or sys.modules["egglog"] is None
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("ok")
