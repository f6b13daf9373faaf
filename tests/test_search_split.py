"""Split forms: the search finds split-KV attention with a combine the lowering fuses into the
split kernel's last block, early in task order.

Three things had kept those forms out of reach, each tested here: two tiles with one abstract
expression but different dimension classes were taken for one (``V @ E`` and ``E @ V`` of square
tiles), a grid axis that leaves each block one index of a class lost that class in the partial
results it wrote, and a combine that reads only the partial results was pruned because the
program's inputs, loaded beside them, were unused.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from model_programs import folded_decode_attention

import egraph_mirage as em
from egraph_mirage.lower import fuse
from egraph_mirage.ops import OPS
from egraph_mirage.search import SearchConfig
from egraph_mirage.search import dims as dims_mod
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.tasks import (
    BESIDE,
    SPLIT,
    Context,
    TaskResult,
    dispatch_order,
    list_tasks,
    run_task,
)
from egraph_mirage.search.tiling import KernelShape, kernel_shapes, split_of

#: split tasks of 5 operators a small search may run before the test gives up
MAX_TASKS = 30


def _fused_split(g: em.KernelGraph) -> bool:
    """Two graph-defined kernels, the second combining the first's partial results in a way the
    lowering runs inside the first (``lower.fuse.plan``)."""
    kernels = [t for t in g.operators if t.op == "customized" and t.params["output"] == 0]
    return len(kernels) == 2 and bool(fuse.plan(g))


def _first_kernel_ops(g: em.KernelGraph) -> list[str]:
    first = next(t for t in g.operators if t.op == "customized")
    return [b.op for b in first.params["kernel"].tb.tensors]


def test_split_kv_attention_is_discovered_with_a_fusable_combine() -> None:
    """The split tasks of 5 operators (kernel 1: exp(Q K) V and the row sums of exp(Q K) over
    its piece of the keys; kernel 2 adds the pieces and divides) of gqa at small shapes, in task
    order: one of the first ``MAX_TASKS`` finds split-KV attention with a fusable combine."""
    g = em.benchmarks.get("gqa", small=True)
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    tasks = [t for t in list_tasks(payload, ctx) if t.kind == SPLIT and t.ops == (5, 5)]
    for task in tasks[:MAX_TASKS]:
        found = [em.loads(f[0]) for f in run_task(payload, task, ctx=ctx).found]
        split = [h for h in found if _fused_split(h) and "exp" in _first_kernel_ops(h)
                 and _first_kernel_ops(h).count("matmul") == 2]
        if split:
            assert em.verify(g, split[0], tests=4, seed=5).equivalent
            assert em.check_numerics(split[0], g) < 1e-6
            return
    pytest.fail(f"no split-KV form in the first {MAX_TASKS} split tasks of 5 operators")


def _keeps_grid(b: KernelShape, a: KernelShape) -> bool:
    """Each grid axis of ``b`` keeps ``a``'s axis (same class, same count, same position) or
    is 1: what ``lower.fuse`` needs to run ``b`` in ``a``'s last block of each group."""
    return all(gb == 1 or (gb == ga and cb == ca)
               for gb, cb, ga, ca in zip(b.grid, b.axis_classes, a.grid, a.axis_classes))


def test_a_combine_keeps_the_split_kernels_grid_and_walks_its_pieces() -> None:
    g = em.benchmarks.get("gqa", small=True)
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    task = next(t for t in list_tasks(payload, ctx) if t.kind == SPLIT and t.ops == (5, 5))
    first = ctx.first_shapes[task.index]
    res = run_task(payload, task, ctx=ctx)
    assert res.counts["states"] > 0
    # the shapes a combine may take over the split kernel's outputs
    from egraph_mirage.search.tasks import _Run

    run = _Run(ctx, None)
    seen = 0
    for tensors, _ in itertools.islice(run.intermediates(first, list(payload.inputs), [],
                                                         task.ops, True), 20):
        for shape in kernel_shapes(tensors, payload.config, keep=first):
            seen += 1
            assert _keeps_grid(shape, first)
            assert shape.frange == 1 or split_of(shape.loop_class) is not None or any(
                split_of(c) == (shape.loop_class, shape.frange)
                for t in tensors for c in t.dcls)
    assert seen


