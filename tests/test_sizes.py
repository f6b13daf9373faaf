"""Structure apart from sizes: a μGraph re-sized keeps computing the program (``mugraph.sizes``,
``rank.size_variants``). The reference forms of ``bench/fixtures.py`` serve as inputs: their tile
caps
are exactly what re-sizing changes."""

from __future__ import annotations

import importlib
import math

import pytest

from egraph_mirage import benchmarks
from egraph_mirage.bench import handwritten_fixtures as fixtures
from egraph_mirage.errors import EMError, GraphError, MapError
from egraph_mirage.mugraph import sizes
from egraph_mirage.rank.size_variants import size_variants
from egraph_mirage.verify import Verifier

FORMS = [(name, build) for name, builds in fixtures.BUILDERS.items() for build in builds]


@pytest.mark.parametrize("name,build", FORMS, ids=[f"{n}-{b.__name__}" for n, b in FORMS])
def test_every_size_choice_computes_the_program(name: str, build) -> None:
    g = benchmarks.get(name, small=True)
    try:
        h = build(g)
    except EMError:
        pytest.skip(f"{build.__name__} does not fit {name}'s small shapes")
    variants = sizes.size_choices(h)
    assert variants[0] is h
    check = Verifier(g, backend="numpy").check
    for v in variants:
        assert check(v).equivalent, sizes.sizes_of(v)


def test_a_split_form_gets_more_pieces_and_its_combine_walks_them() -> None:
    g = benchmarks.get("gqa", batch=1)
    h = fixtures.attention(g)
    (k1, _) = sizes.sizes_of(h)
    more = sizes.with_caps(h, sizes.Caps(grid=64, loop=64, splits=16))
    (m1, m2) = sizes.sizes_of(more)
    assert m1.grid[1] == 16 != k1.grid[1]  # the split axis cuts the keys into 16 pieces
    assert m2.frange == 16  # the combine's loop walks every piece


def test_resize_keeps_the_structure_and_refuses_sizes_that_do_not_fit() -> None:
    g = benchmarks.get("rmsnorm_linear", small=True)
    h = fixtures.rmsnorm_linear(g)
    (k,) = sizes.sizes_of(h)
    again = sizes.resize(h, [k])
    assert sizes.sizes_of(again) == (k,)
    assert Verifier(g, backend="numpy").check(again).equivalent
    with pytest.raises(MapError, match="kernel sizes"):
        sizes.resize(h, [k, k])
    with pytest.raises(EMError):
        sizes.resize(h, [sizes.KernelSizes((7, 1, 1), k.frange)])  # 7 does not divide


def test_size_variants_verifies_and_orders_by_cost() -> None:
    g = benchmarks.get("gqa", small=True)
    h = fixtures.attention(g)
    out = size_variants(h, g, limit=3)
    assert out[0] is h and 1 <= len(out) <= 3
    check = Verifier(g, backend="numpy").check
    assert all(check(v).equivalent for v in out)
    with pytest.raises(GraphError, match="limit"):
        size_variants(h, g, limit=0)


