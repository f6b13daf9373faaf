"""The few calls egraph-mirage makes into egglog's raw bindings, for egglog 13.x and 14.x alike.

egglog is imported lazily so that code which never builds an e-graph (the GPU side) does not
need it.
"""

from __future__ import annotations

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
