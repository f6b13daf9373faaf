"""What the backend's tests share (``test_backend*.py``): small functions to compile, their
inputs, a stand-in search that returns a chosen program as its one result, and the options
the tests compile with (one worker, a 60 s budget, the rest run as is)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import egraph_mirage as em
from egraph_mirage.search.results import SearchResult, SearchResults, SearchStats


def relu_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w) * 2


def rms_mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=1e-6) @ w


def inputs(dtype: torch.dtype = torch.float16, rows: int = 2) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(rows, 64, generator=gen).to(dtype),
            torch.randn(64, 96, generator=gen).to(dtype))


class StandIn:
    """A search that returns ``winner(g)`` (default: the piece's own program ``g``) as its one
    result, and counts its calls."""

    def __init__(self, winner: Any = None) -> None:
        self.calls = 0
        self.winner = winner
        self.__qualname__ = f"StandIn.{getattr(winner, '__name__', 'same')}"

    def __call__(self, g: em.KernelGraph, config: Any, **options: Any) -> SearchResults:
        self.calls += 1
        winner = self.winner(g) if self.winner else g
        return SearchResults([SearchResult(winner, 0, 1e-6, 0.0, 2, 0.0, 0.0)], SearchStats())


def scaled_by_three(g: em.KernelGraph) -> em.KernelGraph:
    """A program of ``g``'s inputs that is not ``g``: relu(x @ w) * 3."""
    h = em.new_kernel_graph()
    x, w = (h.new_input(t.dims, dtype=t.dtype) for t in g.inputs)
    h.mark_output(h.mul_scalar(h.relu(h.matmul(x, w)), 3.0))
    return h


def ops_called(fn: Any, *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)`` (compiled by a first call) under the profiler, and the names of the
    backend's custom ops it ran."""
    fn(*args)
    with torch.profiler.profile() as prof:
        out = fn(*args)
    return out, [e.name for e in prof.events() if e.name.startswith("egraph_mirage::")]


def options(tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"cache_dir": str(tmp_path), "workers": 1, "budget": 60, "rest": "eager", **more}
