"""Every equivalence rule in ``rules/*.egg`` is sound, checked on random values modulo a prime.

The rules are read from the files, so a line added to a rule file is checked automatically. The
model is *index-free*: every Expr denotes a vector of ``L`` values in Z_p, indexed by the one
dimension a ``Sum`` or ``Concat`` runs over.

* Pattern variables of sort Expr are random *constant* vectors (a variable of a rule does not
  depend on the summed index); i64 variables are random sizes in 1..12; String variables are
  random names. ``Var``/``Const`` of a name is a random constant per name; ``Num n`` is n.
* ``Add``/``Mul``/``Div`` are pointwise mod p (``Div`` by a 0 rejects the instance). ``Square x`` is
  x*x. ``Sum n x`` is the constant x[0] + ... + x[n-1] (positions past ``L`` repeat the last one).
  ``Rms n x`` is Sqrt(Sum(n, x*x) / n). ``Concat k1 k2 a b`` holds a[0..k1-1] then b[0..].
  ``Exp``, ``Sqrt``, ``Silu``, ``Gelu``, ``Relu`` (and any constructor not named here) are fixed
  random tables applied pointwise: the same function on both sides, so only identities that hold
  for *every* function pass.
* ``(rewrite L R)``, ``(birewrite L R)`` mean L = R. ``(rule facts actions)`` means e = R for each
  action ``(union e R)``, with e bound by a fact ``(= e L)``. Facts ``(= v (op ...))`` with an i64
  primitive op compute v; comparisons and ``(SplitBy n d)`` (1 < d < n, d | n) are guards;
  ``(Size n)``, ``(Written e)``, ``(Reach e)`` only restrict where a rule fires. Instances that
  fail a guard are resampled. Rules whose actions only assert relations are reachability rules.
"""

from __future__ import annotations

import operator as op_
import random
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from egraph_mirage.oracle.prelude import PRELUDE_PATH, prelude_text
from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR, split_forms

P = 2**31 - 1  # a Mersenne prime
L = 64  # vector length
SIZES = range(1, 13)  # i64 variables are sampled from here
WANT, MIN_ACCEPTED, MAX_TRIES = 30, 20, 4000


class Str(str):
    """A string literal (a bare ``str`` in an s-expression is a symbol)."""


Sexp = list | int | str
Vec = tuple[int, ...]


TOKEN = re.compile(r';[^\n]*|"(?:\\.|[^"\\])*"|[()]|[^\s()";]+')


def read_sexp(text: str) -> Sexp:
    """Parse one s-expression: lists, integers, ``"strings"`` (as Str) and symbols (as str)."""
    stack: list[list] = [[]]
    for tok in TOKEN.findall(text):
        if tok == "(":
            stack.append([])
        elif tok == ")":
            stack[-2].append(stack.pop())
        elif tok.startswith('"'):
            stack[-1].append(Str(re.sub(r"\\(.)", r"\1", tok[1:-1])))
        elif not tok.startswith(";"):
            stack[-1].append(int(tok) if re.fullmatch(r"-?\d+", tok) else tok)
    assert len(stack) == 1 and len(stack[0]) == 1, f"not one form: {text!r}"
    return stack[0][0]


class Reject(Exception):
    """The sampled instance is outside the rule's domain (a guard failed, a division by 0)."""


INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": op_.add, "-": op_.sub, "*": op_.mul, "min": min, "max": max,
    "/": lambda a, b: _trunc_div(a, b), "%": lambda a, b: a - b * _trunc_div(a, b)}
COMPARE: dict[str, Callable[[int, int], bool]] = {
    "<": op_.lt, ">": op_.gt, "<=": op_.le, ">=": op_.ge, "!=": op_.ne, "=": op_.eq}
#: Relations: a guard on their (i64) arguments, or None when they impose no constraint.
RELATIONS: dict[str, Callable[..., bool] | None] = {
    "SplitBy": lambda n, d: 1 < d < n and n % d == 0, "Size": None, "Written": None, "Reach": None,
}
DECLARATIONS = {"datatype", "relation", "sort", "function", "constructor", "ruleset"}


def _trunc_div(a: int, b: int) -> int:
    """i64 division as egglog (Rust) does it: rounding toward zero; a 0 divisor rejects."""
    if b == 0:
        raise Reject
    return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)


