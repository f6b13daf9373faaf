"""The superoptimizer: e-graph-guided search over μGraphs (see ``driver.superoptimize``)."""

from ..pipeline.stages import superoptimize
from .config import SearchConfig, SearchError
from .results import SearchResult, SearchResults, SearchStats

__all__ = ["SearchConfig", "SearchError", "SearchResult", "SearchResults", "SearchStats",
           "superoptimize"]
