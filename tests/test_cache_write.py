"""A static cache's in-place write of the new token (``fx.cache_writes``, ``lower.writes``):
the K and V a decode step computes are written into the layer's caches with ``index_copy_`` at a
position held in a tensor, as transformers' ``StaticCache`` writes them. The write joins the
piece computing K and V (nothing is left out), and the replaced piece's kernels store the new
token into the caches themselves: the caches after a compiled call are eager's, also at a
position that moved between calls (read on the device at every call)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import egraph_mirage as em  # noqa: E402
import egraph_mirage.fx.backend  # noqa: E402  (registers the backend by name)
from egraph_mirage.fx import partition  # noqa: E402
from egraph_mirage.fx.report import REPLACED, reports_of  # noqa: E402
from egraph_mirage.fx.trace import trace_fx  # noqa: E402
from egraph_mirage.gpu.torch_eval import relative_error  # noqa: E402

HIDDEN, HEADS, HEAD_DIM, CACHE = 64, 2, 16, 8
#: the backend on the CPU (Triton's interpreter, nothing timed: every winner that matches is
#: used); on a GPU the winners are timed against Inductor's code, and the GPU test below runs
on_the_cpu = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the CPU's backend (on a GPU: the GPU test)")


class KVStep(torch.nn.Module):
    """A decode step's key and value projections written into static caches, then attention
    over the caches for a query given. ``style``: the write as transformers' ``StaticCache``
    makes it (``index_copy_``), or as a slice assignment ``cache[:, :, position] = k``."""

    def __init__(self, style: str = "index_copy_") -> None:
        super().__init__()
        self.style = style
        torch.manual_seed(0)
        self.k_proj = torch.nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False).half()
        self.v_proj = torch.nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False).half()

    def forward(self, x: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        k = self.k_proj(x).view(b, 1, HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_proj(x).view(b, 1, HEADS, HEAD_DIM).transpose(1, 2)
        if self.style == "index_copy_":
            k_cache.index_copy_(2, position, k)
            v_cache.index_copy_(2, position, v)
        else:
            k_cache[:, :, position] = k
            v_cache[:, :, position] = v
        return torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache)


def _inputs(position: int = 5) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    return ((torch.randn(1, HIDDEN, generator=gen) / 4).half(),
            (torch.randn(1, HEADS, 1, HEAD_DIM, generator=gen)).half(),
            (torch.randn(1, HEADS, CACHE, HEAD_DIM, generator=gen)).half(),
            (torch.randn(1, HEADS, CACHE, HEAD_DIM, generator=gen)).half(),
            torch.tensor([position]))


def _options(tmp_path: Path, **more: object) -> dict[str, object]:
    """The backend's options for these tests: 40 tasks a piece, no time budget, one worker,
    the rest eager (``more`` overrides)."""
    return {"max_tasks": 40, "workers": 1, "rest": "eager", "budget": None,
            "config": em.SearchConfig(max_results=1), "cache_dir": str(tmp_path), **more}


def _compiled(model: torch.nn.Module, options: dict[str, object]) -> object:
    torch._dynamo.reset()
    return torch.compile(model, backend="egraph_mirage", dynamic=False, options=options)


def _step(model: object, compiled: object, device: str = "cpu") -> tuple[object, ...]:
    """One step of ``model`` and of ``compiled``, each on its own fresh inputs (the caches
    are written): (eager's inputs, compiled's inputs, eager's output, compiled's output)."""
    want_in = tuple(x.to(device) for x in _inputs())
    got_in = tuple(x.to(device) for x in _inputs())
    with torch.no_grad():
        return want_in, got_in, model(*want_in), compiled(*got_in)  # type: ignore[operator]


def _matches(want_in: tuple[torch.Tensor, ...], got_in: tuple[torch.Tensor, ...],
             want: torch.Tensor, got: torch.Tensor) -> None:
    """The compiled step's output and both caches within 1e-2 of eager's."""
    assert relative_error(got, want) < 1e-2
    for c in (2, 3):
        assert relative_error(got_in[c], want_in[c]) < 1e-2


def _written(report: object) -> list[str]:
    """What the replaced pieces write, as the report says, sorted."""
    return sorted(p.writes for p in report.pieces  # type: ignore[attr-defined]
                  if p.status == REPLACED and p.writes)


STYLES = pytest.mark.parametrize("style", ["index_copy_", "slice assignment"])


@STYLES
def test_the_cache_write_joins_the_piece_computing_the_new_token(style: str) -> None:
    """Exported, ``index_copy_`` is ``index_put`` and a ``copy_`` back: both join the piece
    of the projection computing the new token (here one piece each for K and V, which share
    no node), which writes its cache input and returns it (what attention reads); its kernel
    graph computes the new K or V, and records where it goes. A slice assignment exports the
    same way, its value viewed without the leading dim of 1 (put as the cache's shape)."""
    model = KVStep(style)
    parts = partition(model, _inputs())
    assert dict(parts.left_out) == {}
    assert [(p.matmuls, sum(n.startswith("index_put") for n in p.nodes))
            for p in parts.pieces] == [(1, 1), (1, 1), (2, 0)]  # K, V, attention
    for piece, cache in zip(parts.pieces, ("k_cache", "v_cache")):
        traced = trace_fx(piece.module, piece.example_inputs)
        (w,) = traced.writes
        assert (traced.placeholders[w.dest], traced.placeholders[w.index], w.dim, w.shape,
                w.returned_at) == (cache, "position", 2, (1, HEADS, 1, HEAD_DIM), 0)
        assert traced.outputs == ()  # the new token is only written: no fx output


@on_the_cpu
@pytest.mark.parametrize("style, rest", [("index_copy_", "eager"), ("index_copy_", "inductor"),
                                         ("slice assignment", "eager")])
def test_the_replaced_piece_writes_the_caches_from_its_kernels(tmp_path: Path, style: str,
                                                               rest: str) -> None:
    """The replaced pieces' operators write the caches (each declares the input it writes:
    functionalized and put back in place where Inductor compiles the rest)."""
    model = KVStep(style)
    compiled = _compiled(model, _options(tmp_path, rest=rest))
    want_in, got_in, want, got = _step(model, compiled)
    (report,) = reports_of(compiled)
    print(report.text())
    assert _written(report) == ["k_cache by its kernels", "v_cache by its kernels"]
    _matches(want_in, got_in, want, got)
    for c in (2, 3):  # the caches: the new token at position 5, the rest untouched
        keep = [p for p in range(CACHE) if p != 5]
        assert torch.equal(got_in[c][:, :, keep], _inputs()[c][:, :, keep])
    # the next step: the position tensor advanced in place (as ``cache_position`` is)
    for xs in (want_in, got_in):
        xs[4].fill_(6)
    with torch.no_grad():
        want, got = model(*want_in), compiled(*got_in)
    assert relative_error(got, want) < 1e-2
    for c in (2, 3):
        assert relative_error(got_in[c][:, :, 6], want_in[c][:, :, 6]) < 1e-2


@on_the_cpu
def test_where_the_lowering_cannot_store_it_torch_writes_the_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A winner whose kernels cannot store the write (the lowering refuses it: the new token
    computed by a library operator, not a kernel) still writes the caches, with torch after
    its kernels; the report says so."""
    from egraph_mirage.errors import LowerError
    from egraph_mirage.lower import triton_program

    def refused(writes: tuple[object, ...], outputs: object) -> dict[int, int]:
        if writes:
            raise LowerError("output write: refused here")
        return {}

    monkeypatch.setattr(triton_program, "checked", refused)
    model = KVStep()
    compiled = _compiled(model, _options(tmp_path))
    want_in, got_in, want, got = _step(model, compiled)
    (report,) = reports_of(compiled)
    assert _written(report) == ["k_cache by torch", "v_cache by torch"]
    _matches(want_in, got_in, want, got)


@pytest.mark.gpu
def test_on_a_gpu_inductor_launches_the_writing_kernels_without_copying_the_caches(
        tmp_path: Path) -> None:
    """On a GPU the replaced pieces' kernels are traced into Inductor's graph
    (``launch="inductor"``): the kernels writing a cache are functionalized and put back in
    place, so the caches come out as eager's, and no kernel copies a whole cache (a copy of
    the cache would cost more than the write saves). Winners are not timed (``profile``
    off: at these sizes Inductor's code is faster), so that they are used."""
    from torch.profiler import ProfilerActivity, profile

    model = KVStep().cuda()
    compiled = _compiled(model, {"max_tasks": 40, "budget": None, "profile": False,
                                 "config": em.SearchConfig(max_results=1),
                                 "cache_dir": str(tmp_path)})
    want_in, got_in, want, got = _step(model, compiled, "cuda")
    (report,) = reports_of(compiled)
    print(report.text())
    _matches(want_in, got_in, want, got)
    assert report.launch == "inductor"
    assert _written(report) == ["k_cache by its kernels", "v_cache by its kernels"]
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        compiled(*got_in)
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages()]
    print(names)
    assert not any("copy" in n.lower() or "clone" in n.lower() for n in names), names
    for xs in (want_in, got_in):  # the next step, the position advanced in place
        xs[4].fill_(6)
    with torch.no_grad():
        want, got = model(*want_in), compiled(*got_in)
    _matches(want_in, got_in, want, got)


