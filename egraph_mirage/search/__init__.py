"""The search stage: e-graph-guided enumeration of μGraphs (``prepare``, ``tasks``, ``run``).

The pipeline (``egraph_mirage.pipeline``) drives it; ``em.superoptimize`` is the entry point.
"""

from .config import SearchConfig, SearchError
from .results import SearchResult, SearchResults, SearchStats

__all__ = ["SearchConfig", "SearchError", "SearchResult", "SearchResults", "SearchStats"]
