"""``egraph-mirage bench generate`` without a GPU: the refusal and the one-line errors of bad
arguments, the ``--cpu-smoke`` run of a two-layer Llama's ``generate()`` through eager and the
backend (a stand-in search budget of one task per piece) with its JSON-lines rows, identical
layers searched once and a second compile from the cache, Qwen3, and the table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from cli_runs import run_cli  # noqa: E402

from egraph_mirage.bench import generate_bench as gb  # noqa: E402

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="--cpu-smoke runs without a GPU")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")




@CPU_ONLY
@pytest.mark.parametrize(("argv", "says"), [
    ((), "error: bench generate needs a CUDA GPU"),
    (("--cpu-smoke", "--layers", "3"), "small preset with 1 or 2 layers only"),
    (("--cpu-smoke", "--preset", "llama3_8b"), "small preset with 1 or 2 layers only"),
    (("--cpu-smoke", "--max-cache-len", "8"), "--max-cache-len 8 is shorter than --prompt-len "
     "+ --new-tokens + 1 = 12"),
    (("--cpu-smoke", "--batch", "1", "0", "--new-tokens", "-1"),
     "--batch 0, --new-tokens -1: must be positive"),
    (("--cpu-smoke", "--budget", "-5"), "error: bench generate: --budget must be"),
])
def test_bad_arguments_give_one_line(capsys: pytest.CaptureFixture[str], argv: tuple[str, ...],
                                     says: str) -> None:
    code, out, err = run_cli(capsys, "bench", "generate", *argv)
    assert code == 2 and not out
    assert says in err and err.startswith("error: ") and len(err.strip().splitlines()) == 1


@CPU_ONLY
def test_the_cpu_smoke_run_writes_json_lines_and_searches_identical_layers_once(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.jsonl"
    code, out, err = run_cli(capsys, "bench", "generate", "--cpu-smoke", "--models", "llama",
                          "--layers", "2", "--batch", "1", "--new-tokens", "2", "--repeats", "1",
                          "--max-tasks", "1", "--workers", "1", "--again",
                          "--cache-dir", str(tmp_path / "cache"), "--out", str(rows_file))
    assert code == 0, err
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [(r["model"], r["layers"], r["batch"], r["mode"]) for r in rows] == [
        ("llama", 2, 1, "eager"), ("llama", 2, 1, "egraph_mirage")]
    assert all(tuple(r) == gb.KEYS for r in rows)
    eager, ours = rows
    assert ours["preset"] == "small" and ours["sizes"]["hidden"] == 64 and ours["vocab"] == 256
    assert (ours["prompt_len"], ours["new_tokens"], ours["max_cache_len"]) == (8, 2, 32)
    assert ours["device"] == "cpu" and ours["compile_mode"] == "reduce-overhead"
    for r in rows:
        assert r["error"] is None and r["compile_s"] > 0 and r["prefill_ms"] > 0
        # a busy host can make N + 1 tokens no slower than 1 by the wall clock: then no rate
        if r["decode_ms_per_step"] > 0:
            assert r["decode_tok_s"] == pytest.approx(1e3 / r["decode_ms_per_step"])
        else:
            assert r["decode_tok_s"] is None
        assert r["param_bytes"] > 0 and r["cache_bytes"] == 2 * 2 * 1 * 2 * 32 * 16 * 2
        # the floor: parameters and cache, the embedding's table but its row; no bandwidth
        assert r["floor_bytes"] == r["param_bytes"] + r["cache_bytes"] - (256 - 1) * 64 * 2
        assert r["copy_bandwidth"] is r["floor_us"] is r["floor_fraction"] is None
    assert eager["tokens_match"] and eager["first_diff"] is None
    assert ours["tokens_match"] == (ours["first_diff"] is None)
    if ours["decode_tok_s"] and eager["decode_tok_s"]:
        assert ours["speedup_vs_eager"] == pytest.approx(
            ours["decode_tok_s"] / eager["decode_tok_s"])
    assert ours["speedup_vs_best"] is None  # no torch.compile mode ran
    # the second layer's pieces that are the first's are found in the cache, not searched
    assert ours["pieces"] > 0 and ours["replaced"] == 0 and ours["cache_hits"] > 0
    assert ours["searches"] + ours["cache_hits"] >= ours["pieces"]
    assert ours["report"].startswith("egraph-mirage: graph")
    # --again: a new Backend after a Dynamo reset finds every piece in the cache
    assert ours["again_compile_s"] > 0 and ours["again_searches"] == 0
    assert ours["again_cache_hits"] == ours["pieces"]
    # where the second compile's time went: the backend's stages, torch's caches (no Inductor
    # on the CPU smoke run: its rest runs eagerly)
    assert ours["again_stages"].startswith("partition ") and "pieces" in ours["again_stages"]
    assert ours["again_torch_caches"] == dict.fromkeys(
        ["autograd_cache_hit", "autograd_cache_miss", "fxgraph_cache_hit", "fxgraph_cache_miss"],
        0)
    head, line = out.splitlines()[:2]
    assert head.split()[:6] == ["model", "L", "dtype", "b", "eager", "tok/s"]
    assert line.split()[:4] == ["llama", "2", "fp16", "1"]
    assert f"0/{ours['pieces']}" in line.split()
    assert f"wrote {rows_file}" in err
    code, again, _ = run_cli(capsys, "bench", "generate", "--table-of", str(rows_file))
    assert code == 0 and again == out


@CPU_ONLY
def test_qwen3_through_the_backend(tmp_path: Path) -> None:
    cfg = gb.GenerateBenchConfig(models=("qwen3",), preset="small", layers=1, batches=(2,),
                                 prompt_len=4, new_tokens=1, max_cache_len=8,
                                 modes=("egraph_mirage",), repeats=1, device="cpu",
                                 max_tasks=1, workers=1, cache_dir=str(tmp_path), rest="eager")
    eager, ours = gb.bench_generate(cfg, log=lambda _: None)
    assert eager["mode"] == "eager" and ours["model"] == "qwen3" and ours["error"] is None
    assert ours["batch"] == 2 and ours["tokens_match"] in (True, False)
    assert ours["pieces"] > 0 and ours["searches"] + ours["cache_hits"] >= ours["pieces"]


@CPU_ONLY
def test_the_modes_are_timed_in_alternating_rounds_without_compiling_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # two backend modes (two Backends) and eager, compiled one after the other, then timed in
    # rounds that each start from the next mode; no mode compiles again while timed (else the
    # rows say so: Dynamo keeps each mode's code, guarded by its backend)
    calls: list[tuple[str, int]] = []
    generate = gb.timed_generate

    def recorded(model: Any, prompt: Any, new: int, config: Any, cfg: Any) -> Any:
        calls.append(("eager" if config is None else config.mode, new))
        return generate(model, prompt, new, config, cfg)

    monkeypatch.setattr(gb, "timed_generate", recorded)
    cfg = gb.GenerateBenchConfig(
        models=("llama",), preset="small", layers=1, batches=(1,), prompt_len=4, new_tokens=1,
        max_cache_len=8, modes=("egraph_mirage", "egraph_mirage-max-autotune"), repeats=2,
        device="cpu", max_tasks=1, workers=1, cache_dir=str(tmp_path), rest="eager")
    rows = gb.bench_generate(cfg, log=lambda _: None)
    assert [(r["mode"], r["error"]) for r in rows] == [
        ("eager", None), ("egraph_mirage", None), ("egraph_mirage-max-autotune", None)]
    modes = ["eager", "reduce-overhead", "max-autotune"]
    first = [(m, 2) for m in modes]  # each compiled by its first call
    rounds = [[(m, n) for m in order for n in (1, 2)]
              for order in (modes, modes[1:] + modes[:1], modes[2:] + modes[:2])]
    assert calls == first + rounds[0] + rounds[1] + rounds[2]
    assert all(r["decode_ms_per_step"] is not None for r in rows)
    # the second backend mode's pieces are the first's: found in the cache
    assert rows[2]["cache_hits"] == rows[2]["pieces"] > 0


def _row(mode: str, rate: float | None, **more: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(gb.KEYS)
    row.update({"model": "llama", "layers": 32, "dtype": "float16", "batch": 8, "mode": mode,
                "decode_tok_s": rate, "tokens_match": True, **more})
    return row


def test_speedups_are_over_eager_and_the_fastest_torch_compile_mode_and_the_table() -> None:
    rows = [_row("eager", 100.0), _row("compile", 400.0, tokens_match=False, first_diff=17),
            _row("max-autotune", 500.0, floor_fraction=0.7),
            _row("egraph_mirage", 450.0, pieces=161, replaced=3, compile_s=200.0,
                 again_compile_s=20.0, floor_fraction=0.63),
            _row("egraph_mirage-max-autotune", None, tokens_match=None,
                 error="RuntimeError: boom")]
    gb._speedups(rows)
    assert rows[3]["speedup_vs_eager"] == pytest.approx(4.5)
    assert rows[3]["speedup_vs_best"] == pytest.approx(0.9)
    assert rows[2]["speedup_vs_best"] == pytest.approx(1.0)
    assert rows[4]["speedup_vs_best"] is None
    lines = gb.format_table(rows).splitlines()
    assert lines[1].split() == ["llama", "32", "fp16", "8", "100.0", "400.0", "500.0", "450.0",
                                "–", "0.90×", "–", "–", "/", "–", "/", "0.70", "/", "0.63",
                                "/", "–", "@17", "same", "same", "3/161",
                                "200.0", "(20.0)"]
    assert lines[-1] == "llama L=32 b=8 egraph_mirage-max-autotune: RuntimeError: boom"


@pytest.mark.parametrize("tied", [False, True])
def test_a_decode_steps_floor_is_its_parameters_and_cache_less_the_embeddings_unread_rows(
        tied: bool) -> None:
    """A decode step reads every weight once and the static cache whole, but of the input
    embedding's table only the batch's rows; where the output head shares that table, the
    head reads it all. The floor's time is those bytes at the copy bandwidth, its fraction
    that time over the step's."""
    cfg = gb.GenerateBenchConfig(preset="small", layers=1, max_cache_len=32)
    sizes = cfg.sizes()
    model = gb.build_model("llama", sizes, 1, 256, torch.float16, "cpu", 0)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    params, cache, floor = gb._bytes(model, sizes, 1, 3, cfg)
    table = 256 * 64 * 2
    assert params == sum(p.numel() * 2 for p in model.parameters())
    assert cache == 2 * 1 * 3 * sizes.kv_heads * 32 * sizes.head_dim * 2
    assert floor == params + cache - (0 if tied else table - 3 * 64 * 2)
    row = _row("compile", 10.0, floor_bytes=4e9, decode_ms_per_step=2.0)
    gb._floor(row, 4e12)
    assert row["floor_us"] == pytest.approx(1000.0) and row["floor_fraction"] == pytest.approx(0.5)
    cpu = _row("eager", 10.0, floor_bytes=4e9, decode_ms_per_step=2.0)
    gb._floor(cpu, None)
    assert cpu["floor_us"] is cpu["floor_fraction"] is None


def test_the_first_differing_position_over_the_batch() -> None:
    want = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert gb._first_diff(want.clone(), want) is None
    got = want.clone()
    got[1, 2] = 0
    got[0, 3] = 0
    assert gb._first_diff(got, want) == 2
