"""The operators of transformer blocks (issue 19), each one op-table entry: sub, neg, rsqrt,
sigmoid, tanh, gelu_tanh, gelu_erf, add_scalar, mean, amax, slice_last and rms_norm's eps.

Each is checked against eager PyTorch (fp32 and fp16), in the finite-field verifier (programs
equal over the reals accepted, a wrong one rejected), in Triton's interpreter, and where it has
identities in the oracle. Shapes are small: the whole file runs in seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import egraph_mirage as em
from egraph_mirage.gpu.torch_eval import evaluate
from egraph_mirage.lower import generate_source

TORCH = {em.float32: torch.float32, em.float16: torch.float16}
#: largest error of eager PyTorch against the float64 reference, relative to the largest value
TOL = {em.float32: 2e-6, em.float16: 2e-3}
DTYPES = pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
NEW_OPS = ("sub", "neg", "rsqrt", "sigmoid", "tanh", "gelu_tanh", "gelu_erf", "add_scalar",
           "mean", "amax", "slice_last")

Build = Callable[[em.KernelGraph, list[em.Tensor]], em.Tensor]
Eager = Callable[..., torch.Tensor]
#: op -> (operand shapes, the op applied in a kernel graph, the same in eager PyTorch)
CASES: dict[str, tuple[list[tuple[int, ...]], Build, Eager]] = {
    "sub": ([(3, 8), (1, 8)], lambda g, t: g.sub(t[0], t[1]), torch.sub),
    "neg": ([(3, 8)], lambda g, t: g.neg(t[0]), torch.neg),
    "rsqrt": ([(3, 8)], lambda g, t: g.rsqrt(t[0]), torch.rsqrt),
    "sigmoid": ([(3, 8)], lambda g, t: g.sigmoid(t[0]), torch.sigmoid),
    "tanh": ([(3, 8)], lambda g, t: g.tanh(t[0]), torch.tanh),
    "gelu_tanh": ([(3, 8)], lambda g, t: g.gelu_tanh(t[0]),
                  lambda x: F.gelu(x, approximate="tanh")),
    "gelu_erf": ([(3, 8)], lambda g, t: g.gelu_erf(t[0]), F.gelu),
    "add_scalar": ([(3, 8)], lambda g, t: g.add_scalar(t[0], 0.75), lambda x: x + 0.75),
    "mean": ([(3, 8)], lambda g, t: g.mean(t[0], -1), lambda x: x.mean(-1, keepdim=True)),
    "amax": ([(3, 8)], lambda g, t: g.amax(t[0], 0), lambda x: x.amax(0, keepdim=True)),
    "slice_last": ([(3, 8)], lambda g, t: g.slice_last(t[0], 2, 7), lambda x: x[..., 2:7]),
    "rms_norm_eps": ([(3, 8), (1, 8)], lambda g, t: g.rms_norm(t[0], (8,), t[1], eps=0.25),
                     lambda x, w: F.rms_norm(x, (8,), w[0], eps=0.25)),
}


def _program(shapes: list[tuple[int, ...]], build: Build,
             dtype: em.DType = em.float32) -> em.KernelGraph:
    g = em.new_kernel_graph()
    ts = [g.new_input(s, dtype) for s in shapes]
    g.mark_output(build(g, ts))
    return g


def _inputs(shapes: list[tuple[int, ...]], seed: int = 0) -> list[np.ndarray]:
    """Values in [0.1, 2) and (-2, -0.1] (rsqrt takes the absolute value of its operand)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.1, 2.0, s) * rng.choice([-1.0, 1.0], s) for s in shapes]


def test_the_table_has_every_operator() -> None:
    assert set(NEW_OPS) <= set(em.OPS) and "eps" in em.OPS["rms_norm"].optional_names
    for name in NEW_OPS:
        spec = em.OPS[name]
        want = {"slice_last": {"kernel", "block"}, "mean": {"kernel", "block"},
                "amax": {"kernel", "block"}}.get(name, {"kernel", "block", "thread"})
        assert spec.levels == want, name
        assert not spec.commutative


