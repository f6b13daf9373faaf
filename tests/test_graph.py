"""Kernel-graph API, abstract expressions, the s-expression parser, evaluation and benchmarks."""

from __future__ import annotations

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage import benchmarks

#: the parameterless element-wise operators of one operand, from the op table
UNARY = [name for name, spec in em.OPS.items() if spec.mutation_class == "unary"]

X, Y = '(Var "v0")', '(Var "v1")'


def _g(*dims: tuple[int, ...]):
    g = em.new_kernel_graph()
    return g, [g.new_input(dims=d, dtype=em.float16) for d in dims]


# --- building ----------------------------------------------------------------------------------

def test_inputs() -> None:
    g = em.new_kernel_graph()
    a = g.new_input(dims=(2, 3), dtype=em.float32)
    b = g.new_input(dims=[4], dtype=em.bfloat16)
    assert a.dims == (2, 3) and a.dtype is em.float32 and a.is_input and a.num_dims == 2
    assert b.dims == (4,) and b.dtype is em.bfloat16
    assert g.inputs == [a, b] and g.operators == [] and g.outputs == []
    assert g.new_input((5,)).dtype is em.float16  # the default
    assert em.abstract_expr(a) == X and em.abstract_expr(b) == Y


def test_every_op_method() -> None:
    g, (a, w, v) = _g((2, 8), (8, 4), (2, 4))
    m = g.matmul(a, w)
    assert m.dims == (2, 4) and m.op == "matmul" and m.operands == (a, w)
    for name in ("add", "mul", "div"):
        t = getattr(g, name)(m, v)
        assert t.dims == (2, 4) and t.op == name
    for name in UNARY:
        t = getattr(g, name)(m)
        assert t.dims == (2, 4) and t.op == name
    assert g.mul_scalar(m, 0.5).params == {"scalar": 0.5}
    assert g.reduction(m, 1).dims == (2, 1)
    assert g.reduction(m, -2).dims == (1, 4)
    assert g.rms_norm(a, (8,)).dims == (2, 8)
    assert g.rms_norm(a, 8).dims == (2, 8)
    gain = g.new_input((1, 8))
    assert g.rms_norm(a, (8,), gain).operands == (a, gain)
    assert g.concat(m, v, 1).dims == (2, 8)
    assert g.concat(m, v, 0).dims == (4, 4)
    ops = [t.op for t in g.operators]
    assert set(ops) >= {*UNARY, "matmul", "add", "mul", "div", "mul_scalar", "reduction",
                        "rms_norm", "concat"}
    assert [t.index for t in g.tensors] == list(range(len(g.tensors)))


def test_mark_output() -> None:
    g, (a, b) = _g((2, 2), (2, 2))
    t = g.add(a, b)
    g.mark_output(t)
    assert g.outputs == [t]
    with pytest.raises(em.GraphError, match="already an output"):
        g.mark_output(t)
    _, (c,) = _g((2, 2))
    with pytest.raises(em.GraphError, match="not a tensor of this graph"):
        g.mark_output(c)
    with pytest.raises(em.GraphError):
        g.mark_output("t2")  # type: ignore[arg-type]


def test_foreign_tensor() -> None:
    g, (a,) = _g((2, 2))
    _, (b,) = _g((2, 2))
    with pytest.raises(em.GraphError, match="another graph"):
        g.add(a, b)
    with pytest.raises(em.GraphError, match="not a Tensor"):
        g.exp(np.ones((2, 2)))  # type: ignore[arg-type]


@pytest.mark.parametrize("dims", [(), (0, 3), (2, -1), (2.0, 3), (True, 2), ("2",)])
def test_bad_dims(dims: tuple) -> None:
    g = em.new_kernel_graph()
    with pytest.raises(em.ShapeError, match="new_input"):
        g.new_input(dims=dims)


def test_bad_dtype_and_arity() -> None:
    g, (a, b) = _g((2, 2), (2, 2))
    with pytest.raises(em.GraphError, match="dtype"):
        g.new_input((2, 2), dtype="float16")  # type: ignore[arg-type]
    with pytest.raises(em.GraphError, match="exp"):
        g.apply("exp", (a, b))
    with pytest.raises(em.GraphError, match="reduction"):
        g.apply("reduction", (a,))  # missing dim
    with pytest.raises(em.GraphError, match="add"):
        g.apply("add", (a, b), dim=0)


def test_repr_lists_program() -> None:
    g, (a, w) = _g((2, 8), (8, 4))
    g.mark_output(g.matmul(a, w))
    text = repr(g)
    assert "matmul(t0, t1)" in text and "outputs: t2" in text


# --- abstract expressions ----------------------------------------------------------------------

def test_expr_matmul() -> None:
    g, (a, b, c, d) = _g((4, 8), (8, 3), (4, 1), (1, 3))
    assert em.abstract_expr(g.matmul(a, b)) == f"(Sum 8 (Mul {X} {Y}))"
    assert em.abstract_expr(g.matmul(c, d)) == '(Mul (Var "v2") (Var "v3"))'


