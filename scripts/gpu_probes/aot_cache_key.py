"""GPU probe: why does a graph whose replaced piece Inductor launches (``fx.rest.inlined``) get
another AOTAutograd cache key when compiled a second time? Compiles the fused RMSNorm + Linear
winner (as ``test_inductor_launches_the_generated_kernels_on_a_gpu`` does) twice, after
Dynamo's reset, and prints the lines of the two keys' debug listings
(``autograd_cache_key``'s) that differ, and the two graphs' code where it differs.

Usage, on the GPU machine from the repository root: python3 scripts/gpu_probes/aot_cache_key.py
"""
from __future__ import annotations

import difflib
import sys
import tempfile
from typing import Any

sys.path[:0] = [".", "tests"]


def main() -> None:
    import torch
    from backend_stand_ins import StandIn, inputs, options, rms_mm
    from torch._functorch._aot_autograd import autograd_cache as ac

    from egraph_mirage.bench.handwritten_fixtures import rmsnorm_linear
    from egraph_mirage.fx.backend import Backend

    keys: list[tuple[str, list[str], str]] = []
    original = ac.autograd_cache_key

    def spy(mod: Any, *a: Any, **k: Any) -> Any:
        key, lines = original(mod, *a, **k)
        gm = mod.gm if hasattr(mod, "gm") else mod
        keys.append((key, lines, gm.code))
        return key, lines

    ac.autograd_cache_key = spy
    x, w = (t.cuda() for t in inputs())
    with tempfile.TemporaryDirectory() as d:
        for _ in range(2):
            torch._dynamo.reset()
            backend = Backend(**options(d, search=StandIn(winner=rmsnorm_linear),
                                        profile=False, rest="inductor"))
            with torch.no_grad():
                torch.compile(rms_mm, backend=backend, dynamic=False)(x, w)
    (k1, l1, c1), (k2, l2, c2) = keys[-2:]
    print("keys", k1, k2, "same" if k1 == k2 else "differ")
    for line in difflib.unified_diff(l1, l2, lineterm="", n=0):
        print(line[:600])
    for line in difflib.unified_diff(c1.splitlines(), c2.splitlines(), lineterm="", n=0):
        print("code:", line[:300])


if __name__ == "__main__":
    main()
