"""Term constructors of the abstract-expression language: one record per constructor.

Every tensor is described by an ``Expr`` term (``docs/expressions.md``). A ``Constructor`` holds
what the rest of egraph-mirage needs to know about one kind of term node:

- its egglog signature (``sorts``), from which the oracle writes the ``Expr`` datatype and the
  ``Reach`` rule that passes reachability down to the arguments (``oracle/prelude.py``), so the
  rule files under ``rules/`` hold identities only;
- its extraction weight (``cost``, read by ``extract.CostModel``);
- its degree rule (``degree``), the bound the finite-field verifier uses to state the chance that
  a random test misses a difference (``verify.degree``).

Constructors that one operator introduces are declared in that operator's op-table entry
(``OpSpec.terms``); the ones below are shared: graph inputs and constants, sums (matmul,
reduction, mean, accumulators), root mean squares (rms_norm, the ``rms`` accumulator) and maxima
(amax, the running max of online softmax).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: (degree bound, the largest number of exps nested on a path) of a term
Degree = tuple[int, int]
DegreeRule = Callable[[Sequence[Degree]], Degree]

#: the egglog sorts an argument may have
SORTS = frozenset({"Expr", "i64", "String"})


def _exps(kids: Sequence[Degree]) -> int:
    return max((e for _, e in kids), default=0)


def variable(kids: Sequence[Degree]) -> Degree:
    """A graph input: degree 1."""
    return (1, 0)


def constant(kids: Sequence[Degree]) -> Degree:
    """A number: degree 0."""
    return (0, 0)


def product(kids: Sequence[Degree]) -> Degree:
    """A product or quotient: the degrees add (numerator plus denominator)."""
    return (sum(d for d, _ in kids), _exps(kids))


def largest(kids: Sequence[Degree]) -> Degree:
    """A sum or a concatenation: the largest degree of the parts."""
    return (max((d for d, _ in kids), default=0), _exps(kids))


def square(kids: Sequence[Degree]) -> Degree:
    """A square: twice the degree."""
    return (2 * kids[0][0], _exps(kids))


def exponential(kids: Sequence[Degree]) -> Degree:
    """exp: the argument's degree, one more exp on the path."""
    return (kids[0][0], _exps(kids) + 1)


def rescaled_sum(kids: Sequence[Degree]) -> Degree:
    """A sum of terms each weighted by an exp (``SumShift``): the terms' degree plus the
    weight's, one more exp on the weight's path."""
    (a, ea), (m, em) = kids
    return (a + m, max(ea, em + 1))


def opaque(kids: Sequence[Degree]) -> Degree:
    """A function without an algebraic model (a random function in the verifier): degree 1."""
    return (1, _exps(kids))


@dataclass(frozen=True)
class Constructor:
    """One term constructor of the ``Expr`` datatype."""

    name: str
    #: egglog sorts of the arguments, in order (``Expr`` arguments are sub-terms)
    sorts: tuple[str, ...]
    #: what the node means, written as the comment of its datatype line
    doc: str
    #: extraction weight of one node (children excluded); a ``Sum`` is charged by its size
    cost: float
    #: the verifier's degree rule (``variable``, ``constant``, ``product``, ``largest``,
    #: ``square``, ``exponential`` or ``opaque``)
    degree: DegreeRule

    def __post_init__(self) -> None:
        if not self.name[:1].isupper() or not self.name.isidentifier():
            raise TypeError(f"term constructor {self.name!r}: names are capitalised identifiers")
        bad = [s for s in self.sorts if s not in SORTS]
        if bad:
            raise TypeError(f"term constructor {self.name!r}: unknown sorts {bad}; "
                            f"known: {sorted(SORTS)}")

    @property
    def declaration(self) -> str:
        """The constructor's line in the ``Expr`` datatype, e.g. ``(Exp Expr)``."""
        return f"({' '.join((self.name, *self.sorts))})"

    @property
    def reach_rule(self) -> str | None:
        """``(rule ((Reach (C a0 a1))) ((Reach a0) (Reach a1)))`` over the ``Expr`` arguments;
        None for a leaf (no ``Expr`` argument)."""
        names = [f"a{i}" for i in range(len(self.sorts))]
        kids = [n for n, s in zip(names, self.sorts) if s == "Expr"]
        if not kids:
            return None
        head = f"({' '.join((self.name, *names))})"
        return f"(rule ((Reach {head})) ({' '.join(f'(Reach {k})' for k in kids)}))"


#: the shared constructors, in datatype order
CORE_TERMS: tuple[Constructor, ...] = (
    Constructor("Var", ("String",), 'graph input number k is (Var "vk")', 0.0, variable),
    Constructor("Num", ("i64",), "an integer constant, such as the count in a mean", 0.0,
                constant),
    Constructor("Const", ("String",), "a scalar (mul_scalar, add_scalar, rms_norm's eps), "
                "written as Python's repr of the float", 0.0, constant),
    Constructor("Sum", ("i64", "Expr"), "the sum of n instances of the body (n > 1)", 1.0,
                largest),
    Constructor("Rms", ("i64", "Expr"), "root mean square of n elements", 6.0, opaque),
    Constructor("Max", ("i64", "Expr"), "the max of n elements (amax, online softmax's running "
                "max)", 4.0, opaque),
    Constructor("SumShift", ("i64", "Expr", "Expr"), "the sum of n instances of a, each times "
                "exp(m - the max of the n instances of m): an accumulator rescaled by a tile "
                "that is not a running max (split-KV's partials, each with its own max)", 2.0,
                rescaled_sum),
)


def collect(groups: Iterable[Iterable[Constructor]]) -> dict[str, Constructor]:
    """Constructors by name, in order of first appearance; one name declared twice with
    different signatures is a ``TypeError`` naming both."""
    out: dict[str, Constructor] = {}
    for group in groups:
        for c in group:
            seen = out.get(c.name)
            if seen is not None and seen.sorts != c.sorts:
                raise TypeError(f"term constructor {c.name!r} declared as {seen.declaration} and "
                                f"as {c.declaration}")
            out.setdefault(c.name, c)
    return out