def test_expr_elementwise() -> None:
    g, (a, b) = _g((4, 8), (4, 8))
    for name, ctor in [("add", "Add"), ("mul", "Mul"), ("div", "Div")]:
        assert em.abstract_expr(getattr(g, name)(a, b)) == f"({ctor} {X} {Y})"
    for name in UNARY:  # each introduces its own constructor, but neg: (Mul x (Const "-1.0"))
        if not em.OPS[name].terms:
            continue
        (ctor,) = em.OPS[name].terms
        assert em.abstract_expr(getattr(g, name)(a)) == f"({ctor.name} {X})"
    assert em.abstract_expr(g.mul_scalar(a, 0.5)) == f'(Mul {X} (Const "0.5"))'
    assert em.abstract_expr(g.mul_scalar(a, 2)) == f'(Mul {X} (Const "2.0"))'


def test_expr_reduction() -> None:
    g, (a,) = _g((4, 1, 6))
    assert em.abstract_expr(g.reduction(a, 0)) == f"(Sum 4 {X})"
    assert em.abstract_expr(g.reduction(a, 2)) == f"(Sum 6 {X})"
    assert em.abstract_expr(g.reduction(a, 1)) == X
    assert em.abstract_expr(g.reduction(g.reduction(a, 0), 0)) == f"(Sum 4 {X})"


def test_expr_rms_norm_and_concat() -> None:
    g, (a, gain, b) = _g((2, 3, 4), (1, 1, 4), (2, 3, 5))
    assert em.abstract_expr(g.rms_norm(a, (4,))) == f"(Div {X} (Rms 4 {X}))"
    assert em.abstract_expr(g.rms_norm(a, (3, 4))) == f"(Div {X} (Rms 12 {X}))"
    assert em.abstract_expr(g.rms_norm(a, (4,), gain)) == f"(Mul (Div {X} (Rms 4 {X})) {Y})"
    assert em.abstract_expr(g.concat(a, b, 2)) == f'(Concat 4 5 {X} (Var "v2"))'
    assert em.abstract_expr(g.concat(a, a, 0)) == f"(Concat 2 2 {X} {X})"


def test_expr_composes_and_term() -> None:
    g, (a, w) = _g((2, 64), (64, 96))
    t = g.matmul(g.rms_norm(a, (64,)), w)
    assert em.abstract_expr(t) == f"(Sum 64 (Mul (Div {X} (Rms 64 {X})) {Y}))"
    term = em.abstract_term(t)
    assert isinstance(term, em.Term) and term.op == "Sum" and term.args[0] == 64
    with pytest.raises(em.GraphError):
        em.abstract_term("t")  # type: ignore[arg-type]


# --- parsing -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '(Var "v0")',
    f"(Sum 64 (Mul {X} {Y}))",
    f'(Mul {X} (Const "0.5"))',
    f"(Sqrt (Div (Sum 4 (Sum 16 (Mul {X} {X}))) (Num 64)))",
    f"(Concat 64 16 {X} (Sum 64 (Mul {X} (Var \"v2\"))))",
    '(Var "a\\"b")',
    '(Var "back\\\\slash")',
    "(Num -3)",
])
def test_parse_round_trip(text: str) -> None:
    term = em.parse(text)
    assert term.to_sexpr() == text
    assert em.parse(term.to_sexpr()) == term and hash(em.parse(text)) == hash(term)


def test_parse_of_abstract_exprs() -> None:
    for name in benchmarks.names():
        g = benchmarks.get(name, small=True)
        for t in g.tensors:
            assert em.parse(em.abstract_expr(t)) == em.abstract_term(t)


def test_parse_whitespace_and_comments() -> None:
    assert em.parse(' ( Sum  4\n  (Var "v0") ) ; note') == em.parse('(Sum 4 (Var "v0"))')


@pytest.mark.parametrize("text", [
    "", "   ", "(", ")", "(Sum 64", "(Sum 64 x)", "64", '"v0"', "(Var \"v0\") (Var \"v1\")",
    '(Var "v0)', "()", "(Sum 64 (Var \"v0\")))",
])
def test_parse_errors(text: str) -> None:
    with pytest.raises(em.ExprError):
        em.parse(text)


def test_term_immutable() -> None:
    t = em.parse(X)
    with pytest.raises(AttributeError):
        t.op = "Exp"  # type: ignore[misc]


# --- evaluation --------------------------------------------------------------------------------

def _inputs(g: em.KernelGraph, seed: int = 0, scale: float = 0.3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.dims) * scale for t in g.inputs]


def _rms(x: np.ndarray) -> np.ndarray:
    return np.sqrt(np.mean(x * x, axis=-1, keepdims=True))


def test_evaluate_rmsnorm_linear() -> None:
    g = benchmarks.get("rmsnorm_linear", small=True)
    x, w = _inputs(g)
    (out,) = g.evaluate([x, w])
    np.testing.assert_allclose(out, (x / _rms(x)) @ w, rtol=1e-10)


