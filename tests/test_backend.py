"""The ``torch.compile`` backend (``fx.backend``) on the CPU, kernels in Triton's interpreter.

Most tests search with a stand-in (``search=``, a function returning a chosen program as the
"winner"), so they test the backend's flow and not the search; one test runs the real search on
a tiny space (``tests/search_space.TINY``), and the Llama layer runs it with one task per piece.
How winners are timed against Inductor's code and launched by it: ``test_backend_timing.py``.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch
from backend_stand_ins import (
    StandIn,
    inputs,
    ops_called,
    options,
    relu_mm,
    rms_mm,
    scaled_by_three,
)
from search_space import TINY

import egraph_mirage as em
from egraph_mirage.fx.backend import NAME, Backend, egraph_mirage_backend
from egraph_mirage.fx.options import BackendError, BackendOptions, DynamicShapesError
from egraph_mirage.fx.report import KEPT, RECENT, REPLACED, torch_report
from egraph_mirage.search.results import SearchResults, SearchStats

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_a_found_piece_is_replaced_and_matches_eager(tmp_path: Path) -> None:
    search = StandIn()
    backend = Backend(**options(tmp_path, search=search))
    compiled = torch.compile(relu_mm, backend=backend, dynamic=False)
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(compiled, x, w)
    torch.testing.assert_close(got, relu_mm(x, w), rtol=2e-3, atol=2e-3)
    assert search.calls == 1 and len(ops) == 1 and ops[0].startswith("egraph_mirage::egm_0_")
    (report,) = backend.reports
    (piece,) = report.pieces
    assert piece.status == REPLACED and piece.cache == "miss"
    assert piece.operators == ("matmul", "relu", "mul_scalar")
    assert piece.shapes == ((2, 64), (64, 96)) and piece.dtypes == ("float16", "float16")
    assert torch_report(compiled) == report.text() == torch_report(backend)
    assert "replaced" in report.text() and report in RECENT


def test_the_second_compile_hits_the_cache(tmp_path: Path) -> None:
    x, w = inputs()
    first, second = StandIn(), StandIn()
    with torch.no_grad():
        torch.compile(relu_mm, backend=Backend(**options(tmp_path, search=first)))(x, w)
        torch._dynamo.reset()
        backend = Backend(**options(tmp_path, search=second))
        got, ops = ops_called(torch.compile(relu_mm, backend=backend), x, w)
    assert (first.calls, second.calls, backend.searches) == (1, 0, 0)
    (piece,) = backend.reports[0].pieces
    assert piece.cache == "hit" and piece.status == REPLACED and piece.search_seconds is None
    assert len(ops) == 1
    torch.testing.assert_close(got, relu_mm(x, w), rtol=2e-3, atol=2e-3)
    assert "0 search(es), cache 1 hit(s) / 0 miss(es)" in backend.reports[0].text()


def test_a_winner_that_differs_from_eager_is_kept(tmp_path: Path) -> None:
    backend = Backend(**options(tmp_path, search=StandIn(winner=scaled_by_three)))
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(torch.compile(relu_mm, backend=backend), x, w)
    assert ops == []
    torch.testing.assert_close(got, relu_mm(x, w))
    (piece,) = backend.reports[0].pieces
    assert piece.status == KEPT and "differs from eager" in piece.reason


def test_with_nothing_replaced_the_rest_is_dynamos_own_graph(tmp_path: Path,
                                                             monkeypatch: Any) -> None:
    """Never slower: when no piece is replaced, the rest compiler gets the graph Dynamo gave
    the backend, not the partitioned one (Inductor compiles exactly what torch.compile would)."""
    import egraph_mirage.fx.backend as backend_module

    given: list[Any] = []
    real = backend_module.compile_rest

    def spy(module: Any, example_inputs: Any, rest: str, mode: Any, dynamo: Any = None) -> Any:
        given.append(module)
        return real(module, example_inputs, rest, mode, dynamo)

    monkeypatch.setattr(backend_module, "compile_rest", spy)
    x, w = inputs()
    with torch.no_grad():
        torch.compile(relu_mm, backend=Backend(**options(
            tmp_path, search=StandIn(winner=scaled_by_three))), dynamic=False)(x, w)
        torch.compile(relu_mm, backend=Backend(**options(
            tmp_path / "other", search=StandIn())), dynamic=False)(x, w)
    kept, replaced = given
    assert not any(name.startswith("egm_") for name, _ in kept.named_children())
    assert any(name.startswith("egm_") for name, _ in replaced.named_children())


def test_inductors_code_for_the_partitioned_graph_takes_dynamos_inputs_as_they_are() -> None:
    """The partition's module is torch.export's, whose code flattens its inputs and unflattens
    its outputs by pytree specs; compiled as is, Inductor's code for it did that too, in
    Python at every call (267 calls more than for Dynamo's graph on a decode step of two small
    Llama layers), host time that every plain launch of a graph with a replaced piece paid.
    The rest compiler hands Inductor a copy that takes Dynamo's flat inputs: as many Python
    calls per call as Inductor's code for Dynamo's own graph, and the same outputs."""
    from egraph_mirage.fx.pieces import partition
    from egraph_mirage.fx.rest import compile_rest

    def f(x: torch.Tensor, *ws: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x
        for w in ws:
            h = torch.relu(h @ w) * 2
        return h, torch.cumsum(h, dim=0)  # an operator the pieces leave to the rest

    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(2, 32, generator=gen)] + [torch.randn(32, 32, generator=gen) / 4
                                                 for _ in range(12)]
    captured: list[Any] = []

    def capture(gm: Any, example_inputs: Any) -> Any:
        captured.append(gm)
        return gm.forward

    with torch.no_grad():
        torch.compile(f, backend=capture, dynamic=False)(*xs)
        (gm,) = captured
        parts = partition(gm, xs)
        assert parts.pieces
        dynamos = compile_rest(gm, xs, "inductor", None)
        ours = compile_rest(parts.module, xs, "inductor", None, gm)

        def python_calls(fn: Any) -> int:
            fn(*xs)
            count = 0

            def profiler(frame: Any, event: str, arg: Any) -> None:
                nonlocal count
                count += event == "call"

            sys.setprofile(profiler)
            try:
                fn(*xs)
            finally:
                sys.setprofile(None)
            return count

        assert python_calls(ours) <= python_calls(dynamos)
        for a, b in zip(ours(*xs), f(*xs), strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("refined", [False, True])
def test_a_graph_whose_pieces_inductor_launches_comes_from_inductors_caches_when_compiled_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refined: bool) -> None:
    """Where Inductor launches every replaced piece's kernels, the rest compiler traces each
    piece's launch into the graph it hands Inductor (``fx.rest.inlined``): no module of ours
    is left in it, its counters a buffer of the graph. AOTAutograd's cache of compiled graphs
    could not key on a graph holding our modules (their operators' registrations cannot be
    pickled), so every compilation of a model with pieces replaced traced and compiled it all
    again; now a second compilation is a hit in both of Inductor's caches. A refined piece
    (``refined``: its parts replaced in its own module) is traced in the same way. (On the CPU
    a piece has no Inductor launch: a stand-in computes it with torch operators.)"""
    import torch._inductor.compile_fx as inductor
    from torch._dynamo.utils import counters

    from egraph_mirage.fx import rest
    from egraph_mirage.fx.pieces import partition
    from egraph_mirage.fx.runtime import PieceCall

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    given: list[Any] = []
    compile_fx = inductor.compile_fx

    def seen(module: Any, *args: Any, **kwargs: Any) -> Any:
        given.append(module)
        return compile_fx(module, *args, **kwargs)

    monkeypatch.setattr(inductor, "compile_fx", seen)

    class Op:  # stands in for a PieceOp: its kernels are never called
        op = staticmethod(lambda xs: [xs[0] * float("nan")])

    def replaced(parts: Any) -> Any:
        for piece in parts.pieces:
            def launch(*ys: Any, module: Any = piece.module, counters: Any = None) -> Any:
                assert counters is not None and counters.dtype == torch.int32
                return tuple(module(*ys))

            launch.counters = 4  # type: ignore[attr-defined]
            call = PieceCall(Op(), launch, device="cpu")  # type: ignore[arg-type]
            call.by_inductor = True
            setattr(parts.module, piece.name, call)
        return parts.module

    def backend(gm: Any, xs: Any) -> Any:
        parts = partition(gm, xs)
        if refined:  # the piece cut at its matmul, each part replaced
            (piece,) = parts.pieces
            inner = partition(piece.module, piece.example_inputs, levels=True)
            assert len(inner.pieces) == 2
            setattr(parts.module, piece.name, replaced(inner))
            return rest.compile_rest(parts.module, xs, "inductor", None, gm)
        return rest.compile_rest(replaced(parts), xs, "inductor", None, gm)

    x, w = inputs(torch.float32)
    f = rms_mm if refined else relu_mm
    held = ["egm_0.egm_0_counters", "egm_0.egm_1_counters"] if refined else ["egm_0_counters"]
    for again in (False, True):
        torch._dynamo.reset()
        counters.clear()
        with torch.no_grad():
            got = torch.compile(f, backend=backend, dynamic=False)(x, w)
        torch.testing.assert_close(got, f(x, w))
        module = given[-1]
        assert not any(isinstance(m, PieceCall) for m in module.modules())
        assert sorted(name for name, _ in module.named_buffers()) == held
        # named to Inductor as static inputs, beside Dynamo's sources
        for name in held:
            assert module._param_name_to_source[name].name == f"egraph_mirage:{name}"
        hits = counters["aot_autograd"]["autograd_cache_hit"]
        assert hits == int(again), dict(counters["aot_autograd"])


def test_an_unsupported_operator_runs_in_the_rest(tmp_path: Path) -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(relu_mm(x, w), dim=0)

    backend = Backend(**options(tmp_path, search=StandIn()))
    x, w = inputs(torch.float32)
    with torch.no_grad():
        got, ops = ops_called(torch.compile(f, backend=backend), x, w)
    torch.testing.assert_close(got, f(x, w), rtol=1e-4, atol=1e-4)
    report = backend.reports[0]
    assert [p.status for p in report.pieces] == [REPLACED] and len(ops) == 1
    (name,) = [n for n in report.left_out if "cumsum" in n]
    assert "left out: " + name in report.text()


def test_the_real_search_on_a_tiny_space_with_inductor_for_the_rest(tmp_path: Path) -> None:
    config = {**asdict(TINY), "max_results": 1}
    compiled = torch.compile(relu_mm, backend=NAME, dynamic=False,
                             options=options(tmp_path, config=config, rest="inductor",
                                             budget=None))  # bounded by its space
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(compiled, x, w)
    torch.testing.assert_close(got, relu_mm(x, w), rtol=2e-3, atol=2e-3)
    (report,) = [r for r in RECENT if r.rest == "inductor"][-1:]
    (piece,) = report.pieces
    assert piece.status == REPLACED and piece.num_kernels == 1 and len(piece.grids) == 1
    assert len(ops) == 1 and report.searches == 1


def test_rms_norm_then_matmul_by_the_fused_kernel(tmp_path: Path) -> None:
    """The one-kernel μGraph of RMSNorm + Linear (hand-written, as the search finds it) as the
    winner: its kernel (which calls ``tl.sum``) replaces the piece and matches eager."""
    from egraph_mirage.bench.handwritten_fixtures import rmsnorm_linear

    backend = Backend(**options(tmp_path, search=StandIn(winner=rmsnorm_linear)))
    x, w = inputs()
    with torch.no_grad():
        got, ops = ops_called(torch.compile(rms_mm, backend=backend, dynamic=False), x, w)
    torch.testing.assert_close(got, rms_mm(x, w), rtol=2e-3, atol=2e-3)
    (piece,) = backend.reports[0].pieces
    assert piece.operators == ("rms_norm", "matmul") and piece.status == REPLACED
    assert len(ops) == 1 and piece.grids == [(6, 1, 1)]


class NothingForNormAndMatmul(StandIn):
    """A stand-in search that finds nothing for a program holding both a norm and a matmul, and
    the program itself for any other."""

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        ops = {t.op for t in g.operators}
        if {"rms_norm", "matmul"} <= ops:
            self.calls += 1
            return SearchResults([], SearchStats())  # nothing found
        return super().__call__(g, config, **options)


def gated(x: torch.Tensor, r: torch.Tensor, g: torch.Tensor, wg: torch.Tensor,
          wu: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.rms_norm(x + r, (x.shape[-1],), g, 1e-5)
    return torch.nn.functional.silu(h @ wg) * (h @ wu)


@pytest.mark.parametrize("refine", [True, False])
def test_a_piece_with_nothing_found_is_searched_again_in_parts(tmp_path: Path,
                                                               refine: bool) -> None:
    """The residual add, RMSNorm and gated projections of an MLP, for which the search finds
    nothing whole. Cut after its matmuls, the norm with both projections is a part the search
    finds nothing for either, so that cut is given up; cut at the projections' inputs, the
    norm and the projections are searched apart and both replaced (``refine=False``: the
    piece stays); a second compile finds every decision in the cache."""
    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(2, 64, generator=gen).half(), torch.randn(2, 64, generator=gen).half(),
          (torch.rand(64, generator=gen) + 0.5).half(),
          torch.randn(64, 32, generator=gen).half() / 8,
          torch.randn(64, 32, generator=gen).half() / 8)
    search = NothingForNormAndMatmul()
    backend = Backend(**options(tmp_path, search=search, refine=refine))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(gated, backend=backend, dynamic=False), *xs)
    torch.testing.assert_close(got, gated(*xs), rtol=2e-3, atol=2e-3)
    whole, *parts = backend.reports[0].pieces
    assert whole.status == KEPT and whole.nothing_found()
    # the whole piece, the norm with its projections, then the two parts of the next cut
    assert search.calls == (4 if refine else 1)
    if not refine:
        assert parts == [] and ops == []
        return
    assert "searched in 2 parts after its matmuls (0.0–0.1), 0.0 not found: given up; " \
        "searched in 2 parts (0.2–0.3)" in whole.reason
    assert [(p.index, p.part, p.name, p.status) for p in parts] == [
        (0, 0, "egm_0.egm_0", KEPT), (0, 2, "egm_0.egm_0", REPLACED),
        (0, 3, "egm_0.egm_1", REPLACED)]
    assert parts[0].operators == ("add", "rms_norm", "matmul", "matmul")
    assert parts[1].operators == ("add", "rms_norm") and "matmul" in parts[2].operators
    assert len(ops) == 2 and "piece 0.3 (egm_0.egm_1)" in backend.reports[0].text()
    torch._dynamo.reset()
    again = Backend(**options(tmp_path, search=search, refine=refine))
    with torch.no_grad():
        torch.compile(gated, backend=again, dynamic=False)(*xs)
    assert [p.cache for p in again.reports[0].pieces] == ["hit"] * 4 and again.searches == 0


class NothingFor(StandIn):
    """A stand-in search that finds nothing for a program holding a matmul and any of
    ``refused`` (a concat: a projection with its RoPE rotation; rms_norm: a norm with its
    projection), and the program itself for any other."""

    def __init__(self, refused: set[str]) -> None:
        super().__init__()
        self.refused = refused

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        ops = {t.op for t in g.operators}
        if "matmul" in ops and ops & self.refused:
            self.calls += 1
            return SearchResults([], SearchStats())
        return super().__call__(g, config, **options)


def norm_projection_rope(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.rms_norm(x, (x.shape[-1],), g, 1e-5)
    q = (h @ w).view(1, 1, 4, 16).transpose(1, 2)
    return q * cos + torch.cat((-q[..., 8:], q[..., :8]), dim=-1) * sin


def _norm_projection_rope_parts(tmp_path: Path, refused: set[str]
                                ) -> tuple[list[Any], int, list[str], str]:
    """``norm_projection_rope`` compiled with ``NothingFor(refused)``: checked against eager;
    the reports of the piece's parts, the searches run, the custom ops launched and the
    report's text."""
    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(1, 64, generator=gen).half(), (torch.rand(64, generator=gen) + 0.5).half(),
          torch.randn(64, 64, generator=gen).half() / 8,
          torch.randn(1, 1, 1, 16, generator=gen).half(),
          torch.randn(1, 1, 1, 16, generator=gen).half())
    search = NothingFor(refused)
    backend = Backend(**options(tmp_path, search=search))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(norm_projection_rope, backend=backend,
                                            dynamic=False), *xs)
    torch.testing.assert_close(got, norm_projection_rope(*xs), rtol=2e-3, atol=2e-3)
    whole, *parts = backend.reports[0].pieces
    assert whole.status == KEPT and whole.nothing_found()
    return parts, search.calls, ops, backend.reports[0].text()


