"""What a search returns: verified μGraphs, best first, with statistics."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..graph import KernelGraph
from ..mugraph.serialize import dumps


@dataclass
class SearchStats:
    """Counts and seconds of one search (summed over workers for the counts)."""

    states: int = 0
    pruned_by_oracle: int = 0
    pruned_otherwise: int = 0
    candidates_verified: int = 0
    candidates_rejected: int = 0
    #: complete candidates the μGraph API refused to build (a search bug when not 0)
    invalid_candidates: int = 0
    tasks_done: int = 0
    tasks_total: int = 0
    seconds: dict[str, float] = field(default_factory=dict)
    #: wall-clock seconds from the start until the first (and the best) result
    seconds_to_first: float | None = None
    seconds_to_best: float | None = None
    interrupted: bool = False
    #: a time or task budget ended the search before its tasks were done
    budget_exhausted: bool = False
    #: what ended the search early: "time budget", "task budget", "max_results",
    #: "interrupted" (Ctrl-C); "" when every task ran
    stopped_by: str = ""
    #: the worker processes the search ran on (None: the caller's executor); fewer than asked
    #: where more processes checking the program's candidates do not fit in memory
    #: (``verify.checks_that_fit``)
    workers: int | None = None
    #: tasks still running ``OVERRUN_S`` seconds after the deadline, left behind (their workers
    #: ended, what they had found lost)
    tasks_left_behind: int = 0
    #: worker processes that died mid-search (killed by memory, a signal, a crash): each time,
    #: the pool was replaced and the tasks in flight run again (``search.run``)
    workers_lost: int = 0
    #: tasks that were in a worker when it died and were run again
    tasks_retried: list[str] = field(default_factory=list)
    #: tasks given up: in a worker when it died twice, or out when no new pool could be started
    tasks_lost: list[str] = field(default_factory=list)
    #: tasks (and their results) taken from a checkpoint instead of searched
    resumed_tasks: int = 0
    resumed_results: int = 0
    #: tasks a time budget had cut short, resumed from the units they finished
    resumed_partial: int = 0
    #: results of the checkpoint that failed verification again, dropped (their tasks re-run)
    dropped_results: int = 0
    #: a large program searched at scaled sizes (``pipeline.scaled``): the sizes of the
    #: inputs searched (None: the program's own); the structures found there that do not fit
    #: the program's sizes (a tile over shared memory, say), and those that failed the checks
    #: against the program at its sizes (dropped; a sign of a wrong identity, never expected)
    searched_sizes: list[tuple[int, ...]] | None = None
    resize_unfit: int = 0
    resize_rejected: int = 0
    #: when nothing was found: why, as far as the search can tell (``search.explain``)
    no_result_reasons: list[str] = field(default_factory=list)
    #: what ordered the results: "cost model" (``lower.cost_model``) or "gpu" (measured; where
    #: the time budget ended the profiling, the unmeasured results follow in the cost model's
    #: order)
    ranked_by: str = "cost model"
    #: ``profile=True`` only: what happened (or why nothing was measured), on which device, and
    #: the results dropped because they failed to lower or run / failed the numeric check
    profile_note: str = ""
    profile_device: str | None = None
    profile_failed: int = 0
    profile_wrong: int = 0
    profile_messages: list[str] = field(default_factory=list)

    def add(self, counts: dict[str, int]) -> None:
        for k, v in counts.items():
            setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SearchResult:
    """One verified μGraph."""

    graph: KernelGraph
    num_kernels: int
    estimated_seconds: float
    #: stated probability that the finite-field tests let an unequal program through
    verify_bound: float
    verify_tests: int
    #: largest relative error against the input program on random fp16-rounded inputs
    numeric_error: float
    #: seconds into the search when it was found
    found_after: float
    #: ``profile=True`` on a GPU: the tuned time in µs (CUDA-graph replay) and the knobs used
    measured_us: float | None = None
    knobs: dict[str, Any] | None = None
    #: tasks done (the one that found it included) when it was found; None: not recorded
    found_at_task: int | None = None

    def to_json(self) -> str:
        return dumps(self.graph)

    def summary(self) -> str:
        measured = ("" if self.measured_us is None else
                    f"measured {self.measured_us:.1f} µs ({_knobs(self.knobs)}), ")
        return (f"{self.num_kernels} kernel(s), {measured}"
                f"estimated {self.estimated_seconds * 1e6:.1f} µs, "
                f"verified ({self.verify_tests} tests, false-accept bound "
                f"{self.verify_bound:.1e}), max rel. error {self.numeric_error:.1e}")


def _knobs(knobs: dict[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((knobs or {}).items())) or "default knobs"


class SearchResults(list[SearchResult]):
    """Verified μGraphs, best first; ``stats`` alongside. The order is by measured time where
    ``stats.ranked_by == "gpu"`` (the measured ones; any left unmeasured when the time budget
    ran out follow them), else by the cost model's estimate (then fewer kernels)."""

    def __init__(self, items: list[SearchResult], stats: SearchStats) -> None:
        super().__init__(items)
        self.stats = stats

    @property
    def best(self) -> SearchResult | None:
        return self[0] if self else None
