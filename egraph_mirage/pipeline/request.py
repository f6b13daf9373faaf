"""One search request, typed and validated once (``Request``).

Every entry point builds one: ``em.superoptimize`` from its arguments, ``egraph-mirage optimize``
and the ``bench`` commands from their flags, the torch backend from its options. The fields are
checked here and nowhere else; a bad value is a ``RequestError`` naming the field (a front end
names its own spelling of it: ``RequestError.field`` maps to a flag or an option).

One name per idea, at each level (library and ``Request``; command-line flag; torch backend
option):

- seconds for the whole job, from its start (None: no limit): ``time_budget``; ``--budget``;
  ``budget`` (there: the whole compilation, its pieces sharing it);
- search tasks, in the task list's order (the same work on any machine): ``max_tasks``;
  ``--max-tasks``; ``max_tasks``;
- the share of ``time_budget`` the search gets when results are timed on a GPU:
  ``search_share``;
- worker processes, or the caller's ``concurrent.futures.Executor``: ``workers``;
  ``--workers``; ``workers``;
- rule files or folders replacing, or loaded after, the shipped rules: ``rules``,
  ``extra_rules``; ``--rules``, ``--extra-rules``;
- the seed of the finite-field tests: ``seed``.

The oracle's saturation, the search and the GPU profiling all fall inside ``time_budget``.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..rank import SEARCH_SHARE, Profiler
from ..search import SearchConfig, SearchError
from ..search.prepare import RulePaths, rule_paths
from ..search.progress import LOG_INTERVAL_S

#: the time budget each entry point takes when none is given, in seconds (None: no limit), in
#: one place: the library and ``optimize`` search the whole space; a benchmark bounds each
#: search; the torch backend bounds each compilation (its pieces share it)
DEFAULT_BUDGETS: dict[str, float | None] = {
    "superoptimize": None, "optimize": None, "bench search": 600.0, "bench gpu": 300.0,
    "torch backend": 60.0,
}


class RequestError(SearchError):
    """A field of a ``Request`` that cannot be meant; ``field`` names it."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"superoptimize: {field_name} {message}")
        self.field = field_name
        self.detail = message


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _paths(value: RulePaths | None, name: str) -> tuple[Path, ...] | None:
    """``search.prepare.rule_paths``, its refusal a ``RequestError`` naming the field."""
    try:
        return rule_paths(value, name)
    except SearchError:
        raise RequestError(name, f"must be rule files or folders, got {value!r}") from None


@dataclass(frozen=True)
class Request:
    """What one search is asked to do, and within what budget (module docstring)."""

    #: seconds for the whole job, counted from its start (``inf`` or None: no limit)
    time_budget: float | None = DEFAULT_BUDGETS["superoptimize"]
    #: only the first ``max_tasks`` tasks of the task list are searched (None: all)
    max_tasks: int | None = None
    #: where results will be timed on a GPU, the search stops at this share of the time budget
    #: and the rest is the profiling's
    search_share: float = SEARCH_SHARE
    #: a process count (None: every core) or the caller's ``concurrent.futures.Executor``
    workers: int | cf.Executor | None = None
    #: rule files or folders replacing the shipped rules (None: the shipped ones)
    rules: tuple[Path, ...] | None = None
    #: rule files or folders loaded after the rules
    extra_rules: tuple[Path, ...] = ()
    seed: int = 0
    config: SearchConfig = field(default_factory=SearchConfig)
    #: rank the verified results by time measured on the CUDA GPU (``rank.profile_stage``)
    profile: bool = False
    #: replaces the GPU measurement (``rank.GpuProfiler`` with another timer, or a fake)
    profiler: Profiler | None = None
    #: a file recording every finished task, so that a rerun resumes
    checkpoint: Path | None = None
    #: progress on stderr (None: on; False: silent), a log line every ``progress_interval`` s
    progress: bool | None = None
    progress_interval: float = LOG_INTERVAL_S
    #: search a program of a real model's sizes as a scaled copy, its results re-sized and
    #: verified at the program's own sizes (``pipeline.scaled``); False: at its own sizes
    scale: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.config, SearchConfig):
            raise RequestError("config", f"must be a SearchConfig, got {self.config!r}")
        if self.time_budget is not None and not (_is_number(self.time_budget)
                                                 and self.time_budget > 0):
            raise RequestError("time_budget", f"must be a positive number of seconds or None, "
                               f"got {self.time_budget!r}")
        if self.max_tasks is not None and not _is_count(self.max_tasks):
            raise RequestError("max_tasks", f"must be a positive integer or None, got "
                               f"{self.max_tasks!r}")
        if not (_is_number(self.search_share) and 0 < self.search_share <= 1):
            raise RequestError("search_share", f"must be a number in (0, 1], got "
                               f"{self.search_share!r}")
        if not (self.workers is None or isinstance(self.workers, cf.Executor)
                or _is_count(self.workers)):
            raise RequestError("workers", f"must be a positive integer or an Executor, got "
                               f"{self.workers!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise RequestError("seed", f"must be an integer, got {self.seed!r}")
        if self.profiler is not None and not self.profile:
            raise RequestError("profiler", "is used only with profile=True")
        if not isinstance(self.scale, bool):
            raise RequestError("scale", f"must be True or False, got {self.scale!r}")
        if not (_is_number(self.progress_interval) and self.progress_interval >= 0):
            raise RequestError("progress_interval", f"must be a number of seconds >= 0, got "
                               f"{self.progress_interval!r}")

    @classmethod
    def of(cls, *, rules: RulePaths | None = None, extra_rules: RulePaths = (),
           config: SearchConfig | None = None, checkpoint: Any = None,
           **fields: Any) -> Request:
        """A request from loosely typed arguments: rule paths as strings or one path, no
        config (the default), a checkpoint path as a string."""
        return cls(rules=_paths(rules, "rules"),
                   extra_rules=_paths(extra_rules, "extra_rules") or (),
                   config=SearchConfig() if config is None else config,
                   checkpoint=None if checkpoint is None else Path(checkpoint), **fields)

    def process_count(self) -> int | cf.Executor:
        """``workers`` resolved: the caller's executor, or a process count (None: every core)."""
        if isinstance(self.workers, cf.Executor):
            return self.workers
        return (os.cpu_count() or 1) if self.workers is None else self.workers

    def limited(self) -> bool:
        """Whether ``time_budget`` bounds the job (neither None nor infinite)."""
        return self.time_budget is not None and not math.isinf(self.time_budget)
