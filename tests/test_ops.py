"""The op table: completeness, typed shape and dtype errors, and float semantics vs torch."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import egraph_mirage as em
from egraph_mirage.ops import LEVELS, THREAD
from egraph_mirage.ops.spec import TileDims, TritonEmission
from egraph_mirage.ops.terms import Constructor

OPS = em.OPS
ELEMENTWISE_UNARY = tuple(n for n, s in OPS.items() if s.mutation_class == "unary")


def _graph(*dims: tuple[int, ...], dtype: em.DType = em.float16):
    g = em.new_kernel_graph()
    return g, [g.new_input(dims=d, dtype=dtype) for d in dims]


# --- completeness --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(OPS))
def test_entry_complete(name: str) -> None:
    spec = OPS[name]
    assert spec.name == name
    for f in dataclasses.fields(spec):
        assert getattr(spec, f.name) is not None, f"{name}.{f.name} is None"
    assert spec.levels and spec.levels <= {"kernel", "block", "thread"}
    lo, hi = spec.num_inputs
    assert 1 <= lo <= hi
    assert isinstance(spec.params, tuple) and all(isinstance(p, str) for p in spec.params)
    assert isinstance(spec.doc, str) and spec.doc
    for rule in ("shape", "dtype", "expr", "reference", "ff", "torch"):
        assert callable(getattr(spec, rule)), f"{name}.{rule} is not callable"
    # the term constructors it introduces: declared once, with a cost and a degree rule
    assert isinstance(spec.terms, tuple)
    for c in spec.terms:
        assert isinstance(c, Constructor) and c.cost >= 0 and callable(c.degree), c
    assert spec.mutation_class in (None, "unary", "binary")
    # the Triton emission: tile (in a kernel), host (torch, between kernels), dimension rule
    assert isinstance(spec.triton, TritonEmission), f"{name}.triton"
    for part in ("tile", "host", "dims"):
        assert callable(getattr(spec.triton, part)), f"{name}.triton.{part} is not callable"
    assert isinstance(spec.triton.keeps_zero, bool)
    if name != "customized":  # a graph-defined kernel is lowered as a whole
        shapes = [(4, 4)] * spec.num_inputs[0]
        params = {k: v for k, v in {"dim": 1, "scalar": 2.0, "normalized_shape": (4,),
                                    "start": 1, "stop": 3, "count": 4,
                                    "dtype": "float16"}.items() if k in spec.params}
        rel = spec.triton.dims(shapes, params)
        assert isinstance(rel, TileDims) and len(rel.out) == 2
        assert isinstance(spec.triton.host(["a", "b"][:len(shapes)], shapes, params), str)


def test_levels_constant() -> None:
    assert LEVELS == {"kernel", "block", "thread"}


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(em.OpSpec)])
def test_opspec_rejects_none(field: str) -> None:
    with pytest.raises(TypeError, match=field):
        dataclasses.replace(OPS["add"], **{field: None})


@pytest.mark.parametrize("levels", [frozenset(), frozenset({"warp"}),
                                    frozenset({"kernel", "grid"})])
def test_opspec_rejects_bad_levels(levels: frozenset) -> None:
    with pytest.raises(TypeError, match="levels"):
        dataclasses.replace(OPS["add"], levels=levels)


def test_unknown_op() -> None:
    g, (x,) = _graph((2, 3))
    with pytest.raises(em.GraphError, match="nosuch"):
        g.apply("nosuch", (x,))


# --- shape errors ------------------------------------------------------------------------------
# One case per op-table entry: a builder that applies the op to operands it must reject, and the
# shapes the error message has to name. Element-wise unary operators accept every shape (there
# is nothing to get wrong), which the second table records; a new op must go in one of the two.

def _case(dims: list[tuple[int, ...]], call: Callable, shapes: list[str]) -> Callable:
    def build() -> tuple[Callable[[], object], list[str]]:
        g, xs = _graph(*dims)
        return (lambda: call(g, *xs)), shapes

    return build


def _matmul_block_graph():
    """A thread-block graph computing X (2, 64) @ W (64, 32) on a grid of 2 blocks."""
    from egraph_mirage.mugraph import new_threadblock_graph

    _, (x, w) = _graph((2, 64), (64, 32))
    tb = new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    xt = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=1)
    wt = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(xt, wt)), output_map=(1, -1, -1))
    return tb


def _customized_bad_operand() -> tuple[Callable[[], object], list[str]]:
    from egraph_mirage.mugraph import GraphDefinedKernel

    kernel = GraphDefinedKernel(_matmul_block_graph())
    h, (bad, w2) = _graph((3, 64), (64, 32))
    # applied through the op-table entry, the way every other operator is checked
    return (lambda: h.apply("customized", (bad, w2), kernel=kernel, output=0)), ["(3, 64)"]


BAD_SHAPES: dict[str, Callable[[], tuple[Callable[[], object], list[str]]]] = {
    "matmul": _case([(2, 3), (4, 5)], lambda g, a, b: g.matmul(a, b), ["(2, 3)", "(4, 5)"]),
    "add": _case([(2, 3), (2, 4)], lambda g, a, b: g.add(a, b), ["(2, 3)", "(2, 4)"]),
    "mul": _case([(2, 3), (3, 3)], lambda g, a, b: g.mul(a, b), ["(2, 3)", "(3, 3)"]),
    "div": _case([(2, 3), (2, 3, 1)], lambda g, a, b: g.div(a, b), ["(2, 3)", "(2, 3, 1)"]),
    "reduction": _case([(2, 3)], lambda g, a: g.reduction(a, 2), ["(2, 3)"]),
    "rms_norm": _case([(2, 3)], lambda g, a: g.rms_norm(a, (4,)), ["(4,)", "(2, 3)"]),
    "concat": _case([(2, 3), (4, 5)], lambda g, a, b: g.concat(a, b, 0), ["(2, 3)", "(4, 5)"]),
    "customized": _customized_bad_operand,
    "sub": _case([(2, 3), (3, 3)], lambda g, a, b: g.sub(a, b), ["(2, 3)", "(3, 3)"]),
    "mean": _case([(2, 3)], lambda g, a: g.mean(a, 2), ["(2, 3)"]),
    "amax": _case([(2, 3)], lambda g, a: g.amax(a, -3), ["(2, 3)"]),
    "slice_last": _case([(2, 3)], lambda g, a: g.slice_last(a, 1, 4), ["(2, 3)"]),
}
SHAPE_FREE = {*ELEMENTWISE_UNARY, "mul_scalar", "add_scalar", "div_count", "cast"}


def test_every_op_has_a_shape_case() -> None:
    assert not set(BAD_SHAPES) & SHAPE_FREE
    assert set(BAD_SHAPES) | SHAPE_FREE == set(OPS)


@pytest.mark.parametrize("name", sorted(BAD_SHAPES))
def test_shape_error(name: str) -> None:
    call, shapes = BAD_SHAPES[name]()
    with pytest.raises(em.ShapeError) as info:
        call()
    msg = str(info.value)
    assert name in msg
    for s in shapes:
        assert s in msg, f"{s} not named in {msg!r}"


@pytest.mark.parametrize("name", sorted(SHAPE_FREE))
def test_shape_free_ops_keep_any_shape(name: str) -> None:
    spec = OPS[name]
    assert spec.num_inputs == (1, 1) and THREAD in spec.levels
    params = ({"scalar": 2.0} if name in ("mul_scalar", "add_scalar") else
              {"count": 4} if name == "div_count" else
              {"dtype": "float32"} if name == "cast" else {})
    for dims in [(5,), (2, 3), (1, 4, 1), (2, 3, 4, 5)]:
        g, (x,) = _graph(dims)
        assert g.apply(name, (x,), **params).dims == dims


def test_customized_method() -> None:
    tb = _matmul_block_graph()
    g, (x, w) = _graph((2, 64), (64, 32))
    (out,) = g.customized([x, w], tb)
    assert out.dims == (2, 32) and out.op == "customized"
    ref, (rx, rw) = _graph((2, 64), (64, 32))
    ref.mark_output(ref.matmul(rx, rw))
    oracle = em.Oracle(ref)  # the kernel's expression equals X @ W's under the rules
    assert oracle.class_of(out) == oracle.snapshot.roots[0]
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 64)), rng.standard_normal((64, 32))]
    g.mark_output(out)
    np.testing.assert_allclose(g.evaluate(xs)[0], xs[0] @ xs[1], rtol=1e-10)
    h, (bad, w2) = _graph((3, 64), (64, 32))
    with pytest.raises(em.EMError, match=r"customized.*\(3, 64\)"):
        h.customized([bad, w2], tb)


def test_rms_norm_gain_may_not_enlarge() -> None:
    g, (x, gain) = _graph((2, 1), (2, 8))
    with pytest.raises(em.ShapeError, match=r"rms_norm.*\(2, 8\).*\(2, 1\)"):
        g.rms_norm(x, (1,), gain)


def test_matmul_rank_errors() -> None:
    g, (a, b, c) = _graph((4,), (4, 2), (3, 4, 2))
    with pytest.raises(em.ShapeError, match=r"matmul.*\(4,\)"):
        g.matmul(a, b)
    with pytest.raises(em.ShapeError, match=r"matmul.*\(4, 2\).*\(3, 4, 2\)"):
        g.matmul(b, c)


@pytest.mark.parametrize("scalar", [float("nan"), float("inf"), "0.5", None, True])
def test_mul_scalar_rejects_bad_scalar_when_built(scalar: object) -> None:
    g, (x,) = _graph((2, 3))
    with pytest.raises(em.EMError, match="mul_scalar"):
        g.mul_scalar(x, scalar)  # type: ignore[arg-type]


# --- dtype errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["matmul", "add", "mul", "div", "concat", "rms_norm"])
def test_dtype_mismatch(name: str) -> None:
    g = em.new_kernel_graph()
    a = g.new_input(dims=(4, 4), dtype=em.float16)
    b = g.new_input(dims=(4, 4) if name != "rms_norm" else (1, 4), dtype=em.float32)
    params = {"dim": 0} if name == "concat" else {"normalized_shape": (4,)} if name == "rms_norm" \
        else {}
    with pytest.raises(em.DTypeError) as info:
        g.apply(name, (a, b), **params)
    msg = str(info.value)
    assert name in msg and "float16" in msg and "float32" in msg


@pytest.mark.parametrize("dtype", list(em.DType))
def test_dtype_kept(dtype: em.DType) -> None:
    g, (a, b) = _graph((4, 4), (4, 4), dtype=dtype)
    assert g.matmul(a, b).dtype is dtype
    assert g.exp(a).dtype is dtype and g.reduction(a, 0).dtype is dtype


# --- float semantics ---------------------------------------------------------------------------

def _ref(name: str, xs: list[np.ndarray], **params: object) -> np.ndarray:
    return OPS[name].reference(xs, params)


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x)


RNG = np.random.default_rng(0)


def _rand(*dims: int) -> np.ndarray:
    return RNG.standard_normal(dims)


def test_matmul_reference() -> None:
    a, b = _rand(3, 4, 5), _rand(3, 5, 6)
    np.testing.assert_allclose(_ref("matmul", [a, b]), torch.matmul(_t(a), _t(b)).numpy(),
                               rtol=1e-12)
    a2, b2 = _rand(1, 4, 5), _rand(3, 5, 2)
    out = _ref("matmul", [a2, b2])
    np.testing.assert_allclose(out, torch.matmul(_t(a2), _t(b2)).numpy(), rtol=1e-12)
    assert out.shape == OPS["matmul"].shape("matmul", [a2.shape, b2.shape], {})


@pytest.mark.parametrize("name,fn", [("add", torch.add), ("mul", torch.mul), ("div", torch.div)])
def test_binary_reference(name: str, fn) -> None:
    a, b = _rand(2, 1, 4), _rand(2, 3, 4) + 3.0
    np.testing.assert_allclose(_ref(name, [a, b]), fn(_t(a), _t(b)).numpy(), rtol=1e-12)
    assert _ref(name, [a, b]).shape == OPS[name].shape(name, [a.shape, b.shape], {})


#: parameters the generic cases below give the operators that take them
SAMPLE_PARAMS = {"dim": -1, "scalar": 0.5, "normalized_shape": (4,), "start": 1, "stop": 3,
                 "count": 4, "dtype": "float16"}
#: operand shapes tried in order; the first that the operator's shape rule accepts is used
SAMPLE_SHAPES = [((3, 4),), ((3, 4), (3, 4)), ((3, 4), (4, 2)), ((3, 4), (1, 4))]


def sample_case(name: str) -> tuple[list[np.ndarray], dict[str, object]]:
    """Positive random operands of shapes the operator accepts, and sample parameters."""
    spec = OPS[name]
    params = {k: SAMPLE_PARAMS[k] for k in spec.params}
    for shapes in SAMPLE_SHAPES:
        if spec.num_inputs[0] <= len(shapes) <= spec.num_inputs[1]:
            try:
                spec.shape(name, list(shapes), params)
            except em.ShapeError:
                continue
            return [np.abs(_rand(*d)) + 0.1 for d in shapes], params
    raise AssertionError(f"{name}: no sample operands; extend SAMPLE_SHAPES")


@pytest.mark.parametrize("name", [n for n, s in OPS.items() if not s.graph_defined])
def test_torch_rule_matches_the_reference(name: str) -> None:
    """Every entry's PyTorch semantics equal its numpy reference (in float64)."""
    xs, params = sample_case(name)
    want = _ref(name, xs, **params)
    got = OPS[name].torch([_t(x) for x in xs], params)
    assert tuple(got.shape) == want.shape == OPS[name].shape(name, [x.shape for x in xs], params)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)


