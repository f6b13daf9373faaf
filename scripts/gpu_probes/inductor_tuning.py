"""GPU probe: are Inductor's coordinate-descent benchmarks of a decode layer's kernels true?

Inductor in max-autotune modes tunes each reduction kernel's block sizes at its first call
(coordinate descent: ``CachingAutotuner.coordinate_descent_tuning``), timing each config with
its benchmarker. In the backend's whole-graph check (``fx.whole``) the same kernels came out
with different block sizes in each compilation of the layer, some 2-5x slower than others
(the V projection with its cache write 29.9 against 6.6 µs), so that a graph with a faster piece
replaced could time slower than Inductor's code for the graph as a whole.

This compiles `bench torch`'s decode layer LAYER (default hf-static, 8B sizes, b = 1, fp16) in
``max-autotune-no-cudagraphs`` from an empty Inductor cache once per CONDITION, calls it once
(the tuning), and prints for each kernel the time the tuner measured for its first and its
chosen config, beside the kernel's time in the compiled graph by torch's profiler, and the
graph's time under CUDA-graph replay. Conditions:
  idle        nothing else runs;
  busy:N      N processes spin on the CPU meanwhile (a search's workers);
  headroom    idle, with 2 GiB allocated and freed first (Inductor clones an argument that a
              kernel writes before each benchmark call on the GPU when the memory allocator's
              peak leaves room for it, else copies it to the host and back in every call);
  timed, timed-busy:N   the same with the configs timed as the backend has them timed
              (``fx.inductor_tuning.timed_on_the_gpu``).
The first call's seconds (compiling and tuning) are printed too.

Usage, on the GPU machine from the repository root:
  python3 scripts/gpu_probes/inductor_tuning.py [CONDITION ...]   (default: idle busy:15)
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
from typing import Any

import torch

sys.path.insert(0, ".")


class Tuned(logging.Handler):
    """Each kernel's (first config's time, chosen config's time, chosen config), in µs, from the
    coordinate descent tuner's debug log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.kernels: dict[str, list[Any]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        msg, args = record.msg, record.args or ()
        if isinstance(msg, str) and "Improve from" in msg and len(args) >= 5:
            name, _, first, best_config, best = args[:5]
            self.kernels[str(name)] = [first * 1e3, best * 1e3, _short(best_config)]


def _short(config: Any) -> str:
    kw = " ".join(f"{k}={v}" for k, v in getattr(config, "kwargs", {}).items())
    return f"{kw} w={getattr(config, 'num_warps', '?')}"


def _spin() -> None:
    while True:
        pass


def run(condition: str, layer: str) -> None:
    from egraph_mirage.bench.torch_bench import (
        TorchBenchConfig,
        _input_sets,
        _module,
        _sizes,
        load_example,
    )
    from egraph_mirage.fx.inductor_tuning import timed_on_the_gpu
    from egraph_mirage.gpu.timing import CudaTimer

    torch._dynamo.reset()
    spinners = []
    timed = condition.startswith("timed")
    busy = condition.removeprefix("timed").removeprefix("-")
    if busy.startswith("busy:"):
        spinners = [mp.Process(target=_spin, daemon=True)
                    for _ in range(int(busy.split(":")[1]))]
        for p in spinners:
            p.start()
    if condition == "headroom":
        big = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        del big
    handler = Tuned()
    log = logging.getLogger("torch._inductor.runtime.coordinate_descent_tuner")
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        cfg = TorchBenchConfig(models=(layer,), preset="llama3_8b", device="cuda")
        example = load_example()
        module = _module(example, layer, _sizes(example, cfg), torch.float16, "cuda")
        sets = _input_sets(module, 1, cfg)
        t0 = time.perf_counter()
        with torch._inductor.config.patch(force_disable_caches=True), \
                (timed_on_the_gpu() if timed else contextlib.nullcontext()):
            fn = torch.compile(module, mode="max-autotune-no-cudagraphs", dynamic=False)
            with torch.no_grad():
                fn(*sets[0])  # compiles and tunes
            torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
    finally:
        log.removeHandler(handler)
        for p in spinners:
            p.terminate()
    timer = CudaTimer()
    kernels = timer.kernels(fn, [list(sets[0])])  # by the profiler, names cut at 80
    graph = timer.graph(fn, sets)
    print(f"== {condition}: graph replay {graph:.1f} µs; kernels by the profiler "
          f"{sum(kernels.values()):.1f} µs; first call {first_s:.1f} s", flush=True)
    print("   kernel | tuner: first config µs -> chosen µs | profiler µs | chosen config")
    for name, (first, best, config) in sorted(handler.kernels.items()):
        real = next((v for k, v in kernels.items() if k.startswith(name[:60])), float("nan"))
        print(f"   {name[:70]} | {first:.1f} -> {best:.1f} | {real:.1f} | {config}", flush=True)


def main() -> None:
    from egraph_mirage.rank.measured import keep_jax_off_the_gpu

    keep_jax_off_the_gpu()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
    layer = os.environ.get("LAYER", "hf-static")
    for condition in sys.argv[1:] or ["idle", "busy:15"]:
        run(condition, layer)


if __name__ == "__main__":
    main()
