"""Inductor's tuning of its kernels timed as the GPU runs them (``fx.inductor_tuning``): each
config Inductor tries is timed by our timer, on copies of the arguments the kernel writes, while
the backend compiles and while the compiled function makes its first call."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from egraph_mirage.fx import rest
from egraph_mirage.fx.inductor_tuning import timed_bench, timed_on_the_gpu, tuned_on_the_gpu

heuristics = pytest.importorskip("torch._inductor.runtime.triton_heuristics")


class OnceTimer:
    """Calls the timed function once and says it took ``us``."""

    def __init__(self, us: float = 7.0, error: Exception | None = None) -> None:
        self.us, self.error, self.calls = us, error, 0

    def plain(self, fn: Any, input_sets: Any) -> float:
        self.calls += 1
        if self.error is not None:
            raise self.error
        for xs in input_sets:
            fn(*xs)
        return self.us


class Launcher:
    """A compiled config of a kernel: records what it was launched with and writes its
    second argument, as a kernel that stores into an output would."""

    def __init__(self, n_spills: int = 0) -> None:
        self.n_spills, self.seen = n_spills, []

    def __call__(self, *args: Any, stream: int) -> None:
        self.seen.append((args, stream))
        args[1].fill_(5.0)


def _tuner(resets: list[Any] | None = None) -> SimpleNamespace:
    """What Inductor's ``CachingAutotuner`` tells about a kernel that writes ``out_ptr0``;
    ``resets`` records its ``reset_to_zero_args`` calls."""
    return SimpleNamespace(fn=SimpleNamespace(arg_names=["in_ptr0", "out_ptr0", "xnumel"]),
                           mutated_arg_names=["out_ptr0"], inductor_meta={},
                           custom_kernel=False,
                           reset_to_zero_args=lambda *a, **k: (resets if resets is not None
                                                               else []).append(a))


def test_within_the_block_each_config_is_timed_by_the_timer_on_copies_of_what_it_writes() -> None:
    original = heuristics.CachingAutotuner.bench
    x = torch.randn(4, 8)
    out = torch.zeros(8, 4).t()  # strided: the copy keeps the strides the kernel indexes by
    launcher, timer, resets = Launcher(), OnceTimer(7.0), []
    with timed_on_the_gpu(timer):
        assert heuristics.CachingAutotuner.bench is not original
        ms = heuristics.CachingAutotuner.bench(_tuner(resets), launcher, x, out, 32)
    assert heuristics.CachingAutotuner.bench is original
    assert ms == pytest.approx(7.0e-3)  # Inductor's benchmarks are in ms
    (args, stream), = launcher.seen
    assert args[0] is x and args[2] == 32 and stream == 0  # no CUDA tensor: stream 0
    assert args[1] is not out and args[1].stride() == out.stride()
    assert bool((out == 0).all())  # the kernel's writes went to the copy
    assert len(resets) == 1 and resets[0][1] is args[1]  # the copies reset before the call


def test_a_config_that_spills_goes_to_inductors_own_bench_and_one_that_cannot_launch_is_inf(
        ) -> None:
    calls: list[Any] = []

    def inductors(tuner: Any, launcher: Any, *args: Any, **kwargs: Any) -> float:
        calls.append(launcher)
        return float("inf")

    x, out = torch.randn(4), torch.zeros(4)
    timer = OnceTimer()
    spilling = Launcher(n_spills=100)
    assert timed_bench(_tuner(), spilling, (x, out, 4), {}, timer, inductors) == float("inf")
    assert calls == [spilling] and timer.calls == 0
    invalid = OnceTimer(error=RuntimeError("CUDA error: invalid configuration argument"))
    assert timed_bench(_tuner(), Launcher(), (x, out, 4), {}, invalid, inductors) == \
        float("inf")
    other = OnceTimer(error=RuntimeError("out of memory"))
    with pytest.raises(RuntimeError, match="out of memory"):
        timed_bench(_tuner(), Launcher(), (x, out, 4), {}, other, inductors)


def test_a_compiled_function_tunes_so_in_its_first_call_only() -> None:
    original = heuristics.CachingAutotuner.bench
    patched: list[bool] = []

    def compiled(a: int, b: int) -> int:
        patched.append(heuristics.CachingAutotuner.bench is not original)
        return a + b

    fn = tuned_on_the_gpu(compiled)
    assert fn(1, 2) == 3 and fn(3, 4) == 7
    assert patched == [True, False]
    assert heuristics.CachingAutotuner.bench is original


def test_the_rest_is_compiled_and_first_called_with_the_tuning_timed_on_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor.compile_fx as inductor

    original = heuristics.CachingAutotuner.bench
    seen: list[tuple[str, bool]] = []

    def state(when: str) -> None:
        seen.append((when, heuristics.CachingAutotuner.bench is not original))

    def compile_fx(module: Any, inputs: Any, config_patches: Any = None) -> Any:
        state("compile")

        def run(*args: Any) -> Any:
            state("call")
            return module(*args)

        return run

    monkeypatch.setattr(inductor, "compile_fx", compile_fx)
    gm = torch.fx.symbolic_trace(lambda a: a * 2)
    fn = rest.compile_rest(gm, [torch.ones(3)], "inductor", None)
    outs = [fn(torch.ones(3)) for _ in range(2)]
    assert all(torch.equal(o, torch.full((3,), 2.0)) for o in outs)
    # compiled and first called so (the call that tunes), the second call as it is
    assert seen == [("compile", True), ("call", True), ("call", False)]
