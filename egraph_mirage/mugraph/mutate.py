"""Mutants of a μGraph, for measuring the verifier: copies rebuilt through the public builders.

``extract(g)`` turns a μGraph into plain data (a ``GraphSpec``: the kernel graph's tensors and each
kernel's thread-block graph), ``edits(spec)`` lists the single changes that can be made to it
(wrong maps, swapped operands, another accumulator, a dropped or an extra operator, another grid,
...), and ``build(spec)`` rebuilds a ``KernelGraph`` through ``new_kernel_graph``,
``new_threadblock_graph`` and ``g.customized``, so every build-time check runs. Most edits give an
invalid graph (the builders raise an ``EMError``); ``mutants`` skips those and yields the rest,
each once, labelled with the kind of edit. Some mutants are equivalent to the original (a
commutative swap, a grid that still tiles correctly): which ones is for a float check to decide.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType
from ..errors import EMError, GraphError
from ..graph import KernelGraph, Tensor, new_kernel_graph
from ..ops import OPS
from .accumulators import ACCUMULATORS
from .serialize import dumps
from .threadblock import ThreadBlockGraph, new_threadblock_graph

#: operators an "extra_op" edit inserts after a tensor ("add_self" is add(x, x))
EXTRA: tuple[tuple[str, dict[str, Any]], ...] = (
    ("exp", {}), ("sqrt", {}), ("square", {}), ("mul_scalar", {"scalar": 2.0}),
    ("add_self", {}), ("silu", {}))
#: kinds of edit meant to keep the program's meaning (the float check still decides)
EQUIVALENT_KINDS = frozenset({"grid", "grid_split", "forloop_range", "commutative_swap",
                              "reduction_dimx"})


@dataclass
class Node:
    """One tensor: a graph input (op "graph_input"), a loader (op "input") or an operator."""

    op: str
    operands: list[int]
    params: dict[str, Any]
    dims: tuple[int, ...] = ()


@dataclass
class Body:
    """Tensors in build order and outputs ``[index, output_map or None]``."""

    nodes: list[Node]
    outputs: list[list[Any]]

    def insert_after(self, j: int, node: Node) -> None:
        """Put ``node`` right after tensor ``j`` and make every use of ``j`` use it instead."""
        pos = j + 1
        for n in self.nodes:
            n.operands = [pos if i == j else i + (i >= pos) for i in n.operands]
        for o in self.outputs:
            o[0] = pos if o[0] == j else o[0] + (o[0] >= pos)
        node.operands = [j] * len(node.operands)
        self.nodes.insert(pos, node)

    def redirect(self, j: int, to: int) -> None:
        """Every use of tensor ``j`` uses tensor ``to`` instead (``j`` stays, unused)."""
        for i, n in enumerate(self.nodes):
            if i != j:
                n.operands = [to if x == j else x for x in n.operands]
        for o in self.outputs:
            o[0] = to if o[0] == j else o[0]


@dataclass
class KernelSpec(Body):
    grid: list[int]
    block: tuple[int, ...]
    forloop_range: int
    dimx: int
    smem: int


@dataclass
class GraphSpec(Body):
    kernels: list[KernelSpec]


# --- graph <-> data ----------------------------------------------------------------------------

def _extract_tb(tb: ThreadBlockGraph) -> KernelSpec:
    nodes = [Node(t.op, [o.index for o in t.operands],
                  {"input_map": list(t.params["input_map"]), "forloop_dim": t.params[
                      "forloop_dim"]} if t.op == "input" else dict(t.params), t.dims)
             for t in tb.tensors]
    return KernelSpec(nodes, [[t.index, list(omap)] for t, omap in tb.outputs], list(tb.grid_dim),
                      tb.block_dim, tb.forloop_range, tb.reduction_dimx, tb.smem_bytes)


def extract(g: KernelGraph) -> GraphSpec:
    """``g`` as plain data (tensors numbered in ``g.tensors`` order)."""
    number = {t.index: i for i, t in enumerate(g.tensors)}
    kernels: list[KernelSpec] = []
    kid: dict[int, int] = {}
    nodes = []
    for t in g.tensors:
        if t.op is None:
            nodes.append(Node("graph_input", [], {"dtype": t.dtype}, t.dims))
            continue
        params = dict(t.params)
        if t.op == "customized":
            k = params["kernel"]
            if id(k) not in kid:
                kid[id(k)] = len(kernels)
                kernels.append(_extract_tb(k.tb))
            params = {"kernel": kid[id(k)], "output": params["output"]}
        nodes.append(Node(t.op, [number[o.index] for o in t.operands], params, t.dims))
    return GraphSpec(nodes, [[number[t.index], None] for t in g.outputs], kernels)


def _build_tb(ks: KernelSpec, sources: list[Tensor]) -> ThreadBlockGraph:
    tb = new_threadblock_graph(tuple(ks.grid), ks.block, ks.forloop_range, ks.dimx, ks.smem)
    bt: list[Any] = []
    for n in ks.nodes:
        args = [bt[i] for i in n.operands]
        if n.op == "input":
            if len(tb.inputs) >= len(sources):
                raise GraphError("mutant: more loaders than kernel inputs")
            p = n.params
            bt.append(tb.new_input(sources[len(tb.inputs)], tuple(p["input_map"]),
                                   p["forloop_dim"]))
        elif n.op in ("forloop_accum", "forloop_accum_rescale"):
            acc = n.params["acc"]
            bt.append(tb.forloop_accum(args[0], None if acc == "plain" else acc,
                                       rescale=args[1] if len(args) > 1 else None))
        elif n.op == "forloop_max":
            bt.append(tb.forloop_max(args[0]))
        elif n.op == "rms_norm" and len(args) == 1:  # normalises the (maybe new) last tile dim
            bt.append(tb.rms_norm(args[0]))
        else:
            bt.append(tb.apply(n.op, args, **dict(n.params)))
    for i, omap in ks.outputs:
        tb.new_output(bt[i], tuple(omap))
    return tb


def build(spec: GraphSpec) -> KernelGraph:
    """Rebuild the μGraph of ``spec`` through the public builders (raises their ``EMError``)."""
    g = new_kernel_graph()
    ts: list[Tensor] = []
    calls: dict[int, list[Tensor]] = {}
    for n in spec.nodes:
        args = [ts[i] for i in n.operands]
        if n.op == "graph_input":
            dtype: DType = n.params["dtype"]
            ts.append(g.new_input(n.dims, dtype))
        elif n.op == "customized":
            k, out = n.params["kernel"], n.params["output"]
            if k not in calls:
                calls[k] = g.customized(args, _build_tb(spec.kernels[k], args))
            if not 0 <= out < len(calls[k]):
                raise GraphError(f"mutant: kernel {k} has no output {out}")
            ts.append(calls[k][out])
        else:
            ts.append(g.apply(n.op, args, **dict(n.params)))
    for i, _ in spec.outputs:
        g.mark_output(ts[i])
    return g


def graph_key(g: KernelGraph) -> str:
    """A text that is equal for structurally equal μGraphs (their JSON, where they have one)."""
    try:
        return dumps(g)
    except EMError:
        return repr(extract(g))


# --- edits -------------------------------------------------------------------------------------

Edit = tuple[str, Callable[[GraphSpec], None]]
Getter = Callable[[GraphSpec], Any]


def _put(get: Getter, key: Any, value: Any) -> Callable[[GraphSpec], None]:
    """An edit setting ``get(spec)[key]`` (a dict or list) or its attribute ``key``."""
    def fn(s: GraphSpec) -> None:
        obj = get(s)
        if isinstance(obj, (dict, list)):
            obj[key] = copy.deepcopy(value)
        else:
            setattr(obj, key, copy.deepcopy(value))
    return fn


def _extra_edits(at: Getter, j: int, dims: tuple[int, ...]) -> list[Edit]:
    out: list[Edit] = []
    for op, p in EXTRA:
        new = Node("add" if op == "add_self" else op, [j, j] if op == "add_self" else [j],
                   dict(p), dims)
        out.append(("extra_op", lambda s, new=new: at(s).insert_after(j, copy.deepcopy(new))))
    return out


def _op_edits(at: Getter, body: Body, j: int, block: bool) -> list[Edit]:
    """Edits of operator ``j`` of ``body`` (``at(spec)`` finds the body in a copy)."""
    n, out = body.nodes[j], []
    node: Getter = lambda s: at(s).nodes[j]  # noqa: E731
    params: Getter = lambda s: at(s).nodes[j].params  # noqa: E731
    spec = OPS.get(n.op)  # None for the block graphs' own operators (loaders, accumulators)
    if len(n.operands) == 2 and n.operands[0] != n.operands[1]:
        out.append(("commutative_swap" if spec is not None and spec.commutative
                    else "swap_operands", _put(node, "operands", n.operands[::-1])))
    kind = spec.mutation_class if spec is not None else None
    if kind is not None:  # another operator of the same class (op table: ``mutation_class``)
        out += [(f"replace_{kind}", _put(node, "op", o)) for o, other in OPS.items()
                if other.mutation_class == kind and o != n.op]
    if n.op == "mul_scalar":
        c = n.params["scalar"]
        out += [("replace_scalar", _put(params, "scalar", x)) for x in (0.5, -c, c + 1.0)]
    if "dim" in n.params and n.operands:
        nd = len(body.nodes[n.operands[0]].dims)
        out += [("reduction_dim", _put(params, "dim", d))
                for d in (range(-nd, 0) if block else range(nd)) if d % nd != n.params["dim"] % nd]
    out += [("drop_op", lambda s, o=o: at(s).redirect(j, o)) for o in sorted(set(n.operands))]
    return out + _extra_edits(at, j, n.dims)


def _kernel_edits(spec: GraphSpec, k: int) -> list[Edit]:
    """Edits inside kernel ``k``: maps, accumulators, operators, grid, loop, reduction_dimx."""
    ks, out = spec.kernels[k], []
    at: Getter = lambda s: s.kernels[k]  # noqa: E731
    for j, n in enumerate(ks.nodes):
        p: Getter = lambda s, j=j: at(s).nodes[j].params  # noqa: E731
        if n.op == "input":
            imap, fd = n.params["input_map"], n.params["forloop_dim"]
            out += [("imap", _put(lambda s, p=p: p(s)["input_map"], a, v))
                    for a in range(3) for v in range(-1, len(n.dims)) if v != imap[a]]
            out += [("fmap", _put(p, "forloop_dim", v)) for v in range(-1, len(n.dims)) if v != fd]
        elif n.op in ("forloop_accum", "forloop_accum_rescale"):
            out += [("accumulator", _put(p, "acc", acc))
                    for acc in ACCUMULATORS if acc != n.params["acc"]]
            out += _rescale_edits(at, ks, j)
        if n.op in ("input", "forloop_accum", "forloop_accum_rescale"):
            out += _extra_edits(at, j, n.dims)
        else:
            out += _op_edits(at, ks, j, block=True)
    for i, (t, omap) in enumerate(ks.outputs):
        out += [("omap", _put(lambda s, i=i: at(s).outputs[i][1], a, v))
                for a in range(3) for v in range(-1, len(ks.nodes[t].dims)) if v != omap[a]]
    grid: Getter = lambda s: at(s).grid  # noqa: E731
    for a, size in enumerate(ks.grid):
        out += [("grid", _put(grid, a, x)) for x in (size * 2, size // 2)
                if x > size or size % 2 == 0]
        if size == 1:
            out += _grid_splits(ks, k, a)
    for attr in ("forloop_range", "dimx"):
        n_ = getattr(ks, attr)
        kind = "forloop_range" if attr == "forloop_range" else "reduction_dimx"
        out += [(kind, _put(at, attr, x)) for x in (n_ * 2, n_ // 2) if x > n_ or n_ % 2 == 0]
    return out


def _rescale_edits(at: Getter, ks: KernelSpec, j: int) -> list[Edit]:
    """An accumulator's rescale dropped, or its rescale tile replaced by another running max
    (or, for an accumulator without one, a running max added): online-softmax mistakes."""
    n, out = ks.nodes[j], []
    node: Getter = lambda s: at(s).nodes[j]  # noqa: E731

    def set_rescale(s: GraphSpec, m: int | None) -> None:
        nd = node(s)
        nd.op = "forloop_accum" if m is None else "forloop_accum_rescale"
        nd.operands = nd.operands[:1] + ([] if m is None else [m])
    if n.op == "forloop_accum_rescale":
        out.append(("rescale", lambda s: set_rescale(s, None)))
    maxes = [i for i, m in enumerate(ks.nodes[:j])
             if m.op == "forloop_max" and i not in n.operands[1:]]
    return out + [("rescale", lambda s, i=i: set_rescale(s, i)) for i in maxes]


def _grid_splits(ks: KernelSpec, k: int, a: int) -> list[Edit]:
    """Grid axis ``a`` (now 1 block) made 2 blocks, splitting one loader's dimension and placing
    every output along one of its dimensions."""
    out: list[Edit] = []
    out_nd = min(len(ks.nodes[t].dims) for t, _ in ks.outputs)
    for j, n in enumerate(ks.nodes):
        if n.op != "input":
            continue
        for d in range(len(n.dims)):
            if d in n.params["input_map"]:
                continue
            for od in range(out_nd):
                def fn(s: GraphSpec, j: int = j, d: int = d, od: int = od) -> None:
                    kk = s.kernels[k]
                    kk.grid[a] = 2
                    kk.nodes[j].params["input_map"][a] = d
                    for o in kk.outputs:
                        o[1][a] = od
                out.append(("grid_split", fn))
    return out


def _call_edits(spec: GraphSpec) -> list[Edit]:
    """Kernel-call inputs swapped, or one replaced by another tensor of the same dims."""
    out: list[Edit] = []
    first: dict[int, int] = {}
    for j, n in enumerate(spec.nodes):
        if n.op != "customized" or n.params["kernel"] in first:
            continue
        k = first[n.params["kernel"]] = n.params["kernel"]
        srcs, dims = n.operands, [spec.nodes[i].dims for i in n.operands]

        def set_srcs(s: GraphSpec, new: list[int], k: int = k) -> None:
            for m in s.nodes:
                if m.op == "customized" and m.params["kernel"] == k:
                    m.operands = list(new)
        for a in range(len(srcs)):
            for b in range(a + 1, len(srcs)):
                if srcs[a] != srcs[b] and dims[a] == dims[b]:
                    new = list(srcs)
                    new[a], new[b] = new[b], new[a]
                    out.append(("swap_kernel_inputs", lambda s, new=new: set_srcs(s, new)))
            for t in range(j):
                if t not in srcs and spec.nodes[t].dims == dims[a]:
                    new = list(srcs)
                    new[a] = t
                    out.append(("wrong_kernel_input", lambda s, new=new: set_srcs(s, new)))
    return out


def edits(spec: GraphSpec) -> list[Edit]:
    """Every single edit of ``spec`` (each a function changing a copy in place)."""
    out = _call_edits(spec)
    for j, n in enumerate(spec.nodes):
        if n.op not in ("graph_input", "customized"):
            out += _op_edits(lambda s: s, spec, j, block=False)
        elif n.op == "customized" or any(j in m.operands for m in spec.nodes):
            out += _extra_edits(lambda s: s, j, n.dims)
    for k in range(len(spec.kernels)):
        out += _kernel_edits(spec, k)
    return out


# --- mutants -----------------------------------------------------------------------------------

@dataclass
class MutationStats:
    """What ``mutants`` tried: built, invalid (a builder raised), or a duplicate."""

    tried: int = 0
    invalid: int = 0
    duplicates: int = 0
    yielded: int = 0
    exhausted: bool = False


def mutants(mugraph: KernelGraph, rng: random.Random, stats: MutationStats | None = None,
            max_edits: int = 2, max_stale: int = 2000) -> Iterator[tuple[str, KernelGraph]]:
    """Distinct valid mutants of ``mugraph``, labelled with their kind of edit.

    First every single edit of ``mugraph`` (in random order); then, without end, mutants of
    mutants: a random earlier mutant (or ``mugraph``) with 1..``max_edits`` random edits, a third
    of the time drawn only from ``EQUIVALENT_KINDS``. Stops after ``max_stale`` attempts in a row
    gave nothing new (``stats.exhausted``)."""
    stats = stats if stats is not None else MutationStats()
    base = extract(mugraph)
    seen = {graph_key(mugraph)}
    pool: list[tuple[str, GraphSpec]] = [("", base)]

    def attempt(s: GraphSpec) -> KernelGraph | None:
        stats.tried += 1
        try:
            g = build(s)
        except EMError:
            stats.invalid += 1
            return None
        key = graph_key(g)
        if key in seen:
            stats.duplicates += 1
            return None
        seen.add(key)
        stats.yielded += 1
        return g

    first = edits(base)
    rng.shuffle(first)
    stale = 0
    while stale < max_stale:
        if first:  # every single edit of the original
            label, fn = first.pop()
            s = copy.deepcopy(base)
            fn(s)
        else:  # 1..max_edits random edits of an earlier mutant
            label, s = _chain(pool, rng, max_edits)
        g = attempt(s)
        stale = stale + 1 if g is None and not first else 0
        if g is not None:
            pool.append((label, extract(g)))
            yield label, g
    stats.exhausted = True


def _chain(pool: list[tuple[str, GraphSpec]], rng: random.Random,
           max_edits: int) -> tuple[str, GraphSpec]:
    label, spec = rng.choice(pool)
    kinds = [label] if label else []
    s = copy.deepcopy(spec)
    equivalent_only = rng.random() < 1 / 3
    for _ in range(rng.randint(1, max_edits)):
        choices = edits(s)
        if equivalent_only:
            choices = [e for e in choices if e[0] in EQUIVALENT_KINDS] or choices
        kind, fn = rng.choice(choices)
        fn(s)
        kinds.append(kind)
    return "+".join(kinds), s
