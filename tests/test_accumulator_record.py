"""The accumulator records: one record per kind holds everything about it, and every consumer
(the per-block interpreter, the vectorised float reference, PyTorch, the finite-field verifier,
the Triton lowering) reads it. Table-driven checks over ``ACCUMULATORS``, then a kind defined
in a fixture, one record and nothing else, followed through all of them.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.expr import Term, app, sum_
from egraph_mirage.gpu import torch_eval
from egraph_mirage.lower import ACCUMULATOR_EMISSIONS, generate_source
from egraph_mirage.mugraph import accumulators as accs
from egraph_mirage.mugraph.accumulators import (
    ACCUMULATORS,
    LOOP,
    NUMPY,
    Accumulator,
    FieldOps,
    TritonOps,
    reduce_last_dims,
    reduce_last_shape,
)
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig
from egraph_mirage.verify import field as ff

ROOT = Path(__file__).resolve().parents[1]
#: the table's kinds, and "rms" with an eps (``accumulators.rms_with_eps``, named by its constant)
KINDS = [*sorted(ACCUMULATORS), "rms+0.001"]
DIMX = 4


def _graph(kind: str, grid: int = 2, scale: float = 1.0) -> em.KernelGraph:
    """``kind`` of X (4, 64) over a loop of 4 tiles of 16 columns (the rows split over ``grid``
    blocks), and of Z (4, 8), loaded whole in every iteration (loop-invariant). ``scale``
    multiplies X first."""
    g = em.new_kernel_graph()
    X, Z = g.new_input((4, 64), em.float32), g.new_input((4, 8), em.float32)
    tb = em.new_threadblock_graph(grid_dim=(grid, 1, 1), forloop_range=4, reduction_dimx=DIMX)
    imap = (0 if grid > 1 else -1, -1, -1)
    x = tb.new_input(X, imap, forloop_dim=1)
    if scale != 1.0:
        x = tb.mul_scalar(x, scale)
    z = tb.new_input(Z, imap, forloop_dim=-1)
    for t in (x, z):
        tb.new_output(tb.forloop_accum(t, kind), imap)
    for O in g.customized([X, Z], tb):
        g.mark_output(O)
    return g


def _inputs(g: em.KernelGraph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.dims).astype(np.float32).astype(np.float64) for t in g.inputs]


def _field(seed: int = 0) -> ff.Field:
    import jax

    return ff.Field(jax.random.PRNGKey(seed), ff.exp_table(), xp=np)


def _float_agreement(g: em.KernelGraph) -> list[np.ndarray]:
    """The per-block interpreter, the vectorised reference and PyTorch (float64) agree; returns
    the interpreter's outputs."""
    xs = _inputs(g)
    blocks = em.run_reference(g, xs)
    vectorised = g.evaluate(xs)
    torched = torch_eval.evaluate(g, [torch.tensor(x) for x in xs], torch.float64)
    for a, b, c in zip(blocks, vectorised, torched, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(c.numpy(), a, rtol=1e-12, atol=1e-12)
    return blocks


def _field_steps_agree(acc: Accumulator) -> None:
    """Over Z_p x Z_q, the vectorised ``ff`` equals stepping iteration by iteration and
    finishing, for a loop-side operand and a loop-invariant one (stepped every iteration)."""
    f, rng = _field(), np.random.default_rng(2)
    o = FieldOps(f)
    for loop in (3, 1):
        x = ff.numpy_input(rng, (2, 1, 1, loop, 2, 8))
        got = acc.ff(f, x, 3, DIMX)
        total = None
        for i in range(3):
            step = acc.step(f.arrays.take(x, i % loop, LOOP), DIMX, o)
            total = step if total is None else f.add(total, step)
        want = acc.finish(total, 3 * 8, o)
        assert got.shape == want.shape == (2, 1, 1, 1, *acc.shape((2, 8), DIMX))
        assert np.array_equal(got.p, want.p) and np.array_equal(got.q, want.q)


def _lowered_matches(g: em.KernelGraph) -> None:
    """The generated Triton program (Triton's interpreter without a GPU) gives the per-block
    interpreter's numbers."""
    xs = _inputs(g)
    want = em.run_reference(g, xs)
    got = em.compile(g)(*[torch.tensor(x, dtype=torch.float32) for x in xs])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.double().cpu().numpy(), b, rtol=1e-5, atol=1e-5)


# --- the table ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_every_record_is_complete(kind: str) -> None:
    acc = accs.lookup_accumulator(kind)
    assert acc.name == kind and acc.doc
    for f in dataclasses.fields(acc):
        assert getattr(acc, f.name) is not None, f.name
    dims = acc.shape((2, 16), DIMX)
    assert len(acc.tile_dims(2).out) == len(dims)
    assert isinstance(acc.expr(app("Var", "v0"), (2, 16), 4, DIMX), Term)
    assert isinstance(acc.triton_finish("acc", 64), str)


@pytest.mark.parametrize("kind", KINDS)
def test_float_evaluators_agree(kind: str) -> None:
    _float_agreement(_graph(kind))


