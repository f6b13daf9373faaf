"""Tracing PyTorch programs into kernel graphs (``egraph_mirage.fx``): every mapped operator
against eager PyTorch, views folded into graph inputs (grouped-query attention), and the errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import egraph_mirage as em  # noqa: E402
from egraph_mirage.errors import DTypeError, UnsupportedOpError  # noqa: E402
from egraph_mirage.fx import from_torch, trace, trace_fx  # noqa: E402
from egraph_mirage.fx.aten import RULES  # noqa: E402


def _rand(*shape: int, positive: bool = False) -> Any:
    g = torch.Generator().manual_seed(sum(shape) * 7 + len(shape))
    x = torch.randn(*shape, generator=g)
    return x.abs() + 0.5 if positive else x


def _matches(fn: Callable[..., Any], *xs: Any) -> Any:
    """Trace ``fn``, evaluate its kernel graph (float64 reference) and compare with eager."""
    traced = trace(fn, *xs)
    want = fn(*xs)
    want = want if isinstance(want, tuple) else (want,)
    got = traced.reference(*xs)
    assert len(got) == len(want)
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    return traced


X, W, B, P = _rand(2, 3, 8), _rand(8, 5), _rand(5), _rand(2, 3, 8, positive=True)

#: (name, function, inputs, aten operators it exercises)
CASES: list[tuple[str, Callable[..., Any], tuple[Any, ...], tuple[str, ...]]] = [
    ("matmul", lambda x, w: x @ w, (X, W), ("aten.matmul.default",)),
    ("mm", lambda a, w: torch.mm(a, w), (_rand(3, 8), W), ("aten.mm.default",)),
    ("bmm", lambda a, b: torch.bmm(a, b), (X, _rand(2, 8, 4)), ("aten.bmm.default",)),
    ("linear", lambda x, w, b: F.linear(x, w, b), (X, _rand(5, 8), B), ("aten.linear.default",)),
    ("linear_no_bias", lambda x, w: F.linear(x, w), (X, _rand(5, 8)), ("aten.linear.default",)),
    ("addmm", lambda b, a, w: torch.addmm(b, a, w), (B, _rand(3, 8), W), ("aten.addmm.default",)),
    ("add_sub_mul_div", lambda x, y: (x + y) * (x - y) / (y * y + 1), (X, _rand(3, 8)),
     ("aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor")),
    ("scalars", lambda x: (2 - x) * 3 / 4 + 1.5 - 0.25, (X,),
     ("aten.rsub.Scalar", "aten.mul.Tensor", "aten.div.Tensor", "aten.add.Tensor")),
    ("neg_exp", lambda x: torch.exp(-x), (X,), ("aten.neg.default", "aten.exp.default")),
    ("sqrt_rsqrt", lambda p: torch.sqrt(p) + torch.rsqrt(p), (P,),
     ("aten.sqrt.default", "aten.rsqrt.default")),
    ("pow", lambda p: p ** 2 + p ** 0.5 - p ** -0.5 + p ** 1, (P,), ("aten.pow.Tensor_Scalar",)),
    ("activations", lambda x: torch.sigmoid(x) + torch.tanh(x) + F.silu(x) + F.relu(x), (X,),
     ("aten.sigmoid.default", "aten.tanh.default", "aten.silu.default", "aten.relu.default")),
    ("gelu", lambda x: F.gelu(x) - F.gelu(x, approximate="tanh") * 2, (X,),
     ("aten.gelu.default",)),
    ("sum", lambda x: (x.sum(-1, keepdim=True), x.sum(1), x.sum()), (X,),
     ("aten.sum.dim_IntList", "aten.sum.default")),
    ("mean_amax", lambda x: (x.mean(-1, keepdim=True) + x.amax(-1, keepdim=True), x.mean((0, 2)),
                             x.amax(0)), (X,), ("aten.mean.dim", "aten.amax.default")),
    ("rms_norm", lambda x, g: F.rms_norm(x, (8,), g, eps=1e-5) + F.rms_norm(x, (3, 8)),
     (X, _rand(8)), ("aten.rms_norm.default",)),
    ("softmax", lambda x: torch.softmax(x, -1) + torch.softmax(x, 1), (X,),
     ("aten.softmax.int",)),
    ("cat_slice", lambda x, y: torch.cat([x.exp(), y, x], -1)[..., 3:20], (X, _rand(2, 3, 4)),
     ("aten.cat.default", "aten.slice.Tensor")),
    ("input_views", lambda x, w: x.transpose(1, 2)[:, 2:6].permute(0, 2, 1)
     @ w.t()[:4, 1:4].unsqueeze(0).expand(2, 4, 3), (X, W),
     ("aten.transpose.int", "aten.permute.default", "aten.t.default", "aten.expand.default")),
    ("select", lambda x: x[1] * x[:, :, 2:3], (X,), ("aten.select.int",)),
    ("relabel", lambda x, w: (x.exp().reshape(6, 8) @ w).view(2, 3, 5).sum(1), (X, W),
     ("aten.view.default",)),
    ("broadcast", lambda x, m: x * m + m.exp(), (X, _rand(3, 1)), ("aten.mul.Tensor",)),
]


@pytest.mark.parametrize("name,fn,xs,ops", CASES, ids=[c[0] for c in CASES])
def test_every_mapped_operator_matches_eager(name: str, fn: Any, xs: Any, ops: Any) -> None:
    traced = _matches(fn, *xs)
    assert traced.graph.operators, name
    assert all(op in RULES for op in ops)


def test_the_cases_cover_every_operator_of_the_brief() -> None:
    covered = {op for *_, ops in CASES for op in ops}
    assert {"aten.mm.default", "aten.bmm.default", "aten.matmul.default", "aten.add.Tensor",
            "aten.gelu.default", "aten.rms_norm.default", "aten.softmax.int",
            "aten.cat.default", "aten.slice.Tensor", "aten.amax.default"} <= covered


def test_parameters_are_graph_inputs_read_as_attributes() -> None:
    lin = torch.nn.Linear(8, 5)
    traced = _matches(lin, X)
    kinds = {v.source: v.kind for v in traced.inputs}
    assert kinds == {"x" if "x" in kinds else traced.placeholders[0]: "placeholder",
                     "weight": "attribute", "bias": "attribute"}
    weight = next(v for v in traced.inputs if v.source == "weight")
    assert weight.steps[0] == ("permute", ((1, 0),)) and weight.dims == (8, 5)
    assert set(traced.attributes) == {"weight", "bias"}
    assert [op.op for op in traced.graph.operators] == ["matmul", "add"]


def test_a_linear_on_batch_and_tokens_is_one_matrix_product_of_all_rows() -> None:
    """``Linear`` on (batch, tokens, features), as transformers' layers call it: the leading
    dims fold into the rows of one product (a view of the input), so the weight is one
    (k, n) operand, not broadcast over the batch; a residual view of the input follows."""
    lin = torch.nn.Linear(8, 5, bias=False)
    x = torch.randn(4, 3, 8)
    traced = _matches(lambda v: lin(v) + v[..., :5], x)
    assert [v.dims for v in traced.inputs if v.kind == "attribute"] == [(8, 5)]  # the weight
    assert sorted(v.dims for v in traced.inputs if v.kind == "placeholder") == [(12, 5),
                                                                                (12, 8)]
    assert [op.op for op in traced.graph.operators] == ["matmul", "add"]


def test_from_torch_returns_the_kernel_graph_with_the_inputs_dtypes() -> None:
    g = from_torch(lambda x, w: torch.exp(x @ w), X.half(), W.half())
    assert isinstance(g, em.KernelGraph)
    assert [t.dtype for t in g.inputs] == [em.float16, em.float16]
    g = from_torch(lambda x: F.silu(x), X.bfloat16())
    assert g.inputs[0].dtype is em.bfloat16


def test_casts_between_float_types_are_the_cast_operator_and_outputs_keep_torch_s_dtype() -> None:
    def f(x: Any) -> Any:
        return torch.softmax(x.float(), -1).to(x.dtype) * 2

    traced = trace(f, X.half())
    ops = [t.op for t in traced.graph.operators]
    assert ops == ["cast", "amax", "sub", "exp", "reduction", "div", "cast", "mul_scalar"]
    assert [t.dtype for t in traced.graph.tensors] == [em.float16, *[em.float32] * 6,
                                                      em.float16, em.float16]
    assert traced.outputs[0].dtype == "float16"
    torch.testing.assert_close(traced.reference(X.half()), (f(X.half()),), rtol=2e-3, atol=2e-3)


def test_an_input_of_another_dtype_raises_a_typed_error() -> None:
    with pytest.raises(DTypeError, match="float64"):
        trace(lambda x: x.exp(), X.double())


def _gqa(q: Any, k: Any, v: Any) -> Any:
    """Grouped-query attention as HF writes it (repeat_interleave of the K/V heads)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return torch.softmax(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5, -1) @ v


