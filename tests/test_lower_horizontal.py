"""Sibling kernels in one launch (``lower.horizontal``, ``LowerOptions.horizontal``): kernels of a
program of several outputs that read none of each other's outputs run as the blocks of one
grid, and the program computes what it computed with one launch each."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as hw
from egraph_mirage.lower import LowerOptions, canonical_knobs, fuse, generate_source, graph_knobs
from egraph_mirage.lower.horizontal import flat_pid_lines, groups
from egraph_mirage.mugraph import ThreadBlockGraph
from egraph_mirage.pipeline.outputs import cone, join


def _projection(g: em.KernelGraph, x: em.Tensor, w: em.Tensor, tile: int) -> em.Tensor:
    """``x @ w`` as a graph-defined kernel of ``w.dims[1] // tile`` blocks, each a column tile."""
    tb = ThreadBlockGraph(grid_dim=(w.dims[1] // tile, 1, 1), forloop_range=1)
    a = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=-1)
    b = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=-1)
    tb.new_output(tb.forloop_accum(tb.matmul(a, b)), output_map=(1, -1, -1))
    (out,) = g.customized([x, w], tb)
    return out


def _siblings(chain: bool = False) -> em.KernelGraph:
    g = em.new_kernel_graph()
    x = g.new_input((4, 32), em.float16)
    wq, wk = g.new_input((32, 64), em.float16), g.new_input((32, 32), em.float16)
    q = _projection(g, x, wq, 16)
    k = _projection(g, q if chain else x, wk if not chain else g.new_input((64, 32), em.float16),
                    8)
    g.mark_output(q)
    g.mark_output(k)
    return g


def test_siblings_run_as_one_grid_and_match() -> None:
    g = _siblings()
    (run,) = groups(g, {})
    assert len(run) == 2
    assert graph_knobs(g)["horizontal"] == (True, False)  # on first: the first timing's
    one = generate_source(g, LowerOptions(horizontal=True))
    assert one.count("_launch(kernel_") == 1 and "(8, 1, 1)" in one  # 4 + 4 blocks
    assert generate_source(g).count("_launch(kernel_") == 2
    rng = np.random.default_rng(0)
    ts = [torch.tensor(0.5 * rng.standard_normal(t.dims), dtype=torch.float16)
          for t in g.inputs]
    want = g.evaluate([t.double().numpy() for t in ts])
    for options in ({}, {"horizontal": True}):
        got = em.compile(g, **options)(*ts)
        for a, b in zip(got, want, strict=True):
            assert np.abs(a.double().numpy() - b).max() <= 1e-2 * np.abs(b).max()


def test_a_kernel_reading_its_neighbour_s_output_is_launched_after_it() -> None:
    g = _siblings(chain=True)
    assert groups(g, {}) == []
    assert "horizontal" not in graph_knobs(g)
    assert canonical_knobs(g, {"horizontal": True}) == {"horizontal": False}
    assert generate_source(g, LowerOptions(horizontal=True)).count("_launch(kernel_") == 2


def test_not_with_programmatic_dependent_launch() -> None:
    g = _siblings()
    assert canonical_knobs(g, {"horizontal": True, "pdl": True})["horizontal"] is False
    assert generate_source(g, LowerOptions(horizontal=True, pdl=True)).count(
        "_launch(kernel_") == 2


@pytest.mark.parametrize("grid, want", [
    ((8, 1, 1), ["pid_x = hpid"]),
    ((4, 3, 1), ["pid_x = hpid % 4", "pid_y = (hpid // 4)"]),
    ((2, 1, 5), ["pid_x = hpid % 2", "pid_z = (hpid // 2)"]),
    ((2, 3, 5), ["pid_x = hpid % 2", "pid_y = (hpid // 2) % 3", "pid_z = (hpid // 6)"]),
])
def test_the_block_index_of_a_flat_grid(grid: tuple[int, int, int], want: list[str]) -> None:
    assert flat_pid_lines(grid) == want


def test_siblings_reading_weights_through_their_own_strides_run_as_one_grid() -> None:
    """A model's projections read ``nn.Linear``'s weights, stored (out, in), as Wᵀ through the
    view's strides (``LowerOptions.input_strides``): such siblings are one launch too, each
    block body reading its weight through its own strides, with no copy; the program matches
    the one reading contiguous copies, launch by launch."""
    g = _siblings()
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 32, generator=gen) / 4).half()
    stored = [(torch.randn(n, 32, generator=gen) / 4).half() for n in (64, 32)]  # (out, in)
    wq, wk = (w.t() for w in stored)  # (32, out), strides (1, 32)
    strides = (None, (1, 32), (1, 32))
    one = em.compile(g, horizontal=True, input_strides=strides)
    assert one.source.count("_launch(kernel_") == 1 and one.source.count("(1, 32)") >= 2
    want = em.compile(g)(x, wq.contiguous(), wk.contiguous())
    for got in (one(x, wq, wk), one.module.launch(x, wq, wk)):  # checked, then direct
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b)


def test_split_k_siblings_with_fused_combines_run_as_one_launch() -> None:
    """An RMSNorm feeding two projections, each output's μGraph split-K in two kernels whose
    combine is fused into the split (``lower.fuse``): joined (``pipeline.outputs.join``: the
    splits, then the combines), both pairs run in one launch, each pair's completion counters
    a range of one buffer of both; the program matches, called twice (the counters left at
    zero), and so does its traced launch with fresh counters."""
    g = em.new_kernel_graph()
    x, w1, w2 = g.new_input((3, 256)), g.new_input((256, 48)), g.new_input((256, 32))
    n = g.rms_norm(x, (256,))
    g.mark_output(g.matmul(n, w1))
    g.mark_output(g.matmul(n, w2))
    parts = []
    for i in range(2):
        part, positions = cone(g, i)
        parts.append((hw.rmsnorm_linear_split_k(part, hw.Tiles(grid=16, loop=32, splits=4)),
                      positions))
    joined = join(g, parts)
    combines = fuse.plan(joined)
    assert len({id(c) for c in combines.values()}) == 2
    (run,) = groups(joined, combines)
    assert len(run) == 2
    assert graph_knobs(joined)["horizontal"] == (True, False)
    source = generate_source(joined, LowerOptions(horizontal=True))
    assert source.count("    _launch(kernel_") == 1 and "COUNTERS = 10" in source  # 6 + 4 groups
    assert "group = 6 + pid_x" in source  # the second pair's counters after the first's
    assert generate_source(joined).count("    _launch(kernel_") == 2
    rng = np.random.default_rng(0)
    ts = [torch.tensor(0.3 * rng.standard_normal(t.dims), dtype=torch.float16)
          for t in g.inputs]
    want = g.evaluate([t.double().numpy() for t in ts])
    fn = em.compile(joined, horizontal=True)
    for got in (fn(*ts), fn(*ts), fn.module.launch_traced(*ts)):
        for a, b in zip(got, want, strict=True):
            assert np.abs(a.double().numpy() - b).max() <= 1e-2 * np.abs(b).max()
