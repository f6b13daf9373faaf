"""The op-table entry: everything egraph-mirage knows about one operator lives in one ``OpSpec``."""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..expr import Term, var
from .terms import Constructor

Shape = tuple[int, ...]
Params = Mapping[str, Any]

#: Levels of the multi-level program an operator may appear at.
KERNEL, BLOCK, THREAD = "kernel", "block", "thread"
LEVELS = frozenset({KERNEL, BLOCK, THREAD})

ShapeRule = Callable[[str, Sequence[Shape], Params], Shape]
DTypeRule = Callable[[str, Sequence[DType], Params], DType]
ExprRule = Callable[[Sequence[Term], Sequence[Shape], Params], Term]
Reference = Callable[[Sequence[np.ndarray], Params], np.ndarray]
#: ``torch(tensors, params) -> tensor``: the operator in PyTorch, in the operands' dtype
TorchRule = Callable[[Sequence[Any], Params], Any]
#: an operand dimension: (operand position, dimension)
OperandDim = tuple[int, int]


@dataclass(frozen=True)
class TileDims:
    """How an operator's output dimensions relate to its operands' (used by the Triton lowering
    to pad tiles consistently; see ``docs/lowering.md``).

    ``out[j]`` lists the operand dimensions aligned with output dimension ``j`` (equal size, or
    size 1 and broadcast); an empty entry is a new dimension, of size 1 if ``j`` is in
    ``reduced`` and built at full size by the emission otherwise. ``joined`` lists groups of
    operand dimensions aligned with each other only (a contraction); ``dot`` the operand
    dimensions that a ``tl.dot`` uses, which the lowering pads to at least 16.
    """

    out: tuple[tuple[OperandDim, ...], ...]
    reduced: tuple[int, ...] = ()
    joined: tuple[tuple[OperandDim, ...], ...] = ()
    dot: tuple[OperandDim, ...] = ()


@dataclass(frozen=True)
class TritonEmission:
    """How the lowering (``egraph_mirage.lower``) writes an operator as code.

    - ``tile(args, ctx, params) -> str``: the Triton expression of the operator on tiles inside
      a kernel. ``args`` are the operands' variable names (fp32 values); ``ctx`` is the lowering's
      ``TileContext`` (operand shapes, masking of padded elements, ``tl.dot``, concatenation).
    - ``host(args, shapes, params) -> str``: the torch expression of the operator as a library
      call between kernels, on fp32 tensors named ``args`` of the given shapes.
    - ``dims(shapes, params) -> TileDims``: how output dimensions relate to operand dimensions
      (``shapes``: the operands' shapes).
    - ``keeps_zero``: whether the tile expression maps zero padding to zero padding (then the
      lowering need not mask the result before a reduction).
    - ``dot_operands``: the operands the tile expression hands to ``tl.dot`` (the tensor cores
      may read them from shared memory; the lowering gives such an operand its own load where
      the same tile also feeds other operators, ``kernel_codegen``).
    - ``host_stored``: the library call takes half-precision operands as stored and accumulates
      in fp32 itself (a matmul: cuBLAS does), so the host does not convert them to fp32 copies
      first (a copy of each operand, then an fp32 matmul: several times slower).
    """

    tile: Callable[[Sequence[str], Any, Params], str]
    host: Callable[[Sequence[str], Sequence[Shape], Params], str]
    dims: Callable[[Sequence[Shape], Params], TileDims]
    keeps_zero: bool
    dot_operands: tuple[int, ...] = ()
    host_stored: bool = False


