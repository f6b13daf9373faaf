"""The reachability oracle: is a candidate tensor still a possible part of the target program?

``Oracle(g)`` inserts the abstract expressions of ``g``'s outputs into an e-graph loaded with the
rule files, asserts ``(Reach target)``, and saturates one iteration at a time under a node, time and
iteration budget. The saturated e-graph is then frozen into a ``Snapshot`` of plain dicts, so a
query is a few dict lookups (no egglog call): a term is reachable exactly when every one of its
e-nodes is in the e-graph and its e-class carries ``Reach``. When the budget cut saturation short,
``complete`` is False and a "no" means "not derived within the budget" (``answer`` says UNKNOWN).
"""

from __future__ import annotations

import dataclasses
import enum
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .. import expr as ex
from ..errors import OracleError
from ..extract.snapshot import Snapshot, from_serialized
from ..graph import KernelGraph, Tensor, abstract_term
from . import egglog_compat as eg
from .prelude import load_prelude, prelude_text
from .rules import DEFAULT_RULES_DIR, load_rules
from .soundness import check_rule_forms

_T = TypeVar("_T")


class Reachability(enum.Enum):
    REACHABLE = "reachable"
    UNREACHABLE = "unreachable"
    #: not derived, but saturation was cut off, so it might be derivable
    UNKNOWN = "unknown"


class IncompleteSaturationWarning(UserWarning):
    """Saturation hit its budget: negative answers are not final."""


@dataclass(frozen=True)
class Budget:
    """Limits on saturation; checked after every iteration."""

    max_enodes: int = 200_000
    max_seconds: float = 20.0
    max_iterations: int = 200


@dataclass(frozen=True)
class OracleStats:
    enodes: int
    eclasses: int
    iterations: int
    seconds: float
    complete: bool
    reachable_classes: int