def test_a_norm_stays_with_its_projection_cut_from_the_rotation(tmp_path: Path) -> None:
    """An RMSNorm, a projection and its RoPE rotation, for which the search finds nothing
    whole: cut after the matmul (``levels=AFTER_MATMULS``), the norm with the projection
    and the rotation are replaced apart, and the whole matches eager."""
    parts, calls, ops, _ = _norm_projection_rope_parts(tmp_path, {"concat"})
    assert calls == 3 and len(ops) == 2  # the whole (nothing found), then its two parts
    assert [(p.name, p.status) for p in parts] == [("egm_0.egm_0", REPLACED),
                                                   ("egm_0.egm_1", REPLACED)]
    assert {"rms_norm", "matmul"} <= set(parts[0].operators)
    assert "concat" in parts[1].operators and "matmul" not in parts[1].operators


def test_a_part_with_nothing_found_is_cut_again_after_its_matmul(tmp_path: Path) -> None:
    """The same, where the search finds nothing for the norm with the projection either: the
    cut after the matmul is given up; the piece is cut at the projection's input (the norm,
    replaced; the projection with the rotation, nothing found), and that part again after
    its matmul (``levels=EPILOGUES``): the projection and the rotation are replaced apart."""
    parts, calls, ops, text = _norm_projection_rope_parts(tmp_path, {"concat", "rms_norm"})
    assert calls == 6  # 3 with nothing found (whole, norm with projection, projection with
    # rotation), 3 parts found
    assert [(p.name, p.status) for p in parts] == [
        ("egm_0.egm_0", KEPT), ("egm_0.egm_0", REPLACED), ("egm_0.egm_1", KEPT),
        ("egm_0.egm_1.egm_0", REPLACED), ("egm_0.egm_1.egm_1", REPLACED)]
    assert "searched in 2 parts (0.3.0–0.3.1)" in parts[2].reason
    assert "concat" in parts[4].operators and "matmul" not in parts[4].operators
    assert len(ops) == 3 and "piece 0.3.1 (egm_0.egm_1.egm_1)" in text


