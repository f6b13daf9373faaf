"""The GPU side's CPU tier: the PyTorch evaluator, byte counting, baselines, tuning, its cache."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.gpu import baselines as bl
from egraph_mirage.gpu.floor import Floor, io_bytes
from egraph_mirage.gpu.timing import (
    TimingConfig,
    graph_bytes,
    input_sets,
    random_inputs,
    rotation_count,
)
from egraph_mirage.gpu.torch_eval import (
    TORCH_ACCUMULATORS,
    evaluate,
    relative_error,
    torch_function,
)
from egraph_mirage.gpu.tune import (
    DEFAULT_KNOBS,
    TuneCache,
    cache_key,
    check,
    knob_space,
    tolerance,
    tune,
)
from egraph_mirage.lower.cost_model import ProgramCost
from egraph_mirage.mugraph import ACCUMULATORS
from egraph_mirage.rank.measured import rank

NAMES = em.benchmarks.names()


class FakeTimer:
    """Runs the program once (so a broken one fails) and returns a fixed figure."""

    def __init__(self, plain_us: float = 10.0, graph_us: float = 5.0) -> None:
        self.plain_us, self.graph_us, self.calls = plain_us, graph_us, 0

    def plain(self, fn: Any, sets: Sequence[Any]) -> float:
        self.calls += 1
        fn(*sets[0])
        return self.plain_us

    def graph(self, fn: Any, sets: Sequence[Any]) -> float:
        self.calls += 1
        fn(*sets[0])
        return self.graph_us


# --- the evaluator -----------------------------------------------------------------------------

def test_every_accumulator_has_a_torch_entry() -> None:
    assert set(TORCH_ACCUMULATORS) == set(ACCUMULATORS)


@pytest.mark.parametrize("name", NAMES)
def test_torch_evaluator_matches_graph_evaluate(name: str) -> None:
    g = em.benchmarks.get(name, batch=2, small=True)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(t.dims) * 0.5 for t in g.inputs]
    want = g.evaluate(xs)
    for prog in (g, fixtures.fused(name, g)):  # the μGraph runs through the table too
        got = evaluate(prog, [torch.tensor(x) for x in xs], torch.float64)
        assert len(got) == len(want)
        for o, r in zip(got, want):
            assert relative_error(o, torch.tensor(r)) < 1e-12


@pytest.mark.parametrize("name", ["gqa", "mha", "mqa"])
def test_torch_evaluator_flash_attention(name: str) -> None:
    """Online softmax (running max, rescaled accumulators) agrees with the per-block reference
    interpreter and with the plain program, in float64 and float32."""
    g = em.benchmarks.get(name, small=True)
    h = fixtures.flash_attention(g)
    xs = [np.random.default_rng(3).standard_normal(t.dims) for t in g.inputs]
    (blocks,) = em.run_reference(h, xs)
    (plain,) = g.evaluate(xs)
    ts = [torch.tensor(x) for x in xs]
    (got,) = evaluate(h, ts, torch.float64)
    (eager,) = evaluate(g, ts, torch.float64)
    assert relative_error(got, torch.tensor(blocks)) < 1e-12
    assert relative_error(got, torch.tensor(plain)) < 1e-12
    assert relative_error(got, eager) < 1e-12
    (got32,) = evaluate(h, ts, torch.float32)
    assert got32.dtype == torch.float32 and relative_error(got32, torch.tensor(blocks)) < 1e-5


def _online_softmax_kinds(loop: int, invariant_max: bool = False) -> em.KernelGraph:
    """Every linear accumulator rescaled by a running max of another input; a rescale tile that
    is no max; an invariant operand rescaled by a loop-side max."""
    g = em.new_kernel_graph()
    X, Y = g.new_input((4, 64), em.float32), g.new_input((4, 64), em.float32)
    Z = g.new_input((4, 8), em.float32)
    tb = em.new_threadblock_graph(grid_dim=(2, 1, 1), forloop_range=loop, reduction_dimx=4)
    x = tb.new_input(X, (0, -1, -1), forloop_dim=1)
    y = tb.new_input(Y, (0, -1, -1), forloop_dim=-1 if invariant_max else 1)
    z = tb.new_input(Z, (0, -1, -1), forloop_dim=-1)
    m = tb.forloop_max(y)
    for acc in (None, "sum", "mean", "sum_todimx"):
        tb.new_output(tb.forloop_accum(x, acc, rescale=m), (0, -1, -1))
    tb.new_output(tb.forloop_accum(x, rescale=x), (0, -1, -1))
    tb.new_output(tb.forloop_accum(z, "sum", rescale=m), (0, -1, -1))
    tb.new_output(tb.forloop_accum(tb.exp(tb.add(y, tb.mul_scalar(m, -1.0))), "sum"),
                  (0, -1, -1))
    for o in g.customized([X, Y, Z], tb):
        g.mark_output(o)
    return g


@pytest.mark.parametrize("loop,invariant_max", [(4, False), (1, False), (4, True)])
def test_torch_online_softmax_is_the_reference_interpreter(loop: int,
                                                           invariant_max: bool) -> None:
    """Each rescaled kind, also where the scores are -inf for some iterations or all (rows
    of Y masked with -inf): the same values as ``run_reference``, finite (the running max is
    never below the lowest finite fp32, so no factor is exp(-inf - -inf))."""
    g = _online_softmax_kinds(loop, invariant_max)
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal(t.dims) for t in g.inputs]
    xs[1][0, :16] = xs[1][1, :32] = xs[1][2, :] = -np.inf
    want = em.run_reference(g, xs)
    got = evaluate(g, [torch.tensor(x) for x in xs], torch.float64)
    for o, w in zip(got, want, strict=True):
        assert np.isfinite(w).all()
        assert np.allclose(o.numpy(), w, rtol=1e-12, atol=1e-12)


def test_torch_evaluator_other_ops() -> None:
    g = em.new_kernel_graph()
    A = g.new_input((3, 4), em.float32)
    B = g.new_input((1, 4), em.float32)
    for t in (g.sqrt(g.square(A)), g.gelu(A), g.relu(A), g.mul_scalar(A, 0.5),
              g.concat(A, B, 0), g.rms_norm(A, (4,), B), g.reduction(A, 0)):
        g.mark_output(t)
    xs = [np.random.default_rng(2).standard_normal(t.dims) for t in g.inputs]
    for o, r in zip(evaluate(g, [torch.tensor(x) for x in xs], torch.float64), g.evaluate(xs)):
        assert relative_error(o, torch.tensor(r)) < 1e-12


def test_targets_run_only_what_they_need() -> None:
    g = em.benchmarks.get("qknorm", small=True)
    A, _, C = bl.match_attention(g)  # type: ignore[misc]
    fn = torch_function(g, targets=[A, C])
    xs = random_inputs(g, "cpu")
    a, c = fn(*xs)
    assert a.shape == A.dims and c.shape == C.dims


def test_relative_error_rejects_nan() -> None:
    x = torch.ones(3)
    assert relative_error(x, x) == 0.0
    assert relative_error(torch.tensor([1.0, math.nan, 1.0]), x) == math.inf
    assert relative_error(torch.ones(2), x) == math.inf


def test_a_kernel_wrong_in_one_block_is_rejected() -> None:
    """Wrong by 3% of the largest value in one 32-element block of 32 x 6144 outputs: the
    norm-wise error stays under the tolerance (miscompiles of this kind, measured on an H200,
    passed a norm-only check), the worst element's does not; fp16 rounding everywhere passes."""
    g = em.benchmarks.get("rmsnorm_linear", small=True)
    ref = torch.randn(32, 6144, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    wrong = ref.clone()
    wrong[5, 128:160] += 0.03 * ref.abs().max()
    assert float(torch.linalg.vector_norm(wrong - ref) / torch.linalg.vector_norm(ref)) < (
        tolerance(g) / 2)
    assert relative_error(wrong, ref) > 0.02
    assert not check(lambda *xs: [wrong], g, [], refs=[ref])[0]
    rounded = ref.to(torch.float16)
    assert relative_error(rounded, ref) < 1e-3 and check(lambda *xs: [rounded], g, [],
                                                         refs=[ref])[0]
    # bfloat16 programs get 8 times the room (3 fewer mantissa bits)
    assert tolerance(em.benchmarks.get("rmsnorm_linear", small=True, dtype=em.bfloat16)) == (
        8 * tolerance(g))


# --- inputs, bytes, floor ----------------------------------------------------------------------

def test_random_inputs_are_not_zeros_and_scaled() -> None:
    g = em.benchmarks.get("gqa", small=True)
    xs = random_inputs(g, "cpu", seed=3, std=0.1)
    assert [tuple(x.shape) for x in xs] == [t.dims for t in g.inputs]
    assert all(x.dtype == torch.float16 for x in xs)
    s = float(torch.cat([x.float().flatten() for x in xs]).std())
    assert 0.08 < s < 0.12
    other = input_sets(g, 2, "cpu", seed=3)
    assert torch.equal(other[0][0], xs[0]) and not torch.equal(other[1][0], xs[0])


def test_rotation_count() -> None:
    cfg = TimingConfig()
    l2 = 60 << 20
    assert rotation_count(200 << 20, l2, cfg) == 1  # bigger than L2: no copies needed
    assert rotation_count(50 << 20, l2, cfg) == 4  # 3 × L2 covered
    assert rotation_count(1000, l2, cfg) == cfg.max_sets
    assert rotation_count(1 << 30, l2, cfg) == 1


def test_floor_bytes_rmsnorm_linear() -> None:
    g = em.benchmarks.get("rmsnorm_linear")  # X (2, 4096), W (4096, 6144), O (2, 6144)
    want = (2 * 4096 + 4096 * 6144 + 2 * 6144) * 2
    assert io_bytes(g) == want
    assert graph_bytes(g) == (2 * 4096 + 4096 * 6144) * 2
    assert Floor(4.14e12).us(g) == pytest.approx(want / 4.14e12 * 1e6)
    assert 12.0 < Floor(4.14e12).us(g) < 12.4  # benchmarks.md: 12.2 µs


def test_traffic_comes_from_the_search_s_cost_model() -> None:
    """One no-GPU model of what a μGraph moves: ``ProgramCost`` (the search ranks by it, and so
    does ``rank`` without a GPU); ``io_bytes`` is the floor, what any version must move."""
    traffic = ProgramCost().traffic_bytes
    g = em.benchmarks.get("ntrans", small=True)
    h = fixtures.fused("ntrans", g)
    assert traffic(h) == io_bytes(h) == io_bytes(g)  # one kernel, no input re-read: the floor
    assert traffic(g) > io_bytes(g)  # eager writes and re-reads every intermediate
    r = fixtures.fused("rmsnorm_linear", em.benchmarks.get("rmsnorm_linear", small=True))
    assert traffic(r) > io_bytes(r)  # every block of the grid reads all of X
    a = fixtures.fused("gqa", em.benchmarks.get("gqa", small=True))
    assert traffic(a) > io_bytes(a)  # split-KV partials cross memory
    for prog in (g, h, r, a):
        assert traffic(prog) == sum(moved for _, moved, _ in ProgramCost().kernels(prog))
    from egraph_mirage.gpu import floor

    assert not hasattr(floor, "traffic_bytes")  # no second model on the GPU side


# --- baselines ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_sdpa_applies_exactly_to_attention(name: str) -> None:
    g = em.benchmarks.get(name, small=True)
    b = bl.sdpa(g)
    assert (b is not None) == (name in {"gqa", "mha", "mqa", "qknorm"})
    if b is None:
        return
    xs = [x.float() for x in random_inputs(g, "cpu", seed=4)]
    (out,) = b.fn(*b.prepare(xs))
    (ref,) = evaluate(g, xs)
    assert relative_error(out, ref) < 1e-5


def test_baselines_for_without_compile() -> None:
    g = em.benchmarks.get("lora", small=True)
    assert bl.names(bl.baselines_for(g, use_compile=False)) == ["eager"]
    gq = em.benchmarks.get("mqa", small=True)
    assert bl.names(bl.baselines_for(gq, use_compile=False)) == ["eager", "sdpa"]
    assert bl.flashinfer_available() in (True, False)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit, inside torch.compile
def test_both_compile_modes_compile_their_own_graph() -> None:
    """With ``max_autotune`` the default mode and max-autotune are two baselines over one code
    object; the second mode's first call must compile anew, not reuse the first's graph."""
    from torch._dynamo.utils import counters

    g = em.benchmarks.get("rmsnorm_linear", small=True, dtype=em.float32)
    both = bl.baselines_for(g, max_autotune=True)
    assert bl.names(both) == ["eager", "compile", "compile-max-autotune"]
    xs = [torch.randn(t.dims, generator=torch.Generator().manual_seed(i)) * 0.1
          for i, t in enumerate(g.inputs)]
    (ref,) = evaluate(g, xs)
    graphs = []
    for b in both[1:]:
        (out,) = b.fn(*xs)
        assert relative_error(out, ref) < 1e-5
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] == graphs[0] + 1


