"""The superoptimizer: e-graph-guided search over μGraphs (see ``driver.superoptimize``)."""

from .config import SearchConfig, SearchError
from .driver import superoptimize
from .results import SearchResult, SearchResults, SearchStats

__all__ = ["SearchConfig", "SearchError", "SearchResult", "SearchResults", "SearchStats",
           "superoptimize"]
