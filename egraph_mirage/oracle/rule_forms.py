"""Reading rule files for the soundness check: s-expressions, declarations and claims.

``classify`` turns the forms of a rule file into ``Claim``s (what each rewrite or rule asserts:
``lhs = rhs``, or that a relation fact holds), reachability rules, and forms the soundness model
cannot check, with the reason (``oracle/soundness.py`` says what is accepted).
"""

from __future__ import annotations

import operator as op_
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .rules import Form, split_forms


class Str(str):
    """A string literal (a bare ``str`` in an s-expression is a symbol)."""


Sexp = list | int | str

TOKEN = re.compile(r';[^\n]*|"(?:\\.|[^"\\])*"|[()]|[^\s()";]+')


class Reject(Exception):
    """The sampled instance is outside the rule's domain (a condition failed, a division by 0)."""


class Unchecked(Exception):
    """The form is outside what the model can evaluate; the message says why."""


def read_sexp(text: str) -> Sexp:
    """Parse one s-expression: lists, integers, ``"strings"`` (as Str) and symbols (as str)."""
    stack: list[list] = [[]]
    for tok in TOKEN.findall(text):
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) < 2:
                raise Unchecked("unbalanced parentheses")
            stack[-2].append(stack.pop())
        elif tok.startswith('"'):
            stack[-1].append(Str(re.sub(r"\\(.)", r"\1", tok[1:-1])))
        elif not tok.startswith(";"):
            stack[-1].append(int(tok) if re.fullmatch(r"-?\d+", tok) else tok)
    if len(stack) != 1 or len(stack[0]) != 1:
        raise Unchecked(f"not one form: {text!r}")
    return stack[0][0]


def write_sexp(s: Sexp) -> str:
    if isinstance(s, list):
        return "(" + " ".join(map(write_sexp, s)) + ")"
    return '"' + s.replace('"', '\\"') + '"' if isinstance(s, Str) else str(s)


def normalized(text: str) -> str:
    """A form's text without comments, with single spaces: equal rules compare equal."""
    return " ".join(t for t in TOKEN.findall(text) if not t.startswith(";"))


def is_symbol(s: Sexp) -> bool:
    return isinstance(s, str) and not isinstance(s, Str)


def _trunc_div(a: int, b: int) -> int:
    """i64 division as egglog (Rust) does it: rounding toward zero; a 0 divisor rejects."""
    if b == 0:
        raise Reject
    return abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)


INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": op_.add, "-": op_.sub, "*": op_.mul, "min": min, "max": max,
    "/": _trunc_div, "%": lambda a, b: a - b * _trunc_div(a, b)}
COMPARE: dict[str, Callable[[int, int], bool]] = {
    "<": op_.lt, ">": op_.gt, "<=": op_.le, ">=": op_.ge, "!=": op_.ne, "=": op_.eq}
#: relations the oracle fills in (``oracle/prelude.py``): a condition on their i64 arguments, or
#: None when they only restrict where a rule fires
RELATION_MODELS: dict[str, Callable[..., bool] | None] = {
    "SplitBy": lambda n, d: 1 < d < n and n % d == 0, "Size": None, "Written": None, "Reach": None,
}
DECLARATIONS = frozenset({"datatype", "relation", "sort", "function", "constructor", "ruleset"})


