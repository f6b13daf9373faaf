"""Cost models and extraction of the cheapest term of an e-class."""

from .cost import DEFAULT_WEIGHTS, CostModel
from .extractor import Extractor

__all__ = ["DEFAULT_WEIGHTS", "CostModel", "Extractor"]
