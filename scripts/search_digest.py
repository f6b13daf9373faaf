"""A digest of what the search finds on every benchmark program at its small shapes: run it at
two commits and compare the JSON to show that a change leaves the search's results alone (with
``scripts/source_hashes.py`` for the generated Triton source).

Each search is bounded by work, never by time, and runs in this process (``workers=1``), so the
output is the same on any machine: the first N tasks (``TASKS``) with ``max_results=3``. Per
program: the number of results, a SHA-256 of their μGraphs' JSON text, kernel counts, estimated
times and the task each was found in, and the search's counts.

Usage, from the repository root of each checkout:
  PYTHONPATH=. python3 scripts/search_digest.py [PROGRAM ...] > digest.json
(about 10 minutes for all eight on a 2-core machine).
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import egraph_mirage as em
from egraph_mirage.mugraph.serialize import dumps
from egraph_mirage.search import SearchConfig

#: tasks searched per program: past each one's third result (``max_results`` ends it there)
TASKS = {"rmsnorm_linear": 60, "lora": 50, "gated_mlp": 60, "ntrans": 60, "mqa": 170,
         "gqa": 260, "mha": 260, "qknorm": 390}


def main(names: list[str]) -> dict[str, Any]:
    out = {}
    for name in names or TASKS:
        g = em.benchmarks.get(name, small=True)
        res = em.superoptimize(g, SearchConfig(max_results=3), max_tasks=TASKS[name], workers=1,
                               progress=False)
        st = res.stats
        rows = [[dumps(r.graph), r.num_kernels, r.estimated_seconds, r.found_at_task]
                for r in res]
        out[name] = {"n": len(rows),
                     "digest": hashlib.sha256(json.dumps(rows).encode()).hexdigest(),
                     "states": st.states, "pruned": st.pruned_by_oracle,
                     "verified": st.candidates_verified,
                     "tasks": [st.tasks_done, st.tasks_total], "stopped_by": st.stopped_by}
        print(name, out[name], file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), indent=1, sort_keys=True))
