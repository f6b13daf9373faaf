"""Enumerating the thread-block graph of one kernel shape.

States are *sets* of tiles: a new operator (or a for-loop accumulator) is applied to tiles at
hand, its tile gets the e-class of its abstract expression, and the branch is cut unless that class
is reachable in the target's e-graph. Two tiles of one class on one side of the loop, with the
same dims and dimension classes, are the same tile, and a set of tiles already seen is not
explored again, so no block graph is built twice in any order. A state is complete when every
tile nobody consumes (a *sink*) lies after the loop; the sinks are the block graph's outputs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import EMError
from ..expr import Term
from ..mugraph.accumulators import (
    ACCUMULATORS,
    Accumulator,
    rms_with_eps,
    running_max_expr,
    running_max_shape,
    shifted,
)
from ..mugraph.threadblock import EPILOGUE, INVARIANT, LOOP_SIDE
from ..ops import BLOCK, OPS
from .config import SearchConfig, SearchError
from .dims import LinkProbe, result_classes
from .pairing import Pairing, joinable
from .reach import ReachIndex, ref
from .tile import Dims, Tile
from .tiling import KernelShape

#: most distinct tiles the goal distances close over (beyond it the search runs unpruned)
_CLOSURE_MAX = 20000


@dataclass
class Counters:
    states: int = 0
    pruned_oracle: int = 0
    pruned_other: int = 0


@dataclass
class BlockSearch:
    """Enumerates block graphs of one kernel shape; ``accept`` decides which sink sets count."""

    shape: KernelShape
    reach: ReachIndex
    config: SearchConfig
    probe: LinkProbe
    scalars: tuple[float, ...]
    accept: Callable[[list[Tile], list[int]], bool]
    counters: Counters = field(default_factory=Counters)
    stop: Callable[[], bool] = lambda: False
    #: most sinks a complete state may have
    max_outputs: int = 1
    #: the e-class the one output must have (None: any sinks ``accept`` likes)
    goal: int | None = None
    _limit: int = 0
    #: results of applying operators to tiles, shared by the searches of one process
    memo: dict = field(default_factory=dict)
    #: per tile key, the fewest operators from it to a tile of class ``goal`` (when set)
    _dist: dict[Any, int] | None = None
    #: tensors from this position on (``DTensor.ref``) are the previous kernel's outputs; when
    #: set, every operator takes at least one operand made from them: a kernel that combines
    #: partial results may still accumulate another tensor (the rms of an input's rows), but
    #: what it would compute from the other tensors alone belongs in the kernel that made the
    #: partials
    fresh: int | None = None
    #: instead of ``goal``: which tiles after the loop may be outputs, as (a hashable name of
    #: the rule, for the memo; the rule): goal distances are then counted to those tiles
    goal_tiles: tuple[Any, Callable[[Tile], bool]] | None = None
    #: wraps the first moves of each walk (``tasks.Units``: a task resumed where it was cut;
    #: the moves it passes over are left out of the walks after them)
    first: Any = None
    #: a complete block graph may also write accumulated tiles that it consumes (up to
    #: ``max_outputs`` outputs in all): a first kernel then hands a later one both a loop's
    #: result and what it computed from it (``S = X @ W`` and per-block sums of ``exp(S)``),
    #: where the later kernel would otherwise compute the loop again
    consumed_outputs: bool = False
    #: the whole numbers ``div_count`` may divide by (``tasks.Context.counts``)
    counts: tuple[int, ...] = ()
    #: ``reduction_dimx(shape)``, read by every accumulator's memo key: computed once
    _reduce_dimx: int = field(init=False, repr=False, default=0)
    #: the accumulator kinds tried: the table's, and "rms" with each positive constant of the
    #: program as its eps (``accumulators.rms_with_eps``: a norm's eps, which the oracle keeps
    #: where the program has that root)
    _kinds: tuple[Accumulator, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        self._reduce_dimx = self.reduction_dimx(self.shape)
        self._kinds = (*ACCUMULATORS.values(),
                       *(rms_with_eps(c) for c in sorted(set(self.scalars)) if c > 0))

    def run(self, ops: tuple[int, int] | None = None) -> Iterator[tuple[list[Tile], list[int]]]:
        """Complete block graphs with ``ops[0]`` to ``ops[1]`` operators (default: up to
        ``max_block_ops``), fewest first (iterative deepening)."""
        tiles = self.inputs()
        lo, hi = (1, self.config.max_block_ops) if ops is None else ops
        if self.goal is not None or self.goal_tiles is not None:
            self._dist = self._distances(tiles, hi)
            if self.goal is not None and self._dist is not None and any(
                    t.key not in self._dist for t in tiles if t.anchored):
                return  # some loaded tile can never reach the output (with ``fresh``: some
                # tile of the previous kernel's; the others may go unused). A first kernel
                # (``goal_tiles``) may leave a loaded tensor to the kernel after it
        moves: list[Tile] = []
        for k in range(len(tiles)):
            moves.extend(self._useful(self._moves_with(tiles[: k + 1], k)))
        done: set[Any] = set()
        for limit in range(lo, hi + 1):
            self._limit = limit
            for found in self._dfs(tiles, set(), 0, set(), moves, self._smem(tiles)):
                # one block graph per output class and set of loaded tensors it reads (a
                # combine may read the partials alone, or the program's inputs again), except
                # that a running max is part of what is computed: its rescaled accumulators
                # have the plain ones' classes
                sig = (frozenset(found[0][i].key for i in found[1]),
                       frozenset(t.key for t in found[0] if t.op == "max"),
                       loads_read(found[0], found[1]))
                if sig not in done:
                    done.add(sig)
                    yield found

    def inputs(self) -> list[Tile]:
        """The loaded tiles the walk starts from."""
        tiles = []
        for i, ld in enumerate(self.shape.loaders):
            side = LOOP_SIDE if ld.fdim != -1 else INVARIANT
            key = (ld.tensor.key, side, ld.tile, ld.tile_classes)
            tiles.append(Tile(key, ld.tensor.cls, ld.tile, ld.tensor.dtype.itemsize, side,
                              ld.tile_classes, "input", (), (("position", i),),
                              anchored=self.fresh is None or ld.tensor.ref >= self.fresh))
        return tiles

    # --- the walk ---------------------------------------------------------------------------
    def _dfs(self, tiles: list[Tile], consumed: set[int], ops: int, seen: set[Any],
             moves: list[Tile], smem: int) -> Iterator[tuple[list[Tile], list[int]]]:
        if self.stop():
            return
        self.counters.states += 1
        sinks = [i for i, t in enumerate(tiles) if t.op != "input" and i not in consumed]
        if ops == self._limit and sinks and all(tiles[i].side == EPILOGUE for i in sinks):
            for outs in self._output_sets(tiles, sinks, consumed):
                if self.accept(tiles, outs):
                    yield list(tiles), outs
        if ops >= self._limit:
            return
        keys = {t.key for t in tiles}
        budget = self.config.smem_bytes
        units = self.first if ops == 0 else None
        for new in units(moves) if units is not None else moves:
            if new.key in keys:
                continue
            size = smem + _bytes(new)
            if size > budget:
                self.counters.pruned_other += 1
                continue
            nxt = [*tiles, new]
            used = consumed | set(new.args)
            state = (frozenset(t.key for t in nxt),
                     frozenset(nxt[i].key for i in range(len(nxt))
                               if nxt[i].op != "input" and i not in used))
            if state in seen:
                continue
            seen.add(state)
            if self._needs(nxt, used) > self._limit - ops - 1:
                self.counters.pruned_other += 1
                continue
            # moves stay valid as tiles are added; only those using the new tile are new
            child = [t for t in moves if t.key != new.key]
            if units is not None and units.passed:  # first moves done in an earlier run
                done = {t.key for t in units.passed}
                child = [t for t in child if t.key not in done]
            child.extend(self._useful(self._moves_with(nxt, len(nxt) - 1)))
            yield from self._dfs(nxt, used, ops + 1, seen, child, size)

    def _output_sets(self, tiles: list[Tile], sinks: list[int], consumed: set[int]
                     ) -> Iterator[list[int]]:
        """The sinks, and with ``consumed_outputs`` the sinks and one consumed accumulated tile
        while there is room for another output, or a row max the sinks are relative to
        (``_row_max``: a later kernel combining them rescales them by it; not counted against
        ``max_outputs``)."""
        yield sinks
        if not self.consumed_outputs:
            return
        if len(sinks) < self.max_outputs:
            for i in sorted(consumed):
                if tiles[i].op == "accum" and tiles[i].side == EPILOGUE:
                    yield sorted([*sinks, i])
        for i in sorted(consumed):
            if _row_max(tiles, i, sinks, self.shape.frange):
                yield sorted([*sinks, i])

    def _needs(self, tiles: list[Tile], consumed: set[int]) -> int:
        """A lower bound on the operators still needed to complete this state.

        Every operator lowers the number of sinks by at most one (a binary operator consumes two
        and adds one), and the number of sinks before the loop's end by at most one (merging two
        of them, or accumulating or combining one with a tile after the loop)."""
        sinks = [t for i, t in enumerate(tiles) if t.op != "input" and i not in consumed]
        before = sum(1 for t in sinks if t.side != EPILOGUE)
        bound = max(before, len(sinks) - self.max_outputs)
        if self._dist is not None:  # each sink still has its path to the output ahead
            bound = max(bound, max((self._dist[t.key] for t in sinks), default=0))
        return bound

    def _useful(self, moves: Iterator[Tile]) -> Iterator[Tile]:
        """The moves whose tile can still lead to the output (all, without a goal)."""
        if self._dist is None:
            return moves
        dist = self._dist
        return (m for m in moves if m.key in dist)

    def _distances(self, inputs: list[Tile], most: int) -> dict[Any, int] | None:
        """Fewest operators from each tile this kernel shape can make to a tile of class
        ``goal`` (or one ``goal_tiles`` accepts) after the loop, in block graphs of at most
        ``most`` operators: tiles not in the map can never be part of one. The closure is
        breadth-first: a tile's *level* is the fewest operators that make it (1 + its
        operands' largest), tiles come in level order, and those of level ``most`` are not
        expanded (a block graph that used one would need more). It is closed under every move
        (shared memory aside) up to that level, so the distances are lower bounds and pruning
        with them loses no block graph. None (no pruning) when there are more than
        ``_CLOSURE_MAX`` tiles or the search was stopped. Memoised."""
        memo_key = ("dist", tuple((t.key, t.dcls, t.anchored) for t in inputs),
                    self.shape.frange, self._reduce_dimx,
                    self.goal if self.goal_tiles is None else self.goal_tiles[0], most,
                    self.counts)
        if memo_key in self.memo:
            return self.memo[memo_key]
        closed: list[Tile] = list(inputs)
        index = {t.key: i for i, t in enumerate(closed)}
        made_from: list[set[int]] = [set() for _ in closed]  # per tile, the tiles it is made of
        pairing = Pairing(closed, self.reach, self._candidates, self.memo)
        levels = [0] * len(closed)
        first = next((i for i, t in enumerate(closed) if t.anchored), len(closed))
        k = 0
        while (k < len(closed) and levels[k] < most and len(closed) <= _CLOSURE_MAX
               and not self.stop()):
            # a tile with no tile of the previous kernel's at or before it pairs with nothing
            # (``fresh``): only its accumulators are new
            combos = () if k < first else pairing.combos(k)
            for t in self._moves_with(closed, k, combos):
                j = index.get(t.key)
                if j is None:  # operands come before k: its level is k's + 1
                    j = index[t.key] = len(closed)
                    closed.append(t)
                    levels.append(levels[k] + 1)
                    made_from.append(set())
                made_from[j].update(t.args)
            k += 1
        dist: dict[Any, int] | None
        if k < len(closed) and levels[k] < most:  # too many tiles (or stopped): no pruning
            if self.stop():
                return None
            dist = None
        else:
            is_goal = ((lambda t: t.cls == self.goal) if self.goal_tiles is None
                       else self.goal_tiles[1])
            steps = {i: 0 for i, t in enumerate(closed) if t.side == EPILOGUE and is_goal(t)}
            frontier = list(steps)
            step = 0
            while frontier:  # breadth-first, back from the goal tiles to what they are made of
                step += 1
                nxt = []
                for i in frontier:
                    for src in made_from[i]:
                        if src not in steps:
                            steps[src] = step
                            nxt.append(src)
                frontier = nxt
            dist = {closed[i].key: d for i, d in steps.items()}
        self.memo[memo_key] = dist
        return dist

    @staticmethod
    def _smem(tiles: Sequence[Tile]) -> int:
        return sum(_bytes(t) for t in tiles)

    def _moves_with(self, tiles: list[Tile], k: int,
                    combos: Sequence[tuple[int, ...]] | None = None) -> Iterator[Tile]:
        """Valid new tiles whose operands include tile ``k`` (and otherwise tiles before it).
        ``combos``: the operand tuples to try (default: all of them; ``Pairing`` leaves out
        pairs that no operator joins)."""
        t = tiles[k]
        use_oracle = self.config.use_oracle
        if combos is None or not use_oracle:
            combos = [(k,)] + [(i, k) for i in range(k + 1)] + [(k, i) for i in range(k)]
        for args in combos:
            operands = [tiles[i] for i in args]
            anchored = any(o.anchored for o in operands)
            if not anchored:
                continue
            if self.shape.frange == 1 and any(_identity(o) for o in operands):
                continue  # f(acc(x)) is acc(f(x)) and f(acc(x), y) is f(x, y): one form each
            sides = {o.side for o in operands} - {INVARIANT}
            if len(sides) > 1:
                continue  # an operator across the loop's end
            side = sides.pop() if sides else INVARIANT
            # (i, k) with i <= k takes every operator, (k, i) only the non-commutative ones
            swapped = len(args) == 2 and args[0] == k and args[1] != k
            shifts = {o.shift for o in operands if o.shift is not None}
            if len(shifts) > 1:
                continue  # two running maxes: no accumulator can rescale by both
            shift = shifts.pop() if shifts else None
            for hit in self._results(operands, swapped):
                yield Tile(hit.key, hit.cls, hit.dims, hit.itemsize, side, hit.dcls, hit.op,
                           args, hit.params, shift, anchored)
        if t.side == EPILOGUE or (t.side == INVARIANT and self.shape.frange > 1):
            return
        if not t.anchored:
            yield from (replace(u, anchored=False) for u in self._accumulations(tiles, k))
        else:
            yield from self._accumulations(tiles, k)

    def _accumulations(self, tiles: list[Tile], k: int) -> Iterator[Tile]:
        """The accumulators (and running max) of loop-side or invariant tile ``k``; a
        loop-side tile is also accumulated rescaled by each other loaded row tile (the maxima
        of partials a split kernel wrote beside them: ``_shifted``)."""
        t = tiles[k]
        if t.shift is not None:  # online softmax: accumulate rescaled by the running max
            m = next(i for i, u in enumerate(tiles) if u.key == t.shift)
            for acc in self._kinds:
                if acc.linear:
                    tile = self._accumulate(k, t, acc, (m, tiles[m]))
                    if tile is not None:
                        yield tile
            return
        # the loaded row tiles it may be rescaled by (found first: the closure appends to
        # ``tiles`` while it reads these moves, but never a loaded tile)
        rows = ([(j, m) for j, m in enumerate(tiles)
                 if j != k and m.op == "input" and m.side == LOOP_SIDE and m.dims[-1] == 1]
                if t.side == LOOP_SIDE and self.shape.frange > 1 else [])
        for acc in self._kinds:
            tile = self._accumulate(k, t, acc)
            if tile is not None:
                yield tile
            if acc.linear:
                for j, m in rows:
                    tile = self._shifted(k, t, acc, j, m)
                    if tile is not None:
                        yield tile
        if t.side == LOOP_SIDE and self.shape.frange > 1:
            tile = self._running_max(k, t)
            if tile is not None:
                yield tile

    def _results(self, operands: list[Tile], swapped: bool) -> list[Tile]:
        """Every reachable tile one block operator makes of ``operands`` (memoised by their
        keys): templates whose ``args`` the caller fills in."""
        memo_key = ("ops", tuple((t.key, t.dcls) for t in operands), swapped,
                    self.shape.frange, self.counts)
        hit = self.memo.get(memo_key)
        if hit is None:
            hit = []
            sides = {o.side for o in operands} - {INVARIANT}
            side = sides.pop() if sides else INVARIANT
            dims = tuple(t.dims for t in operands)
            classes = tuple(t.cls for t in operands)
            check = (len(operands) == 2 and self.config.use_oracle
                     and None not in classes)
            for name, params in self._candidates(dims, swapped):
                if check and not joinable(self.reach, name, dims, params, classes, self.memo):
                    self.counters.pruned_oracle += 1
                    continue  # the operands' handles share no e-node: no class
                tile = self._apply_new(name, (), operands, params, side)
                if tile is not None:
                    hit.append(tile)
            self.memo[memo_key] = hit
        return hit

    def _candidates(self, dims: tuple[Dims, ...], swapped: bool
                    ) -> list[tuple[str, dict[str, Any]]]:
        """Operators (with parameters) that take operands of these dims: memoised by dims (and
        the counts ``div_count`` may take)."""
        memo_key = ("candidates", dims, swapped, self.counts)
        if memo_key not in self.memo:
            out = []
            for name, spec in OPS.items():  # read now: the table may have grown since import
                if BLOCK not in spec.levels:
                    continue
                lo, hi = spec.num_inputs
                if not lo <= len(dims) <= min(hi, 2) or (swapped and spec.commutative):
                    continue
                for params in self._params(spec.params, dims):
                    try:
                        spec.shape(name, list(dims), params)
                    except EMError:
                        continue
                    out.append((name, params))
            self.memo[memo_key] = out
        return self.memo[memo_key]

    def _params(self, names: Sequence[str], dims: tuple[Dims, ...]) -> Iterator[dict[str, Any]]:
        if not names:
            yield {}
            return
        if tuple(names) == ("start", "stop"):  # a half of the last dim (RoPE's rotate-half)
            n = dims[0][-1]
            if n % 2 == 0 and n > 1:
                yield {"start": 0, "stop": n // 2}
                yield {"start": n // 2, "stop": n}
            return
        choices: list[list[Any]] = []
        for p in names:
            if p == "dim":
                choices.append([d for d in range(len(dims[0])) if dims[0][d] > 1])
            elif p == "normalized_shape":
                choices.append([(dims[0][-1],)])
            elif p == "scalar":
                choices.append(list(self.scalars))
            elif p == "count":
                choices.append(list(self.counts))
            else:
                return
        for combo in itertools.product(*choices):
            yield dict(zip(names, combo))

    def _apply_new(self, name: str, args: tuple[int, ...], operands: list[Tile],
                   params: dict[str, Any], side: str) -> Tile | None:
        spec = OPS[name]
        dims_in = [t.dims for t in operands]
        try:
            dims = tuple(spec.shape(name, dims_in, params))
        except EMError:
            return None
        cls, ident = self._classify(spec.expr([_leaf(t) for t in operands], dims_in, params),
                                    name, operands, params)
        if cls is None and self.config.use_oracle:
            self.counters.pruned_oracle += 1
            return None
        try:
            links, _ = self.probe.links(name, dims_in, params)
        except SearchError:  # too large to probe: this move is left out, not the search
            return None
        dcls = result_classes(links, [t.dcls for t in operands], len(dims))
        itemsize = max(t.itemsize for t in operands)
        return Tile((ident, side, dims, dcls), cls, dims, itemsize, side, dcls, name, args,
                    tuple(sorted(params.items())))

    def _accumulate(self, i: int, t: Tile, acc: Any, rescale: tuple[int, Tile] | None = None
                    ) -> Tile | None:
        """The accumulator ``acc`` of tile ``i`` (``t``); ``rescale``: the running max (index,
        tile) it is rescaled by (``forloop_accum(x, acc, rescale=m)``)."""
        memo_key = ("accum", acc.name, t.key, t.dcls, self.shape.frange, self._dimx(t), t.shift)
        if memo_key not in self.memo:
            self.memo[memo_key] = self._accumulate_new(i, t, acc)
        hit = self.memo[memo_key]
        if hit is None:
            return None
        if rescale is None:
            return Tile(hit.key, hit.cls, hit.dims, hit.itemsize, EPILOGUE, hit.dcls, "accum",
                        (i,), hit.params)
        m = rescale[1].dims
        if any(len(m) != len(d) or any(x not in (1, y) for x, y in zip(m, d))
               for d in (t.dims, hit.dims)):
            return None  # the running max does not broadcast to the operand and the result
        # the same expression as the plain accumulator's (the max cancels once indices are
        # abstracted), another tile: its key says it is rescaled
        return Tile((("rescaled", hit.key[0]), *hit.key[1:]), hit.cls, hit.dims, hit.itemsize,
                    EPILOGUE, hit.dcls, "accum", (i, rescale[0]),
                    (*hit.params, ("rescale", True)))

    def _shifted(self, i: int, t: Tile, acc: Any, j: int, m: Tile) -> Tile | None:
        """The accumulator ``acc`` of tile ``i`` (``t``) rescaled by loaded tile ``j`` (``m``),
        which is not a running max: each term weighted by ``exp(m_i - max m)``, abstractly
        ``SumShift`` (``accumulators.shifted``)."""
        memo_key = ("shifted", acc.name, t.key, t.dcls, m.key, self.shape.frange, self._dimx(t))
        if memo_key not in self.memo:
            self.memo[memo_key] = None
            try:
                dims = tuple(acc.shape(t.dims, self._dimx(t)))
            except EMError:
                return None
            if (acc.name != "plain" and dims == t.dims) or any(
                    len(m.dims) != len(d) or any(x not in (1, y) for x, y in zip(m.dims, d))
                    for d in (t.dims, dims)):
                return None  # m does not broadcast to the operand and the result
            term = shifted(acc.expr(_leaf(t), t.dims, self.shape.frange, self._dimx(t)),
                           _leaf(m))
            cls, ident = self._classify(term, "shifted:" + acc.name, [t, m], {})
            if cls is None and self.config.use_oracle:
                self.counters.pruned_oracle += 1
                return None
            dcls = t.dcls if dims == t.dims else (*t.dcls[:-1], None)
            self.memo[memo_key] = Tile((ident, EPILOGUE, dims, dcls), cls, dims, t.itemsize,
                                       EPILOGUE, dcls, "accum", (),
                                       (("acc", acc.name), ("rescale", True)))
        hit = self.memo[memo_key]
        return None if hit is None else replace(hit, args=(i, j))

    def _running_max(self, i: int, t: Tile) -> Tile | None:
        """The running max of loop-side tile ``i`` (``forloop_max``): the max over its last
        dimension and the iterations so far; tiles made from it move with it."""
        memo_key = ("max", t.key, t.dcls, self.shape.frange)
        if memo_key not in self.memo:
            dims = running_max_shape(t.dims)
            count = t.dims[-1] * self.shape.frange
            cls, ident = self._classify(running_max_expr(_leaf(t), t.dims, count), "max", [t],
                                        {})
            if cls is None and self.config.use_oracle:
                self.counters.pruned_oracle += 1
                hit = None
            else:
                dcls = (*t.dcls[:-1], None)
                key = (ident, LOOP_SIDE, dims, dcls)
                hit = Tile(key, cls, dims, t.itemsize, LOOP_SIDE, dcls, "max",
                           (), (), key)
            self.memo[memo_key] = hit
        hit = self.memo[memo_key]
        return None if hit is None else Tile(hit.key, hit.cls, hit.dims, hit.itemsize, LOOP_SIDE,
                                             hit.dcls, "max", (i,), (), hit.key)

    def _accumulate_new(self, i: int, t: Tile, acc: Any) -> Tile | None:
        try:
            dims = tuple(acc.shape(t.dims, self._dimx(t)))
        except EMError:
            return None
        if acc.name != "plain" and dims == t.dims:
            return None
        cls, ident = self._classify(acc.expr(_leaf(t), t.dims, self.shape.frange, self._dimx(t)),
                                    "accum:" + acc.name, [t], {})
        if cls is None and self.config.use_oracle:
            self.counters.pruned_oracle += 1
            return None
        dcls = t.dcls if dims == t.dims else (*t.dcls[:-1], None)
        return Tile((ident, EPILOGUE, dims, dcls), cls, dims, t.itemsize, EPILOGUE, dcls, "accum",
                    (i,), (("acc", acc.name),))

    def _dimx(self, t: Tile) -> int:
        return self._reduce_dimx

    @staticmethod
    def reduction_dimx(shape: KernelShape) -> int:
        """``sum_todimx`` width: the smallest last dimension among the kernel's tiles."""
        return min(ld.tile[-1] for ld in shape.loaders)

    def _classify(self, term: Any, name: str, operands: list[Tile], params: dict[str, Any]
                  ) -> tuple[int | None, Any]:
        cls = self.reach.classify(term)
        if cls is not None and not self.reach.is_reachable(cls):
            cls = None
        if cls is not None:
            return cls, cls
        return None, (name, tuple(t.key for t in operands), tuple(sorted(params.items())))