@pytest.mark.parametrize("name", em.benchmarks.names())
def test_a_benchmark_programs_combine_keeps_split_combines_operators(name: str) -> None:
    """A split's combine is searched with ``SPLIT_COMBINE`` operators, or one more than the
    program's tail after its last matmul or reduction where that is longer
    (``Context.combine_ops``; a projection's RoPE: ``test_search_unseen.py``). The eight
    programs' tails are at most one operator (LoRA's add, the gated MLP's mul), so their
    searches are unchanged by it."""
    from egraph_mirage.search.tasks import SPLIT_COMBINE, tail

    after = tail(em.benchmarks.get(name, small=True))
    assert len(after) <= 1 and 1 + len(after) <= SPLIT_COMBINE


#: operand dims probed at full size and shrunk (sizes above ``dims.SMALL`` replaced)
_DIMS = [[(1, 64, 64), (1, 64, 64)], [(2, 96, 64), (2, 64, 128)], [(1, 64, 1), (1, 64, 64)],
         [(64, 128)], [(1, 32, 128)], [(8, 64), (64, 96)], [(128,), (128,)], [(16, 96), (96,)]]


def _params(spec, dims):
    if "dim" in spec.params:
        return [{"dim": d} for d in range(len(dims[0]))]
    if "scalar" in spec.params:
        return [{"scalar": 2.0}]
    if "dtype" in spec.params:
        return [{"dtype": "bfloat16"}]
    if "normalized_shape" in spec.params:
        return [{"normalized_shape": (dims[0][-1],)}]
    return [{}] if not spec.params else []


def test_links_are_probed_the_same_at_small_sizes() -> None:
    probed = 0
    for name, spec in OPS.items():
        for dims in _DIMS:
            if not spec.num_inputs[0] <= len(dims) <= spec.num_inputs[1]:
                continue
            for params in _params(spec, dims):
                try:
                    spec.shape(name, [list(d) for d in dims], params)
                except em.EMError:
                    continue
                small, small_params = dims_mod._shrunk(list(dims), params)
                assert all(s <= dims_mod.SMALL + 4 for d in small for s in d)
                assert (dims_mod._probe(name, small, small_params)
                        == dims_mod._probe(name, list(dims), params)), (name, dims, params)
                probed += 1
    assert probed > 50


def test_mqa_at_b16_is_within_the_search_and_a_larger_program_is_refused_by_name() -> None:
    """Links are probed at small sizes, but candidates are checked at the program's own sizes,
    so the search takes operators of up to ``PROBE_LIMIT`` elements: MQA at b = 16 (16 × 1,024
    × 4,096 scores, one operator over 2**27 elements) gets its dimension classes; a larger
    operator is refused by name before any work."""
    big = em.benchmarks.get("mqa", batch=16)
    assert max(_elements(t.op, big) for t in big.operators) > 2**27
    ins, outs = dims_mod.dim_classes(big, dims_mod.LinkProbe())
    assert len(ins) == 3 and outs[0][0] is not None
    rows = dims_mod.PROBE_LIMIT // 256
    with pytest.raises(em.EMError, match=rf"slice_last of shapes \[\({rows}, 512\)\].*can take"):
        dims_mod.LinkProbe().links("slice_last", [(rows, 512)], {"start": 0, "stop": 256})


def _elements(op: str, g: em.KernelGraph) -> int:
    """The elements of ``g``'s largest operator of kind ``op`` (operands and result)."""
    import math

    return max((sum(math.prod(a.dims) for a in t.operands) + math.prod(t.dims)
                for t in g.operators if t.op == op), default=0)


