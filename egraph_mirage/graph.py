"""Kernel graphs: the programs users write, through a Mirage-style builder API.

    import egraph_mirage as em
    g = em.new_kernel_graph()
    X = g.new_input(dims=(2, 4096), dtype=em.float16)
    W = g.new_input(dims=(4096, 6144), dtype=em.float16)
    g.mark_output(g.matmul(g.rms_norm(X, (4096,)), W))

Every operator checks its operands through its op-table entry and raises a typed error
(``ShapeError``, ``DTypeError``, ``GraphError``) that names the operator and the shapes.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import numbers
import reprlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import expr as ex
from .dtypes import DType, float16
from .errors import EMError, GraphError, ShapeError
from .ops import lookup
from .ops.shorthands import OpShorthands

#: the most elements one tensor may hold: 2**48, far beyond any device's memory (a larger count
#: is a mistake, e.g. a size in bytes given as a dimension)
MAX_ELEMENTS = 2**48
#: the most dimensions a tensor may have
MAX_RANK = 64
#: what an op-table entry's shape or dtype rule may raise on parameters it does not check
_RULE_ERRORS = (TypeError, ValueError, LookupError, AttributeError, ArithmeticError)


def checked_dims(what: str, dims: Any) -> tuple[int, ...]:
    """``dims`` as a tuple of positive Python ints, holding at most ``MAX_ELEMENTS`` elements;
    otherwise a ``ShapeError`` that names ``what`` and the dims."""
    shown = reprlib.repr(dims)
    if isinstance(dims, (str, bytes)):
        raise ShapeError(f"{what}: dims must be a sequence of positive integers such as "
                         f"(2, 4096), got the {type(dims).__name__} {shown}")
    try:
        items = list(itertools.islice(iter(dims), MAX_RANK + 1))
    except TypeError:
        raise ShapeError(f"{what}: dims must be a sequence of positive integers such as "
                         f"(2, 4096), got {type(dims).__name__} {shown}") from None
    if not items or len(items) > MAX_RANK or not all(
            isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0 for d in items):
        raise ShapeError(f"{what}: dims must be 1 to {MAX_RANK} positive integers, got {shown}")
    out = tuple(int(d) for d in items)
    check_elements(what, out)
    return out


def check_elements(what: str, dims: tuple[int, ...]) -> None:
    """A ``ShapeError`` naming ``what`` and ``dims`` when they hold more than ``MAX_ELEMENTS``."""
    n = math.prod(dims)
    if n > MAX_ELEMENTS:
        raise ShapeError(f"{what}: dims {dims} hold {n:.3g} elements, more than the "
                         f"{MAX_ELEMENTS:.3g} (2**48) one tensor may have")


class Tensor:
    """A tensor of a kernel graph: a graph input or the result of one operator."""

    __slots__ = ("_expr", "dims", "dtype", "graph", "index", "op", "operands", "params")

    def __init__(self, graph: KernelGraph, index: int, dims: tuple[int, ...], dtype: DType,
                 op: str | None, operands: tuple[Tensor, ...], params: dict[str, Any]) -> None:
        self.graph = graph
        self.index = index
        self.dims = dims
        self.dtype = dtype
        self.op = op  # None for a graph input
        self.operands = operands
        self.params = params
        self._expr: ex.Term | None = None

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    @property
    def is_input(self) -> bool:
        return self.op is None

    def __repr__(self) -> str:
        what = "input" if self.op is None else self.op
        return f"<Tensor t{self.index} {what} dims={self.dims} {self.dtype.value}>"


class KernelGraph(OpShorthands[Tensor]):
    """A program: inputs, operators applied in order, and marked outputs."""

    def __init__(self) -> None:
        self.tensors: list[Tensor] = []
        self.inputs: list[Tensor] = []
        self.outputs: list[Tensor] = []

    # --- building ---------------------------------------------------------------------------
    def new_input(self, dims: Sequence[int], dtype: DType = float16) -> Tensor:
        """A new graph input; inputs are numbered by position (``v0``, ``v1``, ...)."""
        dims = checked_dims("new_input", dims)
        if not isinstance(dtype, DType):
            raise GraphError(f"new_input: unsupported dtype {dtype!r}; use em.float16, "
                             "em.bfloat16 or em.float32")
        t = Tensor(self, len(self.tensors), dims, dtype, None, (), {})
        t._expr = ex.var(f"v{len(self.inputs)}")
        self.tensors.append(t)
        self.inputs.append(t)
        return t

    def apply(self, op: str, operands: Sequence[Tensor], **params: Any) -> Tensor:
        """Apply op-table operator ``op``; the named methods below are shorthands for this."""
        if not isinstance(op, str):
            raise GraphError(f"apply: the operator must be a name (str), got {type(op).__name__}")
        spec = lookup(op)
        operands = _tensors(op, "operands", operands)
        lo, hi = spec.num_inputs
        if not lo <= len(operands) <= hi:
            raise GraphError(f"{op}: takes {lo}..{hi} tensors, got {len(operands)}")
        for i, t in enumerate(operands):
            if not isinstance(t, Tensor):
                raise GraphError(f"{op}: operand {i} is {type(t).__name__}, not a Tensor")
            if t.graph is not self:
                raise GraphError(f"{op}: operand {i} ({t!r}) belongs to another graph")
        bound = spec.bind(params)
        if bound is None:
            raise GraphError(f"{op}: expects parameters {spec.params_text}, got {tuple(params)}")
        params = bound
        shapes = [t.dims for t in operands]
        try:
            dims = tuple(spec.shape(op, shapes, params))
            dtype = spec.dtype(op, [t.dtype for t in operands], params)
        except EMError:
            raise
        except _RULE_ERRORS as exc:  # a parameter of a type the entry's rules do not expect
            raise GraphError(f"{op}: parameters {reprlib.repr(params)} do not fit operands of "
                             f"shapes {shapes}: {type(exc).__name__}: {exc}") from None
        check_elements(f"{op} of shapes {shapes}", dims)
        out = Tensor(self, len(self.tensors), dims, dtype, op, operands, dict(params))
        self.tensors.append(out)
        return out

    def rms_norm(self, A: Tensor, normalized_shape: int | Sequence[int],
                 gain: Tensor | None = None, eps: float = 0.0) -> Tensor:
        if not isinstance(normalized_shape, int):
            if isinstance(normalized_shape, (str, bytes)) or \
                    not isinstance(normalized_shape, Sequence):
                raise ShapeError(f"rms_norm: normalized_shape must be an int or a sequence of "
                                 f"ints, got {type(normalized_shape).__name__}")
            normalized_shape = tuple(normalized_shape)
        operands = (A,) if gain is None else (A, gain)
        return self.apply("rms_norm", operands, normalized_shape=normalized_shape, eps=eps)

    def customized(self, inputs: Sequence[Tensor], tb: Any) -> list[Tensor]:
        """Add a graph-defined kernel whose body is thread-block graph ``tb``; returns its outputs.

        ``inputs`` are the kernel-graph tensors ``tb``'s loaders read, in the order of the loaders.
        """
        as_kernel = getattr(tb, "as_kernel", None)
        if as_kernel is None:
            raise GraphError(f"customized: expected a ThreadBlockGraph, got {type(tb).__name__}")
        inputs = _tensors("customized", "inputs", inputs)
        kernel = as_kernel()
        if len(inputs) != len(tb.inputs):
            raise GraphError(f"customized: the block graph has {len(tb.inputs)} loaders but "
                             f"{len(inputs)} inputs were given")
        for i, (t, src) in enumerate(zip(inputs, tb.sources)):
            if not isinstance(t, Tensor) or t.dims != src.dims or t.dtype != src.dtype:
                raise GraphError(f"customized: input {i} ({t!r}) does not match what loader {i} "
                                 f"was built for ({src!r})")
        return [self.apply("customized", inputs, kernel=kernel, output=i)
                for i in range(kernel.num_outputs)]

    def mark_output(self, T: Tensor) -> None:
        if not isinstance(T, Tensor) or T.graph is not self:
            raise GraphError(f"mark_output: {T!r} is not a tensor of this graph")
        if T in self.outputs:
            raise GraphError(f"mark_output: {T!r} is already an output")
        self.outputs.append(T)

    # --- reading ----------------------------------------------------------------------------
    @property
    def operators(self) -> list[Tensor]:
        """The tensors produced by operators, in the order they were added."""
        return [t for t in self.tensors if t.op is not None]

    def evaluate(self, inputs: Sequence[np.ndarray], exact: bool = False) -> list[np.ndarray]:
        """Run the graph in float64 numpy (each op's ``reference``); returns the outputs.

        ``exact``: an operator whose abstract expression is an operand's own (a cast) passes
        that operand through instead of rounding it: the real function that the oracle and the
        verifier reason about (``OpSpec.passes_through``)."""
        try:
            got: Any = len(inputs)
        except TypeError:
            got = type(inputs).__name__
        if got != len(self.inputs):
            raise GraphError(f"evaluate: graph has {len(self.inputs)} inputs, got {got}")
        values: dict[int, np.ndarray] = {}
        for t, x in zip(self.inputs, inputs):
            try:
                x = np.asarray(x, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise GraphError(f"evaluate: input v{len(values)} is not an array of numbers "
                                 f"({type(exc).__name__}: {exc})") from None
            if x.shape != t.dims:
                raise ShapeError(f"evaluate: input v{len(values)} has shape {x.shape}, "
                                 f"expected {t.dims}")
            values[t.index] = x
        for t in self.operators:
            spec, args = lookup(t.op), [values[o.index] for o in t.operands]
            through = spec.passes_through([o.dims for o in t.operands], t.params) if exact \
                else None
            values[t.index] = args[through] if through is not None else \
                spec.reference(args, t.params)
        return [values[t.index] for t in self.outputs]

    def __repr__(self) -> str:
        lines = [f"KernelGraph({len(self.inputs)} inputs, {len(self.operators)} operators)"]
        kernels: dict[int, str] = {}  # graph-defined kernels by identity: k0, k1, ... by first use

        def show(v: Any) -> str:
            text = repr(v)
            if not hasattr(v, "tb") or "(" not in text:
                return text
            # a graph-defined kernel: its name here, then its one-line summary
            # (``kernel=k0(grid=(2,1,1), loop=4, 5 ops)``); one kernel with several outputs
            # keeps one name
            name = kernels.setdefault(id(v), f"k{len(kernels)}")
            return name + text[text.index("("):]

        for t in self.tensors:
            if t.op is None:
                lines.append(f"  t{t.index} = input{t.dims} {t.dtype.value}")
            else:
                args = ", ".join(f"t{o.index}" for o in t.operands)
                ps = "".join(f", {k}={show(v)}" for k, v in t.params.items())
                lines.append(f"  t{t.index} = {t.op}({args}{ps}) -> {t.dims}")
        lines.append("  outputs: " + ", ".join(f"t{t.index}" for t in self.outputs))
        return "\n".join(lines)


def _tensors(what: str, name: str, items: Any) -> tuple[Any, ...]:
    """``items`` as a tuple (each item is checked where it is used); a ``GraphError`` naming
    ``what`` when it is one tensor or not a collection at all."""
    if not isinstance(items, (Tensor, str, bytes)):
        with contextlib.suppress(TypeError):
            return tuple(items)
    raise GraphError(f"{what}: {name} must be a sequence of tensors, got {type(items).__name__}")


def new_kernel_graph() -> KernelGraph:
    """A new, empty kernel graph."""
    return KernelGraph()


def abstract_term(T: Tensor) -> ex.Term:
    """The abstract expression of tensor ``T`` as a ``Term`` (see ``docs/expressions.md``)."""
    if not isinstance(T, Tensor):
        raise GraphError(f"abstract_term: expected a Tensor, got {type(T).__name__}")
    if T._expr is None:
        for t in T.graph.tensors[: T.index + 1]:
            if t._expr is None:
                spec = lookup(t.op)  # type: ignore[arg-type]
                t._expr = spec.expr([o._expr for o in t.operands],  # type: ignore[misc]
                                    [o.dims for o in t.operands], t.params)
    return T._expr  # type: ignore[return-value]


def abstract_expr(T: Tensor) -> str:
    """The abstract expression of tensor ``T`` as s-expression text, in the rule files' syntax."""
    return abstract_term(T).to_sexpr()