# --- tuning ------------------------------------------------------------------------------------

def _torch_compiler(h: em.KernelGraph, knobs: dict[str, Any]) -> Any:
    if knobs.get("num_warps") == 2:
        raise RuntimeError("this setting does not compile")
    fn = torch_function(h)
    if knobs.get("num_stages") == 1:
        return lambda *xs: [o * 1.5 for o in fn(*xs)]  # a wrong kernel
    return fn


def test_cache_key_depends_on_everything() -> None:
    g = fixtures.fused("lora", em.benchmarks.get("lora", small=True))
    text = em.to_json(g)
    k = cache_key(text, "NVIDIA H200", {"num_warps": 4, "num_stages": 2}, "graph")
    assert k == cache_key(text, "NVIDIA H200", {"num_stages": 2, "num_warps": 4}, "graph")
    assert k != cache_key(text, "NVIDIA H100", {"num_warps": 4, "num_stages": 2}, "graph")
    assert k != cache_key(text, "NVIDIA H200", {"num_warps": 8, "num_stages": 2}, "graph")
    assert k != cache_key(text, "NVIDIA H200", {"num_warps": 4, "num_stages": 2}, "plain")
    assert k != cache_key(text, "NVIDIA H200", {"num_warps": 4, "num_stages": 2}, "graph", "v2")
    other = fixtures.fused("lora", em.benchmarks.get("lora", batch=2, small=True))
    assert k != cache_key(em.to_json(other), "NVIDIA H200", {"num_warps": 4, "num_stages": 2},
                          "graph")


