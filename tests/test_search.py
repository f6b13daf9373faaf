"""The superoptimizer on the small benchmark programs: discovery, determinism, checkpoints."""

from __future__ import annotations

import concurrent.futures as cf
import json

import pytest
from search_space import TINY
from search_space import texts as _texts

import egraph_mirage as em
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig, SearchError


def test_rmsnorm_linear_is_discovered_as_one_kernel(rmsnorm):
    results = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    assert results, "no μGraph found"
    best = results.best
    assert best.num_kernels == 1
    assert [t.op for t in best.graph.operators] == ["customized"]
    assert em.verify(rmsnorm, best.graph).equivalent
    assert best.numeric_error < 1e-6

    def moved_division(r) -> bool:  # the paper's form: divide after the matmul, in the epilogue
        (t,) = r.graph.operators
        ops = [b.op for b in t.params["kernel"].tb.tensors]
        return "div" in ops and "matmul" in ops and ops.index("div") > ops.index("matmul")

    assert any(moved_division(r) and r.num_kernels == 1 for r in results)
    st = results.stats
    assert st.states > 0 and st.candidates_verified >= 1 and st.pruned_by_oracle > 0


def test_every_result_is_verified_and_ranked(rmsnorm):
    results = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    assert len(results) >= 2
    est = [r.estimated_seconds for r in results]
    assert est == sorted(est)
    for r in results:
        assert em.verify(rmsnorm, r.graph, seed=7).equivalent
        assert em.to_json(em.loads(r.to_json())) == r.to_json()


def test_result_does_not_depend_on_workers(rmsnorm):
    one = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    two = superoptimize(rmsnorm, TINY, workers=2, progress=False)
    assert _texts(one) == _texts(two)
    with cf.ThreadPoolExecutor(2) as pool:
        threads = superoptimize(rmsnorm, TINY, workers=pool, progress=False)
    assert _texts(threads) == _texts(one)


def test_dask_executor_runs_the_same_search(rmsnorm):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        results = superoptimize(rmsnorm, TINY, workers=client.get_executor(), progress=False)
    assert _texts(results) == _texts(superoptimize(rmsnorm, TINY, workers=1, progress=False))


def test_checkpoint_resumes_instead_of_starting_over(rmsnorm, tmp_path):
    path = tmp_path / "search.ckpt"
    first = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    data = json.loads(path.read_text())
    assert data["format"] == "egraph-mirage-checkpoint"
    assert len(data["tasks"]) == first.stats.tasks_total
    again = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    assert again.stats.resumed_tasks == first.stats.tasks_total
    assert again.stats.states == first.stats.states  # counted from the file, nothing re-run
    assert _texts(again) == _texts(first)


def test_partial_checkpoint_finishes_the_rest(rmsnorm, tmp_path):
    path = tmp_path / "search.ckpt"
    full = superoptimize(rmsnorm, TINY, workers=1, progress=False)
    superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    data = json.loads(path.read_text())
    data["tasks"] = data["tasks"][: len(data["tasks"]) // 2]
    path.write_text(json.dumps(data))
    resumed = superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    assert 0 < resumed.stats.resumed_tasks < resumed.stats.tasks_total
    assert _texts(resumed) == _texts(full)


@pytest.mark.parametrize("text, message", [
    ("not json", "not a readable checkpoint"),
    ('{"format": "something-else"}', "not an egraph-mirage checkpoint"),
    ('{"format": "egraph-mirage-checkpoint", "version": 99}', "version"),
])
def test_bad_checkpoints_are_clear_errors(rmsnorm, tmp_path, text, message):
    path = tmp_path / "bad.ckpt"
    path.write_text(text)
    with pytest.raises(SearchError, match=message):
        superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)


def test_checkpoint_of_another_program_is_refused(rmsnorm, tmp_path):
    path = tmp_path / "search.ckpt"
    superoptimize(rmsnorm, TINY, workers=1, checkpoint=path, progress=False)
    other = em.benchmarks.get("rmsnorm_linear", small=True, gain=True)
    with pytest.raises(SearchError, match="another program"):
        superoptimize(other, TINY, workers=1, checkpoint=path, progress=False)


def test_bad_arguments_are_clear_errors(rmsnorm):
    with pytest.raises(SearchError, match="workers"):
        superoptimize(rmsnorm, TINY, workers=0)
    with pytest.raises(SearchError, match="SearchConfig"):
        superoptimize(rmsnorm, config={"max_block_ops": 3})
    with pytest.raises(SearchError, match="max_block_ops"):
        SearchConfig(max_block_ops=0)
    with pytest.raises(SearchError, match="KernelGraph"):
        superoptimize("rmsnorm_linear")