# --- against eager PyTorch ------------------------------------------------------------------------

@DTYPES
@pytest.mark.parametrize("name", sorted(CASES))
def test_against_eager_torch(name: str, dtype: em.DType) -> None:
    """The entry's PyTorch semantics (run through the program) equal eager PyTorch in ``dtype``,
    and its float64 reference agrees with both to the dtype's precision."""
    shapes, build, eager = CASES[name]
    g = _program(shapes, build, dtype)
    xs = _inputs(shapes)
    if name == "rsqrt":
        xs = [np.abs(x) for x in xs]
    ts = [torch.tensor(x, dtype=TORCH[dtype]) for x in xs]
    (got,) = evaluate(g, ts, None)
    want = eager(*ts)
    assert got.dtype == TORCH[dtype] and tuple(got.shape) == g.outputs[0].dims
    torch.testing.assert_close(got, want)
    (ref,) = g.evaluate([t.double().numpy() for t in ts])
    err = np.abs(want.double().numpy() - ref).max() / np.abs(ref).max()
    assert err < TOL[dtype], f"{name}: {err:.2e}"


def test_gelu_forms() -> None:
    """gelu is the tanh form, like gelu_tanh (one function, one constructor); gelu_erf is
    PyTorch's default."""
    g = _program([(4, 8)], lambda g, t: g.gelu(t[0]))
    h = _program([(4, 8)], lambda g, t: g.gelu_tanh(t[0]))
    assert em.abstract_expr(g.outputs[0]) == em.abstract_expr(h.outputs[0]) == '(Gelu (Var "v0"))'
    x = np.linspace(-3, 3, 32).reshape(4, 8)
    np.testing.assert_allclose(h.evaluate([x])[0], F.gelu(torch.tensor(x), approximate="tanh"))
    e = _program([(4, 8)], lambda g, t: g.gelu_erf(t[0]))
    np.testing.assert_allclose(e.evaluate([x])[0], F.gelu(torch.tensor(x)).numpy(), rtol=1e-12)
    assert np.abs(e.evaluate([x])[0] - h.evaluate([x])[0]).max() > 1e-4


def test_sub_and_neg_are_add_and_mul_by_minus_one() -> None:
    g = em.new_kernel_graph()
    a, b = g.new_input((2, 4)), g.new_input((2, 4))
    assert em.abstract_expr(g.sub(a, b)) == '(Add (Var "v0") (Mul (Var "v1") (Const "-1.0")))'
    assert em.abstract_expr(g.neg(a)) == em.abstract_expr(g.mul_scalar(a, -1.0))
    assert em.abstract_expr(g.add_scalar(a, 2)) == '(Add (Var "v0") (Const "2.0"))'


def test_mean_and_amax_expressions() -> None:
    g = em.new_kernel_graph()
    x = g.new_input((4, 1, 6))
    assert em.abstract_expr(g.mean(x, -1)) == '(Div (Sum 6 (Var "v0")) (Num 6))'
    assert em.abstract_expr(g.amax(x, 0)) == '(Max 4 (Var "v0"))'
    assert em.abstract_expr(g.mean(x, 1)) == em.abstract_expr(g.amax(x, 1)) == '(Var "v0")'
    assert em.abstract_expr(g.slice_last(x, 0, 6)) == '(Var "v0")'
    assert g.mean(x, 0).dims == (1, 1, 6) and g.amax(x, 2).dims == (4, 1, 1)


def test_rms_norm_eps_zero_is_the_program_without_it() -> None:
    """eps 0 (the default) is left out of the program: same parameters, expression, JSON."""
    def build(**eps: float) -> em.KernelGraph:
        g = em.new_kernel_graph()
        x, w = g.new_input((2, 8)), g.new_input((1, 8))
        g.mark_output(g.rms_norm(x, (8,), w, **eps))
        return g

    plain, zero, some = build(), build(eps=0.0), build(eps=1e-5)
    assert zero.outputs[0].params == plain.outputs[0].params == {"normalized_shape": (8,)}
    assert em.to_json(zero) == em.to_json(plain)
    assert em.abstract_expr(zero.outputs[0]) == em.abstract_expr(plain.outputs[0])
    assert some.outputs[0].params["eps"] == 1e-5
    assert em.abstract_expr(some.outputs[0]) == (
        '(Mul (Div (Var "v0") (Sqrt (Add (Div (Sum 8 (Mul (Var "v0") (Var "v0"))) (Num 8)) '
        '(Const "1e-05")))) (Var "v1"))')
    again = em.loads(em.to_json(some))
    assert again.outputs[0].params["eps"] == 1e-5


