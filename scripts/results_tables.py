"""The measurement tables of README.md and docs/*.md, generated from the rows in docs/results/.

A table sits between two marker comments, each alone on its line, naming a rows file (its
stem) and a view:

    <!-- results:gpu_h100:speedups -->
    ...generated...
    <!-- /results:gpu_h100:speedups -->

Rows files are JSON lists, one row per measurement as the command wrote it (plus provenance:
``origin``, ``recorded_in``, ``recorded_on``, ``commit`` where known). Their stem's prefix is
their family: ``gpu_*`` (``bench gpu --json``; views ``table`` and ``speedups``), ``torch_*``
(``bench torch --json``; views ``table`` and ``transformers``, its rows of the static-cache
``hf*`` models), ``generate_*`` (``bench generate``'s JSON lines; view ``table``) and
``cpu_*`` (printed tables of the CPU benchmarks; the view is the row's ``name``). Each file
holds one row per key (``KEYS``).

Usage, from the repository root:
  python3 scripts/results_tables.py           # rewrite every table in place
  python3 scripts/results_tables.py --check   # exit 1 when a table differs from its rows
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
Row = dict[str, Any]
KEYS = {"gpu": ("benchmark", "batch", "dtype"),
        "torch": ("model", "batch", "dtype", "backend_timing", "mode"),
        "generate": ("model", "layers", "batch", "dtype", "backend_timing", "mode"),
        "cpu": ("name",)}
#: the project's targets under CUDA-graph replay at b = 1 (the paper's eight programs)
TARGETS = {"gqa": 2.0, "mha": 1.3, "mqa": 2.0, "qknorm": 2.0, "rmsnorm_linear": 1.2,
           "lora": 2.5, "gated_mlp": 1.6, "ntrans": 1.3}
MODES = ("eager", "compile", "max-autotune", "max-autotune-timed", "egraph_mirage",
         "egraph_mirage-max-autotune")
DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
#: a marked table: the markers alone on their lines
MARKER = re.compile(r"^<!-- results:(?P<name>[\w:]+) -->\n.*?^<!-- /results:(?P=name) -->$",
                    re.S | re.M)


def us(v: float | None) -> str:
    return "–" if v is None else f"{v:.1f}"


def times(v: float | None) -> str:
    """A speedup: two decimals, three where two would round a slowdown up to 1.00."""
    if v is None:
        return "–"
    s = f"{v:.2f}"
    return f"{v:.3f}×" if s == "1.00" and v < 1 else f"{s}×"


def ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def pair(a: str, b: str) -> str:
    return "–" if a == b == "–" else f"{a} / {b}"


def commit(r: Row) -> str:
    return r.get("commit") or f"before {r['recorded_in']}"


def best(baselines: dict[str, float] | None) -> str:
    if not baselines:
        return "–"
    name, t = min(baselines.items(), key=lambda kv: kv[1])
    return f"{us(t)} ({name.removeprefix('compile-')})"


def markdown(header: list[str], lines: Iterable[list[str]]) -> str:
    rows = [header, ["---"] * len(header), *lines]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def gpu_table(rows: list[Row]) -> str:
    header = ["program", "b", "dtype", "searched at b", "ours plain / graph",
              "reference plain / graph", "best baseline plain / graph", "speedup plain / graph",
              "reference / ours (graph)", "of floor (graph)", "winner's form", "commit"]
    return markdown(header, ([
        r["benchmark"], str(r["batch"]), DTYPES[r["dtype"]], str(r.get("searched_at_batch", "–")),
        pair(us(r.get("ours_us")), us(r.get("ours_graph_us"))),
        pair(us(r.get("reference_us")), us(r.get("reference_graph_us"))),
        pair(best(r.get("baselines_us")), best(r.get("baselines_graph_us"))),
        pair(times(r.get("speedup_vs_best")), times(r.get("speedup_vs_best_graph"))),
        ratio(r.get("ours_vs_reference_graph")), ratio(r.get("floor_fraction_graph")),
        r.get("winner_form", "–"), commit(r)] for r in rows))


def gpu_speedups(rows: list[Row]) -> str:
    """Per program and dtype, the speedup under graph replay at b = 1, 8 and 16."""
    cells: dict[tuple[str, str], dict[int, float | None]] = {}
    for r in rows:
        cells.setdefault((r["benchmark"], r["dtype"]), {})[r["batch"]] = r.get(
            "speedup_vs_best_graph")
    lines = []
    for (name, dtype), by_batch in cells.items():
        target, got = TARGETS.get(name), by_batch.get(1)
        mark = "" if target is None or got is None else " ✓" if got >= target else " ✗"
        lines.append([name, DTYPES[dtype], " / ".join(times(by_batch.get(b)) for b in (1, 8, 16)),
                      "–" if target is None else f"{target}×{mark}"])
    return markdown(["program", "dtype", "b = 1 / 8 / 16", "target (b = 1)"], lines)


def transformers_table(rows: list[Row]) -> str:
    """``torch_table`` of ``transformers``' own decoder layers with a static cache only (models
    ``hf-static``, ``hf-qwen3-static``), the README's."""
    return torch_table([r for r in rows if str(r["model"]).startswith("hf")
                        and str(r["model"]).endswith("-static")])


