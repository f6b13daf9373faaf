"""Checkpoint files: a search's finished tasks and their results, written as they arrive.

The file is JSON, rewritten atomically after every finished task. It records a fingerprint of
the program, the configuration, the seed and the rules (a digest of the rule files' contents, in
loading order); a rerun with a different program, configuration, seed or rules, or a file that is
not a checkpoint, is a ``SearchError`` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..files import write_atomic
from .config import SearchError
from .tasks import Payload, TaskResult

FORMAT = "egraph-mirage-checkpoint"
#: 4: the fingerprint covers the rules; 3: split two-kernel tasks between the one-kernel sizes;
#: 2: one size per task
VERSION = 4


def fingerprint(payload: Payload, seed: int) -> str:
    """What a checkpoint must match to be resumed: program, configuration, seed and rules."""
    text = json.dumps([payload.target_json, repr(payload.config), seed, payload.rules])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Checkpoint:
    path: Path
    fingerprint: str
    done: dict[str, TaskResult] = field(default_factory=dict)

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
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
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
                res = TaskResult(str(entry["task"]),
                                 [tuple(f) for f in entry["found"]],  # type: ignore[misc]
                                 {str(k): int(v) for k, v in entry["counts"].items()},
                                 {str(k): float(v) for k, v in entry["seconds"].items()})
                for f in res.found:
                    if len(f) != 7 or not isinstance(f[0], str):
                        raise ValueError("bad result entry")
                ck.done[res.task] = res
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SearchError(f"{p}: corrupt checkpoint ({exc})") from None
        return ck

    def record(self, res: TaskResult) -> None:
        self.done[res.task] = res
        data = {"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
                "tasks": [{"task": r.task, "found": [list(f) for f in r.found],
                           "counts": r.counts, "seconds": r.seconds}
                          for r in self.done.values()]}
        write_atomic(self.path, json.dumps(data))
