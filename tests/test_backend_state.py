"""Compiling leaves the model's state as it was: a graph that writes its inputs in place (a
static KV cache, a step counter, as transformers' ``StaticCache`` does) is run on them several
times while the backend compiles it (the partition records the pieces' inputs, the pieces are
checked), and the compiled call must still find the state the eager model would
(``fx.mutation.preserved``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import egraph_mirage as em
from egraph_mirage.fx.backend import Backend
from egraph_mirage.fx.mutation import written
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Step(torch.nn.Module):
    """A decode step with state: a counter advanced in place and a cache written at a position,
    then an RMSNorm and a projection of the cache (the piece the backend searches)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("cache", torch.randn(4, 16, generator=gen))
        self.w = torch.nn.Parameter(torch.randn(16, 16, generator=gen) / 4)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        self.cache.index_copy_(0, pos, x)
        h = torch.nn.functional.rms_norm(self.cache, (16,), eps=1e-6) @ self.w
        return torch.relu(h) * self.count


def test_a_compiled_step_finds_the_state_the_eager_step_would() -> None:
    """One compiled call advances the counter once and writes the cache once, as one eager
    call does, though compiling ran the graph on those very buffers; its output (scaled by the
    counter) matches eager's, and a second call too."""
    eager, model = Step(), Step()
    x = torch.randn(1, 16, generator=torch.Generator().manual_seed(1))
    pos = torch.tensor([2])
    backend = Backend(budget=None, max_tasks=4, rest="eager", cache=False, workers=1,
                      config=em.SearchConfig(max_results=1))
    fast = torch.compile(model, backend=backend, dynamic=False)
    with torch.no_grad():
        for step in (1, 2):
            want, got = eager(x, pos), fast(x, pos)
            assert float(model.count) == float(eager.count) == step
            torch.testing.assert_close(model.cache, eager.cache)
            torch.testing.assert_close(got, want)
    assert backend.reports and backend.reports[0].pieces  # the graph was cut and searched


def test_the_inputs_a_graph_writes_are_found() -> None:
    """``written``: the buffers a graph writes in place (through ``add_`` and ``index_copy_``)
    are its mutated inputs; the input read only and the parameter are not."""
    seen: list[set[int]] = []
    names: list[list[str]] = []

    def look(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.append(written(gm))
        names.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
        return gm

    with torch.no_grad():
        torch.compile(Step(), backend=look, dynamic=False)(torch.randn(1, 16), torch.tensor([0]))
    (found,), (places,) = seen, names
    assert sorted(places[i] for i in found) == sorted(
        p for p in places if "count" in p or "cache" in p)


def test_inductor_is_told_which_inputs_have_static_addresses(monkeypatch: Any) -> None:
    """The graph the backend hands Inductor (here with nothing replaced: the search may take
    no task) carries Dynamo's metadata: each input's source, and the buffer marked with a
    static address (as transformers' static cache marks its tensors) recorded so. From these
    Inductor takes the inputs whose addresses stay put; without them a graph that writes such
    a buffer in place ran without CUDA graphs under mode="reduce-overhead"."""
    import torch._inductor.compile_fx as inductor

    handed: list[torch.fx.GraphModule] = []

    def compile_fx(gm: torch.fx.GraphModule, example_inputs: Any, **kw: Any) -> Any:
        handed.append(gm)
        return gm

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    model = Step()
    torch._dynamo.mark_static_address(model.cache)
    backend = Backend(budget=None, rest="inductor", cache=False, workers=1,
                      search=lambda g, config, **o: SearchResults([], SearchStats()))
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(torch.randn(1, 16),
                                                             torch.tensor([0]))
    (gm,) = handed
    assert "dynamo_compile_id" in gm.meta
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert all(hasattr(n, "_dynamo_source") for n in places)
    static = [n.name for n in places
              if n.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")]
    assert any("cache" in name for name in static)  # and the parameter and the counter
    assert len(static) == len(places) - 2  # x and pos are not static


def test_a_replaced_pieces_counters_are_named_to_inductor_as_static_inputs(
        monkeypatch: Any) -> None:
    """Where Inductor launches a replaced piece's kernels, the piece's module holds its fused
    combines' counters as a buffer (``PieceCall.counters``), which Inductor lifts as an input.
    The graph handed to Inductor names a source for it (``ConstantSource``) beside Dynamo's
    own, so that Inductor still takes Dynamo's metadata (the static cache's static address)
    and the counters as a static input, and the piece's launch is passed the buffer. (This
    stand-in launch computes in numpy, so it cannot be traced into the graph on fake tensors,
    ``fx.rest.inlined``: its module stays in the graph; ``test_backend.py`` covers a launch
    traced in.)"""
    import torch._inductor.compile_fx as inductor

    from egraph_mirage.fx import backend as be

    handed: list[torch.fx.GraphModule] = []
    passed: list[Any] = []

    def compile_fx(gm: torch.fx.GraphModule, example_inputs: Any, **kw: Any) -> Any:
        handed.append(gm)
        return gm

    def make_inductor_launch(traced: Any, mugraph: Any, knobs: Any, xs: Any) -> Any:
        def launch(*args: Any, counters: Any = None) -> tuple[Any, ...]:
            passed.append(counters)
            return tuple(o.to(args[0].dtype) for o in traced.reference(*args))

        launch.counters = 8  # type: ignore[attr-defined]
        return launch

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    monkeypatch.setattr(be, "make_inductor_launch", make_inductor_launch)
    monkeypatch.setattr(be, "_on_gpu", lambda: True)
    class Written(Step):  # the cache written at a position (a step that runs twice alike)
        def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
            self.cache.index_copy_(0, pos, x)
            return torch.nn.functional.rms_norm(self.cache, (16,), eps=1e-6) @ self.w

    model = Written()
    torch._dynamo.mark_static_address(model.cache)
    backend = Backend(budget=None, rest="inductor", cache=False, workers=1, profile=False,
                      search=lambda g, config, **o: SearchResults(
                          [SearchResult(g, 1, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats()))
    with torch.no_grad():
        torch.compile(model, backend=backend, dynamic=False)(torch.randn(1, 16),
                                                             torch.tensor([0]))
    assert backend.reports[0].launch == "inductor"
    gm = handed[-1]  # the graph with the piece launched by Inductor
    (name,) = [n for n, _ in gm.named_buffers() if n.endswith(".counters")]
    from torch._subclasses.fake_tensor import FakeTensor

    real = [c for c in passed if not isinstance(c, FakeTensor)]  # not the tries to trace it
    assert real and all(c is dict(gm.named_buffers())[name] for c in real)
    source = gm._param_name_to_source[name]
    assert source.name == f"egraph_mirage:{name}"
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert all(hasattr(n, "_dynamo_source") for n in places)
    static = [n for n in places if n.meta.get("tensor_dict", {}).get("_dynamo_static_input_type")]
    assert len(static) == len(places) - 2  # the cache and the weight; x and pos are not static
