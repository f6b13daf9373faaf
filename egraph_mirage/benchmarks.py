"""The eight benchmark programs, at the paper's shapes or at reduced shapes for CPU tests, and
three programs outside them (``UNSEEN``).

``get(name, batch=1)`` builds the kernel graph; ``small=True`` keeps the graph and divides the
sizes, so tests exercise the same structure quickly. Shapes follow the original system's benchmark
scripts; LoRA and the gated MLP take ``batch`` as their leading dimension (the original scripts
keep 16 and 8 for every batch).
"""

from __future__ import annotations

from collections.abc import Callable

from .dtypes import DType, float16
from .errors import GraphError
from .graph import KernelGraph, Tensor, new_kernel_graph


def _attention(g: KernelGraph, Q: Tensor, K: Tensor, V: Tensor) -> Tensor:
    E = g.exp(g.matmul(Q, K))
    S = g.reduction(E, 2)
    return g.matmul(g.div(E, S), V)


def _attention_program(heads: int, queries: int, head_dim: int, kv_len: int,
                       qknorm: bool = False) -> Callable[[int, DType], KernelGraph]:
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        Q = g.new_input((heads * b, queries, head_dim), dtype)
        K = g.new_input((heads * b, head_dim, kv_len), dtype)
        V = g.new_input((heads * b, kv_len, head_dim), dtype)
        if qknorm:
            Q = g.rms_norm(Q, (head_dim,))
            V = g.rms_norm(V, (head_dim,))
        g.mark_output(_attention(g, Q, K, V))
        return g

    return build


def _rmsnorm_linear(rows: int, hidden: int, out: int, gain: bool = False):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        X = g.new_input((rows * b, hidden), dtype)
        W = g.new_input((hidden, out), dtype)
        G = g.new_input((1, hidden), dtype) if gain else None
        g.mark_output(g.matmul(g.rms_norm(X, (hidden,), G), W))
        return g

    return build


def _lora(hidden: int, out: int, rank: int):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        X = g.new_input((b, hidden), dtype)
        W = g.new_input((hidden, out), dtype)
        A = g.new_input((hidden, rank), dtype)
        B = g.new_input((rank, out), dtype)
        g.mark_output(g.add(g.matmul(X, W), g.matmul(g.matmul(X, A), B)))
        return g

    return build


def _gated_mlp(hidden: int, out: int):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        X = g.new_input((b, hidden), dtype)
        W1 = g.new_input((hidden, out), dtype)
        W2 = g.new_input((hidden, out), dtype)
        g.mark_output(g.mul(g.silu(g.matmul(X, W1)), g.matmul(X, W2)))
        return g

    return build


def _ntrans(rows: int, hidden: int):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        H = g.new_input((rows * b, hidden), dtype)
        X = g.new_input((rows * b, hidden), dtype)
        alpha = g.new_input((rows * b, hidden), dtype)
        N = g.rms_norm(H, (hidden,))
        T = g.add(g.mul(g.add(N, X), alpha), X)
        g.mark_output(g.rms_norm(T, (hidden,)))
        return g

    return build


#: name -> (builder at paper shapes, builder at small shapes, one-line description)
_PROGRAMS: dict[str, tuple[Callable, Callable, str]] = {
    "gqa": (_attention_program(2, 256, 64, 4096), _attention_program(2, 16, 16, 64),
            "group-query attention: exp(Q@K) / rowsum @ V, 2b heads"),
    "mha": (_attention_program(32, 16, 64, 4096), _attention_program(4, 16, 16, 64),
            "multi-head attention, 32b heads of 16 queries"),
    "mqa": (_attention_program(1, 1024, 64, 4096), _attention_program(1, 32, 16, 64),
            "multi-query attention, b heads of 1024 queries"),
    "qknorm": (_attention_program(2, 256, 64, 4096, True),
               _attention_program(2, 16, 16, 64, True),
               "attention with rms_norm on Q and V (as the original script does)"),
    "rmsnorm_linear": (_rmsnorm_linear(2, 4096, 6144), _rmsnorm_linear(2, 64, 96),
                       "rms_norm(X) @ W"),
    "lora": (_lora(256, 4096, 16), _lora(64, 64, 16), "X@W + (X@A)@B"),
    "gated_mlp": (_gated_mlp(4096, 4096), _gated_mlp(64, 64), "silu(X@W1) * (X@W2)"),
    "ntrans": (_ntrans(8, 4096), _ntrans(2, 64),
               "rms_norm((rms_norm(H) + X) * alpha + X)"),
}


