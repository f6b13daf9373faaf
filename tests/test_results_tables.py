"""The measurement tables in README.md and docs/ are generated from docs/results/ and current."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("results_tables",
                                               ROOT / "scripts" / "results_tables.py")
assert _spec and _spec.loader
rt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rt)


def test_every_table_matches_its_rows() -> None:
    assert rt.main(["--check"]) == 0, "run python3 scripts/results_tables.py"


def test_every_rows_file_has_one_row_per_key_and_is_shown() -> None:
    shown = "".join(p.read_text() for p in rt.documents())
    stems = [p.stem for p in (ROOT / "docs" / "results").glob("*.json") if p.stem != "archive"]
    assert {"gpu_h100", "gpu_h200", "torch_h100", "torch_h200"} <= set(stems)
    for stem in stems:
        rt.load(stem)  # raises on a repeated key
        assert f"<!-- results:{stem}:" in shown, f"docs/results/{stem}.json is in no table"


def _row(name: str, batch: int, graph: float | None, plain: float = 2.0) -> dict[str, object]:
    return {"benchmark": name, "batch": batch, "dtype": "float16", "recorded_in": "abc1234",
            "ours_us": 5.0, "ours_graph_us": 4.0, "speedup_vs_best": plain,
            "speedup_vs_best_graph": graph, "baselines_graph_us": {"compile": 6.0},
            "baselines_us": {"eager": 9.0, "compile-max-autotune": 7.5}}


@pytest.fixture
def made_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(rt, "RESULTS", tmp_path)
    rows = [_row("rmsnorm_linear", 1, 1.25), _row("rmsnorm_linear", 8, 0.9964),
            _row("gated_mlp", 1, 1.5, plain=0.9996), _row("unseen", 16, 3.0)]
    (tmp_path / "gpu_fake.json").write_text(json.dumps(rows))
    return tmp_path


def test_speedups_render_per_batch_against_the_target(made_up: Path) -> None:
    lines = rt.render("gpu_fake:speedups").splitlines()
    assert lines[0] == "| program | dtype | b = 1 / 8 / 16 | target (b = 1) |"
    # a slowdown never rounds up to 1.00×, a batch not measured is a dash, targets are checked
    assert lines[2] == "| rmsnorm_linear | fp16 | 1.25× / 0.996× / – | 1.2× ✓ |"
    assert lines[3] == "| gated_mlp | fp16 | 1.50× / – / – | 1.6× ✗ |"
    assert lines[4] == "| unseen | fp16 | – / – / 3.00× | – |"


def test_the_full_table_names_the_best_baseline_and_the_provenance(made_up: Path) -> None:
    line = rt.render("gpu_fake:table").splitlines()[4]
    assert "| 7.5 (max-autotune) / 6.0 (compile) |" in line
    assert "| 1.000× / 1.50× |" in line
    assert line.endswith("| – | – | – | before abc1234 |")


def test_regenerate_rewrites_only_between_the_markers(made_up: Path) -> None:
    text = ("intro\n<!-- results:gpu_fake:speedups -->\nstale | table\n"
            "<!-- /results:gpu_fake:speedups -->\noutro\n")
    new = rt.regenerate(text)
    assert new.startswith("intro\n<!-- results:gpu_fake:speedups -->\n\n| program |")
    assert new.endswith("|\n\n<!-- /results:gpu_fake:speedups -->\noutro\n")
    assert "stale" not in new and rt.regenerate(new) == new
    prose = "write `<!-- results:gpu_fake:nope -->` around a table\n"
    assert rt.regenerate(prose) == prose  # a marker counts alone on its line only
    with pytest.raises(ValueError, match="without its"):
        rt.regenerate("<!-- results:gpu_fake:speedups -->\nno end\n")
    with pytest.raises(ValueError, match="no view"):
        rt.regenerate("<!-- results:gpu_fake:nope -->\n<!-- /results:gpu_fake:nope -->")


def test_two_rows_for_one_key_are_refused(made_up: Path) -> None:
    rows = json.loads((made_up / "gpu_fake.json").read_text())
    (made_up / "gpu_twice.json").write_text(json.dumps([*rows, rows[0]]))
    with pytest.raises(ValueError, match="two rows for"):
        rt.load("gpu_twice")


def test_a_generate_table_has_one_line_per_run_and_each_mode_s_rate(made_up: Path) -> None:
    """``bench generate`` rows (``generate_*``): one line per model, layers, batch, dtype and
    backend timing, each mode's tokens/s, the backend's speedup over the best compiled mode,
    each mode's fraction of the step's copy floor (a lone – for a run recorded without one),
    its pieces replaced and compile seconds, and where each mode's tokens leave eager's."""
    base = {"model": "llama", "layers": 2, "batch": 1, "dtype": "float16",
            "backend_timing": "graph", "commit": "abc1234", "tokens_match": True}
    rows = [{**base, "mode": "eager", "decode_tok_s": 100.0},
            {**base, "mode": "compile", "decode_tok_s": 300.0, "tokens_match": False,
             "first_diff": 16},
            {**base, "mode": "egraph_mirage", "decode_tok_s": 330.0, "speedup_vs_best": 1.1,
             "pieces": 10, "replaced": 3, "compile_s": 42.4, "floor_fraction": 0.66}]
    unfloored = [{**r, "batch": 8} for r in rows[:2]]
    (made_up / "generate_fake.json").write_text(json.dumps([*rows, *unfloored]))
    header, _, line, old = rt.render("generate_fake:table").splitlines()
    assert ("| eager tok/s | compile tok/s | egraph_mirage tok/s | ours vs best | of floor (step):"
            " eager / compile / egraph_mirage |") in header
    assert line == ("| llama | 2 | 1 | fp16 | `graph` | 100.0 | 300.0 | 330.0 | 1.10× | – / – / "
                    "0.66 | 3/10 | 42 | compile @16, egraph_mirage same | abc1234 |")
    assert old.startswith("| llama | 2 | 8 | fp16 | `graph` | 100.0 | 300.0 | – | – | – | – |")


def test_a_torch_table_gives_every_mode_s_fraction_of_the_floor(made_up: Path) -> None:
    """``bench torch`` rows (``torch_*``): beside the backend's speedup, every mode's fraction of
    the copy floor under graph replay, in the order of the mode columns; – for a mode not run,
    a lone – for a line recorded without a floor."""
    base = {"model": "llama", "batch": 1, "dtype": "float16", "backend_timing": "both",
            "commit": "abc1234"}
    ours = {"mode": "egraph_mirage", "speedup_vs_best": 0.9, "speedup_vs_best_graph": 1.25,
            "pieces": 14, "replaced": 5}
    rows = [{**base, "mode": "eager", "plain_us": 40.0, "graph_us": 20.0,
             "floor_fraction_graph": 0.3},
            {**base, **ours, "plain_us": 20.0, "graph_us": 8.0, "floor_fraction_graph": 0.75},
            {**base, "mode": "compile", "plain_us": 18.0, "graph_us": 10.0,
             "floor_fraction_graph": 0.6},
            {**base, "batch": 8, "mode": "eager", "plain_us": 50.0, "graph_us": 30.0},
            {**base, "batch": 8, "mode": "max-autotune", "plain_us": 22.0, "graph_us": 14.0},
            {**base, **ours, "batch": 8, "plain_us": 25.0, "graph_us": 12.0}]
    (made_up / "torch_fake.json").write_text(json.dumps(rows))
    header, _, with_floor, without = rt.render("torch_fake:table").splitlines()
    assert header.endswith("| ours vs best (plain / graph) "
                           "| of floor (graph): eager / compile / max-autotune / egraph_mirage "
                           "| replaced | commit |")
    assert with_floor == ("| llama | 1 | fp16 | `both` | 40.0 / 20.0 | 18.0 / 10.0 | – "
                          "| 20.0 / 8.0 | 0.90× / 1.25× | 0.30 / 0.60 / – / 0.75 | 5/14 "
                          "| abc1234 |")
    assert without == ("| llama | 8 | fp16 | `both` | 50.0 / 30.0 | – | 22.0 / 14.0 | 25.0 / 12.0 "
                       "| 0.90× / 1.25× | – | 5/14 | abc1234 |")


def test_the_transformers_view_keeps_the_transformers_layers_only(made_up: Path) -> None:
    """The README's view of ``bench torch`` rows: the lines of transformers' own decoder layers
    with a static cache (``hf-static``, ``hf-qwen3-static``), as ``table`` renders them."""
    base = {"batch": 1, "dtype": "float16", "backend_timing": "both", "commit": "abc1234",
            "mode": "compile", "plain_us": 18.0, "graph_us": 10.0}
    rows = [{**base, "model": "llama"}, {**base, "model": "hf"}, {**base, "model": "hf-static"},
            {**base, "model": "hf-qwen3-static", "dtype": "bfloat16"}]
    (made_up / "torch_fake.json").write_text(json.dumps(rows))
    lines = rt.render("torch_fake:transformers").splitlines()[2:]
    assert [line.split(" | ")[0] for line in lines] == ["| hf-static", "| hf-qwen3-static"]
    assert lines == rt.render("torch_fake:table").splitlines()[4:]


def test_a_runs_rows_take_the_place_of_their_groups_rows_which_are_archived(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scripts/record_rows.py``: a run's rows replace every row of their group (the key but
    the mode: a mode the new run left out does not stay behind from an older commit), the rows
    replaced go to the archive, and each new row carries its provenance."""
    spec = importlib.util.spec_from_file_location("record_rows",
                                                  ROOT / "scripts" / "record_rows.py")
    assert spec and spec.loader
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    monkeypatch.setattr(rr.rt, "RESULTS", tmp_path)

    def row(batch: int, mode: str, us: float) -> dict:
        return {"model": "hf-static", "batch": batch, "dtype": "float16",
                "backend_timing": "both", "mode": mode, "graph_us": us}

    old = [row(1, "eager", 300.0), row(1, "egraph_mirage", 140.0), row(8, "compile", 190.0)]
    (tmp_path / "torch_x.json").write_text(json.dumps(old))
    (tmp_path / "archive.json").write_text(json.dumps({"note": "superseded"}))
    new = [row(1, "max-autotune", 145.0), row(1, "egraph_mirage", 127.0)]
    provenance = {"commit": "abc1234", "origin": "a command", "recorded_in": "a session",
                  "recorded_on": "2026-11-29"}
    assert rr.record("torch_x", new, provenance) == (2, 2)
    rows = json.loads((tmp_path / "torch_x.json").read_text())
    assert [(r["batch"], r["mode"], r["graph_us"]) for r in rows] == [
        (8, "compile", 190.0), (1, "max-autotune", 145.0), (1, "egraph_mirage", 127.0)]
    assert all(r["commit"] == "abc1234" for r in rows[1:]) and "commit" not in rows[0]
    archive = json.loads((tmp_path / "archive.json").read_text())
    assert archive["torch"] == old[:2] and archive["note"] == "superseded"
