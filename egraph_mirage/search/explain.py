"""Why a search found nothing (``SearchStats.no_result_reasons``, printed by ``optimize``).

Each reason is a sentence a user can act on, from what the search knows at its end: what
stopped it, what the verifier did with the candidates the e-graph let through, whether the
oracle's saturation completed, and whether the program has inputs its output does not use.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..graph import KernelGraph, Tensor, abstract_term
from .config import BLOCK_OPS, SearchConfig
from .results import SearchStats

#: ``SearchStats.stopped_by`` values
TIME_BUDGET, TASK_BUDGET, MAX_RESULTS, INTERRUPTED, TASKS_LOST = (
    "time budget", "task budget", "max_results", "interrupted", "tasks lost")


def no_result_reasons(stats: SearchStats, g: KernelGraph, config: SearchConfig,
                      saturated: bool, rule_files: Sequence[Path], max_tasks: int | None,
                      verified_results: int) -> list[str]:
    """The reasons, most telling first. ``saturated``: whether the oracle's saturation
    completed; ``rule_files``: the rule files it loaded; ``verified_results``: results found
    before any GPU profiling dropped them."""
    out = []
    late: list[str] = []  # reasons that follow what stopped the search
    at = f"{stats.tasks_done}/{stats.tasks_total} tasks"
    for t in unused_inputs(g):
        out.append(f"input t{t.index} (dims {t.dims}) is not used by the output: the search "
                   "expects every input to be used; remove it from the program")
    if verified_results and stats.profile_failed + stats.profile_wrong:
        out.append(f"all {verified_results} verified result(s) were dropped by GPU profiling "
                   f"({stats.profile_failed} failed to lower or run, {stats.profile_wrong} "
                   "failed the numeric check): see the profile messages")
    if stats.candidates_verified and stats.candidates_rejected == stats.candidates_verified:
        files = ", ".join(str(f) for f in rule_files) or "none"
        if stats.stopped_by:  # cut short: the abstraction lets some unequal forms through
            late.append(f"the verifier rejected the {stats.candidates_verified} candidate(s) "
                       "the e-graph let through before the search stopped (abstract "
                       "expressions admit some unequal forms; equal ones may come later), or "
                       f"an identity in the rule files in use is unsound ({files})")
        else:
            out.append(f"the verifier rejected every candidate the e-graph let through "
                       f"({stats.candidates_verified}): an identity in the rule files in use "
                       f"may be unsound ({files})")
    if not saturated:
        out.append("the oracle's saturation stopped at its budget before completing: "
                   "e-classes it had not derived were pruned, possibly every form of the "
                   "target the space holds")
    if stats.stopped_by == TIME_BUDGET:
        out.append(f"the time budget was reached at {at}: give it more time (a rerun with "
                   "the same checkpoint goes on from there)")
    elif stats.stopped_by == TASK_BUDGET:
        out.append(f"the task budget (max_tasks {max_tasks}) was reached at {at}: raise it (a "
                   "rerun with the same checkpoint goes on from there)")
    elif stats.stopped_by == INTERRUPTED:
        out.append(f"the search was interrupted at {at}")
    elif stats.stopped_by == TASKS_LOST:
        out.append(f"{len(stats.tasks_lost)} task(s) were lost with worker processes that "
                   f"died ({stats.workers_lost} of them; {lost_names(stats)}): a worker killed "
                   "by memory most often; give the search fewer workers")
    elif not stats.candidates_verified:
        out.append(f"the whole space ({stats.tasks_total} tasks) holds no candidate in the "
                   f"target's e-class: allow more (SearchConfig.max_block_ops "
                   f"{_block_ops(config)}, max_kernels {config.max_kernels}, max_kernel_ops "
                   f"{config.max_kernel_ops})")
    if stats.invalid_candidates:
        out.append(f"{stats.invalid_candidates} complete candidate(s) could not be built as "
                   "μGraphs (a bug in the search)")
    return out + late


def lost_names(stats: SearchStats, most: int = 5) -> str:
    """The tasks lost with dead workers, the first ``most`` by name."""
    names = stats.tasks_lost[:most]
    more = len(stats.tasks_lost) - len(names)
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def unused_inputs(g: KernelGraph) -> list[Tensor]:
    """The inputs of ``g`` that none of its outputs' expressions mention."""
    used = {s.args[0] for t in g.outputs for s in abstract_term(t).walk() if s.op == "Var"}
    return [t for k, t in enumerate(g.inputs) if f"v{k}" not in used]


def _block_ops(config: SearchConfig) -> str:
    """``max_block_ops`` as a search used it: the number, or how None was resolved."""
    if config.max_block_ops is not None:
        return str(config.max_block_ops)
    return "None: the program's operators, within {}-{}".format(*BLOCK_OPS)
