"""Adding an operator is one op-table entry plus its identities: a new unary operator defined in a
fixture flows through the builder, the oracle, the verifier, the search, PyTorch evaluation and
the Triton lowering (interpreter) with no other edit.

The operator is ``cube`` (x * x * x), with its own term constructor ``Cube`` and one identity
line relating it to ``Mul`` and ``Square``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.extract import CostModel
from egraph_mirage.gpu.torch_eval import evaluate
from egraph_mirage.ops.table import elementwise, unary
from egraph_mirage.ops.terms import Constructor, Degree
from egraph_mirage.oracle.prelude import prelude_text
from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig
from egraph_mirage.verify.verify import degree

IDENTITY = "(birewrite (Cube a) (Mul a (Square a)))   ; a cube is x times its square\n"


def _cubic(kids: Sequence[Degree]) -> Degree:
    return (3 * kids[0][0], kids[0][1])


CUBE = unary(
    "cube", Constructor("Cube", ("Expr",), "x*x*x", 2.0, _cubic), lambda x: x * x * x,
    lambda f, xs, p: f.mul(xs[0], f.mul(xs[0], xs[0])), lambda x: x * x * x,
    "element-wise x*x*x", elementwise("{x} * {x} * {x}", "{x} * {x} * {x}", True))


@pytest.fixture
def cube(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The ``cube`` entry in the op table for the test's duration; yields its identity file."""
    monkeypatch.setitem(em.OPS, "cube", CUBE)
    rule = tmp_path / "50_cube.egg"
    rule.write_text(IDENTITY)
    yield rule


def _program(m: int = 8, k: int = 64, n: int = 32, via_square: bool = False) -> em.KernelGraph:
    """cube(X) @ W, the cube written as the new operator or as X * square(X)."""
    g = em.new_kernel_graph()
    X = g.new_input(dims=(m, k), dtype=em.float32)
    W = g.new_input(dims=(k, n), dtype=em.float32)
    Y = g.mul(X, g.square(X)) if via_square else g.cube(X)
    g.mark_output(g.matmul(Y, W))
    return g


def _inputs(g: em.KernelGraph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.dims) * 0.5 for t in g.inputs]


def test_the_entry_gives_the_datatype_line_reachability_cost_and_degree(cube: Path) -> None:
    text = prelude_text()
    assert "(Cube Expr)" in text and "(rule ((Reach (Cube a0))) ((Reach a0)))" in text
    assert CostModel().weights["Cube"] == 2.0
    g = _program()
    assert em.abstract_expr(g.outputs[0]) == '(Sum 64 (Mul (Cube (Var "v0")) (Var "v1")))'
    assert degree(em.abstract_term(g.outputs[0])) == (4, 0)  # x^3 * w
    assert CUBE.mutation_class == "unary"


def test_the_oracle_knows_the_operator_and_its_identity(cube: Path) -> None:
    target = _program(via_square=True)
    without = em.Oracle(target)
    assert without.is_subexpr('(Mul (Var "v0") (Square (Var "v0")))')
    assert not without.is_subexpr('(Cube (Var "v0"))')
    with_line = em.Oracle(target, extra_rules=[cube])
    assert with_line.is_subexpr('(Cube (Var "v0"))')


def test_the_verifier_and_the_evaluators_use_the_entry(cube: Path) -> None:
    a, b = _program(), _program(via_square=True)
    assert em.verify(a, b, tests=2).equivalent
    wrong = em.new_kernel_graph()
    X = wrong.new_input(dims=(8, 64), dtype=em.float32)
    W = wrong.new_input(dims=(64, 32), dtype=em.float32)
    wrong.mark_output(wrong.matmul(wrong.square(X), W))
    assert not em.verify(a, wrong, tests=2).equivalent
    xs = _inputs(a)
    want = np.matmul(xs[0] ** 3, xs[1])
    np.testing.assert_allclose(a.evaluate(xs)[0], want, rtol=1e-12)
    got = evaluate(a, [torch.tensor(x) for x in xs], torch.float64)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_the_search_fuses_it_and_the_lowering_runs_it(cube: Path) -> None:
    target = _program(via_square=True)
    results = superoptimize(target, SearchConfig(max_results=1), workers=1, progress=False,
                            max_tasks=120, extra_rules=[cube])
    assert results, f"nothing found ({results.stats})"
    best = results.best.graph
    assert results.best.num_kernels == 1
    kernels = [t.params["kernel"] for t in best.operators if t.op == "customized"]
    assert "cube" in [b.op for b in kernels[0].tb.tensors]  # reached through the identity line
    assert em.verify(target, best, tests=3, seed=5).equivalent
    # a μGraph with the new operator inside its block graph, lowered through Triton
    g = em.new_kernel_graph()
    X = g.new_input(dims=(8, 64), dtype=em.float32)
    W = g.new_input(dims=(64, 32), dtype=em.float32)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)  # (8, 16) tiles of X
    w = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)   # (16, 16) tiles of W
    tb.new_output(tb.forloop_accum(tb.matmul(tb.cube(x), w)), output_map=(1, -1, -1))
    (O,) = g.customized([X, W], tb)
    g.mark_output(O)
    assert em.verify(target, g, tests=2).equivalent
    xs = _inputs(g)
    out = em.compile(g)(*[torch.tensor(v, dtype=torch.float32) for v in xs])[0]
    np.testing.assert_allclose(out.double().numpy(), np.matmul(xs[0] ** 3, xs[1]), rtol=1e-4,
                               atol=1e-4)


def test_the_rules_folder_declares_no_constructors() -> None:
    """Constructors come from the op table; the rule files hold identities."""
    for f in sorted(DEFAULT_RULES_DIR.glob("*.egg")):
        assert "(datatype" not in f.read_text(), f.name
