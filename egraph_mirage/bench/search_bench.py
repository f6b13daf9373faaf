"""Search benchmark: does ``superoptimize`` rediscover the fused programs, and how fast?

``bench_search()`` runs the search on each benchmark program (paper shapes, batch 1, by default)
with the default ``SearchConfig`` and reports per program:

* ``seconds_to_first`` / ``seconds_to_best``: wall-clock seconds from the start of the search
  (oracle included) until the first verified μGraph and until the one ranked best;
* ``seconds_total``: the whole run (the time budget when ``finished`` is false);
* ``states``, ``pruned_by_oracle``, ``candidates_verified``, ``candidates_rejected``, ``found``;
* ``best_num_kernels`` and ``best_largest_intermediate``: kernel launches of the best μGraph and
  the elements of the largest tensor it writes to device memory that is neither an input nor the
  output (``program_largest_intermediate`` is the same for the input program: for attention, the
  scores);
* ``verified``: the best μGraph passed the finite-field tests and the float check (every result
  of the search does; false when nothing was found);
* ``goal_max_kernels`` and ``met``: what the project asks of the search on this program (at most
  that many kernels, and no intermediate as large as the program's largest) and whether the
  best-ranked result meets it; ``goal_found`` / ``seconds_to_goal``: whether some result meets it,
  and when the first of them was found (the ranking may prefer another: the cost model can judge
  writing the scores cheaper than a fused kernel with few blocks);
* ``tasks_to_first``: tasks done when the first result was found;
* with ``winners`` (per program, the μGraph that won on the GPU: ``load_winners`` reads them from
  the rows of ``bench gpu --json``): ``winner_found``, ``seconds_to_winner`` and
  ``tasks_to_winner``, for the first result of the winner's *structure* (``structure_of``: sizes
  erased, so a winner timed at another batch or retuned still counts).

``use_oracle=False`` (``--no-oracle``) switches e-graph pruning off to show what it buys: every
complete block graph with one output is then verified.

``dtype`` (``--dtype``, default float16) is the element type the programs are built and searched
in; each row records it. A results folder holds one dtype: ``out/<name>_b<batch>/`` for float16
(the layout of every earlier run), ``out/<name>_b<batch>_bf16/`` for bfloat16
(``results_dir_name``), so that ``bench gpu --dtype`` never reads a search of another dtype.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import benchmarks
from ..dtypes import DType, float16
from ..errors import EMError
from ..graph import KernelGraph
from ..mugraph.serialize import loads
from ..mugraph.sizes import retarget, structure_of
from ..pipeline import DEFAULT_BUDGETS, Request, run
from .gpu_report import short_dtype
from .text_table import aligned

#: what each search of the benchmark is asked by default: ten minutes, silent
BENCH_REQUEST = Request(time_budget=DEFAULT_BUDGETS["bench search"], progress=False)
KEYS = ("benchmark", "seconds_to_first", "seconds_to_best", "seconds_total", "states",
        "best_num_kernels", "verified", "met")
#: most kernel launches the best μGraph may have, per program (the search never reads this)
GOALS: dict[str, int] = {"rmsnorm_linear": 1, "gated_mlp": 1, "lora": 1, "ntrans": 1,
                         "gqa": 2, "mha": 2, "mqa": 2, "qknorm": 2}


def dtype_suffix(dtype: DType) -> str:
    """What a results folder's name ends in for ``dtype``: nothing for float16 (the layout of
    every run before bfloat16 was searched), ``_bf16`` for bfloat16."""
    return "" if dtype is float16 else f"_{short_dtype(dtype.value)}"


def results_dir_name(name: str, batch: int, dtype: DType = float16) -> str:
    """The folder (under ``--out`` / ``--mugraph-dir``) of program ``name``'s search at
    ``batch`` in ``dtype``: ``<name>_b<batch>`` for float16, ``<name>_b<batch>_bf16`` for
    bfloat16."""
    return f"{name}_b{batch}{dtype_suffix(dtype)}"


def largest_intermediate(g: KernelGraph) -> int:
    """Elements of the largest tensor ``g`` writes to device memory besides its outputs."""
    outs = {id(t) for t in g.outputs}
    return max((math.prod(t.dims) for t in g.operators if id(t) not in outs), default=0)


def bench_search(names: Sequence[str] | None = None, *, small: bool = False, batch: int = 1,
                 request: Request | None = None, use_oracle: bool = True,
                 max_block_ops: int | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None,
                 out: str | Path | None = None,
                 winners: Mapping[str, KernelGraph] | None = None,
                 dtype: DType = float16) -> list[dict[str, Any]]:
    """One row per program, built in ``dtype``; see the module docstring for the keys.
    ``on_row`` sees each row as soon as its program is done. ``out``: each program's results
    are also written to ``out/<name>_b<batch>/`` (``_bf16`` appended for bfloat16:
    ``results_dir_name``) in ``optimize``'s layout (what ``bench gpu --mugraph-dir`` reads).
    ``request``: each search's budgets, workers, rules and progress (default:
    ``BENCH_REQUEST``); its configuration gets ``use_oracle`` and ``max_block_ops``."""
    from ..rank.measured import keep_jax_off_the_gpu

    keep_jax_off_the_gpu()  # a search on a GPU host: every worker's JAX would take its memory
    rows = []
    for name in names or benchmarks.names():
        g = benchmarks.get(name, batch=batch, small=small, dtype=dtype)
        overrides: dict[str, Any] = {"use_oracle": use_oracle}
        if max_block_ops is not None:
            overrides["max_block_ops"] = max_block_ops
        asked = replace(request or BENCH_REQUEST,
                        config=replace((request or BENCH_REQUEST).config, **overrides))
        t0 = time.perf_counter()
        folder = None if out is None else Path(out) / results_dir_name(name, batch, dtype)
        results = run(g, asked, out=folder, program_info={
            "name": name, "batch": batch, "small": small, "dtype": dtype.value})
        total = time.perf_counter() - t0
        st, best = results.stats, results.best
        program_big = largest_intermediate(g)
        best_big = largest_intermediate(best.graph) if best is not None else None
        goal = GOALS.get(name)

        def meets(r: Any) -> bool:
            return (goal is not None and r.num_kernels <= goal
                    and largest_intermediate(r.graph) < program_big)

        met = best is not None and meets(best)
        to_goal = min((r.found_after for r in results if meets(r)), default=None)
        first = min(results, key=lambda r: r.found_after, default=None)
        won = _first_of(results, winners.get(name)) if winners else None
        rows.append({
            "benchmark": name, "batch": batch, "dtype": dtype.value, "small": small,
            "use_oracle": use_oracle,
            "seconds_to_first": st.seconds_to_first, "seconds_to_best": st.seconds_to_best,
            "seconds_total": total, "finished": st.tasks_done == st.tasks_total,
            "tasks_done": st.tasks_done, "tasks_total": st.tasks_total,
            "states": st.states, "pruned_by_oracle": st.pruned_by_oracle,
            "candidates_verified": st.candidates_verified,
            "candidates_rejected": st.candidates_rejected, "found": len(results),
            "best_num_kernels": best.num_kernels if best is not None else None,
            "best_largest_intermediate": best_big,
            "program_largest_intermediate": program_big,
            "verified": best is not None,
            "best_numeric_error": best.numeric_error if best is not None else None,
            "goal_max_kernels": goal, "met": bool(met),
            "goal_found": to_goal is not None, "seconds_to_goal": to_goal,
            "tasks_to_first": first.found_at_task if first is not None else None,
            "winner_found": None if not winners or name not in winners else won is not None,
            "seconds_to_winner": won.found_after if won is not None else None,
            "tasks_to_winner": won.found_at_task if won is not None else None,
        })
        if on_row is not None:
            on_row(rows[-1])
    return rows


def _first_of(results: Sequence[Any], winner: KernelGraph | None) -> Any:
    """The earliest found of ``results`` with ``winner``'s structure (None: none has it), the
    winner first retargeted to the results' shapes where it was timed at another batch (a
    grid axis it gave a grown batch of one cuts nothing there)."""
    if winner is None or not results:
        return None
    shapes = [t.dims for t in results[0].graph.inputs]
    if [t.dims for t in winner.inputs] != shapes:
        try:
            winner = retarget(winner, results[0].graph)
        except EMError:
            return None
    want = structure_of(winner)
    hits = [r for r in results if structure_of(r.graph) == want]
    return min(hits, key=lambda r: r.found_after, default=None)


def load_winners(path: str | Path, dtype: DType = float16) -> dict[str, KernelGraph]:
    """Per program, the μGraph that won on the GPU in ``dtype``, from a JSON list of ``bench
    gpu`` rows (``winner_mugraph``; a row without ``dtype`` is float16, as every row was before
    the flag); the batch-1 row where a program has several. A ``ValueError`` names the file
    when it is not such a list."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read GPU rows ({e})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{path}: expected a JSON list of `bench gpu` rows")
    out: dict[str, KernelGraph] = {}
    rows = [r for r in rows if r.get("dtype", float16.value) == dtype.value]
    for r in sorted(rows, key=lambda r: r.get("batch") != 1):
        name, text = r.get("benchmark"), r.get("winner_mugraph")
        if name and text and name not in out:
            try:
                out[name] = loads(text)
            except (EMError, ValueError) as e:
                raise ValueError(f"{path}: the winner of {name} is not a μGraph ({e})") from None
    return out


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as an aligned text table."""
    head = ("program", "first s", "best s", "total s", "done", "states", "pruned (e-graph)",
            "verified", "found", "kernels", "largest written", "goal", "best meets it",
            "first meeting it s", "GPU winner s (tasks)")
    body = []
    for r in rows:
        big = r["best_largest_intermediate"]
        body.append((r["benchmark"], _secs(r["seconds_to_first"]), _secs(r["seconds_to_best"]),
                     _secs(r["seconds_total"]),
                     "all" if r["finished"] else f"{r['tasks_done']}/{r['tasks_total']}",
                     f"{r['states']:,}", f"{r['pruned_by_oracle']:,}",
                     f"{r['candidates_verified']} ({r['candidates_rejected']} rej.)",
                     str(r["found"]),
                     "-" if r["best_num_kernels"] is None else str(r["best_num_kernels"]),
                     "-" if big is None else f"{big:,} / {r['program_largest_intermediate']:,}",
                     "-" if r["goal_max_kernels"] is None else f"<= {r['goal_max_kernels']}",
                     "yes" if r["met"] else "NO", _secs(r.get("seconds_to_goal")),
                     _winner(r)))
    return "\n".join(aligned(head, body))


def _winner(r: Mapping[str, Any]) -> str:
    if r.get("winner_found") is None:
        return "-"
    if not r["winner_found"]:
        return "not found"
    return f"{r['seconds_to_winner']:.1f} ({r['tasks_to_winner']})"
