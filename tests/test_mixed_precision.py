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

from pathlib import Path

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.fx import partition, trace
from egraph_mirage.fx.report import REPLACED, reports_of
from egraph_mirage.gpu.torch_eval import evaluate, relative_error, torch_function
from egraph_mirage.gpu.tune import TOLERANCE
from egraph_mirage.mugraph.serialize import dumps
from egraph_mirage.ops import BLOCK, KERNEL, THREAD
from egraph_mirage.ops.cast import CAST, to_dtype
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.tasks import context
from egraph_mirage.verify import NumericCheck

TORCH = {em.float16: torch.float16, em.bfloat16: torch.bfloat16, em.float32: torch.float32}
#: compile() runs the kernels in Triton's interpreter when there is no GPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
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


def test_the_torch_semantics_in_the_program_s_dtypes_and_held_in_float32() -> None:
    """``torch_function(g)``: the eager baseline, a cast is torch's (``probs.half() @ v``
    runs in fp16); ``evaluate(g, xs, float32)``: the reference that tuned kernels are checked
    against, every value held in fp32 and the casts rounding (their fp16 result would not
    meet an fp32 operand in a matmul)."""
    g = em.new_kernel_graph()
    x, v = g.new_input((4, 16), em.float16), g.new_input((16, 8), em.float16)
    p = g.cast(g.exp(g.cast(x, em.float32)), em.float16)
    g.mark_output(g.matmul(p, v))
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(4, 16, generator=gen).half(), torch.randn(16, 8, generator=gen).half()]
    (eager,) = torch_function(g)(*xs)
    assert eager.dtype == torch.float16
    (held,) = evaluate(g, xs, torch.float32)
    assert held.dtype == torch.float32
    rounded = xs[0].float().exp().half().float()
    torch.testing.assert_close(held, rounded @ xs[1].float())
    assert relative_error(eager, held) < TOLERANCE[em.float16]