def test_knob_space_default() -> None:
    import egraph_mirage.lower as lower

    space = knob_space()
    if getattr(lower, "KNOBS", None) is None:  # else the lowering names its own knobs
        assert len(space) == len(DEFAULT_KNOBS["num_warps"]) * len(DEFAULT_KNOBS["num_stages"])
    assert space and all(isinstance(k, dict) for k in space)
    assert knob_space({}) == [{}]
    assert knob_space({"a": (1, 2), "b": (3,)}) == [{"a": 1, "b": 3}, {"a": 2, "b": 3}]


def test_knob_space_tries_the_fused_combine_and_pdl_only_where_they_matter() -> None:
    """Split-KV attention is two kernels whose combine can be fused: fused, it is one launch
    and programmatic dependent launch (``pdl``) changes nothing, so the space has fused, not
    fused, and not fused with pdl. The FlashAttention form is one kernel: neither knob."""
    g = em.benchmarks.get("gqa")
    split, flash = fixtures.attention(g), fixtures.flash_attention(g)
    quick = {"num_warps": (4, 8), "num_stages": (3,)}
    settings = {(k["fuse_combines"], k["pdl"]) for k in knob_space(quick, split)}
    assert settings == {(True, False), (False, False), (False, True)}
    assert len(knob_space(quick, split)) == 6 and len(knob_space(None, split)) == 36
    assert knob_space(quick, flash) == knob_space(quick)
    assert knob_space({}, split) == [{}]  # the lowering's defaults alone
    assert knob_space({"fuse_combines": (False,)}, split) == [
        {"fuse_combines": False, "pdl": False}, {"fuse_combines": False, "pdl": True}]
    assert knob_space({"fuse_combines": (True,)}, split) == [
        {"fuse_combines": True, "pdl": False}]


