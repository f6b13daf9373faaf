"""Soundness of rule files: every identity is checked on random values before the oracle uses it.

A rule that is not an identity (``(rewrite (Exp a) a)``) would let the oracle call terms
"reachable" that are no part of the target, so the search would explore, and the verifier
reject, candidates the rules should have pruned. ``check_rule_forms`` (run by every ``Oracle``)
evaluates both sides of every identity on random instances and refuses a rule that fails with a
``RuleError`` naming its file, its line and the counterexample. ``rule_forms.py`` reads the forms
into claims, ``rule_model.py`` is the model below.

The model is *index-free*, as the rules are: every term denotes a vector of ``L`` values, indexed
by the one dimension a ``Sum`` or ``Concat`` runs over, and each value is a pair
``(x mod P, x mod Q)`` with ``P = 2Q + 1`` prime.

* Pattern variables of a term sort (``Expr``) are random *constant* vectors (a variable of a
  rule does not depend on the summed index); i64 variables are random sizes (1..12 and the
  integers written in the rule); String variables are random names. ``Var``/``Const`` of a name is
  a random constant per name; ``Num n`` is n.
* The constructors of the op table's element-wise operators mean what their finite-field
  semantics says (``OpSpec.ff``, the verifier's own): ``Add``, ``Mul``, ``Div`` (by zero: the
  instance is discarded) and ``Square`` are arithmetic, ``Exp x`` is ``OMEGA ** (x mod Q) mod P``
  (so exp turns sums into products; as in the verifier the exponent of an exp's result is
  unknown, and a rule told apart only through an exp of an exp cannot be checked), and
  ``Sqrt``, ``Silu``, ``Gelu``, ``Relu`` are random
  functions: the same on both sides, so only identities that hold for *every* function pass. A
  new entry gets its meaning from its ``ff`` with no edit here.
* ``Sum n x`` is the constant ``x[0] + ... + x[n-1]`` (positions past ``L`` repeat the last one),
  ``Rms n x`` is ``sqrt(Sum(n, x*x) / n)`` with the same random sqrt, ``Concat k1 k2 a b`` holds
  ``a[0..k1-1]`` then ``b[0..]``; ``Max n x`` is the largest of ``x[0..n-1]`` (by the value
  mod P: a max of equal values is that value), ``SumShift n a m`` is ``Sum`` of
  ``a[i] * Exp(m[i] - Max n m)``; constructors declared in rule files are random functions.
* ``(rewrite L R)`` and ``(birewrite L R)`` claim L = R; ``(rule facts actions)`` claims e = R for
  each action ``(union e R)``. Facts ``(= v (op ...))`` with an i64 primitive compute v;
  comparisons and ``(SplitBy n d)`` (1 < d < n, d | n) are conditions: instances that fail one
  are resampled, and a rule whose conditions hold too rarely cannot be checked. ``Size``,
  ``Written``, ``Reach`` and relations declared in rule files only restrict where a rule fires.
* An action ``(SplitBy n d)`` must hold on every instance; ``(Reach t)`` must name a part of a
  term the facts already match as reachable (reachability only passes down to arguments); a
  ``(let v t)`` names a term for later actions; a bare term is inserted (harmless).
* Declarations (``datatype``, ``constructor``, ``relation``, ``sort``, ``function``,
  ``ruleset``) pass; any other top-level command (``union``, ``set``, ``run``, ...) cannot be
  checked and is refused.

Cost: about 1-20 ms per rule. The shipped rule files are not re-checked when an oracle is built
(the test suite checks them with this module): a rule whose text, comments and spacing aside,
is one of the shipped rules is trusted, so a copy of the shipped folder costs nothing. Every
other rule is checked once per process: a rule found sound is remembered under a digest of its
text, the generated prelude and the declarations it is checked against, for the same op table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import RuleError
from ..ops import OPS, OpSpec
from .rule_forms import (
    Claim,
    Classified,
    Signature,
    Unchecked,
    classify,
    normalized,
    read_sexp,
    read_signature,
)
from .rule_model import Semantics, Verdict, check, op_semantics
from .rules import DEFAULT_RULES_DIR, Form, split_forms

__all__ = ["Claim", "Classified", "Signature", "Verdict", "check", "check_rule_forms", "classify",
           "op_semantics", "read_signature", "shipped_forms"]


def shipped_forms(folder: Path = DEFAULT_RULES_DIR) -> frozenset[str]:
    """The normalised text of every form of the shipped rule files (checked by the tests);
    read again only when a file of the folder changed."""
    files = sorted(folder.glob("*.egg"))
    stamp = []
    for f in files:
        try:
            st = f.stat()
        except OSError:
            continue
        stamp.append((str(f), st.st_mtime_ns, st.st_size))
    key = (str(folder), tuple(stamp))
    if _SHIPPED[0] != key:
        out: set[str] = set()
        for f in files:
            try:
                out.update(normalized(form.text) for form in split_forms(f.read_text(), str(f)))
            except (OSError, UnicodeDecodeError, RuleError):
                continue
        _SHIPPED[:] = [key, frozenset(out)]
    return _SHIPPED[1]


#: (folder and the files' modification stamps, their forms) of the last ``shipped_forms`` read
_SHIPPED: list[Any] = [None, frozenset()]


#: digest of (prelude, declarations, rule) -> the op table it was checked under, kept alive so
#: that a later op table of other entries is not mistaken for it
_FOUND_SOUND: dict[str, tuple[tuple[str, OpSpec], ...]] = {}
_MEMO_SIZE = 512


def check_rule_forms(forms: Sequence[Form], prelude: str,
                     ops: Mapping[str, OpSpec] = OPS) -> int:
    """Check every loaded rule form that is not a shipped rule; returns how many were checked.

    ``forms`` are the forms as loaded (``rules.load_rules``), ``prelude`` the generated text run
    before them. The first form that is unsound or cannot be checked is a ``RuleError`` naming
    its file, its line and the counterexample or the reason.
    """
    trusted = shipped_forms()
    todo = [f for f in forms if normalized(f.text) not in trusted]
    if not todo:
        return 0
    sig = read_signature([("<prelude>", prelude)])
    for f in forms:
        try:
            sig.declare(read_sexp(f.text))
        except Unchecked:
            continue
    declared = repr((sorted(sig.sorts), sorted(sig.constructors.items()),
                     sorted(sig.relations.items())))
    table = tuple(ops.items())
    semantics: Semantics | None = None
    checked = 0
    for form in todo:
        digest = hashlib.sha256("\0".join((prelude, declared, normalized(form.text)))
                                .encode()).hexdigest()
        seen = _FOUND_SOUND.get(digest)
        if seen is not None and len(seen) == len(table) and all(
                a[0] == b[0] and a[1] is b[1] for a, b in zip(seen, table)):
            continue
        found = classify([form], sig)
        for _, reason in found.unchecked:
            raise RuleError(form.path, form.line, f"cannot be checked for soundness: {reason}")
        if semantics is None:
            semantics = op_semantics(ops)
        for claim in found.claims:
            verdict = check(claim, sig, semantics)
            if not verdict.sound:
                raise RuleError(form.path, form.line, verdict.problem())
        checked += 1
        if len(_FOUND_SOUND) >= _MEMO_SIZE:
            _FOUND_SOUND.pop(next(iter(_FOUND_SOUND)))
        _FOUND_SOUND[digest] = table
    return checked
