"""Every rule in ``rules/*.egg`` is sound, checked on random values by ``oracle.soundness``.

The rules are read from the files, so a line added to a rule file is checked automatically. The
model (``egraph_mirage/oracle/soundness.py``) is index-free: every term denotes a vector of
values (x mod P, x mod Q), element-wise constructors mean what their op-table entry's
finite-field semantics says, and functions without an algebraic model are random functions.
The same checker refuses unsound rule files users pass to the oracle
(``tests/test_rule_soundness_refused.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from egraph_mirage.oracle.prelude import PRELUDE_PATH, prelude_text
from egraph_mirage.oracle.rules import DEFAULT_RULES_DIR, split_forms
from egraph_mirage.oracle.soundness import Claim, Classified, check, classify, read_signature

RULE_FILES = sorted(DEFAULT_RULES_DIR.glob("*.egg"))
#: the oracle runs the generated prelude (datatype, relations, reachability) before the files
PRELUDE = prelude_text()
SIG = read_signature([(PRELUDE_PATH, PRELUDE), *((str(f), f.read_text()) for f in RULE_FILES)])


def classify_file(path: Path, text: str | None = None) -> Classified:
    return classify(split_forms(path.read_text() if text is None else text, str(path)), SIG)


RULES = [r for f in RULE_FILES for r in classify_file(f).claims]


@pytest.mark.parametrize("rule", RULES, ids=[r.where for r in RULES])
def test_rule_is_sound(rule: Claim) -> None:
    verdict = check(rule, SIG)
    assert verdict.sound, verdict.message()


def test_rules_are_discovered() -> None:
    """The reader finds the rules: enough of them, in every file, and no form it cannot class."""
    assert {"Sum", "Concat", "Var"} <= SIG.constructors.keys() and "SplitBy" in SIG.relations
    assert len(RULES) >= 15, [r.where for r in RULES]
    for f in RULE_FILES:
        found = classify_file(f)
        assert not found.unchecked, f"forms the checker cannot read: {found.unchecked}"
        assert found.claims, f"{f.name} contributed no equivalence rule"
    prelude = classify_file(Path(PRELUDE_PATH), PRELUDE)
    assert prelude.reachability and not prelude.claims and not prelude.unchecked, \
        "the prelude holds declarations and reachability"


def test_checker_catches_unsound_rules(tmp_path: Path) -> None:
    """The checker is not vacuous: wrong identities fail, a true one and a guarded one pass."""
    bad = tmp_path / "50_bad.egg"
    bad.write_text("; deliberately unsound lines\n"
                   "(birewrite (Add a b) (Mul a b))\n"
                   "(birewrite (Sum i (Mul a b)) (Mul (Sum i a) (Sum i b)))\n"
                   "(birewrite (Mul a b) (Mul b a))\n"
                   "(rule ((= e (Sum n a)) (< n 0)) ((union e a)))  ; never fires\n"
                   "(rule ((= e (Sum n (Sum j a))) (= n (+ j j))) ((union e (Sum j (Sum n a)))))\n"
                   "(rewrite (Exp a) a)\n"
                   "(birewrite (Exp (Add a b)) (Mul (Exp a) (Exp b)))\n")
    verdicts = {r.where: check(r, SIG) for r in classify_file(bad).claims}
    assert sorted(verdicts) == [f"50_bad.egg:{k}" for k in (2, 3, 4, 5, 6, 7, 8)]
    for line in (2, 3, 7):
        v = verdicts[f"50_bad.egg:{line}"]
        assert not v.sound and v.counterexample, v.message()
        assert v.message().startswith(f"50_bad.egg:{line}: (") and "unsound" in v.message()
    for line in (4, 6, 8):  # commutativity, the double sum and exp's homomorphism are true
        assert verdicts[f"50_bad.egg:{line}"].sound, verdicts[f"50_bad.egg:{line}"].message()
    never = verdicts["50_bad.egg:5"]
    assert not never.sound and never.accepted == 0 and "only 0 of" in never.message()