@pytest.mark.parametrize("name", ["gqa", "mha", "mqa", "qknorm"])
def test_evaluate_attention(name: str) -> None:
    g = benchmarks.get(name, small=True)
    ins = _inputs(g)
    q, k, v = ins
    if name == "qknorm":
        q, v = q / _rms(q), v / _rms(v)
    e = np.exp(q @ k)
    expected = (e / e.sum(axis=-1, keepdims=True)) @ v
    (out,) = g.evaluate(ins)
    np.testing.assert_allclose(out, expected, rtol=1e-10)


def test_evaluate_lora_gated_mlp_ntrans() -> None:
    g = benchmarks.get("lora", small=True)
    x, w, a, b = _inputs(g)
    np.testing.assert_allclose(g.evaluate([x, w, a, b])[0], x @ w + (x @ a) @ b, rtol=1e-10)

    g = benchmarks.get("gated_mlp", small=True)
    x, w1, w2 = _inputs(g)
    h = x @ w1
    np.testing.assert_allclose(g.evaluate([x, w1, w2])[0], h / (1 + np.exp(-h)) * (x @ w2),
                               rtol=1e-10)

    g = benchmarks.get("ntrans", small=True)
    hh, x, alpha = _inputs(g)
    t = (hh / _rms(hh) + x) * alpha + x
    np.testing.assert_allclose(g.evaluate([hh, x, alpha])[0], t / _rms(t), rtol=1e-10)


def test_evaluate_errors() -> None:
    g = benchmarks.get("rmsnorm_linear", small=True)
    x, w = _inputs(g)
    with pytest.raises(em.GraphError, match="inputs"):
        g.evaluate([x])
    with pytest.raises(em.ShapeError, match="v1"):
        g.evaluate([x, w.T])


# --- benchmarks --------------------------------------------------------------------------------

#: input dims at paper shapes, as functions of the batch size b
PAPER_INPUTS = {
    "gqa": lambda b: [(2 * b, 256, 64), (2 * b, 64, 4096), (2 * b, 4096, 64)],
    "mha": lambda b: [(32 * b, 16, 64), (32 * b, 64, 4096), (32 * b, 4096, 64)],
    "mqa": lambda b: [(b, 1024, 64), (b, 64, 4096), (b, 4096, 64)],
    "qknorm": lambda b: [(2 * b, 256, 64), (2 * b, 64, 4096), (2 * b, 4096, 64)],
    "rmsnorm_linear": lambda b: [(2 * b, 4096), (4096, 6144)],
    "lora": lambda b: [(b, 256), (256, 4096), (256, 16), (16, 4096)],
    "gated_mlp": lambda b: [(b, 4096), (4096, 4096), (4096, 4096)],
    "ntrans": lambda b: [(8 * b, 4096)] * 3,
}
PAPER_OUTPUTS = {
    "gqa": lambda b: (2 * b, 256, 64), "mha": lambda b: (32 * b, 16, 64),
    "mqa": lambda b: (b, 1024, 64), "qknorm": lambda b: (2 * b, 256, 64),
    "rmsnorm_linear": lambda b: (2 * b, 6144), "lora": lambda b: (b, 4096),
    "gated_mlp": lambda b: (b, 4096), "ntrans": lambda b: (8 * b, 4096),
}


def test_benchmark_names() -> None:
    assert benchmarks.names() == list(PAPER_INPUTS)
    for name in benchmarks.names():
        assert benchmarks.describe(name)


@pytest.mark.parametrize("batch", [1, 8, 16])
@pytest.mark.parametrize("name", list(PAPER_INPUTS))
def test_benchmark_shapes(name: str, batch: int) -> None:
    g = benchmarks.get(name, batch=batch)
    assert [t.dims for t in g.inputs] == PAPER_INPUTS[name](batch)
    assert [t.dims for t in g.outputs] == [PAPER_OUTPUTS[name](batch)]
    assert all(t.dtype is em.float16 for t in g.tensors)
    small = benchmarks.get(name, batch=batch, small=True)
    assert [t.op for t in small.tensors] == [t.op for t in g.tensors]
    assert [[o.index for o in t.operands] for t in small.tensors] == \
        [[o.index for o in t.operands] for t in g.tensors]
    assert [t.index for t in small.outputs] == [t.index for t in g.outputs]


def test_benchmark_options_and_errors() -> None:
    g = benchmarks.get("rmsnorm_linear", gain=True)
    assert [t.dims for t in g.inputs] == [(2, 4096), (4096, 6144), (1, 4096)]
    assert "Mul (Div" in em.abstract_expr(g.outputs[0])
    assert benchmarks.get("gqa", dtype=em.bfloat16).inputs[0].dtype is em.bfloat16
    with pytest.raises(em.GraphError, match="nosuch"):
        benchmarks.get("nosuch")
    with pytest.raises(em.GraphError, match="batch"):
        benchmarks.get("gqa", batch=0)
    with pytest.raises(em.GraphError, match="gain"):
        benchmarks.get("gqa", gain=True)
    with pytest.raises(em.GraphError):
        benchmarks.describe("nosuch")