def _residual_rmsnorm_linear(rows: int, hidden: int, out: int):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        X = g.new_input((rows * b, hidden), dtype)
        R = g.new_input((rows * b, hidden), dtype)
        W = g.new_input((hidden, out), dtype)
        g.mark_output(g.matmul(g.rms_norm(g.add(X, R), (hidden,)), W))
        return g

    return build


def _vocab_softmax(hidden: int, vocab: int):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        X = g.new_input((b, hidden), dtype)
        W = g.new_input((hidden, vocab), dtype)
        E = g.exp(g.matmul(X, W))
        g.mark_output(g.div(E, g.reduction(E, 1)))
        return g

    return build


def _masked_attention(heads: int, queries: int, head_dim: int, kv_len: int):
    def build(b: int, dtype: DType) -> KernelGraph:
        g = new_kernel_graph()
        Q = g.new_input((heads * b, queries, head_dim), dtype)
        K = g.new_input((heads * b, head_dim, kv_len), dtype)
        V = g.new_input((heads * b, kv_len, head_dim), dtype)
        M = g.new_input((heads * b, queries, kv_len), dtype)
        E = g.exp(g.add(g.matmul(Q, K), M))
        g.mark_output(g.matmul(g.div(E, g.reduction(E, 2)), V))
        return g

    return build


#: programs outside the paper's eight, chosen (and written down here) before the search was
#: tried on them: how the superoptimizer does on programs nobody tuned it for
_UNSEEN: dict[str, tuple[Callable, Callable, str]] = {
    "residual_rmsnorm_linear": (_residual_rmsnorm_linear(2, 4096, 4096),
                                _residual_rmsnorm_linear(2, 64, 96),
                                "rms_norm(X + R) @ W: a residual add, the norm and a projection"),
    "vocab_softmax": (_vocab_softmax(2048, 16384), _vocab_softmax(64, 256),
                      "softmax(X @ W) over a vocabulary: exp(X@W) / rowsum"),
    "masked_attention": (_masked_attention(32, 16, 64, 1024), _masked_attention(4, 16, 16, 64),
                         "exp(Q@K + M) / rowsum @ V with an additive mask M"),
}


def names(unseen: bool = False) -> list[str]:
    """Names of the benchmark programs, in the order of the paper's table; with ``unseen``,
    followed by the programs outside the paper's eight (``UNSEEN``)."""
    return list(_PROGRAMS) + (list(_UNSEEN) if unseen else [])


#: the programs outside the paper's eight: ``get`` builds them like the others
UNSEEN: tuple[str, ...] = tuple(_UNSEEN)


def describe(name: str) -> str:
    return _lookup(name)[2]


def _lookup(name: str) -> tuple[Callable, Callable, str]:
    known = _PROGRAMS | _UNSEEN
    if name not in known:
        raise GraphError(f"unknown benchmark {name!r}; known: {', '.join(known)}")
    return known[name]


def get(name: str, batch: int = 1, small: bool = False, dtype: DType = float16,
        gain: bool = False) -> KernelGraph:
    """Build benchmark ``name`` at batch size ``batch``.

    ``small=True`` gives a structurally identical program at reduced sizes (for CPU tests);
    ``gain=True`` adds the learned gain ``G (1, hidden)`` to ``rmsnorm_linear``.
    """
    full, reduced, _ = _lookup(name)
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise GraphError(f"benchmark {name}: batch must be a positive integer, got {batch!r}")
    builder = reduced if small else full
    if gain:
        if name != "rmsnorm_linear":
            raise GraphError(f"benchmark {name}: gain=True applies to rmsnorm_linear only")
        builder = (_rmsnorm_linear(2, 64, 96, True) if small
                   else _rmsnorm_linear(2, 4096, 6144, True))
    return builder(batch, dtype)
