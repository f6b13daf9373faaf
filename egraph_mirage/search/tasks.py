"""Search tasks: independent pieces of the search space, run in any process.

The space is cut by the program's first step. A task of depth 1 is one kernel shape over the
inputs whose block graph must produce the target directly; a task of depth 2 is one kernel shape
(or one library operator) producing intermediate tensors, followed by every final kernel over
them. Tasks depend only on the ``Payload`` (plain, picklable data), so their results are the same
in any process, in any order: the search's result does not depend on the number of workers.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from ..errors import EMError
from ..graph import KernelGraph, Tensor
from ..mugraph.serialize import dumps, loads
from ..mugraph.threadblock import EPILOGUE
from ..ops import REDUCING
from .blocks import BlockSearch, Counters, loads_read
from .config import SearchConfig, SearchError
from .dims import LinkProbe
from .plan import (
    KernelStep,
    OpStep,
    Step,
    build,
    new_tensors,
    output_maps,
    uses_whole_shape,
)
from .reach import ReachIndex, ref
from .tile import Tile
from .tiling import (
    DTensor,
    KernelShape,
    ShapeMemo,
    can_finish,
    kernel_shapes,
    reduced_cuts,
)

T = TypeVar("T")

FINAL, INTERMEDIATE, LIBRARY, SPLIT, BESIDE = ("final", "intermediate", "library", "split",
                                                "beside")
#: block graphs of two-kernel plans: first kernels up to this many operators, then the larger ones
SHALLOW = 5
#: a split task whose first kernel has ``k`` operators runs after the one-kernel tasks of
#: ``k + SPLIT_LAG`` (for the split shapes whose blocks walk their piece with the loop; the
#: others follow the one-kernel tasks)
SPLIT_LAG = 0
#: a *beside* task (a split task whose first kernel also writes a result beside its partials,
#: ``_Run.intermediates``) of ``k`` operators runs after the one-kernel tasks of
#: ``k + BESIDE_LAG``: its first kernels are several times as many as a split task's (three
#: times, for a split-KV shape of 7 operators with two norms: docs/search.md), so the plain
#: split forms come first
BESIDE_LAG = 2
#: split tasks start at first kernels of this many operators (one operator only accumulates an
#: input: those plans are searched with the other two-kernel plans)
SPLIT_MIN = 2
#: the first split shapes walking their piece with the loop (``Context.early_splits``: those
#: that load every input first, each group in the shape heuristic's order) whose split tasks
#: of every size run right after the one-kernel tasks of ``SHALLOW`` operators: a split whose
#: pieces each compute the whole program (split-KV of a softmax with its max subtracted: 8
#: operators a piece) is then reached before the deep one-kernel and split tasks of every
#: other shape
SPLIT_LEAD = 1
#: the second kernel of a split task combines the pieces: it is searched with at most this many
#: operators (accumulating two partial results and finishing them takes 3 to 5), or one more
#: than the program's tail after its last reduction where that is longer, and two more for
#: each statistic that scales that reduction's operand where there is a tail
#: (``Context.combine_ops``: RoPE's rotation after a projection, 7 operators, is applied to the
#: summed partials; after an RMSNorm's projection, the combine also finishes the norm, its
#: statistic's accumulator and the division by it: 10 operators)
SPLIT_COMBINE = 5
#: the combine's operators for each statistic (``statistics``) it finishes before a tail
STATISTIC_OPS = 2


@dataclass(frozen=True)
class Payload:
    """Everything a task needs, as plain data."""

    target_json: str
    reach: ReachIndex
    config: SearchConfig
    inputs: tuple[DTensor, ...]
    scalars: tuple[float, ...]
    #: dimension classes of the program's output
    out_classes: tuple[Any, ...]
    seed: int = 0
    #: digest of the rules the e-graph was saturated with (``oracle.rules.rules_digest``)
    rules: str = ""
    #: (dimension class, factor): where the program searched is a scaled copy, each class
    #: ``factor`` times as large at the program's own sizes (``prepare.growth``), so that a
    #: kernel shape whose tiles cannot fit there is not searched (``tiling.kernel_shapes``)
    growth: tuple[tuple[Any, int], ...] = ()

    #: a digest of everything above: two payloads with one key give tasks the same context
    #: (target, verifier, shapes, the block search's memo), in any process. Computed once, at
    #: construction; a pickled payload carries it
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        r = self.reach
        text = repr((self.target_json, repr(self.config), self.seed, self.rules, self.inputs,
                     self.scalars, self.out_classes, r.roots, r.complete, sorted(r.reachable),
                     list(r.nodes.items()), self.growth))
        object.__setattr__(self, "key", hashlib.sha256(text.encode()).hexdigest())


@dataclass(frozen=True)
class Task:
    kind: str
    index: int
    #: the task's first kernel has from ``ops[0]`` to ``ops[1]`` block operators
    ops: tuple[int, int]

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.index}:{self.ops[0]}-{self.ops[1]}"


@dataclass
class TaskResult:
    task: str
    #: (μGraph JSON, num_kernels, estimated seconds, bound, tests, numeric error, seconds in task)
    found: list[tuple[str, int, float, float, int, float, float]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    stopped: bool = False
    #: how many of the task's units (``Units``) are done: all of them unless ``stopped``; a
    #: task cut short is resumed from here (``run_task(skip=)``)
    progress: int = 0


class Units:
    """The outer loop of a task, counted so that a task cut short by the time budget can be
    resumed where it stopped. A *unit* is one item of that loop: a first move of a one-kernel
    task's block search (each block-graph size in turn), a first kernel of a two-kernel task
    (with every second kernel after it), a kernel shape after a library operator. A unit is
    done once the search behind it was exhausted before the deadline; ``done`` counts the
    units done, in order, ``skip`` of them in an earlier run (they are passed over, and kept in
    ``passed``: a block search leaves their tiles out of the walks after them, as the whole run
    would have: every block graph holding one was made in that unit)."""

    def __init__(self, skip: int, stopped: Callable[[], bool]) -> None:
        self.skip, self.done, self.offered = skip, skip, 0
        self.passed: list[Any] = []
        self._stopped = stopped

    def __call__(self, items: Iterable[T]) -> Iterator[T]:
        for item in items:
            i = self.offered
            self.offered += 1
            if i < self.skip:
                self.passed.append(item)
                continue
            yield item
            if self._stopped():
                return
            self.done = i + 1


class Context:
    """State built from a payload, shared by the tasks of one search in one process: the
    target, its verifier, the kernel shapes and the block search's memo.

    The driver builds one and passes it to ``list_tasks`` and ``run_task``; a task sent to
    another process (or an executor's thread) gets it from ``context``."""

    def __init__(self, payload: Payload) -> None:
        self.payload = payload
        self.target: KernelGraph = loads(payload.target_json)
        self._verifier: Any = None
        self.memo: dict[Any, Any] = {}
        self.probe = LinkProbe()
        #: the last kernels' shapes per signature of the tensors they read (``ShapeMemo``)
        growth = dict(payload.growth)
        self.shapes = ShapeMemo(payload.config, growth)
        self.first_shapes: list[KernelShape] = list(kernel_shapes(payload.inputs,
                                                                  payload.config, growth=growth))
        #: the shapes over the inputs that can write the output in one kernel
        self.final_shapes = [ks for ks in self.first_shapes
                             if can_finish(ks, payload.out_classes)]
        #: indices (into ``first_shapes``) of the shapes that split a reduction: split-K/KV
        self.split_shapes = [i for i, ks in enumerate(self.first_shapes)
                             if splits_reduction(ks, payload.out_classes, payload.config)]
        self.split_set = frozenset(self.split_shapes)
        #: the split shapes whose blocks walk their piece with the loop (FlashDecoding's split-KV,
        #: split-K GEMMs), searched early; those loading a whole piece at once come late. Those
        #: that load every input come first: a split task's second kernel only combines the
        #: pieces, so a first kernel that leaves an input out (a split of attention's head dim,
        #: which cannot load V beside it) computes the program only where a few combining
        #: operators finish it
        walks = [i for i in self.split_shapes if self.first_shapes[i].frange > 1]
        self.early_splits = sorted(walks, key=lambda i: len(self.first_shapes[i].loaders)
                                   < len(payload.inputs))
        #: the most operators of a split task's second kernel (``SPLIT_COMBINE``)
        after = tail(self.target)
        finished = STATISTIC_OPS * len(statistics(self.target)) if after else 0
        self.combine_ops = min(max(SPLIT_COMBINE, 1 + len(after) + finished),
                               payload.config.max_block_ops or SPLIT_COMBINE)

    @cached_property
    def counts(self) -> tuple[int, ...]:
        """The whole numbers of the program's expression (the sizes of its sums, means and
        norms), which ``div_count`` may divide by in a block: a sum accumulated in pieces is
        finished into the program's mean or rms."""
        from ..graph import abstract_term

        term = abstract_term(self.target.outputs[0])
        return tuple(sorted({a for t in term.walk() for a in t.args
                             if isinstance(a, int) and not isinstance(a, bool) and a > 1}))

    @cached_property
    def library_moves(self) -> list[tuple[list[DTensor], list[Step]]]:
        """Library operators on the inputs whose result is reachable and new."""
        return _library_moves(self, list(self.payload.inputs))

    @property
    def verifier(self) -> Any:
        if self._verifier is None:
            from ..verify import Verifier

            self._verifier = Verifier(self.target, tests=self.payload.config.verify_tests,
                                      seed=self.payload.seed, backend="numpy")
        return self._verifier

    @cached_property
    def numerics(self) -> Any:
        """The float check against the target (``verify.NumericCheck``: the target's outputs
        are computed once, on the first check)."""
        from ..verify import NumericCheck

        return NumericCheck(self.target)


#: the contexts this process built for tasks that came without one, by ``Payload.key``, the
#: most recent last; a worker runs many tasks of one search, and building a context (its
#: verifier) is costly
_CONTEXTS: OrderedDict[str, Context] = OrderedDict()
#: how many contexts a process keeps
KEEP_CONTEXTS = 2


def context(payload: Payload) -> Context:
    """The context of ``payload`` in this process: the one kept for a payload with the same
    key (program, configuration, seed, rules and e-graph), else a new one."""
    key = payload.key
    ctx = _CONTEXTS.pop(key, None) or Context(payload)
    _CONTEXTS[key] = ctx
    while len(_CONTEXTS) > KEEP_CONTEXTS:
        _CONTEXTS.popitem(last=False)
    return ctx


def list_tasks(payload: Payload, ctx: Context | None = None) -> list[Task]:
    """The tasks of a search, in the order they should run: cheap and likely first.

    Tasks are ordered by an estimate of the block operators of their plans. A one-kernel task
    searches exactly ``k`` operators (one size at a time over every shape, so a small fused kernel
    of any shape is found before a large one of the first). A *split* task is a two-kernel plan
    whose first kernel's grid cuts a dimension class the output lacks into a few large pieces
    (``SearchConfig.grid_splits``: split-K, split-KV), has exactly ``k`` operators and writes
    only partial results; its second kernel only combines them (``_Run.finals`` with ``after``).
    It runs right after the one-kernel tasks of ``k + SPLIT_LAG`` operators for the split shapes
    whose blocks walk their piece with the loop (``Context.early_splits``), except that the
    first ``SPLIT_LEAD`` of them have their split tasks of every size run after the one-kernel
    tasks of ``SHALLOW`` operators; the others follow the one-kernel tasks. A *beside* task is
    a split task whose first kernel also writes a result beside its partials; it runs after
    the one-kernel tasks of ``k + BESIDE_LAG`` (early split shapes) or after the split tasks
    (the others). Library operators and the other two-kernel
    plans follow. The list depends only on the payload (``ctx``, its context, is built when not
    given).
    """
    ctx = ctx or context(payload)
    most = payload.config.max_block_ops
    two = payload.config.max_kernels >= 2
    shallow = min(SHALLOW, most)
    sizes = range(SPLIT_MIN, most + 1) if two else range(0)
    early = ctx.early_splits
    late = sorted(ctx.split_set - frozenset(early))
    lead = early[:SPLIT_LEAD]
    tasks = []
    for k in range(1, most + max(SPLIT_LAG, BESIDE_LAG) + 1):
        if k <= most:
            tasks += [Task(FINAL, i, (k, k)) for i in range(len(ctx.final_shapes))]
        if k == shallow:
            tasks += [Task(SPLIT, i, (j, j)) for i in lead for j in sizes]
        if k - SPLIT_LAG in sizes:
            tasks += [Task(SPLIT, i, (k - SPLIT_LAG,) * 2) for i in early if i not in lead]
        if k - BESIDE_LAG in sizes:
            tasks += [Task(BESIDE, i, (k - BESIDE_LAG,) * 2) for i in early]
    tasks += [Task(SPLIT, i, (k, k)) for k in sizes for i in late]
    tasks += [Task(BESIDE, i, (k, k)) for k in sizes for i in late]
    if payload.config.max_kernel_ops >= 1:
        tasks += [Task(LIBRARY, i, (0, 0)) for i in range(len(ctx.library_moves))]
    if two:
        tasks += [Task(INTERMEDIATE, i, (1, shallow)) for i in range(len(ctx.first_shapes))]
        if most > SHALLOW:
            tasks += [Task(INTERMEDIATE, i, (SHALLOW + 1, most))
                      for i in range(len(ctx.first_shapes))]
    return tasks


def dispatch_order(tasks: Sequence[Task], ctx: Context, workers: int) -> list[Task]:
    """``tasks`` in the order a pool of ``workers`` processes is handed them. The lead split
    tasks (``SPLIT_LEAD``'s: in the list after the one-kernel tasks of ``SHALLOW`` operators)
    are long (a split-KV first kernel of 9 operators: ~10 s, its second kernels searched after
    each first one) and likely; a pool that has a worker for each of them and more starts them
    all at once, and the other workers go down the list: the split forms are then found within
    a time budget that would end before the list reached them and they finished. A smaller
    pool (or one process) takes the list as it is. Which tasks run does not change (nor,
    without a time budget, what they find); what a time budget cuts short does."""
    lead = set(ctx.early_splits[:SPLIT_LEAD])

    def leads(t: Task) -> bool:
        return t.kind == SPLIT and t.index in lead

    first = [t for t in tasks if leads(t)]
    if not first or workers <= len(first):
        return list(tasks)
    return first + [t for t in tasks if not leads(t)]


#: a tile a first kernel's block graph also consumes is written (handed on to the next kernel)
#: only when it has at most this many times the elements of the program's outputs: handing a
#: loop's result on then costs about what writing the output costs (a vocabulary's logits, not
#: attention's scores)
HANDED_ON = 1.0


def tail(g: KernelGraph) -> list[Tensor]:
    """The operators of ``g`` that read its last matmul or reduction (``ops.REDUCING``, in
    graph order), directly or not, casts left out: what a split reduction's combine must
    apply after summing the pieces (a projection's RoPE rotation). Empty without one."""
    last = _last_reduction(g)
    if last is None:
        return []
    after = {g.operators[last].index}
    out = []
    for t in g.operators[last + 1:]:
        if any(o.index in after for o in t.operands):
            after.add(t.index)
            if t.op != "cast":
                out.append(t)
    return out


def statistics(g: KernelGraph) -> list[Tensor]:
    """The reductions of ``g`` other than matmuls that its last matmul or reduction
    (``ops.REDUCING``) reads, directly or not: statistics that scale what it reduces (an
    RMSNorm's mean of squares before its projection). A split form of the program reduces the
    unscaled operand in its first kernel and finishes each statistic in its combine: its
    accumulator there, and the division by it after the sum."""
    last = _last_reduction(g)
    if last is None:
        return []
    by_index = {t.index: t for t in g.operators}
    seen: set[int] = set()
    found: list[Tensor] = []
    todo = list(g.operators[last].operands)
    while todo:
        t = todo.pop()
        if t.index in seen or t.index not in by_index:
            continue
        seen.add(t.index)
        if t.op in REDUCING and t.op != "matmul":
            found.append(t)
        todo.extend(t.operands)
    return sorted(found, key=lambda t: t.index)


def _last_reduction(g: KernelGraph) -> int | None:
    """Where the last operator of ``g`` that reduces a dimension (``ops.REDUCING``) stands
    among its operators, or None."""
    return max((i for i, t in enumerate(g.operators) if t.op in REDUCING), default=None)


def splits_reduction(ks: KernelShape, out_classes: Sequence[Any], config: SearchConfig) -> bool:
    """Whether a grid axis of ``ks`` cuts a dimension class the output lacks into a few large
    pieces (a ``grid_splits`` count) and each block walks its piece with the loop (or loads it
    whole): each block then holds a partial result of a reduction, which a second kernel
    combines (split-K, split-KV)."""
    cut = [c for g, c in reduced_cuts(ks, out_classes) if g in config.grid_splits]
    return bool(cut) and (ks.frange == 1 or ks.loop_class in cut)


def run_task(payload: Payload, task: Task, deadline: float | None = None,
             ctx: Context | None = None, skip: int = 0) -> TaskResult:
    """Run one task to the end (or to ``deadline``, a ``time.time()`` value). ``ctx``: the
    payload's context (``context(payload)`` when not given). ``skip``: the units (``Units``)
    an earlier run of the task finished before it was cut short; they are not searched again."""
    ctx = ctx or context(payload)
    run = _Run(ctx, deadline)
    units = Units(skip, run.stopped)
    t0 = time.perf_counter()
    inputs = list(payload.inputs)
    if task.kind == FINAL:
        run.final(ctx.final_shapes[task.index], inputs, [], ops=task.ops, units=units)
    elif task.kind in (INTERMEDIATE, SPLIT, BESIDE):
        # a split task takes the first kernels that write only partial results, a beside task
        # those that write a result beside them; the intermediate task of a split shape, over
        # the same sizes, all the others
        partials = (True if task.kind in (SPLIT, BESIDE) else
                    False if task.index in ctx.split_set else None)
        combine = (1, ctx.combine_ops) if partials else None
        for tensors, steps in units(run.intermediates(ctx.first_shapes[task.index], inputs, [],
                                                      task.ops, partials,
                                                      beside=task.kind == BESIDE)):
            run.finals(tensors, steps, must_use=len(inputs), ops=combine,
                       after=ctx.first_shapes[task.index] if partials else None)
    else:
        tensors, steps = ctx.library_moves[task.index]
        run.finals(tensors, steps, must_use=len(inputs), units=units)
    res = run.result
    res.task = task.name
    res.counts.update(states=run.counters.states, pruned_by_oracle=run.counters.pruned_oracle,
                      pruned_otherwise=run.counters.pruned_other)
    res.seconds["search"] = time.perf_counter() - t0 - res.seconds.get("verify", 0.0)
    res.stopped = run.stopped()
    res.progress = units.done if res.stopped else units.offered
    return res


def _library_moves(ctx: Context, inputs: list[DTensor]) -> list[tuple[list[DTensor], list[Step]]]:
    """Library operators on the inputs whose result is reachable and new."""
    from ..ops import KERNEL, OPS

    payload = ctx.payload
    out = []
    have = {t.cls for t in inputs}
    for name, spec in OPS.items():
        if KERNEL not in spec.levels or spec.graph_defined or spec.elementwise:
            continue
        n = len(inputs)
        combos = [(i,) for i in range(n)] + [(i, j) for i in range(n) for j in range(n)]
        for args in combos:
            if not spec.num_inputs[0] <= len(args) <= spec.num_inputs[1]:
                continue
            ops = [inputs[i] for i in args]
            for d in range(max(len(t.dims) for t in ops)):
                params = {"dim": d} if "dim" in spec.params else {}
                if set(params) != set(spec.params):
                    break
                try:
                    dims = tuple(spec.shape(name, [t.dims for t in ops], params))
                except EMError:
                    continue
                cls = payload.reach.classify(spec.expr([ref(t.cls) for t in ops],  # type: ignore
                                                       [t.dims for t in ops], params))
                if not payload.reach.is_reachable(cls) or cls in have:
                    continue
                try:
                    links, _ = ctx.probe.links(name, [t.dims for t in ops], params)
                except SearchError:  # too large to probe: this move is left out, not the search
                    continue
                from .dims import result_classes

                dcls = result_classes(links, [t.dcls for t in ops], len(dims))
                new = DTensor(n, dims, ops[0].dtype, cls, dcls, cls)
                out.append(([*inputs, new], [OpStep(name, args, tuple(sorted(params.items())))]))
                if not params:
                    break
    return out


class _Run:
    def __init__(self, ctx: Context, deadline: float | None) -> None:
        self.ctx, self.deadline = ctx, deadline
        self.config = ctx.payload.config
        self.counters = Counters()
        self.result = TaskResult("")
        self.t0 = time.perf_counter()
        self._seen: set[Any] = set()
        self._checked: set[str] = set()

    def stopped(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    def _search(self, shape: KernelShape, accept: Any, max_outputs: int,
                goal: int | None = None, fresh: int | None = None,
                units: Units | None = None, goal_tiles: Any = None,
                consumed_outputs: bool = False) -> BlockSearch:
        return BlockSearch(shape, self.ctx.payload.reach, self.config, self.ctx.probe,
                           self.ctx.payload.scalars, accept, self.counters, self.stopped,
                           max_outputs, goal, memo=self.ctx.memo, fresh=fresh, first=units,
                           goal_tiles=goal_tiles, consumed_outputs=consumed_outputs,
                           # within one kernel the mean and rms accumulators divide by their
                           # counts; div_count finishes what a combine summed over the pieces
                           counts=self.ctx.counts if fresh is not None else ())

    def _step(self, shape: KernelShape, tiles: Sequence[Tile],
              outputs: Sequence[tuple[int, tuple[int, int, int]]]) -> KernelStep:
        return KernelStep(shape, tuple(tiles), tuple(outputs), BlockSearch.reduction_dimx(shape),
                          self.config.blockdims, self.config.smem_bytes)

    # --- the last kernel: it must produce the target ------------------------------------------
    def finals(self, tensors: list[DTensor], steps: list[Step], must_use: int,
               ops: tuple[int, int] | None = None, after: KernelShape | None = None,
               units: Units | None = None) -> None:
        """Last kernels over ``tensors`` that read every one from position ``must_use`` on.
        ``after``: the previous kernel's shape, when it wrote partial results: the last kernel
        then only combines them (it keeps ``after``'s grid axes or leaves them, and each of its
        operators uses what ``after`` wrote). ``units``: each shape is a unit of the task."""
        fresh = must_use if after is not None else None
        shapes = self.ctx.shapes.shapes(tensors, keep=after)
        for shape in units(shapes) if units is not None else shapes:
            if self.stopped():
                return
            if can_finish(shape, self.ctx.payload.out_classes):
                self.final(shape, tensors, steps, must_use, ops, fresh)

    def final(self, shape: KernelShape, tensors: list[DTensor], steps: list[Step],
              must_use: int | None = None, ops: tuple[int, int] | None = None,
              fresh: int | None = None, units: Units | None = None) -> None:
        """Last kernels of ``shape`` over ``tensors``; ``units``: each first move of the block
        search is a unit of the task."""
        target = self.ctx.target
        roots = self.ctx.payload.reach.roots
        want = target.outputs[0].dims

        def accept(tiles: list[Tile], sinks: list[int]) -> bool:
            return (len(sinks) == 1 and (tiles[sinks[0]].cls == roots[0]
                                         or not self.config.use_oracle))

        if len(target.outputs) != 1:
            return
        goal = roots[0] if self.config.use_oracle else None
        for tiles, sinks in self._search(shape, accept, 1, goal, fresh, units).run(ops):
            tile = tiles[sinks[0]]
            read = {shape.loaders[p].tensor.ref for p in loads_read(tiles, sinks)}
            if must_use is not None and not set(range(must_use, len(tensors))) <= read:
                continue  # every tensor the plan wrote before is read (none written in vain)
            for omap, dims, _ in output_maps(tile, shape, self.config.omaps):
                if dims == want:
                    step = self._step(shape, tiles, [(sinks[0], omap)])
                    if uses_whole_shape(step):
                        self._check([*steps, step], len(tensors))

    # --- a kernel whose outputs a later kernel reads --------------------------------------------
    def intermediates(self, shape: KernelShape, tensors: list[DTensor], steps: list[Step],
                      ops: tuple[int, int], partials: bool | None = None, beside: bool = False):
        """First kernels of two-kernel plans. ``partials``: True keeps only those whose every
        output has reduced away each class the grid cuts that the program's output lacks (the
        partial results of a split reduction), False only the others, None all. ``beside``
        (with ``partials``): only those that also write a result beside the partials (one
        without a class the output keeps); without it, none of those."""
        have = {t.key for t in tensors}
        roots = set(self.ctx.payload.reach.roots)
        cut = {c for _, c in reduced_cuts(shape, self.ctx.payload.out_classes)}
        out_classes = set(self.ctx.payload.out_classes)
        # (a class cut into tiles of 1 is not named by the tiles: it is written back whole)
        unit = {c for ld in shape.loaders for c, t in zip(ld.tensor.dcls, ld.tile) if t == 1}
        kept = {c for g, c in zip(shape.grid, shape.axis_classes)
                if g > 1 and c is not None and c in out_classes and c not in unit}

        def unseen(t: Tile) -> bool:
            """An output that is neither the target nor a tensor the plan already has."""
            return t.cls not in roots and t.key[0] not in have

        def reduced(t: Tile) -> bool:
            """Each class the grid cuts and the output lacks is reduced away."""
            return cut.isdisjoint(t.dcls)

        def partial(t: Tile) -> bool:
            """A tile a split task's first kernel may write: a new partial result that keeps
            the cut classes the output keeps."""
            return unseen(t) and reduced(t) and kept <= set(t.dcls)

        def aside(t: Tile) -> bool:
            """A tile a split task's first kernel may write beside a partial: a new result
            after the loop that lacks a class the output keeps (the per-piece sums of squares
            of X beside the partial products X @ W). It is written once per block along that
            class, so that each block of the combine reads its own copy (``tiling._axis_dim``)
            instead of computing it again. (A property of the tile's key, as goal distances
            need: not of the operator that made it.)"""
            return (unseen(t) and reduced(t) and t.side == EPILOGUE
                    and not kept <= set(t.dcls))

        def written(t: Tile) -> bool:
            return partial(t) or (beside and aside(t))

        def accept(tiles: list[Tile], sinks: list[int]) -> bool:
            # a row max written beside the partials (``BlockSearch._output_sets``) is not
            # counted against max_block_outputs
            counted = sum(1 for i in sinks if tiles[i].op not in ("max", "amax"))
            if not (counted <= self.config.max_block_outputs
                    and all(unseen(tiles[i]) for i in sinks)):
                return False
            if partials is None:
                return True
            ops = sum(1 for t in tiles if t.op != "input")
            split = ops >= SPLIT_MIN and all(reduced(tiles[i]) for i in sinks)
            if split and partials:
                others = sum(1 for i in sinks if aside(tiles[i]))
                return (all(written(tiles[i]) for i in sinks) and others < len(sinks)
                        and (others > 0) == beside)
            return partials == split

        # in a split task every output is a partial (or, in a beside task, beside one): goal
        # distances to those tiles prune
        goal_tiles = ((("partial", beside, frozenset(cut), frozenset(kept), frozenset(roots),
                        frozenset(have)), written) if partials else None)
        most = HANDED_ON * sum(math.prod(t.dims) for t in self.ctx.target.outputs)
        search = self._search(shape, accept, self.config.max_block_outputs,
                              goal_tiles=goal_tiles, consumed_outputs=True)
        for tiles, sinks in search.run(ops):
            consumed = {a for t in tiles for a in t.args}
            options = [list(output_maps(tiles[i], shape, self.config.omaps,
                                        _computed_without(tiles, i, shape))) for i in sinks]
            for combo in _product(options):
                if any(i in consumed and math.prod(d) > most
                       for i, (_, d, _) in zip(sinks, combo)):
                    continue
                omaps = [o for o, _, _ in combo]
                step = self._step(shape, tiles, list(zip(sinks, omaps)))
                if not uses_whole_shape(step):
                    continue
                new = new_tensors(step, len(tensors), [c for _, _, c in combo],
                                  [d for _, d, _ in combo])
                state = frozenset((t.key, t.dims, t.dcls) for t in new)
                if state in self._seen:
                    continue
                self._seen.add(state)
                yield [*tensors, *new], [*steps, step]

    # --- verification ------------------------------------------------------------------------
    def _check(self, steps: list[Step], out_ref: int) -> None:
        from ..lower.cost_model import ProgramCost

        if self.stopped():  # at a program's real sizes a check takes seconds: none past the end
            return
        t0 = time.perf_counter()
        counts = self.result.counts
        try:
            g = build(self.ctx.target, steps, [out_ref])
        except EMError:  # the μGraph API refused it: a search bug, counted, not fatal
            counts["invalid_candidates"] = counts.get("invalid_candidates", 0) + 1
            return
        text = dumps(g)
        if text in self._checked:
            return
        self._checked.add(text)
        verdict = self.ctx.verifier.check(g)
        ok = bool(verdict.equivalent)
        err = float("nan")
        if ok and self.stopped():  # the float check is the longer half
            return
        if ok:
            err = self.ctx.numerics.error(g)
            ok = err <= self.config.numeric_tolerance
        counts["candidates_verified"] = counts.get("candidates_verified", 0) + 1
        if not ok:
            counts["candidates_rejected"] = counts.get("candidates_rejected", 0) + 1
        else:
            cost = ProgramCost()
            self.result.found.append((text, cost.launches(g), cost.seconds(g), verdict.bound,
                                      verdict.tests, err, time.perf_counter() - self.t0))
        self.result.seconds["verify"] = (self.result.seconds.get("verify", 0.0)
                                         + time.perf_counter() - t0)


def _computed_without(tiles: list[Tile], i: int, shape: KernelShape) -> frozenset[Any]:
    """The classes the grid of ``shape`` cuts that none of the tensors tile ``i`` is computed
    from has: each block along them computes the same tile."""
    loaded = {c for p in loads_read(tiles, [i]) for c in shape.loaders[p].tensor.dcls}
    return frozenset(c for g, c in zip(shape.grid, shape.axis_classes)
                     if g > 1 and c is not None and c not in loaded)


def _product(options: list[list[Any]]) -> list[tuple[Any, ...]]:
    import itertools

    return list(itertools.product(*options))
