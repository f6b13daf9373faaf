"""Batched matrix products with broadcast batch axes folded into the rows or columns.

In the vectorised layout ``(gx, gy, gz, F, *tile)`` a block matmul is a batch of small products
whose operands are often broadcast: a loop-invariant tile has size 1 on the loop axis, a tile that
a grid axis does not split has size 1 on that axis. ``matmul`` would materialise the broadcast and
run one small product per batch element. Here a batch axis where only the left operand is larger
than 1 becomes extra rows, one where only the right operand is larger than 1 extra columns, and
only axes where both are larger stay a batch: attention's ``Q K`` at the paper's shapes becomes one
(1024 x 64) @ (64 x 4096) product instead of 1,024 products of 64 x 64 tiles. A product summed
over a batch axis (a matmul accumulated over the for-loop) joins that axis to the contraction.
The products are the same numbers, so exactness (and the verdict) is unchanged.

The two array modules get the same product in different forms:

* numpy: the operands are rearranged (copied) into one contiguous batched product, which BLAS
  runs fastest.
* JAX: one ``lax.dot_general`` that names the batch, contracted and free axes of the operands as
  they are. Rearranging them by hand would put reshapes between the layout's transposes (the
  partition into tiles, the fold) that XLA cannot cancel: at the paper's shapes a weight matrix of
  RMSNorm + Linear (4096 x 6144) was copied twice per test, each copy slower on a CPU than the
  product itself. Given the axes, XLA composes those transposes with the partition's and reads
  the weight where it lies.
"""

from __future__ import annotations

from typing import Any


def is_jax(xp: Any) -> bool:
    """Whether the array module ``xp`` is ``jax.numpy`` (traced and compiled by XLA)."""
    return str(getattr(xp, "__name__", "")).startswith("jax")


def folded_matmul(xp: Any, x: Any, y: Any, summed: int | None = None) -> Any:
    """``xp.matmul(x, y)`` for arrays of rank >= 2, with broadcast batch axes folded. With
    ``summed`` (a batch axis of equal rank operands, larger than 1 in both, of the same size),
    the products are also summed over that axis, which is kept with size 1."""
    bx, by = _batch_shapes(x, y)
    if summed is not None and not (bx[summed] == by[summed] > 1):
        raise ValueError(f"matmul: axis {summed} of batch shapes {bx} and {by} is not summable")
    nb = len(bx)
    both = [a for a in range(nb) if bx[a] > 1 and by[a] > 1 and a != summed]
    if any(bx[a] != by[a] for a in both):
        raise ValueError(f"matmul: batch shapes {bx} and {by} do not broadcast")
    if is_jax(xp):
        return _dot_general(xp, x, y, bx, by, summed)
    if summed is not None:
        x, y = join_loop(xp, x, y, summed)
        bx, by = _batch_shapes(x, y)
    return _folded_numpy(xp, x, y, bx, by)


def product_shape(sx: tuple[int, ...], sy: tuple[int, ...],
                  summed: int | None = None) -> tuple[int, ...]:
    """The shape of ``folded_matmul`` of operands of shapes ``sx`` and ``sy``."""
    nb = max(len(sx), len(sy)) - 2
    bx = (1,) * (nb + 2 - len(sx)) + tuple(sx[:-2])
    by = (1,) * (nb + 2 - len(sy)) + tuple(sy[:-2])
    batch = tuple(1 if a == summed else max(bx[a], by[a]) for a in range(nb))
    return (*batch, sx[-2], sy[-1])


def join_loop(xp: Any, x: Any, y: Any, axis: int) -> tuple[Any, Any]:
    """``x``, ``y`` rearranged so that batch axis ``axis`` joins the contraction:
    ``sum_i x_i @ y_i = [x_0 .. x_F-1] @ [y_0; ..; y_F-1]``, with size 1 left on ``axis``."""
    r = len(x.shape)
    rest = [a for a in range(r - 2) if a != axis]
    iters = x.shape[axis]
    lead = [1 if a == axis else x.shape[a] for a in range(r - 2)]
    x = xp.reshape(xp.transpose(x, [*rest, r - 2, axis, r - 1]),
                   (*lead, x.shape[r - 2], iters * x.shape[r - 1]))
    lead = [1 if a == axis else y.shape[a] for a in range(r - 2)]
    y = xp.reshape(xp.transpose(y, [*rest, axis, r - 2, r - 1]),
                   (*lead, iters * y.shape[r - 2], y.shape[r - 1]))
    return x, y


