"""The op table (``OPS``) and the entry type (``OpSpec``)."""

from __future__ import annotations

from ..errors import GraphError
from .spec import BLOCK, KERNEL, LEVELS, THREAD, OpSpec
from .table import OPS


def lookup(name: str) -> OpSpec:
    """The entry of operator ``name``; a ``GraphError`` lists the known ones otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown operator {name!r}; known: {', '.join(sorted(OPS))}") from None


__all__ = ["BLOCK", "KERNEL", "LEVELS", "OPS", "THREAD", "OpSpec", "lookup"]