def _gqa_expand(q: Any, k: Any, v: Any) -> Any:
    """The same through expand + reshape (``repeat_kv``)."""
    b, kv, s, d = k.shape
    rep = q.shape[1] // kv
    k = k[:, :, None].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)
    v = v[:, :, None].expand(b, kv, rep, s, d).reshape(b, kv * rep, s, d)
    return torch.softmax(q @ k.transpose(-2, -1) * d ** -0.5, -1) @ v


@pytest.mark.parametrize("fn", [_gqa, _gqa_expand])
def test_grouped_query_attention_folds_the_kv_views_into_the_inputs(fn: Any) -> None:
    q, k, v = _rand(2, 8, 5, 4), _rand(2, 2, 5, 4), _rand(2, 2, 5, 4)
    traced = _matches(fn, q, k, v)
    g = traced.graph
    assert len(g.inputs) == 3 and [t.op for t in g.operators].count("matmul") == 2
    # Q's heads split as (kv groups, repeats); K and V keep a size-1 repeat dim (broadcast);
    # the batch and the kv groups merge into one batch dim (``trace.with_batch_folded``)
    assert [t.dims for t in g.inputs] == [(4, 4, 5, 4), (4, 1, 4, 5), (4, 1, 5, 4)]
    for view, source in zip(traced.inputs, (q, k, v)):
        assert {name for name, _ in view.steps} <= {"reshape", "permute"}
        made = view.apply(source)  # views only: the same memory
        assert made.untyped_storage().data_ptr() == source.untyped_storage().data_ptr()
    assert traced.outputs[0].shape == (2, 8, 5, 4)


