"""The random model the soundness check evaluates rules in (``oracle/soundness.py``).

Every term denotes a vector of ``L`` values, each a pair ``(x mod P, x mod Q)`` with
``P = 2Q + 1`` prime; element-wise constructors mean what their op-table entry's finite-field
semantics (``OpSpec.ff``) says, ``Sum``/``Rms``/``Concat``/``Max``/``SumShift`` are index-free,
and anything else is a random function. ``check`` evaluates both sides of a ``Claim`` on random
instances.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .. import expr as ex
from ..ops import OPS, OpSpec
from .rule_forms import (
    COMPARE,
    INT_OPS,
    RELATION_MODELS,
    Claim,
    Reject,
    Sexp,
    Signature,
    Str,
    Unchecked,
    is_symbol,
    write_sexp,
)

#: a safe prime P = 2Q + 1 below 2**31; OMEGA has order Q modulo P
P, Q, OMEGA = 2147483579, 1073741789, 4
L = 32  # vector length
SIZES = tuple(range(1, 13))  # i64 variables are sampled from here (and the rule's own integers)
WANT, MIN_ACCEPTED, MAX_TRIES = 30, 20, 4000

Pair = tuple[int, int | None]  # (x mod P, x mod Q); the latter None after an exp
Vec = tuple[Pair, ...]


class _Arithmetic:
    """The operations an op-table entry's ``ff`` calls (``ops/field_ops.py``) on one value, a
    pair ``(x mod P, x mod Q)``, so an element-wise constructor means what its entry says. As in
    the verifier, the exponent (mod Q) of an exp's result is unknown (None)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def add(self, a: Pair, b: Pair) -> Pair:
        return (a[0] + b[0]) % P, None if a[1] is None or b[1] is None else (a[1] + b[1]) % Q

    def mul(self, a: Pair, b: Pair) -> Pair:
        return a[0] * b[0] % P, None if a[1] is None or b[1] is None else a[1] * b[1] % Q

    def div(self, a: Pair, b: Pair) -> Pair:
        if b[0] == 0 or b[1] == 0:
            raise Reject
        q = None if a[1] is None or b[1] is None else a[1] * pow(b[1], -1, Q) % Q
        return a[0] * pow(b[0], -1, P) % P, q

    def exp(self, a: Pair) -> Pair:
        if a[1] is None:  # an exp of an exp: a random function, and any difference unproven
            self.model.nested_exp = True
            return self.model.fn("exp of an exp", a[0])[0], None
        return pow(OMEGA, a[1], P), None

    def apply_table(self, name: str, a: Pair) -> Pair:
        v = self.model.fn(name, *a)
        return v if a[1] is not None else (v[0], None)

    def constant(self, c: float | Fraction, like: Any = None) -> Pair:
        fr = Fraction(c)
        if fr.denominator % P == 0 or fr.denominator % Q == 0:
            raise Reject
        return (fr.numerator * pow(fr.denominator, -1, P) % P,
                fr.numerator * pow(fr.denominator, -1, Q) % Q)


def same(u: Vec, v: Vec) -> bool:
    """Equal values: the residues mod P agree, and those mod Q where both are known."""
    return all(a[0] == b[0] and (a[1] is None or b[1] is None or a[1] == b[1])
               for a, b in zip(u, v))


Semantics = dict[str, Callable[[Any, Sequence[Any], dict[str, Any]], Any]]


def op_semantics(ops: Mapping[str, OpSpec] = OPS) -> Semantics:
    """Constructor name -> the ``ff`` of the element-wise op-table entry whose expression is
    that constructor over its operands (``(Exp a)`` for exp); entries whose ``ff`` needs more
    than element-wise arithmetic are left out (their constructors are random functions)."""
    out: Semantics = {}
    probe = _Arithmetic(Model(Signature(), random.Random(0)))
    for spec in ops.values():
        lo, hi = spec.num_inputs
        if spec.params or lo != hi or not spec.terms:
            continue
        xs = [ex.var(f"x{i}") for i in range(lo)]
        try:  # any failure of a foreign entry only means: no model for its constructor
            term = spec.expr(xs, [(1,)] * lo, {})
            if not (isinstance(term, ex.Term) and term.args == tuple(xs)
                    and term.op in {c.name for c in spec.terms}):
                continue
            spec.ff(probe, [(2, 3)] * lo, {})
        except Exception:  # any failure of a foreign entry: no model for it
            continue
        out[term.op] = spec.ff
    return out