class NothingWhere(StandIn):
    """A stand-in search that finds nothing for a program ``refused(g)`` says so of, and the
    program itself for any other."""

    def __init__(self, refused: Any) -> None:
        super().__init__()
        self.refused = refused

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        if self.refused(g):
            return SearchResults([], SearchStats())
        return super().__call__(g, config, **options)


def test_a_given_up_cut_leaves_none_of_its_parts_replaced(tmp_path: Path) -> None:
    """Two RMSNorms, each feeding a projection, and their outputs' sum: cut after the matmuls,
    each norm with its projection is a part; the first is found, the second not, so the cut is
    given up and the part found is reported kept (its module is not used). Cut at the
    projections' inputs, the norms and the projections with the sum are replaced."""
    def two_norms(x: torch.Tensor, y: torch.Tensor, w1: torch.Tensor,
                  w2: torch.Tensor) -> torch.Tensor:
        a = torch.nn.functional.rms_norm(x, (64,), None, 1e-5) @ w1
        b = torch.nn.functional.rms_norm(y, (32,), None, 1e-5) @ w2
        return a * 0.5 + b

    def refused(g: em.KernelGraph) -> bool:
        ops = {t.op for t in g.operators}
        narrow = any(t.dims[-1] == 32 for t in g.inputs)
        return {"rms_norm", "add"} <= ops or ({"rms_norm", "matmul"} <= ops and narrow)

    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(2, 64, generator=gen).half(), torch.randn(2, 32, generator=gen).half(),
          torch.randn(64, 96, generator=gen).half() / 8,
          torch.randn(32, 96, generator=gen).half() / 8)
    backend = Backend(**options(tmp_path, search=NothingWhere(refused)))
    with torch.no_grad():
        got, ops = ops_called(torch.compile(two_norms, backend=backend, dynamic=False), *xs)
    torch.testing.assert_close(got, two_norms(*xs), rtol=2e-3, atol=2e-3)
    whole, first, second, *after = backend.reports[0].pieces
    assert "after its matmuls" in whole.reason and "not found: given up" in whole.reason
    assert (first.status, first.reason) == (KEPT, "its piece's cut was given up")
    assert second.nothing_found() and "rms_norm" in first.operators
    assert [p.status for p in after] == [REPLACED] * len(after) == [REPLACED] * len(ops)


