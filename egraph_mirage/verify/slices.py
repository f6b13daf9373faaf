"""Element-wise numpy work on large arrays: in memory order, a cache-sized slice at a time.

Under the numpy backend two element-wise steps of the field are most of the time of a candidate
that applies a function to a weight-sized tile (``silu`` of a loaded weight, ``mul_scalar`` of
it): the reduction mod p (``Field.mod``: six array operations) and the random-function lookups
(``Field.apply_table``: an index cast, a gather, a float cast). Two things made them slow:

* Each step of a formula wrote a fresh array of the whole tile (200 MB of float64 for RMSNorm +
  Linear's weight), read back by the next step from memory. Here the steps run on a slice of
  ``SLICE`` elements at a time, whose temporaries stay in the core's cache: one read of the
  operand and one write of the result go to memory.
* The tiles are views of the inputs in the vectorised layout (``partition.to_blocks``: a
  transposed view, not a copy). ``np.take`` gathers in the view's order, hopping through the
  input, and writes a C-ordered result that the next product has to copy back into the
  weight's order (``fold.join_loop``). Here the work runs over the elements in the order they
  lie in memory, and the result is a view with the operand's own layout.

A broadcast operand (a stride-0 axis) is computed once and broadcast again. The arithmetic is
the same element by element, so the values, and the verdict, are too. ``Field`` takes these
paths for arrays from ``MOD_FROM`` / ``LOOKUP_FROM`` elements. At RMSNorm + Linear's paper
shapes (a 25 M-element weight tile; 2-core VM): the lookup 230–460 ms → 125–145 ms, the
reduction 160–180 ms → 90–110 ms; a check of the mutant that applies ``silu`` to the weight
tile 300–820 ms → 125–150 ms.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

#: elements per slice (512 KB of float64: a slice's temporaries stay in a core's L2 cache)
SLICE = 1 << 16
#: the sizes (elements) from which ``Field`` takes the paths here. Below them the plain numpy
#: formulas are as fast or faster (the whole array stays in the L3 cache, and a Python loop
#: over slices costs more than it saves): measured on the 2-core VM, a reduction of 1 M
#: contiguous values 2.6 ms plain against 3.0 sliced, of 4 M 26 against 15; a lookup of 512 K
#: 3.1 against 2.4, of 128 K 0.45 against 0.95
MOD_FROM = 1 << 21
LOOKUP_FROM = 1 << 19


def in_memory_order(x: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]:
    """``(flat, restore)``: ``x``'s distinct elements as a contiguous 1-D array in the order they
    lie in memory (a view where ``x`` is a permuted view of a contiguous array, else a copy),
    and the function that turns a 1-D array in that order back into an array of ``x``'s shape
    (a view: permuted, broadcast along ``x``'s stride-0 axes)."""
    shape = x.shape
    keep = tuple(slice(0, 1) if s == 0 and n > 1 else slice(None)
                 for s, n in zip(x.strides, shape))
    small = x[keep]
    perm = sorted(range(small.ndim), key=lambda a: -abs(small.strides[a]))
    y = small.transpose(perm)
    if not y.flags.c_contiguous:
        y = np.ascontiguousarray(y)
    inverse = np.argsort(perm)
    blocked = y.shape

    def restore(flat: np.ndarray) -> np.ndarray:
        out = flat.reshape(blocked).transpose(inverse)
        return out if out.shape == shape else np.broadcast_to(out, shape)

    return y.reshape(-1), restore


def lookup(table: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``table[x]`` as float64 for float64 ``x`` holding indices; raises ``IndexError`` on an
    index outside the table (as ``np.take`` does)."""
    flat, restore = in_memory_order(x)
    n = flat.size
    out = np.empty(n, np.float64)
    idx = np.empty(min(n, SLICE), np.int32)
    for s in range(0, n, SLICE):
        e = min(s + SLICE, n)
        part = idx[: e - s]
        np.copyto(part, flat[s:e], casting="unsafe")  # float64 integers -> int32, exact
        out[s:e] = np.take(table, part)
    return restore(out)


def mod(x: np.ndarray, m: int) -> np.ndarray:
    """``x mod m`` for float64 integers below 2**53, as ``x - floor(x / m) * m`` with the
    remainder corrected by one m where the division rounded across an integer."""
    flat, restore = in_memory_order(x)
    n = flat.size
    out = np.empty(n, np.float64)
    for s in range(0, n, SLICE):
        e = min(s + SLICE, n)
        _mod_into(flat[s:e], m, out[s:e])
    return restore(out)


def _mod_into(x: np.ndarray, m: int, r: np.ndarray) -> None:
    """``x mod m`` written to ``r`` (same shape), each step in place."""
    np.divide(x, m, out=r)
    np.floor(r, out=r)
    np.multiply(r, m, out=r)
    np.subtract(x, r, out=r)
    np.add(r, m, out=r, where=r < 0)
    np.subtract(r, m, out=r, where=r >= m)