@pytest.mark.parametrize("call,match", [
    (lambda g, x: g.rms_norm(x, (8,), eps=-1.0), "rms_norm: eps"),
    (lambda g, x: g.rms_norm(x, (8,), eps=float("nan")), "rms_norm: eps"),
    (lambda g, x: g.rms_norm(x, (8,), eps=True), "rms_norm: eps"),
    (lambda g, x: g.add_scalar(x, "1"), "add_scalar: the scalar"),
    (lambda g, x: g.add_scalar(x, float("inf")), "add_scalar: the scalar"),
    (lambda g, x: g.slice_last(x, 3, 3), r"slice_last: \[3:3\]"),
    (lambda g, x: g.slice_last(x, 0, 9), r"slice_last: \[0:9\].*\(2, 8\)"),
    (lambda g, x: g.slice_last(x, 1.0, 4), "slice_last: start must be an integer"),
])
def test_bad_parameters_are_shape_errors(call: Callable, match: str) -> None:
    g = em.new_kernel_graph()
    with pytest.raises(em.ShapeError, match=match):
        call(g, g.new_input((2, 8)))


def test_unknown_parameters_are_refused() -> None:
    g = em.new_kernel_graph()
    x = g.new_input((2, 8))
    with pytest.raises(em.GraphError, match=r"rms_norm: expects parameters .*optionally"):
        g.apply("rms_norm", (x,), normalized_shape=(8,), eps=0.1, gamma=1.0)
    with pytest.raises(em.GraphError, match="mean: expects parameters"):
        g.apply("mean", (x,), dim=0, eps=0.1)


# --- finite-field semantics --------------------------------------------------------------------

def _pair(shapes: list[tuple[int, ...]], a: Build, b: Build) -> tuple[em.KernelGraph, ...]:
    return _program(shapes, a), _program(shapes, b)


def _rms_by_hand(g: em.KernelGraph, t: list[em.Tensor], eps: float) -> em.Tensor:
    """x * rsqrt(mean(x * x) + eps) * w, as a traced Llama RMSNorm writes it."""
    x, w = t
    inner = g.mean(g.mul(x, x), -1)
    if eps:
        inner = g.add_scalar(inner, eps)
    return g.mul(g.mul(x, g.rsqrt(inner)), w)


