"""Multi-output first kernels: a block graph may also write a loop's result that it consumes,
so that a later kernel gets both and need not run the loop again.

``softmax(X @ W)`` over a vocabulary: the first kernel writes the logits ``S = X @ W`` with
what it computed from them (``exp(S)``, or each block's sum of it); the second finishes the
softmax from those. W, the large operand, is read once; without the move every two-kernel form
reads it twice (once for the sums, once for the division's numerator).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import egraph_mirage as em
from egraph_mirage.search import SearchConfig
from egraph_mirage.search import tasks as tasks_mod
from egraph_mirage.search.prepare import prepare
from egraph_mirage.search.tasks import Context, _Run


def _handed_on(name: str, shapes: int | None = None) -> tuple[Context, list[Any]]:
    """(context, first kernels) of ``name`` at small shapes, over its first ``shapes``
    first-kernel shapes: each first kernel that writes a tile it also consumes, as (tensors,
    steps, [(written tile, its tensor)])."""
    g = em.benchmarks.get(name, small=True)
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    found = []
    for shape in ctx.first_shapes[:shapes]:
        for tensors, steps in _Run(ctx, None).intermediates(shape, list(payload.inputs), [],
                                                           (1, 5)):
            step = steps[-1]
            consumed = {a for t in step.tiles for a in t.args}
            new = tensors[len(tensors) - len(step.outputs):]
            written = [(step.tiles[i], t) for (i, _), t in zip(step.outputs, new)
                       if i in consumed]
            if written:
                found.append((tensors, steps, written))
    return ctx, found


def test_a_first_kernel_hands_on_the_logits_and_the_second_does_not_read_w() -> None:
    ctx, firsts = _handed_on("vocab_softmax")
    g = ctx.target
    out = g.outputs[0].dims
    assert firsts and all(tile.op == "accum" for *_, written in firsts for tile, _ in written)
    # the first kernels that hand on the logits (of the output's dims) and write nothing larger
    logits = [(tensors, steps) for tensors, steps, written in firsts
              if any(t.dims == out for _, t in written)
              and all(math.prod(t.dims) <= math.prod(out)
                      for t in tensors[len(tensors) - len(steps[-1].outputs):])]
    for tensors, steps in logits:
        run = _Run(ctx, None)
        run.finals(tensors, steps, must_use=len(g.inputs))
        for text, *_ in run.result.found:
            h = em.loads(text)
            first, last = (t for t in h.operators if t.op == "customized"
                           and t.params["output"] == 0)
            outs = [t for t in h.operators if t.op == "customized" and t.operands == first.operands]
            if not (len(outs) == 2 and all(t in last.operands for t in outs)):
                continue  # a form that leaves one of them unread
            assert not any(a is h.inputs[1] for a in last.operands)  # W is read once
            assert em.verify(g, h, tests=4, seed=5).equivalent
            assert em.check_numerics(h, g) < 1e-6
            return
    pytest.fail(f"none of the {len(logits)} first kernels handing on the logits was completed")


@pytest.mark.parametrize("share", [tasks_mod.HANDED_ON, 1e9])
def test_written_tiles_it_consumes_are_no_larger_than_the_output(share: float,
                                                                 monkeypatch: Any) -> None:
    """Attention's scores (heads × queries × keys) are larger than its output: its first kernels
    do not write them beside what they compute from them, unless the limit is lifted."""
    monkeypatch.setattr(tasks_mod, "HANDED_ON", share)
    ctx, firsts = _handed_on("gqa", shapes=2)
    most = math.prod(ctx.target.outputs[0].dims)
    sizes = [math.prod(t.dims) for *_, written in firsts for _, t in written]
    assert sizes
    assert (max(sizes) <= most) == (share < 1e9)


def test_the_second_kernel_keeps_the_first_kernels_blocks_and_reads_every_blocks_sums() -> None:
    """The W-once forms that won on the GPU: the first kernel's grid cuts the vocabulary only;
    the second cuts it into the same blocks, each block reading its logits and every block's
    partial sums (written along a ``("split", ...)`` dimension, which a later grid of the same
    cut does not split: only a result written once per block as a copy is read one per
    block)."""
    import json

    g = em.benchmarks.get("vocab_softmax", small=True)
    payload = prepare(g, SearchConfig())
    ctx = Context(payload)
    vocab = payload.inputs[1].dcls[1]  # W's columns
    shapes = [s for s in ctx.first_shapes
              if s.axis_classes[0] == vocab and s.grid[0] > 1 and s.grid[1:] == (1, 1)]
    assert shapes
    for shape in shapes:
        for tensors, steps in _Run(ctx, None).intermediates(shape, list(payload.inputs), [],
                                                           (1, 5)):
            run = _Run(ctx, None)
            run.finals(tensors, steps, must_use=len(g.inputs))
            for text, *_ in run.result.found:
                first, second = json.loads(text)["kernels"]
                loads = [op["params"]["input_map"] for op in second["ops"] if op["op"] == "input"]
                if first["grid_dim"] == second["grid_dim"] and [-1, -1, -1] in loads:
                    assert em.verify(g, em.loads(text), tests=4, seed=5).equivalent
                    return
    pytest.fail("no second kernel keeps the first kernel's blocks and reads every block's sums")
