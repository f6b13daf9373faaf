"""What the search tests share: a small search space and how results are compared."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from egraph_mirage.search import SearchConfig

#: a search space small enough to enumerate completely in a few seconds (about 24 one-kernel
#: μGraphs of RMSNorm + Linear at small shapes)
TINY = SearchConfig(max_block_ops=4, max_kernels=1, max_kernel_ops=0)


def texts(results: Iterable[Any]) -> list[str]:
    """The results' μGraphs as JSON text, in order: equal lists mean the same results."""
    return [r.to_json() for r in results]
