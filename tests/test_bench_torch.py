"""``egraph-mirage bench torch`` without a GPU: the refusal, the ``--cpu-smoke`` run of the small
Llama layer (kernels in Triton's interpreter) with its JSON rows and table, a replaced piece
through a stand-in search, transformers' Llama and Qwen3 layers with a concatenated and a static
cache in fp16 and bf16, several dtypes in one run, speedups, the copy floor's bytes and
fractions, and the table's format."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from cli_runs import run_cli  # noqa: E402

import egraph_mirage as em  # noqa: E402
from egraph_mirage.bench import torch_bench as tb  # noqa: E402
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats  # noqa: E402

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="--cpu-smoke runs without a GPU")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")




def _llama_floor_bytes(s: Any, batch: int, itemsize: int) -> int:
    """``LlamaLayer``'s decode step's floor counted by hand from its sizes: the weights (two
    RMSNorm gains, Wq, Wk, Wv, Wo, the MLP's three), the rotary cos and sin, the KV cache read,
    the new token in and its output, keys and values out."""
    weights = (2 * s.hidden + s.hidden * s.heads * s.head_dim
               + 2 * s.hidden * s.kv_heads * s.head_dim + s.heads * s.head_dim * s.hidden
               + 3 * s.hidden * s.mlp + 2 * s.head_dim)
    cache = 2 * batch * s.kv_heads * s.kv_len * s.head_dim
    io = 2 * batch * s.hidden + 2 * batch * s.kv_heads * s.head_dim
    return (weights + cache + io) * itemsize


def test_the_floor_counts_the_weights_the_cache_and_the_step_in_and_out() -> None:
    from egraph_mirage.gpu.floor import module_call_bytes

    example = tb.load_example()
    sizes = example.LlamaSizes.small()
    layer = example.LlamaLayer(sizes, dtype=torch.float16).requires_grad_(False)
    inputs = layer.example_inputs(3)
    assert module_call_bytes(layer, inputs) == _llama_floor_bytes(sizes, 3, 2) == 87_488


@pytest.mark.parametrize("cache", ["concat", "static"])
def test_the_floor_counts_only_the_buffers_the_forward_reads(cache: str) -> None:
    """``HFDecodeStep`` holds ``cache_position`` (int64) for both caches; only the static
    cache's ``index_copy_`` reads it."""
    pytest.importorskip("transformers")
    from egraph_mirage.gpu.floor import module_call_bytes

    example = tb.load_example()
    step = example.HFDecodeStep(example.LlamaSizes.small(), torch.float16, family="qwen3",
                                cache=cache).requires_grad_(False)
    x, k_cache, v_cache = inputs = step.example_inputs(2)
    weights = sum(p.numel() * 2 for p in step.parameters()) + 2 * step.cos.numel() * 2
    io = (x.numel() + k_cache.numel() + v_cache.numel()) * 2 + (x.numel() + 2 * 2 * 2 * 16) * 2
    position = 8 if cache == "static" else 0
    assert module_call_bytes(step, inputs) == weights + io + position


@CPU_ONLY
def test_without_a_gpu_it_refuses_unless_cpu_smoke(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "bench", "torch")
    assert code == 2 and not out
    assert err.startswith("error: bench torch needs a CUDA GPU") and "--cpu-smoke" in err
    code, _, err = run_cli(capsys, "bench", "torch", "--cpu-smoke", "--preset", "llama3_8b")
    assert code == 2 and "small preset only" in err
    code, _, err = run_cli(capsys, "bench", "torch", "--cpu-smoke", "--example", "/no/such.py")
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, "bench", "torch", "--cpu-smoke", "--dtype", "float16,int8")
    assert code == 2 and err.startswith("error: bench torch: --dtype int8: one or more of")


