"""Mixed precision, first step: the dtype conversion ``cast`` (one op-table record,
``egraph_mirage/ops/cast.py``) and the torch front end emitting it.

- The record: a cast rounds to its dtype in the float reference (as PyTorch does), is the
  identity to the finite field and to the oracle (``cast(x)`` and ``x`` are one e-class), and
  lowers to a Triton cast in a kernel and a torch cast between kernels.
- The search never proposes a cast and absorbs a program's: the HF-style norm written with
  casts finds the same μGraph as the norm written without.
- The front end: ``transformers``' RMSNorm (computed in float32, cast back) followed by a
  projection traces into one kernel graph and one piece, and ``torch.compile`` replaces that
  piece and matches eager in fp16 and bf16; softmax computed in float32 traces.

The float check's tolerance (``gpu.tune.TOLERANCE``: relative error, the larger of the norm-wise
and the worst-element one, ``gpu.torch_eval.relative_error``) is 5e-3 for fp16 and fp32 and 4e-2
for bf16 (3 fewer mantissa bits); the tests below assert each replaced piece against eager
within its output dtype's.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.gpu.torch_eval import evaluate, relative_error
from egraph_mirage.gpu.tune import TOLERANCE
from egraph_mirage.ops import BLOCK, KERNEL, THREAD
from egraph_mirage.ops.cast import CAST, to_dtype
from egraph_mirage.verify import NumericCheck

TORCH = {em.float16: torch.float16, em.bfloat16: torch.bfloat16, em.float32: torch.float32}
#: tasks that find the fused RMSNorm + projection below (97 at the time of writing)
TASKS = 130


# --- the record ----------------------------------------------------------------------------------

def test_the_record() -> None:
    assert em.OPS["cast"] is CAST
    assert CAST.num_inputs == (1, 1) and CAST.params == ("dtype",) and CAST.terms == ()
    assert CAST.levels == {KERNEL, BLOCK, THREAD} and CAST.mutation_class is None
    g = em.new_kernel_graph()
    x = g.new_input((4, 8), em.float16)
    for dtype in em.DType:
        y = g.cast(x, dtype)
        assert y.dtype is dtype and y.dims == (4, 8) and y.params == {"dtype": dtype.value}
    with pytest.raises(em.DTypeError, match="cast: dtype must be one of"):
        g.cast(x, "float64")
    with pytest.raises(em.DTypeError, match="different dtypes float16, float32"):
        g.mul(x, g.cast(x, em.float32))  # binary operators take one dtype: the program casts


@pytest.mark.parametrize("dtype", list(em.DType))
def test_the_float_reference_rounds_as_torch_does(dtype: em.DType) -> None:
    """Rounding through float32 (bf16: to nearest even on the float32 bits), equal to torch's
    ``x.to(dtype)`` bit for bit, overflow to infinity and NaN included."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(20_000) * np.exp(rng.uniform(-30, 30, 20_000))
    x = np.concatenate([x, [np.inf, -np.inf, np.nan, 65519.0, 65520.0, 3.4e38, 1e39, 0.0]])
    want = torch.from_numpy(x).to(TORCH[dtype]).double().numpy()
    got = CAST.reference([x], {"dtype": dtype.value})
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    with np.errstate(over="ignore"):
        single = x.astype(np.float32)
    assert np.array_equal(to_dtype(single, dtype),
                          torch.from_numpy(single).to(TORCH[dtype]).float().numpy(),
                          equal_nan=True)
    if dtype is not em.float32:
        assert np.any(got[:20_000] != x[:20_000])  # it rounds


