"""The reachability oracle on every benchmark (small shapes): positives, negatives, the
incremental form, tensors of other graphs, and budgets."""

from __future__ import annotations

import math
import random
import warnings

import pytest

import egraph_mirage as em
from egraph_mirage import Reachability, Term, benchmarks, parse
from egraph_mirage.bench.oracle_bench import random_terms
from egraph_mirage.graph import abstract_term
from egraph_mirage.oracle import Budget

NAMES = benchmarks.names()
R, U, UNKNOWN = Reachability.REACHABLE, Reachability.UNREACHABLE, Reachability.UNKNOWN


@pytest.fixture(scope="module")
def oracles() -> dict[str, em.Oracle]:
    return {n: em.Oracle(benchmarks.get(n, small=True)) for n in NAMES}


# --- term surgery (independent of the package's own helpers) ------------------------------------

def _replace(t: Term, old: Term, new: Term) -> Term:
    if t == old:
        return new
    return Term(t.op, tuple(_replace(a, old, new) if isinstance(a, Term) else a for a in t.args))


def _swap(t: Term, a: str, b: str) -> Term:
    va, vb, tmp = Term("Var", (a,)), Term("Var", (b,)), Term("Var", ("\0",))
    return _replace(_replace(_replace(t, va, tmp), vb, va), tmp, vb)


def _subterms(o: em.Oracle) -> list[Term]:
    return [s for t in o.targets for s in t.walk()]


