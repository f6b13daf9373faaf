"""Pairing tiles through the e-graph: the goal-distance closure reads the partners of a tile from
an index instead of trying every earlier tile, and the walk skips operators whose operands' handles
no e-node joins. Both must leave out only pairs that make nothing."""

from __future__ import annotations

import pytest

import egraph_mirage as em
from egraph_mirage.expr import app
from egraph_mirage.ops import OPS
from egraph_mirage.search import SearchConfig, blocks, pairing
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.reach import ref
from egraph_mirage.search.tasks import Context, _Run

A, B = ref(-1), ref(-2)


def test_split_finds_the_node_that_joins_the_operands() -> None:
    # rms_norm(x, w) = (x / rms(x)) * w: joined by the Mul, x behind a division
    term = OPS["rms_norm"].expr([A, B], [(4, 8), (8,)], {"normalized_shape": (8,)})
    join = pairing.split(term, A, B)
    assert join is not None and join.op == "Mul" and join.at == (0, 1)
    assert join.handles == (app("Div", A, app("Rms", 8, A)), B)
    # sub(a, b) = a + b * -1: the second handle is the scaled operand
    join = pairing.split(OPS["sub"].expr([A, B], [(4, 8), (4, 8)], {}), A, B)
    assert join is not None and join.op == "Add" and join.handles[0] == A
    assert join.handles[1] != B and pairing._holds(join.handles[1], B)
    # the lowest node that holds both, not the root
    assert pairing.split(app("Exp", app("Mul", A, app("Div", A, B))), A, B).op == "Div"
    assert pairing.split(app("Exp", A), A, B) is None


def _closures(name: str, shapes: int, brute: bool, monkeypatch: pytest.MonkeyPatch) -> list:
    """The goal distances of the first ``shapes`` last-kernel shapes of ``name`` (small), with a
    fresh memo;
    ``brute``: every pair tried, no operator skipped by its handles."""
    with monkeypatch.context() as m:
        if brute:
            m.setattr(pairing.Pairing, "combos", lambda self, k: None)
            m.setattr(blocks, "joinable", lambda *args: True)
        payload = prepare(em.benchmarks.get(name, small=True), SearchConfig())
        ctx = Context(payload)
        run = _Run(ctx, None)
        out = []
        for shape in ctx.final_shapes[:shapes]:
            search = run._search(shape, lambda tiles, sinks: True, 1, payload.reach.roots[0])
            out.append(search._distances(search.inputs(), payload.config.max_block_ops))
        return out


#: programs and how many shapes: qknorm's closures are the largest (hundreds of tiles each, a
#: minute to close by trying every pair), the others' are small
@pytest.mark.parametrize("name, shapes", [("qknorm", 2), ("mha", 8), ("rmsnorm_linear", 12),
                                          ("gated_mlp", 12)])
def test_pairing_leaves_out_only_pairs_that_make_nothing(name: str, shapes: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    fast = _closures(name, shapes, False, monkeypatch)
    slow = _closures(name, shapes, True, monkeypatch)
    assert fast == slow
    assert any(d for d in fast)  # some shape reaches the output
