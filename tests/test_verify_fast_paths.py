"""The verifier's shortcuts change no residue: folded matmuls (numpy and JAX), the matmul
accumulated over the loop as one product, evaluation in slices of the grid, one evaluation per
kernel, parts computed only when read, and one BLAS thread."""

from __future__ import annotations

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage.bench import handwritten_fixtures as hw
from egraph_mirage.ops import OPS
from egraph_mirage.ops.field_ops import random_tables
from egraph_mirage.verify import chunks, slices
from egraph_mirage.verify import field as ff
from egraph_mirage.verify.blas import _openblas, one_blas_thread
from egraph_mirage.verify.fold import folded_matmul, product_shape
from egraph_mirage.verify.verify import evaluate_ff


def _batch_pair(rng: np.random.Generator, nb: int) -> tuple[list[int], list[int]]:
    bx = [int(rng.choice([1, 1, 2, 3])) for _ in range(nb)]
    by = [b if rng.random() < 0.3 else (int(rng.choice([1, 2, 3])) if b == 1 else 1) for b in bx]
    return bx, by


def test_folded_matmul_is_matmul() -> None:
    jnp = ff._jnp()
    rng = np.random.default_rng(0)
    for trial in range(200):
        nb = int(rng.integers(0, 5))
        bx, by = _batch_pair(rng, nb)
        if nb and rng.random() < 0.3:
            by = by[int(rng.integers(0, nb)):]
        m, k, n = (int(v) for v in rng.integers(1, 4, 3))
        x, y = rng.standard_normal((*bx, m, k)), rng.standard_normal((*by, k, n))
        want = np.matmul(x, y)
        for xp in (np, jnp) if trial % 4 == 0 else (np,):  # JAX: a quarter (each compiles)
            got = np.asarray(folded_matmul(xp, xp.asarray(x), xp.asarray(y)))
            assert got.shape == want.shape == product_shape(x.shape, y.shape)
            assert np.allclose(got, want)


def test_folded_matmul_summed_over_an_axis() -> None:
    """With ``summed``, the products are summed over that batch axis, kept with size 1."""
    jnp = ff._jnp()
    rng = np.random.default_rng(1)
    for trial in range(40):
        nb = int(rng.integers(1, 4))
        bx, by = _batch_pair(rng, nb)
        axis = int(rng.integers(0, nb))
        bx[axis] = by[axis] = int(rng.integers(2, 4))
        m, k, n = (int(v) for v in rng.integers(1, 4, 3))
        x, y = rng.standard_normal((*bx, m, k)), rng.standard_normal((*by, k, n))
        want = np.matmul(x, y).sum(axis=axis, keepdims=True)
        for xp in (np, jnp) if trial % 4 == 0 else (np,):
            got = np.asarray(folded_matmul(xp, xp.asarray(x), xp.asarray(y), summed=axis))
            assert got.shape == want.shape == product_shape(x.shape, y.shape, axis)
            assert np.allclose(got, want)
    with pytest.raises(ValueError, match="not summable"):
        folded_matmul(np, np.ones((2, 1, 3, 3)), np.ones((2, 2, 3, 3)), summed=1)


@pytest.mark.parametrize("backend", ["numpy", "jax"])
@pytest.mark.parametrize("m, k", [(2**25 + 35, 2), (2**26 - 5, 5)])
def test_products_split_for_exact_sums(backend: str, m: int, k: int) -> None:
    """A contraction too long for exact float64 sums is cut into parts, over the summed axis
    (groups of 3 iterations, then 1, for the first modulus) and the tile's k (parts of one term
    for the second): the residues equal exact integer arithmetic."""
    xp = np if backend == "numpy" else ff._jnp()
    f = ff.Field(None, None, xp=xp)
    rng = np.random.default_rng(2)
    x = rng.integers(m - 1000, m, (2, 4, 1, 3, k)).astype(np.float64)  # summed axis 1
    y = rng.integers(m - 1000, m, (2, 4, 1, k, 2)).astype(np.float64)
    exact = np.matmul(x.astype(np.int64).astype(object), y.astype(np.int64).astype(object))
    for summed, want in ((1, exact.sum(axis=1, keepdims=True) % m), (None, exact % m)):
        got = f._matmul(xp.asarray(x), xp.asarray(y), m, summed=summed)
        assert np.array_equal(np.asarray(got).astype(np.int64), want.astype(np.int64))


