"""Inductor's tuning of its kernels, timed as the GPU runs them (``timed_on_the_gpu``).

In its max-autotune modes Inductor picks each of its Triton kernels' block sizes at the
kernel's first call: the fastest of its heuristic configs (``autotune_to_one_config``), then
coordinate descent (each field of the config moved to its neighbours, a move kept where it is
faster). Each config is timed by ``CachingAutotuner.bench``: Inductor's benchmarker flushes the
L2 with a buffer of the L2's size before each call (about 15 µs of GPU work on an H200) and
times the call with events around its launch through Inductor's Python wrapper, which also
copies the arguments the kernel writes (to the host and back, where the memory allocator's peak
leaves no room for a copy on the device). Where the host takes longer to issue a call than the
GPU takes to flush, the events time the host: on an H200 the tuner measured 17–40 µs for
kernels of 1–12 µs and 140–230 µs for those that write a static cache, so that its choices
were drawn by noise. One decode layer compiled three times from an empty cache ran its V
projection with the cache write at 59.0, 6.2 and 6.8 µs and the layer at 205.4, 144.3 and
143.0 µs (``scripts/gpu_probes/inductor_tuning.py``); in the backend a graph with a faster
piece replaced timed slower than Inductor's code for the graph, its other kernels drawn anew
(the V projection 29.9 against 6.6 µs).

Within ``timed_on_the_gpu()`` each config is timed instead by ``gpu.timing.CudaTimer.plain``
(Triton's ``do_bench``: a 256 MB flush before each call, which keeps the GPU busy while the
host issues it; the median of the calls), on copies of the arguments the kernel writes, made
on the device once before the timing. Everything else of Inductor's tuning is as it was: the
configs it tries, the order, the threshold, and its cache of chosen configs, which is keyed by
the kernel's source: a kernel whose config an earlier compilation chose, on disk or in this
process (Inductor shares a kernel of the same source, tuning and all, within a process), keeps
that config untuned (``bench torch`` and ``bench generate`` therefore compile each mode with
caches of its own: ``bench.inductor_caches``). Keying the cache apart here is not done:
Inductor's compile workers key it by their own settings, and every first call would then tune
again, a second compilation from the cache included.

``tuned_compile(compile)`` runs a compilation so and gives the compiled function with its
first call, the one that tunes, so too (``tuned_on_the_gpu``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

#: how long each config is timed (``TimingConfig``, ms): about 140 calls after 2 ms of warm-up
WARMUP_MS, REP_MS = 2.0, 10.0
#: Inductor's default limit of spilled registers above which a config is not timed
SPILL_THRESHOLD = 16


@contextlib.contextmanager
def timed_on_the_gpu(timer: Any = None) -> Iterator[None]:
    """Inductor's ``CachingAutotuner.bench`` replaced by ``timed_bench`` (module docstring)
    while the block runs; ``timer``: a ``gpu.timing.Timer`` (by default a ``CudaTimer`` of
    ``WARMUP_MS`` and ``REP_MS``). Where this torch has no such class, nothing changes."""
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:  # a torch without Inductor's Triton runtime
        yield
        return
    if timer is None:
        from ..gpu.timing import CudaTimer, TimingConfig

        timer = CudaTimer(TimingConfig(warmup_ms=WARMUP_MS, rep_ms=REP_MS))
    original = CachingAutotuner.bench

    def bench(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> float:
        return timed_bench(self, launcher, args, kwargs, timer, original)

    CachingAutotuner.bench = bench  # type: ignore[method-assign]
    try:
        yield
    finally:
        CachingAutotuner.bench = original  # type: ignore[method-assign]


def timed_bench(tuner: Any, launcher: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                timer: Any, original: Callable[..., float]) -> float:
    """``launcher``'s ms per call by ``timer.plain``, on device copies of the arguments
    ``tuner`` (a ``CachingAutotuner``) names as written (``mutated_arg_names``), the others as
    given, those it names as added into zeroed before each call (``reset_to_zero_args``). A
    config that spills more registers than Inductor allows, or whose arguments cannot be copied
    so, goes to Inductor's own ``original`` bench (which refuses the first); one the device
    cannot launch ("invalid configuration") takes infinitely long, as there."""
    kwargs = {k: v for k, v in kwargs.items() if k != "with_profiler"}
    limit = getattr(tuner, "inductor_meta", {}).get("spill_threshold", SPILL_THRESHOLD)
    if not getattr(tuner, "custom_kernel", False) and (getattr(launcher, "n_spills", 0)
                                                       or 0) > limit:
        return original(tuner, launcher, *args, **kwargs)
    written = set(getattr(tuner, "mutated_arg_names", ()) or ())
    names = list(getattr(getattr(tuner, "fn", None), "arg_names", ()) or ())
    try:
        copied = [_copy(a) if i < len(names) and names[i] in written else a
                  for i, a in enumerate(args)]
        kw = {k: _copy(v) if k in written else v for k, v in kwargs.items()}
    except RuntimeError:  # an argument whose strides overlap: Inductor's own way
        return original(tuner, launcher, *args, **kwargs)
    stream = _stream(copied)
    reset = getattr(tuner, "reset_to_zero_args", None)  # outputs a kernel adds into

    def call() -> None:
        if reset is not None:  # as Inductor's own bench does before each call
            reset(*copied, **kw)
        launcher(*copied, **kw, stream=stream)

    try:
        return float(timer.plain(call, [[]])) / 1e3
    except Exception as e:
        if "invalid configuration" in str(e).lower():
            return float("inf")
        raise


def tuned_compile(compile: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """``compile()`` (an Inductor compilation) run within ``timed_on_the_gpu``, and the
    function it gives with its first call so too (``tuned_on_the_gpu``)."""
    with timed_on_the_gpu():
        fn = compile()
    return tuned_on_the_gpu(fn)


def tuned_on_the_gpu(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a function Inductor compiled), its first call run within ``timed_on_the_gpu``:
    the call in which Inductor tunes its kernels; the later calls as they are."""
    tuned = [False]

    def call(*args: Any) -> Any:
        if tuned[0]:
            return fn(*args)
        with timed_on_the_gpu():
            out = fn(*args)
        tuned[0] = True
        return out

    return call


def _copy(x: Any) -> Any:
    """A tensor on ``x``'s device with its sizes, strides and values (a kernel indexes its
    arguments by their strides); anything else as it is."""
    if not isinstance(x, torch.Tensor):
        return x
    out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
    out.copy_(x)
    return out


def _stream(args: list[Any]) -> int:
    """The raw current CUDA stream where an argument is on a CUDA device (Inductor's launchers
    take one), else 0."""
    if any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        return int(torch.cuda.current_stream().cuda_stream)
    return 0


__all__ = ["REP_MS", "SPILL_THRESHOLD", "WARMUP_MS", "timed_bench", "timed_on_the_gpu",
           "tuned_compile", "tuned_on_the_gpu"]
