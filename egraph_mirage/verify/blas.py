"""One BLAS thread while the numpy backend evaluates.

numpy's matrix products run in OpenBLAS, which by default starts a thread per core and lets the
threads spin while they wait for work. The verifier's products are small (attention's scores at
the paper's shapes are 0.3 G multiply-adds per test) and run beside other work: the search checks
candidates in a worker on every core. With the cores taken, the spinning threads wait for each
other: on a busy 2-core machine a (16, 128, 512) @ (16, 512, 64) product took 54 to 244 ms with
two threads and 10 ms with one. ``one_blas_thread()`` sets OpenBLAS to one thread for the
duration of a ``with`` block and restores the previous count after it.

OpenBLAS has no Python interface: its thread count is set through the library numpy loaded,
found among the process's mapped files (Linux). Elsewhere, or with another BLAS, the block runs
unchanged.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

#: the name prefixes and suffixes of OpenBLAS's thread functions in the builds numpy ships with
#: (``scipy_openblas_set_num_threads64_`` in numpy 2 wheels) and in plain builds
_PREFIXES = ("scipy_openblas", "openblas")
_SUFFIXES = ("64_", "")


@cache
def _openblas() -> tuple[tuple[Any, Any], ...]:
    """``(get_num_threads, set_num_threads)`` of each OpenBLAS library in the process."""
    try:
        with open("/proc/self/maps") as maps:
            files = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    except OSError:
        return ()
    paths = sorted(f for f in files if "openblas" in f.lower() and ".so" in f)
    found = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    found.append((get, put))
                    break
            else:
                continue
            break
    return tuple(found)


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with OpenBLAS on one thread (see the module docstring)."""
    libs = _openblas()
    before = [get() for get, _ in libs]
    for _, put in libs:
        put(1)
    try:
        yield
    finally:
        for (_, put), n in zip(libs, before):
            put(n)