def test_numpy_parts_are_computed_when_read() -> None:
    """numpy: a product's parts wait until read, so one nobody reads is never computed."""
    f = ff.Field(None, ff.exp_table(), xp=np)
    rng = np.random.default_rng(3)
    a = ff.numpy_input(rng, (2, 3, 4))
    b = ff.numpy_input(rng, (2, 4, 5))
    c = f.matmul(a, b)
    assert isinstance(c._p, ff.Lazy) and isinstance(c._q, ff.Lazy) and c.has_q
    assert c.shape == (2, 3, 5) and isinstance(c._p, ff.Lazy)  # the shape computes nothing
    e = f.exp(c)  # exp reads only the q-part
    assert isinstance(c._p, ff.Lazy) and not isinstance(c._q, ff.Lazy)
    assert np.array_equal(c.p, np.matmul(a.p, b.p) % ff.P)
    assert np.array_equal(e.p, ff.exp_table()[(np.matmul(a.q, b.q) % ff.Q).astype(int)])
    d = f.div(a, ff.FF(a.p + 1, a.q + 1))  # the divisor's zero checks run at once
    assert isinstance(d._q, ff.Lazy) and not isinstance(d._p, ff.Lazy)


def test_one_blas_thread_restores_the_count() -> None:
    libs = _openblas()
    before = [get() for get, _ in libs]
    with one_blas_thread():
        assert all(get() == 1 for get, _ in libs)
    assert [get() for get, _ in libs] == before


def _field_run(g: em.KernelGraph, xp: object, seed: int = 0) -> tuple[list[np.ndarray], bool]:
    import jax

    rng = np.random.default_rng(seed)
    tables = {ff.table_key(n, d): xp.asarray(ff.numpy_table(rng, ff.P if d == "p" else ff.Q))
              for n in random_tables(OPS) for d in ("p", "q")}
    xs = [ff.numpy_input(rng, t.dims) for t in g.inputs]
    f = ff.Field(jax.random.PRNGKey(0), xp.asarray(ff.exp_table()), tables, xp=xp)
    outs = evaluate_ff(g, f, [ff.FF(xp.asarray(x.p), xp.asarray(x.q)) for x in xs])
    return [np.asarray(o.p) for o in outs], bool(f.zero_division)


@pytest.mark.parametrize("name, flash", [("mqa", False), ("qknorm", False), ("gqa", True),
                                         ("rmsnorm_linear", False)])