class Model:
    """One random instance of a claim: variable values, i64 definitions and function tables."""

    def __init__(self, sig: Signature, rng: random.Random, semantics: Semantics | None = None,
                 sizes: Sequence[int] = SIZES) -> None:
        self.sig, self.rng, self.sizes = sig, rng, tuple(sizes)
        self.semantics = semantics or {}
        self.arith = _Arithmetic(self)
        self.tables: dict[tuple, Pair] = {}  # (function, *args) -> value
        self.sorts: dict[str, str] = {}  # symbol -> sort
        self.expr_defs: dict[str, Sexp] = {}  # e -> pattern, from (= e L)
        self.int_defs: dict[str, Sexp] = {}  # v -> primitive expression, from (= v (op ...))
        self.guards: list[Sexp] = []
        self.env: dict[str, Any] = {}
        self.instance = 0
        #: set when this instance took an exp of an exp (outside the model's exp homomorphism)
        self.nested_exp = False

    def result_sort(self, s: Sexp) -> str:
        if isinstance(s, list):
            if s and s[0] in self.sig.constructors:
                return self.sig.constructors[s[0]][1]
            return "i64"
        if is_symbol(s):
            return self.sorts.get(s, "i64")
        return "String" if isinstance(s, Str) else "i64"

    def is_term(self, s: Sexp) -> bool:
        return self.result_sort(s) in self.sig.sorts

    def note(self, s: Sexp, sort: str) -> None:
        """Record the sort of every symbol in ``s`` (which has sort ``sort``)."""
        if isinstance(s, list):
            head = s[0] if s else None
            if head in self.sig.constructors:
                sorts = self.sig.constructors[head][0]
            elif head in self.sig.relations:
                sorts = self.sig.relations[head]
            elif head in INT_OPS or head in COMPARE:
                sorts = ("i64",) * (len(s) - 1)
            else:
                raise Unchecked(f"no model for ({head} ...)")
            if len(sorts) != len(s) - 1:
                raise Unchecked(f"{head} takes {len(sorts)} arguments: {write_sexp(s)}")
            for a, srt in zip(s[1:], sorts):
                self.note(a, srt)
        elif is_symbol(s):
            self.sorts.setdefault(s, sort)

    def read_fact(self, f: Sexp) -> None:
        """Sort the symbols of one fact, and file it as a definition or a condition."""
        if not isinstance(f, list) or not f:
            raise Unchecked(f"the fact {write_sexp(f)} is not a pattern")
        head, args = f[0], f[1:]
        if head == "=" and len(args) == 2:
            a, b = args[::-1] if is_symbol(args[1]) else args  # the symbol first
            if is_symbol(a) and a not in self.expr_defs and a not in self.int_defs:
                (self.expr_defs if self.is_term(b) else self.int_defs)[a] = b
            else:
                self.guards.append(f)
            srt = next((s for s in map(self.result_sort, (a, b)) if s in self.sig.sorts), "i64")
            self.note(a, srt), self.note(b, srt)
        elif head in COMPARE:
            self.guards.append(f)
            self.note(f, "i64")
        elif head in self.sig.relations:
            self.note(f, "i64")
            if RELATION_MODELS.get(head) is not None:
                self.guards.append(f)
        elif head in self.sig.constructors:
            self.note(f, self.sig.constructors[head][1])  # the term exists: no condition
        else:
            raise Unchecked(f"no model for the fact ({head} ...)")

    def sample(self) -> None:
        """Fresh values for the free variables (defined ones are computed on demand)."""
        self.env, self.instance = {}, self.instance + 1  # Var/Const are fresh per instance
        self.nested_exp = False
        for v, srt in sorted(self.sorts.items()):
            if v in self.expr_defs or v in self.int_defs:
                continue
            if srt == "i64":
                self.env[v] = self.rng.choice(self.sizes)
            elif srt == "String":
                self.env[v] = Str(f"s{self.rng.randrange(3)}")
            elif srt in self.sig.sorts:
                self.env[v] = ((self.rng.randrange(P), self.rng.randrange(Q)),) * L
            else:
                raise Unchecked(f"no model for values of sort {srt} (variable {v})")

    def fn(self, name: str, *args: object) -> Pair:
        """A fixed random function: the same key always gives the same value."""
        key = (name, *args)
        if key not in self.tables:
            self.tables[key] = (self.rng.randrange(P), self.rng.randrange(Q))
        return self.tables[key]

    def holds(self, g: Sexp) -> bool:
        """Whether the condition (or asserted relation) ``g`` holds on this instance."""
        head, args = g[0], g[1:]
        if head == "=" and any(self.is_term(a) for a in args):
            return same(self.vec(args[0]), self.vec(args[1]))
        test = COMPARE.get(head) or RELATION_MODELS.get(head)
        if test is None:
            raise Unchecked(f"no model for the condition ({head} ...)")
        return bool(test(*(self.int(a) for a in args)))

    def int(self, s: Sexp) -> int:
        """The value of an i64 term (a defined variable is computed on first use)."""
        if isinstance(s, int):
            return s
        if isinstance(s, list):
            if s[0] not in INT_OPS:
                raise Unchecked(f"no model for the i64 primitive {s[0]}")
            return INT_OPS[s[0]](*(self.int(a) for a in s[1:]))
        if s not in self.env:
            if s not in self.int_defs:
                raise Unchecked(f"{s} is not bound by the rule's pattern")
            self.env[s] = self.int(self.int_defs[s])
        return self.env[s]

    def vec(self, s: Sexp) -> Vec:
        """The value of a term: a vector of L pairs (x mod P, x mod Q)."""
        if is_symbol(s):
            if s not in self.env:
                if s not in self.expr_defs:
                    raise Unchecked(f"{s} is not bound by the rule's pattern")
                self.env[s] = self.vec(self.expr_defs[s])
            return self.env[s]
        if not isinstance(s, list) or not s or s[0] not in self.sig.constructors:
            raise Unchecked(f"no model for {write_sexp(s)}")
        op, sorts = s[0], self.sig.constructors[s[0]][0]
        a = [self.int(x) if t == "i64" else x if isinstance(x, Str) else
             self.env[x] if t == "String" else self.vec(x) for x, t in zip(s[1:], sorts)]
        if op in ("Var", "Const"):
            return (self.fn(op, a[0], self.instance),) * L
        if op == "Num":
            return ((a[0] % P, a[0] % Q),) * L
        if op == "Sum":
            return (self.sum(a[0], a[1]),) * L
        if op == "Rms":
            n = a[0]
            mean = self.arith.div(self.sum(n, tuple(self.arith.mul(x, x) for x in a[1])),
                                  (n % P, n % Q))
            return (self.arith.apply_table("sqrt", mean),) * L  # sqrt: the Sqrt entry's table
        if op == "Max":
            return (self.max(a[0], a[1]),) * L
        if op == "SumShift":  # sum over i < n of a[i] * exp(m[i] - max of m[0..n-1])
            n, x, m = a
            top = self.max(n, m)
            exp = self.semantics["Exp"]
            shifted = tuple(self.arith.mul(v, exp(self.arith, [self.arith.add(
                w, self.arith.mul(top, (P - 1, Q - 1)))], {})) for v, w in zip(x, m))
            return (self.sum(n, shifted),) * L
        if op == "Concat":
            k1, k2, x, y = a
            if min(k1, k2) < 1:
                raise Reject
            return tuple(x[i] if i < k1 else y[min(i - k1, L - 1)] for i in range(L))
        ff = self.semantics.get(op)
        cols = [x if isinstance(x, tuple) else (x,) * L for x in a]
        done: dict[tuple, Pair] = {}  # vectors are mostly constant: each distinct row once
        for row in zip(*cols):
            if row not in done:
                # Max and any constructor without an entry: a random function, pointwise
                done[row] = self.fn(op, *row) if ff is None else ff(self.arith, list(row), {})
        return tuple(done[row] for row in zip(*cols))

    def max(self, n: int, x: Vec) -> Pair:
        """The largest of x[0..n-1] (by the value mod P, its representative in 0..P-1; the
        pair as it is): a max of equal values is that value. A size below 1 is outside the
        model."""
        if n < 1:
            raise Reject
        return max(x[: min(n, L)], key=lambda v: v[0])

    def sum(self, n: int, x: Vec) -> Pair:
        """x[0] + ... + x[n-1]; a size below 1 is outside the model."""
        if n < 1:
            raise Reject
        head, rest = x[: min(n, L)], max(0, n - L)
        p = (sum(v[0] for v in head) + rest * x[-1][0]) % P
        if any(v[1] is None for v in head):
            return p, None
        return p, (sum(v[1] for v in head) + rest * x[-1][1]) % Q