def _positives(o: em.Oracle) -> list[Term]:
    """Forms every rule set with these axioms must derive from the written target."""
    out = []
    for s in _subterms(o):
        if s.op == "Sum":
            n, body = s.args
            for m in range(2, n):
                if n % m == 0:
                    out.append(Term("Sum", (m, body)))  # a partial sum (split-K)
                    out.append(Term("Sum", (n // m, Term("Sum", (m, body)))))  # and its total
            if body.op == "Mul" and body.args[0].op == "Div":  # the division after the sum
                (a, b), c = body.args[0].args, body.args[1]
                out.append(Term("Div", (Term("Sum", (n, Term("Mul", (a, c)))), b)))
        if s.op in ("Add", "Mul"):
            out.append(Term(s.op, s.args[::-1]))
        if s.op == "Rms":
            n, x = s.args
            out.append(parse(f"(Sqrt (Div (Sum {n} (Mul {x} {x})) (Num {n})))"))
    return out


def _negatives(o: em.Oracle) -> dict[str, Term]:
    """Near misses of the target that no correct rule set derives."""
    t = o.targets[0]
    names = sorted({s.args[0] for s in t.walk() if s.op == "Var"})
    out = {"inputs swapped": _swap(t, names[0], names[-1])}
    sized = [s for s in t.walk() if s.op == "Sum"] or [s for s in t.walk() if s.op == "Rms"]
    s = sized[-1]
    out["wrong sum size"] = _replace(t, s, Term(s.op, (2 * s.args[0], *s.args[1:])))
    v0 = Term("Var", ("v0",))
    out["exp inserted"] = _replace(t, v0, Term("Exp", (v0,)))
    for s in t.walk():  # the first product of two different operands
        if s.op == "Mul" and s.args[0] != s.args[1]:
            b = s.args[1]
            out["wrong operand"] = _replace(t, s, Term("Mul", (b, b)))
            for p in t.walk():
                if p.op == "Sum" and p.args[1] == s:
                    out["wrong operand, alone"] = Term("Sum", (p.args[0], Term("Mul", (b, b))))
            break
    return out


# --- saturation and the program itself ---------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_complete_and_program_reachable(oracles: dict[str, em.Oracle], name: str) -> None:
    o = oracles[name]
    assert o.complete and o.stats.complete
    s = o.stats
    assert s.enodes == o.snapshot.num_enodes > 0 and s.eclasses == o.snapshot.num_eclasses > 0
    assert 0 < s.reachable_classes <= s.eclasses and s.iterations >= 1 and s.seconds > 0
    for t in o.target.tensors:
        assert o.is_subexpr(t), f"{name}: t{t.index} ({t.op}) not reachable"
        assert o.answer(t) is R
        assert o.is_subexpr(em.abstract_expr(t)) and o.is_subexpr(em.abstract_term(t))
    assert len(o.snapshot.roots) == len(o.target.outputs)
    assert all(r in o.snapshot.reachable for r in o.snapshot.roots)


@pytest.mark.parametrize("name", NAMES)
def test_generic_positives(oracles: dict[str, em.Oracle], name: str) -> None:
    o = oracles[name]
    pos = _positives(o)
    assert pos
    missing = [str(t) for t in pos if o.answer(t) is not R]
    assert not missing, f"{name}: not derived: {missing[:3]}"


@pytest.mark.parametrize("name", NAMES)
def test_negatives(oracles: dict[str, em.Oracle], name: str) -> None:
    o = oracles[name]
    neg = _negatives(o)
    assert {"inputs swapped", "wrong sum size", "exp inserted", "wrong operand"} <= set(neg)
    for what, t in neg.items():
        assert t != o.targets[0]
        assert o.answer(t) is U, f"{name}: {what} {t} answered {o.answer(t)}"
        assert not o.is_subexpr(t) and not o.is_subexpr(str(t))


POSITIVE = {
    "rmsnorm_linear": [
        '(Div (Sum 64 (Mul (Var "v0") (Var "v1"))) (Rms 64 (Var "v0")))',  # division after matmul
        '(Sum 16 (Mul (Var "v0") (Var "v1")))',  # a partial sum
        '(Sqrt (Div (Sum 4 (Sum 16 (Mul (Var "v0") (Var "v0")))) (Num 64)))',  # split rms
    ],
    "gqa": [
        '(Sum 64 (Exp (Sum 16 (Mul (Var "v0") (Var "v1")))))',  # the softmax denominator
        '(Sum 16 (Mul (Exp (Sum 16 (Mul (Var "v0") (Var "v1")))) (Var "v2")))',  # split-KV part
        ('(Div (Sum 64 (Mul (Exp (Sum 16 (Mul (Var "v0") (Var "v1")))) (Var "v2")))'
         ' (Sum 64 (Exp (Sum 16 (Mul (Var "v0") (Var "v1"))))))'),  # normalise after P@V
    ],
    "lora": [  # X (1, 64), W (64, 64), A (64, 16), B (16, 64): [X, XA] @ [W; B]
        '(Concat 64 16 (Var "v0") (Sum 64 (Mul (Var "v0") (Var "v2"))))',
        '(Concat 64 16 (Var "v1") (Var "v3"))',
        ('(Sum 80 (Mul (Concat 64 16 (Var "v0") (Sum 64 (Mul (Var "v0") (Var "v2"))))'
         ' (Concat 64 16 (Var "v1") (Var "v3"))))'),
    ],
    "gated_mlp": ['(Sum 32 (Mul (Var "v0") (Var "v2")))',
                  '(Silu (Sum 2 (Sum 32 (Mul (Var "v0") (Var "v1")))))'],
    "ntrans": ['(Sqrt (Div (Sum 64 (Mul (Var "v0") (Var "v0"))) (Num 64)))'],
}
#: hand-picked misses; note the axioms over-approximate (sum(i, a*b) = sum(i, a)*b), so in LoRA
#: (Sum 64 (Mul v0 v3)) *is* derived, and in rmsnorm_linear every partial sum of v0*v0 is
NEGATIVE = {
    "rmsnorm_linear": ['(Sum 64 (Mul (Var "v1") (Var "v1")))', '(Exp (Var "v0"))',
                       '(Div (Sum 64 (Mul (Var "v0") (Var "v1"))) (Rms 64 (Var "v1")))',
                       '(Rms 64 (Var "v1"))'],
    "gqa": ['(Sum 16 (Mul (Var "v0") (Var "v0")))', '(Exp (Sum 16 (Mul (Var "v0") (Var "v2"))))',
            '(Sum 64 (Exp (Sum 64 (Mul (Var "v0") (Var "v1")))))', '(Exp (Var "v2"))'],
    "lora": ['(Concat 16 64 (Var "v1") (Var "v3"))', '(Concat 64 16 (Var "v1") (Var "v2"))',
             '(Sum 64 (Mul (Var "v0") (Var "v0")))', '(Sum 16 (Mul (Var "v2") (Var "v2")))'],
}


def test_small_shapes_as_documented() -> None:
    dims = {n: [t.dims for t in benchmarks.get(n, small=True).inputs] for n in NAMES}
    assert dims["rmsnorm_linear"] == [(2, 64), (64, 96)]
    assert dims["gqa"] == [(2, 16, 16), (2, 16, 64), (2, 64, 16)]
    assert dims["lora"] == [(1, 64), (64, 64), (64, 16), (16, 64)]


@pytest.mark.parametrize("name", sorted(POSITIVE))
def test_specific_forms(oracles: dict[str, em.Oracle], name: str) -> None:
    o = oracles[name]
    for text in POSITIVE[name]:
        assert o.answer(text) is R, text
    for text in NEGATIVE.get(name, []):
        assert o.answer(text) is U, text


# --- the incremental form ----------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_lookup_agrees_with_class_of(oracles: dict[str, em.Oracle], name: str) -> None:
    o = oracles[name]
    for t in _subterms(o):
        kids = [o.class_of(a) if isinstance(a, Term) else a for a in t.args]
        c = o.lookup(t.op, kids)
        assert c is not None and c == o.class_of(t)
        assert o.lookup(t.op, tuple(kids)) == c
    v0 = o.class_of(parse('(Var "v0")'))
    assert o.lookup("Exp", [v0]) is None and o.class_of(parse('(Exp (Var "v0"))')) is None
    assert o.lookup("Var", ["nosuch"]) is None and o.lookup("NoSuchOp", [v0]) is None
    assert not o.is_reachable_class(None)


# --- tensors of other graphs, and bad questions ------------------------------------------------

def test_tensor_of_second_graph(oracles: dict[str, em.Oracle]) -> None:
    o = oracles["rmsnorm_linear"]
    g = em.new_kernel_graph()
    x, w = g.new_input((2, 64)), g.new_input((64, 96))
    n = g.rms_norm(x, (64,))
    assert o.is_subexpr(n) and o.is_subexpr(g.matmul(n, w)) and o.is_subexpr(g.matmul(x, w))
    assert o.answer(g.exp(x)) is U and o.answer(g.matmul(g.exp(x), w)) is U
    h = em.new_kernel_graph()
    assert o.is_subexpr(h.rms_norm(h.new_input((2, 64)), 64))  # fewer inputs, same positions

    o = oracles["gqa"]
    g = em.new_kernel_graph()
    q, k, v = g.new_input((2, 16, 16)), g.new_input((2, 16, 64)), g.new_input((2, 64, 16))
    e = g.exp(g.matmul(q, k))
    assert o.is_subexpr(g.reduction(e, 2)) and o.is_subexpr(g.matmul(e, v))
    assert not o.is_subexpr(g.matmul(g.exp(g.matmul(q, k)), g.exp(v)))


def test_mismatched_inputs_rejected(oracles: dict[str, em.Oracle]) -> None:
    o = oracles["rmsnorm_linear"]
    g = em.new_kernel_graph()
    x = g.new_input((3, 64))
    with pytest.raises(em.OracleError, match=r"\(3, 64\)"):
        o.is_subexpr(g.rms_norm(x, (64,)))
    with pytest.raises(em.OracleError):
        o.answer(x)
    h = em.new_kernel_graph()
    a, _, c = h.new_input((2, 64)), h.new_input((64, 96)), h.new_input((2, 64))
    with pytest.raises(em.OracleError):
        o.class_of(h.add(a, c))


def test_bad_questions_and_targets(oracles: dict[str, em.Oracle]) -> None:
    o = oracles["gqa"]
    with pytest.raises(em.OracleError):
        o.is_subexpr(42)  # type: ignore[arg-type]
    with pytest.raises(em.ExprError):
        o.is_subexpr("(Sum 64")
    with pytest.raises(em.OracleError):
        em.Oracle("gqa")  # type: ignore[arg-type]
    g = em.new_kernel_graph()
    g.exp(g.new_input((2, 2)))
    with pytest.raises(em.OracleError, match="outputs"):
        em.Oracle(g)


# --- budgets -----------------------------------------------------------------------------------

def _tiny(name: str, **budget: float) -> em.Oracle:
    with pytest.warns(em.IncompleteSaturationWarning):
        return em.Oracle(benchmarks.get(name, small=True), budget=em.Budget(**budget))


def test_tiny_budget_is_unknown_not_no() -> None:
    o = _tiny("rmsnorm_linear", max_iterations=1)
    assert not o.complete and not o.stats.complete and o.iterations == 1
    late = '(Sqrt (Div (Sum 4 (Sum 16 (Mul (Var "v0") (Var "v0")))) (Num 64)))'
    assert o.answer(late) is UNKNOWN and not o.is_subexpr(late)
    assert o.answer('(Exp (Var "v1"))') is UNKNOWN  # never UNREACHABLE while incomplete
    assert o.answer(o.target.outputs[0]) is R


def test_other_budgets_and_silence() -> None:
    assert not _tiny("lora", max_enodes=50).complete
    assert not _tiny("qknorm", max_seconds=0.0).complete
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        o = em.Oracle(benchmarks.get("gqa", small=True), budget=em.Budget(max_iterations=1),
                      warn_incomplete=False)
    assert not o.complete


@pytest.mark.parametrize("name", NAMES)
def test_incomplete_never_says_more(oracles: dict[str, em.Oracle], name: str) -> None:
    full = oracles[name]
    part = _tiny(name, max_iterations=1)
    rng = random.Random(0)
    terms = [*_subterms(full), *_positives(full), *_negatives(full).values(),
             *random_terms(part, rng).values(), *random_terms(full, rng).values()]
    unknown = 0
    for t in terms:
        a = part.answer(t)
        assert a is not U, f"{name}: incomplete oracle answered UNREACHABLE for {t}"
        if a is R:
            assert full.answer(t) is R, f"{name}: {t} reachable only in the incomplete oracle"
        unknown += a is UNKNOWN and full.answer(t) is R
    assert unknown > 0, f"{name}: one iteration already derived everything tested"


def test_a_norm_of_a_projection_of_a_norm_saturates() -> None:
    """Qwen3's qk-norm: transformers' float32 RMSNorm, a per-head projection, then another
    RMSNorm of the result. The second norm squares a long product (the first norm's scale, its
    weight and the projection); were the square taken apart into a product of two copies, mul's
    associativity and commutativity would regroup the factors without end (310,666 e-nodes,
    incomplete). A square is one way in ``rules/`` (``a·a -> square(a)``): it saturates."""
    import torch

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = x.float()
        return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)

    def norm_projection_norm(x: torch.Tensor, w1: torch.Tensor, W: torch.Tensor,
                             w2: torch.Tensor) -> torch.Tensor:
        return rms(rms(x, w1) @ W, w2)

    g = em.from_torch(norm_projection_norm, torch.randn(1, 64).half(),
                      torch.randn(64).half(), torch.randn(2, 64, 16).half(),
                      torch.randn(16).half())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an incomplete saturation warns
        # bounded by e-nodes and iterations, not by seconds (the machine's speed)
        oracle = em.Oracle(g, budget=Budget(max_seconds=math.inf))
    assert oracle.complete and len(oracle.snapshot.nodes) < 30_000
    assert oracle.is_subexpr(abstract_term(g.outputs[0]))
