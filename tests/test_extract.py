"""Extraction: the cheapest member of an e-class under a cost model."""

from __future__ import annotations

import pytest

import egraph_mirage as em
from egraph_mirage.extract import DEFAULT_WEIGHTS, CostModel, Extractor


@pytest.fixture(scope="module")
def oracles() -> dict[str, em.Oracle]:
    return {n: em.Oracle(em.benchmarks.get(n, small=True)) for n in em.benchmarks.names()}


@pytest.mark.parametrize("name", em.benchmarks.names())
def test_canonical_is_equal_and_no_dearer(oracles: dict[str, em.Oracle], name: str) -> None:
    oracle = oracles[name]
    target = oracle.targets[0]
    best = oracle.canonical(target)
    assert oracle.class_of(best) == oracle.snapshot.roots[0]  # the same e-class: equal
    model = CostModel()
    assert model.term_cost(best) <= model.term_cost(target)


@pytest.mark.parametrize("name", ["rmsnorm_linear", "qknorm", "lora"])
def test_costs_are_a_fixed_point(oracles: dict[str, em.Oracle], name: str) -> None:
    """Every class costs exactly its extracted term, and no e-node of it is cheaper."""
    snap = oracles[name].snapshot
    ex = Extractor(snap)
    for c, keys in snap.classes.items():
        term = ex.extract(c)
        assert ex.cost_model.term_cost(term) == pytest.approx(ex.cost[c])
        for op, children in keys:
            total = ex.cost_model.node_cost(op, children) + sum(
                ex.cost[ch] for ch, is_class in zip(children, snap.signatures[op]) if is_class)
            assert total >= ex.cost[c] - 1e-9


def test_cost_model_steers_the_choice(oracles: dict[str, em.Oracle]) -> None:
    oracle = oracles["rmsnorm_linear"]
    target = oracle.targets[0]
    assert "Rms" in str(oracle.canonical(target))
    no_rms = CostModel(weights={**DEFAULT_WEIGHTS, "Rms": 1000.0})
    spelled_out = oracle.canonical(target, no_rms)
    assert "Rms" not in str(spelled_out) and "Sqrt" in str(spelled_out)
    assert oracle.class_of(spelled_out) == oracle.snapshot.roots[0]


def test_canonical_of_an_absent_term(oracles: dict[str, em.Oracle]) -> None:
    with pytest.raises(em.OracleError, match="not in the e-graph"):
        oracles["gqa"].canonical('(Exp (Var "v2"))')
    with pytest.raises(em.OracleError, match="e-class 99999"):
        Extractor(oracles["gqa"].snapshot).extract(99999)
