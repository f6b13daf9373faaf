"""Batched matrix products with broadcast batch axes folded into the rows or columns.

In the vectorised layout ``(gx, gy, gz, F, *tile)`` a block matmul is a batch of small products
whose operands are often broadcast: a loop-invariant tile has size 1 on the loop axis, a tile that
a grid axis does not split has size 1 on that axis. ``matmul`` would materialise the broadcast and
run one small product per batch element. Here a batch axis where only the left operand is larger
than 1 becomes extra rows, one where only the right operand is larger than 1 extra columns, and
only axes where both are larger stay a batch: attention's ``Q K`` at the paper's shapes becomes one
(1024 x 64) @ (64 x 4096) product instead of 1,024 products of 64 x 64 tiles. The products are
the same numbers, so exactness (and the verdict) is unchanged.
"""

from __future__ import annotations

from typing import Any


def folded_matmul(xp: Any, x: Any, y: Any) -> Any:
    """``xp.matmul(x, y)`` for arrays of rank >= 2, with broadcast batch axes folded."""
    bx, by = tuple(x.shape[:-2]), tuple(y.shape[:-2])
    nb = max(len(bx), len(by))
    bx, by = (1,) * (nb - len(bx)) + bx, (1,) * (nb - len(by)) + by
    rows = [a for a in range(nb) if bx[a] > 1 and by[a] == 1]
    cols = [a for a in range(nb) if by[a] > 1 and bx[a] == 1]
    if not rows and not cols:
        return xp.matmul(x, y)
    both = [a for a in range(nb) if bx[a] > 1 and by[a] > 1]
    if any(bx[a] != by[a] for a in both):
        raise ValueError(f"matmul: batch shapes {bx} and {by} do not broadcast")
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