@dataclass(frozen=True)
class OpSpec:
    """One operator of the kernel-graph language: everything egraph-mirage knows about it.

    Consumers (graph builder, abstract expressions, the oracle's datatype and reachability rules,
    evaluators in numpy, PyTorch and the finite field, the search, the verifier's degree bound,
    the mutation benchmark and the code generators) look the entry up instead of switching on
    the operator name. Adding an operator is one entry here plus its identities, one per line,
    under ``rules/`` (``docs/architecture.md``).
    """

    name: str
    #: Inclusive range of how many tensor operands the operator takes.
    num_inputs: tuple[int, int]
    #: Names of the non-tensor parameters (``dim``, ``scalar``, ...), in call order.
    params: tuple[str, ...]
    #: ``shape(op, input_shapes, params) -> output shape``; raises ``ShapeError``.
    shape: ShapeRule
    #: ``dtype(op, input_dtypes, params) -> output dtype``; raises ``DTypeError``.
    dtype: DTypeRule
    #: ``expr(child_terms, input_shapes, params) -> abstract expression of the output``.
    expr: ExprRule
    #: ``reference(arrays, params) -> array``: float semantics in numpy, the ground truth.
    reference: Reference
    #: ``ff(field, operands, params) -> FF``: semantics over Z_p x Z_q for the verifier.
    ff: Callable[[Any, Sequence[Any], Params], Any]
    #: ``torch(tensors, params) -> tensor``: PyTorch semantics (the eager baseline, what
    #: ``torch.compile`` compiles, and the float reference of tuned kernels).
    torch: TorchRule
    #: Term constructors the abstract expression introduces (shared ones such as ``Sum`` are in
    #: ``terms.CORE_TERMS``): the oracle declares them and their reachability rules.
    terms: tuple[Constructor, ...]
    #: Levels (kernel / block / thread) the operator may appear at.
    levels: frozenset[str]
    #: Whether the two tensor operands may be swapped without changing the result.
    commutative: bool
    #: How the Triton lowering writes the operator: in a kernel (Triton) and between kernels
    #: (torch).
    triton: TritonEmission
    #: One-line description for documentation and error messages.
    doc: str
    #: Parameters a program may leave out, each with the number that leaving it out means
    #: (``rms_norm``'s ``eps``, 0.0). One given at that number is dropped (``bind``), so the
    #: program builds, prints, serialises and lowers exactly as one that leaves it out. The
    #: search varies ``params`` only.
    optional: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        missing = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is None]
        if missing:
            raise TypeError(f"op-table entry {self.name!r} lacks {', '.join(missing)}")
        if not self.levels <= LEVELS or not self.levels:
            raise TypeError(f"op-table entry {self.name!r} has bad levels {sorted(self.levels)}")

    @property
    def optional_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.optional)

    @property
    def params_text(self) -> str:
        """The parameter names for error messages: ``('dim',)``, or with ``and optionally``."""
        extra = f" and optionally {self.optional_names}" if self.optional else ""
        return f"{self.params}{extra}"

    def bind(self, params: Mapping[str, Any]) -> dict[str, Any] | None:
        """``params`` as a program stores them: None unless every name of ``params`` is given
        and no other but optional ones; optional ones at their default left out."""
        names, optional = set(params), dict(self.optional)
        if not set(self.params) <= names <= set(self.params) | set(optional):
            return None
        return {k: v for k, v in params.items()
                if not (k in optional and _is_number(v) and v == optional[k])}

    @property
    def elementwise(self) -> bool:
        """Element-wise operators are the ones allowed at thread level."""
        return THREAD in self.levels

    @property
    def graph_defined(self) -> bool:
        """A graph-defined kernel's output: evaluators run the kernel's thread-block graph as a
        whole (``verify.kernels``, ``gpu.torch_eval``, the lowering) instead of ``ff``/``torch``."""
        return "kernel" in self.params

    def passes_through(self, shapes: Sequence[Shape], params: Params) -> int | None:
        """The operand whose abstract expression the result's is (an operator that is the
        identity in exact arithmetic: a cast, a slice of the whole dimension), or None."""
        if self.graph_defined:
            return None
        operands = [var(f"operand {i}") for i in range(len(shapes))]
        out = self.expr(operands, shapes, params)
        return operands.index(out) if out in operands else None

    @property
    def mutation_class(self) -> str | None:
        """Which operators a mutant may put in this one's place (``mugraph/mutate.py``):
        "unary" or "binary" for parameterless element-wise operators of that arity."""
        if not self.elementwise or self.params or self.num_inputs[0] != self.num_inputs[1]:
            return None
        return {1: "unary", 2: "binary"}.get(self.num_inputs[0])


def _is_number(v: object) -> bool:
    """A real number (numpy's included), not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)