N = 16
#: (operand shapes, a program, one equal to it over the reals, one that is not)
FIELD_CASES: dict[str, tuple[list[tuple[int, ...]], Build, Build, Build]] = {
    "sub": ([(4, N), (4, N)], lambda g, t: g.sub(t[0], t[1]),
            lambda g, t: g.add(t[0], g.neg(t[1])), lambda g, t: g.sub(t[1], t[0])),
    "neg": ([(4, N)], lambda g, t: g.neg(g.neg(t[0])), lambda g, t: g.mul_scalar(t[0], 1.0),
            lambda g, t: g.neg(t[0])),
    "rsqrt": ([(4, N), (4, N)], lambda g, t: g.mul(t[0], g.rsqrt(t[1])),
              lambda g, t: g.div(t[0], g.sqrt(t[1])), lambda g, t: g.mul(t[0], g.sqrt(t[1]))),
    "tanh": ([(4, N)], lambda g, t: g.tanh(t[0]),
             lambda g, t: g.add_scalar(g.mul_scalar(g.sigmoid(g.mul_scalar(t[0], 2.0)), 2.0),
                                       -1.0),
             lambda g, t: g.sigmoid(t[0])),
    "gelu_tanh": ([(4, N)], lambda g, t: g.gelu_tanh(t[0]), lambda g, t: g.gelu(t[0]),
                  lambda g, t: g.gelu_erf(t[0])),
    "add_scalar": ([(4, N)], lambda g, t: g.add_scalar(g.add_scalar(t[0], 0.5), 0.25),
                   lambda g, t: g.add_scalar(t[0], 0.75), lambda g, t: g.add_scalar(t[0], 0.5)),
    "mean": ([(4, N)], lambda g, t: g.mean(t[0], -1),
             lambda g, t: g.mul_scalar(g.reduction(t[0], -1), 1.0 / N),
             lambda g, t: g.reduction(t[0], -1)),
    "amax": ([(4, 6), (4, 10)], lambda g, t: g.amax(g.concat(t[0], t[1], -1), -1),
             lambda g, t: g.amax(g.concat(t[1], t[0], -1), -1),
             lambda g, t: g.amax(g.concat(t[0], t[0], -1), -1)),
    "slice_last": ([(4, 6), (4, 10)],
                   lambda g, t: g.slice_last(g.concat(t[0], t[1], -1), 6, 16),
                   lambda g, t: g.slice_last(t[1], 0, 10),
                   lambda g, t: g.slice_last(g.concat(t[0], t[1], -1), 5, 15)),
    "rms_norm_eps": ([(4, N), (1, N)], lambda g, t: g.rms_norm(t[0], (N,), t[1], eps=1e-5),
                     lambda g, t: _rms_by_hand(g, t, 1e-5),
                     lambda g, t: g.rms_norm(t[0], (N,), t[1])),
    "rms_norm_no_eps": ([(4, N), (1, N)], lambda g, t: g.rms_norm(t[0], (N,), t[1]),
                        lambda g, t: _rms_by_hand(g, t, 0.0),
                        lambda g, t: g.rms_norm(t[0], (N,), t[1], eps=1e-3)),
}


def test_verify_sub() -> None:
    shapes, a, same, wrong = FIELD_CASES["sub"]
    target = _program(shapes, a)
    assert em.verify(target, _program(shapes, same)).equivalent
    assert not em.verify(target, _program(shapes, wrong)).equivalent


@pytest.mark.parametrize("name", sorted(FIELD_CASES))
def test_finite_field_semantics(name: str) -> None:
    """``em.verify``'s tests, run by one ``Verifier`` on the numpy backend (the same verdict
    without a JAX compile per program)."""
    shapes, a, same, wrong = FIELD_CASES[name]
    verifier = em.Verifier(_program(shapes, a), tests=2, backend="numpy")
    assert verifier.check(_program(shapes, same)).equivalent, name
    assert not verifier.check(_program(shapes, wrong)).equivalent, name


def test_amax_agrees_with_the_running_max_of_online_softmax() -> None:
    """A row max taken by amax and one taken by ``forloop_max`` over tiles of the row are the
    same value in the field model (a function of the multiset of values)."""
    from egraph_mirage.mugraph.accumulators import running_max_ff
    from egraph_mirage.verify import field as ff

    rng = np.random.default_rng(0)
    tables = {ff.table_key(name, dom): ff.numpy_table(rng, ff.P if dom == "p" else ff.Q)
              for name in ("max", "max_hash") for dom in ("p", "q")}
    f = ff.Field(None, None, tables, xp=np)
    rows, iters, width = 3, 4, 5
    x = ff.numpy_input(rng, (rows, iters * width))
    amax = em.OPS["amax"].ff(f, [x], {"dim": -1})
    # the vectorised layout of one block: (gx, gy, gz, iterations, rows, width)
    tiles = f.arrays.reshape(x, (1, 1, 1, rows, iters, width))
    tiles = f.arrays.transpose(tiles, (0, 1, 2, 4, 3, 5))
    running = running_max_ff(f, tiles)  # (1, 1, 1, iters, rows, 1)
    last = f.arrays.take(running, -1, 3)
    np.testing.assert_array_equal(np.reshape(last.p, (rows, 1)), amax.p)
    np.testing.assert_array_equal(np.reshape(last.q, (rows, 1)), amax.q)