def test_shortcuts_give_the_same_residues(name: str, flash: bool,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluated in slices of the grid (a tiny part size forces them) and with the matmul
    accumulated as one product, or neither: identical outputs, numpy and JAX alike."""
    g = em.benchmarks.get(name, small=True)
    h = hw.flash_attention(g) if flash else hw.fused(name, g)
    ff._jnp()
    import jax.numpy as jnp

    plain = _field_run(h, np)
    kernel = next(t.params["kernel"] for t in h.operators if t.op == "customized")
    monkeypatch.setattr(ff.Field, "matmul_sum", lambda self, a, b, axis: None)
    monkeypatch.setattr(chunks, "plan", lambda tb, limit=None: None)
    reference = _field_run(h, np)
    monkeypatch.undo()
    tb = kernel.tb
    for axis in range(3):
        if tb.grid_dim[axis] % 2 == 0:  # two parts along every axis that allows it
            monkeypatch.setattr(chunks, "plan", lambda t, limit=None, axis=axis, tb=tb:
                                (axis, 2) if t is tb else None)
            for xp in (np, jnp):
                got = _field_run(h, xp)
                assert got[1] == reference[1]
                for a, b in zip(got[0], reference[0]):
                    assert np.array_equal(a, b)
    for a, b in zip(plain[0], reference[0]):
        assert np.array_equal(a, b)


def test_plan_splits_only_kernels_with_large_intermediate_tiles() -> None:
    g = em.benchmarks.get("mqa")
    h = hw.fused("mqa", g)
    kernels = [t.params["kernel"] for t in h.operators
               if t.op == "customized" and t.params["output"] == 0]
    tb = kernels[0].tb  # 4 M attention scores from 0.6 M input elements
    axis, parts = chunks.plan(tb)
    assert tb.grid_dim[axis] % parts == 0 and 1 < parts <= tb.grid_dim[axis]
    assert chunks.plan(kernels[1].tb) is None  # the small second kernel runs at once
    mha = hw.fused("mha", em.benchmarks.get("mha"))
    assert chunks.plan(mha.operators[0].params["kernel"].tb) is None  # inputs dominate


def test_a_kernel_with_two_outputs_runs_once_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    g = em.benchmarks.get("gqa", small=True)
    h = hw.fused("gqa", g)
    kernel = h.operators[0].params["kernel"]
    assert kernel.num_outputs == 2
    calls = []
    real = type(kernel).run_vectorised

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(type(kernel), "run_vectorised", counting)
    _field_run(h, np)
    assert calls.count(kernel) == 1


@pytest.mark.parametrize("name", ["rmsnorm_linear", "gated_mlp"])
def test_jit_reads_the_weights_in_place(name: str) -> None:
    """Under JAX a matmul accumulated over the loop is one ``dot_general`` on the tiles' own
    axes: XLA cancels the partition's transposes and copies no weight matrix (two copies of
    each weight per test, slower than the product, were the cost of rearranging by hand)."""
    import re

    g = em.benchmarks.get(name, small=True)
    h = hw.fused(name, g)
    v = em.Verifier(g, tests=1)
    ins, _ = v._cases[0]
    hlo = v._compile(h).lower(*ins, v._exp_table).compile().as_text()
    weight = max(int(np.prod(t.dims)) for t in g.inputs)
    moved = [int(np.prod([int(d) for d in dims.split(",") if d]))
             for dims in re.findall(r"= \w+\[([\d,]*)\]\{[^}]*\} (?:transpose|copy)\(", hlo)]
    assert re.search(r" dot\(", hlo) and weight not in moved


def _layouts(rng: np.random.Generator) -> list[np.ndarray]:
    """Arrays of residues mod q larger than a slice, as the vectorised layout makes them:
    contiguous, transposed and sliced views, a reversed axis and broadcast axes."""
    base = rng.integers(0, ff.Q, (3, 40, 5, 300)).astype(np.float64)
    assert base.size > 2 * slices.SLICE
    return [base, base.transpose(2, 0, 3, 1), base[:, ::2], base[..., ::-1],
            np.broadcast_to(base[:, :1], base.shape), base[None].transpose(4, 1, 0, 2, 3),
            np.broadcast_to(base[0, 0, 0], (50, 4, 300)).transpose(1, 0, 2), base[:, 3]]


def test_slices_give_the_same_numbers_in_the_same_shape() -> None:
    """``slices.mod`` and ``slices.lookup`` (memory order, a slice at a time) against the
    plain numpy formulas, on every layout the vectorised evaluation produces."""
    rng = np.random.default_rng(5)
    table = ff.numpy_table(rng, ff.Q)
    for x in _layouts(rng):
        y = x * x + 3.0 * x  # below 2**53
        got = slices.mod(y, ff.Q)
        assert got.shape == y.shape and np.array_equal(got, y - np.floor(y / ff.Q) * ff.Q)
        got = slices.lookup(table, x)
        assert got.shape == x.shape and got.dtype == np.float64
        assert np.array_equal(got, table[x.astype(np.int64)])
    with pytest.raises(IndexError):  # an index outside the table raises, as np.take does
        slices.lookup(table[:100], _layouts(rng)[1])


def test_a_large_tile_keeps_its_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A weight-sized tile looked up in its memory order comes back as a view with the weight's
    layout, so the product after it reads it in place (no copy of the weight)."""
    from egraph_mirage.mugraph import maps as pt

    monkeypatch.setattr(slices, "LOOKUP_FROM", slices.SLICE)  # a small weight takes the path
    rng = np.random.default_rng(6)
    w = rng.integers(0, ff.P, (256, 512)).astype(np.float64)
    tile = pt.to_blocks(np, w, (8, 1, 1), 4, (1, -1, -1), 0)  # a transposed view of w
    f = ff.Field(None, ff.exp_table(), {"silu/p": ff.numpy_table(rng, ff.P)}, xp=np)
    got = f._lookup(f.table("silu"), tile)
    assert np.shares_memory(got, got.base) and not got.flags.c_contiguous
    assert got.strides == tile.strides
    assert np.array_equal(got, f.table("silu")[tile.astype(np.int64)])