def test_gelu_is_not_the_erf_form() -> None:
    x = np.linspace(-3, 3, 13)
    exact = F.gelu(_t(x)).numpy()
    assert np.max(np.abs(_ref("gelu", [x]) - exact)) > 1e-6


def test_mul_scalar_reference() -> None:
    x = _rand(2, 5)
    np.testing.assert_allclose(_ref("mul_scalar", [x], scalar=0.125), (_t(x) * 0.125).numpy())


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_reduction_reference(dim: int) -> None:
    x = _rand(2, 3, 4)
    out = _ref("reduction", [x], dim=dim)
    np.testing.assert_allclose(out, torch.sum(_t(x), dim=dim, keepdim=True).numpy(), rtol=1e-12)
    assert out.shape == OPS["reduction"].shape("reduction", [x.shape], {"dim": dim})


@pytest.mark.parametrize("normalized_shape", [(5,), (4, 5)])
def test_rms_norm_reference(normalized_shape: tuple[int, ...]) -> None:
    x = _rand(3, 4, 5)
    dims = tuple(range(-len(normalized_shape), 0))
    tx = _t(x)
    expected = tx / torch.sqrt(torch.mean(tx * tx, dim=dims, keepdim=True))
    np.testing.assert_allclose(_ref("rms_norm", [x], normalized_shape=normalized_shape),
                               expected.numpy(), rtol=1e-10)
    gain = _rand(1, 1, 5)
    np.testing.assert_allclose(_ref("rms_norm", [x, gain], normalized_shape=normalized_shape),
                               (expected * _t(gain)).numpy(), rtol=1e-10)