# --- Triton (interpreter) ----------------------------------------------------------------------

Tiles = Callable[[Any, Any, Any], Any]
#: op -> (the operator on tiles a, b of a block graph, the same on the columns a, b of the
#: program with library operators; None where that program needs rows apart)
TILE_OPS: dict[str, tuple[Tiles, Tiles | None]] = {
    "sub": (lambda tb, a, b: tb.sub(a, b), lambda g, a, b: g.sub(a, b)),
    "neg": (lambda tb, a, b: tb.neg(a), lambda g, a, b: g.neg(a)),
    "rsqrt": (lambda tb, a, b: tb.rsqrt(tb.mul(a, a)), lambda g, a, b: g.rsqrt(g.mul(a, a))),
    "sigmoid": (lambda tb, a, b: tb.sigmoid(a), lambda g, a, b: g.sigmoid(a)),
    "tanh": (lambda tb, a, b: tb.tanh(a), lambda g, a, b: g.tanh(a)),
    "gelu_tanh": (lambda tb, a, b: tb.gelu_tanh(a), lambda g, a, b: g.gelu_tanh(a)),
    "gelu_erf": (lambda tb, a, b: tb.gelu_erf(a), lambda g, a, b: g.gelu_erf(a)),
    "add_scalar": (lambda tb, a, b: tb.add_scalar(a, -0.5), lambda g, a, b: g.add_scalar(a, -0.5)),
    "mean": (lambda tb, a, b: tb.add(b, tb.mean(a, 1)), lambda g, a, b: g.add(b, g.mean(a, 1))),
    "amax": (lambda tb, a, b: tb.add(b, tb.amax(a, 1)), lambda g, a, b: g.add(b, g.amax(a, 1))),
    "amax_rows": (lambda tb, a, b: tb.add(b, tb.amax(a, 0)), None),
    "rms_norm_eps": (lambda tb, a, b: tb.rms_norm(a, eps=0.5),
                     lambda g, a, b: g.rms_norm(a, (16,), eps=0.5)),
}


def _one_kernel(op: Tiles, dtype: em.DType) -> em.KernelGraph:
    """X, Y (8, 48): a grid of 2 blocks, a loop of 3 iterations over (4, 16) tiles (padded to
    16 rows), the operator on the tiles, summed over the loop."""
    g = em.new_kernel_graph()
    X, Y = g.new_input((8, 48), dtype), g.new_input((8, 48), dtype)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=3)
    a = tb.new_input(X, (0, -1, -1), forloop_dim=1)
    b = tb.new_input(Y, (0, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(op(tb, a, b)), (0, -1, -1))
    (O,) = g.customized([X, Y], tb)
    g.mark_output(O)
    return g


def _library(op: Tiles) -> em.KernelGraph:
    """``_one_kernel`` with library operators: the operator on each 16 columns, summed."""
    g = em.new_kernel_graph()
    X, Y = g.new_input((8, 48), em.float32), g.new_input((8, 48), em.float32)
    parts = [op(g, g.slice_last(X, k, k + 16), g.slice_last(Y, k, k + 16)) for k in (0, 16, 32)]
    g.mark_output(g.add(g.add(parts[0], parts[1]), parts[2]))
    return g


@pytest.mark.parametrize("name", sorted(TILE_OPS))
def test_triton_emission_in_the_interpreter(name: str) -> None:
    """The operator's tile emission, compiled and run on the CPU, matches the block-by-block
    float64 reference (fp32), and the finite-field verifier accepts the μGraph against the
    program written with library operators."""
    tiles, library = TILE_OPS[name]
    g = _one_kernel(tiles, em.float32)
    rng = np.random.default_rng(1)
    xs = [rng.uniform(-2.0, 2.0, t.dims) for t in g.inputs]
    (want,) = em.run_reference(g, xs)
    (got,) = em.compile(g)(*[torch.tensor(x, dtype=torch.float32) for x in xs])
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-5)
    if library is not None:
        lib = _library(library)
        np.testing.assert_allclose(lib.evaluate(xs)[0], want, rtol=1e-12, atol=1e-12)
        assert em.Verifier(lib, tests=2, backend="numpy").check(g).equivalent


