"""Hand-written fused μGraphs for the benchmark programs: a reference, not part of the library.

The search finds its μGraphs without these; ``egraph-mirage bench gpu`` times them in a column of
their own (``reference``) beside the search's results, and tests use them as known-good μGraphs
for the verifier, the lowering and serialisation.

Each builder takes the benchmark's kernel graph and returns a μGraph over the same inputs that
computes the same outputs with graph-defined kernels. Tile sizes come from the shapes under the
caps of a ``Tiles`` (by default at most 64 along each tiled dimension), never from the program's
name. ``variants(name, g)`` gives the same form under a few tile caps, for a GPU tuner to choose
among: the tile sizes are part of the μGraph, not knobs of its lowering.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import GraphError, ResourceError
from ..graph import KernelGraph, Tensor, new_kernel_graph
from ..mugraph import new_threadblock_graph
from ..mugraph.serialize import dumps
from ..mugraph.threadblock import DEFAULT_SMEM_BYTES, BlockTensor, ThreadBlockGraph


@dataclass(frozen=True)
class Tiles:
    """Caps on the tiles of a hand-written μGraph (each tile is the largest power of two that
    divides its dimension under its cap)."""

    #: along a dimension the grid splits into tiles (W's columns, query rows)
    grid: int = 64
    #: along the dimension the for-loop walks
    loop: int = 64
    #: most pieces a split form cuts its reduction into (the key/value length of split-KV
    #: attention, the contraction of split-K)
    splits: int = 8
    #: shared-memory budget of the FlashAttention form's block graph (its tiles mostly live in
    #: registers once lowered; Triton reports a kernel that does not fit when it compiles)
    smem: int = DEFAULT_SMEM_BYTES


def _tile(n: int, limit: int = 64) -> int:
    """The largest power of two that divides n, at most ``limit`` and at most n / 4 (so that a
    loop over the dimension has several iterations)."""
    return _grid_tile(n, min(limit, max(1, n // 4)))


def _grid_tile(n: int, limit: int = 64) -> int:
    """The largest power of two that divides n, at most ``limit``."""
    t = 1
    while t * 2 <= limit and n % (t * 2) == 0:
        t *= 2
    return t


def _same_inputs(g: KernelGraph) -> tuple[KernelGraph, list[Tensor]]:
    h = new_kernel_graph()
    return h, [h.new_input(t.dims, t.dtype) for t in g.inputs]


def rmsnorm_linear(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """One kernel: grid over W's columns, loop over the hidden dimension; the block accumulates
    X @ W and the rms of X, and divides after the loop."""
    h, ins = _same_inputs(g)
    X, W = ins[0], ins[1]
    k, n = X.dims[1], W.dims[1]
    tk, tn = _tile(k, tiles.loop), _tile(n, tiles.grid)
    tb = new_threadblock_graph(grid_dim=(n // tn, 1, 1), forloop_range=k // tk)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, (1, -1, -1), forloop_dim=0)
    if len(ins) == 3:  # learned gain G (1, k): scales X's columns before the product
        x = tb.mul(x, tb.new_input(ins[2], (-1, -1, -1), forloop_dim=1))
        xw = tb.forloop_accum(tb.matmul(x, w))
        rms = tb.forloop_accum(tb.new_input(X, (-1, -1, -1), forloop_dim=1), "rms")
        tb.new_output(tb.div(xw, rms), (1, -1, -1))
        (O,) = h.customized([X, W, ins[2], X], tb)
    else:
        xw = tb.forloop_accum(tb.matmul(x, w))
        rms = tb.forloop_accum(x, "rms")
        tb.new_output(tb.div(xw, rms), (1, -1, -1))
        (O,) = h.customized([X, W], tb)
    h.mark_output(O)
    return h


def _split_k_products(h: KernelGraph, X: Tensor, Ws: list[Tensor], gain: Tensor | None,
                      tiles: Tiles, squares: bool = False) -> tuple[list[Tensor], int]:
    """Kernel 1 of a split-K plan: grid (W's column tiles, ``splits`` pieces of the contraction);
    each block's loop walks its piece and accumulates ``X @ W`` for every W (X's columns scaled
    by ``gain`` first, if given). Piece ``s`` of the partial products is written to rows
    ``s * M .. (s + 1) * M`` of a (splits * M, N) tensor. With ``squares``, a last output holds
    each row's sum of squares of X over the piece (the X tiles are loaded anyway): block
    (j, s) writes column j of rows ``s * M ..`` of a (splits * M, column tiles) tensor, every
    column the same. Returns the outputs and the splits."""
    k, n = X.dims[1], Ws[0].dims[1]
    splits = _grid_tile(k // 64, tiles.splits) if k >= 128 else 1
    piece = k // splits
    tk, tn = _tile(piece, tiles.loop), _tile(n, tiles.grid)
    tb = new_threadblock_graph(grid_dim=(n // tn, splits, 1), forloop_range=piece // tk)
    x_raw = x = tb.new_input(X, (-1, 1, -1), forloop_dim=1)
    sources = [X]
    if gain is not None:
        x = tb.mul(x, tb.new_input(gain, (-1, 1, -1), forloop_dim=1))
        sources.append(gain)
    for W in Ws:
        w = tb.new_input(W, (1, 0, -1), forloop_dim=0)
        tb.new_output(tb.forloop_accum(tb.matmul(x, w)), (1, 0, -1))
        sources.append(W)
    if squares:
        tb.new_output(tb.forloop_accum(tb.square(x_raw), "sum"), (1, 0, -1))
    return h.customized(sources, tb), splits


def _split_k_combine(tb_range: int, n: int, tiles: Tiles) -> ThreadBlockGraph:
    """Kernel 2's thread-block graph: grid over the column tiles, a loop over the pieces."""
    tn = _tile(n, tiles.grid)
    return new_threadblock_graph(grid_dim=(n // tn, 1, 1), forloop_range=tb_range)


def rmsnorm_linear_split_k(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """Two kernels, split-K: kernel 1 spreads the contraction of X @ W over the grid as well
    and also writes each piece's sums of squares of X (``_split_k_products``); kernel 2 sums
    both in a loop over the pieces and divides by ``sqrt(sum of squares / hidden)``. More
    blocks than the one-kernel form when X has few rows, and kernel 2 never reads X."""
    h, ins = _same_inputs(g)
    X, W = ins[0], ins[1]
    gain = ins[2] if len(ins) == 3 else None
    (P, S), splits = _split_k_products(h, X, [W], gain, tiles, squares=True)
    tb = _split_k_combine(splits, W.dims[1], tiles)
    xw = tb.forloop_accum(tb.new_input(P, (1, -1, -1), forloop_dim=0))
    squares = tb.forloop_accum(tb.new_input(S, (1, -1, -1), forloop_dim=0), "sum")
    rms = tb.sqrt(tb.mul_scalar(squares, 1.0 / X.dims[1]))
    tb.new_output(tb.div(xw, rms), (1, -1, -1))
    (O,) = h.customized([P, S], tb)
    h.mark_output(O)
    return h


def _normed(tb: ThreadBlockGraph, q: BlockTensor, v: BlockTensor, norm_q: bool,
            norm_v: bool) -> tuple[BlockTensor, BlockTensor]:
    """The attention builders' Q and V tiles, each rms-normed over its last dimension if asked
    (QKNorm's normalisation, done inside the kernel)."""
    return (tb.rms_norm(q) if norm_q else q), (tb.rms_norm(v) if norm_v else v)


def _split_kv_attention(h: KernelGraph, Q: Tensor, K: Tensor, V: Tensor, tiles: Tiles,
                        norm_q: bool = False, norm_v: bool = False) -> Tensor:
    """Split-KV attention without max subtraction, in two kernels.

    Kernel 1, grid (heads, KV splits, query tiles): per split, the loop walks the split's KV tiles
    and accumulates exp(Q K) V and the row sums of exp(Q K); partials are written side by side
    along the last dimension. Kernel 2, grid (heads, 1, query tiles), adds the partials in a
    loop over the splits and divides.
    """
    heads, lq, d = Q.dims
    lk = K.dims[2]
    tq, tk = _grid_tile(lq, tiles.grid), _tile(lk, tiles.loop)
    splits = max(1, min(lk // tk // 2, tiles.splits))  # at least two loop iterations per split
    loop = lk // (tk * splits)
    tb = new_threadblock_graph(grid_dim=(heads, splits, lq // tq), forloop_range=loop,
                               reduction_dimx=d, smem_bytes=tiles.smem)
    q = tb.new_input(Q, (0, -1, 1), forloop_dim=-1)
    k = tb.new_input(K, (0, 2, -1), forloop_dim=2)
    v = tb.new_input(V, (0, 1, -1), forloop_dim=1)
    q, v = _normed(tb, q, v, norm_q, norm_v)
    e = tb.exp(tb.matmul(q, k))
    tb.new_output(tb.forloop_accum(tb.matmul(e, v)), (0, 2, 1))
    tb.new_output(tb.forloop_accum(e, "sum"), (0, 2, 1))
    num, den = h.customized([Q, K, V], tb)

    # kernel 2 keeps kernel 1's heads and query tiles, and its loop walks the splits: the
    # lowering can run it inside kernel 1 (``lower.fuse``)
    tb2 = new_threadblock_graph(grid_dim=(heads, 1, lq // tq), forloop_range=splits)
    n = tb2.new_input(num, (0, -1, 1), forloop_dim=2)
    s = tb2.new_input(den, (0, -1, 1), forloop_dim=2)
    tb2.new_output(tb2.div(tb2.forloop_accum(n), tb2.forloop_accum(s)), (0, -1, 1))
    (O,) = h.customized([num, den], tb2)
    return O


def _one_kernel_attention(h: KernelGraph, Q: Tensor, K: Tensor, V: Tensor, tiles: Tiles,
                          norm_q: bool = False, norm_v: bool = False) -> Tensor:
    """Attention without max subtraction in one kernel: grid (heads, query tiles, 1); the loop
    walks all KV tiles, accumulating exp(Q K) V and the row sums of exp(Q K), and the block
    divides after the loop. No partials cross device memory; fewer blocks than split-KV."""
    heads, lq, _ = Q.dims
    lk = K.dims[2]
    tq, tk = _grid_tile(lq, tiles.grid), _tile(lk, tiles.loop)
    tb = new_threadblock_graph(grid_dim=(heads, lq // tq, 1), forloop_range=lk // tk,
                               smem_bytes=tiles.smem)
    q = tb.new_input(Q, (0, 1, -1), forloop_dim=-1)
    k = tb.new_input(K, (0, -1, -1), forloop_dim=2)
    v = tb.new_input(V, (0, -1, -1), forloop_dim=1)
    q, v = _normed(tb, q, v, norm_q, norm_v)
    e = tb.exp(tb.matmul(q, k))
    num = tb.forloop_accum(tb.matmul(e, v))
    tb.new_output(tb.div(num, tb.forloop_accum(e, "sum")), (0, 1, -1))
    (O,) = h.customized([Q, K, V], tb)
    return O


def attention(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    h, (Q, K, V) = _same_inputs(g)
    h.mark_output(_split_kv_attention(h, Q, K, V, tiles))
    return h


def attention_one_kernel(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    h, (Q, K, V) = _same_inputs(g)
    h.mark_output(_one_kernel_attention(h, Q, K, V, tiles))
    return h


def flash_attention(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """Attention as one kernel with online softmax (FlashAttention's running max).

    Grid (heads, query tiles, 1); the loop walks the KV tiles. Iteration i computes
    ``s_i = q k_i``, the running row max ``m_i`` (``forloop_max``) and ``p_i = exp(s_i - m_i)``;
    the accumulators rescale their totals by ``exp(m_(i-1) - m_i)`` each step, so after the loop
    they hold ``sum_i exp(s_i - m_last) v_i`` and ``sum_i exp(s_i - m_last)``, whose quotient is
    the attention output: the max cancels, and every exponent is <= 0."""
    h, (Q, K, V) = _same_inputs(g)
    heads, lq, _ = Q.dims
    lk = K.dims[2]
    tq, tk = _grid_tile(lq, tiles.grid), _tile(lk, tiles.loop)
    tb = new_threadblock_graph(grid_dim=(heads, lq // tq, 1), forloop_range=lk // tk,
                               smem_bytes=tiles.smem)
    q = tb.new_input(Q, (0, 1, -1), forloop_dim=-1)  # (1, tq, d), the same every iteration
    k = tb.new_input(K, (0, -1, -1), forloop_dim=2)  # (1, d, tk)
    v = tb.new_input(V, (0, -1, -1), forloop_dim=1)  # (1, tk, d)
    s = tb.matmul(q, k)
    m = tb.forloop_max(s)  # (1, tq, 1): max over the keys of iterations 0..i
    p = tb.exp(tb.add(s, tb.mul_scalar(m, -1.0)))
    o = tb.forloop_accum(tb.matmul(p, v), rescale=m)
    rowsum = tb.forloop_accum(p, "sum", rescale=m)
    tb.new_output(tb.div(o, rowsum), (0, 1, -1))
    (O,) = h.customized([Q, K, V], tb)
    h.mark_output(O)
    return h


def qknorm(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """Attention with the rms_norm of Q and V done inside kernel 1."""
    h, (Q, K, V) = _same_inputs(g)
    h.mark_output(_split_kv_attention(h, Q, K, V, tiles, norm_q=True, norm_v=True))
    return h


def qknorm_one_kernel(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """Attention with the rms_norm of Q and V, all in one kernel (``_one_kernel_attention``)."""
    h, (Q, K, V) = _same_inputs(g)
    h.mark_output(_one_kernel_attention(h, Q, K, V, tiles, norm_q=True, norm_v=True))
    return h


def lora(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """One kernel: grid over the output columns, loop over the hidden dimension accumulating
    X @ W and X @ A; after the loop (X @ A) @ B is added, B's tile being loaded once."""
    h, (X, W, A, B) = _same_inputs(g)
    k, n = W.dims
    tk, tn = _tile(k, tiles.loop), _tile(n, tiles.grid)
    tb = new_threadblock_graph(grid_dim=(n // tn, 1, 1), forloop_range=k // tk)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w = tb.new_input(W, (1, -1, -1), forloop_dim=0)
    a = tb.new_input(A, (-1, -1, -1), forloop_dim=0)
    b = tb.new_input(B, (1, -1, -1), forloop_dim=-1)
    xw = tb.forloop_accum(tb.matmul(x, w))
    xa = tb.forloop_accum(tb.matmul(x, a))
    tb.new_output(tb.add(xw, tb.matmul(xa, b)), (1, -1, -1))
    (O,) = h.customized([X, W, A, B], tb)
    h.mark_output(O)
    return h


def lora_concat(g: KernelGraph) -> KernelGraph:
    """LoRA through concatenation: X @ W + (X @ A) @ B = concat(X, X @ A) @ concat(W; B).

    Kernel 1 computes X @ A; the concatenations are library operators; kernel 2 is one matmul
    over the joined dimension."""
    h, (X, W, A, B) = _same_inputs(g)
    k = X.dims[1]
    r, n = B.dims
    tb = new_threadblock_graph(grid_dim=(1, 1, 1), forloop_range=k // _tile(k))
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    a = tb.new_input(A, (-1, -1, -1), forloop_dim=0)
    tb.new_output(tb.forloop_accum(tb.matmul(x, a)), (-1, -1, -1))
    (XA,) = h.customized([X, A], tb)
    C = h.concat(X, XA, 1)
    D = h.concat(W, B, 0)
    kk, tn = k + r, _tile(n)
    tk = _tile(kk)
    tb2 = new_threadblock_graph(grid_dim=(n // tn, 1, 1), forloop_range=kk // tk)
    c = tb2.new_input(C, (-1, -1, -1), forloop_dim=1)
    dd = tb2.new_input(D, (1, -1, -1), forloop_dim=0)
    tb2.new_output(tb2.forloop_accum(tb2.matmul(c, dd)), (1, -1, -1))
    (O,) = h.customized([C, D], tb2)
    h.mark_output(O)
    return h


def gated_mlp(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """One kernel: both matmuls share X's tiles in one loop; silu and the product after it."""
    h, (X, W1, W2) = _same_inputs(g)
    k, n = W1.dims
    tk, tn = _tile(k, tiles.loop), _tile(n, tiles.grid)
    tb = new_threadblock_graph(grid_dim=(n // tn, 1, 1), forloop_range=k // tk)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w1 = tb.new_input(W1, (1, -1, -1), forloop_dim=0)
    w2 = tb.new_input(W2, (1, -1, -1), forloop_dim=0)
    a = tb.forloop_accum(tb.matmul(x, w1))
    b = tb.forloop_accum(tb.matmul(x, w2))
    tb.new_output(tb.mul(tb.silu(a), b), (1, -1, -1))
    (O,) = h.customized([X, W1, W2], tb)
    h.mark_output(O)
    return h


def gated_mlp_split_k(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """Two kernels, split-K: kernel 1 writes partial X @ W1 and X @ W2 per piece of the
    contraction; kernel 2 sums them in a loop over the pieces, then silu and the product."""
    h, (X, W1, W2) = _same_inputs(g)
    (P1, P2), splits = _split_k_products(h, X, [W1, W2], None, tiles)
    tb = _split_k_combine(splits, W1.dims[1], tiles)
    a = tb.forloop_accum(tb.new_input(P1, (1, -1, -1), forloop_dim=0))
    b = tb.forloop_accum(tb.new_input(P2, (1, -1, -1), forloop_dim=0))
    tb.new_output(tb.mul(tb.silu(a), b), (1, -1, -1))
    (O,) = h.customized([P1, P2], tb)
    h.mark_output(O)
    return h


def ntrans(g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """One kernel: one row per block; both norms and the element-wise chain in registers."""
    h, (H, X, alpha) = _same_inputs(g)
    rows = H.dims[0]
    tb = new_threadblock_graph(grid_dim=(rows, 1, 1), forloop_range=1)
    hh, x, al = (tb.new_input(t, (0, -1, -1), forloop_dim=-1) for t in (H, X, alpha))
    t = tb.add(tb.mul(tb.add(tb.rms_norm(hh), x), al), x)
    tb.new_output(tb.forloop_accum(tb.rms_norm(t)), (0, -1, -1))
    (O,) = h.customized([H, X, alpha], tb)
    h.mark_output(O)
    return h


Builder = Callable[..., KernelGraph]
#: per benchmark, its hand-written forms, the one ``fused`` returns first
BUILDERS: dict[str, tuple[Builder, ...]] = {
    "gqa": (attention, flash_attention, attention_one_kernel),
    "mha": (attention, flash_attention, attention_one_kernel),
    "mqa": (attention, flash_attention, attention_one_kernel),
    "qknorm": (qknorm, qknorm_one_kernel),
    "rmsnorm_linear": (rmsnorm_linear, rmsnorm_linear_split_k), "lora": (lora,),
    "gated_mlp": (gated_mlp, gated_mlp_split_k), "ntrans": (ntrans,),
}
#: the shared memory one block may use on an H100 / H200
HOPPER_SMEM_BYTES = 227 * 1024
#: tile caps ``variants`` tries: the defaults first, then narrower grid tiles (more blocks) and
#: longer loop steps (fewer iterations), or more KV splits for the split-KV forms
TILE_CHOICES: tuple[Tiles, ...] = (
    Tiles(), Tiles(grid=32), Tiles(grid=16), Tiles(grid=32, loop=128), Tiles(grid=16, loop=256),
    Tiles(splits=16), Tiles(loop=128, splits=16), Tiles(grid=128), Tiles(grid=128, splits=4),
    Tiles(grid=128, splits=2), Tiles(loop=128, splits=2), Tiles(grid=128, loop=128),
    Tiles(grid=128, smem=HOPPER_SMEM_BYTES), Tiles(loop=128, smem=HOPPER_SMEM_BYTES),
    Tiles(loop=128, splits=16, smem=HOPPER_SMEM_BYTES),
)


def _builders(name: str) -> tuple[Builder, ...]:
    if name not in BUILDERS:
        raise GraphError(f"no hand-written μGraph for {name!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[name]


def fused(name: str, g: KernelGraph, tiles: Tiles = Tiles()) -> KernelGraph:
    """The hand-written fused μGraph of benchmark ``name`` for program ``g`` (its first form)."""
    return _builders(name)[0](g, tiles)


def variants(name: str, g: KernelGraph) -> list[KernelGraph]:
    """Every hand-written form of ``name`` under each of ``TILE_CHOICES``, distinct ones only,
    ``fused(name, g)`` first; tilings whose tiles overflow shared memory are left out (but
    ``fused`` itself must fit)."""
    seen: set[str] = set()
    out = []
    first = _builders(name)[0]
    for build, tiles in itertools.product(_builders(name), TILE_CHOICES):
        try:
            h = build(g, tiles)
        except ResourceError:
            if build is first and tiles == Tiles():
                raise
            continue
        key = dumps(h)
        if key not in seen:
            seen.add(key)
            out.append(h)
    return out
