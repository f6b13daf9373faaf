"""The reports of ``egraph-mirage bench gpu``: an aligned table, Markdown and a plot of its rows.

Columns: ours (the search's μGraphs), ``ref`` (the hand-written reference μGraphs, measured beside
ours and never counted as ours), each baseline, the best baseline, ours' speedups and ours
against the reference; a ``dtype`` column where the rows hold several dtypes. Rows written before
the reference column existed read as rows without it, rows without a ``dtype`` as float16 (every
row was, before ``--dtype``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .text_table import aligned

#: short names of the dtypes, as the tables and the results folders write them
SHORT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def short_dtype(dtype: str) -> str:
    """``bf16`` for ``"bfloat16"``, and so on (a name it does not know, unchanged)."""
    return SHORT_DTYPES.get(dtype, dtype)


def row_dtype(r: Mapping[str, Any]) -> str:
    """The row's dtype; float16 where the row has none (written before ``--dtype``)."""
    return r.get("dtype") or "float16"


def _dtype_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The ``dtype`` column's head and each row's cell where the rows hold several dtypes;
    else nothing (a table of one dtype looks as it always did)."""
    if len({row_dtype(r) for r in rows}) < 2:
        return [], [[] for _ in rows]
    return ["dtype"], [[short_dtype(row_dtype(r))] for r in rows]


def best(times: Mapping[str, float | None]) -> float | None:
    """The smallest time measured (None: none was)."""
    vals = [v for v in times.values() if v is not None]
    return min(vals) if vals else None


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, None where either is missing (or ``b`` is not positive)."""
    return None if a is None or b is None or b <= 0 else a / b


