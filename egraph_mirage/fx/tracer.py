"""The tracer: builds the kernel graph of one fx graph of aten operators, node by node.

Each node's rule (``aten.RULES``) calls the primitives of ``Tracer`` (``unary``, ``binary``,
``matmul``, ``reduce``, ``rms_norm``, ``softmax``, ``concat`` and the views). A value is a
``PendingView`` (a view of a program input, not yet a graph input: ``views.py``) or a
``Computed`` graph tensor relabelled to its torch shape; the graph is laid out so that operands
of one operator line up (``_operands``), left-padded with size-1 dims to the graph's rank (the
largest rank of a computing node's tensors).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..errors import EMError, UnsupportedOpError
from ..graph import KernelGraph, Tensor
from ..ops import OPS
from . import aten
from .traced import (
    DTYPES,
    Computed,
    InputView,
    OutputView,
    TracedProgram,
    UnsupportedDTypeError,
    aten_name,
    meta_of,
    user_line,
)
from .views import (
    Expanded,
    PendingView,
    Relayout,
    Shape,
    Source,
    Step,
    blocks,
    fit,
    graph_dim,
    layout,
    refines,
)

#: how many times a trace starts again to lay a node out as a later operator wants it
MAX_RELAYOUTS = 64


def _live(graph: Any) -> set[Any]:
    """The nodes the output depends on."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    live, stack = {out}, [out]
    while stack:
        for n in stack.pop().all_input_nodes:
            if n not in live:
                live.add(n)
                stack.append(n)
    return live


def _leaves(x: Any) -> list[Any]:
    return [y for v in x for y in _leaves(v)] if isinstance(x, (tuple, list)) else [x]