@pytest.mark.parametrize("name, ops", [("rmsnorm_linear", 5), ("lora", 5), ("ntrans", 6)])
def test_goal_distances_lose_no_block_graph(name: str, ops: int) -> None:
    """Pruning by the goal distances finds exactly the block graphs the plain walk finds."""
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import Context, _Run

    config = SearchConfig(max_block_ops=ops)
    payload = prepare(em.benchmarks.get(name, small=True), config)
    ctx = Context(payload)
    root = payload.reach.roots[0]

    def complete(goal):
        run = _Run(ctx, None)
        found = set()
        for shape in ctx.final_shapes:
            search = run._search(shape, lambda tiles, sinks: tiles[sinks[0]].cls == root, 1, goal)
            for tiles, sinks in search.run((1, ops)):
                found.add((repr(shape), frozenset(t.key for t in tiles)))
        return found, run.counters.states

    plain, plain_states = complete(None)
    pruned, pruned_states = complete(root)
    assert plain and pruned == plain
    assert pruned_states < plain_states


#: block graphs of up to 5 operators: the split-K plans of the small RMSNorm + Linear have 2 + 3
SPLIT = SearchConfig(max_block_ops=5, max_kernel_ops=0)


def _is_split_plan(g, x_dims) -> bool:
    """Two graph-defined kernels, the first cutting X's columns (the contraction, which the
    output lacks) into a few pieces over its grid: partial products that the second combines."""
    kernels = [t for t in g.operators if t.op == "customized" and t.params["output"] == 0]
    if len(kernels) != 2:
        return False
    tb = kernels[0].params["kernel"].tb
    return any(src.dims == x_dims and any(d == 1 and tb.grid_dim[a] in SPLIT.grid_splits
                                          for a, d in enumerate(ld.params["input_map"]))
               for ld, src in zip(tb.inputs, kernels[0].operands))


def test_split_tasks_come_between_the_one_kernel_sizes(rmsnorm):
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import FINAL, SPLIT_LAG, list_tasks
    from egraph_mirage.search.tasks import SPLIT as SPLIT_TASK

    payload = prepare(rmsnorm, SearchConfig())
    tasks = list_tasks(payload)
    names = [t.name for t in tasks]
    assert len(set(names)) == len(names)
    assert names == [t.name for t in list_tasks(prepare(rmsnorm, SearchConfig()))]  # same order
    kinds = [t.kind for t in tasks]
    first_split = kinds.index(SPLIT_TASK)
    # split tasks run right after the one-kernel tasks of k + SPLIT_LAG operators (the split
    # shapes whose blocks walk their piece with the loop), the others after the last one-kernel
    # task: before the library operators and the other two-kernel plans
    assert tasks[first_split - 1].kind == FINAL
    assert tasks[first_split - 1].ops[0] >= min(tasks[first_split].ops[0] + SPLIT_LAG,
                                                payload.config.max_block_ops)
    assert set(kinds[:first_split]) == {FINAL}
    others = [i for i, k in enumerate(kinds) if k not in (FINAL, SPLIT_TASK)]
    assert max(i for i, k in enumerate(kinds) if k == SPLIT_TASK) < min(others)


def test_a_split_k_plan_is_found_early(rmsnorm):
    """In task order, a split-K plan (kernel 1: partial products over pieces of the contraction;
    kernel 2: sums them in a loop that also walks X for its rms) comes before the library
    operators and the other two-kernel plans, verified like every result."""
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import list_tasks, run_task

    payload = prepare(rmsnorm, SPLIT)
    tasks = list_tasks(payload)
    x_dims = rmsnorm.inputs[0].dims
    early = [t for t in tasks if t.kind in ("final", "split")]
    assert tasks[: len(early)] == early
    for task in early:
        found = [em.loads(f[0]) for f in run_task(payload, task).found]
        split = [g for g in found if _is_split_plan(g, x_dims)]
        if split:
            assert task.kind == "split"
            assert em.verify(rmsnorm, split[0], seed=3).equivalent
            break
    else:
        pytest.fail("no split-K plan among the one-kernel and split tasks")


def test_the_search_runs_as_named_stages_whose_artefacts_can_be_inspected() -> None:
    from egraph_mirage.pipeline.stages import STAGES

    g = em.benchmarks.get("rmsnorm_linear", small=True)
    seen: list[tuple[str, object]] = []
    results = superoptimize(g, SearchConfig(max_results=1), workers=1, progress=False,
                            max_tasks=60, on_stage=lambda name, art: seen.append((name, art)))
    assert [name for name, _ in seen] == [name for name, _ in STAGES] == [
        "scale", "prepare", "tasks", "search", "resize", "rank", "profile", "write"]
    art = dict(seen)
    assert art["scale"] is g  # a small program is searched at its own sizes
    assert art["prepare"].reach is not None and len(art["tasks"]) == results.stats.tasks_total
    assert len(art["search"]) == len(results) and art["rank"][0] is results.best
