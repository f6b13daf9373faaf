"""GPU probe: which of a generated program's inputs does torch's analysis of a ``wrap_triton``
kernel (``identify_mutated_tensors``, the TTIR walk that decides what functionalization clones)
say each kernel writes? A kernel taken to write an input it only reads makes Inductor copy that
input before every call (a decode step's KV cache, read by a replaced attention piece).
Lowers the hand-written split-KV attention of the ``gqa`` program (a fused combine), prints
each kernel's mutated arguments and the functionalized trace of ``launch_traced``.

Usage, on the GPU machine from the repository root:
  python3 scripts/gpu_probes/kernel_mutations.py
"""
from __future__ import annotations

import inspect
import sys

sys.path.insert(0, ".")


def main() -> None:
    import torch
    from torch._higher_order_ops.triton_kernel_wrap import identify_mutated_tensors
    from torch.fx.experimental.proxy_tensor import make_fx

    import egraph_mirage as em
    from egraph_mirage import benchmarks
    from egraph_mirage.bench import handwritten_fixtures as hw

    for name, build in (("attention", hw.attention), ("attention_one_kernel",
                                                      hw.attention_one_kernel)):
        mod = em.compile(build(benchmarks.get("gqa"))).module
        xs = [torch.randn(s, dtype=d, device="cuda") for s, d, _ in mod.INPUTS]
        src = inspect.getsource(mod)
        print(f"== {name}: {src.count('@triton.jit')} jit functions", flush=True)
        for k in [n for n in dir(mod) if n.startswith("kernel_")]:
            kernel = getattr(mod, k)
            params = kernel.arg_names
            args = {p: (xs[int(p[2:])] if p.startswith("in") and p[2:].isdigit()
                        else torch.empty(1 << 22, dtype=torch.float32, device="cuda"))
                    for p in params}
            try:
                print(f"  {k}({', '.join(params)}): mutated "
                      f"{identify_mutated_tensors(kernel, args, {})}", flush=True)
            except Exception as e:
                print(f"  {k}: {type(e).__name__}: {e}", flush=True)
        try:
            from torch.func import functionalize

            gm = make_fx(functionalize(lambda *a: mod.launch_traced(*a)))(*xs)
            for n in gm.graph.nodes:
                if "triton" in str(n.target):
                    print("  traced:", n.format_node()[:400], flush=True)
        except Exception as e:
            print(f"  trace: {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main()