def test_rms_norm_reference_int_shape() -> None:
    x = _rand(2, 6)
    expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))
    np.testing.assert_allclose(_ref("rms_norm", [x], normalized_shape=6), expected, rtol=1e-12)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_concat_reference(dim: int) -> None:
    a = _rand(2, 3)
    b = _rand(4, 3) if dim == 0 else _rand(2, 5)
    out = _ref("concat", [a, b], dim=dim)
    np.testing.assert_array_equal(out, torch.cat([_t(a), _t(b)], dim=dim).numpy())
    assert out.shape == OPS["concat"].shape("concat", [a.shape, b.shape], {"dim": dim})


def test_references_cover_table() -> None:
    """Every operator has a float reference that runs on sample operands."""
    for name, spec in OPS.items():
        if not spec.graph_defined:  # graph-defined kernels: checked block by block elsewhere
            xs, params = sample_case(name)
            assert np.all(np.isfinite(_ref(name, xs, **params))), name


def test_every_constructor_of_an_expression_is_declared() -> None:
    """The terms an entry's expression builds use only declared constructors (the oracle
    declares exactly those), so no entry forgets its ``terms``."""
    from egraph_mirage.ops import term_constructors

    declared = term_constructors()
    for name, spec in OPS.items():
        if spec.graph_defined:
            continue
        xs, params = sample_case(name)
        g, ts = _graph(*[x.shape for x in xs], dtype=em.float32)
        out = g.apply(name, ts, **params)
        used = {t.op for t in em.abstract_term(out).walk()}
        assert used <= declared.keys(), f"{name}: {used - declared.keys()} not declared"
