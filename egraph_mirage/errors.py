"""Typed errors raised by egraph-mirage. Every message names the offending thing."""

from __future__ import annotations


class EMError(Exception):
    """Base class of every error egraph-mirage raises on purpose."""


class ShapeError(EMError, ValueError):
    """An operator was applied to tensors whose shapes it does not accept."""


class DTypeError(EMError, TypeError):
    """An operator was applied to tensors of mismatched or unsupported dtypes."""


class GraphError(EMError, ValueError):
    """A graph was used wrongly (foreign tensor, output marked twice, no outputs, ...)."""


class RuleError(EMError, ValueError):
    """A rule file is malformed; the message names the file and line."""

    def __init__(self, path: str, line: int, message: str) -> None:
        self.path = path
        self.line = line
        self.detail = message
        super().__init__(f"{path}:{line}: {message}")


class ExprError(EMError, ValueError):
    """An abstract expression could not be parsed or uses an unknown operator."""


class OracleError(EMError, RuntimeError):
    """The reachability oracle could not be built or was asked an ill-formed question."""


class MapError(EMError, ValueError):
    """A partition map (imap, omap, forloop_dim, grid) is invalid; names the map and the numbers."""


class BlockGraphError(EMError, ValueError):
    """A thread-block graph was built wrongly (operator across the accumulator, bad accumulator,
    output before the accumulator, ...)."""


class ResourceError(EMError, ValueError):
    """A thread-block graph's tiles do not fit the shared-memory budget."""


class SerializationError(EMError, ValueError):
    """A μGraph file could not be written or read; names the file and the faulty entry."""


class LowerError(EMError, ValueError):
    """A μGraph cannot be lowered to Triton; names the kernel and the operator."""


class UnsupportedOpError(EMError, ValueError):
    """A PyTorch program uses an operator (or a use of one) that egraph-mirage cannot trace into a
    kernel graph; names the aten operator and the user's source line where known."""

    def __init__(self, message: str, *, op: str | None = None, node: str | None = None,
                 where: str | None = None) -> None:
        self.op = op  # the aten operator, e.g. "aten.sort.default"
        self.node = node  # the fx node's name, e.g. "sort"
        self.where = where  # "file:line: code" of the user's source, when fx recorded it
        super().__init__(message)
