"""The generated head of every rule set: the ``Expr`` datatype, the oracle's fact relations and
the reachability rules, written from the op table's term constructors (``ops.terms``).

The rule files under ``rules/`` hold identities only; the oracle runs this text before them.
``egraph-mirage rules --prelude`` prints it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ops import OPS, OpSpec, term_constructors
from .rules import run_forms, split_forms

#: the facts the oracle asserts for each target (``oracle.target_facts``)
RELATIONS: tuple[tuple[str, str], ...] = (
    ("(relation SplitBy (i64 i64))",
     "facts from the oracle: a sum of n may be split into d partial sums"),
    ("(relation Size (i64))",
     "facts from the oracle: sums of two sum sizes written in the target"),
    ("(relation Written (Expr))", "facts from the oracle: the subterms of the target as written"),
    ("(relation Reach (Expr))", "the term is a subexpression of (a term equal to) a target"),
)

#: the name rule errors and drawings give the generated text
PRELUDE_PATH = "<generated prelude>"


def _commented(lines: list[tuple[str, str]], indent: str = "") -> list[str]:
    width = max(len(code) for code, _ in lines)
    return [f"{indent}{code.ljust(width)} ; {doc}" for code, doc in lines]


def prelude_text(ops: Mapping[str, OpSpec] = OPS) -> str:
    """The egglog text the oracle runs before the rule files, for the op table ``ops``."""
    ctors = list(term_constructors(ops).values())
    decls = _commented([(c.declaration, c.doc) for c in ctors], "  ")
    decls[-1] = decls[-1].replace(c_last := ctors[-1].declaration, c_last + ")", 1)
    reach = [(c.reach_rule, f"the arguments of {c.name}")
             for c in ctors if c.reach_rule is not None]
    return "\n".join([
        "; The term language of abstract expressions (docs/expressions.md), from the op table.",
        "(datatype Expr", *decls,
        *_commented(list(RELATIONS)),
        "; Reachability: (Reach t) holds when t is a subexpression of a term equal to a target.",
        "; The oracle asserts (Reach target) for every output; these rules pass it down.",
        *_commented(reach), ""])


def load_prelude(egraph: Any, text: str) -> None:
    """Run the generated text on ``egraph``; a failure (a constructor name egglog refuses) is a
    ``RuleError`` naming the line of the generated text."""
    run_forms(egraph, split_forms(text, PRELUDE_PATH))