def test_dynamic_true_is_a_clear_error(tmp_path: Path) -> None:
    compiled = torch.compile(relu_mm, backend=NAME, dynamic=True, options=options(tmp_path))
    with pytest.raises(Exception, match=r"static shapes only.*dynamic=True\) is not supported"
                       ) as caught, torch.no_grad():
        compiled(*inputs())
    inner = getattr(caught.value, "inner_exception", caught.value.__cause__)
    assert isinstance(inner, DynamicShapesError)


def test_automatic_dynamic_shapes_and_autograd_run_in_the_rest(tmp_path: Path) -> None:
    backend = Backend(**options(tmp_path, search=StandIn()))
    compiled = torch.compile(relu_mm, backend=backend)  # dynamic=None: automatic
    with torch.no_grad():
        compiled(*inputs(rows=2))
        x, w = inputs(rows=4)
        torch.testing.assert_close(compiled(x, w), relu_mm(x, w))
    assert "symbolic shapes" in backend.reports[-1].note and not backend.reports[-1].pieces
    torch._dynamo.reset()
    x, w = inputs(torch.float32)
    w.requires_grad_(True)
    got = torch.compile(relu_mm, backend=backend, dynamic=False)(x, w)
    torch.testing.assert_close(got, relu_mm(x, w))
    assert "inference only" in backend.reports[-1].note


