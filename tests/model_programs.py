"""Kernel graphs of model code as the tracer gives it, for the search's tests: an RMSNorm and the
projection it feeds, as ``transformers`` writes the norm (``LlamaRMSNorm``: float32 inside,
cast back), and a batch of sequences' decode attention folded into its KV heads."""

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


def folded_decode_attention(keys: int) -> em.KernelGraph:
    """An 8B model's grouped-query decode attention for 8 sequences, the sequences merged into
    the 8 KV heads (``fx.trace.with_batch_folded``): ``softmax(q @ Kᵀ / sqrt(128) + mask) @ V``
    with q (64, 4, 128), Kᵀ (64, 128, keys), V (64, keys, 128) and the mask (64, 1, keys)."""
    g = em.new_kernel_graph()
    q = g.new_input((64, 4, 128))
    kt, v = g.new_input((64, 128, keys)), g.new_input((64, keys, 128))
    s = g.add(g.mul_scalar(g.matmul(q, kt), 128 ** -0.5), g.new_input((64, 1, keys)))
    e = g.exp(g.sub(s, g.amax(s, 2)))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, 2)), v))
    return g
