"""Snapshot of the generated Triton source for the small hand-written RMSNorm + Linear μGraph.

A change in the generated code shows up here as a diff. To accept it, regenerate:

    EM_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_lower_snapshot.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import egraph_mirage as em
from egraph_mirage.lower import generate_source

SNAPSHOT = Path(__file__).resolve().parent / "snapshots" / "rmsnorm_linear_small.py.snap"


def test_rmsnorm_linear_source_snapshot() -> None:
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    source = generate_source(em.handwritten.fused("rmsnorm_linear", g))
    if os.environ.get("EM_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(source, encoding="utf-8")
    expected = SNAPSHOT.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(expected.splitlines(True), source.splitlines(True),
                                        str(SNAPSHOT.name), "generated"))
    assert source == expected, ("generated source differs from the snapshot (regenerate with "
                                f"EM_UPDATE_SNAPSHOTS=1):\n{diff}")
