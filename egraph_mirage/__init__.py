"""egraph-mirage: a multi-level superoptimizer for tensor programs on an e-graph core."""

from __future__ import annotations

from . import benchmarks
from .dtypes import DType, bfloat16, float16, float32
from .errors import (DTypeError, EMError, ExprError, GraphError, OracleError, RuleError,
                     ShapeError)
from .expr import Term, parse
from .graph import KernelGraph, Tensor, abstract_expr, abstract_term, new_kernel_graph
from .oracle import Budget, IncompleteSaturationWarning, Oracle, Reachability
from .ops import OPS, OpSpec

__version__ = "0.1.0"

__all__ = [
    "benchmarks", "DType", "float16", "bfloat16", "float32",
    "EMError", "ShapeError", "DTypeError", "GraphError", "RuleError", "ExprError", "OracleError",
    "Term", "parse", "KernelGraph", "Tensor", "abstract_expr", "abstract_term", "new_kernel_graph",
    "Oracle", "Budget", "Reachability", "IncompleteSaturationWarning", "OPS", "OpSpec",
]