@dataclass(frozen=True)
class Signature:
    """Argument sorts (i64, String, Expr) of each constructor and relation, from declarations."""

    constructors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    relations: dict[str, tuple[str, ...]] = field(default_factory=dict)


def read_signature(texts: list[tuple[str, str]]) -> Signature:
    """Collect ``(datatype Expr (Op sort ...) ...)`` and ``(relation R (sort ...))``
    declarations from ``(name, text)`` pairs."""
    sig = Signature()
    for name, text in texts:
        for s in (read_sexp(f.text) for f in split_forms(text, name)):
            if s[0] == "datatype":
                sig.constructors.update({c[0]: tuple(c[1:]) for c in s[2:]})
            elif s[0] == "relation":
                sig.relations[s[1]] = tuple(s[2])
    return sig


@dataclass
class Equivalence:
    """One claimed identity ``lhs = rhs`` under ``facts``, with where it came from."""

    where: str  # "file:line"
    text: str
    lhs: Sexp
    rhs: Sexp
    facts: list[Sexp] = field(default_factory=list)


def classify(path: Path, text: str | None = None
             ) -> tuple[list[Equivalence], list[str], list[str]]:
    """Split a rule file (or ``text`` under that name) into (equivalences, reachability rules,
    unrecognised forms) by file:line."""
    eqs: list[Equivalence] = []
    reach: list[str] = []
    unknown: list[str] = []
    text = path.read_text() if text is None else text
    for form in split_forms(text, str(path)):
        s, where = read_sexp(form.text), f"{path.name}:{form.line}"
        if (head := s[0]) in ("rewrite", "birewrite"):
            opts = dict(zip(s[3::2], s[4::2]))
            eqs.append(Equivalence(where, form.text, s[1], s[2], list(opts.get(":when", []))))
        elif head == "rule":
            unions = [a for a in s[2] if isinstance(a, list) and a[0] == "union"]
            eqs += [Equivalence(where, form.text, u[1], u[2], list(s[1])) for u in unions]
            if not unions:
                reach.append(where)
        elif head not in DECLARATIONS:
            unknown.append(where)
    return eqs, reach, unknown