def test_size_variants_checked_in_worker_processes_are_the_same_in_the_same_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where one check is long (a large program at its real sizes), the other variants are
    checked in worker processes, a batch at a time; what comes back does not change. Here
    every check counts as long, so the workers check all but the first."""
    from egraph_mirage.mugraph.serialize import dumps
    from egraph_mirage.rank import size_variants as rank_sizes

    g = benchmarks.get("gqa", small=True)
    h = fixtures.attention(g)
    alone = size_variants(h, g, limit=6)
    monkeypatch.setattr(rank_sizes, "PARALLEL_AFTER_S", -1.0)
    shared = size_variants(h, g, limit=6, workers=2)
    assert len(alone) > 3
    assert [dumps(v) for v in shared] == [dumps(v) for v in alone]
    # where no second check fits in memory, the rest are checked one by one
    verify_module = importlib.import_module("egraph_mirage.verify.verify")  # not the function

    monkeypatch.setattr(verify_module, "_available_memory", lambda: 0)
    assert rank_sizes._workers_that_fit(g) == 1
    short = size_variants(h, g, limit=6, workers=2)
    assert [dumps(v) for v in short] == [dumps(v) for v in alone]


def test_as_many_checking_workers_as_fit_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program at its real sizes takes gigabytes per checking process: the workers are as
    many as fit in ``verify.CHECK_MEMORY_SHARE`` of the available memory (mha at b = 16: about
    10 GB each)."""
    from egraph_mirage.rank import size_variants as rank_sizes
    verify_module = importlib.import_module("egraph_mirage.verify.verify")  # not the function

    g = benchmarks.get("mha", batch=16)
    elements = sum(math.prod(t.dims) for t in [*g.inputs, *g.operators])
    per = verify_module.CHECK_BASE_BYTES + verify_module.CHECK_BYTES_PER_ELEMENT * elements
    assert 8e9 < per < 12e9
    monkeypatch.setattr(verify_module, "_available_memory", lambda: 128 << 30)  # a GPU host's
    assert rank_sizes._workers_that_fit(g) == int(0.6 * (128 << 30) // per) == 8
    monkeypatch.setattr(verify_module, "_available_memory", lambda: None)  # not Linux
    assert rank_sizes._workers_that_fit(g) > 1000


def test_a_gpus_shared_memory_lets_larger_tiles_through() -> None:
    """The search's blocks keep to its budget of shared memory (96 KB, every tile counted);
    sized for one GPU (``with_smem``: an H100 lets a block take 227 KB), a structure also gets
    the larger tiles that budget refused, and each set of sizes comes once."""
    g = benchmarks.get("mqa")
    h = fixtures.attention(g)
    own = [sizes.sizes_of(v) for v in sizes.size_choices(h)]
    more = sizes.size_choices(h, sizes.with_smem(sizes.DEFAULT_CAPS, 227 * 1024))
    gpu = [sizes.sizes_of(v) for v in more]
    assert len(set(gpu)) == len(gpu) and set(own) < set(gpu)
    new = [v for v, s in zip(more, gpu) if s not in own]
    assert all(max(k.tb.smem_usage() for k in sizes.kernels(v)) > 96 * 1024 for v in new)


def test_resized_forms_keep_their_structure_and_other_forms_differ() -> None:
    g = benchmarks.get("gqa", batch=1)
    split, one = fixtures.attention(g), fixtures.attention_one_kernel(g)
    assert sizes.structure_of(split) != sizes.structure_of(one)
    for v in sizes.size_choices(split)[:4]:
        assert sizes.structure_of(v) == sizes.structure_of(split)


def test_the_search_takes_one_size_per_structure_unless_asked() -> None:
    from egraph_mirage.search.config import SearchConfig, SearchError
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import Context
    from egraph_mirage.search.tiling import structure

    g = benchmarks.get("rmsnorm_linear", small=True)
    one = Context(prepare(g, SearchConfig()))
    every = Context(prepare(g, SearchConfig(sizes_per_structure=None)))
    keys = [structure(ks, one.payload.config) for ks in one.first_shapes]
    assert len(keys) == len(set(keys))
    assert len(every.first_shapes) > len(one.first_shapes)
    assert {structure(ks, every.payload.config) for ks in every.first_shapes} == set(keys)
    with pytest.raises(SearchError, match="sizes_per_structure"):
        SearchConfig(sizes_per_structure=0)


@pytest.mark.parametrize("name", sorted(fixtures.BUILDERS))
def test_one_search_serves_every_batch(name: str) -> None:
    """A form built for batch 1, retargeted to batch 8's shapes, computes the batch-8 program
    (where its tiles fit: a dimension no grid axis cuts grows inside the tiles)."""
    g1, g8 = benchmarks.get(name, batch=1, small=True), benchmarks.get(name, batch=8, small=True)
    assert [t.dims for t in g1.inputs] != [t.dims for t in g8.inputs]
    check = Verifier(g8, backend="numpy").check
    fitted = 0
    for h in fixtures.variants(name, g1):
        try:
            r = sizes.retarget(h, g8)
        except EMError:
            continue
        assert [t.dims for t in r.inputs] == [t.dims for t in g8.inputs]
        assert len(sizes.kernels(r)) == len(sizes.kernels(h))
        assert check(r).equivalent, name
        fitted += 1
    assert fitted >= 1


def test_retarget_names_the_input_that_differs() -> None:
    g = benchmarks.get("lora", small=True)
    h = fixtures.variants("lora", g)[0]
    other = benchmarks.get("rmsnorm_linear", small=True)
    with pytest.raises(MapError, match="inputs"):
        sizes.retarget(h, other)
    g16 = benchmarks.get("gated_mlp", batch=1, small=True)
    with pytest.raises(MapError, match="input 1"):
        sizes.retarget(fixtures.variants("gated_mlp", g16)[0],
                       _with_dtype(g16, 1, "float32"))


def _with_dtype(g, position: int, dtype: str):
    """``g``'s inputs as a new program with one input's dtype changed (its body: the inputs'
    sum is enough, only the inputs are read)."""
    from egraph_mirage import new_kernel_graph
    from egraph_mirage.dtypes import DType

    h = new_kernel_graph()
    xs = [h.new_input(t.dims, DType[dtype] if i == position else t.dtype)
          for i, t in enumerate(g.inputs)]
    h.mark_output(xs[0])
    return h


def _batched_matmul(batch: int):
    """``X @ W`` on a batch of ``batch``: X (batch, 32, 16), W (batch, 16, 8)."""
    from egraph_mirage.graph import new_kernel_graph

    g = new_kernel_graph()
    X, W = g.new_input((batch, 32, 16)), g.new_input((batch, 16, 8))
    g.mark_output(g.matmul(X, W))
    return g


def test_a_batch_of_one_that_grows_goes_on_a_free_grid_axis() -> None:
    """Found at batch 1, a kernel may leave the batch dimension to no grid axis (it has one
    index). Retargeted to batch 4, that dimension takes a grid axis the kernel does not use,
    one index per block, so each block computes what it did at batch 1."""
    from egraph_mirage.mugraph import new_threadblock_graph

    g1, g4 = _batched_matmul(1), _batched_matmul(4)
    from egraph_mirage.graph import new_kernel_graph

    h = new_kernel_graph()
    X, W = h.new_input((1, 32, 16)), h.new_input((1, 16, 8))
    tb = new_threadblock_graph(grid_dim=(4, 1, 1), forloop_range=2)
    x = tb.new_input(X, (1, -1, -1), forloop_dim=2)
    w = tb.new_input(W, (-1, -1, -1), forloop_dim=1)
    tb.new_output(tb.forloop_accum(tb.matmul(x, w)), (1, -1, -1))
    (O,) = h.customized([X, W], tb)
    h.mark_output(O)
    assert Verifier(g1, backend="numpy").check(h).equivalent
    r = sizes.retarget(h, g4)
    (kernel,) = sizes.kernels(r)
    assert kernel.tb.grid_dim[1] == 4  # the batch, one index per block
    assert [ld.params["input_map"][1] for ld in kernel.tb.inputs] == [0, 0]
    assert kernel.tb.outputs[0][1][1] == 0
    assert [t.dims[0] for t in kernel.tb.inputs] == [1, 1]  # the block graph as at batch 1
    assert Verifier(g4, backend="numpy").check(r).equivalent


def _split_k_with_norm_in_combine(x_dims: tuple[int, int], w_dims: tuple[int, int]):
    """rmsnorm_linear's split-K form as the search writes it: kernel 1 (grid: 4 pieces of the
    contraction x 2 column tiles) writes partial products; kernel 2 walks the pieces and, in
    the same 4 steps, X's columns for the root mean square, then divides."""
    from egraph_mirage.graph import new_kernel_graph
    from egraph_mirage.mugraph import new_threadblock_graph

    h = new_kernel_graph()
    X, W = h.new_input(x_dims), h.new_input(w_dims)
    tb = new_threadblock_graph(grid_dim=(4, 2, 1), forloop_range=2)
    x = tb.new_input(X, (1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, (0, 1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(x, w)), (0, 1, -1))
    (P,) = h.customized([X, W], tb)
    tb = new_threadblock_graph(grid_dim=(1, 2, 1), forloop_range=4)
    rms = tb.forloop_accum(tb.new_input(X, (-1, -1, -1), forloop_dim=1), "rms")
    total = tb.forloop_accum(tb.new_input(P, (-1, 1, -1), forloop_dim=0))
    tb.new_output(tb.div(total, rms), (-1, 1, -1))
    (O,) = h.customized([X, P], tb)
    h.mark_output(O)
    return h


def test_a_combine_walks_one_piece_per_step_at_every_size_and_batch() -> None:
    """The combine's loop walks the first kernel's pieces and X together: resized or retargeted
    to more rows, it still takes one piece (all of its rows) per step, however many pieces
    the first kernel now writes, and every size choice computes the program."""
    g2 = benchmarks.get("rmsnorm_linear", 1, small=True)
    h = _split_k_with_norm_in_combine(*(t.dims for t in g2.inputs))
    assert Verifier(g2, backend="numpy").check(h).equivalent
    g16 = benchmarks.get("rmsnorm_linear", 8, small=True)
    r = sizes.retarget(h, g16)
    check = Verifier(g16, backend="numpy").check
    assert check(r).equivalent
    choices = sizes.size_choices(r)
    assert len(choices) > 4
    for c in choices:
        first, combine = sizes.sizes_of(c)
        assert combine.frange == first.grid[0]  # one piece per step
        assert check(c).equivalent, sizes.sizes_of(c)
