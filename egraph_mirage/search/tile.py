"""A block-level tile as the block search sees it (``Tile``): what ``blocks`` builds and
``pairing`` pairs, kept apart from both so that neither imports the other's module for it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Dims = tuple[int, ...]


@dataclass(frozen=True)
class Tile:
    #: e-class (or structural key without the oracle) with side, dims and dimension classes:
    #: abstract expressions forget the order of a matmul's operands, so ``V @ E`` and ``E @ V``
    #: of square tiles share a class; their dimension classes tell them apart
    key: Any
    cls: int | None
    dims: Dims
    itemsize: int
    side: str
    dcls: tuple[Any, ...]
    op: str  # "input", an op-table name, "accum" or "max" (a running max)
    args: tuple[int, ...]
    params: tuple[tuple[str, Any], ...]
    #: the key of the running max this loop-side tile moves with (None: no running max): it
    #: may only be accumulated rescaled by that max (online softmax)
    shift: Any = None
    #: whether the tile is (made from) a tensor of the previous kernel (``BlockSearch.fresh``)
    anchored: bool = True