def test_tune_rejects_wrong_and_caches(tmp_path: Any) -> None:
    g = em.benchmarks.get("gated_mlp", small=True)
    h = fixtures.fused("gated_mlp", g)
    sets = input_sets(g, 2, "cpu")
    check = random_inputs(g, "cpu", seed=99)
    space = {"num_warps": (2, 4), "num_stages": (1, 2)}
    timer = FakeTimer()
    cache = TuneCache(tmp_path)
    r = tune(h, g, compiler=_torch_compiler, timer=timer, input_sets=sets, check_inputs=check,
             device="cpu", cache=cache, space=space)
    status = {(t.knobs["num_warps"], t.knobs["num_stages"]): t.status for t in r.trials}
    assert status == {(2, 1): "failed", (2, 2): "failed", (4, 1): "wrong", (4, 2): "ok"}
    assert r.best is not None and r.best.knobs == {"num_warps": 4, "num_stages": 2}
    assert r.us == 5.0 and r.fn is not None
    assert timer.calls == 1  # only the correct setting was timed
    again = FakeTimer()
    r2 = tune(h, g, compiler=_torch_compiler, timer=again, input_sets=sets, check_inputs=check,
              device="cpu", cache=cache, space=space)
    assert again.calls == 0 and all(t.cached for t in r2.trials)
    assert r2.best is not None and r2.best.knobs == r.best.knobs
    assert len(list((tmp_path / "tune").glob("*.json"))) == 4


