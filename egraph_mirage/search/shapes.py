"""Deprecated module path (kept one release): ``egraph_mirage.search.shapes`` is now
``egraph_mirage.search.tiling``."""

from __future__ import annotations

import warnings
from typing import Any

from . import tiling as _moved

warnings.warn("egraph_mirage.search.shapes is deprecated; use egraph_mirage.search.tiling",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