def test_the_float_check_s_tolerance_per_dtype() -> None:
    """Against eager (the torch backend) and on a GPU (the tuner): the relative error of an
    output within its dtype's tolerance, a program's being its loosest output's."""
    from egraph_mirage.gpu.tune import tolerance

    assert TOLERANCE == {em.float16: 5e-3, em.float32: 5e-3, em.bfloat16: 4e-2}
    g = em.new_kernel_graph()
    x = g.new_input((4, 8), em.float32)
    g.mark_output(g.exp(x))
    assert tolerance(g) == 5e-3
    g.mark_output(g.cast(x, em.bfloat16))
    assert tolerance(g) == 4e-2


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
    the reference rounds to nearest even; a GPU rounds as the reference does (an fp32 output
    then within 1e-5)."""
    h = _cast_matmul(dtype, to)
    rng = np.random.default_rng(0)
    ts = [torch.tensor(rng.standard_normal(t.dims) * 0.5, dtype=TORCH[dtype], device=DEVICE)
          for t in h.inputs]
    got = em.compile(h)(*ts)[0].cpu()
    want = torch.from_numpy(em.run_reference(h, [t.double().cpu().numpy() for t in ts])[0])
    assert got.dtype == TORCH[dtype]
    assert relative_error(got, want) < TOLERANCE[dtype]
    if DEVICE == "cuda" and dtype is em.float32:
        assert relative_error(got, want) < 1e-5
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
    got = em.compile(g)(xs.to(DEVICE))[0].cpu()
    want = (xs.exp().to(torch.bfloat16).float() ** 2)
    assert got.dtype == torch.float32
    assert relative_error(got, want) < TOLERANCE[em.bfloat16]
    torch.testing.assert_close(evaluate(g, [xs], None)[0], want, rtol=1e-2, atol=1e-2)


# --- the front end -------------------------------------------------------------------------------

class RMSNorm(torch.nn.Module):
    """``transformers``' ``LlamaRMSNorm`` as written there (Qwen3's and Mistral's are the same):
    the statistics and the scaling in float32, cast back before the weight."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class NormProjection(torch.nn.Module):
    """The norm, then the projection it feeds (a ``Linear`` without bias), randomly set."""

    def __init__(self, hidden: int = 64, out: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden)
        self.proj = torch.nn.Linear(hidden, out, bias=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(hidden, generator=gen) + 0.5)
            self.proj.weight.copy_(torch.randn(out, hidden, generator=gen) / 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def _norm_projection(dtype: torch.dtype, rows: int = 2) -> tuple[NormProjection, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return NormProjection().to(dtype), torch.randn(rows, 64, generator=gen).to(dtype)


NORM_PROJECTION_OPS = ["cast", "square", "mean", "add_scalar", "rsqrt", "mul", "cast", "mul",
                       "matmul"]
HALF = [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", HALF)
def test_hf_rms_norm_and_its_projection_trace_to_one_graph_and_one_piece(
        dtype: torch.dtype) -> None:
    m, x = _norm_projection(dtype)
    g = em.from_torch(m, x)
    assert [t.op for t in g.operators] == NORM_PROJECTION_OPS
    graph_dtype = em.DType(str(dtype).removeprefix("torch."))
    assert [t.dtype for t in g.inputs] == [graph_dtype] * 3  # x, the weight, the projection
    assert g.operators[0].dtype is em.float32 and g.outputs[0].dtype is graph_dtype
    parts = partition(m, (x,))
    assert len(parts.pieces) == 1 and not parts.left_out, parts.left_out
    assert parts.pieces[0].matmuls == 1 and parts.pieces[0].reductions == 1


def _cast_free(x: torch.Tensor, w: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """The same norm and projection in the storage dtype, no cast."""
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return (w * h) @ proj.t()


def test_the_search_absorbs_the_casts() -> None:
    """The program with casts finds the μGraph that the program without finds (one kernel, its
    inputs and output in fp16, no cast in it): the casts are the identity to the oracle, and a
    kernel computes in fp32 whatever the storage dtype."""
    m, x = _norm_projection(torch.float16)
    with_casts = em.from_torch(m, x)
    without = em.from_torch(_cast_free, x, m.norm.weight.detach(), m.proj.weight.detach())
    assert "cast" not in [t.op for t in without.operators]
    found = [em.superoptimize(g, em.SearchConfig(max_results=1), max_tasks=TASKS, workers=1,
                              progress=False) for g in (with_casts, without)]
    assert all(found), [r.stats.no_result_reasons for r in found]
    best = found[0].best
    assert dumps(best.graph) == dumps(found[1].best.graph) and best.num_kernels == 1
    assert found[0].best.found_at_task == found[1].best.found_at_task
    # the same moves: no cast is proposed (no strategy chooses a dtype: blocks._params,
    # tasks._library_moves), so the walks are the same
    a, b = (r.stats for r in found)
    assert (a.states, a.pruned_by_oracle, a.tasks_total) == (b.states, b.pruned_by_oracle,
                                                            b.tasks_total)
    moves = context(prepare(with_casts, em.SearchConfig())).library_moves
    assert "cast" not in [s.op for _, steps in moves for s in steps]
    kernel_ops = [t.op for t in best.graph.operators]
    block_ops = [b.op for t in best.graph.operators if t.op == "customized"
                 for b in t.params["kernel"].tb.tensors]
    assert "cast" not in kernel_ops + block_ops
    assert [t.dtype for t in best.graph.inputs] == [em.float16] * 3
    assert best.graph.outputs[0].dtype is em.float16


def test_a_found_output_keeps_the_program_s_dtype() -> None:
    """A program of fp16 inputs whose result is fp32 (``exp((x @ w).float())``): the kernel
    writes fp16, as its inputs, and the μGraph casts its output to fp32 (``plan.build``)."""
    g = em.new_kernel_graph()
    x, w = g.new_input((4, 64), em.float16), g.new_input((64, 32), em.float16)
    g.mark_output(g.exp(g.cast(g.matmul(x, w), em.float32)))
    found = em.superoptimize(g, em.SearchConfig(max_results=1), max_tasks=60, workers=1,
                             progress=False)
    assert found, found.stats.no_result_reasons
    best = found.best.graph
    assert best.outputs[0].dtype is em.float32 and best.outputs[0].op == "cast"
    gen = torch.Generator().manual_seed(4)
    xs = [torch.randn(4, 64, generator=gen).half(), (torch.randn(64, 32, generator=gen) / 8).half()]
    got = em.compile(best)(*xs)[0]
    assert got.dtype == torch.float32
    assert relative_error(got, torch.exp(xs[0].float() @ xs[1].float())) < TOLERANCE[em.float32]


def test_a_program_of_inputs_of_two_dtypes_is_refused_by_the_search() -> None:
    """A kernel reads one storage dtype and the search proposes no cast: the search says so
    before any work (the backend keeps such a piece, with this reason)."""
    g = em.new_kernel_graph()
    x, w = g.new_input((4, 64), em.float32), g.new_input((64, 32), em.float16)
    g.mark_output(g.matmul(g.cast(x, em.float16), w))
    with pytest.raises(em.SearchError, match="inputs have dtypes float16, float32"):
        em.superoptimize(g, max_tasks=1, workers=1, progress=False)


@pytest.mark.parametrize("dtype", HALF)
def test_torch_compile_replaces_the_norm_and_projection(dtype: torch.dtype,
                                                        tmp_path: Path) -> None:
    """One piece, replaced by one kernel, matching eager within the output dtype's tolerance
    (``TOLERANCE``: 5e-3 for fp16, 4e-2 for bf16)."""
    torch._dynamo.reset()
    m, x = _norm_projection(dtype)
    fast = torch.compile(m, backend="egraph_mirage", dynamic=False,
                         options={"max_tasks": TASKS, "workers": 1, "rest": "eager",
                                  "budget": None,  # bounded by tasks, not seconds
                                  "config": em.SearchConfig(max_results=1),
                                  "cache_dir": str(tmp_path)})
    with torch.no_grad():
        got, want = fast(x), m(x)
    (report,) = reports_of(fast)
    assert not report.left_out, report.left_out
    (piece,) = report.pieces
    assert piece.operators == tuple(NORM_PROJECTION_OPS), em.torch_report(fast)
    assert piece.status == REPLACED and piece.num_kernels == 1, em.torch_report(fast)
    graph_dtype = em.DType(str(dtype).removeprefix("torch."))
    assert got.dtype == dtype
    assert relative_error(got, want) < TOLERANCE[graph_dtype]
    torch._dynamo.reset()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Eager attention as ``transformers`` writes it: the softmax in float32, cast back."""
    scores = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    probs = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return probs @ v


def _softmax_float(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(x.float(), -1).to(x.dtype)`` before a matmul."""
    return torch.softmax(x.float(), -1).to(x.dtype) @ w


@pytest.mark.parametrize("dtype", HALF)
def test_softmax_in_float32_traces(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    x, w = (torch.randn(4, 16, generator=gen).to(dtype), torch.randn(16, 8, generator=gen)
            .to(dtype))
    g = em.from_torch(_softmax_float, x, w)
    assert [t.op for t in g.operators] == ["cast", "amax", "sub", "exp", "reduction", "div",
                                           "cast", "matmul"]
    q, k, v = (torch.randn(1, 2, 4, 16, generator=gen).to(dtype) for _ in range(3))
    g = em.from_torch(_attention, q, k, v)
    ops = [t.op for t in g.operators]
    assert ops.count("cast") == 2 and ops.count("matmul") == 2
    traced = trace(_attention, q, k, v)
    got = traced.reference(q, k, v)[0]
    assert relative_error(got, _attention(q, k, v)) < TOLERANCE[em.DType(str(dtype)[6:])]
    parts = partition(_attention, (q, k, v))
    assert len(parts.pieces) == 1 and not parts.left_out, parts.left_out


def test_torch_s_type_promotion_is_a_cast() -> None:
    """A float16 tensor times a float32 one is float32 in torch: the float16 operand is cast."""
    gen = torch.Generator().manual_seed(3)
    x, s = torch.randn(4, 16, generator=gen).half(), torch.rand(16, generator=gen)
    g = em.from_torch(lambda a, b: (a * b).exp(), x, s)
    assert [t.op for t in g.operators] == ["cast", "mul", "exp"]
    assert g.outputs[0].dtype is em.float32
