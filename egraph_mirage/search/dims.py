"""Dimension classes: which dimensions of a program are "the same index".

A grid axis or a for-loop splits one *dimension class*: every loaded tensor with a dimension in
that class is cut along it, the others are replicated. Classes come from the program itself:
an operator links an operand dimension to the output dimension it becomes, and the dimensions a
contraction sums over to each other. The links of an operator are found by *probing* its op-table
float reference (no per-operator table to keep in sync): an operand that varies along one
dimension only (ones everywhere else) makes the output vary along the dimension it is linked to,
or along none when that dimension is summed away; the summed-away dimensions of two operands are
linked when their sizes agree (the contraction of a matmul).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import EMError
from ..graph import KernelGraph
from ..ops import lookup
from ..unionfind import UnionFind
from .config import SearchError

Dims = tuple[int, ...]
#: per operand, per dimension: the output dimension it becomes (None: summed away or size 1)
Links = tuple[tuple[int | None, ...], ...]
#: pairs ((operand, dim), (operand, dim)) summed together
Contractions = tuple[tuple[tuple[int, int], tuple[int, int]], ...]


#: the most elements (operands and result together) of one operator the search takes (2**28:
#: 2 GiB of float64 per copy). Links are probed at small sizes (``_shrunk``), but the search's
#: numeric check evaluates every candidate at the program's own sizes in float64, so a larger
#: program is refused up front with a ``SearchError`` naming the operator and its shapes
PROBE_LIMIT = 2**28


def _freeze(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, v if isinstance(v, Hashable) else repr(v)) for k, v in params.items()))


@dataclass
class LinkProbe:
    """Cached probing of operator links, keyed by (op, operand dims, params)."""

    cache: dict[tuple, tuple[Links, Contractions]] = field(default_factory=dict)

    def links(self, op: str, dims: Sequence[Dims], params: dict[str, Any]
              ) -> tuple[Links, Contractions]:
        key = (op, tuple(dims), _freeze(params))
        if key not in self.cache:
            shapes = [tuple(d) for d in dims]
            out = lookup(op).shape(op, shapes, params)
            n = sum(math.prod(d) for d in shapes) + math.prod(out)
            if n > PROBE_LIMIT:
                raise SearchError(f"{op} of shapes {shapes} (result {tuple(out)}): {n:.3g} "
                                  f"elements, more than the {PROBE_LIMIT:.3g} the search can "
                                  "take; search a program of smaller shapes")
            small, small_params = _shrunk(shapes, params)
            try:
                self.cache[key] = _probe(op, small, small_params)
            except MemoryError:
                raise SearchError(f"{op} of shapes {shapes}: out of memory while probing which "
                                  "dimensions it links; search a program of smaller shapes"
                                  ) from None
        return self.cache[key]


#: sizes up to this are probed as they are; larger ones are probed at ``SMALL + 1``, ``SMALL + 2``
#: ... (one value per distinct size, in order)
SMALL = 16
#: parameters that are left alone (an axis index, a scalar, a cast's dtype) or that hold sizes
#: of the operands' dimensions (mapped like the dimensions); an operator with any other
#: parameter is probed at its own sizes
_SHRINKABLE = {"dim": False, "scalar": False, "eps": False, "dtype": False,
               "normalized_shape": True}


def _shrunk(dims: list[Dims], params: dict[str, Any]) -> tuple[list[Dims], dict[str, Any]]:
    """The same operator on small operands: which output dimension an operand dimension becomes
    does not depend on the sizes, only on which sizes are 1 and which are equal, so every size
    above ``SMALL`` is replaced by a small one, distinct sizes by distinct ones. Probing a tile of
    a million elements took a tenth of a second per dimension; at these sizes it is free."""
    if any(k not in _SHRINKABLE for k in params):
        return dims, params
    big = sorted({s for d in dims for s in d if s > SMALL})
    size = {s: SMALL + 1 + k for k, s in enumerate(big)}
    small = [tuple(size.get(s, s) for s in d) for d in dims]
    out = dict(params)
    for k, v in params.items():
        if _SHRINKABLE[k]:
            if not isinstance(v, tuple) or any(not isinstance(x, int) for x in v):
                return dims, params
            out[k] = tuple(size.get(x, x) for x in v)
    return small, out


def _varying(out: np.ndarray) -> list[int]:
    scale = max(float(np.abs(out).max()), 1e-30)
    return [j for j in range(out.ndim)
            if out.shape[j] > 1 and float(np.ptp(out, axis=j).max()) > 1e-9 * scale]


def _eval(spec: Any, xs: list[np.ndarray], params: dict[str, Any]) -> np.ndarray | None:
    try:
        return np.asarray(spec.reference(xs, params), dtype=np.float64)
    except (ArithmeticError, ValueError, EMError):
        return None


def _probe_one(spec: Any, dims: list[Dims], params: dict[str, Any], i: int, d: int,
               rng: np.random.Generator) -> int | None:
    """The output dimension that dimension ``d`` of operand ``i`` becomes, or None."""
    di = dims[i]
    # 1. the operand varies along d only, ones elsewhere: the output varies along the linked dim
    shape = [1] * len(di)
    shape[d] = di[d]
    xs = [np.ones(dj) for dj in dims]
    xs[i] = np.broadcast_to(rng.uniform(1.0, 2.0, shape), di).copy()
    out = _eval(spec, xs, params)
    if out is not None and len(v := _varying(out)) == 1:
        return v[0]
    # 2. random operands, one slice of d perturbed: only one slice of the linked dim changes
    # (needed where the operator normalises along another dimension, as rms_norm does)
    xs = [rng.uniform(1.0, 2.0, dj) for dj in dims]
    base = _eval(spec, xs, params)
    index = [slice(None)] * len(di)
    index[d] = 0
    xs[i][tuple(index)] += 0.5
    out = _eval(spec, xs, params)
    if base is None or out is None:
        return None
    changed = np.abs(out - base) > 1e-9 * max(float(np.abs(base).max()), 1e-30)
    for j in range(out.ndim):
        if out.shape[j] > 1:
            rest = tuple(k for k in range(out.ndim) if k != j)
            along = changed.any(axis=rest) if rest else changed
            if along[0] and not along[1:].any():
                return j
    return None


def _probe(op: str, dims: list[Dims], params: dict[str, Any]) -> tuple[Links, Contractions]:
    spec = lookup(op)
    rng = np.random.default_rng(0)
    links: list[tuple[int | None, ...]] = []
    free: list[tuple[int, int, int]] = []  # (operand, dim, size) summed away
    for i, di in enumerate(dims):
        row: list[int | None] = []
        for d, size in enumerate(di):
            j = None if size == 1 else _probe_one(spec, dims, params, i, d, rng)
            row.append(j)
            if j is None and size > 1:
                free.append((i, d, size))
        links.append(tuple(row))
    pairs = []
    used: set[tuple[int, int]] = set()
    for a, (i, d, size) in enumerate(free):
        for j, e, other in free[a + 1:]:
            if j != i and other == size and (i, d) not in used and (j, e) not in used:
                pairs.append(((i, d), (j, e)))
                used |= {(i, d), (j, e)}
    return tuple(links), tuple(pairs)


def dim_classes(g: KernelGraph, probe: LinkProbe
                ) -> tuple[list[tuple[str | None, ...]], list[tuple[str | None, ...]]]:
    """Classes of the dimensions of ``g``'s inputs and of its outputs (None for size-1 dims).

    Input classes are named ``"d<k>"`` in order of first appearance; an output dimension linked
    to no input dimension gets a name of its own after those.
    """
    uf = UnionFind()
    for t in g.operators:
        ls, pairs = probe.links(t.op, [o.dims for o in t.operands], t.params)  # type: ignore[arg-type]
        for o, row in zip(t.operands, ls):
            for d, j in enumerate(row):
                if j is not None:
                    uf.union((o.index, d), (t.index, j))
        for (i, d), (j, e) in pairs:
            uf.union((t.operands[i].index, d), (t.operands[j].index, e))
    names: dict[Hashable, str] = {}

    def classes(x: Any) -> tuple[str | None, ...]:
        return tuple(None if size == 1 else names.setdefault(uf.find((x.index, d)),
                                                             f"d{len(names)}")
                     for d, size in enumerate(x.dims))

    ins = [classes(x) for x in g.inputs]
    return ins, [classes(x) for x in g.outputs]


def result_classes(links: Links, operand_classes: Sequence[Sequence[Any]], out_rank: int
                   ) -> tuple[Any, ...]:
    """Classes of an operator's output dimensions from its operands' (first link wins)."""
    out: list[Any] = [None] * out_rank
    for row, classes in zip(links, operand_classes):
        for j, c in zip(row, classes):
            if j is not None and out[j] is None:
                out[j] = c
    return tuple(out)