@dataclass
class Signature:
    """Sorts, constructors (argument sorts, result sort) and relations (argument sorts), from
    the declarations of the prelude and the rule files."""

    sorts: set[str] = field(default_factory=set)
    constructors: dict[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    relations: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def declare(self, s: Sexp) -> None:
        """Record one declaration form (others are ignored)."""
        if not isinstance(s, list) or len(s) < 2 or not is_symbol(s[1]):
            return
        if s[0] == "datatype":
            self.sorts.add(s[1])
            for c in s[2:]:
                if isinstance(c, list) and c and is_symbol(c[0]):
                    self.constructors[c[0]] = (tuple(map(str, c[1:])), s[1])
        elif s[0] == "constructor" and len(s) >= 4 and isinstance(s[2], list):
            self.constructors[s[1]] = (tuple(map(str, s[2])), str(s[3]))
        elif s[0] == "relation" and len(s) >= 3 and isinstance(s[2], list):
            self.relations[s[1]] = tuple(map(str, s[2]))
        elif s[0] == "sort" and len(s) == 2:
            self.sorts.add(s[1])


def read_signature(texts: Iterable[tuple[str, str]]) -> Signature:
    """The declarations of ``(name, text)`` pairs."""
    sig = Signature()
    for name, text in texts:
        for form in split_forms(text, name):
            try:
                sig.declare(read_sexp(form.text))
            except Unchecked:
                continue
    return sig


@dataclass
class Claim:
    """What one rule asserts: ``lhs = rhs`` under ``facts``, or, with ``rhs`` None, that the
    relation fact ``lhs`` holds (an action such as ``(SplitBy n d)``)."""

    path: str
    line: int
    text: str
    lhs: Sexp
    rhs: Sexp | None
    facts: list[Sexp] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{Path(self.path).name}:{self.line}"

    def describe(self) -> str:
        if self.rhs is None:
            return write_sexp(self.lhs)
        return f"{write_sexp(self.lhs)} = {write_sexp(self.rhs)}"


@dataclass
class Classified:
    """The forms of rule files, sorted: claims to check, reachability rules (their actions only
    pass ``Reach`` down), and forms the model cannot check with the reason."""

    claims: list[Claim] = field(default_factory=list)
    reachability: list[str] = field(default_factory=list)
    unchecked: list[tuple[Form, str]] = field(default_factory=list)


def _options(items: Sequence[Sexp]) -> dict[str, Sexp]:
    """``:key value`` options of a rewrite; a key followed by another key is a flag."""
    out: dict[str, Sexp] = {}
    i = 0
    while i < len(items):
        key = items[i]
        value = items[i + 1] if i + 1 < len(items) else None
        if isinstance(value, str) and value.startswith(":"):
            value = None
        out[str(key)] = value if value is not None else True
        i += 1 if value is None else 2
    return out


def _subterms(s: Sexp, defs: Mapping[str, Sexp], out: set, seen: tuple[str, ...] = ()) -> Any:
    """``s`` as a hashable tree with defined symbols expanded; every subtree is added to out."""
    if is_symbol(s) and s in defs and s not in seen:
        return _subterms(defs[s], defs, out, (*seen, s))
    if isinstance(s, list):
        tree = (s[0], *(_subterms(a, defs, out, seen) for a in s[1:]))
    else:
        tree = s
    out.add(tree)
    return tree


def _reach_ok(term: Sexp, facts: list[Sexp]) -> bool:
    """Whether ``term`` is part of a term a ``(Reach t)`` fact matches."""
    defs: dict[str, Sexp] = {}
    for f in facts:
        if isinstance(f, list) and len(f) == 3 and f[0] == "=":
            for a, b in ((f[1], f[2]), (f[2], f[1])):
                if is_symbol(a) and isinstance(b, list):
                    defs.setdefault(a, b)
    reachable: set = set()
    for f in facts:
        if isinstance(f, list) and len(f) == 2 and f[0] == "Reach":
            _subterms(f[1], defs, reachable)
    return _subterms(term, defs, set()) in reachable


def _substitute(s: Sexp, names: Mapping[str, Sexp]) -> Sexp:
    if isinstance(s, list):
        return [_substitute(a, names) for a in s]
    return names[s] if is_symbol(s) and s in names else s


def classify(forms: Iterable[Form], sig: Signature) -> Classified:
    """Sort rule-file forms into claims, reachability rules and forms the model cannot check."""
    out = Classified()
    for form in forms:
        try:
            claims, reach_only = _claims_of(form, read_sexp(form.text), sig)
        except Unchecked as exc:
            out.unchecked.append((form, str(exc)))
            continue
        out.claims += claims
        if reach_only:
            out.reachability.append(f"{Path(form.path).name}:{form.line}")
    return out


def _claims_of(form: Form, s: Sexp, sig: Signature) -> tuple[list[Claim], bool]:
    """The claims of one form, and whether it is a rule whose actions only assert relations."""
    if not isinstance(s, list) or not s:
        raise Unchecked("not a form")
    head = s[0]
    if head in DECLARATIONS:
        return [], False
    if head in ("rewrite", "birewrite"):
        if len(s) < 3:
            raise Unchecked(f"({head} ...) needs two sides")
        when = _options(s[3:]).get(":when", [])
        if not isinstance(when, list):
            raise Unchecked(":when takes a list of facts")
        return [Claim(form.path, form.line, form.text, s[1], s[2], list(when))], False
    if head != "rule":
        raise Unchecked(f"a top-level ({head} ...) is neither a declaration nor a rule; rule "
                        "files hold declarations and rules (rewrite, birewrite, rule) only")
    if len(s) < 3 or not isinstance(s[1], list) or not isinstance(s[2], list):
        raise Unchecked("(rule (facts ...) (actions ...)) needs two lists")
    facts, claims, lets = list(s[1]), [], {}
    relations_only = True
    for action in s[2]:
        a = _substitute(action, lets)
        if not isinstance(a, list) or not a:
            raise Unchecked(f"the action {write_sexp(a)} is not a command")
        what = a[0]
        if what == "union" and len(a) == 3:
            claims.append(Claim(form.path, form.line, form.text, a[1], a[2], facts))
            relations_only = False
        elif what == "let" and len(a) == 3 and is_symbol(a[1]):
            lets[a[1]] = a[2]
        elif what == "Reach" and len(a) == 2:
            if not _reach_ok(a[1], facts):
                raise Unchecked(f"the action {write_sexp(a)} asserts reachability of a term that "
                                "is not part of a term its facts match as reachable")
        elif what in sig.relations and RELATION_MODELS.get(what) is not None:
            claims.append(Claim(form.path, form.line, form.text, a, None, facts))
        elif what in sig.relations:
            pass  # Size, Written and declared relations only restrict where rules fire
        elif what in sig.constructors:
            relations_only = False  # inserting a term changes no equality
        else:
            raise Unchecked(f"the action ({what} ...) has no model")
    return claims, relations_only and not claims
