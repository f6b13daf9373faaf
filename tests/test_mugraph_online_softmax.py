"""Online softmax: the running max (``forloop_max``) and rescaled accumulators
(``forloop_accum(..., rescale=m)``), and the hand-written single-kernel FlashAttention."""

from __future__ import annotations

import random

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.bench.handwritten_fixtures import _same_inputs, _tile
from egraph_mirage.mugraph.mutate import mutants

ATTENTION = ("gqa", "mha", "mqa")


def _flash_variant(g: em.KernelGraph, sign: float = -1.0, rescale_o: bool = True,
                   rescale_sum: bool = True) -> em.KernelGraph:
    """flash_attention with a switchable sign of the max and switchable rescales."""
    h, (Q, K, V) = _same_inputs(g)
    heads, lq, _ = Q.dims
    lk = K.dims[2]
    tq, tk = _tile(lq), _tile(lk)
    tb = em.new_threadblock_graph(grid_dim=(heads, lq // tq, 1), forloop_range=lk // tk)
    q = tb.new_input(Q, (0, 1, -1), forloop_dim=-1)
    k = tb.new_input(K, (0, -1, -1), forloop_dim=2)
    v = tb.new_input(V, (0, -1, -1), forloop_dim=1)
    s = tb.matmul(q, k)
    m = tb.forloop_max(s)
    p = tb.exp(tb.add(s, tb.mul_scalar(m, sign)))
    o = tb.forloop_accum(tb.matmul(p, v), rescale=m if rescale_o else None)
    den = tb.forloop_accum(p, "sum", rescale=m if rescale_sum else None)
    tb.new_output(tb.div(o, den), (0, 1, -1))
    (O,) = h.customized([Q, K, V], tb)
    h.mark_output(O)
    return h


def _inputs(g: em.KernelGraph, scale: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [scale * rng.standard_normal(t.dims) for t in g.inputs]


@pytest.mark.parametrize("name", ATTENTION)
def test_flash_attention_matches_and_verifies(name: str) -> None:
    g = em.benchmarks.get(name, small=True)
    h = fixtures.flash_attention(g)
    assert len(h.operators) == 1 and h.operators[0].op == "customized"  # one kernel
    xs = _inputs(g)
    (want,) = g.evaluate(xs)
    (blocks,) = em.run_reference(h, xs)
    (vectorised,) = h.evaluate(xs)
    assert np.allclose(blocks, want, rtol=1e-12, atol=1e-12)
    assert np.allclose(vectorised, blocks, rtol=1e-12, atol=1e-12)
    assert em.check_numerics(h, g) < 1e-9
    res = em.verify(g, h)
    assert res.equivalent and res.bound < 1e-7
    assert em.Verifier(g, backend="numpy", seed=5).check(h).equivalent


def test_max_subtraction_keeps_large_scores_finite() -> None:
    """Scores around 1000: exp overflows without the max, not with it (the block-by-block
    interpreter, the literal online algorithm, stays finite and matches a stable softmax)."""
    g = em.benchmarks.get("mqa", small=True)
    h = fixtures.flash_attention(g)
    xs = _inputs(g, scale=8.0, seed=1)
    Q, K, V = xs
    s = Q @ K
    assert s.max() > 710  # exp(s) overflows float64
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ V
    (got,) = em.run_reference(h, xs)
    assert np.all(np.isfinite(got)) and np.allclose(got, want, rtol=1e-9, atol=1e-9)
    assert np.allclose(h.evaluate(xs)[0], want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", ATTENTION)
@pytest.mark.parametrize("wrong", [dict(sign=1.0), dict(rescale_o=False),
                                   dict(rescale_sum=False),
                                   dict(rescale_o=False, rescale_sum=False)])
def test_online_softmax_mistakes_are_rejected(name: str, wrong: dict) -> None:
    g = em.benchmarks.get(name, small=True)
    h = _flash_variant(g, **wrong)
    assert em.check_numerics(h, g) > 1e-3  # really wrong
    assert not em.verify(g, h).equivalent


def test_running_max_and_rescale_semantics() -> None:
    """A rescaled plain accumulator is sum_i x_i exp(m_i - max m), which for a running max is
    exp(m_i - m_last); the running max is cumulative; both evaluators agree, also for a rescale
    tile that is not a running max (its weights relative to its own largest value)."""
    g = em.new_kernel_graph()
    X = g.new_input((4, 32))
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4, reduction_dimx=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)  # (2, 8) tiles
    m = tb.forloop_max(x)
    assert m.side == "loop" and m.dims == (2, 1)
    tb.new_output(tb.forloop_accum(x, "sum", rescale=m), (0, -1, -1))
    tb.new_output(tb.forloop_accum(x, rescale=x), (0, -1, -1))  # weights exp(x_i - max x)
    tb.new_output(tb.forloop_accum(x, "sum_todimx", rescale=m), (0, -1, -1))
    outs = g.customized([X], tb)
    for o in outs:
        g.mark_output(o)
    xs = _inputs(g)
    x4 = xs[0].reshape(4, 4, 8)  # rows, iteration, column
    run = np.maximum.accumulate(x4.max(-1), axis=1)  # (rows, iteration)
    w = np.exp(run - run[:, -1:])
    assert np.allclose(g.evaluate(xs)[0][:, 0], (x4.sum(-1) * w).sum(1))
    assert np.allclose(g.evaluate(xs)[1], (x4 * np.exp(x4 - x4.max(1, keepdims=True))).sum(1))
    for a, b in zip(em.run_reference(g, xs), g.evaluate(xs)):
        assert np.allclose(a, b, rtol=1e-12)
    assert em.verify(g, g).equivalent


def test_invariant_running_max_is_the_tile_max() -> None:
    g = em.new_kernel_graph()
    X = g.new_input((2, 8))
    tb = em.new_threadblock_graph(forloop_range=3)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=-1)
    m = tb.forloop_max(x)
    assert m.side == "invariant"
    tb.new_output(tb.forloop_accum(tb.exp(tb.add(x, tb.mul_scalar(m, -1.0))), "sum"),
                  (-1, -1, -1))
    (O,) = g.customized([X], tb)
    g.mark_output(O)
    assert em.abstract_expr(O).startswith('(Sum 24 (Exp (Add (Var "v0") (Mul (Max 8 (Var "v0"))')
    xs = _inputs(g)
    want = 3 * np.exp(xs[0] - xs[0].max(-1, keepdims=True)).sum(-1, keepdims=True)
    assert np.allclose(em.run_reference(g, xs)[0], want) and np.allclose(g.evaluate(xs)[0], want)


def _row_softmax_sum(loop: int, rescale: bool = True, of_max: bool = False) -> em.KernelGraph:
    """sum_k exp(x_k - max(x)) per row, computed online over ``loop`` tiles (or, with
    ``of_max``, sum_i exp(m_i) exp(m_i - m_last): a function of the intermediate maxima)."""
    g = em.new_kernel_graph()
    X = g.new_input((4, 64))
    tb = em.new_threadblock_graph(grid_dim=(4, 1, 1), forloop_range=loop)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)
    m = tb.forloop_max(x)
    term = tb.exp(m) if of_max else tb.exp(tb.add(x, tb.mul_scalar(m, -1.0)))
    tb.new_output(tb.forloop_accum(term, "sum", rescale=m if rescale else None), (0, -1, -1))
    (O,) = g.customized([X], tb)
    g.mark_output(O)
    return g


def test_the_max_is_a_function_of_the_values_not_of_the_tiling() -> None:
    """The max is modelled as a function of the multiset of values: sum exp(x - max x) computed
    over 4 or 8 tiles agrees in the field (it depends on the final max, the same for both),
    while forgetting the rescale, or a function of the intermediate maxima, does not."""
    four, eight = _row_softmax_sum(4), _row_softmax_sum(8)
    xs = _inputs(four)
    assert np.allclose(four.evaluate(xs)[0], eight.evaluate(xs)[0])
    assert em.verify(four, eight).equivalent
    assert not em.verify(four, _row_softmax_sum(4, rescale=False)).equivalent
    assert not em.verify(_row_softmax_sum(4, of_max=True),
                         _row_softmax_sum(8, of_max=True)).equivalent


def test_builder_errors() -> None:
    g = em.new_kernel_graph()
    X = g.new_input((2, 64))
    tb = em.new_threadblock_graph(forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)  # (2, 16)
    m = tb.forloop_max(x)
    acc = tb.forloop_accum(x)
    with pytest.raises(em.BlockGraphError, match="only the linear accumulators"):
        tb.forloop_accum(x, "rms", rescale=m)
    with pytest.raises(em.BlockGraphError, match="after an accumulator"):
        tb.forloop_accum(x, rescale=acc)
    with pytest.raises(em.BlockGraphError, match="after an accumulator"):
        tb.forloop_max(acc)
    with pytest.raises(em.BlockGraphError, match="does not broadcast to the result"):
        tb.forloop_accum(x, "sum", rescale=x)
    with pytest.raises(em.BlockGraphError, match="does not broadcast to the operand"):
        tb.forloop_accum(m, rescale=x)
    with pytest.raises(em.BlockGraphError, match="accumulate both or neither"):
        tb.add(m, acc)
    other = em.new_threadblock_graph(forloop_range=4)
    with pytest.raises(em.BlockGraphError, match="not a tile of this block graph"):
        other.forloop_max(x)
    with pytest.raises(em.BlockGraphError, match="not a tile of this block graph"):
        tb.forloop_accum(x, rescale=other.new_input(X, (-1, -1, -1), forloop_dim=1))


def test_exp_of_a_max_of_exps_is_outside_the_fragment() -> None:
    g = em.new_kernel_graph()
    X = g.new_input((2, 64))
    tb = em.new_threadblock_graph(forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    m = tb.forloop_max(tb.exp(x))
    tb.new_output(tb.forloop_accum(x, rescale=m), (-1, -1, -1))
    (O,) = g.customized([X], tb)
    g.mark_output(O)
    with pytest.raises(em.VerifyError, match="more than one exp"):
        em.verify(g, g)


def test_serialize_draw_and_mutants() -> None:
    from egraph_mirage.mugraph.draw import mugraph_dot

    g = em.benchmarks.get("mha", small=True)
    h = fixtures.flash_attention(g)
    again = em.loads(em.to_json(h))
    assert em.to_json(again) == em.to_json(h) and em.verify(g, again).equivalent
    dot = mugraph_dot(h)
    assert "running max" in dot and "rescaled by" in dot and 'label="rescale"' in dot
    print(h.operators[0].params["kernel"].tb)


def test_rescale_mutants_are_rejected() -> None:
    g = em.benchmarks.get("gqa", small=True)
    h = fixtures.flash_attention(g)
    v = em.Verifier(g, backend="numpy")
    seen = 0
    for kind, m in mutants(h, random.Random(1)):
        if kind == "rescale":
            seen += 1
            assert not v.check(m).equivalent
        if seen >= 2:
            break
    assert seen == 2