def test_tuning_stops_at_its_deadline_once_a_setting_has_a_time(tmp_path: Any) -> None:
    """``tune(stop=)``: asked before each setting not in the cache once one setting has a time;
    True ends the tuning with the best so far. Settings already cached are still read, and
    ``tune_staged`` skips its second round."""
    from egraph_mirage.gpu.tune import Trial, TuneResult, tune_staged

    g = em.benchmarks.get("gated_mlp", small=True)
    h = fixtures.fused("gated_mlp", g)
    sets, check = input_sets(g, 1, "cpu"), random_inputs(g, "cpu", seed=99)
    space = {"num_warps": (2, 4), "num_stages": (1, 2, 3)}
    cache = TuneCache(tmp_path)

    def tuned(stop: Any) -> Any:
        return tune(h, g, compiler=_torch_compiler, timer=FakeTimer(), input_sets=sets,
                    check_inputs=check, device="cpu", cache=cache, space=space, stop=stop)

    # (warps 2, *) fail to compile and (4, stages 1) is wrong: the first time is (4, 2), then
    # it stops (settings in order of stages, then warps)
    r = tuned(lambda: True)
    assert [(t.knobs["num_warps"], t.knobs["num_stages"]) for t in r.trials] == [
        (2, 1), (4, 1), (2, 2), (4, 2)]
    assert r.best is not None and r.best.knobs == {"num_warps": 4, "num_stages": 2}
    r = tuned(lambda: False)  # the cached four read, the other two tried
    assert [t.cached for t in r.trials] == [True] * 4 + [False] * 2
    r = tuned(lambda: True)  # all six cached: nothing to stop
    assert len(r.trials) == 6 and all(t.cached for t in r.trials)

    spaces: list[Any] = []

    def tuner(mugraph: Any, sp: Any) -> TuneResult:
        spaces.append(sp)
        t = Trial({"num_warps": 4, "num_stages": 3}, "ok", us=1.0)
        return TuneResult([t], t, None)

    split = fixtures.rmsnorm_linear_split_k(em.benchmarks.get("rmsnorm_linear", small=True),
                                            fixtures.Tiles(grid=16))
    assert em.lower.graph_knobs(split)
    tune_staged(split, tuner, stop=lambda: True)
    assert len(spaces) == 1
    tune_staged(split, tuner, stop=lambda: False)
    assert len(spaces) == 3


