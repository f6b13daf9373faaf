"""The search's first step: saturate the target's e-graph and describe its inputs (``prepare``).

The payload it returns is plain, picklable data (``tasks.Payload``): every search task, in any
process, starts from it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..graph import KernelGraph, abstract_term
from ..mugraph.serialize import dumps
from ..ops import REDUCING
from ..oracle import Budget, Oracle, rule_files, rules_digest
from .config import SearchConfig, SearchError
from .dims import LinkProbe, dim_classes
from .reach import ReachIndex
from .tasks import Payload
from .tiling import DTensor

#: rule files or folders, as ``Oracle(rules=, extra_rules=)`` takes them; one path is a list of one
RulePaths = Sequence[str | os.PathLike[str]] | str | os.PathLike[str]


def rule_paths(value: RulePaths | None, name: str) -> tuple[Path, ...] | None:
    """``rules`` / ``extra_rules`` as a tuple of paths (one path is a tuple of one); a
    ``SearchError`` naming ``name`` for anything else."""
    if value is None:
        return None
    items = [value] if isinstance(value, (str, os.PathLike)) else value
    try:
        return tuple(Path(p) for p in items)
    except TypeError:
        raise SearchError(f"superoptimize: {name} must be rule files or folders, got "
                          f"{value!r}") from None


def prepare(g: KernelGraph, config: SearchConfig, seed: int = 0,
            rules: RulePaths | None = None, extra_rules: RulePaths = (),
            saturation_seconds: float | None = None) -> Payload:
    """Saturate the target's e-graph and describe its inputs.

    ``rules`` replaces the shipped rule files, ``extra_rules`` are loaded after them (both as
    in ``Oracle``); the payload records a digest of the files' contents.
    ``saturation_seconds`` caps the oracle's saturation time (default: ``Budget``'s)."""
    return prepare_with_rules(g, config, seed, rules, extra_rules, saturation_seconds)[0]


def prepare_with_rules(g: KernelGraph, config: SearchConfig, seed: int = 0,
                       rules: RulePaths | None = None, extra_rules: RulePaths = (),
                       saturation_seconds: float | None = None,
                       own: KernelGraph | None = None) -> tuple[Payload, list[Path]]:
    """``prepare``, and the rule files the oracle loaded (in order). ``own``: where ``g`` is a
    scaled copy (``pipeline.scaled``), the program at its own sizes, which the payload's
    ``growth`` is taken from."""
    if not isinstance(g, KernelGraph):
        raise SearchError(f"superoptimize: expected a KernelGraph, got {type(g).__name__}")
    if len(g.outputs) != 1:  # the pipeline searches a program of several one output at a time
        raise SearchError(f"superoptimize: the program must have an output (call "
                          f"mark_output), it has {len(g.outputs)}" if not g.outputs else
                          f"prepare: a program of one output, not {len(g.outputs)} (the "
                          "pipeline searches several one at a time: pipeline.outputs)")
    if any(t.op == "customized" for t in g.operators):
        raise SearchError("superoptimize: the input program already has graph-defined kernels;"
                          " give it as library operators")
    dtypes = sorted({t.dtype.value for t in g.inputs})
    if len(dtypes) > 1:
        raise SearchError(f"superoptimize: the program's inputs have dtypes {', '.join(dtypes)}; "
                          "the search takes inputs of one dtype (a kernel reads one storage "
                          "dtype, and the search proposes no cast)")
    budget = (Budget() if saturation_seconds is None
              else Budget(max_seconds=min(Budget().max_seconds, saturation_seconds)))
    oracle = Oracle(g, rules=rule_paths(rules, "rules"),
                    extra_rules=rule_paths(extra_rules, "extra_rules") or (), budget=budget,
                    warn_incomplete=False)
    reach = ReachIndex.from_oracle(oracle)
    classes, out_classes = dim_classes(g, LinkProbe())
    inputs = []
    for i, (t, dcls) in enumerate(zip(g.inputs, classes)):
        cls = reach.classify(abstract_term(t))
        inputs.append(DTensor(i, t.dims, t.dtype, cls, dcls, cls if cls is not None else ("v", i)))
    scalars = sorted(program_scalars(g) | set(config.scalars))
    # casts are the identity to the search (it proposes none): they do not count
    config = replace(config, max_block_ops=config.block_ops(
        sum(t.op != "cast" for t in g.operators), any(t.op in REDUCING for t in g.operators)))
    # the generated prelude (from the op table) is part of the rules the e-graph was built with
    digest = rules_digest(oracle.rule_paths, oracle.prelude)
    payload = Payload(dumps(g), reach, config, tuple(inputs), tuple(scalars), out_classes[0],
                      seed, digest, growth(inputs, own))
    return payload, rule_files(oracle.rule_paths)


def growth(inputs: Sequence[DTensor], own: KernelGraph | None) -> tuple[tuple[Any, int], ...]:
    """(dimension class, factor) for each class of the searched inputs whose size is ``factor``
    times as large in ``own`` (the program at its own sizes; none without it), the smallest
    factor where a class's dimensions grew unequally: what ``tiling.kernel_shapes`` reads a
    shape's tiles at those sizes by."""
    if own is None or len(own.inputs) != len(inputs):
        return ()
    out: dict[Any, int] = {}
    for t, o in zip(inputs, own.inputs):
        for c, n, m in zip(t.dcls, t.dims, o.dims):
            if c is not None and m > n and m % n == 0:
                out[c] = min(out.get(c, m // n), m // n)
    return tuple(sorted(out.items(), key=repr))


def program_scalars(g: KernelGraph) -> set[float]:
    """The constants of ``g``'s operators, which ``add_scalar`` and ``mul_scalar`` may use in a
    block: every ``scalar`` and every other float parameter (``rms_norm``'s ``eps``, so that
    ``sqrt(mean(x * x) + eps)`` can be built from an accumulated mean)."""
    return {float(v) for t in g.operators for k, v in t.params.items()
            if k == "scalar" or (isinstance(v, float) and math.isfinite(v))}
