"""Abstract expressions: the index-free terms that describe what a tensor computes.

A term is an operator name applied to arguments; an argument is another term, an integer
(a size, for ``Sum``/``Rms``/``Num``/``Concat``) or a string (an input's name for ``Var``, a scalar
for ``Const``). Terms print as s-expressions in exactly the syntax the rule files under ``rules/``
use, and parse back from it::

    (Sum 64 (Mul (Var "v0") (Var "v1")))

Terms are immutable and hashable; structurally equal terms compare equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Union

from .errors import ExprError

Arg = Union["Term", int, str]


class Term:
    """An immutable expression node ``(op arg ...)``."""

    __slots__ = ("_hash", "args", "op")

    def __init__(self, op: str, args: tuple[Arg, ...] = ()) -> None:
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "_hash", hash((op, self.args)))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Term is immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Term):
            return NotImplemented
        return self._hash == other._hash and self.op == other.op and self.args == other.args

    def __repr__(self) -> str:
        return f"Term({self.to_sexpr()})"

    def __str__(self) -> str:
        return self.to_sexpr()

    @property
    def children(self) -> tuple[Term, ...]:
        """The sub-terms among the arguments (integers and strings left out)."""
        return tuple(a for a in self.args if isinstance(a, Term))

    def to_sexpr(self) -> str:
        """The s-expression text of this term, as used in ``rules/*.egg``."""
        parts = [self.op]
        for a in self.args:
            if isinstance(a, Term):
                parts.append(a.to_sexpr())
            elif isinstance(a, str):
                parts.append('"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"')
            else:
                parts.append(str(a))
        return "(" + " ".join(parts) + ")"

    def walk(self) -> Iterator[Term]:
        """Every sub-term, children before parents (each distinct sub-term once)."""
        seen: set[Term] = set()
        stack: list[tuple[Term, bool]] = [(self, False)]
        while stack:
            t, expanded = stack.pop()
            if expanded:
                if t not in seen:
                    seen.add(t)
                    yield t
                continue
            if t in seen:
                continue
            stack.append((t, True))
            for c in reversed(t.children):
                if c not in seen:
                    stack.append((c, False))

    def size(self) -> int:
        """Number of operator nodes in the term tree (shared sub-terms counted each time)."""
        return 1 + sum(c.size() for c in self.children)


# --- constructors used by the op table -------------------------------------------------------

def var(name: str) -> Term:
    return Term("Var", (name,))


def sum_(n: int, x: Term) -> Term:
    """``Sum(n, x)``, normalised so that a sum over one element is the element itself."""
    if n == 1:
        return x
    return Term("Sum", (int(n), x))


def app(op: str, *args: Arg) -> Term:
    return Term(op, args)


# --- parsing ---------------------------------------------------------------------------------

def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
        elif c == ";":
            while i < n and text[i] != "\n":
                i += 1
        elif c in "()":
            tokens.append(c)
            i += 1
        elif c == '"':
            j = i + 1
            buf = ['"']
            while j < n and text[j] != '"':
                if text[j] == "\\" and j + 1 < n:
                    j += 1
                buf.append(text[j])
                j += 1
            if j >= n:
                raise ExprError(f"unterminated string in expression: {text!r}")
            buf.append('"')
            tokens.append("".join(buf))
            i = j + 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in '();"':
                j += 1
            tokens.append(text[i:j])
            i = j
    return tokens


def parse(text: str) -> Term:
    """Parse one s-expression such as ``(Sum 64 (Mul (Var "v0") (Var "v1")))``."""
    tokens = _tokenize(text)
    if not tokens:
        raise ExprError("empty expression")
    pos = 0

    def parse_arg() -> Arg:
        nonlocal pos
        if pos >= len(tokens):
            raise ExprError(f"unexpected end of expression: {text!r}")
        tok = tokens[pos]
        pos += 1
        if tok == "(":
            if pos >= len(tokens) or tokens[pos] in "()":
                raise ExprError(f"expected an operator name after '(' in {text!r}")
            op = tokens[pos]
            pos += 1
            args: list[Arg] = []
            while pos < len(tokens) and tokens[pos] != ")":
                args.append(parse_arg())
            if pos >= len(tokens):
                raise ExprError(f"missing ')' in {text!r}")
            pos += 1
            return Term(op, tuple(args))
        if tok == ")":
            raise ExprError(f"unexpected ')' in {text!r}")
        if tok.startswith('"'):
            return tok[1:-1]
        try:
            return int(tok)
        except ValueError:
            raise ExprError(f"bare symbol {tok!r} in {text!r}: write operators as (Op args...)")

    result = parse_arg()
    if pos != len(tokens):
        raise ExprError(f"trailing text after the expression in {text!r}")
    if not isinstance(result, Term):
        raise ExprError(f"{text!r} is a literal, not an expression")
    return result