def test_a_repeat_of_kv_heads_with_a_computed_query_splits_its_heads() -> None:
    def f(q: Any, k: Any) -> Any:  # Q computed: laid out again with heads as (groups, repeats)
        return (q * 2) @ k.repeat_interleave(4, dim=1).transpose(-2, -1)

    traced = _matches(f, _rand(2, 8, 5, 4), _rand(2, 2, 5, 4))
    # K not repeated (its batch and groups merged: ``trace.with_batch_folded``)
    assert (4, 1, 4, 5) in [t.dims for t in traced.graph.inputs]


def test_a_projection_split_into_heads_times_a_computed_per_head_factor() -> None:
    """RoPE's ``q * cos`` in the first layer of a decode step: Q is a projection's output split
    into heads (laid out as the projection's columns, heads merged), and the factor shared by
    every head is computed in the same piece (a cast of the float32 table), so it cannot be an
    input laid out at will. Broadcast over heads, it fits only a layout with the heads apart:
    the projection is laid out again in that one (``Relayout``), rather than the trace refused
    ("an earlier reshape laid out unlike the other operand")."""
    def f(x: Any, w: Any, cos: Any) -> Any:
        q = (x @ w).view(1, 1, 4, 8).transpose(1, 2)  # (1, 4, 1, 8): heads of the projection
        return q * (cos.to(torch.float16) * 2).unsqueeze(1)  # (1, 1, 1, 8) over every head

    xs = (_rand(1, 1, 16).half(), (_rand(16, 32) / 4).half(), _rand(1, 1, 8))
    traced = trace(f, *xs)
    torch.testing.assert_close(traced.reference(*xs)[0], f(*xs), rtol=2e-3, atol=2e-3)
    assert traced.graph.inputs[2].dims[-1] == 8  # the factor read once, not per head


def _sorted_exp(x: Any) -> Any:
    y = x.exp()
    return torch.sort(y, -1).values * 2


def _running_sum(x: Any) -> Any:
    return torch.cumsum(x, dim=-1) + 1


@pytest.mark.parametrize("fn,op", [(_sorted_exp, "aten.sort.default"),
                                   (_running_sum, "aten.cumsum.default")])