@CPU_ONLY
def test_the_cpu_smoke_run_writes_json_rows_and_prints_the_table(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    code, out, err = run_cli(capsys, "bench", "torch", "--cpu-smoke", "--models", "llama",
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
    # every piece searched or found in the cache (how the layer is cut is the partitioner's
    # business, tests/test_partition.py); with one task each nothing is found and replaced
    assert ours["pieces"] > 0 and ours["replaced"] == 0
    assert 0 < ours["searches"] and ours["searches"] + ours["cache_hits"] >= ours["pieces"]
    assert ours["report"].startswith("egraph-mirage: graph")
    assert ours["speedup_vs_best"] == pytest.approx(eager["plain_us"] / ours["plain_us"])
    # the floor's bytes are counted; without a GPU there is no bandwidth, so no floor time
    sizes = tb.load_example().LlamaSizes(**ours["sizes"])
    assert all(r["floor_bytes"] == _llama_floor_bytes(sizes, 1, 2) for r in rows)
    assert all(r[k] is None for r in rows for k in ("copy_bandwidth", "floor_us",
                                                     "floor_fraction", "floor_fraction_graph"))
    head, line = out.splitlines()[:2]
    assert head.split()[:5] == ["model", "dtype", "b", "eager", "µs"] and "ours vs best" in head
    assert "of floor (graph)" in head and "ours of floor" not in head
    assert line.split()[:3] == ["llama", "fp16", "1"]
    assert line.split()[-3:] == ["–", f"0/{ours['pieces']}", "0.0e+00"]
    assert "µs: cpu wall clock (Triton interpreter)" in out and "of floor:" not in out
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
    # every piece can be replaced (the program itself, lowered as is)
    assert ours["replaced"] == ours["pieces"] > 0 and ours["matches_eager"]
    assert ours["report"].count(" | replaced: ") == ours["pieces"]


def test_a_measured_bandwidth_gives_every_mode_its_fraction_of_the_floor(tmp_path: Path) -> None:
    cfg = tb.TorchBenchConfig(models=("llama",), batches=(2,), preset="small", modes=("eager",),
                              rest="eager", device="cpu", cache_dir=str(tmp_path))
    (row,) = tb.bench_torch(cfg, timer=tb.CpuTimer(repeats=1), log=lambda _: None,
                            copy_bandwidth=1e9)
    nbytes = _llama_floor_bytes(tb.load_example().LlamaSizes.small(), 2, 2)
    assert row["floor_bytes"] == nbytes and row["copy_bandwidth"] == 1e9
    assert row["floor_us"] == pytest.approx(nbytes / 1e3)
    assert row["floor_fraction"] == pytest.approx(row["floor_us"] / row["plain_us"])
    assert row["floor_fraction_graph"] is None  # no graph replay on the CPU


@pytest.mark.parametrize(("model", "dtype"), [
    ("hf-qwen3", "bfloat16"), ("hf-static", "float16"), ("hf-qwen3-static", "bfloat16")])
def test_the_hf_layers_where_transformers_is_installed(tmp_path: Path, model: str,
                                                       dtype: str) -> None:
    pytest.importorskip("transformers")
    cfg = tb.TorchBenchConfig(models=(model,), dtypes=(dtype,), batches=(2,), preset="small",
                              modes=("eager", "egraph_mirage"), cache_dir=str(tmp_path),
                              max_tasks=1, workers=1, rest="eager", device="cpu")
    rows = tb.bench_torch(cfg, timer=tb.CpuTimer(repeats=1), log=lambda _: None)
    assert [(r["model"], r["dtype"], r["mode"]) for r in rows] == [
        (model, dtype, "eager"), (model, dtype, "egraph_mirage")]
    ours = rows[-1]
    assert ours["error"] is None and ours["matches_eager"] and ours["pieces"]
    assert ours["tolerance"] == tb.TOLERANCE[dtype]


def test_qwen3_normalises_queries_and_keys_per_head_and_the_static_cache_is_written_in_place(
        ) -> None:
    """``hf-qwen3`` is transformers' Qwen3 layer (``q_norm``/``k_norm`` over the head dim);
    its static cache is the whole ``kv_len`` positions, the new token written in place at the
    last, and the step gives what the concatenated cache gives over the first ``kv_len - 1``
    positions for the same weights (the new token at the same position)."""
    import dataclasses

    pytest.importorskip("transformers")
    example = tb.load_example()
    sizes = example.LlamaSizes.small()
    static = example.HFDecodeStep(sizes, torch.bfloat16, family="qwen3", cache="static")
    concat = example.HFDecodeStep(dataclasses.replace(sizes, kv_len=sizes.kv_len - 1),
                                  torch.bfloat16, family="qwen3")
    attn = static.layer.self_attn
    assert type(static.layer).__name__ == "Qwen3DecoderLayer"
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (sizes.head_dim,)
    x, k_full, v_full = static.example_inputs(2)
    assert k_full.shape == (2, sizes.kv_heads, sizes.kv_len, sizes.head_dim)
    k_cache, v_cache = k_full[:, :, :-1].clone(), v_full[:, :, :-1].clone()
    with torch.no_grad():
        want = concat(x, k_cache, v_cache)
        got = static(x, k_full, v_full)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert torch.equal(k_full[:, :, -1:], want[1]) and torch.equal(v_full[:, :, -1:], want[2])
    assert torch.equal(k_full[:, :, :-1], k_cache)


@CPU_ONLY
def test_the_static_cache_is_written_in_place_through_the_backend_with_pieces_replaced() -> None:
    """With every piece replaced (a stand-in search), the compiled step still writes the new
    token into the static cache passed in, and matches eager."""
    pytest.importorskip("transformers")
    from egraph_mirage.fx.backend import Backend
    from egraph_mirage.gpu.torch_eval import relative_error

    example = tb.load_example()
    step = example.HFDecodeStep(example.LlamaSizes.small(), torch.bfloat16, family="qwen3",
                                cache="static").requires_grad_(False)
    x, k_cache, v_cache = step.example_inputs(2)
    with torch.no_grad():
        want = step(x, k_cache, v_cache)
    k_cache[:, :, -1:] = 0
    v_cache[:, :, -1:] = 0
    backend = Backend(search=_Same(), cache=False, workers=1, rest="eager")
    with torch.no_grad():
        got = torch.compile(step, backend=backend, dynamic=False)(x, k_cache, v_cache)
    pieces = [p for r in backend.reports for p in r.pieces]
    assert pieces and all(p.status == "replaced" for p in pieces)
    assert all(relative_error(g, w) <= tb.TOLERANCE["bfloat16"]
               for g, w in zip(got, want, strict=True))
    assert torch.equal(k_cache[:, :, -1:], want[1]) and torch.equal(v_cache[:, :, -1:], want[2])


@CPU_ONLY
def test_several_dtypes_in_one_run_and_the_table_of_rows_files(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    rows_file = tmp_path / "rows.json"
    code, out, err = run_cli(capsys, "bench", "torch", "--cpu-smoke", "--models", "hf",
                          "--dtype", "float16,bfloat16", "--batch", "1", "--max-tasks", "1",
                          "--workers", "1", "--cache-dir", str(tmp_path / "cache"),
                          "--out", str(rows_file))
    assert code == 0, err
    rows = json.loads(rows_file.read_text())
    assert [(r["dtype"], r["mode"]) for r in rows] == [
        ("float16", "eager"), ("float16", "egraph_mirage"),
        ("bfloat16", "eager"), ("bfloat16", "egraph_mirage")]
    assert all(r["model"] == "hf" and r["matches_eager"] for r in rows)
    lines = out.splitlines()
    assert [line.split()[:3] for line in lines[1:3]] == [["hf", "fp16", "1"], ["hf", "bf16", "1"]]
    code, again, _ = run_cli(capsys, "bench", "torch", "--table-of", str(rows_file),
                          str(tmp_path / "missing.json"))
    assert code == 0 and again == out


def _row(mode: str, plain: float | None, graph: float | None, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(tb.KEYS)
    row.update({"model": "llama", "dtype": "float16", "batch": 8, "mode": mode, "plain_us": plain,
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
    assert lines[0].split() == ["model", "dtype", "b", "eager", "µs", "compile", "µs",
                                "max-autotune", "µs", "egraph_mirage", "µs", "ours", "vs",
                                "best", "of", "floor", "(graph)", "replaced", "ours", "error"]
    # rows without a floor (as written before it existed): an empty cell, no floor line
    assert lines[1].split() == ["llama", "fp16", "8", "20.0", "/", "10.0", "16.0", "/", "8.0",
                                "15.0", "/", "9.0", "12.0", "/", "8.0", "1.25×", "/", "1.00×",
                                "–", "2/4", "2.5e-03"]
    assert lines[2].split() == ["hf", "fp16", "8", "30.0", "/", "20.0", "failed", "–", "40.0", "/",
                                "25.0", "(WRONG)", "0.75×", "/", "0.80×", "–", "1/7", "5.0e-01",
                                "WRONG"]
    assert lines[3] == "µs: plain launches / CUDA-graph replay"
    assert lines[4].startswith("hf float16 b=8 compile: RuntimeError")


def test_the_table_shows_every_modes_fraction_of_the_floor_under_graph_replay() -> None:
    """One ``of floor (graph)`` column: each mode's fraction in the order of the µs columns (the
    modes' order, whatever the rows' order), – for a mode without a graph time."""
    rows = [_row("egraph_mirage", 12.0, 8.0, pieces=4, replaced=2), _row("eager", 20.0, 10.0),
            _row("compile", None, None, error="RuntimeError: boom"),
            _row("max-autotune", 14.0, 7.5)]
    tb._speedups(rows)
    tb._floor(rows, 12_000_000, 2e12)  # 6 µs at 2 TB/s
    assert rows[1]["floor_us"] == pytest.approx(6.0)
    assert rows[1]["floor_fraction_graph"] == pytest.approx(0.6)
    assert rows[0]["floor_fraction"] == pytest.approx(0.5)
    assert rows[0]["floor_fraction_graph"] == pytest.approx(0.75)
    assert rows[2]["floor_fraction_graph"] is None
    lines = tb.format_table(rows).splitlines()
    assert lines[0].split()[-7:] == ["best", "of", "floor", "(graph)", "replaced", "ours",
                                     "error"]
    assert lines[1].split()[-12:] == ["1.17×", "/", "0.94×", "0.60", "/", "–", "/", "0.80",
                                      "/", "0.75", "2/4", "1.0e-03"]
    assert lines[3] == ("of floor (graph): the copy floor over each mode's CUDA-graph µs, in the "
                        "order of the µs columns (floor: parameters, KV cache and activations "
                        "moved once at 2.00 TB/s)")


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
    tb._floor(rows, 12_000_000, 2e12)  # 6 µs at 2 TB/s
    head, line = tb.format_table(rows).splitlines()[:2]
    assert head.split()[-12:] == ["ours", "vs", "best", "ours-max-autotune", "vs", "best",
                                  "of", "floor", "(graph)", "replaced", "ours", "error"]
    assert line.split()[-18:] == ["1.50×", "/", "1.25×", "1.07×", "/", "1.00×",
                                  "0.60", "/", "0.75", "/", "0.80", "/", "1.00", "/", "0.80",
                                  "2/4", "0/4", "4.0e-03"]


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


class _ProfilingTimer(tb.CpuTimer):
    """``CpuTimer`` with a stand-in kernel profile (``CudaTimer.kernels``'s shape: µs per call
    by kernel name), or one that fails."""

    def __init__(self, fails: bool = False) -> None:
        super().__init__(repeats=1)
        self.fails = fails

    def kernels(self, fn: Any, input_sets: Any) -> dict[str, float]:
        if self.fails:
            raise RuntimeError("no profiler here")
        return {f"kernel_{i}": float(i) for i in range(1, 16)}


def test_each_mode_is_profiled_and_its_slowest_kernels_are_in_the_row_and_the_table(
        tmp_path: Path) -> None:
    """Where the timer profiles kernels (``CudaTimer.kernels`` on a GPU), each row keeps its
    kernels' µs per call in all and its ``KERNELS_KEPT`` slowest, slowest first, and the table
    lists them under the figures: which kernel holds a mode back from the floor. A profile that
    fails leaves the times and says so."""
    cfg = tb.TorchBenchConfig(models=("llama",), batches=(1,), preset="small",
                              modes=("eager",), rest="eager", device="cpu",
                              cache_dir=str(tmp_path))
    (row,) = tb.bench_torch(cfg, timer=_ProfilingTimer(), log=lambda _: None)
    assert row["kernels_total_us"] == sum(range(1, 16)) == 120
    assert row["kernels_us"] == [[f"kernel_{i}", float(i)]
                                 for i in range(15, 15 - tb.KERNELS_KEPT, -1)]
    table = tb.format_table([row])
    assert table.splitlines()[-1] == ("  llama fp16 b=1 eager: 120.0 in kernels: 15.0 kernel_15, "
                                      "14.0 kernel_14, 13.0 kernel_13, 12.0 kernel_12, 11.0 "
                                      "kernel_11, 10.0 kernel_10")
    said: list[str] = []
    (row,) = tb.bench_torch(cfg, timer=_ProfilingTimer(fails=True), log=said.append)
    assert row["kernels_us"] is None and row["error"] is None and row["plain_us"] is not None
    assert "note: llama eager: kernels not profiled: RuntimeError: no profiler here" in said
    assert "in kernels" not in tb.format_table([row])


def test_max_autotune_timed_compiles_and_tunes_at_its_first_call_with_the_gpu_timed_tuning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``max-autotune-timed``: torch.compile's max-autotune, whose first call (the one that
    compiles and tunes) runs with Inductor's tuning timed as the backend has it
    (``fx.inductor_tuning``); a baseline, so the backend's speedups count it among the best."""
    heuristics = pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    original = heuristics.CachingAutotuner.bench
    seen: list[tuple[str | None, bool]] = []

    def compile(module: Any, mode: str | None = None, dynamic: bool | None = None) -> Any:
        return lambda *a: seen.append(
            (mode, heuristics.CachingAutotuner.bench is not original)) or module(*a)

    monkeypatch.setattr(torch, "compile", compile)
    fn, backend = tb._compiled(lambda x: x + 1, "max-autotune-timed", tb.TorchBenchConfig())
    assert backend is None and fn(1) == 2 and fn(2) == 3
    assert seen == [("max-autotune-no-cudagraphs", True), ("max-autotune-no-cudagraphs", False)]
    assert "max-autotune-timed" not in tb.DEFAULT_MODES
    rows = [_row("max-autotune", 15.0, 7.5), _row("max-autotune-timed", 12.0, 7.0),
            _row("egraph_mirage", 10.0, 6.0, pieces=4, replaced=2)]
    tb._speedups(rows)
    assert rows[-1]["speedup_vs_best"] == pytest.approx(12 / 10)


def test_each_mode_is_compiled_and_first_called_with_inductor_caches_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Modes compiled one after another in one process would share every kernel of the same
    source, tuning and all (``bench.inductor_caches``): each mode's first call runs with a
    cache directory of its own, and the process's is as it was afterwards."""
    from egraph_mirage.bench.inductor_caches import CACHE_DIR

    monkeypatch.setenv(CACHE_DIR, str(tmp_path / "inductor"))
    seen: dict[str, str | None] = {}
    prepare = tb._prepare

    def recorded(row: dict[str, Any], *args: Any) -> None:
        seen[row["mode"]] = os.environ.get(CACHE_DIR)
        prepare(row, *args)

    monkeypatch.setattr(tb, "_compiled", lambda module, mode, cfg: (module, None))
    monkeypatch.setattr(tb, "_prepare", recorded)
    cfg = tb.TorchBenchConfig(models=("llama",), batches=(2,), preset="small",
                              modes=("eager", "max-autotune", "max-autotune-timed"),
                              rest="eager", device="cpu", cache_dir=str(tmp_path))
    rows = tb.bench_torch(cfg, timer=tb.CpuTimer(repeats=1), log=lambda _: None)
    assert all(r["error"] is None for r in rows)
    assert seen == {m: str(tmp_path / "inductor" / f"mode-{m}") for m in cfg.modes}
    assert os.environ[CACHE_DIR] == str(tmp_path / "inductor")
