"""The op-table entry: everything egraph-mirage knows about one operator lives in one ``OpSpec``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType
from ..expr import Term

Shape = tuple[int, ...]
Params = Mapping[str, Any]

#: Levels of the multi-level program an operator may appear at.
KERNEL, BLOCK, THREAD = "kernel", "block", "thread"
LEVELS = frozenset({KERNEL, BLOCK, THREAD})

ShapeRule = Callable[[str, Sequence[Shape], Params], Shape]
DTypeRule = Callable[[str, Sequence[DType], Params], DType]
ExprRule = Callable[[Sequence[Term], Sequence[Shape], Params], Term]
Reference = Callable[[Sequence[np.ndarray], Params], np.ndarray]


@dataclass(frozen=True)
class OpSpec:
    """One operator of the kernel-graph language.

    Consumers (graph builder, abstract expressions, evaluators, and later the search, verifier and
    code generators) look the entry up instead of switching on the operator name.
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
    #: Levels (kernel / block / thread) the operator may appear at.
    levels: frozenset[str]
    #: Whether the two tensor operands may be swapped without changing the result.
    commutative: bool
    #: One-line description for documentation and error messages.
    doc: str

    def __post_init__(self) -> None:
        missing = [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is None]
        if missing:
            raise TypeError(f"op-table entry {self.name!r} lacks {', '.join(missing)}")
        if not self.levels <= LEVELS or not self.levels:
            raise TypeError(f"op-table entry {self.name!r} has bad levels {sorted(self.levels)}")

    @property
    def elementwise(self) -> bool:
        """Element-wise operators are the ones allowed at thread level."""
        return THREAD in self.levels