def test_a_piece_traced_into_the_graph_returns_the_cache_it_writes_in_its_place() -> None:
    """Traced into the graph handed to Inductor (``fx.rest.inlined``), a replaced piece that
    writes a cache gives its users what its module would: its kernels' outputs, and the
    written cache where the module returned it (what attention reads)."""
    import operator

    from egraph_mirage.fx.rest import inlined
    from egraph_mirage.fx.runtime import PieceCall
    from egraph_mirage.fx.traced import CacheWrite

    class Op:  # stands in for a PieceOp
        __call__ = staticmethod(lambda xs: [xs[0] * 3])

    def launch(x: torch.Tensor, cache: torch.Tensor, position: torch.Tensor
               ) -> tuple[torch.Tensor, ...]:  # stands in for the kernels' launch
        cache.index_copy_(0, position, x * 2)
        return (x * 3,)

    write = CacheWrite(output=1, shape=(1, 4), dest=1, index=2, dim=0, returned_at=0)
    root = torch.nn.Module()
    root.egm_0 = PieceCall(Op(), launch, writes=[write])  # type: ignore[arg-type]
    graph = torch.fx.Graph()
    x, cache, position = (graph.placeholder(n) for n in ("x", "cache", "position"))
    examples = (torch.ones(1, 4), torch.zeros(3, 4), torch.tensor([1]))
    for node, value in zip((x, cache, position), examples, strict=True):
        node.meta["val"] = value
    call = graph.call_module("egm_0", (x, cache, position))
    written, y = (graph.call_function(operator.getitem, (call, k)) for k in (0, 1))
    graph.output((graph.call_function(torch.sum, (written,)), y))
    flat, _ = inlined(torch.fx.GraphModule(root, graph))
    assert not any(n.op == "call_module" for n in flat.graph.nodes)
    total, got = flat(*(t.clone() for t in examples))
    assert total.item() == 8.0 and torch.equal(got, torch.full((1, 4), 3.0))


