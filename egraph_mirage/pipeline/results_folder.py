"""Search results on disk: the folder ``egraph-mirage optimize --out DIR`` writes and
``egraph-mirage bench gpu --mugraph-dir`` reads.

One folder per program (and batch)::

    DIR/result_0.json, result_1.json, ...   every verified μGraph, best first (``em.load``)
    DIR/best.json                           the best one again (absent when none was found)
    DIR/results.json                        each result's figures, the program, the statistics
    DIR/search.ckpt                         the checkpoint a rerun resumes from

``bench gpu --mugraph-dir ROOT`` looks for a program's folder as ``ROOT/<name>_b<batch>/``, then
``ROOT/<name>/`` (see ``bench.gpu_bench.candidates``). Nothing here imports egglog, JAX or torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..files import write_atomic
from ..search.results import SearchResults

RESULT_FILE = re.compile(r"result_(\d+)\.json")


def result_files(folder: str | Path) -> list[Path]:
    """``folder/result_<k>.json`` in the order of k (the search's ranking, best first)."""
    found = [(int(m.group(1)), f) for f in Path(folder).glob("result_*.json")
             if (m := RESULT_FILE.fullmatch(f.name))]
    return [f for _, f in sorted(found)]


def mugraph_files(folder: str | Path) -> list[Path]:
    """The μGraphs of a results folder: every ``result_<k>.json``, else ``best.json``, else
    none."""
    files = result_files(folder)
    best = Path(folder) / "best.json"
    return files or ([best] if best.is_file() else [])


def write_results(folder: str | Path, results: SearchResults,
                  program: Mapping[str, Any] | None = None) -> None:
    """Write ``results`` in the layout above; ``result_<k>.json`` files of an earlier run beyond
    the new count, and a stale ``best.json``, are removed. ``program`` (e.g. name and batch) is
    recorded in ``results.json``."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for k, r in enumerate(results):
        write_atomic(out / f"result_{k}.json", r.to_json())
    for f in result_files(out)[len(results):]:
        f.unlink()
    best = out / "best.json"
    if results.best is not None:
        write_atomic(best, results.best.to_json())
    elif best.exists():
        best.unlink()
    rows = [{"file": f"result_{k}.json", "num_kernels": r.num_kernels,
             "estimated_us": r.estimated_seconds * 1e6, "measured_us": r.measured_us,
             "knobs": r.knobs, "verify_bound": r.verify_bound, "verify_tests": r.verify_tests,
             "numeric_error": r.numeric_error, "found_after": r.found_after,
             "found_at_task": r.found_at_task}
            for k, r in enumerate(results)]
    summary = {"program": dict(program or {}), "ranked_by": results.stats.ranked_by,
               "results": rows, "stats": results.stats.as_dict()}
    write_atomic(out / "results.json", json.dumps(summary, indent=1, default=str))
