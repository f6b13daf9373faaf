"""Each mode of a benchmark compiled with Inductor caches of its own (``own_caches``).

Inductor keeps what it compiled in caches keyed by a kernel's source: on disk, under
``TORCHINDUCTOR_CACHE_DIR`` (compiled graphs; each kernel's chosen block sizes), and in the
process (``CompiledTritonKernels``: the kernel itself, tuned at its first call). Modes compiled
one after another in one process share every kernel of the same source, tuning and all, so
that a mode's figure would carry the tuning of whichever mode compiled that kernel first: a
draw of Inductor's coordinate descent, which differs from one compilation to the next
(``fx.inductor_tuning``), or the backend's tuning by GPU time.

Within ``own_caches(mode)`` Inductor's cache directory is the mode's own, ``mode-<mode>`` in the
one the process had (the same in every run, so that a later run of the mode, a cached
recompile, finds it), and with ``fresh=True`` the in-process kernel cache starts empty. What
was compiled before keeps working: each compiled function holds its own kernels.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator

#: the environment variable that names Inductor's cache directory
CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"


@contextlib.contextmanager
def own_caches(mode: str, fresh: bool = True) -> Iterator[str]:
    """Inductor's caches for ``mode`` while the block runs (module docstring); yields the
    directory. ``fresh``: the kernels this process compiled before are not taken up (False: a
    second compilation of the mode in the same process, which may take up its own)."""
    previous = os.environ.get(CACHE_DIR)
    path = os.path.join(previous or _inductor_cache_dir(),
                        "mode-" + re.sub(r"[^A-Za-z0-9_.-]", "_", mode))
    os.makedirs(path, exist_ok=True)
    if fresh:
        _forget_kernels()
    os.environ[CACHE_DIR] = path
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(CACHE_DIR, None)
        else:
            os.environ[CACHE_DIR] = previous


def _inductor_cache_dir() -> str:
    """The directory Inductor caches in where ``CACHE_DIR`` is not set."""
    try:
        from torch._inductor.runtime.runtime_utils import cache_dir

        return str(cache_dir())
    except ImportError:  # a torch without Inductor's runtime, which compiles nothing here
        return os.path.join(tempfile.gettempdir(), "torchinductor")


def _forget_kernels() -> None:
    """Inductor's in-process cache of compiled Triton kernels emptied, where it has one."""
    try:
        from torch._inductor.async_compile import CompiledTritonKernels
    except ImportError:
        return
    CompiledTritonKernels.cache_clear()


__all__ = ["CACHE_DIR", "own_caches"]
