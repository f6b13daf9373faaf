"""Rule files users pass to the oracle are checked sound before use (``oracle/soundness.py``).

``Oracle(rules=, extra_rules=)``, which ``superoptimize(rules=, extra_rules=)`` and
``egraph-mirage optimize --rules/--extra-rules`` reach, evaluates both sides of every identity of
a user file on random values and refuses a line that fails with a ``RuleError`` naming the file,
the line and the counterexample; a form the model cannot evaluate is refused the same way. The
shipped rules are trusted (``tests/test_rules_sound.py`` checks them), and a user rule found
sound is not checked again in the same process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import egraph_mirage as em
from egraph_mirage import RuleError
from egraph_mirage.cli import main
from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig

EXP_IS_IDENTITY = "; a wrong identity\n(rewrite (Exp a) a)  ; exp of anything is itself\n"


@pytest.fixture(scope="module")
def softmax() -> em.KernelGraph:
    """exp(X) / sum(exp(X)): with exp(a) = a the rules would reach X / Sum(X)."""
    g = em.new_kernel_graph()
    X = g.new_input((4, 8))
    E = g.exp(X)
    g.mark_output(g.div(E, g.reduction(E, 1)))
    return g


def refused(target: em.KernelGraph, path: Path, line: int, **rules: object) -> RuleError:
    with pytest.raises(RuleError) as info:
        em.Oracle(target, **rules)  # type: ignore[arg-type]
    err = info.value
    assert (err.path, err.line) == (str(path), line), str(err)
    assert str(err).startswith(f"{path}:{line}: ") and "\n" not in str(err)
    return err


def test_an_unsound_extra_rule_is_refused_with_a_counterexample(softmax: em.KernelGraph,
                                                                tmp_path: Path) -> None:
    assert not em.Oracle(softmax).is_subexpr('(Div (Var "v0") (Sum 8 (Var "v0")))')
    bad = tmp_path / "50_exp.egg"
    bad.write_text(EXP_IS_IDENTITY)
    err = refused(softmax, bad, 2, extra_rules=[bad])
    assert "unsound" in err.detail and "(Exp a) = a" in err.detail
    assert "with a=(" in err.detail and "left side" in err.detail  # the counterexample


def test_a_sound_extra_rule_loads(softmax: em.KernelGraph, tmp_path: Path) -> None:
    """exp turns sums into products in the model too (exp(x) = OMEGA ** (x mod Q))."""
    good = tmp_path / "50_exp.egg"
    good.write_text("(birewrite (Exp (Add p q)) (Mul (Exp p) (Exp q)))  ; exp of a sum\n"
                    "(rule ((= e (Mul p (Div q p)))) ((union e q)))  ; p cancels\n")
    oracle = em.Oracle(softmax, extra_rules=[good])
    assert oracle.rules_checked == 2 and oracle.complete


def test_replaced_rules_are_checked_line_by_line(softmax: em.KernelGraph, tmp_path: Path) -> None:
    """``rules=`` a copy of the shipped folder plus one wrong line: the shipped lines are trusted
    (nothing to check), the new one is refused by file and line."""
    folder = tmp_path / "rules"
    shutil.copytree(DEFAULT_RULES_DIR, folder)
    assert em.Oracle(softmax, rules=[folder]).rules_checked == 0
    algebra = folder / "10_algebra.egg"
    lines = algebra.read_text().splitlines(keepends=True)
    lines.insert(3, "(birewrite (Add a a) (Mul a a))  ; wrong: a + a is 2a\n")
    algebra.write_text("".join(lines))
    err = refused(softmax, algebra, 4, rules=[folder])
    assert "(Add a a) = (Mul a a)" in err.detail


@pytest.mark.parametrize("text, reason", [
    ('(union (Var "v0") (Var "v1"))\n', "neither a declaration nor a rule"),
    ("(rule ((= e (Add a b))) ((Reach a)))\n", "reachability"),
    ("(rule ((= e (Sum n a))) ((SplitBy n 5)))\n", "unsound"),
    ("(rule ((= e (Sum n a)) (< n 0)) ((union e a)))  ; never fires\n", "conditions held"),
    ("(function Twice (Expr) Expr :merge new)\n(rewrite (Twice a) (Add a a))\n", "no model"),
])
def test_forms_that_cannot_be_shown_sound_are_refused(softmax: em.KernelGraph, tmp_path: Path,
                                                      text: str, reason: str) -> None:
    path = tmp_path / "50_user.egg"
    path.write_text("(rewrite (Mul (Num 1) a) a)  ; a valid line first\n" + text)
    err = refused(softmax, path, 2 if "function" not in text else 3, extra_rules=[path])
    assert reason in err.detail, err.detail


def test_declared_constructors_and_passing_reachability_are_accepted(
        softmax: em.KernelGraph, tmp_path: Path) -> None:
    path = tmp_path / "50_user.egg"
    path.write_text("(constructor Twice (Expr) Expr)  ; a new function symbol\n"
                    "(rule ((Reach (Twice a))) ((Reach a)))  ; its argument is reachable\n"
                    "(rule ((= e (Sum n a)) (SplitBy n d) (= m (/ n d))) ((SplitBy n m)))\n")
    assert em.Oracle(softmax, extra_rules=[path]).rules_checked == 3


def test_a_rule_found_sound_is_not_checked_again(softmax: em.KernelGraph, tmp_path: Path) -> None:
    path = tmp_path / "50_unit.egg"
    path.write_text("(rewrite (Add (Num 0) a) a)  ; zero is the unit of add, checked once\n")
    em.Oracle(softmax, extra_rules=[path])
    assert em.Oracle(softmax, extra_rules=[path]).rules_checked == 0


def test_the_search_and_the_command_line_refuse_it(softmax: em.KernelGraph, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "50_exp.egg"
    bad.write_text(EXP_IS_IDENTITY)
    with pytest.raises(RuleError, match=r"50_exp\.egg:2: unsound"):
        superoptimize(softmax, SearchConfig(max_results=1), workers=1, progress=False,
                      extra_rules=[bad])
    code = main(["optimize", "rmsnorm_linear", "--small", "--workers", "1", "--max-tasks", "1",
                 "--out", str(tmp_path / "out"), "--extra-rules", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {bad}:2: unsound"), err
    assert len(err.strip().splitlines()) == 1