@pytest.mark.parametrize("name, ops, beside", [("rmsnorm_linear", 5, False),
                                               ("rmsnorm_linear", 5, True), ("gqa", 4, False)])
def test_partial_goal_distances_lose_no_first_kernel(name: str, ops: int, beside: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A split task's first kernel is pruned by goal distances to the tiles it may write (the
    partials, and in a beside task the results beside them): it writes exactly what the plain
    walk's first kernels write, in fewer states."""
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import Context, _Run

    payload = prepare(em.benchmarks.get(name, small=True), SearchConfig(max_block_ops=ops))
    ctx = Context(payload)

    def first_kernels() -> tuple[set[object], int]:
        found, states = set(), 0
        for i in ctx.split_shapes:
            for k in range(2, ops + 1):  # one run per split task
                run = _Run(ctx, None)
                for tensors, steps in run.intermediates(ctx.first_shapes[i],
                                                        list(payload.inputs), [], (k, k), True,
                                                        beside=beside):
                    # what the kernel writes (the walk keeps one block graph per set of
                    # output classes, which one depends on the order of the walk)
                    found.add((i, k, tuple(tensors)))
                states += run.counters.states
        return found, states

    pruned, pruned_states = first_kernels()
    search = _Run._search

    def without_goal(self: _Run, *args: object, **kw: object) -> object:
        kw["goal_tiles"] = None
        return search(self, *args, **kw)

    monkeypatch.setattr(_Run, "_search", without_goal)
    plain, plain_states = first_kernels()
    assert plain and pruned == plain
    assert pruned_states < plain_states


def test_split_k_whose_combine_reads_per_piece_sums_of_squares_is_discovered() -> None:
    """RMSNorm + Linear split along the hidden dimension: kernel 1 writes each piece's partial
    products X @ W and, beside them, each piece's sums of squares of X (a tile without W's
    column class, written once per column block); kernel 2 sums both over the pieces, divides
    by the hidden size (``div_count``) and never reads X again. The beside tasks of 4 operators,
    in task order, find it; it is exact, and its lowering (fused combine or two launches)
    matches the program in Triton's interpreter."""
    import numpy as np
    import torch

    g = em.benchmarks.get("rmsnorm_linear", small=True)
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    tasks = [t for t in list_tasks(payload, ctx) if t.kind == BESIDE and t.ops == (4, 4)]
    for task in tasks[:MAX_TASKS]:
        for text, *_ in run_task(payload, task, ctx=ctx).found:
            h = em.loads(text)
            kernels = [t for t in h.operators if t.op == "customized" and t.params["output"] == 0]
            ops = [b.op for b in kernels[-1].params["kernel"].tb.tensors]
            if (len(kernels) == 2 and "div_count" in ops
                    and not set(kernels[-1].operands) & set(h.inputs)):
                break
        else:
            continue
        break
    else:
        pytest.fail(f"no split-K form with per-piece sums of squares in {MAX_TASKS} split tasks")
    assert _fused_split(h)
    assert em.verify(g, h, tests=4, seed=5).equivalent
    assert em.check_numerics(h, g) < 1e-6
    rng = np.random.default_rng(0)
    xs = [torch.tensor(0.1 * rng.standard_normal(t.dims), dtype=torch.float16) for t in g.inputs]
    (want,) = g.evaluate([x.double().numpy() for x in xs])
    for fused in (True, False):
        fn = em.compile(h, fuse_combines=fused)
        for _ in range(2):  # the second call finds the counters the first left at zero
            (got,) = fn(*xs)
        assert np.abs(got.double().numpy() - want).max() <= 1e-2 * np.abs(want).max()


