"""Benchmark of the reachability oracle: saturation cost and query throughput per target.

``bench_oracle()`` builds the oracle of each benchmark program and measures

* ``saturate_s``: the median of ``Oracle(g).seconds`` over a few builds (after one warm-up build,
  because the first e-graph of a process pays egglog's one-time start-up);
* ``op_queries_per_s``: ``oracle.lookup(op, children)`` (the incremental, one-operator form) on
  a mix of e-nodes of the saturated e-graph (hits) and of e-nodes with one child e-class swapped
  for another (mostly misses);
* ``term_queries_per_s``: ``oracle.is_subexpr(term)`` on whole terms: terms extracted at random
  from reachable e-classes plus every subterm of the target (positives), and those terms with a
  leaf ``Var`` swapped for another input or a ``Sum`` size changed (negatives). Every queried term
  is a freshly built object, and every answer is checked (positives must be True, negatives must
  agree with ``oracle.class_of``), so no caching or shortcut can inflate the figure.

All timing loops run in this one Python thread, i.e. on one core. The term helpers below
(``copy_term``, ``swap_vars``, ``random_terms``, ...) are also used by the command-line demo.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .. import benchmarks
from ..errors import OracleError
from ..expr import Term
from ..oracle import Oracle
from .text_table import aligned

#: The keys of every row ``bench_oracle`` returns (plus ``term_nodes_mean``).
KEYS = ("target", "saturate_s", "enodes", "eclasses", "complete", "op_queries_per_s",
        "term_queries_per_s")

# --- terms -------------------------------------------------------------------------------------

def copy_term(t: Term) -> Term:
    """A structurally equal term made of new objects only (shared subterms copied per use)."""
    return Term(t.op, tuple(copy_term(a) if isinstance(a, Term) else a for a in t.args))


def replace(t: Term, old: Term, new: Term) -> Term:
    """``t`` with every occurrence of subterm ``old`` replaced by ``new``."""
    if t == old:
        return new
    return Term(t.op, tuple(replace(a, old, new) if isinstance(a, Term) else a for a in t.args))


def swap_vars(t: Term, a: str, b: str) -> Term:
    """``t`` with input variables ``a`` and ``b`` exchanged everywhere."""
    if t.op == "Var":
        name = t.args[0]
        return Term("Var", (b if name == a else a if name == b else name,))
    return Term(t.op, tuple(swap_vars(x, a, b) if isinstance(x, Term) else x for x in t.args))


def var_names(t: Term) -> list[str]:
    """The input variables of ``t``, sorted by name."""
    return sorted({s.args[0] for s in t.walk() if s.op == "Var"})


def _paths(t: Term, pred, prefix: tuple[int, ...] = ()) -> Iterable[tuple[int, ...]]:
    if pred(t):
        yield prefix
    for i, a in enumerate(t.args):
        if isinstance(a, Term):
            yield from _paths(a, pred, (*prefix, i))


def _at(t: Term, path: tuple[int, ...]) -> Term:
    for i in path:
        t = t.args[i]  # type: ignore[assignment]
    return t


def _put(t: Term, path: tuple[int, ...], new: Term) -> Term:
    if not path:
        return new
    args = list(t.args)
    args[path[0]] = _put(args[path[0]], path[1:], new)  # type: ignore[arg-type]
    return Term(t.op, tuple(args))


def mutate(t: Term, inputs: Sequence[str], sizes: Sequence[int], rng: random.Random) -> Term:
    """A near miss of ``t``: one ``Var`` leaf replaced by another input, or one ``Sum`` size
    changed. Returns ``t`` itself when it has neither (a lone constant)."""
    var_paths = list(_paths(t, lambda s: s.op == "Var"))
    sum_paths = list(_paths(t, lambda s: s.op == "Sum"))
    if var_paths and len(inputs) > 1 and (not sum_paths or rng.random() < 0.5):
        p = rng.choice(var_paths)
        other = rng.choice([v for v in inputs if v != _at(t, p).args[0]])
        return _put(t, p, Term("Var", (other,)))
    if sum_paths:
        p = rng.choice(sum_paths)
        s = _at(t, p)
        n = s.args[0]
        choices = [m for m in (*sizes, 2 * n, n + 1) if m != n and m > 1]
        return _put(t, p, Term("Sum", (rng.choice(choices), *s.args[1:])))
    return t


# --- the saturated e-graph ---------------------------------------------------------------------

def signatures(oracle: Oracle) -> Mapping[str, tuple[bool, ...]]:
    """For each term constructor, which arguments are e-classes (True) rather than literals."""
    return oracle.snapshot.signatures


def random_terms(oracle: Oracle, rng: random.Random, max_depth: int = 6) -> dict[int, Term]:
    """One term per e-class (those expressible within ``max_depth``), chosen at random: e-nodes
    are visited in a shuffled order and an e-node is used once all its child classes have terms,
    so the result never loops through a cycle."""
    sigs = signatures(oracle)
    order = [(op, kids, c) for (op, kids), c in oracle.snapshot.nodes.items() if op in sigs]
    terms: dict[int, Term] = {}
    depth: dict[int, int] = {}
    changed = True
    while changed:
        changed = False
        rng.shuffle(order)
        for op, kids, c in order:
            if c in terms:
                continue
            args: list[Any] = []
            d = 0
            for k, is_class in zip(kids, sigs[op]):
                if not is_class:
                    args.append(k)
                elif k in terms:
                    args.append(terms[k])
                    d = max(d, depth[k])
                else:
                    break
            else:
                if d < max_depth:
                    terms[c], depth[c] = Term(op, tuple(args)), d + 1
                    changed = True
    return terms


def _node_keys(oracle: Oracle, rng: random.Random, n: int) -> list[tuple[str, tuple]]:
    """``n`` lookup keys: half existing e-nodes, half with one child class swapped at random."""
    sigs = signatures(oracle)
    nodes = list(oracle.snapshot.nodes)
    classes = list(oracle.snapshot.classes)
    keys = []
    for i in range(n):
        op, kids = rng.choice(nodes)
        slots = [j for j, is_class in enumerate(sigs.get(op, ())) if is_class]
        if i % 2 and slots:
            j = rng.choice(slots)
            kids = (*kids[:j], rng.choice(classes), *kids[j + 1:])
        keys.append((op, tuple(kids)))
    return keys


# --- measurements ------------------------------------------------------------------------------

def _op_rate(oracle: Oracle, keys: Sequence[tuple[str, tuple]], seconds: float) -> float:
    lookup = oracle.lookup
    done = 0
    t0 = time.perf_counter()
    while True:
        for op, kids in keys:
            lookup(op, kids)
        done += len(keys)
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            return done / elapsed


def _term_rate(oracle: Oracle, queries: Sequence[tuple[Term, bool]], seconds: float) -> float:
    """Queries per second over fresh term objects, each answered once; answers are checked."""
    is_subexpr = oracle.is_subexpr
    wrong: list[Term] = []
    done = 0
    t0 = time.perf_counter()
    elapsed = 0.0
    for start in range(0, len(queries), 256):
        for term, expected in queries[start:start + 256]:
            if is_subexpr(term) is not expected:
                wrong.append(term)
        done += len(queries[start:start + 256])
        elapsed = time.perf_counter() - t0
        if elapsed >= seconds:
            break
    if wrong:
        raise OracleError(f"oracle bench: {len(wrong)} wrong answers, e.g. {wrong[0]}")
    return done / max(elapsed, 1e-9)


def term_templates(oracle: Oracle, rng: random.Random, extractions: int = 4,
                   per_extraction: int = 64) -> tuple[list[Term], list[tuple[Term, bool]]]:
    """Positive and negative query templates for ``oracle``'s target; raises ``OracleError``
    if a positive is not answered True. Negatives carry the answer ``class_of`` implies."""
    positives = {s for t in oracle.targets for s in t.walk()}
    reach = oracle.snapshot.reachable
    for _ in range(extractions):
        terms = random_terms(oracle, rng)
        pool = sorted(c for c in terms if c in reach)
        for c in rng.sample(pool, min(per_extraction, len(pool))):
            positives.add(terms[c])
    pos = sorted(positives, key=str)
    bad = [t for t in pos if not oracle.is_subexpr(t)]
    if bad:
        raise OracleError(f"oracle bench: positive term answered False: {bad[0]}")
    inputs = [f"v{i}" for i in range(len(oracle.target.inputs))]
    sizes = [s for s in oracle.sizes if s > 1]
    neg = []
    for t in pos:
        m = mutate(t, inputs, sizes, rng)
        if m != t:
            neg.append((m, oracle.is_reachable_class(oracle.class_of(m))))
    return pos, neg


def _source(t: Term) -> str:
    args = "".join((_source(a) if isinstance(a, Term) else repr(a)) + "," for a in t.args)
    return f"T({t.op!r},({args}))"


def term_builder(t: Term) -> Callable[[], Term]:
    """A function that builds a new copy of ``t`` on every call (faster than ``copy_term``)."""
    build = eval("lambda T: " + _source(t), {})  # the text is made of reprs of t's parts only
    return lambda: build(Term)


def _fresh_queries(pos: Sequence[Term], neg: Sequence[tuple[Term, bool]], n: int,
                   rng: random.Random) -> list[tuple[Term, bool]]:
    """``n`` queries, alternately positive and negative, each a newly built term object."""
    kinds = [[(term_builder(t), True) for t in pos], [(term_builder(t), e) for t, e in neg]]
    out = []
    was_enabled = gc.isenabled()
    gc.disable()  # many small, long-lived objects: the cyclic collector would dominate the cost
    try:
        for i in range(n):
            build, expected = rng.choice(kinds[i % 2] or kinds[0])
            out.append((build(), expected))
    finally:
        if was_enabled:
            gc.enable()
    return out


def bench_target(name: str, small: bool = False, seconds: float = 0.3, repeats: int = 5,
                 seed: int = 0, max_terms: int = 200_000) -> dict[str, Any]:
    """One row of ``bench_oracle`` (assumes egglog is already warm)."""
    rng = random.Random(seed)
    g = benchmarks.get(name, small=small)
    oracles = [Oracle(g) for _ in range(max(1, repeats))]
    oracle = oracles[-1]
    keys = _node_keys(oracle, rng, 20_000)
    op_rate = _op_rate(oracle, keys, seconds)
    pos, neg = term_templates(oracle, rng)
    calibration = _fresh_queries(pos, neg, 2000, rng)
    rate = _term_rate(oracle, calibration, 10.0)
    queries = _fresh_queries(pos, neg, min(max_terms, int(rate * seconds * 1.3) + 500), rng)
    # Park the new objects outside the cyclic collector's generations while timing, so its
    # one-off passes over them (hundreds of ms) are not charged to the queries.
    already_frozen = gc.get_freeze_count() > 0
    gc.freeze()
    try:
        term_rate = _term_rate(oracle, queries, seconds)
    finally:
        if not already_frozen:
            gc.unfreeze()
    return {
        "target": name,
        "saturate_s": statistics.median(o.seconds for o in oracles),
        "enodes": oracle.stats.enodes,
        "eclasses": oracle.stats.eclasses,
        "complete": oracle.complete,
        "op_queries_per_s": op_rate,
        "term_queries_per_s": term_rate,
        "term_nodes_mean": statistics.fmean(t.size() for t, _ in queries[:5000]),
    }


def bench_oracle(names: Sequence[str] | None = None, small: bool = False, seconds: float = 0.3,
                 repeats: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Saturation time, e-graph size and query throughput (one core) of each target's oracle.

    ``names`` defaults to all of ``benchmarks.names()``; ``small`` uses the reduced shapes;
    ``seconds`` is the length of each timed query loop; ``repeats`` builds are timed per target.
    Returns one dict per target with the keys ``KEYS`` plus ``term_nodes_mean``.
    """
    names = benchmarks.names() if names is None else list(names)
    graphs = [benchmarks.get(n, small=small) for n in names]  # unknown names fail before timing
    if graphs:
        Oracle(graphs[0])  # warm-up: egglog's one-time start-up is not part of any figure
    return [bench_target(n, small, seconds, repeats, seed) for n in names]


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The rows as an aligned text table."""
    head = ("target", "saturate ms", "e-nodes", "e-classes", "complete", "op queries/s",
            "term queries/s")
    body = [(r["target"], f"{r['saturate_s'] * 1e3:.1f}", str(r["enodes"]), str(r["eclasses"]),
             "yes" if r["complete"] else "NO", f"{r['op_queries_per_s']:,.0f}",
             f"{r['term_queries_per_s']:,.0f}") for r in rows]
    return "\n".join(aligned(head, body))
