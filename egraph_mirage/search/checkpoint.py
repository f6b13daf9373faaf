"""Checkpoint files: a search's finished tasks and their results, written as they arrive.

The file is JSON, rewritten atomically after every finished task and every task cut short by
the time budget: such a task is kept with its results so far and its progress (the units it
finished, ``tasks.Units``), and a rerun resumes it from there. It records a fingerprint of
the program, the configuration, the seed and the rules (a digest of the rule files' contents, in
loading order); a rerun with a different program, configuration, seed or rules, or a file that is
not a checkpoint, is a ``SearchError`` naming the file.

The fingerprint says which search a file belongs to, not that its results are right: a file can
be edited, or written by another version of the package. So a resumed search verifies every
stored result again (``verify_stored``: the finite-field test against the program, then the
float check) before it returns or writes it; a result that fails is dropped with a
``CheckpointWarning`` naming its task, and that task is searched again.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EMError
from ..files import write_atomic
from ..graph import KernelGraph
from ..mugraph.serialize import loads
from .config import SearchError
from .tasks import Context, Payload, TaskResult

FORMAT = "egraph-mirage-checkpoint"
#: 5: tasks cut short are kept with their progress; 4: the fingerprint covers the rules;
#: 3: split two-kernel tasks between the one-kernel sizes; 2: one size per task
VERSION = 5


class CheckpointWarning(UserWarning):
    """A result stored in a checkpoint failed verification again and was dropped."""


def fingerprint(payload: Payload, seed: int) -> str:
    """What a checkpoint must match to be resumed: program, configuration, seed and rules."""
    text = json.dumps([payload.target_json, repr(payload.config), seed, payload.rules])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Checkpoint:
    path: Path
    fingerprint: str
    done: dict[str, TaskResult] = field(default_factory=dict)
    #: tasks cut short by a time budget: their results so far and ``progress``
    partial: dict[str, TaskResult] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Any, payload: Payload, seed: int) -> Checkpoint:
        """Load ``path`` when it exists (and belongs to this search), else start a new one."""
        if not isinstance(path, (str, os.PathLike)):
            raise SearchError(f"checkpoint must be a path, got {type(path).__name__}")
        p = Path(path)
        fp = fingerprint(payload, seed)
        ck = cls(p, fp)
        if not p.exists():
            return ck
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # unreadable, not JSON, too deep
            raise SearchError(f"{p}: not a readable checkpoint ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise SearchError(f"{p}: not an egraph-mirage checkpoint")
        if data.get("version") != VERSION:
            raise SearchError(f"{p}: checkpoint version {data.get('version')!r}, expected "
                              f"{VERSION}")
        if data.get("fingerprint") != fp:
            raise SearchError(f"{p}: this checkpoint belongs to another program, configuration, "
                              "seed or rule set; use a new file")
        try:
            for entry in data["tasks"]:
                res = _entry(entry)
                ck.done[res.task] = res
            for entry in data["partial"]:
                res = _entry(entry)
                res.stopped, res.progress = True, int(entry["progress"])
                if res.progress < 0 or res.task in ck.done:
                    raise ValueError(f"bad progress entry for task {res.task!r}")
                ck.partial[res.task] = res
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise SearchError(f"{p}: corrupt checkpoint ({exc})") from None
        return ck

    def record(self, res: TaskResult) -> None:
        """A task finished, or (``res.stopped``) cut short: its results join those of its
        earlier cut runs."""
        earlier = self.partial.pop(res.task, None)
        if earlier is not None:
            texts = {f[0] for f in earlier.found}
            res.found = [*earlier.found, *(f for f in res.found if f[0] not in texts)]
        (self.partial if res.stopped else self.done)[res.task] = res
        self.save()

    def save(self) -> None:
        """Write the finished tasks, those cut short, and their results (atomically)."""
        def entry(r: TaskResult) -> dict[str, Any]:
            return {"task": r.task, "found": [list(f) for f in r.found], "counts": r.counts,
                    "seconds": r.seconds}

        data = {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
                "tasks": [entry(r) for r in self.done.values()],
                "partial": [{**entry(r), "progress": r.progress} for r in self.partial.values()]}
        write_atomic(self.path, json.dumps(data))


def _entry(entry: Any) -> TaskResult:
    res = TaskResult(str(entry["task"]),
                     [tuple(f) for f in entry["found"]],  # type: ignore[misc]
                     {str(k): int(v) for k, v in entry["counts"].items()},
                     {str(k): float(v) for k, v in entry["seconds"].items()})
    for f in res.found:
        if len(f) != 7 or not isinstance(f[0], str):
            raise ValueError("bad result entry")
    return res


def verify_stored(ck: Checkpoint, ctx: Context) -> list[str]:
    """Verify every result ``ck`` holds again, as the search verifies a new candidate: the
    finite-field test against the program (``ctx.verifier``) and the float check
    (``ctx.numerics``: ``verify.check_numerics`` within the configuration's
    ``numeric_tolerance``). The figures of a result that passes are computed afresh (kernels,
    estimated time, the verifier's bound).
    A task with a result that fails leaves ``ck.done`` or ``ck.partial`` (it is searched again
    from its start) and the file is
    rewritten without it; each dropped result is described in the returned messages, which
    are also issued as ``CheckpointWarning``s."""
    from ..lower.cost_model import ProgramCost

    tolerance = ctx.payload.config.numeric_tolerance
    messages: list[str] = []
    for name, res, held in [*((n, r, ck.done) for n, r in ck.done.items()),
                            *((n, r, ck.partial) for n, r in ck.partial.items())]:
        fresh = []
        for text, *_, secs in res.found:
            try:
                g = loads(text)
            except EMError as exc:
                messages.append(f"{ck.path}: task {name}: a stored result is not a readable "
                                f"μGraph ({' '.join(str(exc).split())[:120]}); dropped")
                continue
            try:
                verdict = ctx.verifier.check(g)
                err = ctx.numerics.error(g) if verdict.equivalent else float("nan")
            except EMError as exc:  # e.g. a μGraph of other inputs than the program's
                messages.append(f"{ck.path}: task {name}: the stored result {describe(g)} cannot "
                                f"be checked ({' '.join(str(exc).split())[:120]}); dropped")
                continue
            if not verdict.equivalent or not err <= tolerance:
                why = ("fails the finite-field test" if not verdict.equivalent else
                       f"differs in float (max rel. error {err:.1e} > {tolerance:.1e})")
                messages.append(f"{ck.path}: task {name}: the stored result {describe(g)} {why};"
                                " dropped")
                continue
            cost = ProgramCost()
            fresh.append((text, cost.launches(g), cost.seconds(g), verdict.bound, verdict.tests,
                          err, secs))
        if len(fresh) < len(res.found):
            del held[name]  # searched again from its start: its other results come back
        else:
            res.found = fresh
    for m in messages:
        warnings.warn(m + "; the task is searched again", CheckpointWarning, stacklevel=3)
    if messages:
        ck.save()
    return messages


def describe(g: KernelGraph) -> str:
    """A μGraph in a few words: its operators in order, a graph-defined kernel as the list of
    its block operators, e.g. ``[matmul, forloop_accum, forloop_accum, div]``."""
    parts = []
    for t in g.operators:
        if t.op != "customized":
            parts.append(t.op)
        elif t.params["output"] == 0:
            ops = [b.op for b in t.params["kernel"].tb.tensors if b.op != "input"]
            parts.append("[" + ", ".join(ops) + "]")
    text = " -> ".join(parts)
    return text if len(text) <= 160 else text[:157] + "..."