def torch_table(rows: list[Row]) -> str:
    """One line per model, batch, dtype and backend timing: each mode's plain / graph µs, the
    backend's speedup over the best other mode and every mode's fraction of the copy floor under
    graph replay (``floor_fraction_graph``), in the order of the mode columns (– for a mode
    without one, a lone – for a line whose rows were recorded without a floor: none is
    inferred)."""
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    runs: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in rows:
        runs.setdefault(tuple(r[k] for k in KEYS["torch"][:4]), {})[r["mode"]] = r
    lines = []
    for (model, batch, dtype, timing), by_mode in runs.items():
        ours = by_mode.get("egraph_mirage", {})
        some = next(iter(by_mode.values()))
        floors = [ratio(by_mode[m].get("floor_fraction_graph")) if m in by_mode else "–"
                  for m in modes]
        lines.append([model, str(batch), DTYPES[dtype], f"`{timing}`",
                      *[pair(us(by_mode[m].get("plain_us")), us(by_mode[m].get("graph_us")))
                        if m in by_mode else "–" for m in modes],
                      pair(times(ours.get("speedup_vs_best")),
                           times(ours.get("speedup_vs_best_graph"))),
                      "–" if set(floors) == {"–"} else " / ".join(floors),
                      f"{ours['replaced']}/{ours['pieces']}" if ours else "–", commit(some)])
    header = ["model", "b", "dtype", "backend timing", *modes,
              "ours vs best (plain / graph)", f"of floor (graph): {' / '.join(modes)}",
              "replaced", "commit"]
    return markdown(header, lines)


