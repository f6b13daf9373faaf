"""Cutting a whole model's fx graph into pieces the search can take; the rest runs as is.

``partition(gm, example_inputs, *, max_matmuls=2, max_reductions=4, levels=False) -> Partitioned``
(``levels``: False, True, ``EPILOGUES`` or ``AFTER_MATMULS``):

1. **aten**: the graph is brought to aten operators (``trace.export_aten``) unless it is already
   (a module or a function is exported); assertions of a value's dtype (``aten.ASSERTIONS``,
   export's before each ``.to``) are erased; a boolean ``attn_mask`` of SDPA becomes the
   additive mask SDPA applies for it (``_additive_masks``).
2. **capability**: a node is supported when the mapping table (``aten.RULES``) has a rule whose
   op-table entries are in ``OPS`` now and which takes the node's arguments, and its tensors are
   float16, bfloat16 or float32. A view that only folds into a graph input (permute, expand, a
   slice, ...) is supported where it views a value from outside the computation (its chain of
   views does not start at a supported computing node), so that it becomes a piece's input
   view, and on a computed value only where it relabels it (``aten.Rule.on_intermediate``: a
   permute of size-1 dims at decode, an expand of shared K/V heads that broadcasts). Before
   this, each view of an outside value that several nodes use is copied once per user
   (``_views_per_user``). A copy (clone) of an outside value is supported where only operators
   read it and it copies the value itself or a broadcast of it (``_broadcast_copy``).
3. **partition**: torch's ``CapabilityBasedPartitioner`` groups supported nodes into partitions
   without cycles.
4. **cones**: each partition is split into cones, one per value that leaves it: the node and
   its ancestors in the partition. A matmul (or a node computed from one) that several cones
   need becomes the output of a cone of its own, which the others take as an input
   (``_cones``).
5. **caps**: each cone is cut, in topological order, into runs in which no node's cone (it
   and its ancestors in the run) holds more than ``max_matmuls`` matmuls and
   ``max_reductions`` reductions (counted by the rules: softmax is two, rms_norm one): the
   caps bound each output's cone, which is what one search takes (the pipeline searches a
   program of several outputs one output at a time, ``pipeline.outputs``). A run is cut before
   the last projection in it that a norm came before, where there is one: the nodes after the
   run's matmuls before it that it needs, that read no matmul themselves and hold a reduction
   (``_prologue``: an RMSNorm before a projection, not a softmax before attention's second
   product, which fuses with the first) start the next run with it, so the norm goes
   with the projections it feeds and the residual add before it stays with the projection it
   adds; otherwise the run is cut at the node over the caps (a norm just before it moving
   along the same way). A node over the caps on its own runs as is; each run is
   split into cones again. Cutting a convex set of nodes in topological order leaves every
   piece convex. A reduction over the whole output of a projection (an RMSNorm of the residual
   stream after a down projection) counts as over the caps for a projection it feeds
   (``_barrier``): no kernel fuses across it, so the norm starts the next run with the
   projections it feeds, and a model's later layers give the first layer's program (searched
   once). A view of an input joins the piece of its users; one that several pieces (or
   nodes outside) use runs as is. The default of two
   matmuls keeps a gated MLP's two projections together and its down projection apart; a
   program of three matmuls searched whole (LoRA) needs ``max_matmuls=3``.
   Then **several outputs**: cones that share a node, or of which one reads the other's value,
   are joined into one piece of several outputs where the union is convex and each output's
   cone in it keeps the caps (``_joined``; under ``levels``, only cones that share a node), so
   that a shared node is computed once and a value read across stays in the kernels: an
   RMSNorm before the query, key and value projections and their RoPE rotations is one piece
   with three outputs. A node shared by cones that cannot be joined is computed again in each.
   With ``levels``, each cone is first cut at its matmuls' inputs: a node's level is the most
   matmuls on a path from the cone's inputs to it (itself counted), and each level is a run
   (levels never decrease along an edge, so ordering by level keeps a topological order and
   every run convex). The backend cuts a piece this way when the search finds nothing for it
   whole: an RMSNorm before a gated MLP's projections becomes a piece apart from them. With
   ``levels=EPILOGUES`` a matmul's users are a level further too, so each matmul is also cut
   from what follows it: the backend cuts a part this way when the search finds nothing for
   the part either (a projection followed by its RoPE rotation). With
   ``levels=AFTER_MATMULS`` only a matmul's users are a level further, so a norm stays with
   the projections it feeds, apart from their RoPE rotations: the backend's first cut
   (``fx.backend.CUTS``). Under these two, a view of a matmul's value goes with the first
   computing nodes that read it, or with the matmul where none does (``_levels``).
6. **check**: every piece is traced (``trace_fx``); a node that fails to trace runs as is and
   steps 2–5 run again.
7. **keep**: a piece with no matmul, no reduction and fewer than two computing nodes (a lone
   element-wise operator, or views only) is not kept: its nodes run as is. Before that, a
   piece that would read inputs of two dtypes loses a cast of its other-dtype inputs to its
   own, with the element-wise nodes it is computed from, where that leaves it one dtype
   (``_one_dtype``: RoPE's float32 angles cast to float16; the search takes one dtype).
8. **fuse**: torch's ``fuse_by_partitions`` makes each piece a submodule ``egm_0``, ``egm_1``, ...
   returning a tuple; running the rewritten module once on ``example_inputs`` records each piece's
   example inputs. Where pieces share a node, each piece gets its own copy of it in the graph
   (``_recompute_shared``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import EMError, GraphError, UnsupportedOpError
from . import aten
from .cache_writes import absorbed
from .trace import DTYPES, aten_name, ensure_meta, export_aten, is_aten, meta_of, trace_fx

#: the prefix of the pieces' submodule names
PREFIX = "egm_"
#: ``partition(levels=EPILOGUES)``: each matmul cut from what comes before and after it
EPILOGUES = "epilogues"
#: ``partition(levels=AFTER_MATMULS)``: each matmul cut from what comes after it only (a norm
#: stays with the projections it feeds)
AFTER_MATMULS = "after matmuls"


@dataclass(frozen=True)
class Piece:
    """One subprogram for the search: submodule ``name`` of the rewritten module."""

    name: str
    module: Any  # torch.fx.GraphModule (aten operators), returning a tuple
    example_inputs: tuple[Any, ...]  # what the rewritten module passed it on the example inputs
    nodes: tuple[str, ...]  # the nodes of the aten graph it holds
    matmuls: int
    reductions: int


@dataclass(frozen=True)
class Partitioned:
    """The rewritten module (still runs eagerly), its pieces, and why every other operator node
    runs as is."""

    module: Any  # torch.fx.GraphModule calling the pieces
    pieces: tuple[Piece, ...]
    left_out: Mapping[str, str]  # node name -> reason


def partition(gm: Any, example_inputs: Sequence[Any], *, max_matmuls: int = 2,
              max_reductions: int = 4, levels: bool | str = False) -> Partitioned:
    """``gm`` (called with ``example_inputs``) cut into pieces for the search (module docstring);
    ``gm`` is an fx graph module, or any module or function (exported first), and is not
    changed."""
    import torch
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    if min(max_matmuls, max_reductions) < 0:
        raise GraphError(f"partition: caps must be >= 0, got max_matmuls={max_matmuls}, "
                         f"max_reductions={max_reductions}")
    if isinstance(gm, torch.fx.GraphModule) and is_aten(gm):
        with warnings.catch_warnings():  # copying an exported graph's pytree specs warns
            warnings.simplefilter("ignore", FutureWarning)
            work = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    else:
        work = export_aten(gm, example_inputs)
    ensure_meta(work, example_inputs)
    for node in list(work.graph.nodes):
        if node.op == "call_function" and aten_name(node.target) in aten.ASSERTIONS \
                and not node.users:
            work.graph.erase_node(node)
    _additive_masks(work)
    _views_per_user(work)
    order = {n: i for i, n in enumerate(work.graph.nodes)}
    refused: dict[Any, str] = {}
    checked: dict[frozenset[Any], tuple[Any, str] | None] = {}  # a piece traced once
    for _ in range(len(order) + 1):
        supported, left = _capability(work, refused)
        proposals = CapabilityBasedPartitioner(work, _support(supported),
                                               allows_single_node_partition=True)
        cones: list[list[Any]] = []  # one output each; they may share nodes
        for p in proposals.propose_partitions():
            for cone in _cones(sorted(p.nodes, key=order.__getitem__)):
                for chunk in _cut(cone, supported, max_matmuls, max_reductions, left, levels):
                    cones += _cones(sorted(chunk, key=order.__getitem__), cone)
        cones = list({c[-1]: c for c in reversed(cones)}.values())[::-1]  # one per output
        cones = _joined(cones, order, max_matmuls, max_reductions, adjacent=not levels)
        pieces = [c for c in cones if _worth(c)]
        for c in cones:
            if not _worth(c):
                left.update({n: "a piece of one element-wise operator or of views only is not "
                             "kept" for n in c if not any(n in k for k in pieces)})
        for c in pieces:  # a piece the refusals left as it was is not traced again
            if frozenset(c) not in checked:
                checked[frozenset(c)] = _check(work, c)
        failures = dict(f for f in (checked[frozenset(c)] for c in pieces) if f is not None)
        if not failures:
            break
        refused.update(failures)
    pieces = _recompute_shared(work, pieces, cones, left)
    pieces = [_one_dtype(work, c, left) for c in pieces]
    pieces = [c for c in pieces if _worth(c)]
    order = {n: i for i, n in enumerate(work.graph.nodes)}
    pieces.sort(key=lambda c: order[c[-1]])  # numbered in the order their outputs are computed
    pieces = absorbed(work, pieces, left)  # a static cache's write joins its value's piece
    fuse_by_partitions(work, [dict.fromkeys(c) for c in pieces], prefix=PREFIX,
                       always_return_tuple=True)
    examples = _piece_inputs(work, example_inputs)
    out = tuple(Piece(f"{PREFIX}{i}", getattr(work, f"{PREFIX}{i}"), examples[f"{PREFIX}{i}"],
                      tuple(n.name for n in c), *_counts(c)) for i, c in enumerate(pieces))
    return Partitioned(work, out, {n.name: why for n, why in left.items()})


def _additive_masks(work: Any) -> None:
    """Each ``scaled_dot_product_attention`` given a boolean ``attn_mask`` is given instead the
    additive mask that SDPA's fused kernels apply for it (``where(mask, 0, -inf)`` in the
    query's dtype, made once per mask: a model's layers share theirs; the nodes that make it
    run as is), which the tracer maps. On a GPU the
    result is the same; SDPA's math path (the CPU) alone differs, on rows whose every key is
    masked: 0 there, NaN here (as ``softmax`` of a row of -inf)."""
    import torch

    aten_ops = torch.ops.aten
    made: dict[tuple[Any, Any, Any], Any] = {}  # (mask, dtype, device) -> its additive mask
    for node in list(work.graph.nodes):
        if node.op != "call_function" or aten_name(node.target) != \
                "aten.scaled_dot_product_attention.default":
            continue
        in_kwargs = "attn_mask" in node.kwargs
        mask = node.kwargs["attn_mask"] if in_kwargs else (
            node.args[3] if len(node.args) > 3 else None)
        if not isinstance(mask, torch.fx.Node):
            continue
        mask_val, q_val = meta_of(mask), meta_of(node.args[0])
        if mask_val is None or q_val is None or mask_val.dtype != torch.bool:
            continue
        key = (mask, q_val.dtype, q_val.device)
        if key not in made:  # one per mask (a model's layers share theirs), before its first use
            with work.graph.inserting_before(node):
                zero, hidden = (work.graph.call_function(
                    aten_ops.scalar_tensor.default, (value,),
                    {"dtype": q_val.dtype, "device": q_val.device})
                    for value in (0.0, -float("inf")))
                made[key] = work.graph.call_function(aten_ops.where.self, (mask, zero, hidden))
            for n, val in ((zero, q_val.new_zeros(())), (hidden, q_val.new_zeros(())),
                           (made[key], mask_val.to(q_val.dtype))):
                n.meta["val"] = val
        if in_kwargs:
            node.kwargs = {**node.kwargs, "attn_mask": made[key]}
        else:
            node.args = (*node.args[:3], made[key], *node.args[4:])
    if made:
        work.graph.lint()
        work.recompile()


def _views_per_user(work: Any) -> None:
    """Each view of a value from outside the computation (a chain of views starting at a
    graph input or an unsupported node: RoPE's ``cos`` and ``sin`` unsqueezed and expanded)
    that several nodes use becomes one copy of the view per user: a view costs nothing in
    torch, and each piece then folds its own into its graph input (step 2) instead of the
    view running as is between them."""
    def view(n: Any) -> bool:
        rule = _rule(n)
        return rule is not None and rule.kind != aten.COMPUTE and not rule.copies \
            and n.args and hasattr(n.args[0], "op") and aten_name(n.target) not in aten.CASTS

    def outside(n: Any) -> bool:
        while view(n):
            n = n.args[0]
        return n.op != "call_function" or _rule(n) is None

    for node in reversed(list(work.graph.nodes)):  # users first: a chain is copied whole
        if not view(node) or len(node.users) < 2 or not outside(node):
            continue
        for user in list(node.users)[1:]:
            with work.graph.inserting_before(user):
                copy = work.graph.node_copy(node)
            user.replace_input_with(node, copy)


def _rule(node: Any) -> aten.Rule | None:
    return aten.RULES.get(aten_name(node.target)) if node.op == "call_function" else None


def _root(node: Any, within: Any) -> Any:
    """The node where ``node``'s chain of views (through nodes in ``within``) starts."""
    m = node.args[0] if node.args else None
    while m is not None and hasattr(m, "op") and m in within and _rule(m) is not None and \
            _rule(m).kind != aten.COMPUTE:  # type: ignore[union-attr]
        m = m.args[0]
    return m


def _refusal(node: Any, supported: set[Any]) -> str | None:
    rule = _rule(node)
    if rule is None:
        return "no op-table operator computes it"
    reason = aten.refusal(rule, node.args, node.kwargs)
    if reason is not None:
        return reason
    for m in (node, *node.all_input_nodes):
        v = meta_of(m)
        name = str(getattr(v, "dtype", "")).removeprefix("torch.")
        if hasattr(v, "shape") and name not in DTYPES:
            return f"a tensor of dtype {name} (kernel graphs take {', '.join(DTYPES)})"
    intermediate = _root(node, supported) in supported
    if rule.kind == aten.INPUT_VIEW and intermediate and not (
            rule.on_intermediate is not None and rule.on_intermediate(node)):
        return "a view of a computed value would be a copy (only views of inputs fold)"
    if rule.copies and not intermediate and not _broadcast_copy(node):
        return "a copy of a value from outside runs as is (the piece takes the copy)"
    return None


def _broadcast_copy(node: Any) -> bool:
    """Whether copy ``node`` of a value from outside that only operators read can fold: a copy
    of the value itself (eval-mode dropout's clone), or one that materialises a broadcast of it
    (the repeat of a cache's K/V heads, expand then clone): the piece reads the value (folding
    the broadcast), never making the copy. Other copies of values from outside (a transposed
    view made contiguous, which a reshape after it needs) run as is."""
    if not all(_rule(u) is not None for u in node.users):  # something writes into the copy
        return False
    m = node.args[0] if node.args else None
    if not (hasattr(m, "op") and _rule(m) is not None and _rule(m).kind != aten.COMPUTE):  # type: ignore[union-attr]
        return True  # the value itself, not a view of it
    while hasattr(m, "op") and _rule(m) is not None and _rule(m).kind != aten.COMPUTE:  # type: ignore[union-attr]
        if aten_name(m.target) == "aten.expand.default":
            return True
        m = m.args[0]
    return False


def _capability(work: Any, refused: Mapping[Any, str]) -> tuple[set[Any], dict[Any, str]]:
    """The supported operator nodes, and why each other one is not."""
    supported: set[Any] = set()
    left: dict[Any, str] = {}
    for node in work.graph.nodes:
        if node.op != "call_function":
            continue
        reason = refused.get(node) or _refusal(node, supported)
        if reason is None:
            supported.add(node)
        else:
            left[node] = reason
    return supported, left


def _support(supported: set[Any]) -> Any:
    from torch.fx.passes.operator_support import OperatorSupportBase

    class Supported(OperatorSupportBase):
        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            return node in supported

    return Supported()


def _counts(nodes: Sequence[Any]) -> tuple[int, int]:
    rules = [r for r in map(_rule, nodes) if r is not None]
    return sum(r.matmuls for r in rules), sum(r.reductions for r in rules)


def _cut(nodes: Sequence[Any], supported: set[Any], max_matmuls: int, max_reductions: int,
         left: dict[Any, str], levels: bool | str = False) -> list[list[Any]]:
    """Partition ``nodes`` (topologically ordered) cut into runs within the caps, and with
    ``levels`` at each new level of matmuls (module docstring); the views of inputs join the run
    of their users."""
    inside = set(nodes)
    views = [n for n in nodes
             if _rule(n).kind != aten.COMPUTE and _root(n, inside) not in inside]  # type: ignore[union-attr]
    level = _levels(nodes, levels) if levels else dict.fromkeys(nodes, 0)
    viewed = set(views)
    computing = sorted((n for n in nodes if n not in viewed), key=level.__getitem__)
    chunks: list[list[Any]] = [[]]
    #: in the last run: (position, prologue) of each matmul that a norm came before
    starts: list[tuple[int, list[Any]]] = []
    for n in computing:  # a stable sort: the same order within a level
        if chunks[-1] and level[chunks[-1][-1]] != level[n]:
            chunks.append([])
            starts = []
        mm, rd = _counts([n])
        if mm > max_matmuls or rd > max_reductions:
            left[n] = (f"{mm} matmuls and {rd} reductions on its own, over the caps "
                       f"({max_matmuls}, {max_reductions})")
            chunks.append([])
            starts = []
            continue
        while True:
            run = chunks[-1]
            above = _ancestors(n, set(run))
            used = _counts(above)  # the caps bound each output's cone
            if used[0] + mm <= max_matmuls and used[1] + rd <= max_reductions \
                    and not (mm and _barrier(n, above)):
                break
            start = next(((i, moved) for i, moved in reversed(starts)
                          if len(run[:i]) > len(moved)), None)
            if start is None:  # no earlier norm to cut before: cut here
                moved = _prologue(run, n, max_matmuls, max_reductions) if mm else []
                chunks[-1] = [m for m in run if m not in moved]
                chunks.append(moved)
                starts = []
                break
            i, moved = start  # cut before the last matmul a norm came before
            chunks[-1] = [m for m in run[:i] if m not in moved]
            chunks.append(moved + run[i:])
            starts = [(j - i + len(moved), later) for j, later in starts if j > i]
        if mm and chunks[-1]:
            moved = _prologue(chunks[-1], n, max_matmuls, max_reductions)
            if moved:
                starts.append((len(chunks[-1]), moved))
        chunks[-1].append(n)
    chunks = [c for c in chunks if c]
    home = {n: i for i, c in enumerate(chunks) for n in c}
    for v in reversed(views):
        homes = {home.get(u) for u in v.users}
        if len(homes) == 1 and None not in homes:
            home[v] = homes.pop()
            chunks[home[v]].append(v)
        else:
            left[v] = "a view of an input that several pieces (or other nodes) use runs as is"
    return chunks


def _reached(starts: Iterable[Any], step: Callable[[Any], Iterable[Any]]) -> set[Any]:
    """Every node reached from ``starts`` (included) by following ``step``."""
    seen: set[Any] = set()
    todo = list(starts)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(step(n))
    return seen


def _ancestors(node: Any, within: set[Any]) -> list[Any]:
    """The ancestors of ``node`` in ``within`` (reached through nodes of ``within``)."""
    def inputs(n: Any) -> list[Any]:
        return [a for a in n.all_input_nodes if a in within]

    return list(_reached(inputs(node), inputs))


def _projection(node: Any) -> bool:
    """Whether matmul ``node`` multiplies by a matrix (a weight: its last operand has rank 2),
    not a batch of them (attention's products, whose softmax fuses with them)."""
    last = node.args[2] if aten_name(node.target) == "aten.addmm.default" else node.args[1]
    return len(getattr(meta_of(last), "shape", ())) == 2


def _prologue(run: list[Any], matmul: Any, max_matmuls: int, max_reductions: int
              ) -> list[Any]:
    """The nodes of ``run`` that go with projection ``matmul`` (``_projection``) where it
    starts the next run: those after the run's last matmul that ``matmul`` depends on, that
    read no matmul of the run themselves and that hold a reduction (an RMSNorm before the next
    projection, the paper's fused norm and matmul); none where the run would then depend on
    them, or the next run would be over the caps. The nodes that read the run's matmuls (a
    residual add) stay with them."""
    last = max((i for i, m in enumerate(run) if _rule(m).matmuls), default=None)  # type: ignore[union-attr]
    if last is None or not _projection(matmul):
        return []
    tail = run[last + 1:]
    matmuls = {m for m in run if _rule(m).matmuls}  # type: ignore[union-attr]
    needed = set(_ancestors(matmul, set(tail)))
    moved = [m for m in tail if m in needed and not matmuls & set(m.all_input_nodes)]
    mm, rd = _counts([*moved, matmul])
    if not moved or not rd or mm > max_matmuls or rd > max_reductions:
        return []
    stay = set(run) - set(moved)
    if any(u in stay for m in moved for u in m.users):
        return []
    return moved


def _levels(nodes: Sequence[Any], levels: bool | str = True) -> dict[Any, int]:
    """Each node of ``nodes`` (topologically ordered): the most matmuls on a path to it from
    outside ``nodes``, itself counted (``levels`` True); with ``EPILOGUES``, twice that less
    one at a matmul (a matmul's users a level after it); with ``AFTER_MATMULS``, itself not
    counted (a matmul at the level of its inputs, its users a level after it). Under either of
    the last two, a view of a computed value is at the level of the first computing nodes that
    read it (RoPE's slices of a projection's heads, with the rotation), or, where none in
    ``nodes`` does, at the level of the value it views (a projection's heads returned or
    written into a cache, with the projection)."""
    level: dict[Any, int] = {}
    after = levels in (EPILOGUES, AFTER_MATMULS)

    def matmul(n: Any) -> bool:
        return _rule(n).matmuls > 0  # type: ignore[union-attr]

    def view(n: Any) -> bool:
        return _rule(n).kind != aten.COMPUTE  # type: ignore[union-attr]

    for n in nodes:
        before = [level[a] + (after and matmul(a)) for a in n.all_input_nodes if a in level]
        level[n] = max(before, default=0) + (levels != AFTER_MATMULS and matmul(n))
    if not after:
        return level
    readers: dict[Any, set[Any]] = {}  # a view: the computing nodes that read it through views
    for n in reversed(nodes):
        if view(n):
            users = [u for u in n.users if u in level]
            readers[n] = {r for u in users for r in (readers[u] if u in readers else {u})}
            if readers[n]:
                level[n] = min(level[r] for r in readers[n])
    for n in nodes:
        if view(n) and not readers[n]:
            level[n] = max((level[a] for a in n.all_input_nodes if a in level), default=0)
    return level


def _cones(chunk: Sequence[Any], cone: Sequence[Any] | None = None) -> list[list[Any]]:
    """``chunk`` (topologically ordered) as pieces of one output each: for each node whose value
    leaves the chunk (a sink), the sink and its ancestors in the chunk, in order (sink last).
    The pieces overlap where a node feeds several sinks: ``_recompute_shared`` gives each piece
    its own copy. A node several pieces need that is a matmul or computed from one is not
    computed twice: it becomes the output of a piece of its own, which the others take as an
    input (the latest such node first, until none is left); so does an output that is. Other
    outputs are computed again in the pieces that need them. Each cone of a convex chunk is
    convex: a path between two of its nodes runs through ancestors of its output.

    With ``cone`` (a piece of one output, which the caps cut into runs: ``chunk`` is one), the
    outputs are those of the cone and the values later runs of the cone use."""
    inside = set(chunk)
    if cone is None:
        roots = [n for n in chunk if any(u not in inside for u in n.users)]
    else:
        rest = set(cone) - inside
        roots = [n for n in chunk if n is cone[-1] or any(u in rest for u in n.users)]
    heavy = {n for n in chunk if _rule(n).matmuls}  # type: ignore[union-attr]
    for n in chunk:  # in order: a node computed from a matmul is heavy too
        if any(a in heavy for a in n.all_input_nodes if a in inside):
            heavy.add(n)
    while True:
        cones = []
        for r in roots:
            members, todo = {r}, [r]
            while todo:
                for a in todo.pop().all_input_nodes:
                    if a in inside and a not in members and not (a in heavy and a in roots):
                        members.add(a)
                        todo.append(a)
            cones.append(members)
        again = [n for n in chunk if n in heavy and n not in roots
                 and sum(n in c for c in cones) > 1]
        if not again:
            return [[n for n in chunk if n in c] for c in cones]  # each ends with its root
        roots.append(again[-1])


def _joined(cones: list[list[Any]], order: Mapping[Any, int], max_matmuls: int,
            max_reductions: int, adjacent: bool = True) -> list[list[Any]]:
    """``cones`` with those that share a node, or of which one reads the other's value, joined
    into one piece of several outputs, where the union is convex (no path between two of its
    nodes runs outside it) and each of its outputs' cones within it keeps the caps: the shared
    nodes are then computed once, and a value one reads from the other stays in the kernels
    (step 5: a query projection and its RoPE rotation join the piece of the norm they read).
    Cones are joined one at a time, the earliest first; a join that would not be allowed is not
    made (a shared node is computed again in each, ``_recompute_shared``). Without
    ``adjacent`` (a cut by ``levels``, whose runs are apart on purpose) only cones that share a
    node are joined."""
    def reads(nodes: set[Any]) -> set[Any]:
        return {i for n in nodes for i in n.all_input_nodes}

    def joinable(a: _Group, b: _Group) -> bool:
        touch = bool(a.nodes & b.nodes) or (adjacent and bool(a.reads & b.nodes
                                                               or b.reads & a.nodes))
        union = a.nodes | b.nodes
        return touch and _convex(union, order) and _within_caps(union, order, max_matmuls,
                                                                max_reductions)

    def join(a: _Group, b: _Group) -> None:
        a.nodes |= b.nodes
        a.reads |= b.reads
        a.order = sorted(a.nodes, key=order.__getitem__)

    groups: list[_Group] = []
    for c in cones:
        cone = _Group(list(c), set(c), reads(set(c)))
        g = next((g for g in groups if joinable(cone, g)), None)
        if g is not None:
            join(g, cone)
        else:
            groups.append(cone)
    changed = True
    while changed:  # a join may make two groups overlap
        changed = False
        for i, a in enumerate(groups):
            b = next((b for b in groups[i + 1:] if joinable(a, b)), None)
            if b is not None:
                join(a, b)
                groups.remove(b)
                changed = True
                break
    return [g.order for g in groups]


@dataclass
class _Group:
    """Cones joined into one piece (``_joined``): its nodes in graph order, as a set, and the
    nodes they read."""

    order: list[Any]
    nodes: set[Any]
    reads: set[Any]


def _within_caps(nodes: set[Any], order: Mapping[Any, int], max_matmuls: int,
                 max_reductions: int) -> bool:
    """Whether the cone of each node of ``nodes`` within them (it and its ancestors there)
    holds at most ``max_matmuls`` matmuls and ``max_reductions`` reductions, and no projection
    in it reads a reduction over another's whole output (``_barrier``); ``order``: the
    nodes' places in the graph (a topological order)."""
    above: dict[Any, set[Any]] = {}
    for n in sorted(nodes, key=order.__getitem__):
        above[n] = {n}.union(*(above[a] for a in n.all_input_nodes if a in nodes))
        mm, rd = _counts(list(above[n]))
        if mm > max_matmuls or rd > max_reductions or (mm and _barrier(n, above[n])):
            return False
    return True


def _barrier(matmul: Any, above: Iterable[Any]) -> bool:
    """Whether projection ``matmul`` (``_projection``) reads, among the nodes ``above`` it (it
    among them or not), a reduction over the whole output of another projection there (an
    RMSNorm of the residual stream after a down projection, before the next layer's query
    projection). No kernel graph fuses across it: the reduction needs every block's part of
    the first projection's output, so a search of both finds a kernel boundary there at best.
    The caps hold no such pair in one output's cone: the second projection's piece is then the
    same program as where the norm reads an input (a model's first layer), and identical
    layers are searched once."""
    if not _rule(matmul).matmuls or not _projection(matmul):  # type: ignore[union-attr]
        return False
    within = set(above) - {matmul}  # built only for a projection
    return any(_rule(r) is not None and _rule(r).reductions and _over_projection(r, within)  # type: ignore[union-attr]
               for r in within)


def _over_projection(reduction: Any, within: set[Any]) -> bool:
    """Whether ``reduction`` reduces the last dimension of a value computed element-wise
    (through nodes of ``within`` of its shape: element-wise operators, casts) from a
    projection's output in ``within``."""
    if not reduction.args or not hasattr(reduction.args[0], "op"):
        return False
    shape = tuple(getattr(meta_of(reduction.args[0]), "shape", ()))
    if not shape or not _reduces_last(reduction, len(shape)):
        return False
    seen: set[Any] = set()
    todo = [reduction.args[0]]
    while todo:
        n = todo.pop()
        if n in seen or n not in within or tuple(getattr(meta_of(n), "shape", ())) != shape:
            continue
        seen.add(n)
        rule = _rule(n)
        if rule is None or rule.reductions or rule.kind == aten.INPUT_VIEW:
            continue  # element-wise operators, casts and relabelling views are followed
        if rule.matmuls:
            if _projection(n):
                return True
            continue
        todo.extend(n.all_input_nodes)
    return False


def _reduces_last(node: Any, rank: int) -> bool:
    """Whether reduction ``node`` of a value of rank ``rank`` reduces its last dimension."""
    name = aten_name(node.target)
    if name in ("aten.rms_norm.default", "aten.layer_norm.default", "aten.sum.default",
                "aten.mean.default"):
        return True
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    if dims is None:
        return name.startswith(("aten.amax", "aten.sum", "aten.mean"))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return any(int(d) % rank == rank - 1 for d in dims) or not dims


def _convex(nodes: set[Any], order: Mapping[Any, int]) -> bool:
    """Whether no node outside ``nodes`` lies on a path between two of them. ``order``: the
    nodes' places in a topological order; every node of such a path lies strictly between the
    first and the last of ``nodes`` there, so only those are followed (a piece of a deep model
    is checked over its neighbourhood, not the whole graph)."""
    lo, hi = min(order[n] for n in nodes), max(order[n] for n in nodes)

    def between(ns: Iterable[Any]) -> Iterator[Any]:
        return (n for n in ns if lo < order[n] < hi)

    below = _reached(between(u for n in nodes for u in n.users if u not in nodes),
                     lambda n: between(n.users))
    above = _reached(between(a for n in nodes for a in n.all_input_nodes if a not in nodes),
                     lambda n: between(n.all_input_nodes))
    return not (below & above)


def _recompute_shared(work: Any, pieces: list[list[Any]], cones: list[list[Any]],
                      left: dict[Any, str]) -> list[list[Any]]:
    """The pieces (the ``cones`` kept) made disjoint: a node in several cones stays as it is
    where it is a piece's output and in the cones not kept (which run as is), and each other
    piece that holds it gets a copy (inserted in the graph after it, the piece's users of it
    rewired). An original or a copy left unused is erased, and a piece whose output is."""
    graph = work.graph
    count: dict[Any, int] = {}
    for c in cones:
        for n in c:
            count[n] = count.get(n, 0) + 1
    shared = {n for n, k in count.items() if k > 1}
    if not shared:
        return pieces
    every: list[dict[Any, Any]] = []
    for c in pieces:  # all copies first, from the originals' arguments
        copies: dict[Any, Any] = {}
        for n in c[:-1]:  # the last node is the piece's output (``_cones``)
            if n in shared:
                with graph.inserting_after(n):
                    copies[n] = graph.node_copy(n, lambda a: copies.get(a, a))
        every.append(copies)
    for c, copies in zip(pieces, every):  # then the originals a piece keeps use its copies
        for m in c:
            if m not in copies:
                for old, new in copies.items():
                    m.replace_input_with(old, new)
    out = [[copies.get(n, n) for n in c] for c, copies in zip(pieces, every)]
    erasable = shared.union(*(copies.values() for copies in every))
    gone = set()
    for n in reversed(list(graph.nodes)):  # users before what they use
        if n in erasable and not n.users:
            graph.erase_node(n)
            left.pop(n, None)
            gone.add(n)
    order = {n: i for i, n in enumerate(graph.nodes)}
    # a piece whose output only the other pieces used is gone with its copies
    return [sorted(c, key=order.__getitem__) for c in out if c[-1] not in gone]


def _worth(chunk: Sequence[Any]) -> bool:
    """Whether a piece is worth a search: a matmul, a reduction, or two computing nodes."""
    mm, rd = _counts(chunk)
    computing = [n for n in chunk if _rule(n).kind == aten.COMPUTE]  # type: ignore[union-attr]
    return mm > 0 or rd > 0 or len(computing) >= 2


def _dtype(node: Any) -> Any:
    return getattr(meta_of(node), "dtype", None)


def _one_dtype(work: Any, piece: list[Any], left: dict[Any, str]) -> list[Any]:
    """``piece`` less the casts that make its inputs of several dtypes: the search takes
    inputs of one. Where the piece's outputs have one dtype and it reads inputs of another, a
    cast to the outputs' dtype computed, within the piece, from those inputs by element-wise
    operators of the other dtype only (RoPE's angles: ``cos`` in float32 times a scale, cast
    to float16) runs as is with what it is computed from, and the piece reads the cast value,
    where the piece then reads one dtype and still traces. Casts from a reduction's result
    (transformers' float32 RMSNorm, back to float16) stay."""
    inside = set(piece)
    outs = {_dtype(n) for n in piece if any(u not in inside for u in n.users)}
    if len(outs) != 1:
        return piece
    (want,) = outs

    def reads(nodes: set[Any]) -> set[Any]:
        return {a for n in nodes for a in n.all_input_nodes if a not in nodes}

    if all(_dtype(a) == want for a in reads(inside)):
        return piece
    evicted: set[Any] = set()
    for n in piece:
        if _rule(n) is None or aten_name(n.target) not in aten.CASTS or _dtype(n) != want:
            continue
        chain = set(_ancestors(n, inside)) | {n}
        counts = _counts(list(chain))
        if counts == (0, 0) and all(_dtype(m) != want for m in chain - {n}):
            evicted |= chain
    for n in piece:  # views of what runs as is (a piece's output only viewing it) go with it
        ins = [a for a in n.all_input_nodes if a in inside]
        if ins and all(a in evicted for a in ins) and _rule(n).kind != aten.COMPUTE:  # type: ignore[union-attr]
            evicted.add(n)
    kept = [n for n in piece if n not in evicted]
    if not evicted or piece[-1] in evicted or any(_dtype(a) != want for a in reads(set(kept))) \
            or not kept or _check(work, kept) is not None:
        return piece
    why = (f"a cast to {str(want).removeprefix('torch.')} of a piece's inputs of another dtype "
           "runs as is, so that the piece reads one dtype (the search takes one)")
    left.update(dict.fromkeys(evicted, why))
    return kept


def _check(work: Any, chunk: Sequence[Any]) -> tuple[Any, str] | None:
    """None when piece ``chunk`` traces; else the node that failed and why."""
    from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

    sub, ins, _ = fuse_as_graphmodule(work, list(chunk), "check", always_return_tuple=True)
    try:
        trace_fx(sub, [meta_of(n) for n in ins])
    except EMError as exc:
        name = getattr(exc, "node", None)
        culprit = next((n for n in chunk if n.name == name), None)
        if culprit is None:  # not pinned on one node: leave the piece's first computing node out
            culprit = next(n for n in chunk if _rule(n).kind == aten.COMPUTE)  # type: ignore[union-attr]
        reason = str(exc)
        if isinstance(exc, UnsupportedOpError) and " is not supported: " in reason:
            reason = reason.split(" is not supported: ", 1)[1]
        return culprit, f"does not trace: {reason}"
    return None


def _piece_inputs(work: Any, example_inputs: Sequence[Any]) -> dict[str, tuple[Any, ...]]:
    """What the rewritten module passes each piece when run on ``example_inputs``."""
    import torch

    seen: dict[str, tuple[Any, ...]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            if str(target).startswith(PREFIX):
                seen[str(target)] = tuple(args)
            return super().call_module(target, args, kwargs)

    with torch.no_grad():
        Recorder(work).run(*example_inputs)
    return seen