class Model:
    """One random instance of a rule: variable values, i64 definitions and function tables."""

    def __init__(self, sig: Signature, rng: random.Random) -> None:
        self.sig, self.rng = sig, rng
        self.tables: dict[tuple, int] = {}  # (function, *args) -> value
        self.sorts: dict[str, str] = {}  # symbol -> sort
        self.expr_defs: dict[str, Sexp] = {}  # e -> pattern, from (= e L)
        self.int_defs: dict[str, Sexp] = {}  # v -> primitive expression, from (= v (op ...))
        self.guards: list[Sexp] = []
        self.env: dict[str, object] = {}
        self.instance = 0

    def note(self, s: Sexp, sort: str) -> None:
        """Record the sort of every symbol in ``s`` (which has sort ``sort``)."""
        if isinstance(s, list):
            sorts = self.sig.constructors.get(s[0]) or ("i64",) * (len(s) - 1)
            assert len(sorts) == len(s) - 1, f"arity of {s[0]} in {s}"
            for a, srt in zip(s[1:], sorts):
                self.note(a, srt)
        elif isinstance(s, str) and not isinstance(s, Str):
            self.sorts.setdefault(s, sort)

    def sort_of(self, s: Sexp) -> str:
        if isinstance(s, list):
            return "Expr" if s[0] in self.sig.constructors else "i64"
        return self.sorts.get(s, "i64") if isinstance(s, str) else "i64"

    def read_fact(self, f: Sexp) -> None:
        """Sort the symbols of one fact, and file it as a definition or a guard."""
        head, args = f[0], f[1:]
        if head == "=":
            a, b = args[::-1] if isinstance(args[1], str) else args  # the symbol first
            if isinstance(a, str) and a not in self.expr_defs and a not in self.int_defs:
                (self.expr_defs if self.sort_of(b) == "Expr" else self.int_defs)[a] = b
            else:
                self.guards.append(f)
            srt = "Expr" if "Expr" in (self.sort_of(a), self.sort_of(b)) else "i64"
            self.note(a, srt), self.note(b, srt)
        elif head in COMPARE:
            self.guards.append(f)
            self.note(f, "i64")
        elif head in self.sig.relations:
            assert head in RELATIONS, f"no model for relation {head}: add it to RELATIONS"
            for a, srt in zip(args, self.sig.relations[head]):
                self.note(a, srt)
            if RELATIONS[head] is not None:
                self.guards.append(f)
        else:
            raise AssertionError(f"cannot model fact {f}")

    def sample(self) -> None:
        """Fresh values for the free variables (defined ones are computed on demand)."""
        self.env, self.instance = {}, self.instance + 1  # Var/Const are fresh per instance
        for v, srt in sorted(self.sorts.items()):
            if v not in self.expr_defs and v not in self.int_defs:
                self.env[v] = (self.rng.choice(SIZES) if srt == "i64" else
                               Str(f"s{self.rng.randrange(3)}") if srt == "String" else
                               (self.rng.randrange(P),) * L)

    def fn(self, name: str, *args: object) -> int:
        """A fixed random function: the same key always gives the same value."""
        return self.tables.setdefault((name, *args), self.rng.randrange(P))

    def guard_holds(self, g: Sexp) -> bool:
        head, args = g[0], g[1:]
        if head == "=" and "Expr" in (self.sort_of(args[0]), self.sort_of(args[1])):
            return self.vec(args[0]) == self.vec(args[1])
        test = COMPARE.get(head) or RELATIONS[head]
        return bool(test(*(self.int(a) for a in args)))

    def int(self, s: Sexp) -> int:
        """The value of an i64 term (a defined variable is computed on first use)."""
        if isinstance(s, int):
            return s
        if isinstance(s, list):
            return INT_OPS[s[0]](*(self.int(a) for a in s[1:]))
        if s not in self.env:
            self.env[s] = self.int(self.int_defs[s])
        return self.env[s]

    def vec(self, s: Sexp) -> Vec:
        """The value of an Expr term: a vector of L residues mod P."""
        if isinstance(s, str):
            if s not in self.env:
                self.env[s] = self.vec(self.expr_defs[s])
            return self.env[s]
        op, sorts = s[0], self.sig.constructors[s[0]]
        a = [self.int(x) if t == "i64" else self.vec(x) if t == "Expr" else
             (x if isinstance(x, Str) else self.env[x]) for x, t in zip(s[1:], sorts)]
        if op in ("Var", "Const"):
            return (self.fn(op, a[0], self.instance),) * L
        if op == "Num":
            return (a[0] % P,) * L
        if op == "Div" and 0 in a[1]:
            raise Reject
        if op in ("Add", "Mul", "Div", "Square"):
            f = {"Add": op_.add, "Mul": op_.mul, "Div": lambda x, y: x * pow(y, -1, P),
                 "Square": lambda x: x * x}[op]
            return tuple(f(*xs) % P for xs in zip(*a))
        if op == "Sum":
            return (self.sum(a[0], a[1]),) * L
        if op == "Rms":  # sizes are < P, so n has an inverse
            mean = self.sum(a[0], tuple(x * x % P for x in a[1])) * pow(a[0], -1, P) % P
            return (self.fn("Sqrt", mean),) * L
        if op == "Concat":
            k1, k2, x, y = a
            if min(k1, k2) < 1:
                raise Reject
            return tuple(x[i] if i < k1 else y[min(i - k1, L - 1)] for i in range(L))
        # Exp, Sqrt, Silu, Gelu, Relu and any other constructor: an uninterpreted pointwise table
        cols = [x if isinstance(x, tuple) else (x,) * L for x in a]
        return tuple(self.fn(op, *row) for row in zip(*cols))

    def sum(self, n: int, x: Vec) -> int:
        """x[0] + ... + x[n-1]; a size below 1 is outside the model."""
        if n < 1:
            raise Reject
        return sum(x[min(k, L - 1)] for k in range(n)) % P


@dataclass
class Verdict:
    """The result of checking one equivalence: how many instances, and a counterexample if any."""

    rule: Equivalence
    accepted: int
    counterexample: str | None = None

    @property
    def sound(self) -> bool:
        return self.counterexample is None and self.accepted >= MIN_ACCEPTED

    def message(self) -> str:
        return f"{self.rule.where}: {self.rule.text}\n  " + (
            f"UNSOUND: {self.counterexample}" if self.counterexample else
            f"only {self.accepted} of {MAX_TRIES} random instances pass the guards")