def test_an_unsupported_operator_names_the_op_and_the_user_s_line(fn: Any, op: str) -> None:
    lines = {_sorted_exp: _sorted_exp.__code__.co_firstlineno + 2,
             _running_sum: _running_sum.__code__.co_firstlineno + 1}
    with pytest.raises(UnsupportedOpError) as info:
        trace(fn, X)
    message = str(info.value)
    assert op in message and f"test_trace.py:{lines[fn]}" in message and "\n" not in message
    assert info.value.op == op and info.value.where is not None


def test_a_permute_of_an_intermediate_is_refused_with_the_reason() -> None:
    with pytest.raises(UnsupportedOpError, match="permute of an intermediate is a copy"):
        trace(lambda x: x.exp().transpose(1, 2) @ x, X)


def test_an_export_failure_is_one_typed_line() -> None:
    def data_dependent(x: Any) -> Any:
        return x * 2 if x.sum() > 0 else x

    with pytest.raises(UnsupportedOpError, match=r"torch\.export could not trace") as info:
        trace(data_dependent, X)
    assert "\n" not in str(info.value)


def test_trace_fx_takes_a_torch_level_graph_and_keeps_placeholder_positions() -> None:
    class M(torch.nn.Module):
        def forward(self, x: Any, w: Any) -> Any:
            return torch.relu(torch.matmul(x, w.t())) * 3

    gm = torch.fx.symbolic_trace(M())
    w = _rand(6, 8)
    traced = trace_fx(gm, [X, w])
    assert traced.placeholders == ("x", "w")
    assert [(v.source, v.position) for v in traced.inputs] == [("x", 0), ("w", 1)]
    torch.testing.assert_close(traced.reference(X, w), (gm(X, w),), rtol=1e-4, atol=1e-5)
    (out,) = traced.fx_outputs([torch.ones(traced.graph.outputs[0].dims)])
    assert out.shape == (2, 3, 6)


def test_the_front_end_is_exported_lazily_and_needs_no_torch_to_import() -> None:
    """``em.from_torch``, ``em.torch_report`` and ``em.UnsupportedOpError`` are the package's
    public names; ``import egraph_mirage`` (and reading those names) imports no torch."""
    import subprocess
    import sys
    import textwrap

    from egraph_mirage.fx.report import torch_report

    assert em.from_torch is from_torch and em.torch_report is torch_report
    assert em.UnsupportedOpError is UnsupportedOpError
    assert {"from_torch", "torch_report", "UnsupportedOpError"} <= set(em.__all__) & set(dir(em))
    with pytest.raises(AttributeError, match="no attribute 'from_torhc'"):
        em.from_torhc
    script = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None  # any import of torch fails
        import egraph_mirage as em
        from egraph_mirage import *  # noqa: F403
        assert callable(em.from_torch) and issubclass(em.UnsupportedOpError, em.EMError)
        print(em.torch_report())
        try:
            em.from_torch(lambda x: x, 1.0)
        except ImportError:
            print("needs torch")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == [
        "egraph-mirage: no graph compiled by the egraph_mirage backend", "needs torch"]


def test_leading_dims_of_one_shared_by_every_tensor_are_dropped() -> None:
    """A decode step's projection of one token of one sequence, as transformers' layers call
    it ((1, 1, 64) through a ``Linear`` and an RMSNorm): the graph is the rank-2 program
    (1, 64) @ (64, 32), not a batched product over a batch of one; its outputs keep their
    torch shape. A reduction names its dim in the graph's rank."""
    norm = torch.nn.RMSNorm(64, eps=1e-5)
    lin = torch.nn.Linear(64, 32, bias=False)

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(lin(norm(x)))

    x = torch.randn(1, 1, 64)
    traced = _matches(f, x)
    assert all(len(t.dims) == 2 for t in traced.graph.tensors)
    assert [t.dims for t in traced.graph.inputs if t.dims[0] == 64] == [(64, 32)]
    assert traced.outputs[0].shape == (1, 1, 32)

    def g(x: torch.Tensor) -> torch.Tensor:
        return x.sum(1, keepdim=True) * 2  # dim 1 of the torch shape: dim 0 of the graph's

    assert _matches(g, torch.randn(1, 4, 8)).graph.inputs[0].dims == (4, 8)
