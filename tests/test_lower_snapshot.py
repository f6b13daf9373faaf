"""Snapshots of generated Triton sources: the small hand-written RMSNorm + Linear μGraph, a
split-K form whose combine kernel is fused into its producer, and one-kernel attention (2-D
blocks for tiles with a batch of one).

A change in the generated code shows up here as a diff. To accept it, regenerate:

    EM_UPDATE_SNAPSHOTS=1 python -m pytest tests/test_lower_snapshot.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.lower import generate_source

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"


def _check(name: str, source: str) -> None:
    snapshot = SNAPSHOTS / name
    if os.environ.get("EM_UPDATE_SNAPSHOTS") == "1":
        snapshot.write_text(source, encoding="utf-8")
    expected = snapshot.read_text(encoding="utf-8")
    diff = "".join(difflib.unified_diff(expected.splitlines(True), source.splitlines(True),
                                        snapshot.name, "generated"))
    assert source == expected, ("generated source differs from the snapshot (regenerate with "
                                f"EM_UPDATE_SNAPSHOTS=1):\n{diff}")


def test_rmsnorm_linear_source_snapshot() -> None:
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    _check("rmsnorm_linear_small.py.snap",
           generate_source(fixtures.fused("rmsnorm_linear", g)))


def test_fused_split_k_source_snapshot() -> None:
    """The split-K form with its combine fused: one kernel whose last block per column tile
    sums the fp32 partials."""
    g = em.new_kernel_graph()
    X, W = g.new_input((2, 256)), g.new_input((256, 32))
    g.mark_output(g.matmul(g.rms_norm(X, (256,)), W))
    h = fixtures.rmsnorm_linear_split_k(g, fixtures.Tiles(grid=16, splits=4))
    _check("rmsnorm_linear_split_k_fused.py.snap", generate_source(h))


def test_one_kernel_attention_source_snapshot() -> None:
    """Attention in one kernel: every tile is (1, rows, cols), written as 2-D blocks (the batch
    dimension of one left out), so both products are plain tl.dot calls."""
    g = em.benchmarks.get("gqa", small=True)
    _check("gqa_one_kernel_small.py.snap", generate_source(fixtures.attention_one_kernel(g)))