@pytest.mark.parametrize("kind", KINDS)
def test_field_semantics_step_by_step(kind: str) -> None:
    _field_steps_agree(accs.lookup_accumulator(kind))


@pytest.mark.parametrize("kind", KINDS)
def test_field_semantics_decide_equivalence(kind: str) -> None:
    """One block or two over the rows: equivalent; the operand doubled: not (rms too, since
    sqrt is a random function)."""
    v = em.Verifier(_graph(kind, grid=1), backend="numpy")
    assert v.check(_graph(kind, grid=2)).equivalent
    assert not v.check(_graph(kind, grid=2, scale=2.0)).equivalent


@pytest.mark.parametrize("kind", KINDS)
def test_lowered_kernels_match(kind: str) -> None:
    _lowered_matches(_graph(kind))


def test_triton_text_of_the_finishing_steps() -> None:
    finish = {k: a.triton_finish("b4", 64) for k, a in ACCUMULATORS.items()}
    assert finish == {"plain": "b4", "sum": "b4", "mean": "b4 / 64.0",
                      "rms": "tl.sqrt(b4 / 64.0)", "sum_todimx": "b4"}
    assert TritonOps().mul("a + b", "c.to(tl.float32)") == "(a + b) * c.to(tl.float32)"
    with pytest.raises(em.LowerError, match="only a step may reduce"):
        TritonOps().sum_last("b4")


def test_an_rms_with_eps_is_named_by_its_constant_and_adds_it_under_the_root() -> None:
    """``"rms+EPS"`` is the rms kind with EPS added to the mean square under the root (a norm's
    eps): its name carries the constant (through a μGraph's JSON), its expression is the one a
    traced ``x * rsqrt(mean(x²) + eps)`` has after ``rules/`` turn the product into a quotient,
    and a name that is no such kind is a clear error."""
    acc = accs.lookup_accumulator("rms+1e-05")
    assert acc is accs.rms_with_eps(1e-5) and acc.name == "rms+1e-05" and not acc.linear
    assert acc.triton_finish("b4", 64) == "tl.sqrt(b4 / 64.0 + 1e-05)"
    assert str(acc.expr(app("Var", "x"), (2, 16), 4, DIMX)) == (
        '(Sqrt (Add (Div (Sum 64 (Square (Var "x"))) (Num 64)) (Const "1e-05")))')
    x = np.arange(24.0).reshape(1, 1, 1, 3, 2, 4)
    np.testing.assert_allclose(acc.reference(x, 3, DIMX), np.sqrt(
        ACCUMULATORS["rms"].reference(x, 3, DIMX) ** 2 + 1e-5))
    for bad, why in [("rms+x", "takes a number"), ("rms+0.0", "> 0, got 0.0"),
                     ("rms+inf", "got inf"), ("rms2", "unknown accumulator 'rms2'")]:
        with pytest.raises(em.BlockGraphError, match=why):
            accs.lookup_accumulator(bad)


def test_reference_follows_a_replaced_finish() -> None:
    """The derived vectorised reference is the record's own step and finish, also after
    ``dataclasses.replace``; a given ``reference`` is kept."""
    x = np.arange(24.0).reshape(1, 1, 1, 3, 2, 4)
    sums = ACCUMULATORS["sum"]
    doubled = dataclasses.replace(sums, finish=lambda total, count, o=NUMPY: total * 2)
    np.testing.assert_array_equal(doubled.reference(x, 3, DIMX), 2 * sums.reference(x, 3, DIMX))
    fixed = dataclasses.replace(sums, reference=lambda x, n, dimx: x)
    assert fixed.reference(x, 3, DIMX) is x


def test_the_record_module_stays_below_verify_lower_gpu_and_search() -> None:
    """The record module imports no higher layer (not even inside a function), and torch only
    inside functions: the package imports without torch."""
    tree = ast.parse((ROOT / "egraph_mirage/mugraph/accumulators.py").read_text())
    higher = tuple(f"egraph_mirage.{p}" for p in ("verify", "lower", "gpu", "search"))
    package, names = ["egraph_mirage", "mugraph"], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative: from the module's package upwards
            base = package[:len(package) + 1 - node.level] if node.level else []
            names.append(".".join([*base, *([node.module] if node.module else [])]))
    assert names and not [n for n in names if n.startswith(higher)]
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert not any("torch" in ast.unparse(n) for n in top)


# --- a new kind, one record ---------------------------------------------------------------------

SUM_SQUARES = Accumulator(
    "sum_squares", "sum over iterations and the last dimension of x * x",
    shape=reduce_last_shape, tile_dims=reduce_last_dims,
    expr=lambda t, tile, n, dimx: sum_(n * tile[-1], app("Mul", t, t)),
    step=lambda x, dimx, o=NUMPY: o.sum_last(o.mul(x, x)),
    finish=lambda total, count, o=NUMPY: total,
    linear=False)  # the step is not linear in x: a rescaled operand is not a rescaled term


@pytest.fixture
def sum_squares(monkeypatch: pytest.MonkeyPatch) -> Iterator[Accumulator]:
    """``"sum_squares"`` in the table for one test only."""
    monkeypatch.setitem(ACCUMULATORS, SUM_SQUARES.name, SUM_SQUARES)
    yield SUM_SQUARES


