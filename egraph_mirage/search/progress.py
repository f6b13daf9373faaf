"""How a running search reports itself on stderr (``superoptimize(progress=...)``).

On a terminal, one status line is rewritten in place after every finished task. In a Jupyter
notebook, a tqdm progress bar over the tasks (a widget where ``ipywidgets`` is installed, else
tqdm's text bar), the status in its postfix. Elsewhere (a log file, a pipe, a CI job) a line is
appended every ``interval`` seconds, and one for each new result, each starting with the seconds
since the search began::

    [   12.4 s] tasks 30/292 | states 1,204 | pruned 20,311 by e-graph, 290 other | ...
    [   13.0 s] found result 1: 1 kernel(s), ~3.1 µs estimated

A resumed search says so first: how many tasks the checkpoint held, and how many results.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from .results import SearchResult, SearchStats

#: seconds between two log lines when stderr is not a terminal
LOG_INTERVAL_S = 5.0

OFF, LINE, LOG, BAR = "off", "line", "log", "bar"


def mode(progress: bool | None) -> str:
    """``progress=False``: nothing; otherwise the status line on a terminal, the tqdm bar in a
    notebook, else the log."""
    if progress is False:
        return OFF
    if in_notebook():
        return BAR
    isatty = getattr(sys.stderr, "isatty", None)
    return LINE if callable(isatty) and isatty() else LOG


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell is running)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _tqdm() -> Any:
    """tqdm's notebook bar where ipywidgets is installed (it draws one), else its text bar."""
    try:
        import ipywidgets  # noqa: F401
        from tqdm.notebook import tqdm
    except ImportError:
        from tqdm.std import tqdm
    return tqdm


class Progress:
    """The reporter of one search; ``t_start`` is its ``time.perf_counter()`` at the start."""

    def __init__(self, how: str, interval: float, t_start: float) -> None:
        self.how, self.interval, self.t_start = how, interval, t_start
        self._last = -float("inf")
        self._line_open = False
        self._bar: Any = None  # the tqdm bar (BAR), made when the search starts

    @property
    def on(self) -> bool:
        return self.how != OFF

    def _write(self, text: str) -> None:
        stream = sys.stderr  # looked up each time: a caller may redirect it meanwhile
        if self.how == LINE:
            stream.write("\r" + text[:200])
            self._line_open = True
        else:
            stream.write(f"[{time.perf_counter() - self.t_start:9.1f} s] {text}\n")
        stream.flush()

    def _say(self, text: str) -> None:
        """A line of its own, in any mode."""
        if self.how == OFF:
            return
        if self.how == BAR:
            if self._bar is not None:
                self._bar.write(text, file=sys.stderr)
            else:
                sys.stderr.write(text + "\n")
            return
        if self.how == LINE:
            self._end_line()
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
        else:
            self._write(text)

    def _end_line(self) -> None:
        if self._line_open:
            sys.stderr.write("\n")
            self._line_open = False

    def verifying(self, path: Any, results: int) -> None:
        self._say(f"verifying the {results} result(s) stored in {path} again")

    def resumed(self, path: Any, tasks: int, total: int, results: int, dropped: int,
                cut: int = 0) -> None:
        note = f", {dropped} dropped (failed verification again)" if dropped else ""
        part = f" ({cut} more cut short, resumed where they stopped)" if cut else ""
        self._say(f"resumed from {path}: {tasks} of {total} tasks done before{part}, {results} "
                  f"stored result(s) verified again{note}")

    def started(self, todo: int, total: int, workers: str) -> None:
        self._say(f"searching {todo} of {total} tasks ({workers})")
        if self.how == BAR and self._bar is None:
            options = dict(total=total, desc="search", unit="task", file=sys.stderr,
                           dynamic_ncols=True)
            try:
                self._bar = _tqdm()(**options)
            except Exception:  # a widget that cannot be shown (old ipywidgets): the text bar
                from tqdm.std import tqdm

                self._bar = tqdm(**options)

    def left_behind(self, tasks: int) -> None:
        self._say(f"the time budget is spent: {tasks} task(s) still running are left behind "
                  "(what they found since they started is lost)")

    def worker_lost(self, again: int, retried: int, lost: int, new_pool: bool) -> None:
        """A worker process died: the tasks in flight run again (on a new pool) or are lost."""
        then = (f"{again} task(s) in flight run again on a new pool ({retried} of them were "
                "in a worker)" if new_pool else f"{again} task(s) in flight cannot run again")
        gone = f"; {lost} task(s) lost (in a worker when one died twice)" if lost else ""
        self._say(f"a worker process died (killed by memory, a signal or a crash): {then}{gone}")

    def found(self, result: SearchResult, count: int) -> None:
        if self.how == LOG:
            self._write(f"found result {count}: {result.num_kernels} kernel(s), "
                        f"~{result.estimated_seconds * 1e6:.1f} µs estimated")

    def update(self, stats: SearchStats, results: Mapping[str, SearchResult],
               force: bool = False, idle: bool = False) -> None:
        """The status line after a finished task; in the log, only every ``interval`` seconds
        (or when ``force``). ``idle``: no task finished, the search only says it is alive (in
        the log at most once a second)."""
        if self.how == OFF or (idle and self.how == LINE):
            return
        if self.how == BAR:
            if self._bar is not None and not idle:
                self._bar.n = stats.tasks_done
                self._bar.set_postfix_str(status(stats, results).split(" | ", 1)[1],
                                          refresh=True)
            return
        now = time.perf_counter()
        gap = max(self.interval, 1.0) if idle else self.interval
        if self.how == LOG and not force and now - self._last < gap:
            return
        self._last = now
        self._write(status(stats, results))

    def close(self, stats: SearchStats, results: Mapping[str, SearchResult]) -> None:
        if self.how == LOG:
            self.update(stats, results, force=True)
        if self._bar is not None:
            self.update(stats, results, force=True)
            self._bar.close()
            self._bar = None
        self._end_line()


def status(stats: SearchStats, results: Mapping[str, SearchResult]) -> str:
    """One line: tasks, states, pruning, verification, results and the best so far."""
    best = min(results.values(), key=lambda r: r.estimated_seconds, default=None)
    line = (f"tasks {stats.tasks_done}/{stats.tasks_total} | states {stats.states:,} | "
            f"pruned {stats.pruned_by_oracle:,} by e-graph, {stats.pruned_otherwise:,} other | "
            f"verified {stats.candidates_verified} ({stats.candidates_rejected} rejected) | "
            f"found {len(results)}")
    if best is not None:
        line += f" | best {best.num_kernels} kernel(s) ~{best.estimated_seconds * 1e6:.1f} µs"
    return line