class Tracer:
    """Builds the kernel graph of one fx graph; its public methods are the primitives the
    mapping table's rules call."""

    def __init__(self, gm: Any, example_inputs: Sequence[Any]) -> None:
        self.gm = gm
        self.example_inputs = example_inputs
        self.g = KernelGraph()
        self.inputs: list[InputView] = []
        self.attributes: dict[str, Any] = {}
        self.memo: dict[tuple[Any, ...], Tensor] = {}
        self.values: dict[Any, Any] = {}
        self.node: Any = None
        self.rank = 1
        #: fx node name -> graph dims its graph tensor is laid out in (``Relayout``)
        self.hints: dict[str, Shape] = {}
        #: graph tensor index -> the fx node whose rule made it
        self.producer: dict[int, str] = {}

    # --- the walk --------------------------------------------------------------------------
    def run(self) -> TracedProgram:
        """The traced program; where a later operator wants an earlier value laid out in other
        graph dims (a split of heads, a size-1 dim where an expand broadcasts), the trace starts
        again with that node laid out so (``hints``)."""
        seen: set[tuple[tuple[str, Shape], ...]] = set()
        for _ in range(MAX_RELAYOUTS):
            try:
                return self._build()
            except Relayout as r:
                if self.hints.get(r.node) == r.dims:
                    raise self._located(UnsupportedOpError, f"{r.node} laid out as graph dims "
                                        f"{r.dims} still does not fit") from None
                before = self.hints.get(r.node)
                self.hints[r.node] = r.dims
                state = tuple(sorted(self.hints.items()))
                if state in seen:  # the same hints again: operators ask in turn for each
                    raise self._located(UnsupportedOpError, f"{r.node} is wanted as graph dims "
                                        f"{r.dims} and as {before} by different operators; "
                                        "no layout found serves both") from None
                seen.add(state)
        raise self._located(UnsupportedOpError, f"no layout fits after {MAX_RELAYOUTS} tries")

    def _build(self) -> TracedProgram:
        self.g = KernelGraph()
        self.inputs, self.attributes, self.memo, self.values = [], {}, {}, {}
        self.producer = {}
        live = _live(self.gm.graph)
        self.rank = max([1, *(len(meta_of(m).shape) for n in live if self._computes(n)
                              for m in (n, *n.all_input_nodes) if hasattr(meta_of(m), "shape")),
                         *(len(meta_of(n).shape) for n in live if _broadcasts(n))])
        out_node = None
        for position, node in enumerate(n for n in self.gm.graph.nodes if n.op == "placeholder"):
            self.values[node] = self._source(node, "placeholder", position)
        for node in self.gm.graph.nodes:
            if node not in live or node.op == "placeholder":
                continue
            self.node = node
            if node.op == "output":
                out_node = node
                continue
            try:
                self.values[node] = value = self._visit(node)
                if isinstance(value, (Computed, Expanded)):
                    self.producer.setdefault(value.tensor.index, node.name)
            except UnsupportedOpError as exc:
                raise exc if exc.node is not None else self._located(type(exc), str(exc))
            except EMError as exc:
                raise self._located(UnsupportedOpError, f"{type(exc).__name__}: {exc}") from None
        return TracedProgram(self.g, (), tuple(self.inputs), self._outputs(out_node),
                             dict(self.attributes))

    def _computes(self, node: Any) -> bool:
        rule = aten.RULES.get(aten_name(node.target)) if node.op == "call_function" else None
        return rule is not None and rule.kind == aten.COMPUTE and meta_of(node) is not None

    def _located(self, cls: type[UnsupportedOpError], reason: str) -> UnsupportedOpError:
        op = aten_name(self.node.target)
        where = user_line(self.node)
        at = f" at {where}" if where else ""
        return cls(f"{op} ({self.node.name}) is not supported: {reason}{at}", op=op,
                   node=self.node.name, where=where)

    def _source(self, node: Any, kind: str, position: int) -> Any:
        value = meta_of(node)
        if value is None and kind == "placeholder" and position < len(self.example_inputs):
            value = self.example_inputs[position]
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            return value  # a Python value (int, None, ...)
        return PendingView.of(Source(node.name if kind == "placeholder" else node.target, kind,
                                     position, tuple(value.shape), tuple(value.stride()),
                                     value.dtype))

    def _visit(self, node: Any) -> Any:
        if node.op == "get_attr":
            value = functools.reduce(getattr, node.target.split("."), self.gm)
            self.attributes[node.target] = value
            return self._source(node, "attribute", -1)
        if node.op != "call_function":
            raise UnsupportedOpError(f"{node.op} nodes are not traced")
        rule = aten.RULES.get(aten_name(node.target))
        if rule is None:
            raise UnsupportedOpError("no op-table operator computes it")
        reason = aten.refusal(rule, node.args, node.kwargs)
        if reason is not None:
            raise UnsupportedOpError(reason)
        args, kwargs = _map(node.args, self.values), _map(node.kwargs, self.values)
        return self._checked(rule.emit(self, *args, **kwargs))

    def _checked(self, value: Any) -> Any:
        """``value`` with the torch shape and dtype of the current node (fx's record); a graph
        tensor of another float type is cast to it."""
        meta = meta_of(self.node)
        if meta is None or not hasattr(meta, "shape"):
            return value
        shape = tuple(meta.shape)
        if isinstance(value, Computed):
            if math.prod(value.tensor.dims) != math.prod(shape):
                raise UnsupportedOpError(f"the graph holds it as dims {value.tensor.dims}, "
                                         f"not {shape}")
            float_type = str(meta.dtype).removeprefix("torch.") in DTYPES
            tensor = self._converted(value.tensor, meta.dtype) if float_type else value.tensor
            return Computed(tensor, shape, meta.dtype)
        if isinstance(value, PendingView) and value.shape != shape:
            raise UnsupportedOpError(f"its view has shape {value.shape}, not {shape}")
        if isinstance(value, Expanded):
            if math.prod(value.full) != math.prod(shape):
                raise UnsupportedOpError(f"the graph holds it as dims {value.full}, not {shape}")
            return replace(value, shape=shape)
        return value

    def _outputs(self, out_node: Any) -> tuple[OutputView, ...]:
        outs = []
        for i, node in enumerate(_leaves(out_node.args[0] if out_node is not None else ())):
            value = self.values.get(node) if hasattr(node, "op") else node
            if isinstance(value, Expanded):
                value = self._materialised(value)
            if not hasattr(node, "op"):
                raise UnsupportedOpError(f"trace_fx: output {i} is {node!r}, not a tensor")
            if not isinstance(value, Computed):
                self.node = node
                what = f"a view of input {value.source.name!r}" if isinstance(
                    value, PendingView) else "a broadcast of a computed value (a copy)" if \
                    isinstance(value, Expanded) else type(value).__name__
                raise self._located(UnsupportedOpError, f"output {i} is {what}: nothing for a "
                                    "kernel graph to compute")
            if value.tensor not in self.g.outputs:
                self.g.mark_output(value.tensor)
            outs.append(OutputView(node.name, self.g.outputs.index(value.tensor), value.shape,
                                   str(value.dtype).removeprefix("torch.")))
        if not outs:
            raise UnsupportedOpError("trace_fx: the program has no tensor outputs")
        return tuple(outs)

    # --- building blocks -------------------------------------------------------------------
    @property
    def out_shape(self) -> Shape:
        return tuple(meta_of(self.node).shape)

    @property
    def out_dtype(self) -> Any:
        return meta_of(self.node).dtype

    def apply(self, op: str, operands: Sequence[Tensor], **known: Any) -> Tensor:
        """Op-table operator ``op`` on graph tensors; ``known``: the parameters the tracer can
        set, of which the entry's are taken."""
        spec = OPS.get(op)
        if spec is None:
            raise UnsupportedOpError(f"needs op-table operator {op!r}, which "
                                     "egraph_mirage.ops.OPS does not have")
        unknown = [p for p in spec.params if p not in known]
        if unknown:
            raise UnsupportedOpError(f"op-table operator {op!r} takes parameters {unknown} "
                                     "that the tracer does not set")
        optional = [p for p in getattr(spec, "optional_names", ()) if p in known]
        return self.g.apply(op, operands, **{p: known[p] for p in (*spec.params, *optional)})

    def _input(self, view: PendingView, steps: tuple[Step, ...], dims: Shape) -> Tensor:
        """The graph input for ``view`` made by ``steps`` (one per distinct view), cast to the
        view's dtype where the program cast the input (one cast per input and dtype)."""
        src = view.source
        key = (src.kind, src.name, steps, dims)
        if key not in self.memo:
            dtype = _graph_dtype(src.dtype, f"input {src.name!r}")
            self.memo[key] = self.g.new_input(dims, dtype)
            self.inputs.append(InputView(src.name, src.kind, src.position, steps, dims, dtype))
        return self._converted(self.memo[key], view.dtype, key)

    def _converted(self, t: Tensor, dtype: Any, key: tuple[Any, ...] | None = None) -> Tensor:
        """Graph tensor ``t`` as torch dtype ``dtype``: op-table operator ``cast`` where the
        dtypes differ (memoised by ``key``)."""
        want = _graph_dtype(dtype, "a cast")
        if t.dtype is want:
            return t
        if key is None:
            return self.apply("cast", [t], dtype=want.value)
        if (*key, want) not in self.memo:
            self.memo[(*key, want)] = self.apply("cast", [t], dtype=want.value)
        return self.memo[(*key, want)]

    def hint(self) -> Shape | None:
        """The graph dims the current node's tensor is to be laid out in, if a later operator
        asked (``Relayout``)."""
        return self.hints.get(self.node.name) if self.node is not None else None

    def _relayout(self, value: Computed, dims: Shape, why: str) -> Relayout:
        """A ``Relayout`` of the node that made ``value``'s graph tensor into ``dims``; an
        ``UnsupportedOpError`` saying ``why`` where none can be asked for."""
        node = self.producer.get(value.tensor.index)
        if node is None or math.prod(dims) != math.prod(value.tensor.dims) or \
                self.hints.get(node) == dims:
            raise UnsupportedOpError(why)
        return Relayout(node, dims)

    def computed(self, value: Any, what: str, dims: Shape | None = None) -> Computed:
        """``value`` as a graph tensor; a view of an input becomes a graph input of its shape,
        left-padded with size-1 dims to the graph's rank (or laid out as ``dims``, default: the
        current node's ``hint``; ``()``: no layout asked). A computed value laid out finer than
        ``dims`` (``refines``: a per-head norm's heads split further into grouped-query
        attention's (kv_heads, n_rep)) serves as is: asking for the coarser layout would undo
        the split that another consumer asked for."""
        dims = self.hint() if dims is None else (dims or None)
        if isinstance(value, Expanded):
            raise UnsupportedOpError(f"{what} of a broadcast (expanded) computed value would "
                                     "materialise it (a copy)")
        if isinstance(value, Computed):
            if dims is not None and value.tensor.dims != dims and \
                    math.prod(dims) == math.prod(value.tensor.dims) and \
                    not refines(value.tensor.dims, dims):
                raise self._relayout(value, dims, f"{what}: held as graph dims "
                                     f"{value.tensor.dims}, wanted as {dims}")
            return value
        if not isinstance(value, PendingView):
            raise UnsupportedOpError(f"{what}: expected a tensor, got {value!r}")
        S = value.shape
        L = (1,) * (self.rank - len(S)) + S
        if dims is not None and math.prod(dims) == math.prod(S):
            L = dims
        steps, got = value.materialise(S, L, what)
        if got != L:
            raise UnsupportedOpError(f"{what}: the expanded view of input {value.source.name!r} "
                                     "would have to be materialised (a copy)")
        return Computed(self._input(value, steps, got), S, value.dtype)

    def _fit(self, value: Any, R: Shape, L: Shape, tail: Shape, what: str) -> Tensor:
        """``value`` as an operand of a result of torch shape ``R`` (+ its own matrix dims
        ``tail``) laid out as graph dims ``L``."""
        if isinstance(value, PendingView):
            steps, dims = value.materialise(R + tail, L + tail, what)
            if dims[len(dims) - len(tail):] != tail:
                raise UnsupportedOpError(f"{what}: a matrix dim of input "
                                         f"{value.source.name!r} is an expanded view (a copy)")
            return self._input(value, steps, dims)
        S = value.shape[:len(value.shape) - len(tail)]
        G = value.full if isinstance(value, Expanded) else value.tensor.dims
        want = fit((1,) * (len(R) - len(S)) + S, R, L)
        if want is not None and want + tail == G:
            return value.tensor
        why = (f"{what}: an operand of torch shape {value.shape} is held as graph dims {G}, "
               f"which an earlier reshape laid out unlike the other operand ({R} as {L})")
        if want is None or isinstance(value, Expanded):
            raise UnsupportedOpError(why)
        raise self._relayout(value, want + tail, why)

    def _operands(self, R: Shape, values: Sequence[Any], tail: int, what: str,
                  hint: Shape | None = None) -> tuple[Shape, list[Tensor]]:
        """A layout (graph dims) for a result of torch shape ``R`` (the batch dims of a matmul,
        whose operands keep their last ``tail`` dims), and each operand in it: the layout
        ``hint``, else a broadcast operand's, else a computed operand's, else one split where
        the views of inputs split their dims; the first that every view of an input takes (a
        computed operand laid out otherwise is laid out again: ``Relayout``)."""
        candidates: list[Shape] = [] if hint is None else [hint]
        splits: list[list[Shape]] = [[] for _ in R]
        for v in sorted(values, key=lambda v: not isinstance(v, Expanded)):
            if not isinstance(v, (Computed, PendingView, Expanded)):
                raise UnsupportedOpError(f"{what}: expected a tensor, got {v!r}")
            S = v.shape[:len(v.shape) - tail]
            aligned = (1,) * (len(R) - len(S)) + S
            if isinstance(v, (Computed, Expanded)):
                G = v.full if isinstance(v, Expanded) else v.tensor.dims
                if tail and (G[-tail:] != v.shape[-tail:] or math.prod(G) != math.prod(v.shape)):
                    raise UnsupportedOpError(f"{what}: an earlier reshape merged a matrix dim "
                                             f"(torch shape {v.shape}, graph dims {G})")
                if aligned == R:
                    candidates.append(G[:len(G) - tail])
                continue
            for i in range(len(R) - len(S), len(R)):
                run = [s for s, _ in v.group(i - (len(R) - len(S))) if s != 1]
                if aligned[i] == R[i] and len(run) > 1:
                    splits[i].append(tuple(run))
        candidates.append(layout(R, splits, self.rank - tail))
        error: UnsupportedOpError | None = None
        for L in dict.fromkeys(candidates):
            try:
                for v in values:
                    if isinstance(v, PendingView):
                        v.materialise(R + tuple(v.shape[len(v.shape) - tail:]),
                                      L + tuple(v.shape[len(v.shape) - tail:]), what)
                    elif isinstance(v, Expanded):
                        S = v.shape[:len(v.shape) - tail]
                        if fit((1,) * (len(R) - len(S)) + S, R, L) != v.full[:len(v.full) - tail]:
                            raise UnsupportedOpError(f"{what}: a broadcast computed value held "
                                                     f"as graph dims {v.full} does not fit "
                                                     f"{R} as graph dims {L}")
                    else:  # computed: laid out again where it must, if it can be at all
                        S = v.shape[:len(v.shape) - tail]
                        if fit((1,) * (len(R) - len(S)) + S, R, L) is None:
                            raise UnsupportedOpError(
                                f"{what}: an operand of torch shape {v.shape} is held as graph "
                                f"dims {v.tensor.dims}, which an earlier reshape laid out "
                                f"unlike the other operand ({R} as {L})")
            except UnsupportedOpError as exc:
                error = error or exc
                continue
            return L, [self._fit(v, R, L, tuple(v.shape[len(v.shape) - tail:]), what)
                       for v in values]
        assert error is not None
        raise error

    # --- primitives the rules call ---------------------------------------------------------
    def unary(self, op: str, x: Any, **params: Any) -> Computed:
        c = self.computed(x, op)
        return Computed(self.apply(op, [c.tensor], **params), c.shape, c.dtype)

    def binary(self, op: str, a: Any, b: Any, hint: Shape | bool | None = True) -> Computed:
        """Element-wise ``op``; the result laid out as ``hint`` (default: the node's)."""
        import torch

        R = tuple(torch.broadcast_shapes(a.shape, b.shape))
        a, b = self.as_result(a), self.as_result(b)  # torch's type promotion
        wanted = self.hint() if hint is True else hint
        if wanted is not None and math.prod(wanted) != math.prod(R):
            wanted = None
        L, tensors = self._operands(R, [a, b], 0, op, wanted or None)
        out = self.apply(op, tensors)
        if out.dims != L:
            raise UnsupportedOpError(f"{op}: both operands broadcast a dim of the result "
                                     f"(graph dims {out.dims}, torch shape {R})")
        return Computed(out, R, a.dtype)

    def matmul(self, a: Any, b: Any) -> Computed:
        import torch

        if len(a.shape) < 2 or len(b.shape) < 2:
            raise UnsupportedOpError("a matrix-vector product (an operand of rank 1)")
        R = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        m, n, k = a.shape[-2], b.shape[-1], a.shape[-1]
        hint = self.hint()
        if hint is not None and (len(hint) < 2 or hint[-2:] != (m, n)):
            split = self._split_columns(a, b, hint, R)
            if split is not None:
                return split
            hint = None
        if k == 1 and (_held_otherwise(a) or _held_otherwise(b)):
            # an outer product (a decode step's attention over one key): a * b, broadcast
            return self.binary("mul", a, b, hint)
        if n == 1 and _held_otherwise(b):
            # one column held as a row (q @ k^T over one key): the sum over k of a * b^T
            bt = self.reshape(b, (*b.shape[:-2], 1, k))
            prod = self.binary("mul", a, bt, None if hint is None else (*hint[:-1], k))
            return self.reduce("reduction", prod, [-1], True)
        cut = _heads_cut(a.tensor.dims, math.prod(R) * m, k) if isinstance(a, Computed) \
            else None
        if cut is not None and len(b.shape) == 2 and isinstance(b, PendingView):
            # a's features held as (rows..., heads..., 1, head_dim) (an attention's output at
            # decode, into its output projection): one product per row and head, summed over
            # the heads
            G = a.tensor.dims
            heads = self.reshape(b, (*(1,) * cut, *G[cut:-2], G[-1], n))
            out = self.apply("matmul", [a.tensor, self._fit(heads, (), (), heads.shape,
                                                            "matmul")])
            for e in (e for e in range(cut, len(G) - 2) if G[e] != 1):
                out = self.apply("reduction", [out], dim=e)
            return Computed(out, (*R, m, n), a.dtype)
        if isinstance(a, Computed) and a.tensor.dims[-2:] != a.shape[-2:] and \
                a.tensor.dims[-1] == a.shape[-1] and len(b.shape) == 2:
            # A's rows spread over graph dims (a reshape merged leading dims into them, as
            # linear on a 3-d input does): B broadcasts over all of them
            lead = (1,) * (len(a.tensor.dims) - 2)
            rhs = self._fit(b, (), lead, tuple(b.shape[-2:]), "matmul")
            out = self.apply("matmul", [a.tensor, rhs])
            return Computed(out, (*R, m, n), a.dtype)
        if isinstance(a, PendingView) and len(b.shape) == 2 and len(a.shape) > 2 and \
                math.prod(a.shape[:-2]) > 1 and len(a.shape) <= self.rank and hint is None:
            # an input's leading dims times a weight (a Linear on (batch, tokens, features)):
            # the leading dims and the rows merge into the rows of one matrix product, so
            # the weight is read once and the search sees (rows, k) @ (k, n)
            rows = math.prod(a.shape[:-1])
            lead = (1,) * (self.rank - 2)
            S = (1,) * (self.rank - len(a.shape)) + tuple(a.shape)
            steps, dims = a.materialise(S, (*lead, rows, a.shape[-1]), "matmul")
            lhs = self._input(a, steps, dims)
            rhs = self._fit(b, (), lead, tuple(b.shape), "matmul")
            return Computed(self.apply("matmul", [lhs, rhs]), (*R, m, n), a.dtype)
        L, tensors = self._operands(R, [a, b], 2, "matmul", None if hint is None else hint[:-2])
        out = self.apply("matmul", tensors)
        if out.dims != (*L, m, n):
            raise UnsupportedOpError(f"matmul: both operands broadcast a batch dim "
                                     f"(graph dims {out.dims}, torch shape {(*R, m, n)})")
        return Computed(out, (*R, m, n), a.dtype)

    def _split_columns(self, a: Any, b: Any, hint: Shape, R: Shape) -> Computed | None:
        """``a @ b`` for a weight ``b`` whose columns a later view splits into heads, laid out
        as ``hint`` = (rows..., heads..., 1, head_dim), the rows (``R`` and ``m``, in order)
        before the heads (a projection at decode: one row per sequence; the result's element
        order is the product's own): ``a`` as (rows..., 1, ..., 1, k), ``b`` viewed as
        (1, ..., heads..., k, head_dim), one product per row and head, broadcast both ways.
        None where it does not apply."""
        m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
        rows = math.prod(R) * m
        if not (len(b.shape) == 2 and len(hint) >= 3 and isinstance(b, PendingView)
                and hint[-2] == 1 and n % hint[-1] == 0
                and math.prod(hint[:-2]) == rows * (n // hint[-1])):
            return None
        cut = next((p for p in range(len(hint) - 1) if math.prod(hint[:p]) == rows), None)
        if cut is None:
            return None
        d, lead, heads = hint[-1], hint[:cut], hint[cut:-2]
        ones = (1,) * len(heads)
        lhs = self._fit(self.reshape(a, (*lead, *ones, 1, k)), (), (), (*lead, *ones, 1, k),
                        "matmul")
        weight = self.reshape(self.permute(self.reshape(b, (k, n // d, d)), (1, 0, 2)),
                              (*(1,) * len(lead), *heads, k, d))
        rhs = self._fit(weight, (), (), weight.shape, "matmul")
        return Computed(self.apply("matmul", [lhs, rhs]), (*R, m, n), a.dtype)

    def _materialised(self, x: Expanded) -> Computed:
        """A broadcast value that leaves the graph (an output) as a graph tensor of its full
        dims: the copy torch makes (``clone`` of the expand), by concatenating the tensor with
        itself along each broadcast dim."""
        t = x.tensor
        for e, size in enumerate(x.full):
            whole = t
            while whole.dims[e] * 2 <= size:
                whole = self.apply("concat", [whole, whole], dim=e)
            while whole.dims[e] < size:
                whole = self.apply("concat", [whole, t], dim=e)
            t = whole
        return Computed(t, x.shape, x.dtype)

    def _dim(self, c: Computed, d: int, what: str) -> int:
        e = graph_dim(c.shape, c.tensor.dims, d)
        big = tuple(s for s in c.shape if s != 1)
        if e is None and big and self.rank > len(big):  # each dim a graph dim of its own
            own = (1,) * (self.rank - len(big) - 1) + big[:-1] + (1,) + big[-1:]
            if graph_dim(c.shape, own, d) is not None:
                raise self._relayout(c, own, f"{what} along dim {d}, which an earlier reshape "
                                     f"merged (torch shape {c.shape}, graph dims "
                                     f"{c.tensor.dims})")
        if e is None:
            raise UnsupportedOpError(f"{what} along dim {d}, which an earlier reshape merged or "
                                     f"split (torch shape {c.shape}, graph dims {c.tensor.dims})")
        return e

    def _unreduced(self, S: Shape, wanted: Sequence[int]) -> Shape | None:
        """Graph dims for the operand (torch shape ``S``) of a reduction along torch dims
        ``wanted`` whose result is to be laid out as the node's ``hint``: the hint with each
        reduced dim's size restored in a size-1 graph dim of its own (the last that serves);
        None where there is no hint or none fits."""
        H = self.hint()
        if H is None or math.prod(H) * math.prod(S[d] for d in wanted) != math.prod(S):
            return None
        part, G = [1 if d in wanted else s for d, s in enumerate(S)], list(H)
        for d in (d for d in wanted if S[d] != 1):
            part[d] = S[d]
            e = next((e for e in reversed(range(len(G))) if G[e] == 1 and graph_dim(
                tuple(part), (*G[:e], S[d], *G[e + 1:]), d) == e), None)
            if e is None:
                return None
            G[e] = S[d]
        return tuple(G)

    def reduce(self, op: str, x: Any, dims: Any, keepdim: bool) -> Computed:
        """``op`` along torch dims ``dims``; its operand laid out so that the result is laid
        out as the node's hint, where one was asked (``_unreduced``)."""
        x = self.as_result(x)
        rank = len(x.shape)
        if rank == 0:  # a reduction of a single number is that number
            return self.computed(x, op, dims=())
        dims = range(rank) if dims is None or dims == [] else dims
        wanted = sorted({d % rank for d in ([dims] if isinstance(dims, int) else dims)})
        c = self.computed(x, op, dims=self._unreduced(tuple(x.shape), wanted) or ())
        S, t = c.shape, c.tensor
        for d in wanted:
            if S[d] == 1:
                continue
            e = self._dim(Computed(t, S, c.dtype), d, op)
            expect = tuple(1 if k == e else s for k, s in enumerate(t.dims))
            t = self.apply(op, [t], dim=e)
            if t.dims != expect:
                raise UnsupportedOpError(f"op-table operator {op!r} gave dims {t.dims}, not "
                                         f"{expect} (the reduced dim kept with size 1)")
            S = tuple(1 if k == d else s for k, s in enumerate(S))
        if not keepdim:
            S = tuple(s for k, s in enumerate(S) if k not in wanted)
        return Computed(t, S, c.dtype)

    def rms_norm(self, x: Any, normalized_shape: Shape, weight: Any, eps: float | None
                 ) -> Computed:
        import torch

        c = self.computed(x, "rms_norm")
        S, G = c.shape, c.tensor.dims
        start = len(S) - len(normalized_shape)
        j = next((rj.start for ri, rj in blocks(S, G) if ri.start == start and len(ri)), None)
        if j is None or j >= len(G):
            raise UnsupportedOpError(f"rms_norm over {normalized_shape}, which an earlier "
                                     f"reshape merged with other dims (graph dims {G})")
        operands = [c.tensor]
        if weight is not None:
            operands.append(self._fit(weight, S, G, (), "rms_norm's weight"))
        eps = torch.finfo(c.dtype).eps if eps is None else eps
        out = self.apply("rms_norm", operands, normalized_shape=G[j:], eps=float(eps))
        return Computed(out, S, c.dtype)

    def softmax(self, x: Any, dim: int) -> Computed:
        """The stable decomposition: exp(x - amax(x)) / sum(exp(x - amax(x))); along a dim of
        size 1 (attention over one key), exp(x - x) / exp(x - x)."""
        c = self.computed(self.as_result(x), "softmax")
        t = c.tensor
        if c.shape[dim % len(c.shape)] == 1:
            num = self.apply("exp", [self.apply("sub", [t, t])])
            return Computed(self.apply("div", [num, num]), c.shape, c.dtype)
        e = self._dim(c, dim % len(c.shape), "softmax")
        num = self.apply("exp", [self.apply("sub", [t, self.apply("amax", [t], dim=e)])])
        return Computed(self.apply("div", [num, self.apply("reduction", [num], dim=e)]),
                        c.shape, c.dtype)

    def concat(self, values: Sequence[Any], dim: int) -> Computed:
        d = dim % len(values[0].shape)
        hint = self.hint()
        e = None if hint is None else graph_dim(self.out_shape, hint, d)
        if e is None:
            cs = [self.computed(v, "cat", dims=()) for v in values]
        else:  # each operand laid out as the result, less the joined dim's size
            cs = [self.computed(v, "cat", dims=(*hint[:e], v.shape[d], *hint[e + 1:]))
                  for v in values]
        out, e = cs[0].tensor, self._dim(cs[0], d, "cat")
        for c in cs[1:]:
            if self._dim(c, d, "cat") != e:
                raise UnsupportedOpError("cat of operands laid out differently")
            out = self.apply("concat", [out, c.tensor], dim=e)
        return Computed(out, self.out_shape, cs[0].dtype)

    def reshape(self, x: Any, shape: Shape) -> Any:
        if isinstance(x, PendingView):
            return x.reshape(tuple(shape))
        if isinstance(x, Expanded):
            return replace(x, shape=tuple(shape))
        return Computed(x.tensor, tuple(shape), x.dtype)

    def permute(self, x: Any, perm: Sequence[int]) -> Any:
        perm = tuple(p % len(x.shape) for p in perm)
        if isinstance(x, PendingView):
            return x.permute(perm)
        if not aten.relabels(x.shape, perm):
            raise UnsupportedOpError(f"a permute of an intermediate is a copy here: {perm} on "
                                     f"shape {x.shape} moves dims of size > 1 (a transpose; "
                                     "the kernel graph has none); only permutes of views of "
                                     "inputs, or of size-1 dims, fold")
        return self.reshape(x, tuple(x.shape[p] for p in perm))

    def transpose(self, x: Any, d0: int, d1: int) -> Any:
        perm = list(range(len(x.shape)))
        d0, d1 = d0 % max(1, len(perm)), d1 % max(1, len(perm))
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return self.permute(x, perm)

    def expand(self, x: Any, sizes: Shape) -> Any:
        if isinstance(x, PendingView):
            return x.expand(sizes)
        pad = len(sizes) - len(x.shape)
        S = (1,) * pad + tuple(x.shape)
        shape = tuple(s if s != -1 else S[i] for i, s in enumerate(sizes))
        T = x.tensor
        full = list(x.full if isinstance(x, Expanded) else T.dims)
        for i, (old, new) in enumerate(zip(S, shape)):
            if old == new:
                continue
            e = graph_dim(S, tuple(full), i) if old == 1 else None
            if e is None or full[e] != 1 or T.dims[e] != 1:
                if isinstance(x, Computed) and len(S) <= self.rank:
                    # lay the value out with a size-1 graph dim of its own for this dim
                    raise self._relayout(x, (1,) * (self.rank - len(S)) + S,
                                         f"an expand of an intermediate along dim {i}, which "
                                         f"the graph holds merged (graph dims {tuple(full)})")
                raise UnsupportedOpError(f"an expand of an intermediate along dim {i}, which "
                                         f"has no size-1 graph dim of its own (torch shape {S}, "
                                         f"graph dims {tuple(full)}): it would be a copy")
            full[e] = new
        if tuple(full) == T.dims:
            return Computed(T, shape, x.dtype)
        return Expanded(T, tuple(full), shape, x.dtype)

    def slice(self, x: Any, dim: int, start: int | None, end: int | None) -> Any:
        size = x.shape[dim % len(x.shape)]
        lo, hi, _ = slice(start, end).indices(size)
        d, length = dim % len(x.shape), max(0, hi - lo)
        if isinstance(x, PendingView):
            return x.narrow(d, lo, length)
        if length == size:
            return x
        x = self.computed(x, "slice", dims=())
        if d != len(x.shape) - 1 or self._dim(x, d, "slice") != len(x.tensor.dims) - 1:
            raise UnsupportedOpError("a slice of an intermediate other than along its last dim "
                                     "(only views of inputs fold)")
        out = self.apply("slice_last", [x.tensor], start=lo, stop=hi, end=hi, length=length)
        return Computed(out, (*x.shape[:-1], length), x.dtype)

    def select(self, x: Any, dim: int, index: int) -> Any:
        d = dim % len(x.shape)
        sliced = self.slice(x, d, index, index + 1 if index != -1 else None)
        return self.reshape(sliced, x.shape[:d] + x.shape[d + 1:])

    def repeat_interleave(self, x: Any, repeats: int, dim: int) -> Any:
        """Each slice along ``dim`` repeated: unsqueeze, expand, merge (a view of an input)."""
        S, d = x.shape, dim % len(x.shape)
        y = self.expand(self.reshape(x, (*S[:d + 1], 1, *S[d + 1:])),
                        (*S[:d + 1], repeats, *S[d + 1:]))
        return self.reshape(y, (*S[:d], S[d] * repeats, *S[d + 1:]))

    def cast(self, x: Any, dtype: Any) -> Any:
        """``x`` converted to torch dtype ``dtype``: on a view of an input, a cast done where
        the input is read (``_input``); on a computed value, op-table operator ``cast``."""
        if isinstance(x, PendingView):
            return replace(x, dtype=dtype)
        c = self.computed(x, "cast")
        return Computed(self._converted(c.tensor, dtype), c.shape, dtype)

    def as_result(self, x: Any) -> Any:
        """``x`` cast to the current node's dtype where torch computes the node in it (the
        ``dtype`` argument of a reduction, softmax's ``half_to_float``, type promotion)."""
        meta = meta_of(self.node)
        dtype = getattr(meta, "dtype", None)
        return x if dtype is None or getattr(x, "dtype", dtype) == dtype else self.cast(x, dtype)


def _broadcasts(node: Any) -> bool:
    """Whether ``node`` is an expand (its rank is the rank a broadcast value needs)."""
    return node.op == "call_function" and aten_name(node.target) in (
        "aten.expand.default", "aten.repeat_interleave.self_int") and meta_of(node) is not None


def _held_otherwise(v: Any) -> bool:
    """Whether computed value ``v``'s graph dims do not end with its torch matrix dims (a
    relabelling moved a size-1 dim into them), or it is broadcast."""
    if isinstance(v, Expanded):
        return v.full[-2:] != v.shape[-2:]
    return isinstance(v, Computed) and v.tensor.dims[-2:] != v.shape[-2:]


def _heads_cut(G: Shape, rows: int, k: int) -> int | None:
    """Where graph dims ``G`` hold ``rows`` rows of ``k`` features as (rows..., heads..., 1,
    head_dim): the number of leading dims that hold the rows; None where they do not."""
    if len(G) < 3 or G[-2] != 1 or G[-1] == k or k % G[-1] or \
            math.prod(G[:-2]) != rows * (k // G[-1]):
        return None
    return next((c for c in range(len(G) - 1) if math.prod(G[:c]) == rows), None)


def _graph_dtype(dtype: Any, what: str) -> Any:
    """The graph dtype of torch dtype ``dtype``; an ``UnsupportedDTypeError`` naming ``what``
    for a type kernel graphs do not take."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise UnsupportedDTypeError(f"{what} has dtype {name}; kernel graphs take float16, "
                                    "bfloat16 or float32")
    return DTYPES[name]


def _map(x: Any, values: Mapping[Any, Any]) -> Any:
    """fx arguments with each node replaced by its traced value."""
    import torch

    return torch.fx.node.map_arg(x, lambda n: values[n])


