"""egraph-mirage: a multi-level superoptimizer for tensor programs on an e-graph core.

The torch front end (``egraph_mirage.fx``) is exported lazily: ``em.from_torch`` and
``em.torch_report`` load it on first use, so ``import egraph_mirage`` needs no torch (calling
``from_torch`` does). ``torch.compile(model, backend="egraph_mirage")`` finds the backend through
the package's entry point, without this import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
                     UnsupportedOpError,
)
from .expr import Term, parse
from .graph import KernelGraph, Tensor, abstract_expr, abstract_term, new_kernel_graph
from .mugraph import ThreadBlockGraph, new_threadblock_graph
from .mugraph.interpreter import run_reference
from .mugraph.serialize import load, loads
from .ops import OPS, OpSpec
from .oracle import Budget, IncompleteSaturationWarning, Oracle, Reachability
from .pipeline import superoptimize
from .search import SearchConfig, SearchError
from .verify import Verifier, VerifyError, VerifyResult, check_numerics, verify

__version__ = "0.1.0"

if TYPE_CHECKING:
    from .fx.report import torch_report
    from .fx.trace import from_torch


def __getattr__(name: str) -> Any:
    """The torch front end's names, imported on first use (module docstring)."""
    if name == "from_torch":
        from .fx.trace import from_torch as value
    elif name == "torch_report":
        from .fx.report import torch_report as value
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
                     "UnsupportedOpError",
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
                     "from_torch",
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
                     "torch_report",
                     "verify",
]