def test_the_finite_field_and_the_oracle_see_the_identity() -> None:
    sentinel = object()
    assert CAST.ff(None, [sentinel], {"dtype": "float16"}) is sentinel
    g = em.new_kernel_graph()
    x = g.new_input((4, 64), em.float16)
    w = g.new_input((64, 32), em.float16)
    up = g.cast(x, em.float32)
    back = g.cast(g.square(up), em.float16)
    g.mark_output(g.matmul(back, w))
    assert em.abstract_expr(up) == em.abstract_expr(x) == '(Var "v0")'
    assert em.abstract_expr(back) == '(Square (Var "v0"))'
    oracle = em.Oracle(g)
    assert oracle.class_of(up) == oracle.class_of(x)
    assert oracle.class_of(back) == oracle.class_of(g.operators[1])  # square(cast(x))
    plain = em.new_kernel_graph()
    px, pw = plain.new_input((4, 64), em.float16), plain.new_input((64, 32), em.float16)
    plain.mark_output(plain.matmul(plain.square(px), pw))
    assert em.verify(g, plain, tests=2).equivalent


def test_the_search_s_float_check_sees_through_casts() -> None:
    """The search's float check (``NumericCheck``, tolerance ``numeric_tolerance`` = 1e-6)
    compares real functions: casts pass their operand through (``evaluate(exact=True)``);
    the program's own evaluation rounds."""
    g = em.new_kernel_graph()
    x = g.new_input((4, 64), em.float32)
    g.mark_output(g.cast(g.exp(g.cast(x, em.bfloat16)), em.float32))
    plain = em.new_kernel_graph()
    plain.mark_output(plain.exp(plain.new_input((4, 64), em.float32)))
    xs = [np.random.default_rng(1).standard_normal((4, 64))]
    assert np.array_equal(g.evaluate(xs, exact=True)[0], plain.evaluate(xs)[0])
    assert np.max(np.abs(g.evaluate(xs)[0] - plain.evaluate(xs)[0])) > 1e-3
    assert NumericCheck(g).error(plain) < 1e-12


# --- the lowering --------------------------------------------------------------------------------

def _cast_matmul(dtype: em.DType, to: em.DType) -> em.KernelGraph:
    """X @ W in one kernel whose block graph rounds X's tiles to ``to`` and back."""
    h = em.new_kernel_graph()
    X, W = h.new_input((8, 64), dtype), h.new_input((64, 32), dtype)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=4)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, (1, -1, -1), forloop_dim=0)
    xr = tb.cast(tb.cast(x, to), dtype)
    tb.new_output(tb.forloop_accum(tb.matmul(xr, w)), (1, -1, -1))
    h.mark_output(h.customized([X, W], tb)[0])
    return h


@pytest.mark.parametrize("dtype,to", [(em.float32, em.bfloat16), (em.bfloat16, em.float32),
                                      (em.float16, em.float32)])
def test_a_cast_in_a_block_graph_lowers(dtype: em.DType, to: em.DType) -> None:
    """Within the output dtype's tolerance: Triton's interpreter truncates to bfloat16 where
    the reference (and a GPU) round to nearest even."""
    h = _cast_matmul(dtype, to)
    rng = np.random.default_rng(0)
    ts = [torch.tensor(rng.standard_normal(t.dims) * 0.5, dtype=TORCH[dtype]) for t in h.inputs]
    got = em.compile(h)(*ts)[0]
    want = em.run_reference(h, [t.double().numpy() for t in ts])[0]
    assert got.dtype == TORCH[dtype]
    assert relative_error(got, torch.from_numpy(want)) < TOLERANCE[dtype]
    src = em.lower.generate_source(h)
    assert f".to(tl.{to.value}).to(tl.float32)" in src or to is em.float32


def test_a_cast_between_kernels_is_a_torch_cast() -> None:
    """A library cast (kernel level): the host's ``x.to(torch.bfloat16)``, a bf16 tensor
    between the kernels."""
    g = em.new_kernel_graph()
    x = g.new_input((8, 64), em.float32)
    y = g.cast(g.exp(x), em.bfloat16)
    g.mark_output(g.cast(g.square(y), em.float32))
    src = em.lower.generate_source(g)
    assert ".to(torch.bfloat16)" in src
    xs = torch.randn(8, 64)
    got = em.compile(g)(xs)[0]
    want = (xs.exp().to(torch.bfloat16).float() ** 2)
    assert got.dtype == torch.float32
    assert relative_error(got, want) < TOLERANCE[em.bfloat16]
    torch.testing.assert_close(evaluate(g, [xs], None)[0], want, rtol=1e-2, atol=1e-2)