def sizes(terms: Iterable[ex.Term]) -> list[int]:
    """The sizes the rules may use: every sum size of the terms, the sum of any two of them
    (a contraction over a concatenation), and all their divisors (partial sums)."""
    found: set[int] = set()
    for t in terms:
        for s in t.walk():
            if s.op in ("Sum", "Rms"):
                found.add(s.args[0])
            elif s.op == "Concat":
                found.update((s.args[0], s.args[1], s.args[0] + s.args[1]))
    found |= {a + b for a in found for b in found}
    return sorted({d for n in found for d in divisors(n) if d > 1})


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, in increasing order (by its prime factors: fast for the
    sizes of any program, where trying every number up to n would not end)."""
    primes: dict[int, int] = {}
    rest, d = n, 2
    while d * d <= rest:
        while rest % d == 0:
            primes[d] = primes.get(d, 0) + 1
            rest //= d
        d += 1 if d == 2 else 2
    if rest > 1:
        primes[rest] = primes.get(rest, 0) + 1
    out = [1]
    for p, k in primes.items():
        out = [x * p**e for x in out for e in range(k + 1)]
    return sorted(out)


def split_pairs(sizes: Iterable[int]) -> list[tuple[int, int]]:
    """The ``(n, d)`` facts for sum splitting: d divides n, 1 < d < n."""
    return [(n, d) for n in sorted(sizes) for d in divisors(n) if 1 < d < n]


def target_facts(targets: Sequence[ex.Term], split_sizes: Iterable[int]) -> list[str]:
    """The facts the rule files expect from the oracle (``oracle/prelude.py``): the sizes
    that may be split (``SplitBy``), the joined sizes of two written sums (``Size``), the written
    subterms (``Written``), and each target, named ``$target<i>``, reachable (``Reach``)."""
    written = sorted({t.args[0] for tt in targets for t in tt.walk() if t.op == "Sum"})
    facts = [f"(Size {a + b})" for a in written for b in written if a < b]
    facts += [f"(Written {t.to_sexpr()})" for tt in targets for t in tt.walk()]
    facts += [f"(SplitBy {n} {d})" for n, d in split_pairs(split_sizes)]
    for i, t in enumerate(targets):
        facts += [f"(let $target{i} {t.to_sexpr()})", f"(Reach $target{i})"]
    return facts


def _as_term(x: Tensor | ex.Term | str) -> ex.Term:
    if isinstance(x, ex.Term):
        return x
    if isinstance(x, str):
        return ex.parse(x)
    if isinstance(x, Tensor):
        return abstract_term(x)
    raise OracleError(f"expected a Tensor, a Term or an s-expression, got {type(x).__name__}")


class Oracle:
    """Decides subexpression reachability for the outputs of a target kernel graph.

    ``rules`` replaces the shipped rule files (``DEFAULT_RULES_DIR``), ``extra_rules`` are loaded
    after them; both take files and folders of ``*.egg`` files. Every rule is checked sound on
    random values before saturation (``oracle/soundness.py``): a malformed, unsound or
    uncheckable line is a ``RuleError`` naming its file and line (and the counterexample).
    """

    def __init__(self, target: KernelGraph, rules: Sequence[str | Path] | None = None,
                 extra_rules: Sequence[str | Path] = (), budget: Budget | None = None,
                 warn_incomplete: bool = True) -> None:
        if not isinstance(target, KernelGraph):
            raise OracleError(f"Oracle: expected a KernelGraph, got {type(target).__name__}")
        if not target.outputs:
            raise OracleError("Oracle: the target graph has no outputs; call g.mark_output(T)")
        self.target = target
        self.budget = budget or Budget()
        self.targets = [abstract_term(t) for t in target.outputs]
        rule_paths = [DEFAULT_RULES_DIR] if rules is None else list(rules)
        self.rule_paths = [*rule_paths, *extra_rules]

        t0 = time.perf_counter()
        self._egraph = eg.new_egraph()
        self.prelude = prelude_text()
        load_prelude(self._egraph, self.prelude)
        forms = load_rules(self._egraph, self.rule_paths)
        #: how many rules were checked sound on this build (the shipped rules, and rules found
        #: sound before in this process, are not checked again: ``oracle/soundness.py``)
        self.rules_checked = check_rule_forms(forms, self.prelude)
        self._constructors = self._term_constructors()
        #: the sizes the rules may split sums by (see ``sizes``)
        self.sizes = sizes(self.targets)
        self._run("the rules do not declare the target's operators",
                  lambda: eg.run_text(self._egraph, "\n".join(target_facts(self.targets,
                                                                            self.sizes))))
        self.iterations, self.complete = self._run("saturation failed",
                                                   lambda: self._saturate(t0))
        self.snapshot = self._freeze()
        self.seconds = time.perf_counter() - t0
        self._nodes = self.snapshot.nodes
        self._reachable = self.snapshot.reachable
        self._extractor: Any = None
        if not self.complete and warn_incomplete:
            warnings.warn(f"saturation stopped at its budget after {self.iterations} iterations "
                          f"({self.snapshot.num_enodes} e-nodes); negative answers are not final",
                          IncompleteSaturationWarning, stacklevel=2)

    # --- building ---------------------------------------------------------------------------
    def _run(self, what: str, call: Callable[[], _T]) -> _T:
        """``call()``, with egglog's failures (errors, panics of user rules such as an i64
        overflow) an ``OracleError`` of one line, and its native output captured."""
        err = eg.NativeStderr()
        try:
            with err:
                return call()
        except BaseException as exc:
            if eg.is_interrupt(exc) or isinstance(exc, OracleError):
                raise
            raise OracleError(f"Oracle: {what}: {eg.failure_message(exc, err.text)}") from None

    def _term_constructors(self) -> frozenset[str]:
        frozen = self._egraph.freeze()
        return frozenset(n for n, f in frozen.functions.items()
                         if f.output_sort == "Expr" and not f.is_let_binding
                         and not n.startswith("$"))

    def _saturate(self, t0: float) -> tuple[int, bool]:
        # egglog cannot stop inside an iteration, so the next iteration's size is predicted
        # from the last growth factor, and saturation stops before it would break the budget.
        b = self.budget
        before = eg.count_rows(self._egraph, self._constructors)
        for it in range(1, b.max_iterations + 1):
            if not eg.last_run_updated(eg.run_text(self._egraph, "(run 1)")):
                return it, True
            if time.perf_counter() - t0 > b.max_seconds:
                return it, False
            now = eg.count_rows(self._egraph, self._constructors)
            if now > b.max_enodes or now * now / max(before, 1) > 4 * b.max_enodes:
                return it, False
            before = now
        return b.max_iterations, False

    def _freeze(self) -> Snapshot:
        snap = from_serialized(eg.serialize_json(self._egraph))
        roots = []
        for t in self.targets:
            c = _class_of(snap.nodes, t)
            if c is None:
                raise OracleError(f"Oracle: target {t} vanished from its own e-graph")
            roots.append(c)
        return dataclasses.replace(snap, roots=tuple(roots))

    # --- queries ----------------------------------------------------------------------------
    @property
    def stats(self) -> OracleStats:
        return OracleStats(self.snapshot.num_enodes, self.snapshot.num_eclasses, self.iterations,
                           self.seconds, self.complete, len(self._reachable))

    def lookup(self, op: str, children: Sequence[Any]) -> int | None:
        """E-class of one operator over children already known (class ids or literals), or None.

        This is the incremental form the search uses: one dict lookup per new operator.
        """
        return self._nodes.get((op, tuple(children)))

    def is_reachable_class(self, eclass: int | None) -> bool:
        return eclass is not None and eclass in self._reachable

    def class_of(self, x: Tensor | ex.Term | str) -> int | None:
        """E-class of a term (or a tensor's expression), or None when it is not in the e-graph."""
        return _class_of(self._nodes, self._check(x))

    def answer(self, x: Tensor | ex.Term | str) -> Reachability:
        if self.is_reachable_class(self.class_of(x)):
            return Reachability.REACHABLE
        return Reachability.UNREACHABLE if self.complete else Reachability.UNKNOWN

    def is_subexpr(self, x: Tensor | ex.Term | str) -> bool:
        """Whether ``x`` (tensor, term or s-expression) is a subexpression of the target.

        True only when the rules derive it. With ``complete == False`` a False may be UNKNOWN.
        """
        return self.is_reachable_class(self.class_of(x))

    def _check(self, x: Tensor | ex.Term | str) -> ex.Term:
        if isinstance(x, Tensor) and x.graph is not self.target:
            theirs, ours = x.graph.inputs, self.target.inputs
            if len(theirs) > len(ours) or any(a.dims != b.dims for a, b in zip(theirs, ours)):
                raise OracleError(
                    "is_subexpr: the tensor's graph has inputs "
                    f"{[t.dims for t in theirs]}, which do not match the target's inputs "
                    f"{[t.dims for t in ours]} by position")
        return _as_term(x)

    def canonical(self, x: Tensor | ex.Term | str, cost_model: Any = None) -> ex.Term:
        """The cheapest term equal to ``x`` under the rules (``extract.CostModel`` by default).

        The rules treat tensors as if they did not depend on summed indices, so the cheapest
        member may pull factors out of sums in ways that are not valid tensor formulas: read it as
        a normal form of the abstract expression, not as a program.
        """
        from ..extract import Extractor

        c = self.class_of(x)
        if c is None:
            raise OracleError(f"canonical: {_as_term(x)} is not in the e-graph of this target")
        if cost_model is None:
            if self._extractor is None:
                self._extractor = Extractor(self.snapshot)
            return self._extractor.extract(c)
        return Extractor(self.snapshot, cost_model).extract(c)

    def __repr__(self) -> str:
        s = self.stats
        return (f"Oracle({len(self.targets)} target(s), {s.enodes} e-nodes, {s.eclasses} e-classes,"
                f" {s.iterations} iterations, {s.seconds * 1e3:.1f} ms, complete={s.complete})")


def _class_of(nodes: dict, term: ex.Term) -> int | None:
    """Bottom-up lookup of every e-node of ``term``."""
    memo: dict[ex.Term, int | None] = {}

    def go(t: ex.Term) -> int | None:
        if t in memo:
            return memo[t]
        kids = []
        for a in t.args:
            if isinstance(a, ex.Term):
                c = go(a)
                if c is None:
                    memo[t] = None
                    return None
                kids.append(c)
            else:
                kids.append(a)
        c = nodes.get((t.op, tuple(kids)))
        memo[t] = c
        return c

    return go(term)
