"""egraph-mirage: a multi-level superoptimizer for tensor programs on an e-graph core."""

from __future__ import annotations

from . import benchmarks, handwritten
from .dtypes import DType, bfloat16, float16, float32
from .errors import (BlockGraphError, DTypeError, EMError, ExprError, GraphError, MapError,
                     OracleError, ResourceError, RuleError, SerializationError, ShapeError)
from .expr import Term, parse
from .graph import KernelGraph, Tensor, abstract_expr, abstract_term, new_kernel_graph
from .mugraph import ThreadBlockGraph, new_threadblock_graph
from .mugraph.reference import run_reference
from .mugraph.serialize import load, loads
from .oracle import Budget, IncompleteSaturationWarning, Oracle, Reachability
from .ops import OPS, OpSpec
from .verify import Verifier, VerifyError, VerifyResult, check_numerics, verify

__version__ = "0.1.0"

__all__ = [
    "benchmarks", "handwritten", "DType", "float16", "bfloat16", "float32",
    "EMError", "ShapeError", "DTypeError", "GraphError", "RuleError", "ExprError", "OracleError",
    "Term", "parse", "KernelGraph", "Tensor", "abstract_expr", "abstract_term", "new_kernel_graph",
    "Oracle", "Budget", "Reachability", "IncompleteSaturationWarning", "OPS", "OpSpec",
    "MapError", "BlockGraphError", "SerializationError", "ResourceError", "ThreadBlockGraph", "new_threadblock_graph",
    "run_reference", "verify", "check_numerics", "Verifier", "VerifyResult", "VerifyError",
    "load", "loads",
]
