"""Deprecated module path (kept one release): ``egraph_mirage.extract.program_cost`` is now
``egraph_mirage.rank.cost_model``."""

from __future__ import annotations

import warnings
from typing import Any

from ..rank import cost_model as _moved

warnings.warn("egraph_mirage.extract.program_cost is deprecated; use egraph_mirage.rank.cost_model",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