def generate_table(rows: list[Row]) -> str:
    """One line per model, layers, batch, dtype and backend timing (``bench generate`` rows):
    each mode's decode tokens/s, the backend's speedup over the best other compiled mode, each
    mode's fraction of the step's copy floor (– where the row has none), its pieces replaced,
    its first compile's seconds (and its second's, from the cache, in brackets, where
    measured), and where each mode's greedy tokens first differ from eager's (@N: the first
    position that differs; with random weights, greedy choices turn on fp16 rounding, so
    compiled modes drift apart)."""
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    runs: dict[tuple[Any, ...], dict[str, Row]] = {}
    for r in rows:
        runs.setdefault(tuple(r.get(k) for k in KEYS["generate"][:5]), {})[r["mode"]] = r
    lines = []
    for (model, layers, batch, dtype, timing), by_mode in runs.items():
        ours = by_mode.get("egraph_mirage", {})
        some = next(iter(by_mode.values()))
        rate = lambda m: ("–" if m not in by_mode or by_mode[m].get("decode_tok_s") is None  # noqa: E731
                          else f"{by_mode[m]['decode_tok_s']:.1f}")
        tokens = ", ".join(f"{m} " + ("same" if by_mode[m].get("tokens_match")
                                      else f"@{by_mode[m].get('first_diff')}")
                           for m in modes if m != "eager" and m in by_mode)
        floors = ["–" if by_mode.get(m, {}).get("floor_fraction") is None
                  else f"{by_mode[m]['floor_fraction']:.2f}" for m in modes]
        lines.append([model, str(layers), str(batch), DTYPES[dtype], f"`{timing}`",
                      *[rate(m) for m in modes], times(ours.get("speedup_vs_best")),
                      "–" if all(f == "–" for f in floors) else " / ".join(floors),
                      f"{ours['replaced']}/{ours['pieces']}" if ours.get("pieces") else "–",
                      compile_seconds(ours), tokens, commit(some)])
    header = ["model", "layers", "b", "dtype", "backend timing",
              *[f"{m} tok/s" for m in modes], "ours vs best",
              f"of floor (step): {' / '.join(modes)}", "replaced", "ours compile s",
              "tokens vs eager", "commit"]
    return markdown(header, lines)


def compile_seconds(row: Row) -> str:
    """The backend's first compile's seconds, and the second's (``--again``) in brackets."""
    if row.get("compile_s") is None:
        return "–"
    again = row.get("again_compile_s")
    return f"{row['compile_s']:.0f}" + ("" if again is None else f" ({again:.0f})")


def cpu_output(rows: list[Row], name: str) -> str:
    for r in rows:
        if r["name"] == name:
            return "```\n" + "\n".join(r["output"]) + "\n```"
    raise ValueError(f"no cpu row named {name!r}")


VIEWS: dict[str, dict[str, Callable[[list[Row]], str]]] = {
    "gpu": {"table": gpu_table, "speedups": gpu_speedups},
    "torch": {"table": torch_table, "transformers": transformers_table},
    "generate": {"table": generate_table}}


def load(stem: str) -> tuple[str, list[Row]]:
    """The family and the rows of ``docs/results/<stem>.json``, each key once."""
    family = stem.split("_")[0]
    if family not in KEYS:
        raise ValueError(f"{stem}: no family {family!r} (one of {sorted(KEYS)})")
    rows: list[Row] = json.loads((RESULTS / f"{stem}.json").read_text())
    seen: set[tuple[Any, ...]] = set()
    for r in rows:
        key = tuple(r.get(k) for k in KEYS[family])
        if key in seen:
            raise ValueError(f"{stem}: two rows for {dict(zip(KEYS[family], key, strict=True))}")
        seen.add(key)
    return family, rows


def render(name: str) -> str:
    """The table that marker ``name`` (``stem:view``) stands for."""
    stem, _, view = name.partition(":")
    family, rows = load(stem)
    if family == "cpu":
        return cpu_output(rows, view)
    if view not in VIEWS[family]:
        raise ValueError(f"results:{name}: no view {view!r} for {family} rows")
    return VIEWS[family][view](rows)


def regenerate(text: str) -> str:
    """``text`` with every marked table generated again from its rows."""
    def block(m: re.Match[str]) -> str:
        name = m["name"]
        return f"<!-- results:{name} -->\n\n{render(name)}\n\n<!-- /results:{name} -->"
    new, n = MARKER.subn(block, text)
    if n != len(re.findall(r"^<!-- results:", text, re.M)):
        raise ValueError("a <!-- results:NAME --> marker without its <!-- /results:NAME -->")
    return new


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a table differs from its rows")
    args = parser.parse_args(argv)
    stale = []
    for path in documents():
        text = path.read_text()
        new = regenerate(text)
        if new != text:
            stale.append(str(path.relative_to(ROOT)))
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"stale tables in {', '.join(stale)}: run python3 scripts/results_tables.py",
              file=sys.stderr)
        return 1
    for p in stale:
        print(f"rewrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
