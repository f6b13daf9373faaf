"""The search discovers online softmax (FlashAttention's running max and rescaled accumulators)
when the identity that lets a running max cancel is loaded (``rules/optional/online_softmax.egg``),
and not without it. A small attention program of distinct dimensions (so that no transposed
product has the same shape), one kernel shape, block graphs of up to 8 operators: the budget is
16 tasks, never seconds."""

from __future__ import annotations

from pathlib import Path

import egraph_mirage as em
from egraph_mirage.pipeline import superoptimize
from egraph_mirage.search import SearchConfig

RULE = Path(__file__).resolve().parents[1] / "rules" / "optional" / "online_softmax.egg"
#: one kernel: grid over the heads, the loop over the 64 keys in tiles of 16
CONFIG = SearchConfig(max_kernels=1, max_kernel_ops=0, griddims=((2, 1, 1),), franges=(4,),
                      max_block_ops=8)


def _attention() -> em.KernelGraph:
    g = em.new_kernel_graph()
    q, k, v = g.new_input((2, 8, 16)), g.new_input((2, 16, 64)), g.new_input((2, 64, 32))
    e = g.exp(g.matmul(q, k))
    g.mark_output(g.matmul(g.div(e, g.apply("reduction", [e], dim=2)), v))
    return g


def _online(result: em.KernelGraph) -> bool:
    ops = {b.op for t in result.operators if t.op == "customized"
           for b in t.params["kernel"].tb.tensors}
    return {"forloop_max", "forloop_accum_rescale"} <= ops


def test_the_online_softmax_form_is_discovered_with_its_identity() -> None:
    g = _attention()
    found = superoptimize(g, CONFIG, max_tasks=16, workers=1, extra_rules=[RULE],
                          progress=False)
    online = [r for r in found if _online(r.graph)]
    assert online, [r.summary() for r in found]
    for r in online:
        assert em.verify(g, r.graph, tests=3, seed=7).equivalent
        assert em.check_numerics(r.graph, g) < 1e-6


def test_without_the_identity_no_running_max_is_reachable() -> None:
    found = superoptimize(_attention(), CONFIG, max_tasks=16, workers=1, progress=False)
    assert found and not any(_online(r.graph) for r in found)