def test_rank_by_time_and_by_bytes() -> None:
    g = em.benchmarks.get("lora", small=True)
    one, two = fixtures.lora(g), fixtures.lora_concat(g)
    static = rank([two, one])  # no GPU: the search's cost model decides
    cost = ProgramCost()
    assert [r.estimated_us for r in static] == sorted(cost.seconds(h) * 1e6 for h in (one, two))
    assert [r.traffic_bytes for r in static] == [cost.traffic_bytes(r.mugraph) for r in static]
    assert all(r.us is None for r in static)
    assert static[0].mugraph is min((one, two), key=cost.seconds)

    def tuner(h: em.KernelGraph) -> Any:
        t = FakeTimer(graph_us=3.0 if h is two else 7.0)
        return tune(h, g, compiler=lambda k, knobs: torch_function(k), timer=t,
                    input_sets=input_sets(g, 1, "cpu"), check_inputs=random_inputs(g, "cpu", 5),
                    device="cpu", space={})

    timed = rank([one, two], tuner)
    assert timed[0].mugraph is two and timed[0].us == 3.0 and timed[1].us == 7.0


def test_staged_tuning_tries_the_lowering_knobs_then_the_graphs_own() -> None:
    """``tune_staged``: 12 settings of warps x stages with the μGraph's own knobs at their first
    value, then its own knobs in full at the best of those; the faster of the two rounds wins."""
    from egraph_mirage.gpu.tune import Trial, TuneResult, tune_staged

    g = em.new_kernel_graph()
    X, W = g.new_input((4, 256), em.float16), g.new_input((256, 256), em.float16)
    g.mark_output(g.matmul(g.rms_norm(X, (256,)), W))
    h = fixtures.rmsnorm_linear_split_k(g, fixtures.Tiles(grid=128))
    own = em.lower.graph_knobs(h)
    assert len(own) >= 2
    spaces = []

    def tuner(mugraph: Any, space: dict) -> TuneResult:
        spaces.append(space)
        settings = [dict(zip(space, combo)) for combo in itertools.product(*space.values())]
        # fastest: 4 warps, 3 stages, and every own knob at its last value
        trials = [Trial(k, "ok", us=10.0 - (k["num_warps"] == 4) - (k["num_stages"] == 3)
                        - sum(k.get(o) == v[-1] for o, v in own.items()))
                  for k in settings]
        best = min(trials, key=lambda t: t.us)
        return TuneResult(trials, best, None)

    r = tune_staged(h, tuner)
    first, second = spaces
    assert math.prod(map(len, first.values())) == 12
    assert all(first[o] == (v[0],) for o, v in own.items())
    assert second["num_warps"] == (4,) and second["num_stages"] == (3,)
    assert all(second[o] == tuple(v) for o, v in own.items())
    assert r.best is not None and all(r.best.knobs[o] == v[-1] for o, v in own.items())
    assert len(r.trials) == 12 + math.prod(len(v) for v in own.values())
    # a μGraph without knobs of its own: one round
    spaces.clear()
    tune_staged(fixtures.fused("rmsnorm_linear", em.benchmarks.get("rmsnorm_linear",
                                                                    small=True)), tuner)
    assert len(spaces) == 1
