"""Graph inputs that are views of a piece's inputs, as a replaced piece's runner
(``fx.runtime.make_runner``) hands them to the kernels: on the CPU, kernels in Triton's
interpreter.

A view whose elements do not overlap (a permutation, a slice, a narrow, a select) is read in
place through its own strides (``LowerOptions.input_strides``), with no copy per call; a view
whose elements overlap (an expanded source) is copied to a row-major tensor, as before.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

import egraph_mirage as em
from egraph_mirage.fx import runtime

#: a copy made on the host, by name in torch's profiler
COPIES = ("aten::contiguous", "aten::copy_", "aten::clone", "aten::empty_strided")
#: the name of the profiler range around the kernels' launch (inside it: Triton's interpreter)
KERNELS = "kernels"

B, H, D, HID = 8, 8, 128, 512


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def projection_and_rope(x: torch.Tensor, w: torch.Tensor, cos: torch.Tensor,
                        sin: torch.Tensor) -> torch.Tensor:
    """transformers' query projection and RoPE at decode (one token, ``B`` sequences)."""
    q = torch.nn.functional.linear(x, w).view(B, 1, H, D).transpose(1, 2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin


def one_kernel(graph: em.KernelGraph, grid: tuple[int, int, int]) -> em.KernelGraph:
    """The best one-kernel μGraph the search finds for ``graph`` on ``grid`` (a few seconds)."""
    config = em.SearchConfig(max_results=1, max_kernels=1, max_kernel_ops=0,
                             griddims=(grid,), franges=(1,))
    best = em.superoptimize(graph, config, max_tasks=40, workers=1, progress=False).best
    assert best is not None
    assert [t.op for t in best.graph.operators] == ["customized"]
    return best.graph


def runner_and_program(monkeypatch: Any, traced: Any, kernels: em.KernelGraph,
                       example_inputs: tuple[Any, ...]) -> tuple[Any, Any, list[Any]]:
    """The piece's runner, the compiled μGraph it launches, and the list that each later
    launch appends its inputs to (the launch inside a profiler range named ``KERNELS``)."""
    import egraph_mirage.api as api

    compiled: list[Any] = []
    real_compile = api.compile
    monkeypatch.setattr(api, "compile", lambda g, **o: compiled.append(real_compile(g, **o))
                        or compiled[-1])
    runner = runtime.make_runner(traced, kernels, {}, example_inputs)
    (fn,) = compiled
    runner(list(example_inputs))  # the first call: through the compiled μGraph's checks
    launched: list[Any] = []
    real_launch = fn.module.launch

    def launch(*ins: Any) -> Any:
        launched.append(ins)
        with torch.profiler.record_function(KERNELS):
            return real_launch(*ins)

    monkeypatch.setattr(fn.module, "launch", launch)
    return runner, fn, launched


def host_copies(runner: Any, xs: list[Any]) -> tuple[list[Any], list[str]]:
    """``runner(xs)`` and the copies it made on the host outside the kernels' launch (Triton's
    interpreter copies on its own inside it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = runner(xs)

    def in_kernels(e: Any) -> bool:
        while e is not None:
            if e.name == KERNELS:
                return True
            e = e.cpu_parent
        return False

    return out, [e.name for e in prof.events() if e.name in COPIES and not in_kernels(e)]


def test_ropes_rotate_half_halves_are_read_in_place_with_no_copy_per_call(
        monkeypatch: Any) -> None:
    """At decode, the RoPE piece that the partitioner cuts after the query projection takes
    ``q[..., :64]`` and ``q[..., 64:]`` as graph inputs: narrow views of the projection's
    output, its sequences and heads merged into one dim (``trace.with_batch_folded``), strides
    (128, 64, 1), with gaps between rows. The runner compiles the
    kernel for those strides and, after its first call, passes the views as they are (the
    data pointer carries the slice's offset): no ``aten::contiguous`` or other copy per call,
    and the output matches eager."""
    from egraph_mirage.fx.pieces import EPILOGUES, partition
    from egraph_mirage.fx.trace import trace_fx

    gen = torch.Generator().manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).half()

    xs = (t(B, 1, HID), t(H * D, HID) / 16, t(1, 1, D), t(1, 1, D))
    pieces = partition(projection_and_rope, xs, levels=EPILOGUES).pieces
    (piece,) = [p for p in pieces if "narrow" in str(trace_fx(p.module, p.example_inputs)
                                                     .inputs)]
    traced = trace_fx(piece.module, piece.example_inputs)
    halves = [i for i, v in enumerate(traced.inputs) if any(n == "narrow" for n, _ in v.steps)]
    assert len(halves) == 2
    runner, fn, launched = runner_and_program(monkeypatch, traced,
                                              one_kernel(traced.graph, (B * H, 1, 1)),
                                              piece.example_inputs)
    assert [fn.strides[i] for i in halves] == [(D, D // 2, 1)] * 2

    out, copies = host_copies(runner, list(piece.example_inputs))
    assert copies == []
    (ins,) = launched
    (q,) = [x for x in piece.example_inputs if x.shape == (B, 1, H * D)]
    starts = [args[1] for i in halves for n, args in traced.inputs[i].steps if n == "narrow"]
    assert sorted(starts) == [0, D // 2]  # x1 = q[..., :64], x2 = q[..., 64:]
    for i, start in zip(halves, starts, strict=True):
        assert ins[i].stride() == (D, D // 2, 1)
        assert ins[i].data_ptr() == q.data_ptr() + start * q.element_size()  # in place
    want = piece.module(*piece.example_inputs)[0]
    torch.testing.assert_close(out[0], want, rtol=1e-2, atol=1e-2)


def test_a_view_whose_elements_overlap_is_copied_as_before(monkeypatch: Any) -> None:
    """A source passed expanded (``cos`` broadcast over the rows: stride 0 on a dim of size 8)
    gives a graph input whose elements overlap: it is not read in place (no strides compiled
    for it) but copied to a row-major tensor at every call, as before, and the output matches
    eager. Its slice beside it, ``q[:, 64:]``, is read in place."""
    from egraph_mirage.fx.trace import trace

    def f(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return q[:, 64:] * c

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(8, 128, generator=gen).half()
    c = torch.randn(1, 64, generator=gen).half().expand(8, 64)  # strides (0, 1)
    traced = trace(f, q, c)
    views = traced.graph_inputs(q, c)
    overlapping = [i for i, v in enumerate(views) if 0 in v.stride()]
    sliced = [i for i, v in enumerate(views) if v.stride() == (128, 1)]
    assert len(overlapping) == len(sliced) == 1
    assert runtime._view_strides(traced, (q, c)) == tuple(
        (128, 1) if i in sliced else None for i in range(len(views)))
    runner, fn, launched = runner_and_program(monkeypatch, traced, one_kernel(traced.graph,
                                                                             (8, 1, 1)), (q, c))
    out, copies = host_copies(runner, [q, c])
    (ins,) = launched
    (i,) = overlapping
    (j,) = sliced
    assert fn.strides[i] is None and fn.strides[j] == (128, 1)
    assert ins[i].is_contiguous() and ins[i].data_ptr() != c.data_ptr()  # a copy
    assert "aten::contiguous" in copies
    assert ins[j].data_ptr() == q.data_ptr() + 64 * q.element_size()  # in place
    torch.testing.assert_close(out[0], f(q, c), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("start", [3, 8])
def test_a_slice_off_a_16_byte_boundary_is_read_in_place_and_right(
        monkeypatch: Any, start: int) -> None:
    """A slice starting at element 3 of fp16 rows of 131 (a data pointer 6 bytes past a
    16-byte boundary, rows 262 bytes apart) is read in place like any slice, and the output
    matches eager on the checked first call and on later ones (element 8: 16 bytes, aligned,
    alike). The generated launcher assumes nothing of the pointer there: its direct path is
    taken only where every pointer is 16-byte aligned, else Triton launches (and compiles for
    the pointer's alignment), as ``launch_path`` shows with the launched inputs."""
    from egraph_mirage.fx.trace import trace

    def f(q: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return q[:, start:start + 64] * c

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(8, 131, generator=gen).half()
    c = torch.randn(64, generator=gen).half()
    traced = trace(f, q, c)
    (i,) = [k for k, v in enumerate(traced.graph_inputs(q, c)) if v.stride() == (131, 1)]
    kernels = one_kernel(traced.graph, (8, 1, 1))
    first = runtime.make_runner(traced, kernels, {}, (q, c))([q, c])
    torch.testing.assert_close(first[0], f(q, c), rtol=1e-2, atol=1e-2)
    runner, fn, launched = runner_and_program(monkeypatch, traced, kernels, (q, c))
    assert fn.strides[i] == (131, 1)
    out, copies = host_copies(runner, [q, c])
    (ins,) = launched
    assert copies == [] and ins[i].data_ptr() == q.data_ptr() + start * 2
    assert (ins[i].data_ptr() % 16 == 0) == (start == 8)
    torch.testing.assert_close(out[0], f(q, c), rtol=1e-2, atol=1e-2)
    assert launch_path(monkeypatch, fn.module, list(ins)) == ("direct" if start == 8
                                                              else "triton")


def launch_path(monkeypatch: Any, module: Any, args: list[Any]) -> str:
    """How the generated program's ``_launch`` launches a kernel already compiled at an
    earlier launch, with pointers ``args``: "direct" (the compiled kernel, which Triton compiled
    assuming 16-byte aligned pointers) or "triton" (``kernel[grid](...)``, which specialises on
    the pointers it gets). Kernel, compiled kernel and stream are stand-ins: on the CPU the
    direct path is never taken for real."""
    calls: list[str] = []

    class Compiled:
        function = packed_metadata = None

        def run(self, *_: Any) -> None:
            calls.append("direct")

    class Kernel:
        def __getitem__(self, grid: Any) -> Any:
            def launch(*_: Any, **__: Any) -> Compiled:
                calls.append("triton")
                return Compiled()
            return launch

    kernel = Kernel()
    driver = SimpleNamespace(active=SimpleNamespace(get_current_stream=lambda device: 0))
    monkeypatch.setattr(module, "triton", SimpleNamespace(runtime=SimpleNamespace(driver=driver)))
    monkeypatch.setattr(module, "_unhooked", lambda: True)
    monkeypatch.setitem(module._COMPILED, (kernel, -1, 4, 2), Compiled())
    module._launch(kernel, (1,), args, 4, 2)
    return calls[0]


def test_the_rule_for_reading_a_view_in_place() -> None:
    """``_disjoint``: a view is read in place where no two of its elements share a memory
    location (size-1 dims ignored), gaps allowed: slices, steps, selects, permutations of
    those; a view whose elements overlap (an expand, two dims of one stride) is not. An
    interleaving that does not overlap but that no slice or permute makes (sizes (3, 2),
    strides (2, 3)) is refused too: the test is cheap and never accepts an overlap."""
    x = torch.empty(4, 6, 8)
    read = [x[..., :4], x[:, 2:, 1:5], x[:, 1], x[..., 3], x[::2, :, ::3],
            x[..., 2:6].permute(2, 0, 1), x.transpose(0, 2)[1:], x[:1, :, :5].expand(1, 6, 5)]
    assert all(runtime._disjoint(v) for v in read)
    refused = [x[:, :1].expand(4, 3, 8), torch.empty(8).as_strided((2, 2), (1, 1)),
               torch.empty(8).as_strided((4, 2), (1, 2)),
               torch.empty(8).as_strided((3, 2), (2, 3))]
    assert not any(runtime._disjoint(v) for v in refused)
