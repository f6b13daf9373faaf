"""bf16 end to end: every benchmark program, built in bfloat16 at its small shapes, is searched,
and the μGraph found is lowered to Triton, run on bf16 tensors (in Triton's interpreter without a
GPU, where ``compile`` casts ``tl.dot`` operands to fp32: the interpreter's bf16 dot is wrong) and
compared with the program evaluated in float64 on the same bf16-rounded inputs.

The comparison is ``gpu.torch_eval.relative_error`` (the larger of the norm-wise and the
worst-element relative error) against ``gpu.tune.TOLERANCE[bfloat16]`` (4e-2), the tolerance the
GPU profiler and the torch backend hold a bf16 kernel to; the output must stay bf16.

Each search is bounded by tasks, never by time: ``TASKS`` holds, per program, the smallest task
budget that finds a result (one task fewer finds nothing), measured 2026-11-27; each search
gets twice that (``max_results=1`` stops it at its first result, so the margin costs nothing
while the first result comes where it did). They are the
fp16 counts of the same programs (the task list does not depend on the dtype). Every program is
tested at its usual small shape: the whole file takes about 30 s of CPU on a 2-core machine
(qknorm's search 15 s of it, gated_mlp's interpreted kernel 2 s), so no shape was reduced.
Measured errors were 2.5e-3 (gated_mlp) to 6.1e-3 (mqa).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import egraph_mirage as em
from egraph_mirage.gpu.torch_eval import relative_error
from egraph_mirage.gpu.tune import TOLERANCE

#: program -> the smallest ``max_tasks`` that finds a result in bf16 (one fewer finds nothing)
TASKS = {
    "gqa": 145,
    "mha": 145,
    "mqa": 97,
    "qknorm": 217,
    "rmsnorm_linear": 25,
    "lora": 19,
    "gated_mlp": 32,
    "ntrans": 35,
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_every_benchmark_program_has_a_budget() -> None:
    assert sorted(TASKS) == sorted(em.benchmarks.names())


@pytest.mark.parametrize("name", list(TASKS))
def test_bf16_program_is_found_lowered_and_matches(name: str) -> None:
    g = em.benchmarks.get(name, small=True, dtype=em.bfloat16)
    assert all(t.dtype is em.bfloat16 for t in g.inputs + g.outputs)
    results = em.superoptimize(g, max_tasks=2 * TASKS[name], workers=1, progress=False,
                               config=em.SearchConfig(max_results=1))
    assert results, f"{name}: nothing found in {TASKS[name]} tasks ({results.stats})"
    h = results.best.graph
    assert all(t.dtype is em.bfloat16 for t in h.outputs)

    rng = np.random.default_rng(5)
    xs = [torch.tensor(0.5 * rng.standard_normal(t.dims), dtype=torch.float32)
          .to(torch.bfloat16).to(DEVICE) for t in g.inputs]
    got = em.compile(h)(*xs)
    want = g.evaluate([x.double().cpu().numpy() for x in xs])  # the same bf16-rounded values
    assert len(got) == len(want) == len(g.outputs)
    for out, ref in zip(got, want, strict=True):
        assert out.dtype == torch.bfloat16
        assert tuple(out.shape) == ref.shape
        err = relative_error(out.cpu(), torch.from_numpy(ref))
        assert err < TOLERANCE[em.bfloat16], (
            f"{name}: the bf16 μGraph lowers but differs from the program: {err:.1e}")