def fmt(x: float | None, digits: int = 1) -> str:
    """A figure for the table; – where missing."""
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _baseline_names(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        seen += [k for k in r["baselines_us"] if k not in seen]
    return seen


def table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Head and body: ours (the search's), the hand-written reference, each baseline, the best
    baseline, ours' speedup over it and ours against the reference (reference time / ours, so
    above 1 where ours is faster); a ``dtype`` column after ``b`` where the rows hold several.
    Rows written before the reference column read as without."""
    names = _baseline_names(rows)
    dtype_head, dtype_cells = _dtype_cells(rows)
    head = ["program", "b", *dtype_head, "floor", "ours", "ours+graph", "ref", "ref+graph"]
    for n in names:
        head += [n, f"{n}+graph"]
    head += ["best", "best+graph", "speedup", "speedup+graph", "ref/ours", "ref/ours+graph",
             "floor/ours+graph"]
    body = []
    for r, dtype in zip(rows, dtype_cells):
        cells = [r["benchmark"], str(r["batch"]), *dtype, fmt(r["floor_us"]), fmt(r["ours_us"]),
                 fmt(r["ours_graph_us"]), fmt(r.get("reference_us")),
                 fmt(r.get("reference_graph_us"))]
        for n in names:
            cells += [fmt(r["baselines_us"].get(n)), fmt(r["baselines_graph_us"].get(n))]
        cells += [fmt(best(r["baselines_us"])), fmt(best(r["baselines_graph_us"])),
                  fmt(r["speedup_vs_best"], 2), fmt(r["speedup_vs_best_graph"], 2),
                  fmt(r.get("ours_vs_reference"), 2), fmt(r.get("ours_vs_reference_graph"), 2),
                  fmt(r["floor_fraction_graph"], 2)]
        body.append(cells)
    return head, body


def search_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Head and body of the second table, on ours' candidates: the form of the winner, how
    many forms were timed, each form's best first timing and the cost model's rank
    correlation with the first timings (``gpu_bench.calibration``); a ``dtype`` column where
    the rows hold several. Empty where no row has timed candidates."""
    dtype_head, dtype_cells = _dtype_cells(rows)
    head = ["program", "b", *dtype_head, "timed", "forms", "winner form", "rank corr",
            "best per form (µs)"]
    body = []
    for r, dtype in zip(rows, dtype_cells):
        if not r.get("form_us"):  # nothing timed (or a row written before this table)
            continue
        per_form = ", ".join(f"{f}: {us:.1f}" for f, us in
                             sorted((r.get("form_us") or {}).items(), key=lambda kv: kv[1]))
        body.append([r["benchmark"], str(r["batch"]), *dtype, str(r["candidates"]),
                     str(r.get("forms_timed", "–")), r.get("winner_form") or "–",
                     fmt(r.get("cost_model_rank_corr"), 2), per_form or "–"])
    return head, body


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as an aligned text table (µs; speedups over the best baseline, like for like),
    followed by the search-results table (``search_cells``) where there is one."""
    head, body = table_cells(rows)
    dtype_cols = len(_dtype_cells(rows)[0])  # left-aligned, as program and b are
    out = aligned(head, body, left=2 + dtype_cols)
    s_head, s_body = search_cells(rows)
    if s_body:
        out += [""] + aligned(s_head, s_body, left=5 + dtype_cols)
    return "\n".join(out)


def markdown(rows: Sequence[Mapping[str, Any]], date: str, command: str,
             bandwidth: float | None = None) -> str:
    """A Markdown report of the rows: device, date, command, then the table."""
    head, body = table_cells(rows)
    devices = sorted({r["device"] for r in rows})
    lines = ["# GPU benchmarks", "",
             f"Measured on {', '.join(devices)}, {date}, with `{command}`.", ""]
    if bandwidth:
        lines += [f"Copy bandwidth measured in the same run: {bandwidth / 1e12:.2f} TB/s "
                  "(bytes read + written); floor = input + output bytes at that rate.", ""]
    dtypes = sorted({short_dtype(row_dtype(r)) for r in rows})
    dtype_text = (f"{' and '.join(dtypes)} (the dtype column)" if len(dtypes) > 1
             else dtypes[0] if dtypes else "fp16")
    lines += [f"{dtype_text}, µs, medians. Plain: `triton.testing.do_bench` (L2 flushed); "
              "+graph: replay of a captured CUDA graph, inputs rotated when they fit in L2. "
              "`ours`: the fastest of the search's μGraphs and their size variants, each "
              "tuned (the JSON rows name its file); `ref`: the fastest hand-written reference "
              "μGraph, measured the same way, never counted as ours. Speedup: best baseline "
              "over ours; ref/ours: reference over ours; plain vs plain and graph vs graph. – "
              "where nothing was measured (the notes say why).", "",
              "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    s_head, s_body = search_cells(rows)
    if s_body:
        lines += ["", "Ours' candidates: the winner's form (graph-defined kernels + library "
                  "operators), the forms timed, the cost model's rank correlation with the "
                  "first timings (Spearman; 1: the same order) and each form's best first "
                  "timing.", "", "| " + " | ".join(s_head) + " |", "|" + "---|" * len(s_head)]
        lines += ["| " + " | ".join(cells) + " |" for cells in s_body]
    where: dict[str, list[str]] = {}  # a note shared by several rows is written once
    for r in rows:
        for n in r["notes"]:
            where.setdefault(n, []).append(f"{r['benchmark']} b={r['batch']}")
    if where:
        lines += ["", "Notes:", ""]
        lines += [f"- {n} ({'every row' if len(w) == len(rows) > 1 else ', '.join(w)})"
                  for n, w in where.items()]
    return "\n".join(lines) + "\n"


def _graph_us(r: Mapping[str, Any], system: str) -> float | None:
    if system == "ours":
        return r["ours_graph_us"]
    if system == "reference":
        return r.get("reference_graph_us")
    return r["baselines_graph_us"].get(system)


def plot(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """A PNG of floor / time (graph replay) per program and system (ours, the hand-written
    reference, the baselines), and of ours' speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['benchmark']}\nb={r['batch']}" for r in rows]
    has_ours = any(r["ours_graph_us"] is not None for r in rows)
    has_ref = any(r.get("reference_graph_us") is not None for r in rows)
    systems = ["ours"] * has_ours + ["reference"] * has_ref + _baseline_names(rows)
    fig, axes = plt.subplots(2 if has_ours else 1, 1, figsize=(max(8, 0.9 * len(rows)), 8),
                             squeeze=False)
    ax = axes[0][0]
    width = 0.8 / max(1, len(systems))
    for i, s in enumerate(systems):
        vals = [ratio(r["floor_us"], _graph_us(r, s)) or 0.0 for r in rows]
        ax.bar([x + i * width for x in range(len(rows))], vals, width,
               label="reference (hand-written)" if s == "reference" else s)
    ax.set_ylabel("floor / time (CUDA graph)")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, fontsize=7)
    ax.legend(fontsize=7)
    ax.set_title(f"{rows[0]['device'] if rows else ''}: fraction of the bandwidth floor")
    if has_ours:
        ax2 = axes[1][0]
        for i, key in enumerate(("speedup_vs_best", "speedup_vs_best_graph")):
            ax2.bar([x + i * 0.4 for x in range(len(rows))], [r[key] or 0.0 for r in rows], 0.4,
                    label="plain" if i == 0 else "CUDA graph")
        ax2.axhline(1.0, color="k", linewidth=0.8)
        ax2.set_ylabel("speedup of ours over best baseline")
        ax2.set_xticks([x + 0.2 for x in range(len(rows))], labels, fontsize=7)
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