def used_tiles(tiles: Sequence[Tile], outputs: Sequence[int]) -> list[int]:
    """Indices of the tiles the outputs depend on, in order."""
    need: set[int] = set()
    stack = list(outputs)
    while stack:
        i = stack.pop()
        if i not in need:
            need.add(i)
            stack.extend(tiles[i].args)
    return sorted(need)


def loads_read(tiles: Sequence[Tile], sinks: Sequence[int]) -> frozenset[int]:
    """The loader positions of the input tiles that ``sinks`` are computed from."""
    return frozenset(dict(tiles[i].params)["position"] for i in used_tiles(tiles, sinks)
                     if tiles[i].op == "input")


def _row_max(tiles: Sequence[Tile], i: int, sinks: Sequence[int], frange: int) -> bool:
    """Whether tile ``i`` is a row max the sinks were computed relative to, which a first
    kernel writes beside them for the kernel that combines them: a running max that rescaled
    a sink, or, in a kernel without a loop, an ``amax``."""
    t = tiles[i]
    if t.op == "max":
        return any(tiles[s].args[1:] == (i,) for s in sinks)
    return frange == 1 and t.op == "amax"


def _identity(t: Tile) -> bool:
    """A plain accumulator of a loop of one iteration: the identity."""
    return t.op == "accum" and t.params == (("acc", "plain"),)


def _bytes(t: Tile) -> int:
    """Shared memory of a tile: accumulators after the loop are fp32."""
    n = 1
    for d in t.dims:
        n *= d
    return n * (4 if t.side == EPILOGUE else t.itemsize)


def _leaf(t: Tile) -> Any:
    if t.cls is not None:
        return ref(t.cls)
    return Term("$opaque", (repr(t.key),))
