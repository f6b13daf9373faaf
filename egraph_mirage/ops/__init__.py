"""The op table (``OPS``), the entry type (``OpSpec``) and the term constructors (``terms``)."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import GraphError
from .spec import BLOCK, KERNEL, LEVELS, THREAD, OpSpec
from .table import OPS, REDUCING
from .terms import CORE_TERMS, Constructor, collect


def lookup(name: str) -> OpSpec:
    """The entry of operator ``name``; a ``GraphError`` lists the known ones otherwise."""
    try:
        return OPS[name]
    except KeyError:
        raise GraphError(f"unknown operator {name!r}; known: {', '.join(sorted(OPS))}") from None


def term_constructors(ops: Mapping[str, OpSpec] = OPS) -> dict[str, Constructor]:
    """Every term constructor by name: the shared ones, then each entry's, in table order."""
    return collect([CORE_TERMS, *(spec.terms for spec in ops.values())])


__all__ = ["BLOCK", "KERNEL", "LEVELS", "OPS", "REDUCING", "THREAD", "Constructor", "OpSpec",
           "lookup", "term_constructors"]
