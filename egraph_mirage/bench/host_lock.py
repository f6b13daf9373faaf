"""Benchmarks sharing a host take turns at timing (``HostLock``).

On a host of several GPUs, ``scripts/gpu_torch.sh`` and ``scripts/gpu_generate.sh`` run one
benchmark per GPU side by side. Plain launches of a decode step are bound by the host, and a
neighbour's compilation (searches on every core of its share, Inductor's compile workers) slows
the host: an H200 host's plain rounds of one Qwen3 layer at b = 8 measured 305, 636 and 661 µs
while the benchmark of the other GPU compiled, where the backend had measured the same code at
211 µs alone. So, given a lock file, each benchmark compiles holding it shared (compilations run
side by side) and times holding it exclusively: no timing runs beside a compilation or another
timing. Without a path nothing is locked.

What this cannot keep apart: the backend's own timings during its compilation (``fx.whole``, a
piece against Inductor's code) run while it holds the lock shared, beside the other benchmark's
compilation.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostLock:
    """The lock file ``path`` the benchmarks of one host share (None: no lock)."""

    path: str | None = None

    @contextlib.contextmanager
    def compiling(self) -> Iterator[None]:
        """Held shared while the block runs: compilations run side by side."""
        with self._held(fcntl.LOCK_SH):
            yield

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        """Held exclusively while the block runs: nothing else of the host's benchmarks runs."""
        with self._held(fcntl.LOCK_EX):
            yield

    @contextlib.contextmanager
    def _held(self, how: int) -> Iterator[None]:
        if self.path is None:
            yield
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def add_argument(p: Any) -> None:
    """A bench command's ``--host-lock PATH`` option."""
    p.add_argument("--host-lock", metavar="PATH", default=None,
                   help="a lock file shared with the benchmarks of other GPUs of this host: "
                   "compile holding it shared, time holding it exclusively, so that no timing "
                   "runs beside another's compilation (default: none)")


__all__ = ["HostLock", "add_argument"]