@DTYPES
def test_fp16_kernel_against_eager_torch(dtype: em.DType) -> None:
    """One kernel with several of the operators in ``dtype``, against eager PyTorch in fp32."""
    def op(tb: Any, a: Any, b: Any) -> Any:
        s = tb.sub(tb.gelu_erf(a), tb.tanh(tb.neg(b)))
        return tb.mul(tb.add_scalar(s, 0.25), tb.rsqrt(tb.add_scalar(tb.mean(tb.mul(a, a), 1),
                                                                     1e-3)))

    g = _one_kernel(op, dtype)
    rng = np.random.default_rng(2)
    ts = [torch.tensor(rng.uniform(-2.0, 2.0, t.dims), dtype=TORCH[dtype]) for t in g.inputs]
    (got,) = em.compile(g)(*ts)
    x, y = (t.float().reshape(8, 3, 16) for t in ts)
    s = F.gelu(x) - torch.tanh(-y)
    want = ((s + 0.25) * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-3)).sum(1)
    err = (got.float() - want).abs().max() / want.abs().max()
    assert got.dtype == TORCH[dtype] and err < {em.float32: 1e-5, em.float16: 2e-3}[dtype]


def test_slice_last_between_kernels() -> None:
    """slice_last is a torch slice between kernels; the kernel after it reads the slice."""
    g = em.new_kernel_graph()
    X = g.new_input((8, 48), em.float32)
    S = g.slice_last(X, 8, 40)  # (8, 32), not contiguous in X
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=2)
    s = tb.new_input(S, (0, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.sigmoid(s)), (0, -1, -1))
    (O,) = g.customized([S], tb)
    g.mark_output(O)
    assert "[..., 8:40].contiguous()" in generate_source(g)
    x = torch.tensor(np.random.default_rng(3).standard_normal((8, 48)), dtype=torch.float32)
    (got,) = em.compile(g)(x)
    want = torch.sigmoid(x[:, 8:40]).reshape(8, 2, 16).sum(1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


# --- the oracle --------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_the_oracle_proves_hand_written_rms_norm(eps: float) -> None:
    """x * rsqrt(mean(x*x) + eps) * w (a traced Llama RMSNorm) and rms_norm(x, w, eps) meet in
    the e-graph of the hand-written program (the rsqrt line of rules/30_functions.egg)."""
    hand = _program([(4, N), (1, N)], lambda g, t: _rms_by_hand(g, t, eps))
    norm = _program([(4, N), (1, N)], lambda g, t: g.rms_norm(t[0], (N,), t[1], eps=eps))
    oracle = em.Oracle(hand)
    assert oracle.class_of(norm.outputs[0]) == oracle.snapshot.roots[0]
    other = _program([(4, N), (1, N)], lambda g, t: g.rms_norm(t[0], (N,), t[1], eps=eps + 0.5))
    assert oracle.class_of(other.outputs[0]) != oracle.snapshot.roots[0]


def test_the_oracle_knows_sub_as_add_of_a_negation() -> None:
    """exp(s - m) written with sub and with mul_scalar(m, -1.0) (the hand-written online
    softmax) is one e-class."""
    a = _program([(4, N), (4, 1)], lambda g, t: g.exp(g.sub(t[0], t[1])))
    b = _program([(4, N), (4, 1)], lambda g, t: g.exp(g.add(t[0], g.mul_scalar(t[1], -1.0))))
    oracle = em.Oracle(a)
    assert oracle.class_of(b.outputs[0]) == oracle.snapshot.roots[0]


def test_the_oracle_merges_a_mean_of_means() -> None:
    """A mean over two dimensions, written as two means, is one mean over both
    (rules/50_blocks.egg multiplies the counts)."""
    target = _program([(4, N)], lambda g, t: g.mean(g.mean(t[0], -1), 0))
    oracle = em.Oracle(target)
    assert oracle.class_of(f'(Div (Sum {4 * N} (Var "v0")) (Num {4 * N}))') == \
        oracle.snapshot.roots[0]
