"""Kernel graphs of an RMSNorm and the projection it feeds, as ``transformers`` writes the norm
(``LlamaRMSNorm``: float32 inside, cast back), for the search's tests and probes."""

from __future__ import annotations

import egraph_mirage as em


def transformers_norm_projection(rows: tuple[int, ...], hidden: int, out: int, eps: float,
                                 gain: bool = False, dtype: em.DType = em.float16
                                 ) -> em.KernelGraph:
    """``(w * (x32 * rsqrt(mean(x32²) + eps)).to(dtype)) @ W``, ``x32 = x.float()``: x
    ``(*rows, hidden)``, W ``(hidden, out)`` with as many leading 1s as ``rows`` has beyond
    one, and with ``gain`` the norm's weight w ``(1, ..., hidden)``, all of ``dtype``."""
    g = em.new_kernel_graph()
    lead = (1,) * (len(rows) - 1)
    x = g.new_input((*rows, hidden), dtype)
    w = g.new_input((*lead, hidden, out), dtype)
    x32 = g.cast(x, em.float32)
    ms = g.mean(g.square(x32), len(rows))
    normed = g.cast(g.mul(x32, g.rsqrt(g.add_scalar(ms, eps))), dtype)
    if gain:
        normed = g.mul(g.new_input((*lead, 1, hidden), dtype), normed)
    g.mark_output(g.matmul(normed, w))
    return g