def test_a_combine_block_reads_its_own_copy_but_every_partial() -> None:
    """A first kernel's result written once per block along a class it was computed without
    (``("copy", ...)``) is split by a later grid of the same cut: each block reads its own
    copy. Partial results along a class it reduced (``("split", ...)``: a vocabulary's
    per-block sums) are read whole by every block, which sums them."""
    from egraph_mirage.search.tiling import DTensor, _axis_dim, copy_of

    axes, grid = ("V", None, None), (8, 1, 1)
    sums = DTensor(2, (2, 8), em.float16, None, ("rows", ("split", axes, 0, grid)), "s")
    copies = DTensor(3, (2, 8), em.float16, None, ("rows", ("copy", axes, 0, grid)), "c")
    assert split_of(sums.dcls[1]) == copy_of(copies.dcls[1]) == ("V", 8)
    assert _axis_dim(sums, "V", 8) == -1 and _axis_dim(copies, "V", 8) == 1
    assert _axis_dim(copies, "V", 4) == -1  # another cut: no copy per block


def test_a_pool_with_a_worker_for_each_lead_split_task_is_handed_them_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The lead split tasks (split-KV attention at gqa's paper sizes, every first-kernel size)
    come in the list after the one-kernel tasks of a few operators: a process running the list
    reaches them late, and the largest is long. A pool with more workers than there are of
    them is handed them first, so that they run beside the list and finish within a budget
    that would end before the list reached them; a smaller pool takes the list as it is."""
    import concurrent.futures as cf

    from egraph_mirage.pipeline import superoptimize
    from egraph_mirage.search import run as run_module

    g = em.benchmarks.get("gqa")
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    tasks = list_tasks(payload, ctx)
    lead = [t for t in tasks if t.kind == SPLIT and t.index == ctx.early_splits[0]]
    assert len(lead) > 2 and tasks.index(lead[0]) > 100  # late in the list
    rest = [t for t in tasks if t not in lead]
    assert dispatch_order(tasks, ctx, len(lead) + 1) == lead + rest
    assert dispatch_order(tasks, ctx, len(lead)) == dispatch_order(tasks, ctx, 1) == tasks

    # the search hands a pool its tasks in that order (each task a stand-in that finds nothing)
    handed: list[str] = []
    payloads: list[Any] = []

    class Pool(cf.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            payloads.append(args[0])
            handed.append(args[1].name)
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(run_module, "run_task", lambda payload, task, *a: TaskResult(task.name))
    with Pool(len(lead) + 1) as pool:
        superoptimize(g, SearchConfig(), workers=pool, progress=False)
    searched = Context(payloads[0])  # the search's own payload (its program as it searched it)
    listed = list_tasks(payloads[0], searched)
    assert handed == [t.name for t in dispatch_order(listed, searched, len(lead) + 1)]
    assert handed[0].startswith("split:") and handed != [t.name for t in listed]


def test_the_lead_split_shape_loads_every_input() -> None:
    """A split task's second kernel only combines the pieces, so a first kernel must load every
    input to compute the program. The lead split shape (``Context.early_splits[0]``, whose
    tasks run first) is one that does: for a batch of sequences' decode attention folded into
    its KV heads (q (64, 4, 128) against 256 keys, a mask row per sequence and head), the
    heuristic's best-scored split shape cuts the head dim and cannot load V beside it; the lead
    is FlashDecoding's grid over (sequence × KV head, key blocks), each block looping over its
    keys. Its split task of all 9 operators finds the split-KV form (32 results in ~10 s in one
    process: ``scripts/task_times.py decode-attention --batch 8 --keys 256 --folded``)."""
    payload = prepare(folded_decode_attention(256), SearchConfig())
    ctx = Context(payload)
    shapes = [ctx.first_shapes[i] for i in ctx.early_splits]
    everything = [len(ks.loaders) == len(payload.inputs) for ks in shapes]
    assert everything[0] and False in everything  # some leave an input out: they come after
    assert everything == sorted(everything, reverse=True)
    lead = shapes[0]
    assert lead.grid[0] == 64 and lead.loop_class in lead.axis_classes  # split-KV, looping
