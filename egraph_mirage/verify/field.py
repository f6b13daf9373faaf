"""Arithmetic over Z_p x Z_q in JAX or numpy, for the finite-field verifier.

Every tensor is a pair of arrays (``FF``): its value mod p, and its value mod q, the exponent
domain, where q is a prime dividing p - 1. ``exp(x) = omega ** (x mod q) mod p`` with omega of
order q, so exp turns sums into products exactly as over the reals. After an exp the mod-q part is
unknown (``None``): a second exp on the same path is outside the verifiable fragment and raises
``VerifyError``. Functions with no algebraic model (sqrt, silu, gelu, relu) are random functions,
drawn independently over Z_p and over Z_q: the same random tables on both programs of a test, so
equal programs still agree, and unequal ones are told apart with high probability.

Values are float64 holding integers: a product of two residues is below 2**40 and a dot product
of K of them below K * 2**40, exact while under 2**53 (contractions are chunked to stay there).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np

from ..errors import EMError
from . import slices
from .fold import folded_matmul, is_jax, join_loop, product_shape

#: p is a safe prime below 2**20 (p = 2q + 1), omega = 9 has order q modulo p.
P, Q, OMEGA = 1048343, 524171, 9
EXACT = 2.0**53


class VerifyError(EMError, ValueError):
    """A program is outside what the finite-field verifier can decide (e.g. exp of an exp)."""


def _jnp() -> Any:
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    return jnp


class Lazy:
    """A part of an ``FF`` that is computed when first read (numpy backend; see ``FF``)."""

    __slots__ = ("compute", "shape")

    def __init__(self, compute: Callable[[], Any], shape: tuple[int, ...] | None = None) -> None:
        self.compute, self.shape = compute, shape


class FF:
    """A tensor over Z_p x Z_q; ``q`` is None where the exponent-domain value is unknown.

    With the numpy backend a part may be ``Lazy``: computed when read, and never if nothing
    reads it. A program's outputs are compared mod p only, and exp reads only the q-part of its
    operand, so whole products go unused: the q-part of RMSNorm + Linear's ``X @ W`` (read only
    by the division's q-part, which the output does not need) and the p-part of attention's
    scores (read only by the exp). Under JAX both parts are plain arrays; XLA drops what the
    outputs do not need. The values are the same either way."""

    __slots__ = ("_p", "_q", "why")

    def __init__(self, p: Any, q: Any | None, why: str = "") -> None:
        self._p, self._q = p, q
        #: the op that poisoned ``q`` (for error messages)
        self.why = why

    @property
    def p(self) -> Any:
        if isinstance(self._p, Lazy):
            self._p = self._p.compute()
        return self._p

    @property
    def q(self) -> Any | None:
        if isinstance(self._q, Lazy):
            self._q = self._q.compute()
        return self._q

    @property
    def has_q(self) -> bool:
        """Whether the q-part is known (without computing it)."""
        return self._q is not None

    @property
    def shape(self) -> tuple[int, ...]:
        p = self._p
        return p.shape if isinstance(p, Lazy) and p.shape is not None else tuple(self.p.shape)

    def __repr__(self) -> str:
        return f"FF(shape={self.shape}, q={'known' if self.has_q else 'unknown'}, why={self.why!r})"


class Field:
    """Z_p x Z_q with per-test random function tables; pass it to the op table's ``ff``."""

    def __init__(self, key: Any, exp_table: Any, tables: dict[str, Any] | None = None,
                 p: int = P, q: int = Q, xp: Any = None) -> None:
        import jax

        #: the array module: jax.numpy (default; jit-compilable) or numpy (no compile step)
        self.xp = _jnp() if xp is None else xp
        self.p, self.q = p, q
        self._key = key
        self._tables: dict[str, Any] = dict(tables or {})
        self.exp_table = exp_table
        self._jax = jax
        #: set when a division by zero happened; the test is then redrawn
        self.zero_division = self.xp.asarray(False)
        #: results of graph-defined kernels already evaluated with this field (a kernel with
        #: several outputs is one operator per output, but runs once)
        self.memo: dict[Any, Any] = {}

    @property
    def arrays(self) -> FFArrays:
        """Reshape, transpose, broadcast, take and concatenate on this field's values (both
        parts of an ``FF`` at once), with the field's array module."""
        return FFArrays(self.xp)

    # --- elementary -----------------------------------------------------------------------
    def mod(self, x: Any, m: int) -> Any:
        """x mod m for float64 integers below 2**53. x / m may round across an integer when x is
        large, leaving the remainder off by one m: correct it."""
        if self.xp is np and np.ndim(x):
            return _mod_numpy(x, m)
        r = x - self.xp.floor(x / m) * m
        r = self.xp.where(r < 0, r + m, r)
        return self.xp.where(r >= m, r - m, r)

    def table(self, name: str, domain: str = "p") -> Any:
        """The random function ``name`` over Z_p or Z_q (fixed by the field's key and the name)."""
        key = table_key(name, domain)
        if key not in self._tables:
            table = random_table(self._key, key, self.p if domain == "p" else self.q)
            self._tables[key] = self.xp.asarray(table)
        return self._tables[key]

    def lift(self, p_part: Any, q_part: Any | None, why: str = "") -> FF:
        return FF(p_part, q_part, why)

    def constant(self, c: float | Fraction, like: FF) -> FF:
        """A rational constant (a float is taken exactly) as an element of Z_p and Z_q."""
        fr = Fraction(c)
        vp = fr.numerator % self.p * pow(fr.denominator % self.p, -1, self.p) % self.p
        vq = fr.numerator % self.q * pow(fr.denominator % self.q, -1, self.q) % self.q
        return FF(self.xp.asarray(float(vp)), self.xp.asarray(float(vq)))

    def later(self, compute: Callable[[], Any], shape: tuple[int, ...] | None = None) -> Any:
        """``compute()`` now (JAX) or as a ``Lazy`` part, computed when read (numpy)."""
        return Lazy(compute, shape) if self.xp is np else compute()

    # --- arithmetic -----------------------------------------------------------------------
    def add(self, a: FF, b: FF) -> FF:
        q = (self.later(lambda: self.mod(a.q + b.q, self.q)) if a.has_q and b.has_q
             else None)
        return FF(self.mod(a.p + b.p, self.p), q, a.why or b.why)

    def mul(self, a: FF, b: FF) -> FF:
        q = (self.later(lambda: self.mod(a.q * b.q, self.q)) if a.has_q and b.has_q
             else None)
        return FF(self.mod(a.p * b.p, self.p), q, a.why or b.why)

    def inverse(self, x: Any, m: int) -> Any:
        """x ** (m - 2) mod m (Fermat), elementwise; 0 maps to 0. With numpy, a lookup in the
        table of every residue's inverse (``inverse_table``), the same numbers: square and
        multiply takes some 40 array operations, most of a small-shape check's time."""
        if self.xp is np:
            return self._lookup(inverse_table(m), x)
        result = self.xp.ones_like(x)
        base, e = x, m - 2
        while e:
            if e & 1:
                result = self.mod(result * base, m)
            base = self.mod(base * base, m)
            e >>= 1
        return result

    def div(self, a: FF, b: FF) -> FF:
        self.zero_division = self.zero_division | self.xp.any(b.p == 0)
        q = None
        if a.has_q and b.has_q:
            bq = b.q
            self.zero_division = self.zero_division | self.xp.any(bq == 0)
            q = self.later(lambda: self.mod(a.q * self.inverse(bq, self.q), self.q))
        return FF(self.mod(a.p * self.inverse(b.p, self.p), self.p), q, a.why or b.why)

    def exp(self, a: FF) -> FF:
        if not a.has_q:
            where = f"already went through {a.why}" if a.why else "has no exponent-domain value"
            raise VerifyError(f"exp of a value that {where}: more than one exp on a path is "
                              "outside the finite-field fragment")
        return FF(self._lookup(self.exp_table, a.q), None, "exp")

    def apply_table(self, name: str, a: FF) -> FF:
        """A random function, drawn independently over Z_p and over Z_q."""
        table_q = self.table(name, "q")
        q = self.later(lambda: self._lookup(table_q, a.q)) if a.has_q else None
        return FF(self._lookup(self.table(name, "p"), a.p), q, a.why)

    def _lookup(self, table: Any, x: Any) -> Any:
        """``table[x]`` as float64 (``x`` holds residues below the table's size). In numpy,
        ``take`` is faster than indexing (6 against 11 ms for 1 M values of the 2 MB exp table)
        and raises on an index out of range; a large ``x`` is looked up in memory order, a
        slice at a time (``slices.py``)."""
        if self.xp is np and x.size > slices.LOOKUP_FROM:
            return slices.lookup(table, x)
        idx = x.astype(self.xp.int32)
        got = np.take(table, idx) if self.xp is np else table[idx]
        return got.astype(self.xp.float64)

    def sum(self, a: FF, axis: int | Sequence[int], keepdims: bool = True) -> FF:
        # a sum of n residues stays below n * p < 2**53 for any realistic n
        q = (self.later(lambda: self.mod(self.xp.sum(a.q, axis=axis, keepdims=keepdims),
                                         self.q)) if a.has_q else None)
        return FF(self.mod(self.xp.sum(a.p, axis=axis, keepdims=keepdims), self.p), q, a.why)

    def cumsum(self, a: FF, axis: int) -> FF:
        """Running sums along ``axis`` (a running sum of n residues stays below n * p)."""
        q = (self.later(lambda: self.mod(self.xp.cumsum(a.q, axis=axis), self.q)) if a.has_q
             else None)
        return FF(self.mod(self.xp.cumsum(a.p, axis=axis), self.p), q, a.why)

    def matmul(self, a: FF, b: FF) -> FF:
        return self._product(a, b, None)

    def matmul_sum(self, a: FF, b: FF, axis: int) -> FF | None:
        """``matmul(a, b)`` summed over batch axis ``axis`` (kept with size 1) as one product:
        the plain accumulator of a matmul over the for-loop, without storing the products of
        the iterations. None when an operand does not vary along ``axis``."""
        if not (a.shape[axis] == b.shape[axis] > 1) or len(a.shape) != len(b.shape):
            return None
        return self._product(a, b, axis)

    def _product(self, a: FF, b: FF, summed: int | None) -> FF:
        shape = product_shape(a.shape, b.shape, summed)
        p = self.later(lambda: self._matmul(a.p, b.p, self.p, summed), shape)
        q = (self.later(lambda: self._matmul(a.q, b.q, self.q, summed)) if a.has_q and b.has_q
             else None)
        return FF(p, q, a.why or b.why)

    def _matmul(self, x: Any, y: Any, m: int, summed: int | None = None) -> Any:
        """The product mod ``m``, in parts whose contraction (over the tile's k and, with
        ``summed``, that axis too) is short enough for exact float64 sums."""
        k, iters = x.shape[-1], 1 if summed is None else x.shape[summed]
        chunk = max(1, int(EXACT // ((m - 1) ** 2)) - 1)
        if k * iters <= chunk:
            return self.mod(folded_matmul(self.xp, x, y, summed), m)
        if summed is not None and not is_jax(self.xp):  # numpy: join the axis, cut the whole
            x, y = join_loop(self.xp, x, y, summed)
            k, iters, summed = x.shape[-1], 1, None
        group = max(1, chunk // k)  # iterations of ``summed`` per part
        acc = None
        for i in range(0, iters, group):
            xs, ys = (x, y) if summed is None else (_cut(x, summed, i, group),
                                                    _cut(y, summed, i, group))
            for s in range(0, k, chunk):
                xk, yk = xs[..., s:s + chunk], ys[..., s:s + chunk, :]
                if summed is not None and xk.shape[summed] == 1:
                    part = folded_matmul(self.xp, xk, yk)  # a last group of one iteration
                else:
                    part = folded_matmul(self.xp, xk, yk, summed)
                part = self.mod(part, m)
                acc = part if acc is None else self.mod(acc + part, m)
        return acc


def _mod_numpy(x: np.ndarray, m: int) -> np.ndarray:
    """``Field.mod`` in numpy: one new array, updated in place. Reductions are a large share
    of a numpy evaluation, and each step of the formula in an array of its own costs a fresh
    buffer (page faults on every run at the paper's shapes); in place they take half the time.
    A large array is reduced in memory order, a cache-sized slice at a time (``slices.py``)."""
    if x.size > slices.MOD_FROM:
        return slices.mod(x, m)
    r = np.divide(x, m)
    np.floor(r, out=r)
    np.multiply(r, m, out=r)
    np.subtract(x, r, out=r)
    np.add(r, m, out=r, where=r < 0)
    np.subtract(r, m, out=r, where=r >= m)
    return r


def _cut(x: Any, axis: int, start: int, size: int) -> Any:
    """Entries ``start .. start + size`` of ``axis``."""
    return x[(slice(None),) * axis + (slice(start, start + size),)]


def numpy_input(rng: np.random.Generator, shape: tuple[int, ...], p: int = P, q: int = Q) -> FF:
    """A uniformly random tensor over Z_p x Z_q (numpy arrays). Drawn as int32 (p and q are
    below 2**31): uniform as int64 draws are, and 5x faster (a 4096 x 4096 weight's residues
    in 0.1 s instead of 0.5 s)."""
    return FF(rng.integers(0, p, shape, dtype=np.int32).astype(np.float64),
              rng.integers(0, q, shape, dtype=np.int32).astype(np.float64))


def numpy_table(rng: np.random.Generator, size: int) -> np.ndarray:
    """A random function on 0..size-1 with values in the same range (float32, exact)."""
    return rng.integers(0, size, size, dtype=np.int32).astype(np.float32)


def table_key(name: str, domain: str) -> str:
    return f"{name}/{domain}"


def random_table(key: Any, name: str, p: int = P) -> Any:
    """The values of random function ``name`` on 0..p-1, derived from ``key`` and the name."""
    import jax

    jnp = _jnp()
    sub = jax.random.fold_in(key, zlib.crc32(name.encode()))
    return jax.random.randint(sub, (p,), 0, p, dtype=jnp.int32).astype(jnp.float32)


@cache
def exp_table(p: int = P, q: int = Q, omega: int = OMEGA) -> Any:
    """``omega ** k mod p`` for k in [0, q), as a float32 numpy array (residues below 2**24 are
    exact in float32, and the table is half the size). Built once per process (0.25 s) and
    read-only: every ``Verifier`` shares it."""
    if pow(omega, q, p) != 1 or (p - 1) % q:
        raise VerifyError(f"omega={omega} has no order q={q} modulo p={p}")
    k = np.arange(q, dtype=np.int64)
    pw = np.ones(q, dtype=np.int64)
    base = omega % p
    while k.any():
        pw = np.where(k & 1, pw * base % p, pw)
        base = base * base % p
        k >>= 1
    table = pw.astype(np.float32)  # residues < 2**20: exact in float32
    table.flags.writeable = False
    return table


@cache
def inverse_table(m: int) -> np.ndarray:
    """``x ** (m - 2) mod m`` for every residue x of the prime ``m`` (the inverse; 0 maps to 0),
    by the same square and multiply as ``Field.inverse``, on all residues at once: a float32
    numpy array, read-only, built once per process and modulus (0.2 s for p)."""
    x = np.arange(m, dtype=np.int64)
    result = np.ones(m, dtype=np.int64)
    e = m - 2
    while e:
        if e & 1:
            result = result * x % m
        x = x * x % m
        e >>= 1
    table = result.astype(np.float32)  # residues < 2**20: exact in float32
    table.flags.writeable = False
    return table


class FFArrays:
    """The array functions the partition layout needs, applied to both parts of an ``FF``."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def reshape(self, x: FF, shape: Sequence[int]) -> FF:
        return self._map(x, lambda a: self.xp.reshape(a, shape))

    def transpose(self, x: FF, perm: Sequence[int]) -> FF:
        return self._map(x, lambda a: self.xp.transpose(a, perm))

    def broadcast_to(self, x: FF, shape: Sequence[int]) -> FF:
        return self._map(x, lambda a: self.xp.broadcast_to(a, shape))

    def take(self, x: FF, index: int, axis: int) -> FF:
        """The slice at ``index`` of ``axis``, kept with size 1."""
        i = index % x.shape[axis]
        where = (slice(None),) * axis + (slice(i, i + 1),)
        return self._map(x, lambda a: a[where])

    def concatenate(self, xs: Sequence[FF], axis: int) -> FF:
        q = (self._later(lambda: self.xp.concatenate([x.q for x in xs], axis))
             if all(x.has_q for x in xs) else None)
        return FF(self.xp.concatenate([x.p for x in xs], axis), q, xs[0].why or xs[1].why)

    def _map(self, x: FF, f: Any) -> FF:
        return FF(f(x.p), self._later(lambda: f(x.q)) if x.has_q else None, x.why)

    def _later(self, compute: Callable[[], Any]) -> Any:
        return Lazy(compute) if self.xp is np else compute()


def per_test_bound(degree: int, exps: int, p: int = P, q: int = Q) -> float:
    """Probability that one random test fails to tell two unequal programs apart."""
    if exps == 0:
        return min(1.0, degree / p)
    return min(1.0, 8 * degree * exps**4 / q + q ** (-1.0 / exps**2))


def combined_bound(per_test: float, tests: int) -> float:
    return per_test**tests if per_test < 1 else 1.0