@dataclass
class Verdict:
    """The result of checking one claim: how many instances, and a counterexample if any."""

    claim: Claim
    accepted: int
    counterexample: str | None = None
    #: why the claim could not be evaluated at all
    unchecked: str | None = None

    @property
    def sound(self) -> bool:
        return self.counterexample is None and self.unchecked is None and \
            self.accepted >= MIN_ACCEPTED

    def problem(self) -> str:
        """What is wrong, in one line (empty when sound)."""
        if self.counterexample:
            return f"unsound: {self.claim.describe()} fails {self.counterexample}"
        if self.unchecked:
            return f"cannot be checked for soundness: {self.unchecked}"
        if self.accepted < MIN_ACCEPTED:
            return (f"cannot be checked for soundness: its conditions held on only "
                    f"{self.accepted} of {MAX_TRIES} random instances")
        return ""

    def message(self) -> str:
        return f"{self.claim.where}: {self.claim.text}\n  " + (self.problem() or "sound")


def _show(v: Any) -> str:
    if isinstance(v, tuple) and v and isinstance(v[0], tuple):
        return str(v[0]) if len(set(v)) == 1 else "[" + ", ".join(map(str, v[:6])) + ", ...]"
    return repr(v) if isinstance(v, Str) else str(v)


def show(env: Mapping[str, Any]) -> str:
    """Variable values of an instance; a constant vector is shown as its one value."""
    return ", ".join(f"{k}={_show(v)}" for k, v in sorted(env.items())) or "no variables"


