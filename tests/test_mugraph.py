"""μGraph IR: construction checks, the three evaluators agree, and fused forms stay reachable."""

from __future__ import annotations

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures


def _xw(m: int = 4, k: int = 64, n: int = 32) -> tuple[em.KernelGraph, em.Tensor, em.Tensor]:
    g = em.new_kernel_graph()
    return g, g.new_input((m, k)), g.new_input((k, n))


def _matmul_kernel(grid: tuple[int, int, int] = (2, 1, 1), loop: int = 4,
                   wmap: tuple[int, int, int] = (1, -1, -1), omap=(1, -1, -1)):
    g, X, W = _xw()
    tb = em.new_threadblock_graph(grid_dim=grid, forloop_range=loop)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, wmap, forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(x, w)), omap)
    (O,) = g.customized([X, W], tb)
    g.mark_output(O)
    return g, X, W, O


def test_tile_shapes_follow_the_maps() -> None:
    _g, _X, _W, O = _matmul_kernel()
    tb = O.params["kernel"].tb
    assert [t.dims for t in tb.inputs] == [(4, 16), (16, 16)]
    assert O.dims == (4, 32)
    assert em.abstract_expr(O) == '(Sum 4 (Sum 16 (Mul (Var "v0") (Var "v1"))))'


@pytest.mark.parametrize("build, error, words", [
    (lambda tb, X, W: tb.new_input(X, (1, -1, -1), forloop_dim=1), em.MapError,
     ["dimension 1 of size 64", "does not split into 12"]),
    (lambda tb, X, W: tb.new_input(X, (5, -1, -1), -1), em.MapError, ["names dimension 5"]),
    (lambda tb, X, W: tb.new_input(X, (1, 1, -1), -1), em.MapError, ["two grid axes"]),
    (lambda tb, X, W: tb.new_input(X, (-1, -1), -1), em.MapError, ["one entry per grid axis"]),
    (lambda tb, X, W: tb.new_input(X, (-1, -1, -1), forloop_dim=3), em.MapError,
     ["forloop_dim 3"]),
])
def test_bad_input_maps(build, error, words: list[str]) -> None:
    _g, X, W = _xw()
    tb = em.new_threadblock_graph(grid_dim=(3, 1, 1), forloop_range=4)
    with pytest.raises(error) as info:
        build(tb, X, W)
    for w in words:
        assert w in str(info.value)


def test_omap_minus_one_on_a_split_grid_axis() -> None:
    with pytest.raises(em.MapError, match=r"leaves grid axis x \(2 blocks\) unmapped"):
        _matmul_kernel(omap=(-1, -1, -1))


def test_unused_grid_axis() -> None:
    g, X, _W = _xw()
    tb = em.new_threadblock_graph(grid_dim=(1, 4, 1), forloop_range=1)
    x = tb.new_input(X, (-1, -1, -1))
    tb.new_output(tb.forloop_accum(x), (-1, 0, -1))
    with pytest.raises(em.MapError, match="grid axis y has 4 blocks but no input_map splits"):
        g.customized([X], tb)


def test_binary_op_across_the_accumulator() -> None:
    _g, X, _W = _xw()
    tb = em.new_threadblock_graph(forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    acc = tb.forloop_accum(x)
    with pytest.raises(em.BlockGraphError, match="both sides of a for-loop accumulator"):
        tb.add(acc, x)


def test_invariant_tiles_may_meet_the_epilogue() -> None:
    g, X, W = _xw(n=16)
    B = g.new_input((4, 16))
    tb = em.new_threadblock_graph(forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, (-1, -1, -1), forloop_dim=0)
    b = tb.new_input(B, (-1, -1, -1), forloop_dim=-1)
    assert b.side == "invariant"
    tb.new_output(tb.add(tb.forloop_accum(tb.matmul(x, w)), b), (-1, -1, -1))
    (O,) = g.customized([X, W, B], tb)
    g.mark_output(O)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(t.dims) for t in g.inputs]
    np.testing.assert_allclose(em.run_reference(g, xs)[0], xs[0] @ xs[1] + xs[2], rtol=1e-12)
    np.testing.assert_allclose(g.evaluate(xs)[0], xs[0] @ xs[1] + xs[2], rtol=1e-12)


