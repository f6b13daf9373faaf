"""Deciding whether a candidate program equals its target: finite-field tests and a float check.

``Verifier(target)`` draws ``tests`` random input sets over Z_p x Z_q (``field.py``), evaluates the
target once per test, and compares every candidate against those outputs. Equal programs always
agree; unequal ones agree on one test with probability at most the per-test bound (``bound``),
on all tests with at most its ``tests``-th power. A test in which the target divides by zero is
redrawn when the verifier is built; a test in which a candidate divides by zero is skipped for
that candidate, and its bound counts only the tests that ran.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dtypes import DType, float16
from ..errors import GraphError
from ..expr import Term
from ..graph import KernelGraph, abstract_term
from ..ops import OPS, term_constructors
from ..ops.field_ops import random_tables
from ..ops.terms import opaque
from . import field as ff
from .blas import one_blas_thread
from .kernels import field_op


@dataclass(frozen=True)
class VerifyResult:
    equivalent: bool
    tests: int
    #: probability that one random test lets an unequal program through
    per_test_bound: float
    #: probability that all tests let an unequal program through (the stated error bound)
    bound: float
    #: index of the first output that differed, for a rejection
    differing_output: int | None = None
    reason: str = ""
    redrawn: int = 0
    seconds: float = 0.0

    def __bool__(self) -> bool:
        return self.equivalent


def evaluate_ff(graph: KernelGraph, f: ff.Field, inputs: Sequence[ff.FF]) -> list[ff.FF]:
    """Run ``graph`` over the field ``f`` (each op's ``ff`` semantics)."""
    vals: dict[int, ff.FF] = {t.index: x for t, x in zip(graph.inputs, inputs)}
    for t in graph.operators:
        vals[t.index] = field_op(f, t.op, [vals[o.index] for o in t.operands], t.params)
    return [vals[t.index] for t in graph.outputs]


def degree(term: Term) -> tuple[int, int]:
    """(degree, exps on a path) of a term: a rational function's degree bound (numerator plus
    denominator), and the largest number of exps nested on a path, by each constructor's degree
    rule (``ops.terms``). Constructors the tables do not know (from user rule files) are
    functions without an algebraic model: fresh variables (degree 1)."""
    rules = {c.name: c.degree for c in term_constructors(OPS).values()}
    memo: dict[Term, tuple[int, int]] = {}

    def go(t: Term) -> tuple[int, int]:
        if t not in memo:
            memo[t] = rules.get(t.op, opaque)([go(c) for c in t.children])
        return memo[t]

    return go(term)


def _check_interfaces(a: KernelGraph, b: KernelGraph) -> str:
    if [t.dims for t in a.inputs] != [t.dims for t in b.inputs]:
        raise GraphError(f"verify: the programs' inputs differ: {[t.dims for t in a.inputs]} vs "
                         f"{[t.dims for t in b.inputs]}")
    if len(a.outputs) != len(b.outputs):
        return f"{len(a.outputs)} outputs vs {len(b.outputs)}"
    for i, (x, y) in enumerate(zip(a.outputs, b.outputs)):
        if x.dims != y.dims:
            return f"output {i} has dims {x.dims} vs {y.dims}"
    return ""


#: how candidates are evaluated: "jit" compiles each program with JAX (slow first call, fast
#: after: for repeated checks of one program), "numpy" runs the same code eagerly in numpy (no
#: compile step: for many distinct candidates; OpenBLAS on one thread, ``blas.py``; parts of
#: values computed only when read, ``field.FF``). The arithmetic, and so the verdict, is the same.
BACKENDS = ("jit", "numpy")


class Verifier:
    """Random finite-field tests of candidates against one target program.

    Each program is evaluated by one function (inputs, field key -> output values mod p,
    division-by-zero flag); with the "jit" backend its first call compiles it.
    """

    def __init__(self, target: KernelGraph, tests: int = 2, seed: int = 0,
                 max_redraws: int = 8, backend: str = "jit") -> None:
        import jax

        if not target.outputs:
            raise GraphError("verify: the target has no outputs")
        if tests < 1:
            raise GraphError(f"verify: tests must be >= 1, got {tests}")
        if backend not in BACKENDS:
            raise GraphError(f"verify: backend must be one of {BACKENDS}, got {backend!r}")
        self.target, self.tests, self.backend = target, tests, backend
        self._jax = jax
        self._xp = np if backend == "numpy" else ff._jnp()
        self._exp_table = self._xp.asarray(ff.exp_table())
        self._compiled: weakref.WeakKeyDictionary[KernelGraph, Any] = weakref.WeakKeyDictionary()
        base = jax.random.PRNGKey(seed)
        run = self._compile(target)
        #: per test: (inputs mod p, inputs mod q, field key, function tables), target outputs
        self._cases: list[tuple[tuple[Any, ...], list[Any]]] = []
        self.redrawn = 0
        draw = 0
        while len(self._cases) < tests:
            if draw >= tests + max_redraws:
                raise GraphError("verify: the target divides by zero on every random input")
            rng = np.random.default_rng([seed, draw])  # numpy: far faster than JAX's on a CPU
            field_key = jax.random.fold_in(base, draw)
            draw += 1
            xp = self._xp
            tables = {ff.table_key(name, dom):
                      xp.asarray(ff.numpy_table(rng, ff.P if dom == "p" else ff.Q))
                      for name in random_tables(OPS) for dom in ("p", "q")}
            xs = [ff.numpy_input(rng, t.dims) for t in target.inputs]
            ins = ([xp.asarray(x.p) for x in xs], [xp.asarray(x.q) for x in xs], field_key, tables)
            outs, zero = run(*ins, self._exp_table)
            if bool(zero):
                self.redrawn += 1
                continue
            self._cases.append((ins, list(outs)))
        self._target_degree = [degree(abstract_term(t)) for t in target.outputs]

    def _compile(self, graph: KernelGraph) -> Any:
        if graph in self._compiled:
            return self._compiled[graph]

        def run(in_p: list[Any], in_q: list[Any], key: Any, tables: dict[str, Any],
                exp_table: Any) -> Any:
            f = ff.Field(key, exp_table, tables, xp=self._xp)
            outs = evaluate_ff(graph, f, [ff.FF(p, q) for p, q in zip(in_p, in_q)])
            return [o.p for o in outs], f.zero_division

        def run_numpy(*args: Any) -> Any:
            with one_blas_thread():
                return run(*args)

        self._compiled[graph] = self._jax.jit(run) if self.backend == "jit" else run_numpy
        return self._compiled[graph]

    def bound_for(self, candidate: KernelGraph) -> float:
        d, k = 0, 0
        for ta, tb in zip(self._target_degree, (degree(abstract_term(t))
                                                 for t in candidate.outputs)):
            d, k = max(d, ta[0] + tb[0]), max(k, ta[1], tb[1])
        return ff.per_test_bound(max(d, 1), k)

    def check(self, candidate: KernelGraph) -> VerifyResult:
        t0 = time.perf_counter()
        per_test = self.bound_for(candidate)
        mismatch = _check_interfaces(self.target, candidate)
        if mismatch:
            return VerifyResult(False, 0, per_test, ff.combined_bound(per_test, self.tests), None,
                                mismatch, seconds=time.perf_counter() - t0)
        run = self._compile(candidate)
        redrawn, done = 0, 0
        for ins, expected in self._cases:
            got, zero = run(*ins, self._exp_table)
            if bool(zero):
                redrawn += 1  # the candidate divides by zero here; the other tests decide
                continue
            done += 1
            for i, (x, y) in enumerate(zip(got, expected)):
                if not bool(self._xp.array_equal(x, y)):
                    return VerifyResult(False, done, per_test, ff.combined_bound(per_test, done),
                                        i, f"output {i} differs", redrawn,
                                        time.perf_counter() - t0)
        if done == 0:
            return VerifyResult(False, 0, per_test, 1.0, None,
                                "the candidate divided by zero in every test", redrawn,
                                time.perf_counter() - t0)
        return VerifyResult(True, done, per_test, ff.combined_bound(per_test, done), None, "",
                            redrawn, time.perf_counter() - t0)


def _check_arguments(what: str, graphs: Sequence[tuple[str, Any]],
                     ints: Sequence[tuple[str, Any]]) -> None:
    """A ``GraphError`` naming the argument when a program is not a ``KernelGraph`` or a count
    or seed is not an int."""
    for name, g in graphs:
        if not isinstance(g, KernelGraph):
            raise GraphError(f"{what}: {name} must be a KernelGraph, got {type(g).__name__}")
    for name, v in ints:
        if not isinstance(v, int) or isinstance(v, bool):
            raise GraphError(f"{what}: {name} must be an int, got {type(v).__name__}")
        if name == "seed" and not 0 <= v < 2**63:
            raise GraphError(f"{what}: seed must be in [0, 2**63), got {v}")


def verify(a: KernelGraph, b: KernelGraph, tests: int = 2, seed: int = 0) -> VerifyResult:
    """Whether programs ``a`` and ``b`` (same inputs by position) compute the same outputs."""
    _check_arguments("verify", [("a", a), ("b", b)], [("tests", tests), ("seed", seed)])
    return Verifier(a, tests=tests, seed=seed).check(b)


def check_numerics(candidate: KernelGraph, reference: KernelGraph, dtype: DType = float16,
                   seed: int = 0) -> float:
    """Largest relative error of ``candidate`` against ``reference`` in float64, on random
    normal inputs rounded to ``dtype`` (relative to each output's largest magnitude).

    Both programs are evaluated in float64 by the reference semantics, casts passing their
    operand through (``KernelGraph.evaluate(exact=True)``): this checks that they compute the
    same function on realistic inputs; it does not model the rounding or overflow of
    intermediate values in ``dtype`` or at a program's casts (the GPU check of lowered kernels
    and the torch backend's check against eager do, within ``gpu.tune.TOLERANCE``). To check many
    candidates against one reference, ``NumericCheck`` evaluates the reference once."""
    _check_arguments("check_numerics", [("candidate", candidate), ("reference", reference)],
                     [("seed", seed)])
    return NumericCheck(reference, dtype, seed).error(candidate)


#: bytes a process checking candidates of a program holds per element of the program's tensors
#: (inputs and operators), and besides them: the finite-field tests' values of the program and
#: the float64 check's (measured peak: 13 bytes per element for mqa at b = 16), with margin
CHECK_BYTES_PER_ELEMENT = 24
CHECK_BASE_BYTES = 1 << 30
#: the share of the machine's available memory that processes checking candidates may take
#: together (the search's workers, ``rank.size_variants``' checking workers)
CHECK_MEMORY_SHARE = 0.6


def checks_that_fit(program: KernelGraph, share: float = CHECK_MEMORY_SHARE) -> int | None:
    """How many processes checking candidates of ``program`` fit side by side in ``share`` of
    the memory available now (at least 1; a program at its real sizes takes gigabytes per
    process); None where the available memory is unknown."""
    import math

    available = _available_memory()
    if available is None:
        return None
    elements = sum(math.prod(t.dims) for t in [*program.inputs, *program.operators])
    per_process = CHECK_BASE_BYTES + CHECK_BYTES_PER_ELEMENT * elements
    return max(1, int(share * available // per_process))


def _available_memory() -> int | None:
    """Bytes of memory available for new processes (Linux's ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class NumericCheck:
    """``check_numerics`` against one ``reference``: its inputs and float64 outputs are
    computed once (on the first check), and each ``error(candidate)`` evaluates the candidate
    only. At a program's real sizes the reference's evaluation is a third of a check."""

    def __init__(self, reference: KernelGraph, dtype: DType = float16, seed: int = 0) -> None:
        _check_arguments("NumericCheck", [("reference", reference)], [("seed", seed)])
        if not isinstance(dtype, DType):
            raise GraphError(f"check_numerics: dtype must be an em dtype (em.float16, "
                             f"em.bfloat16, em.float32), got {type(dtype).__name__} {dtype!r}")
        self.reference, self.dtype, self.seed = reference, dtype, seed
        self._inputs: list[np.ndarray] | None = None
        self._want: list[np.ndarray] = []

    def error(self, candidate: KernelGraph) -> float:
        """Largest relative error of ``candidate``'s outputs (``check_numerics``)."""
        if not isinstance(candidate, KernelGraph):
            raise GraphError(f"check_numerics: candidate must be a KernelGraph, got "
                             f"{type(candidate).__name__}")
        problem = _check_interfaces(self.reference, candidate)
        if problem:
            raise GraphError(f"check_numerics: {problem}")
        inputs = self._reference_inputs()
        worst = 0.0
        for x, y in zip(candidate.evaluate(inputs, exact=True), self._want):
            scale = max(float(np.max(np.abs(y))), 1e-30)
            worst = max(worst, float(np.max(np.abs(x - y))) / scale)
        return worst

    def _reference_inputs(self) -> list[np.ndarray]:
        import ml_dtypes  # installed with JAX; no torch needed here

        if self._inputs is None:
            rng = np.random.default_rng(self.seed)
            # rounded through float32 first, as torch's float64 -> float16 / bfloat16 casts do
            ndtype = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
                      "float32": np.float32}
            inputs = []
            for t in self.reference.inputs:
                x = rng.standard_normal(t.dims).astype(np.float32)
                inputs.append(x.astype(ndtype[self.dtype.value]).astype(np.float64))
            self._want = list(self.reference.evaluate(inputs, exact=True))
            self._inputs = inputs
        return self._inputs