def _integers(s: Sexp) -> set[int]:
    if isinstance(s, list):
        return set().union(*map(_integers, s)) if s else set()
    return {s} if isinstance(s, int) and s > 0 else set()


def check(claim: Claim, sig: Signature, semantics: Semantics | None = None) -> Verdict:
    """Evaluate the claim on random instances (seeded by its text) and compare both sides."""
    sizes = sorted(set(SIZES) | _integers([claim.lhs, claim.rhs, claim.facts]))
    rng = random.Random(zlib.crc32(f"{claim.text} {claim.lhs}".encode()))
    m = Model(sig, rng, op_semantics() if semantics is None else semantics, sizes)
    accepted = 0
    try:
        for f in claim.facts:
            m.read_fact(f)
        if claim.rhs is None:
            m.note(claim.lhs, "i64")
        else:
            sort = next((s for s in map(m.result_sort, (claim.lhs, claim.rhs))
                         if s in sig.sorts), None)
            if sort is None:
                raise Unchecked(f"neither side of {claim.describe()} is a term")
            m.note(claim.lhs, sort), m.note(claim.rhs, sort)
        for _ in range(MAX_TRIES):
            m.sample()
            try:
                if not all(m.holds(g) for g in m.guards):
                    continue
                if claim.rhs is None:
                    if not m.holds(claim.lhs):
                        return Verdict(claim, accepted, f"with {show(m.env)}: it does not hold")
                else:
                    lhs, rhs = m.vec(claim.lhs), m.vec(claim.rhs)
                    if not same(lhs, rhs):
                        if m.nested_exp:
                            raise Unchecked("an exp of an exp is outside the model")
                        i = next(k for k in range(L) if not same(lhs[k:k + 1], rhs[k:k + 1]))
                        at = "" if len(set(lhs)) == len(set(rhs)) == 1 else f"at position {i} "
                        return Verdict(claim, accepted, f"with {show(m.env)}: {at}the left side "
                                       f"is {lhs[i]} and the right side {rhs[i]} (values as "
                                       f"(x mod {P}, x mod {Q}))")
            except Reject:
                continue
            accepted += 1
            if accepted == WANT:
                break
    except Unchecked as exc:
        return Verdict(claim, accepted, unchecked=str(exc))
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        return Verdict(claim, accepted, unchecked=f"{type(exc).__name__}: {exc}")
    return Verdict(claim, accepted)
