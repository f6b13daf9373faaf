"""The few calls egraph-mirage makes into egglog's raw bindings, for egglog 13.x and 14.x alike.

egglog is imported lazily so that code which never builds an e-graph (the GPU side) does not
need it.

egglog is written in Rust: when it panics (a rule given twice, for instance) Rust writes the
panic message, and with ``RUST_BACKTRACE`` set a backtrace of a hundred lines, straight to file
descriptor 2 before Python sees the exception. ``NativeStderr`` captures that output around a
call, so the caller can turn the failure into a one-line error.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from types import TracebackType
from typing import Any


def new_egraph() -> Any:
    from egglog import bindings

    return bindings.EGraph()


def run_text(egraph: Any, text: str) -> list[Any]:
    """Parse and run egglog program text; returns egglog's outputs (raises egglog's error)."""
    if hasattr(egraph, "parse_and_run_program"):  # egglog >= 14
        return list(egraph.parse_and_run_program(text))
    return list(egraph.run_program(*egraph.parse_program(text)))


def egglog_error_types() -> tuple[type[BaseException], ...]:
    from egglog import bindings

    return tuple(t for t in (getattr(bindings, "EggSmolError", None),) if t is not None) or (
        Exception,
    )


def last_run_updated(outputs: list[Any]) -> bool:
    """Whether the ``(run 1)`` whose outputs are given changed the e-graph."""
    for out in reversed(outputs):
        report = getattr(out, "report", None)
        if report is not None:
            return bool(report.updated)
    raise RuntimeError("egglog returned no run report for (run 1)")


def count_rows(egraph: Any, functions: frozenset[str]) -> int:
    """Number of e-nodes: rows of the given constructor functions."""
    frozen = egraph.freeze()
    return sum(len(f.rows) for name, f in frozen.functions.items() if name in functions)


def serialize_json(egraph: Any) -> str:
    return egraph.serialize([]).to_json()


#: one redirection of file descriptor 2 at a time in the process (each saves and restores it)
_FD2_LOCK = threading.RLock()


class NativeStderr:
    """Captures what native code writes to file descriptor 2 while the block runs.

    ``with NativeStderr() as err: ...``: when the block succeeds the captured text is written
    back to descriptor 2 afterwards (nothing is lost, e.g. output of other threads); when it
    raises, the text is kept in ``err.text`` and not shown, so that the caller can put its
    meaningful line into its own error message (``failure_message``). Where descriptor 2 cannot
    be redirected (closed), the block runs without capture.
    """

    def __init__(self) -> None:
        self.text = ""
        self._saved: int | None = None
        self._tmp: Any = None

    def __enter__(self) -> NativeStderr:
        _FD2_LOCK.acquire()
        try:
            if sys.stderr is not None:
                sys.stderr.flush()
            self._tmp = tempfile.TemporaryFile()
            self._saved = os.dup(2)
            os.dup2(self._tmp.fileno(), 2)
        except Exception:  # no capture possible: run the block as it is
            try:
                self._restore()
            finally:
                self.text = ""
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._restore()
            failed = kind is not None and not issubclass(kind, (KeyboardInterrupt, SystemExit))
            if self.text and not failed:
                os.write(2, self.text.encode())
        finally:
            _FD2_LOCK.release()

    def _restore(self) -> None:
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
            self._saved = None
        if self._tmp is not None:
            self._tmp.seek(0)
            self.text = self._tmp.read().decode(errors="replace")
            self._tmp.close()
            self._tmp = None


_NOISE = re.compile(r"thread '.*' panicked at|stack backtrace:|note: |\s*\d+: |\s+at |"
                    r"\s*\.\.\.\s*$")


def meaningful_line(stderr_text: str) -> str:
    """The first line of captured native output that says what went wrong: not the
    "thread ... panicked at" header, backtrace frames or notes; empty when there is none."""
    for line in stderr_text.splitlines():
        if line.strip() and not _NOISE.match(line):
            return line.strip()
    return ""


def failure_message(exc: BaseException, stderr_text: str = "") -> str:
    """One line for an egglog failure: its message (egglog's offsets within the form left out),
    with the meaningful line of what it wrote to descriptor 2 when that adds something."""
    msg = str(exc).strip() or type(exc).__name__
    msg = re.sub(r"\bIn \d+:\d+-\d+(:\d+)?:\s*", "", msg)
    msg = re.sub(r"\s+", " ", msg)
    extra = meaningful_line(stderr_text)
    if extra and extra not in msg:
        msg = f"{msg} ({extra})" if msg != type(exc).__name__ else extra
    return msg[:400]


def is_interrupt(exc: BaseException) -> bool:
    """Interrupts pass through; every other failure of an egglog call (egglog's errors, and
    its panics, which arrive as pyo3's ``PanicException``, a BaseException) is reported."""
    return isinstance(exc, (KeyboardInterrupt, SystemExit))
