"""egraph-mirage: a multi-level superoptimizer for tensor programs on an e-graph core."""

from __future__ import annotations

from . import benchmarks
from .api import compile, generate_triton_program, save, to_json, to_svg
from .dtypes import DType, bfloat16, float16, float32
from .errors import (
                     BlockGraphError,
                     DTypeError,
                     EMError,
                     ExprError,
                     GraphError,
                     LowerError,
                     MapError,
                     OracleError,
                     ResourceError,
                     RuleError,
                     SerializationError,
                     ShapeError,
)
from .expr import Term, parse
from .graph import KernelGraph, Tensor, abstract_expr, abstract_term, new_kernel_graph
from .mugraph import ThreadBlockGraph, new_threadblock_graph
from .mugraph.reference import run_reference
from .mugraph.serialize import load, loads
from .ops import OPS, OpSpec
from .oracle import Budget, IncompleteSaturationWarning, Oracle, Reachability
from .search import SearchConfig, SearchError, superoptimize
from .verify import Verifier, VerifyError, VerifyResult, check_numerics, verify

__version__ = "0.1.0"

__all__ = [
                     "OPS",
                     "BlockGraphError",
                     "Budget",
                     "DType",
                     "DTypeError",
                     "EMError",
                     "ExprError",
                     "GraphError",
                     "IncompleteSaturationWarning",
                     "KernelGraph",
                     "LowerError",
                     "MapError",
                     "OpSpec",
                     "Oracle",
                     "OracleError",
                     "Reachability",
                     "ResourceError",
                     "RuleError",
                     "SearchConfig",
                     "SearchError",
                     "SerializationError",
                     "ShapeError",
                     "Tensor",
                     "Term",
                     "ThreadBlockGraph",
                     "Verifier",
                     "VerifyError",
                     "VerifyResult",
                     "abstract_expr",
                     "abstract_term",
                     "benchmarks",
                     "bfloat16",
                     "check_numerics",
                     "compile",
                     "float16",
                     "float32",
                     "generate_triton_program",
                     "load",
                     "loads",
                     "new_kernel_graph",
                     "new_threadblock_graph",
                     "parse",
                     "run_reference",
                     "save",
                     "superoptimize",
                     "to_json",
                     "to_svg",
                     "verify",
]
