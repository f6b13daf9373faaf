"""Outputs also written in place (``lower.writes``, ``LowerOptions.writes``): the kernel that
stores an output stores the same tile into a destination the call passes, along one dimension
at the positions an index tensor on the device gives, as ``dest.index_copy_(dim, index,
value)`` would: a static KV cache's new token written by the projection that computes it, with
no launch of its own. The program's outputs are what they were."""

from __future__ import annotations

import pytest
import torch
from test_lower_horizontal import _projection

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as hw
from egraph_mirage.errors import DTypeError, LowerError, ShapeError
from egraph_mirage.lower import generate_source
from egraph_mirage.lower.triton_program import LowerOptions
from egraph_mirage.lower.writes import OutputWrite

HEADS, HEAD_DIM, CACHE = 2, 16, 8
#: where the programs run: the GPU where there is one, else Triton's interpreter on the CPU
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _kv(rows: int = 1) -> em.KernelGraph:
    """A decode step's key and value projections: x (rows, 32) against two (32, 32) weights."""
    g = em.new_kernel_graph()
    x = g.new_input((rows, 32), em.float16)
    wk, wv = g.new_input((32, 32), em.float16), g.new_input((32, 32), em.float16)
    g.mark_output(_projection(g, x, wk, 8))
    g.mark_output(_projection(g, x, wv, 16))
    return g


def _inputs(rows: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(rows, 32, generator=gen) / 4).half().to(DEVICE),
            *((torch.randn(32, 32, generator=gen) / 4).half().to(DEVICE) for _ in range(2))]


def _write(output: int, cache: torch.Tensor, rows: int = 1) -> OutputWrite:
    """The output, seen as (1, heads, rows, head_dim) (a new token's K or V per head), into a
    cache of (1, heads, CACHE, head_dim) along dim 2."""
    return OutputWrite(output, (1, HEADS, rows, HEAD_DIM), tuple(cache.stride()), 2,
                       cache.numel())


@pytest.mark.parametrize("horizontal", [False, True], ids=["launch each", "one grid"])
def test_each_output_is_written_into_its_cache_at_the_device_position(horizontal: bool) -> None:
    """Key and value go into their caches at position 5 (read from a tensor), every other
    position untouched; the outputs are returned as before."""
    g = _kv()
    ks, vs = (torch.randn(1, HEADS, CACHE, HEAD_DIM).half().to(DEVICE) for _ in range(2))
    position = torch.tensor([5], device=DEVICE)
    fn = em.compile(g, horizontal=horizontal, writes=(_write(0, ks), _write(1, vs)))
    assert fn.source.count("_launch(kernel_") == (1 if horizontal else 2)
    want = em.compile(g)(*_inputs())
    k_want, v_want = ks.clone(), vs.clone()
    k_want.index_copy_(2, position, want[0].reshape(1, HEADS, 1, HEAD_DIM))
    v_want.index_copy_(2, position, want[1].reshape(1, HEADS, 1, HEAD_DIM))
    got = fn(*_inputs(), ks, position, vs, position)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(ks, k_want, rtol=0, atol=0)
    torch.testing.assert_close(vs, v_want, rtol=0, atol=0)


def test_several_positions_through_a_strided_cache() -> None:
    """Three rows (a prefill of three tokens) into positions 1, 6, 3 of a cache laid out
    (1, CACHE, heads, head_dim) and viewed as (1, heads, CACHE, head_dim): each element goes
    where ``index_copy_`` puts it, whatever the strides."""
    g = _kv(rows=3)
    store = torch.zeros(1, CACHE, HEADS, HEAD_DIM, device=DEVICE).half()
    ks = store.transpose(1, 2)  # (1, heads, CACHE, head_dim), not contiguous
    position = torch.tensor([1, 6, 3], device=DEVICE)
    # the projection's (3, 32) output as a value of (1, heads, 3, head_dim) has the rows of
    # one head apart: here the value is laid out (1, 3, heads, head_dim) -> as dims of
    # the write, (1, 3, HEADS, HEAD_DIM) with the cache's strides in that order
    w = OutputWrite(0, (1, 3, HEADS, HEAD_DIM), tuple(store.stride()), 1, store.numel())
    fn = em.compile(g, writes=(w,))
    (k, _) = fn(*_inputs(3), store, position)
    want = torch.zeros_like(store)
    want.index_copy_(1, position, k.reshape(1, 3, HEADS, HEAD_DIM))
    torch.testing.assert_close(store, want, rtol=0, atol=0)
    assert ks.data_ptr() == store.data_ptr()


