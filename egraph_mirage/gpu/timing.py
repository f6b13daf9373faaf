"""Timing of programs on a CUDA GPU: plain launches and CUDA-graph replay, on random inputs.

A program is any ``fn(*inputs) -> list of outputs`` (a lowered μGraph, a PyTorch baseline).
Two measurements, both the median of many runs after a warm-up, in microseconds:

* ``plain``: ``triton.testing.do_bench(..., return_mode="median")``, which flushes the L2 cache
  before every run; launch overhead is part of the figure.
* ``graph``: the calls are captured into one CUDA graph and its replays are timed with events;
  launch gaps shrink to what the graph leaves.
* ``back_to_back`` (``CudaTimer`` only): many plain calls in a row, timed together; a call's
  host time counts wherever it exceeds its GPU time.
* ``synced`` (``CudaTimer`` only): plain calls each waited for on the host before the next, as
  a decode loop that reads every step's result waits (``generate()``): host and GPU time add.

Inputs are normal random numbers times ``std`` (0.1 by default: ``exp(Q @ K)`` over 64-long dot
products then stays far from fp16's range), never zeros. When one set of inputs fits in the L2
cache, several copies are made and the runs cycle through them, so no run finds its inputs in
the cache that the previous run left (``rotation_count``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..dtypes import DType
from ..graph import KernelGraph

Program = Callable[..., Sequence[torch.Tensor]]
InputSet = list[torch.Tensor]

TORCH_DTYPES: dict[DType, torch.dtype] = {
    DType.float16: torch.float16, DType.bfloat16: torch.bfloat16, DType.float32: torch.float32,
}
#: L2 size assumed where the device does not report one (an H200 has 60 MB)
DEFAULT_L2_BYTES = 64 << 20


@dataclass(frozen=True)
class TimingConfig:
    """Knobs of the measurements (times in milliseconds, like ``do_bench``'s arguments)."""

    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    #: device time one CUDA-graph replay should take; the graph holds that many calls
    graph_replay_ms: float = 20.0
    graph_replays: int = 15
    max_graph_calls: int = 2000
    #: rotated input sets together cover this many times the L2 size...
    rotate_factor: float = 3.0
    #: ...with at most this many sets and this many bytes
    max_sets: int = 1024
    max_rotation_bytes: int = 2 << 30


class Timer(Protocol):
    """What the benchmark harness and the tuner need from a timer (a fake one in CPU tests)."""

    def plain(self, fn: Program, input_sets: Sequence[InputSet]) -> float:
        """Median µs of one call with plain launches."""
        ...

    def graph(self, fn: Program, input_sets: Sequence[InputSet]) -> float:
        """Median µs of one call under CUDA-graph replay."""
        ...


def graph_bytes(g: KernelGraph) -> int:
    """Bytes of one set of ``g``'s inputs."""
    return sum(math.prod(t.dims) * t.dtype.itemsize for t in g.inputs)


def rotation_count(set_bytes: int, l2_bytes: int, config: TimingConfig = TimingConfig()) -> int:
    """How many input sets to cycle through: enough that they cover ``rotate_factor`` × L2."""
    if set_bytes <= 0:
        return 1
    want = math.ceil(config.rotate_factor * l2_bytes / set_bytes)
    cap = max(1, min(config.max_sets, config.max_rotation_bytes // set_bytes))
    return max(1, min(want, cap))


def random_inputs(g: KernelGraph, device: str | torch.device = "cuda", seed: int = 0,
                  std: float = 0.1) -> InputSet:
    """One set of ``g``'s inputs: normal random numbers times ``std``, in each input's dtype."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return [(torch.randn(t.dims, generator=gen, device=device, dtype=torch.float32) * std)
            .to(TORCH_DTYPES[t.dtype]) for t in g.inputs]


def input_sets(g: KernelGraph, count: int, device: str | torch.device = "cuda", seed: int = 0,
               std: float = 0.1) -> list[InputSet]:
    """``count`` independent input sets (seeds ``seed``, ``seed + 1``, ...)."""
    return [random_inputs(g, device, seed + i, std) for i in range(count)]


def l2_bytes(device: torch.device | int | None = None) -> int:
    if not torch.cuda.is_available():
        return DEFAULT_L2_BYTES
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0)) or DEFAULT_L2_BYTES


def smem_per_block(device: torch.device | int | None = None) -> int | None:
    """Bytes of shared memory one block may take on the GPU (its opt-in limit), or None."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "shared_memory_per_block_optin", 0)) or None


def device_name(device: torch.device | int | None = None) -> str:
    if not torch.cuda.is_available():
        return "cpu"
    return torch.cuda.get_device_name(device or torch.cuda.current_device())


class _Cycle:
    """Calls ``fn`` on the next input set each time."""

    def __init__(self, fn: Program, input_sets: Sequence[InputSet]) -> None:
        self.fn, self.sets, self.i = fn, list(input_sets), 0

    def __call__(self) -> None:
        xs = self.sets[self.i % len(self.sets)]
        self.i += 1
        self.fn(*xs)


class CudaTimer:
    """Events on the current CUDA device; see the module docstring."""

    def __init__(self, config: TimingConfig = TimingConfig()) -> None:
        self.config = config

    def plain(self, fn: Program, input_sets: Sequence[InputSet]) -> float:
        import triton.testing

        with torch.no_grad():
            ms = triton.testing.do_bench(_Cycle(fn, input_sets), warmup=self.config.warmup_ms,
                                         rep=self.config.rep_ms, return_mode="median")
        return float(ms) * 1e3

    def graph(self, fn: Program, input_sets: Sequence[InputSet]) -> float:
        graph, calls = self._captured(fn, input_sets)
        times = [_event_ms(graph.replay) / calls for _ in range(self.config.graph_replays)]
        del graph
        return statistics.median(times) * 1e3

    def graphs(self, fns: Sequence[Program], input_sets: Sequence[InputSet], rounds: int
               ) -> list[float | None]:
        """Each of ``fns``' µs per call under CUDA-graph replay, as ``graph`` times one, their
        graphs captured once and replayed in alternation: ``rounds`` rounds, each replaying
        every graph ``graph_replays`` times; each one's fastest round's median counts. Two
        programs timed one after the other see the GPU's drift between them (the same compiled
        decode graph measured 4 % slower a minute later on an H200); in alternation a drift
        falls on both, and a slow spell only adds time. None for a program whose calls cannot
        be captured (a graph that records CUDA graphs of its own)."""
        captured: list[tuple[Any, int] | None] = []
        for fn in fns:
            try:
                captured.append(self._captured(fn, input_sets))
            except Exception:  # not capturable: the caller times it otherwise
                captured.append(None)
        rounds_ms: list[list[float]] = [[] for _ in fns]
        for _ in range(rounds):
            for got, one in zip(captured, rounds_ms):
                if got is not None:
                    graph, calls = got
                    one.append(statistics.median([_event_ms(graph.replay) / calls
                                                  for _ in range(self.config.graph_replays)]))
        del captured
        return [min(one) * 1e3 if one else None for one in rounds_ms]

    def _captured(self, fn: Program, input_sets: Sequence[InputSet]) -> tuple[Any, int]:
        """A CUDA graph of as many calls of ``fn`` (cycling through ``input_sets``) as take
        about ``graph_replay_ms``, warmed up off the capture and uploaded, and its calls."""
        c = self.config
        call = _Cycle(fn, input_sets)
        with torch.no_grad():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture (compiles, autotunes)
                for _ in range(max(3, len(input_sets))):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            estimate = _event_ms(lambda: [call() for _ in range(5)]) / 5
            calls = int(c.graph_replay_ms / estimate) if estimate > 0 else c.max_graph_calls
            calls = max(len(input_sets), min(c.max_graph_calls, max(1, calls)))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(calls):
                    call()
            graph.replay()  # the first replay uploads the graph
            torch.cuda.synchronize()
        return graph, calls

    def back_to_back(self, fn: Program, input_sets: Sequence[InputSet], calls: int = 200,
                     repeats: int = 7) -> float:
        """Median µs of one call among ``calls`` plain calls issued back to back (no L2 flush
        between them, no wait for the GPU): what a call costs in a loop of plain launches, the
        larger of its GPU time and its host time. ``plain``'s flush before every run hides up to
        the flush's duration of host time, which is all of a small piece's."""
        call = _Cycle(fn, input_sets)
        with torch.no_grad():
            for _ in range(max(3, len(input_sets))):
                call()
            torch.cuda.synchronize()
            times = [_event_ms(lambda: [call() for _ in range(calls)]) / calls
                     for _ in range(repeats)]
        return statistics.median(times) * 1e3

    def synced(self, fn: Program, input_sets: Sequence[InputSet], calls: int = 20) -> float:
        """µs of one call among ``calls`` plain calls, each waited for (the GPU synchronized)
        before the next is issued, by the host's clock: its host time and its GPU time in
        series, as a step of a decode loop that reads each step's result (``generate()``'s stop
        check) costs. A warm-up call first."""
        call = _Cycle(fn, input_sets)
        with torch.no_grad():
            call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                call()
                torch.cuda.synchronize()
            return (time.perf_counter() - start) / calls * 1e6

    def kernels(self, fn: Program, input_sets: Sequence[InputSet], calls: int = 20
                ) -> dict[str, float]:
        """Device time of each GPU kernel ``fn`` launches, µs per call, by kernel name (torch's
        profiler over ``calls`` plain calls after a warm-up): where a program's time goes."""
        from torch.profiler import ProfilerActivity, profile

        call = _Cycle(fn, input_sets)
        with torch.no_grad():
            for _ in range(3):
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
        out: dict[str, float] = {}
        for e in prof.key_averages():
            us = float(getattr(e, "device_time_total", 0.0) or 0.0)
            if us > 0:
                out[e.key[:80]] = out.get(e.key[:80], 0.0) + us / calls
        return out


def _event_ms(work: Callable[[], object]) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end))