def _squares_target() -> em.KernelGraph:
    """The same as ``_graph("sum_squares")`` with library operators: rows of X * X summed, and
    rows of Z * Z summed four times."""
    g = em.new_kernel_graph()
    X, Z = g.new_input((4, 64), em.float32), g.new_input((4, 8), em.float32)
    g.mark_output(g.reduction(g.mul(X, X), 1))
    zz = g.reduction(g.mul(Z, Z), 1)
    g.mark_output(g.add(g.add(zz, zz), g.add(zz, zz)))
    return g


def test_a_new_kind_flows_through_every_consumer(sum_squares: Accumulator) -> None:
    h = _graph("sum_squares")
    kernel = next(t.params["kernel"] for t in h.operators if t.op == "customized")
    assert [t.params.get("acc") for t in kernel.tb.tensors if t.op == "forloop_accum"] == [
        "sum_squares", "sum_squares"]
    assert em.abstract_expr(h.outputs[0]) == '(Sum 64 (Mul (Var "v0") (Var "v0")))'
    target = _squares_target()
    xs = _inputs(h)
    # the per-block interpreter, the vectorised reference, PyTorch: the target's numbers
    blocks = _float_agreement(h)
    for a, b in zip(blocks, target.evaluate(xs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    # the finite field: equivalent to the target, and a wrong μGraph is not
    assert em.verify(target, h).equivalent
    assert not em.verify(target, _graph("sum")).equivalent
    assert not em.verify(target, _graph("sum_squares", scale=2.0)).equivalent
    _field_steps_agree(sum_squares)
    # the Triton lowering, run in Triton's interpreter without a GPU
    src = generate_source(h)
    assert "tl.sum(" in src and "tl.sqrt" not in src
    _lowered_matches(h)
    # the other views of the table follow it
    assert "sum_squares" in torch_eval.TORCH_ACCUMULATORS
    assert "sum_squares" in ACCUMULATOR_EMISSIONS


def test_rescaling_follows_the_linear_flag(sum_squares: Accumulator,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``rescale=`` is refused for a kind whose step is not linear in its operand; a linear
    kind is rescaled alike by the interpreter's recurrence, the vectorised weights, PyTorch and
    the lowering."""
    g = em.new_kernel_graph()
    X, Y = g.new_input((4, 64), em.float32), g.new_input((4, 64), em.float32)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)
    m = tb.forloop_max(tb.new_input(Y, (0, -1, -1), forloop_dim=1))
    with pytest.raises(em.BlockGraphError, match="only the linear accumulators"):
        tb.forloop_accum(x, "sum_squares", rescale=m)
    halved = Accumulator("halved", "half the sum over iterations and the last dimension",
                         shape=reduce_last_shape, tile_dims=reduce_last_dims,
                         expr=lambda t, tile, n, dimx: sum_(n * tile[-1], t),
                         step=lambda x, dimx, o=NUMPY: o.sum_last(x),
                         finish=lambda total, count, o=NUMPY: o.div(total, 2))
    monkeypatch.setitem(ACCUMULATORS, halved.name, halved)
    tb.new_output(tb.forloop_accum(x, "halved", rescale=m), (0, -1, -1))
    (O,) = g.customized([X, Y], tb)
    g.mark_output(O)
    _float_agreement(g)
    _lowered_matches(g)


def test_the_search_enumerates_a_new_kind(sum_squares: Accumulator) -> None:
    """The block enumerator tries every kind in the table: searching the row sums of X * X
    finds one-kernel μGraphs that accumulate with the new kind."""
    g = em.new_kernel_graph()
    X = g.new_input((4, 64), em.float32)
    g.mark_output(g.reduction(g.mul(X, X), 1))
    results = superoptimize(g, SearchConfig(max_block_ops=2), time_budget=60, workers=1,
                            progress=False)
    kinds = {b.params["acc"] for r in results for t in r.graph.operators if t.op == "customized"
             for b in t.params["kernel"].tb.tensors if b.op == "forloop_accum"}
    assert "sum_squares" in kinds


def test_the_new_kind_is_gone_after_its_tests() -> None:
    assert "sum_squares" not in ACCUMULATORS
    with pytest.raises(em.BlockGraphError, match="unknown accumulator 'sum_squares'"):
        accs.lookup_accumulator("sum_squares")


def test_float_semantics_are_written_once() -> None:
    """numpy and torch run the same step and finish (``ArrayOps``): identical float64 values."""
    x = np.random.default_rng(5).standard_normal((2, 1, 1, 3, 2, 8))
    for acc in ACCUMULATORS.values():
        np.testing.assert_allclose(acc.torch(torch.tensor(x), 3, DIMX).numpy(),
                                   acc.reference(x, 3, DIMX), rtol=1e-14)
    m = np.maximum.accumulate(x.max(-1, keepdims=True), axis=LOOP)
    np.testing.assert_array_equal(accs.running_max_ref(x), m)
    np.testing.assert_allclose(torch_eval.rescale(torch.tensor(x), torch.tensor(m)).numpy(),
                               accs.rescale_ref(x, m), rtol=1e-14)