@pytest.mark.parametrize("fused", [True, False], ids=["combine fused", "combine launched"])
def test_a_split_k_output_is_written_by_its_combine(fused: bool) -> None:
    """A split-K form: the output is stored by its combine, fused into the kernel of the
    partial sums (the last block of a group runs it, passed the destination) or launched on
    its own; either way the destination gets the output at the index."""
    g = em.new_kernel_graph()
    x, w = g.new_input((3, 256)), g.new_input((256, 48))
    g.mark_output(g.matmul(g.rms_norm(x, (256,)), w))
    h = hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=16, loop=32, splits=4))
    (out,) = h.outputs
    rows = out.dims[0]
    cache = torch.zeros((CACHE, *out.dims[1:]), device=DEVICE).half()
    write = OutputWrite(0, out.dims, tuple(cache.stride()), 0, cache.numel())
    fn = em.compile(h, fuse_combines=fused, writes=(write,))
    assert fn.source.count("_launch(kernel_") == (1 if fused else 2)
    gen = torch.Generator().manual_seed(0)
    xs = [(torch.randn(t.dims, generator=gen) / 4).half().to(DEVICE) for t in h.inputs]
    position = torch.arange(rows, device=DEVICE) + 1
    (y,) = fn(*xs, cache, position)
    torch.testing.assert_close(cache[1:1 + rows], y, rtol=0, atol=0)
    assert not cache[0].any() and not cache[1 + rows:].any()


def test_bad_writes_and_bad_calls_are_typed_errors() -> None:
    g = _kv()
    cache = torch.zeros(1, HEADS, CACHE, HEAD_DIM, device=DEVICE).half()
    with pytest.raises(LowerError, match="not a distinct output"):
        generate_source(g, LowerOptions(writes=(_write(2, cache),)))
    with pytest.raises(LowerError, match="is not a value of dims"):
        generate_source(g, LowerOptions(writes=(OutputWrite(0, (1, 3, 16), (0, 16, 1), 1,
                                                            cache.numel()),)))
    with pytest.raises(LowerError, match="index dim"):
        OutputWrite(0, (1, 2), (2, 1), 2, 4)
    with pytest.raises(LowerError, match="64-bit"):
        OutputWrite(0, (1, 2), (2, 1), 1, 2 ** 31)
    fn = em.compile(g, writes=(_write(0, cache),))
    with pytest.raises(ShapeError, match="destination and index"):
        fn(*_inputs())
    with pytest.raises(DTypeError, match="index"):
        fn(*_inputs(), cache, torch.tensor([1.0], device=DEVICE))


def test_a_write_of_an_output_no_kernel_computes_is_refused() -> None:
    """A graph that returns an input as is: no kernel stores that output, so none can write it
    (the backend then writes it with torch)."""
    g = em.new_kernel_graph()
    x = g.new_input((1, 32), em.float16)
    w = g.new_input((32, 32), em.float16)
    g.mark_output(_projection(g, x, w, 8))
    g.mark_output(x)
    cache = torch.zeros(CACHE, 32, device=DEVICE).half()
    write = OutputWrite(1, (1, 32), tuple(cache.stride()), 0, cache.numel())
    with pytest.raises(LowerError, match="no kernel computes"):
        generate_source(g, LowerOptions(writes=(write,)))