def test_numpy_inverses_are_fermat() -> None:
    """The numpy backend's inverses come from a table: the same residues as square and
    multiply (the JAX path), 0 mapping to 0."""
    jnp = ff._jnp()
    rng = np.random.default_rng(7)
    for m in (ff.P, ff.Q):
        table = ff.inverse_table(m)
        assert table[0] == 0 and not table.flags.writeable
        x = np.concatenate([[0, 1, m - 1], rng.integers(0, m, 5000)]).astype(np.float64)
        got = ff.Field(None, None, xp=np).inverse(x, m)
        want = np.asarray(ff.Field(None, None, xp=jnp).inverse(jnp.asarray(x), m))
        assert np.array_equal(got, want)
        nonzero = x != 0
        assert np.all(got[nonzero].astype(np.int64) * x[nonzero].astype(np.int64) % m == 1)


def test_backends_agree_on_a_function_of_a_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate that applies a random function and a scalar to loaded weights larger than
    a slice (the slowest kind under numpy before the slices): numpy and JAX give the same
    outputs, and the verifier tells it from the gated MLP."""
    monkeypatch.setattr(slices, "LOOKUP_FROM", slices.SLICE)  # small weights take the paths
    monkeypatch.setattr(slices, "MOD_FROM", slices.SLICE)
    calls: list[str] = []
    for name in ("lookup", "mod"):
        real = getattr(slices, name)
        monkeypatch.setattr(slices, name, lambda *a, real=real, name=name:
                            calls.append(name) or real(*a))
    g = em.new_kernel_graph()
    X, W1, W2 = g.new_input((1, 512)), g.new_input((512, 256)), g.new_input((512, 256))
    g.mark_output(g.mul(g.silu(g.matmul(X, W1)), g.matmul(X, W2)))
    assert 512 * 256 > slices.SLICE
    tb = em.new_threadblock_graph(grid_dim=(4, 1, 1), forloop_range=8)
    x = tb.new_input(X, (-1, -1, -1), forloop_dim=1)
    w1 = tb.new_input(W1, (1, -1, -1), forloop_dim=0)
    w2 = tb.new_input(W2, (1, -1, -1), forloop_dim=0)
    a = tb.forloop_accum(tb.matmul(x, tb.silu(w1)))
    b = tb.forloop_accum(tb.matmul(x, tb.mul_scalar(w2, 2.0)))
    tb.new_output(tb.mul(tb.silu(a), b), (1, -1, -1))
    m = em.new_kernel_graph()
    ins = [m.new_input(t.dims) for t in g.inputs]
    (out,) = m.customized(ins, tb)
    m.mark_output(out)
    ff._jnp()
    import jax.numpy as jnp

    got, want = _field_run(m, np), _field_run(m, jnp)
    assert got[1] == want[1] and all(np.array_equal(a, b) for a, b in zip(got[0], want[0]))
    assert {"lookup", "mod"} <= set(calls)
    assert not em.Verifier(g, backend="numpy").check(m).equivalent
