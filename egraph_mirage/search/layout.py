"""Deprecated module path (kept one release): ``egraph_mirage.search.layout`` is now
``egraph_mirage.search.outdir``."""

from __future__ import annotations

import warnings
from typing import Any

from . import outdir as _moved

warnings.warn("egraph_mirage.search.layout is deprecated; use egraph_mirage.search.outdir",
              DeprecationWarning, stacklevel=2)


def __getattr__(name: str) -> Any:
    return getattr(_moved, name)