def test_options_are_checked() -> None:
    with pytest.raises(BackendError, match="unknown option"):
        BackendOptions.of({"budjet": 3})
    with pytest.raises(BackendError, match="rest"):
        BackendOptions.of({"rest": "aot_eager"})
    with pytest.raises(BackendError, match="budget"):
        BackendOptions.of({"budget": -1})
    with pytest.raises(BackendError, match="workers"):
        BackendOptions.of({"workers": 0})
    assert BackendOptions.of({"config": {"max_kernels": 1}}).config.max_kernels == 1
    with pytest.raises(BackendError, match="Backend\\(\\.\\.\\.\\)"):
        Backend()(None, [], options={"budget": 1})


def test_registered_with_dynamo() -> None:
    assert NAME in torch._dynamo.list_backends(exclude_tags=())
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend(NAME) is egraph_mirage_backend


def test_the_entry_point_is_found_by_dynamo(tmp_path: Path) -> None:
    """A distribution whose entry points are pyproject's lets Dynamo find the backend without
    importing egraph_mirage first (and without a duplicate registration when it loads)."""
    import tomllib

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    (value,) = eps["torch_dynamo_backends"].values()
    info = tmp_path / "site" / "egraph_mirage_entry-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: egraph-mirage-entry\n"
                                   "Version: 0\n")
    (info / "entry_points.txt").write_text(f"[torch_dynamo_backends]\n{NAME} = {value}\n")
    script = textwrap.dedent(f"""
        import sys, torch
        assert "egraph_mirage" not in sys.modules
        f = torch.compile(lambda x: x + 1, backend={NAME!r}, dynamic=False,
                          options={{"rest": "eager", "cache": False}})
        assert torch.equal(f(torch.ones(3)), torch.full((3,), 2.0))
        print("ok", "egraph_mirage.fx.backend" in sys.modules)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok", "True"]


def test_the_small_llama_layer_matches_eager(tmp_path: Path) -> None:
    """The whole layer through the backend, the stand-in search's "winner" being each piece's
    own program (lowered as is): every single-output piece is replaced by its custom op, input
    views and output reshapes included, and the layer still computes what eager does. (The
    real search on these pieces takes minutes on a CPU.)"""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from llama_layer import LlamaLayer
    finally:
        sys.path.remove(str(ROOT / "examples"))
    layer = LlamaLayer()
    args = layer.example_inputs(batch=2)
    backend = Backend(**options(tmp_path, search=StandIn()))
    compiled = torch.compile(layer, backend=backend, dynamic=False)
    with torch.no_grad():
        got, ops = ops_called(compiled, *args)
        want = layer(*args)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    report = backend.reports[0]
    assert len(report.pieces) >= 3
    assert {"rms_norm", "matmul", "concat", "exp", "silu"} <= {
        op for p in report.pieces for op in p.operators}
    replaced = [p for p in report.pieces if p.status == REPLACED]
    assert replaced and len(ops) == len(replaced)
    assert all(p.reason for p in report.pieces if p.status != REPLACED)


def test_the_interpreter_is_switched_on_after_triton_was_imported() -> None:
    """``torch._dynamo`` imports triton (its interpreter off) before the backend compiles a
    winner: ``lower.compile.use_interpreter`` then also makes Triton's library functions
    (``tl.sum``) interpreted, so an interpreted kernel may call them; a second call is
    harmless."""
    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from egraph_mirage.lower.compile import use_interpreter

        use_interpreter()

        @triton.jit
        def row_sum(x_ptr, out_ptr, n: tl.constexpr):
            row = tl.program_id(0)
            tl.store(out_ptr + row, tl.sum(tl.load(x_ptr + row * n + tl.arange(0, n)), axis=0))

        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        for _ in range(2):
            out = torch.empty(3)
            row_sum[(3,)](x, out, 4)
            assert torch.equal(out, x.sum(1)), out
            use_interpreter()
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["ok"]


def test_the_pieces_of_a_compilation_share_one_pool_of_workers(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    """A process count starts one pool, warmed up, at the first search of a compilation: every
    piece's search gets it (its budget is not spent starting processes), and it is shut down
    when the compilation ends. A compilation whose pieces all hit the cache starts none."""
    from egraph_mirage import processes

    started: list[Any] = []
    real = processes.worker_pool
    monkeypatch.setattr(processes, "worker_pool", lambda n: started.append(real(n)) or started[-1])

    seen: list[Any] = []

    class Recording(StandIn):
        def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
            seen.append(options["workers"])
            return super().__call__(g, config, **options)

    def chain(x: torch.Tensor, *ws: torch.Tensor) -> torch.Tensor:
        for w in ws:
            x = torch.relu(x @ w)
        return x

    gen = torch.Generator().manual_seed(0)
    dims = (16, 16, 32, 32, 16)  # two pieces of two matmuls each, not alike
    xs = (torch.randn(4, 16, generator=gen).half(),
          *(torch.randn(a, b, generator=gen).half() / 4 for a, b in itertools.pairwise(dims)))
    for expect_pools in (1, 1):  # the second compilation hits the cache
        torch._dynamo.reset()
        search = Recording()
        backend = Backend(**options(tmp_path, search=search, workers=2, max_matmuls=2))
        with torch.no_grad():
            got = torch.compile(chain, backend=backend)(*xs)
        torch.testing.assert_close(got, chain(*xs), rtol=2e-2, atol=2e-2)
        assert len(started) == expect_pools
    assert len(seen) == 2 and seen[0] is seen[1] is started[0]
    assert started[0]._shutdown_thread  # shut down at the end of its compilation
    assert [p.cache for p in backend.reports[0].pieces] == ["hit", "hit"]


def test_a_piece_whose_checks_take_much_memory_gets_as_many_processes_as_fit(
        tmp_path: Path, monkeypatch: Any) -> None:
    """Where fewer processes checking a piece's candidates fit in memory than the compilation's
    pool has workers (``verify.checks_that_fit``: a real model's sizes), that piece's search
    gets that many processes of its own, and no shared pool is started for it: a worker
    killed for memory would lose its tasks."""
    from egraph_mirage import processes
    from egraph_mirage.fx import backend as be

    started: list[Any] = []
    monkeypatch.setattr(processes, "worker_pool", lambda n: started.append(n))
    monkeypatch.setattr(be, "checks_that_fit", lambda g: 1)
    seen: list[Any] = []

    class Recording(StandIn):
        def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
            seen.append(options["workers"])
            return super().__call__(g, config, **options)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w)

    gen = torch.Generator().manual_seed(0)
    xs = (torch.randn(4, 16, generator=gen).half(), torch.randn(16, 16, generator=gen).half())
    backend = Backend(**options(tmp_path, search=Recording(), workers=4, cache=False))
    with torch.no_grad():
        torch.compile(f, backend=backend)(*xs)
    assert seen == [1] and started == []


def test_after_the_first_call_a_runner_passes_its_sources_in_place(
        monkeypatch: Any) -> None:
    """A replaced piece's runner checks its inputs on the first call; later calls hand the
    kernels each contiguous source whose views only reshape it as it is (no view made), and a
    weight read transposed (``nn.Linear``'s W, stored (out, in)) through the strides of its
    view, with no copy: the kernels were compiled for them."""
    import egraph_mirage.api as api
    from egraph_mirage.fx import runtime
    from egraph_mirage.fx.trace import trace

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t())

    x, w = torch.randn(1, 1, 64).half(), (torch.randn(32, 64) / 8).half()
    traced = trace(f, x, w)
    assert [len(t.dims) for t in traced.graph.inputs] == [2, 2]  # (1, 64) @ (64, 32)
    results = em.superoptimize(traced.graph, em.SearchConfig(max_results=1), max_tasks=40,
                               workers=1, progress=False)
    kernels = results.best.graph
    assert all(t.op == "customized" for t in kernels.operators)  # graph-defined kernels only
    compiled: list[Any] = []
    real_compile = api.compile
    monkeypatch.setattr(api, "compile", lambda g, **o: compiled.append(real_compile(g, **o))
                        or compiled[-1])
    runner = runtime.make_runner(traced, kernels, {}, (x, w))
    (fn,) = compiled
    assert fn.strides == [None, (1, 64)]
    first = runner([x, w])
    launched: list[Any] = []
    real_launch = fn.module.launch
    monkeypatch.setattr(fn.module, "launch", lambda *ins: launched.append(ins)
                        or real_launch(*ins))
    second = runner([x, w])
    (ins,) = launched
    assert ins[0] is x  # as it is: the graph's (1, 64) is x's (1, 1, 64), row-major
    assert ins[1].data_ptr() == w.data_ptr() and ins[1].stride() == (1, 64)  # no copy
    torch.testing.assert_close(second[0], first[0])
    torch.testing.assert_close(second[0], f(x, w), rtol=2e-2, atol=2e-2)
    assert second[0].shape == (1, 1, 32)


def test_a_layout_the_lowering_refuses_is_copied_instead(monkeypatch: Any) -> None:
    """Where the lowering cannot read an input in place (``LowerError``: a fused combine that
    reads it), the runner compiles the μGraph for row-major inputs and copies the view at
    each call, as before: still right."""
    import egraph_mirage.api as api
    from egraph_mirage.errors import LowerError
    from egraph_mirage.fx import runtime
    from egraph_mirage.fx.trace import trace

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w.t())

    x, w = torch.randn(2, 64).half(), (torch.randn(32, 64) / 8).half()
    traced = trace(f, x, w)
    kernels = em.superoptimize(traced.graph, em.SearchConfig(max_results=1), max_tasks=40,
                               workers=1, progress=False).best.graph
    real_compile, asked = api.compile, []

    def refusing(g: em.KernelGraph, **options: Any) -> Any:
        asked.append(options.get("input_strides"))
        if options.get("input_strides"):
            raise LowerError("not supported")
        return real_compile(g, **options)

    monkeypatch.setattr(api, "compile", refusing)
    runner = runtime.make_runner(traced, kernels, {}, (x, w))
    assert asked == [(None, (1, 64)), None]
    for _ in range(2):  # the checked first call, then the direct one
        torch.testing.assert_close(runner([x, w])[0], f(x, w), rtol=2e-2, atol=2e-2)
