"""What the GPU probes share: the host's time to issue calls."""

from __future__ import annotations

import time
from typing import Any

import torch


def host_us(fn: Any, xs: Any, n: int = 300) -> tuple[float, float]:
    """µs per call on the host: issuing ``n`` calls back to back; and until they finished."""
    with torch.no_grad():
        for _ in range(10):
            fn(*xs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*xs)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6
