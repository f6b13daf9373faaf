"""The worker processes of a search (``superoptimize(workers=N)``, N > 1).

Workers are started with the ``spawn`` method: fresh interpreters, so neither egglog's nor
JAX's threads of the calling process are forked. Four things differ from a plain
``ProcessPoolExecutor(mp_context=get_context("spawn"))``:

- **A main module that cannot be imported is left out.** A spawned interpreter first imports
  the main module of the process that started it (so that what is defined there, an operator
  registered at the top of a script for instance, exists in the worker too). A main module
  read from stdin (``python - <<EOF``) has no file to import from: the pool would break on its
  first task. Such a main module is hidden while each worker is launched (a search's tasks need
  nothing from it), so ``python -`` works like ``python -c``, a script or a notebook. A script
  is imported as usual, so it must start its search under ``if __name__ == "__main__":``.
- **Workers ignore Ctrl-C.** A Ctrl-C at a terminal reaches every process of the foreground
  group; the searching process alone decides what happens (it keeps what was found and stops
  the workers), instead of every worker printing a traceback.
- **Stopping early is prompt** (``stop``): queued tasks are cancelled and running workers are
  terminated, rather than waited for until their tasks end.
- **The cores are shared out.** Each worker's BLAS and OpenMP thread pools (numpy's products
  in the numeric check, at real sizes) get the machine's cores divided among the workers
  (``THREAD_VARIABLES``, where the caller has not set them): otherwise every worker starts a
  thread per core, and 15 workers on 16 cores run 240 threads.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import multiprocessing.context
import multiprocessing.process
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

#: seconds a terminated worker is given to end before it is killed
TERMINATE_GRACE_S = 1.0
#: the thread counts of the libraries a worker computes with, set in each worker's environment
#: (where the caller has not set them) to its share of the cores
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Ctrl-C is ignored inside (in the main thread; elsewhere signals cannot be changed, and
    this does nothing). Processes started inside inherit the ignoring."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):  # a handler Python cannot restore
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """A Ctrl-C inside is held back and raised as ``KeyboardInterrupt`` at the end, so that
    what is inside (recording a finished task, writing a file) is done whole. Main thread
    only; elsewhere this does nothing."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is None):
        yield
        return
    caught: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if caught:
        raise KeyboardInterrupt


def _main_importable(main: Any) -> bool:
    """Whether a spawned worker can import ``main`` as ``multiprocessing`` will try to: by its
    module name (``python -m``), else from its file; a main module with neither (``python -c``,
    a notebook) is not imported at all."""
    if getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return True
    path = getattr(main, "__file__", None)
    if path is None:
        return True
    if not os.path.isabs(path) and multiprocessing.process.ORIGINAL_DIR is not None:
        path = os.path.join(multiprocessing.process.ORIGINAL_DIR, path)
    return os.path.isfile(path)


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """When a worker could not import the caller's main module (``_main_importable``), its
    ``__file__`` and ``__spec__`` are taken away while the worker is launched, then put back:
    ``multiprocessing`` then does not try."""
    main = sys.modules.get("__main__")
    if main is None or _main_importable(main):
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__dict__["__spec__"] = None
    try:
        yield
    finally:
        main.__dict__.pop("__file__", None)
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    """``THREAD_VARIABLES`` not set by the caller are ``count`` while a worker is launched (a
    spawned process takes the environment it is started with), then unset again."""
    added = [v for v in THREAD_VARIABLES if v not in os.environ]
    os.environ.update(dict.fromkeys(added, str(count)))
    try:
        yield
    finally:
        for v in added:
            os.environ.pop(v, None)


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A spawned process that starts without the caller's main module, ignoring Ctrl-C, with
    ``threads`` threads for its libraries (set by ``_WorkerContext``)."""

    threads = 1

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        with sigint_ignored(), _main_module_hidden(), _threads(process_obj.threads):
            return multiprocessing.context.SpawnProcess._Popen(process_obj)


class _WorkerContext(multiprocessing.context.SpawnContext):
    def __init__(self, threads: int) -> None:
        super().__init__()
        self.threads = threads

    def Process(self, *args: Any, **kwargs: Any) -> _WorkerProcess:
        p = _WorkerProcess(*args, **kwargs)
        p.threads = self.threads
        return p


def _ignore_sigint() -> None:
    """Each worker's initializer: Ctrl-C is for the searching process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def worker_pool(n: int) -> cf.ProcessPoolExecutor:
    """A pool of ``n`` spawned workers that need no main module, ignore Ctrl-C and share the
    machine's cores (each its share of them for its libraries' threads)."""
    threads = max(1, (os.cpu_count() or 1) // max(1, n))
    return cf.ProcessPoolExecutor(n, mp_context=_WorkerContext(threads),
                                  initializer=_ignore_sigint)


def _ready(hold: float) -> int:
    """A warm-up task: import what a search task imports, then hold the worker ``hold``
    seconds so that the other warm-up tasks go to the other workers."""
    import jax.numpy  # noqa: F401  (the verifier's)


    time.sleep(hold)
    return os.getpid()


def warm(executor: cf.ProcessPoolExecutor, n: int, hold: float = 0.2) -> int:
    """Start the pool's ``n`` workers and import the search into each before the first task,
    so that a time budget given afterwards is spent searching. Returns how many distinct
    workers answered (fewer when some took two warm-up tasks)."""
    return len({f.result() for f in [executor.submit(_ready, hold) for _ in range(n)]})


def broken(executor: cf.Executor) -> bool:
    """Whether ``executor`` is a process pool one of whose workers died: it takes no more
    tasks (``concurrent.futures`` keeps that in a private attribute; no public one says it)."""
    return bool(getattr(executor, "_broken", False))


def stop(executor: cf.ProcessPoolExecutor) -> None:
    """Cancel the queued tasks and end the workers now; the tasks they were running are lost.
    Takes at most about ``2 * TERMINATE_GRACE_S`` seconds; Ctrl-C is ignored meanwhile, so a
    second one cannot leave workers behind."""
    with sigint_ignored():
        procs = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + TERMINATE_GRACE_S
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(TERMINATE_GRACE_S)
        # the pool's manager thread sees its workers gone and ends
        executor.shutdown(wait=True)
