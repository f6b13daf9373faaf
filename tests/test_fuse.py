"""Fused combines (``egraph_mirage.lower.fuse``): a kernel that sums another kernel's partials
runs inside it, in the last block of each group, where that is exact; otherwise the two kernels
are launched as they are. Numerics run in Triton's interpreter (no GPU) or on the GPU."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as hw
from egraph_mirage.lower import fuse, generate_source
from egraph_mirage.lower.triton_program import LowerOptions

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _combines(h: em.KernelGraph) -> list[fuse.Combine]:
    return list({id(c): c for c in fuse.plan(h).values()}.values())


def _launches(source: str) -> int:
    return len(re.findall(r"^    _launch\(", source, re.M))


def _max_rel_error(h: em.KernelGraph, g: em.KernelGraph, seed: int = 0, **options: object
                   ) -> float:
    rng = np.random.default_rng(seed)
    xs = [torch.tensor(0.1 * rng.standard_normal(t.dims), dtype=torch.float16, device=DEVICE)
          for t in g.inputs]
    (ref,) = g.evaluate([x.double().cpu().numpy() for x in xs])
    fn = em.compile(h, **options)
    for _ in range(2):  # the second call finds the counters the first left at zero
        (out,) = fn(*xs)
    return float(np.abs(out.double().cpu().numpy() - ref).max() / np.abs(ref).max())


def _split_k_program(rows: int = 3, hidden: int = 256, cols: int = 48) -> em.KernelGraph:
    g = em.new_kernel_graph()
    X, W = g.new_input((rows, hidden)), g.new_input((hidden, cols))
    g.mark_output(g.matmul(g.rms_norm(X, (hidden,)), W))
    return g


@pytest.mark.parametrize("name", ["rmsnorm_linear", "gated_mlp"])
def test_split_k_combine_is_fused_at_paper_shapes(name: str) -> None:
    g = em.benchmarks.get(name)
    h = hw.BUILDERS[name][1](g)
    (c,) = _combines(h)
    assert c.producer.tb.grid_dim == (96 if name == "rmsnorm_linear" else 64, 8, 1)
    assert c.kept == (0,) and c.group == 8 and c.groups == c.producer.tb.grid_dim[0]
    assert c.private == frozenset(range(len(c.producer.tb.outputs)))  # partials stay in fp32
    source = generate_source(h)
    assert _launches(source) == 1 and "if ticket == 7:" in source
    assert _launches(generate_source(h, LowerOptions(fuse_combines=False))) == 2


@pytest.mark.parametrize("name", ["gqa", "mha", "mqa", "qknorm"])
def test_split_kv_combine_is_fused_at_paper_shapes(name: str) -> None:
    g = em.benchmarks.get(name)
    (c,) = _combines(hw.fused(name, g))
    heads, splits, qtiles = c.producer.tb.grid_dim
    # the heads and query tiles the grid has more than one of (mqa has one head at b = 1; mha's
    # 16 query rows are one tile)
    assert c.kept == tuple(ax for ax in (0, 2) if c.producer.tb.grid_dim[ax] > 1)
    assert c.group == splits > 1 and c.groups == heads * qtiles


def test_one_kernel_forms_have_nothing_to_fuse() -> None:
    for name in ["rmsnorm_linear", "gated_mlp", "lora", "ntrans"]:
        g = em.benchmarks.get(name)
        assert fuse.plan(hw.fused(name, g)) == {}


def test_a_consumer_with_other_tiles_along_a_kept_axis_is_not_fused() -> None:
    """Kernel 2 reads query tiles of 16 rows where kernel 1 wrote tiles of 64: one block of
    kernel 2 would need partials of another group."""
    g = em.benchmarks.get("gqa")
    h = em.new_kernel_graph()
    Q, K, V = (h.new_input(t.dims, t.dtype) for t in g.inputs)
    tb = em.new_threadblock_graph(grid_dim=(2, 4, 4), forloop_range=16)
    q = tb.new_input(Q, (0, -1, 1), forloop_dim=-1)
    k = tb.new_input(K, (0, 2, -1), forloop_dim=2)
    v = tb.new_input(V, (0, 1, -1), forloop_dim=1)
    e = tb.exp(tb.matmul(q, k))
    tb.new_output(tb.forloop_accum(tb.matmul(e, v)), (0, 2, 1))
    tb.new_output(tb.forloop_accum(e, "sum"), (0, 2, 1))
    num, den = h.customized([Q, K, V], tb)
    tb2 = em.new_threadblock_graph(grid_dim=(2, 1, 16), forloop_range=4)
    n = tb2.new_input(num, (0, -1, 1), forloop_dim=2)
    s = tb2.new_input(den, (0, -1, 1), forloop_dim=2)
    tb2.new_output(tb2.div(tb2.forloop_accum(n), tb2.forloop_accum(s)), (0, -1, 1))
    (O,) = h.customized([num, den], tb2)
    h.mark_output(O)
    assert em.verify(g, h).equivalent
    assert fuse.plan(h) == {}
    assert _launches(generate_source(h)) == 2


def test_a_consumer_reading_a_tensor_computed_after_the_producer_is_not_fused() -> None:
    g = _split_k_program()
    h0 = hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=16, loop=32, splits=4))
    h = em.new_kernel_graph()
    X, W = (h.new_input(t.dims, t.dtype) for t in g.inputs)
    (P, S), splits = hw._split_k_products(h, X, [W], None, hw.Tiles(grid=16, loop=32, splits=4),
                                          squares=True)
    S2 = h.mul_scalar(S, 1.0)  # a library operator between the two kernels
    tb = hw._split_k_combine(splits, 48, hw.Tiles(grid=16))
    xw = tb.forloop_accum(tb.new_input(P, (1, -1, -1), forloop_dim=0))
    sq = tb.forloop_accum(tb.new_input(S2, (1, -1, -1), forloop_dim=0), "sum")
    tb.new_output(tb.div(xw, tb.sqrt(tb.mul_scalar(sq, 1.0 / 256))), (1, -1, -1))
    (O,) = h.customized([P, S2], tb)
    h.mark_output(O)
    assert len(_combines(h0)) == 1
    assert fuse.plan(h) == {}
    assert _max_rel_error(h, g) < 1e-2


def test_a_partial_that_is_also_returned_keeps_its_dtype() -> None:
    g = _split_k_program()
    h = hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=16, loop=32, splits=4))
    P = next(t for t in h.operators if t.op == "customized" and t.params["output"] == 0)
    h.mark_output(P)
    (c,) = _combines(h)
    assert c.private == frozenset({1})
    launch, traced = generate_source(h).split("def launch_traced")
    # the sums of squares only, in ``launch`` and in its traced twin
    assert launch.count("dtype=torch.float32") == traced.count("dtype=torch.float32") == 1


@pytest.mark.parametrize("tiles", [hw.Tiles(grid=16, loop=32, splits=4),
                                   hw.Tiles(grid=32, loop=64, splits=2)])
def test_fused_split_k_matches_the_program(tiles: hw.Tiles) -> None:
    g = _split_k_program()
    h = hw.rmsnorm_linear_split_k(g, tiles)
    assert _combines(h)[0].group == tiles.splits
    assert _max_rel_error(h, g) < 1e-2
    assert _max_rel_error(h, g, fuse_combines=False) < 1e-2


def test_the_traced_launch_of_a_fused_combine_matches_its_launch() -> None:
    """``launch_traced`` (what Inductor traces to launch the kernels itself) takes the
    caller's persistent counter buffer (``COUNTERS`` zeros, which ``PieceCall`` holds as a
    buffer, so that Inductor mutates it in place with no kernel zeroing it per call) and leaves
    it zeroed, call after call; without one, a fresh zeroed buffer per call: the same outputs
    as ``launch`` either way. A buffer too small or not int32 is refused by name."""
    g = _split_k_program()
    fn = em.compile(hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=16, loop=32, splits=4)))
    (c,) = _combines(hw.rmsnorm_linear_split_k(g, hw.Tiles(grid=16, loop=32, splits=4)))
    assert fn.module.COUNTERS == c.groups  # one counter per group of the combine
    rng = np.random.default_rng(1)
    xs = [torch.tensor(0.1 * rng.standard_normal(t.dims), dtype=torch.float16, device=DEVICE)
          for t in g.inputs]
    counters = torch.zeros(fn.module.COUNTERS, dtype=torch.int32, device=DEVICE)
    with np.errstate(all="ignore"):
        (want,) = fn.module.launch(*xs)
        for _ in range(2):
            (got,) = fn.module.launch_traced(*xs)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            (got,) = fn.module.launch_traced(*xs, counters=counters)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            assert not counters.any()  # left zeroed for the next call
        with pytest.raises(ValueError, match="counters: expected an int32 buffer of at least"):
            fn.module.launch_traced(*xs, counters=counters[:-1])


def test_fused_split_kv_attention_matches_the_program() -> None:
    g = em.new_kernel_graph()
    Q, K, V = g.new_input((2, 32, 16)), g.new_input((2, 16, 512)), g.new_input((2, 512, 16))
    E = g.exp(g.matmul(Q, K))
    g.mark_output(g.div(g.matmul(E, V), g.reduction(E, 2)))
    h = hw.attention(g, hw.Tiles(grid=16, loop=64, splits=4))
    (c,) = _combines(h)
    assert c.group == 4 and c.groups == 4
    assert _max_rel_error(h, g) < 1e-2


@pytest.mark.gpu
def test_direct_launches_match_and_misaligned_inputs_take_tritons_path() -> None:
    """After the first launch, kernels are launched straight through the compiled launcher; an
    input that is not 16-byte aligned goes through Triton again (and stays right)."""
    g = em.benchmarks.get("rmsnorm_linear")
    h = hw.rmsnorm_linear_split_k(g)
    fn = em.compile(h)
    rng = np.random.default_rng(0)
    X = torch.tensor(0.1 * rng.standard_normal((2, 4096)), dtype=torch.float16, device="cuda")
    W = torch.tensor(0.1 * rng.standard_normal((4096, 6144)), dtype=torch.float16,
                     device="cuda")
    first = fn(X, W)[0]
    again = fn(X, W)[0]
    assert torch.equal(first, again)
    shifted = torch.empty(2 * 4096 + 1, dtype=torch.float16, device="cuda")[1:].view(2, 4096)
    shifted.copy_(X)
    assert shifted.data_ptr() % 16 != 0
    assert torch.allclose(fn(shifted, W)[0].float(), first.float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
def test_inductor_launches_a_fused_combine_with_its_persistent_counters() -> None:
    """Traced and compiled by Inductor (as the backend's ``launch="inductor"`` path does), a
    fused split-K program whose counters are a persistent input runs as one kernel: Inductor
    mutates the buffer in place (no kernel of its own zeroes or copies it), and the outputs
    match the direct launch call after call (a counter the kernel did not leave at zero would
    make a later call's combine run early, or never)."""
    from torch._inductor.utils import run_and_get_code

    from egraph_mirage.fx import inductor_timing

    g = em.benchmarks.get("rmsnorm_linear")
    fn = em.compile(hw.rmsnorm_linear_split_k(g))
    assert fn.module.COUNTERS > 0

    def launch(*xs: torch.Tensor, counters: torch.Tensor | None = None) -> list[torch.Tensor]:
        return fn.module.launch_traced(*xs, counters=counters)

    launch.counters = fn.module.COUNTERS  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    xs = [torch.tensor(0.1 * rng.standard_normal(t.dims), dtype=torch.float16, device="cuda")
          for t in g.inputs]
    (want,) = fn.module.launch(*xs)
    compiled, codes = run_and_get_code(lambda: inductor_timing._launched_by_inductor(launch, xs))
    assert compiled is not None
    call = "\n".join(codes)
    call = call[call.index("def call("):]
    assert call.count(".run(") == 1, call  # our kernel alone: no zeroing, no copy, no clone
    for _ in range(3):
        (got,) = compiled(*xs)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
