"""The verifier's shortcuts change no residue: folded matmuls, the matmul accumulated over the
loop as one product, evaluation in slices of the grid, and one evaluation per kernel."""

from __future__ import annotations

import numpy as np
import pytest

import egraph_mirage as em
from egraph_mirage.mugraph import accumulators as accs
from egraph_mirage.ops import OPS
from egraph_mirage.ops.field_ops import random_tables
from egraph_mirage.verify import chunks
from egraph_mirage.verify import field as ff
from egraph_mirage.verify.fold import folded_matmul
from egraph_mirage.verify.verify import evaluate_ff


def test_folded_matmul_is_matmul() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        nb = int(rng.integers(0, 5))
        bx = [int(rng.choice([1, 1, 2, 3])) for _ in range(nb)]
        by = [b if rng.random() < 0.3 else (int(rng.choice([1, 2, 3])) if b == 1 else 1)
              for b in bx]
        if nb and rng.random() < 0.3:
            by = by[int(rng.integers(0, nb)):]
        m, k, n = (int(v) for v in rng.integers(1, 4, 3))
        x, y = rng.standard_normal((*bx, m, k)), rng.standard_normal((*by, k, n))
        want = np.matmul(x, y)
        got = folded_matmul(np, x, y)
        assert got.shape == want.shape and np.allclose(got, want)


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
    h = em.handwritten.flash_attention(g) if flash else em.handwritten.fused(name, g)
    ff._jnp()
    import jax.numpy as jnp

    plain = _field_run(h, np)
    kernel = next(t.params["kernel"] for t in h.operators if t.op == "customized")
    monkeypatch.setattr(accs, "matmul_loop_sum_ff", lambda f, a, b: None)
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
    h = em.handwritten.fused("mqa", g)
    kernels = [t.params["kernel"] for t in h.operators
               if t.op == "customized" and t.params["output"] == 0]
    tb = kernels[0].tb  # 4 M attention scores from 0.6 M input elements
    axis, parts = chunks.plan(tb)
    assert tb.grid_dim[axis] % parts == 0 and 1 < parts <= tb.grid_dim[axis]
    assert chunks.plan(kernels[1].tb) is None  # the small second kernel runs at once
    mha = em.handwritten.fused("mha", em.benchmarks.get("mha"))
    assert chunks.plan(mha.operators[0].params["kernel"].tb) is None  # inputs dominate


def test_a_kernel_with_two_outputs_runs_once_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    g = em.benchmarks.get("gqa", small=True)
    h = em.handwritten.fused("gqa", g)
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
