"""Ranking μGraphs, in one place.

- ``lower.cost_model.ProgramCost``: the estimate without a GPU (per launch, the longer of
  moving its bytes and computing, at the share of the GPU its blocks occupy); ``by_cost`` orders the
  search's verified results by it.
- ``measured``: ranking by time measured on a GPU — the search's ``profile`` stage
  (``profile_stage``, ``GpuProfiler``) and ``rank`` (candidates ordered by a tuner's times, used
  by ``bench gpu``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..mugraph.serialize import dumps
from .measured import (
    PROFILE_SIZES,
    SEARCH_SHARE,
    GpuProfiler,
    Profiler,
    cuda_available,
    for_inputs,
    keep_jax_off_the_gpu,
    profile_stage,
)


def cost_key(result: Any) -> tuple[float, int, str]:
    """The cost model's order of search results: estimated time, then fewer kernels, then the
    μGraph's JSON text (so that equal estimates still give one order on every machine)."""
    return (result.estimated_seconds, result.num_kernels, dumps(result.graph))


def by_cost(results: Sequence[Any]) -> list[Any]:
    """Search results (``SearchResult``) best first by the cost model (``cost_key``)."""
    return sorted(results, key=cost_key)


__all__ = ["PROFILE_SIZES", "SEARCH_SHARE", "GpuProfiler", "Profiler", "by_cost", "cost_key",
           "cuda_available", "for_inputs", "keep_jax_off_the_gpu", "profile_stage"]