@on_the_cpu
def test_a_cached_winner_is_checked_again_before_it_is_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second compilation takes the pieces' decisions from the cache, and each cached
    winner is checked against eager again (the caches it writes included) before it replaces
    its piece: one that no longer matches is kept, and the report says why."""
    from egraph_mirage.fx import backend

    model = KVStep()
    _step(model, _compiled(model, _options(tmp_path)))
    checked: list[float] = []

    def wrong(*args: object) -> float:  # as if the cached winner computed something else
        checked.append(1.0)
        return 1.0

    monkeypatch.setattr(backend, "piece_error", wrong)
    compiled = _compiled(model, _options(tmp_path))
    want_in, got_in, want, got = _step(model, compiled)
    (report,) = reports_of(compiled)
    hits = [p for p in report.pieces if p.cache == "hit" and p.reason.startswith(
        "the cached μGraph differs from eager")]
    assert len(hits) == 2 and len(checked) == 2
    assert not any(p.status == REPLACED for p in report.pieces)
    _matches(want_in, got_in, want, got)


def test_the_graph_check_compares_the_caches_written_too() -> None:
    """The check of a graph whose pieces Inductor launches against Dynamo's graph
    (``fx.checks.graph_error``) runs each on its own copies of the inputs the graph writes and
    compares those too: a cache written at the wrong position fails it though every output
    matches, and the example inputs are left as they were."""
    from egraph_mirage.fx.checks import graph_error

    class Write(torch.nn.Module):
        def forward(self, x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor
                    ) -> torch.Tensor:
            cache.index_copy_(0, pos, x)
            return x * 2

    gm = torch.fx.symbolic_trace(Write())
    xs = (torch.ones(1, 4), torch.zeros(3, 4), torch.tensor([1]))

    def right(x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache[1] = x[0]
        return x * 2

    def wrong(x: torch.Tensor, cache: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache[2] = x[0]
        return x * 2

    assert graph_error(right, gm, xs)[0] == 0.0
    assert graph_error(wrong, gm, xs)[0] >= 1.0
    assert not xs[1].any()


class ComputedPosition(KVStep):
    """``KVStep`` with the position computed in the graph from a start, as ``generate()``'s
    graphs compute ``cache_position`` (an ``arange`` plus the length so far)."""

    def forward(self, x: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor,  # type: ignore[override]
                v_cache: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return super().forward(x, q, k_cache, v_cache, torch.arange(1) + start)


@on_the_cpu
def test_a_position_the_graph_computes_goes_into_the_piece_as_an_input(tmp_path: Path
                                                                        ) -> None:
    """The position computed outside the piece, from nothing the piece computes, becomes one
    of its inputs: the write still joins the piece, and its kernels store the new token."""
    model = ComputedPosition()
    parts = partition(model, _inputs())
    assert [sum(n.startswith("index_put") for n in p.nodes) for p in parts.pieces] == [1, 1, 0]
    assert set(dict(parts.left_out)) == {"arange", "add"}  # the position's own computation
    compiled = _compiled(model, _options(tmp_path))
    want_in, got_in, want, got = _step(model, compiled)
    (report,) = reports_of(compiled)
    assert _written(report) == ["k_cache by its kernels", "v_cache by its kernels"]
    _matches(want_in, got_in, want, got)