def show(env: dict[str, object]) -> str:
    """Variable values of an instance; a constant vector is shown as its one value."""
    return ", ".join(f"{k}={v[0] if isinstance(v, tuple) and len(set(v)) == 1 else v}"
                     for k, v in sorted(env.items())) or "no variables"


def check(rule: Equivalence, sig: Signature) -> Verdict:
    """Evaluate both sides on random instances (seeded by the rule text) and compare them."""
    m = Model(sig, random.Random(zlib.crc32(f"{rule.text} {rule.lhs}".encode())))
    try:
        for f in rule.facts:
            m.read_fact(f)
        m.note(rule.lhs, "Expr"), m.note(rule.rhs, "Expr")
    except AssertionError as exc:
        raise AssertionError(f"{rule.where}: {rule.text}\n  cannot model: {exc}") from None
    accepted = 0
    for _ in range(MAX_TRIES):
        m.sample()
        try:
            if not all(m.guard_holds(g) for g in m.guards):
                continue
            lhs, rhs = m.vec(rule.lhs), m.vec(rule.rhs)
        except Reject:
            continue
        if lhs != rhs:
            i = next(k for k in range(L) if lhs[k] != rhs[k])
            return Verdict(rule, accepted, f"with {show(m.env)}: at position {i} the left side "
                                           f"is {lhs[i]} and the right side {rhs[i]} (mod {P})")
        accepted += 1
        if accepted == WANT:
            break
    return Verdict(rule, accepted)


RULE_FILES = sorted(DEFAULT_RULES_DIR.glob("*.egg"))
#: the oracle runs the generated prelude (datatype, relations, reachability) before the files
PRELUDE = prelude_text()
SIG = read_signature([(PRELUDE_PATH, PRELUDE), *((str(f), f.read_text()) for f in RULE_FILES)])
RULES = [r for f in RULE_FILES for r in classify(f)[0]]


@pytest.mark.parametrize("rule", RULES, ids=[r.where for r in RULES])
def test_rule_is_sound(rule: Equivalence) -> None:
    verdict = check(rule, SIG)
    assert verdict.sound, verdict.message()


def test_rules_are_discovered() -> None:
    """The reader finds the rules: enough of them, in every file, and no form it cannot class."""
    assert {"Sum", "Concat", "Var"} <= SIG.constructors.keys() and "SplitBy" in SIG.relations
    assert len(RULES) >= 15, [r.where for r in RULES]
    for f in RULE_FILES:
        eqs, _, unknown = classify(f)
        assert not unknown, f"forms that are neither declarations nor rules: {unknown}"
        assert eqs, f"{f.name} contributed no equivalence rule"
    eqs, reach, unknown = classify(Path(PRELUDE_PATH), PRELUDE)
    assert reach and not eqs and not unknown, "the prelude holds declarations and reachability"


def test_checker_catches_unsound_rules(tmp_path: Path) -> None:
    """The checker is not vacuous: wrong identities fail, a true one and a guarded one pass."""
    bad = tmp_path / "50_bad.egg"
    bad.write_text("; deliberately unsound lines\n"
                   "(birewrite (Add a b) (Mul a b))\n"
                   "(birewrite (Sum i (Mul a b)) (Mul (Sum i a) (Sum i b)))\n"
                   "(birewrite (Mul a b) (Mul b a))\n"
                   "(rule ((= e (Sum n a)) (< n 0)) ((union e a)))  ; never fires\n"
                   "(rule ((= e (Sum n (Sum j a))) (= n (+ j j))) ((union e (Sum j (Sum n a)))))\n")
    verdicts = {r.where: check(r, SIG) for r in classify(bad)[0]}
    assert sorted(verdicts) == [f"50_bad.egg:{k}" for k in (2, 3, 4, 5, 6)]
    for line in (2, 3):
        v = verdicts[f"50_bad.egg:{line}"]
        assert not v.sound and v.counterexample, v.message()
        assert v.message().startswith(f"50_bad.egg:{line}: (birewrite") and "UNSOUND" in v.message()
    assert verdicts["50_bad.egg:4"].sound, verdicts["50_bad.egg:4"].message()
    never = verdicts["50_bad.egg:5"]
    assert not never.sound and never.accepted == 0 and "only 0 of" in never.message()
    assert verdicts["50_bad.egg:6"].sound, verdicts["50_bad.egg:6"].message()
