"""The numeric checks of the backend: a replaced piece's kernels against the piece's eager
code (``piece_error``), and a graph with its pieces launched by Inductor against Dynamo's graph
(``graph_error`` within ``graph_tolerance``); both compare the inputs written in place too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .mutation import written
from .pieces import Piece
from .runtime import Runner
from .traced import TracedProgram


def piece_error(runner: Runner, piece: Piece, traced: TracedProgram) -> float:
    """The largest relative error of ``runner``'s outputs against the piece's eager outputs on
    its example inputs, and of the inputs both write in place (a static cache,
    ``TracedProgram.writes``; each run on copies of them, from the same values)."""
    from ..gpu.torch_eval import relative_error

    returned = {w.returned_at for w in traced.writes}
    got, ref, written_error = _on_copies(lambda *xs: runner(list(xs)), piece.module,
                                         piece.example_inputs, {w.dest for w in traced.writes})
    ref = [r for k, r in enumerate(ref) if k not in returned]
    return max([written_error, *(relative_error(a, b) for a, b in zip(got, ref, strict=True))])


def _on_copies(ours: Any, theirs: Any, inputs: Sequence[Any], writes: set[int]
               ) -> tuple[Any, Any, float]:
    """``ours`` and ``theirs`` called on ``inputs``, each with its own copies of the inputs at
    ``writes`` (which they write in place): their outputs, and the largest relative error
    between what each wrote (0 for none)."""
    from ..gpu.torch_eval import relative_error

    def fresh() -> list[Any]:
        return [x.clone() if i in writes else x for i, x in enumerate(inputs)]

    ins_ours, ins_theirs = fresh(), fresh()
    with torch.no_grad():
        got, want = ours(*ins_ours), theirs(*ins_theirs)
    return got, want, max((relative_error(ins_ours[i], ins_theirs[i]) for i in sorted(writes)),
                          default=0.0)


#: relative error (``gpu.torch_eval.relative_error``) of a graph's outputs with Inductor
#: launching the pieces' kernels, against Dynamo's graph run as is, as a multiple of a
#: kernel's tolerance in the outputs' loosest dtype (``gpu.tune.TOLERANCE``): 1e-2 in fp16,
#: 8e-2 in bf16, whose 3 fewer mantissa bits a model's depth adds up (an 8-layer Llama's
#: logits with its attention replaced: 3.1e-2 against Dynamo's graph, where each kernel
#: matched within its own tolerance)
GRAPH_TOLERANCE = 2.0


def graph_tolerance(want: Any) -> float:
    """The launch check's tolerance for a graph's outputs ``want`` (``GRAPH_TOLERANCE``)."""
    from ..gpu.tune import TOLERANCE
    from .traced import DTYPES

    want = list(want) if isinstance(want, (list, tuple)) else [want]
    loosest = [TOLERANCE[DTYPES[name]] for w in want if isinstance(w, torch.Tensor)
               and (name := str(w.dtype).removeprefix("torch.")) in DTYPES]
    return GRAPH_TOLERANCE * max(loosest, default=TOLERANCE[DTYPES["float16"]])


def graph_error(ours: Any, gm: Any, example_inputs: Sequence[Any]) -> tuple[float, Any]:
    """The largest relative error of ``ours``'s outputs, and of the inputs it writes in place
    (a static cache: ``mutation.written``), against Dynamo's graph ``gm``, each run on its own
    copies of the written inputs; and ``gm``'s outputs."""
    writes = {i for i in written(gm) if isinstance(example_inputs[i], torch.Tensor)}
    got, want, written_error = _on_copies(ours, gm, example_inputs, writes)
    return max(outputs_error(got, want), written_error), want


def outputs_error(got: Any, want: Any) -> float:
    """The largest relative error between two graphs' outputs (tuples or lists of tensors)."""
    from ..gpu.torch_eval import relative_error

    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = list(want) if isinstance(want, (list, tuple)) else [want]
    if len(got) != len(want):
        return float("inf")
    return max((relative_error(a, b) for a, b in zip(got, want) if isinstance(b, torch.Tensor)),
               default=0.0)


__all__ = ["GRAPH_TOLERANCE", "graph_error", "graph_tolerance", "outputs_error", "piece_error"]