def test_output_needs_an_accumulator_and_accumulators_do_not_stack() -> None:
    _g, X, _W = _xw()
    tb = em.new_threadblock_graph(forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    with pytest.raises(em.BlockGraphError, match="has not passed through a forloop_accum"):
        tb.new_output(x, (-1, -1, -1))
    acc = tb.forloop_accum(x)
    with pytest.raises(em.BlockGraphError, match="already after an accumulator"):
        tb.forloop_accum(acc)
    with pytest.raises(em.BlockGraphError, match="unknown accumulator 'max'"):
        tb.forloop_accum(x, "max")


def test_shared_memory_budget() -> None:
    g = em.new_kernel_graph()
    X = g.new_input((256, 256))
    tb = em.new_threadblock_graph(forloop_range=1, smem_bytes=64 * 1024)
    tb.new_output(tb.forloop_accum(tb.exp(tb.new_input(X, (-1, -1, -1)))), (-1, -1, -1))
    with pytest.raises(em.ResourceError, match=r"over the budget of 65536 .*\(256, 256\)"):
        g.customized([X], tb)


def test_customized_checks_its_inputs() -> None:
    g, X, W, O = _matmul_kernel()
    tb = O.params["kernel"].tb
    with pytest.raises(em.GraphError, match="2 loaders but 1 inputs"):
        g.customized([X], tb)
    with pytest.raises(em.GraphError, match="does not match what loader 0"):
        g.customized([W, X], tb)


@pytest.mark.parametrize("acc, expected", [
    (None, lambda x: x.reshape(4, 4, 16).sum(1)),  # loop over dim 1 in 4 tiles of 16
    ("sum", lambda x: x.sum(1, keepdims=True)),
    ("mean", lambda x: x.mean(1, keepdims=True)),
    ("rms", lambda x: np.sqrt((x * x).mean(1, keepdims=True))),
    ("sum_todimx", lambda x: x.reshape(4, 8, 8).sum(1)),
])
def test_accumulators(acc, expected) -> None:
    g = em.new_kernel_graph()
    X = g.new_input((4, 64))
    tb = em.new_threadblock_graph(forloop_range=4, reduction_dimx=8)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(x, acc), (-1, -1, -1))
    (O,) = g.customized([X], tb)
    g.mark_output(O)
    x = np.random.default_rng(1).standard_normal((4, 64))
    if acc is None:  # tile i holds columns 16i..16i+15: the plain sum adds the tiles
        want = sum(x[:, 16 * i: 16 * i + 16] for i in range(4))
    else:
        want = expected(x)
    np.testing.assert_allclose(em.run_reference(g, [x])[0], want, rtol=1e-12)
    np.testing.assert_allclose(g.evaluate([x])[0], want, rtol=1e-12)


def test_loop_invariant_tensor_is_accumulated_every_iteration() -> None:
    g = em.new_kernel_graph()
    X = g.new_input((4, 8))
    tb = em.new_threadblock_graph(forloop_range=3)
    tb.new_output(tb.forloop_accum(tb.new_input(X, (-1, -1, -1), -1)), (-1, -1, -1))
    (O,) = g.customized([X], tb)
    g.mark_output(O)
    x = np.ones((4, 8))
    assert np.all(em.run_reference(g, [x])[0] == 3.0)
    assert np.all(g.evaluate([x])[0] == 3.0)
    assert em.abstract_expr(O) == '(Sum 3 (Var "v0"))'


@pytest.mark.parametrize("name", em.benchmarks.names())
def test_hand_written_mugraphs(name: str) -> None:
    """Block-by-block interpreter == vectorised evaluator == the program, and every tensor of
    the μGraph is reachable in the program's e-graph."""
    g = em.benchmarks.get(name, small=True)
    h = fixtures.fused(name, g)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(t.dims) for t in g.inputs]
    want = g.evaluate(xs)[0]
    np.testing.assert_allclose(em.run_reference(h, xs)[0], want, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(h.evaluate(xs)[0], want, rtol=1e-9, atol=1e-12)
    oracle = em.Oracle(g)
    assert all(oracle.is_subexpr(t) for t in h.operators)


def test_thread_chains_group_elementwise_ops() -> None:
    g = em.benchmarks.get("ntrans", small=True)
    h = fixtures.fused("ntrans", g)
    tb = h.outputs[0].params["kernel"].tb
    chains = tb.thread_chains()
    ops = [[t.op for t in c] for c in chains]
    assert ["add", "mul", "add"] in ops


def test_a_used_block_graph_cannot_change() -> None:
    _g, _X, _W, O = _matmul_kernel()
    tb = O.params["kernel"].tb
    with pytest.raises(em.BlockGraphError, match="already used by a kernel"):
        tb.exp(tb.inputs[0])


def test_block_ops_check_their_parameters() -> None:
    _g, X, _W = _xw()
    tb = em.new_threadblock_graph(forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    with pytest.raises(em.BlockGraphError, match=r"reduction: expects parameters \('dim',\)"):
        tb.apply("reduction", (x,))
    with pytest.raises(em.BlockGraphError, match="smem_bytes must be a positive integer"):
        em.new_threadblock_graph(smem_bytes="big")  # type: ignore[arg-type]
