"""E-graph snapshots (plain data, ``snapshot``) and extraction of the cheapest term of an
e-class from one (``Extractor`` under a ``CostModel``). The oracle builds snapshots; it sits
above this package."""

from .cost import DEFAULT_WEIGHTS, CostModel
from .extractor import Extractor
from .snapshot import NodeKey, Snapshot

__all__ = ["DEFAULT_WEIGHTS", "CostModel", "Extractor", "NodeKey", "Snapshot"]