def _batch_shapes(x: Any, y: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The batch shapes of ``x`` and ``y``, padded with leading 1s to the same length."""
    bx, by = tuple(x.shape[:-2]), tuple(y.shape[:-2])
    nb = max(len(bx), len(by))
    return (1,) * (nb - len(bx)) + bx, (1,) * (nb - len(by)) + by


def _folded_numpy(xp: Any, x: Any, y: Any, bx: tuple[int, ...], by: tuple[int, ...]) -> Any:
    nb = len(bx)
    rows = [a for a in range(nb) if bx[a] > 1 and by[a] == 1]
    cols = [a for a in range(nb) if by[a] > 1 and bx[a] == 1]
    if not rows and not cols:
        return xp.matmul(x, y)
    both = [a for a in range(nb) if bx[a] > 1 and by[a] > 1]
    m, k = x.shape[-2:]
    n = y.shape[-1]
    # x: (both..., rows..., m, k) -> (B, R*m, k); y: (both..., k, cols..., n) -> (B, k, C*n);
    # axes are named by their batch position, m and k (or k and n) by nb and nb + 1
    x = _arrange(xp, xp.reshape(x, (*bx, m, k)), both + rows + [nb, nb + 1])
    y = _arrange(xp, xp.reshape(y, (*by, k, n)), both + [nb] + cols + [nb + 1])
    nbatch = _prod(bx[a] for a in both)
    out = xp.matmul(xp.reshape(x, (nbatch, _prod(bx[a] for a in rows) * m, k)),
                    xp.reshape(y, (nbatch, k, _prod(by[a] for a in cols) * n)))
    # (B, R*m, C*n) -> (both..., rows..., m, cols..., n) -> batch axes in order, m, n
    labels = both + rows + [nb] + cols + [nb + 1]
    out = xp.reshape(out, [bx[a] for a in both + rows] + [m] + [by[a] for a in cols] + [n])
    out = xp.transpose(out, [labels.index(a) for a in sorted(both + rows + cols) + [nb, nb + 1]])
    return xp.reshape(out, tuple(max(bx[a], by[a]) for a in range(nb)) + (m, n))


def _dot_general(xp: Any, x: Any, y: Any, bx: tuple[int, ...], by: tuple[int, ...],
                 summed: int | None) -> Any:
    """The folded product as one ``lax.dot_general`` on the operands' own axes: batch axes
    larger than 1 in both are batch dimensions (``summed`` a contracted one), the others free."""
    from jax import lax

    nb = len(bx)
    m, k = x.shape[-2:]
    n = y.shape[-1]
    xa = [a for a in range(nb) if bx[a] > 1]  # the batch axes each operand keeps
    ya = [a for a in range(nb) if by[a] > 1]
    x = xp.reshape(x, [bx[a] for a in xa] + [m, k])  # size-1 axes dropped: no data moves
    y = xp.reshape(y, [by[a] for a in ya] + [k, n])
    sums = [] if summed is None else [summed]
    both = [a for a in xa if a in ya and a != summed]
    contract = ([xa.index(a) for a in sums] + [len(xa) + 1],
                [ya.index(a) for a in sums] + [len(ya)])
    batch = ([xa.index(a) for a in both], [ya.index(a) for a in both])
    out = lax.dot_general(x, y, (contract, batch))
    # dot_general's result: batch axes, x's free axes (then m), y's free axes (then n); the
    # batch axes are named by their position, m and n by nb and nb + 1
    rows = [a for a in xa if a not in both and a != summed]
    cols = [a for a in ya if a not in both and a != summed]
    labels = both + rows + [nb] + cols + [nb + 1]
    order = sorted(both + rows + cols) + [nb, nb + 1]
    if labels != order:
        out = xp.transpose(out, [labels.index(a) for a in order])
    shape = [1 if a == summed else max(bx[a], by[a]) for a in range(nb)]
    return xp.reshape(out, (*shape, m, n))


def _arrange(xp: Any, x: Any, wanted: list[int]) -> Any:
    """The axes ``wanted`` of ``x`` in that order; every other axis has size 1 and is dropped."""
    kept = sorted(wanted)
    x = xp.reshape(x, [x.shape[a] for a in kept])
    return xp.transpose(x, [kept.index(a) for a in wanted])


def _prod(xs: Any) -> int:
    r = 1
    for s in xs:
        r *= s
    return r
