"""Deprecated module path (kept one release): ``egraph_mirage.search.profile`` is now
``egraph_mirage.rank.measured``."""

from __future__ import annotations

import warnings
from typing import Any

from ..rank import measured as _moved

warnings.warn("egraph_mirage.search.profile is deprecated; use egraph_mirage.rank.measured",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
