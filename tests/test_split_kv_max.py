"""Split-KV attention with the row max subtracted, as model code writes softmax
(``exp(s - amax(s)) / sum(...)``): each block of a first kernel takes a piece of the keys and
writes its partial sums relative to its own max, with that max beside them; a second kernel
combines the pieces, each rescaled by ``exp(m_i - max m)`` (an accumulator rescaled by a tile
that is not a running max, ``docs/mugraph.md`` section 6). Two identities in ``rules/`` make it
reachable (``SumShift``), the verifier decides it exactly (exp is a homomorphism, the maxima
cancel), it stays finite where exponentiating without a max overflows, it lowers, and the
search finds it. Small shapes, a budget in tasks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.graph import abstract_term
from egraph_mirage.search import SearchConfig

HEADS, ROWS, HEAD_DIM, KEYS = 2, 4, 16, 64
SPLITS, STEP = 4, 8
SCALE = 0.25


def attention(dtype: em.DType = em.float32, masked: bool = False) -> em.KernelGraph:
    """Attention over ``KEYS`` keys, its softmax as the torch front end traces it: the scaled
    scores less their row max, exponentiated, over their sum, times V; ``masked``: plus an
    additive mask (a fourth input), as a boolean ``attn_mask`` becomes (0 or -inf)."""
    g = em.new_kernel_graph()
    q = g.new_input((HEADS, ROWS, HEAD_DIM), dtype=dtype)
    k = g.new_input((HEADS, HEAD_DIM, KEYS), dtype=dtype)
    v = g.new_input((HEADS, KEYS, HEAD_DIM), dtype=dtype)
    s = g.mul_scalar(g.matmul(q, k), SCALE)
    if masked:
        s = g.add(s, g.new_input((HEADS, ROWS, KEYS), dtype=dtype))
    e = g.exp(g.sub(s, g.apply("amax", [s], dim=2)))
    g.mark_output(g.matmul(g.div(e, g.apply("reduction", [e], dim=2)), v))
    return g


def split_kv(g: em.KernelGraph, rescale_o: bool = True, rescale_l: bool = True,
             subtract: bool = True) -> em.KernelGraph:
    """Kernel 1, grid (heads, splits): per split, a loop over its keys in tiles of ``STEP``
    with a running max (FlashAttention's form inside the split); it writes the partial
    numerator and denominator and the split's max. Kernel 2, grid (heads): a loop over the
    splits, both partials rescaled by the maxima it loads, and their quotient. The flags
    build the mistakes the verifier must reject."""
    h = em.new_kernel_graph()
    Q, K, V, *mask = (h.new_input(t.dims, dtype=t.dtype) for t in g.inputs)
    tb = em.new_threadblock_graph(grid_dim=(HEADS, SPLITS, 1),
                                  forloop_range=KEYS // SPLITS // STEP)
    q = tb.new_input(Q, (0, -1, -1), forloop_dim=-1)
    k = tb.new_input(K, (0, 2, -1), forloop_dim=2)
    v = tb.new_input(V, (0, 1, -1), forloop_dim=1)
    s = tb.mul_scalar(tb.matmul(q, k), SCALE)
    if mask:  # the additive mask, split and stepped as the keys are
        s = tb.add(s, tb.new_input(mask[0], (0, 2, -1), forloop_dim=2))
    m = tb.forloop_max(s)
    e = tb.exp(tb.sub(s, m) if subtract else s)
    tb.new_output(tb.forloop_accum(tb.matmul(e, v), rescale=m), (0, 2, -1))
    tb.new_output(tb.forloop_accum(e, "sum", rescale=m), (0, 2, -1))
    tb.new_output(m, (0, 2, -1))  # the running max's value after the loop
    O, L, M = h.customized([Q, K, V, *mask], tb)
    tb2 = em.new_threadblock_graph(grid_dim=(HEADS, 1, 1), forloop_range=SPLITS)
    o = tb2.new_input(O, (0, -1, -1), forloop_dim=2)
    l_ = tb2.new_input(L, (0, -1, -1), forloop_dim=2)
    mm = tb2.new_input(M, (0, -1, -1), forloop_dim=2)
    num = tb2.forloop_accum(o, rescale=mm if rescale_o else None)
    den = tb2.forloop_accum(l_, rescale=mm if rescale_l else None)
    tb2.new_output(tb2.div(num, den), (0, -1, -1))
    (out,) = h.customized([O, L, M], tb2)
    h.mark_output(out)
    return h


def _inputs(g: em.KernelGraph, scale: float, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [scale * rng.standard_normal(t.dims) for t in g.inputs]


def test_the_split_form_verifies_and_stays_finite_where_exp_alone_overflows() -> None:
    g = attention()
    h = split_kv(g)
    for scale in (1.0, 20.0):
        xs = _inputs(g, scale)
        if scale > 1:  # scores past 710: exp overflows float64 without a max
            assert (xs[0] @ xs[1]).max() * SCALE > 710
        (want,) = g.evaluate(xs)
        (blocks,) = em.run_reference(h, xs)  # the literal per-block loops
        (vectorised,) = h.evaluate(xs)
        assert np.all(np.isfinite(blocks))
        assert np.allclose(blocks, want, rtol=1e-9, atol=1e-12)
        assert np.allclose(vectorised, want, rtol=1e-9, atol=1e-12)
    assert em.check_numerics(h, g) < 1e-9
    assert em.verify(g, h, tests=3, seed=1).equivalent


@pytest.mark.parametrize("wrong", [dict(rescale_o=False), dict(rescale_l=False),
                                   dict(rescale_o=False, rescale_l=False),
                                   dict(subtract=False)])
def test_a_combine_that_forgets_a_rescale_is_rejected(wrong: dict) -> None:
    """Without one of the rescales the pieces' maxima no longer cancel (and without the
    subtraction the first kernel's rescaled sums are off by exp(m)): the verifier tells."""
    g = attention()
    assert not em.verify(g, split_kv(g, **wrong), tests=3, seed=1).equivalent


def test_every_tile_is_reachable_and_the_e_graph_stays_small() -> None:
    """The two split-KV identities of ``rules/30_functions.egg`` write the split form as
    ``SumShift`` terms, which the sum rules do not take apart: the e-graph saturates, at about
    twice the size without them, and every tile of both kernels is reachable."""
    g = attention()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an incomplete saturation warns
        oracle = em.Oracle(g)
    assert oracle.complete and len(oracle.snapshot.nodes) < 3000
    h = split_kv(g)
    for op in h.operators:
        if op.op != "customized":
            continue
        kernel = op.params["kernel"]
        terms = kernel.block_exprs([abstract_term(x) for x in op.operands])
        for t in kernel.tb.tensors:
            if t.op != "input":
                assert oracle.is_subexpr(terms[t.index]), (t.index, t.op)


@pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
def test_the_split_form_lowers_and_matches_with_large_scores(dtype: em.DType) -> None:
    """In Triton (the interpreter without a GPU): scores past 100, where exp(s) alone
    overflows fp32 and fp16; the partials and maxima are stored in fp32."""
    torch_dtype = {em.float32: torch.float32, em.float16: torch.float16}[dtype]
    g = attention(dtype)
    h = split_kv(g)
    xs = _inputs(g, 6.0, seed=3)
    ts = [torch.tensor(x, dtype=torch_dtype) for x in xs]
    xs = [t.double().numpy() for t in ts]
    assert (xs[0] @ xs[1]).max() * SCALE > 100
    (want,) = g.evaluate(xs)
    (got,) = em.compile(h)(*ts)
    got = got.double().numpy()
    assert np.all(np.isfinite(got))
    assert np.abs(got - want).max() / np.abs(want).max() < (1e-5 if dtype is em.float32
                                                            else 2e-3)


def test_the_search_finds_the_split_form_with_its_max() -> None:
    """The search itself, its split task of 8 operators run alone (grids of the heads by 8 key
    pieces and of the heads alone; the tasks before it find the one-kernel forms): its
    two-kernel results write each piece's max beside its partial sums (an ``amax`` of the
    piece, all its keys in one tile) and rescale both by it in the combine; each verifies and
    matches the program."""
    from egraph_mirage.mugraph.serialize import loads
    from egraph_mirage.search.prepare import prepare
    from egraph_mirage.search.tasks import SPLIT, Context, list_tasks, run_task

    g = attention(em.float16)
    config = SearchConfig(griddims=((HEADS, 8, 1), (HEADS, 1, 1)), franges=(1, 8))
    payload = prepare(g, config)
    ctx = Context(payload)
    task = next(t for t in list_tasks(payload, ctx) if t.kind == SPLIT and t.ops == (8, 8))
    found = run_task(payload, task, ctx=ctx).found
    assert found
    for text, kernels, *_ in found[:4]:
        h = loads(text)
        kernels_of = {id(op.params["kernel"]): op.params["kernel"].tb for op in h.operators
                      if op.op == "customized"}  # one operator per output of a kernel
        first, combine = kernels_of.values()
        assert kernels == 2 and any(t.op == "amax" for t, _ in first.outputs)
        assert sum(t.op == "forloop_accum_rescale" for t in combine.tensors) == 2
        assert em.verify(g, h, tests=2, seed=3).equivalent
        assert em.check_numerics(h, g) < 1e-2


@pytest.mark.parametrize("dtype", [em.float32, em.float16], ids=lambda d: d.value)
def test_pieces_whose_keys_a_mask_hides_add_nothing(dtype: em.DType) -> None:
    """An additive mask of -inf (a boolean ``attn_mask`` as SDPA applies it, or a static
    cache's unwritten positions) hides every key of a piece: the piece's max is then the
    lowest finite float, not -inf, so its partial sums are 0, not NaN (-inf - -inf), and the
    combine weighs its max, stored as -inf in fp16, by 0. Rows keep at least one key."""
    torch_dtype = {em.float32: torch.float32, em.float16: torch.float16}[dtype]
    g = attention(dtype, masked=True)
    h = split_kv(g)
    xs = _inputs(g, 2.0, seed=5)
    piece = KEYS // SPLITS
    mask = np.zeros((HEADS, ROWS, KEYS))
    mask[:, :, piece:2 * piece] = -np.inf  # the second piece of every row
    mask[:, 0, 2 * piece:] = -np.inf  # row 0: its last three pieces too
    mask[1, 1, :3 * piece] = -np.inf  # a row whose first tiles are all hidden
    xs[3] = mask
    ts = [torch.tensor(x, dtype=torch_dtype) for x in xs]
    want = torch.softmax(ts[0].double() @ ts[1].double() * SCALE + ts[3].double(), -1) \
        @ ts[2].double()
    (got,) = em.compile(h)(*ts)
    got = got.double()
    assert torch.isfinite(got).all()
    assert ((got - want).abs().max() / want.abs().max()).item() < (
        1e-5 if dtype is em.float32 else 2e-3)
