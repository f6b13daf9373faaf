"""Tuning lowered μGraphs: try the lowering's knobs, reject wrong kernels, keep the fastest.

``tune(mugraph, program, ...)`` compiles ``mugraph`` once per point of the knob space
(``num_warps`` × ``num_stages`` unless the lowering names its own), checks each compiled program
against the PyTorch evaluation of ``program`` in float32 on fresh random inputs (relative error,
norm-wise or in the worst element, above ``tol`` or any NaN: rejected, never timed), times the
rest and keeps the best. Every trial is cached on disk under a hash of the μGraph's JSON, the
device name and the knobs, so a second run re-times nothing; the best is compiled again to
hand back a callable.

``rank(candidates, tuner)`` orders μGraphs by measured time where a GPU and the lowering are
present, and by the search's cost model (``lower.cost_model.ProgramCost``: estimated time from
the bytes the kernels move and their launches) otherwise.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..dtypes import DType
from ..files import write_atomic
from ..graph import KernelGraph
from ..lower import KNOBS, canonical_knobs, compile_graph, graph_knobs
from ..mugraph.serialize import dumps
from .timing import InputSet, Program, Timer

Knobs = dict[str, Any]
Compiler = Callable[[KernelGraph, Mapping[str, Any]], Program]

#: the knobs tried when the lowering does not name its own (``egraph_mirage.lower.KNOBS``)
DEFAULT_KNOBS: dict[str, tuple[Any, ...]] = {"num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4)}
#: per output dtype, the relative error (``torch_eval.relative_error``: the larger of the
#: norm-wise and the worst-element error) above which a kernel is wrong. Measured on an H200:
#: every hand-written variant of every benchmark and the eager and SDPA fp16 baselines stay
#: under 1.1e-3; Triton's miscompiles there gave 2e-2 and more. bfloat16 keeps 3 fewer
#: mantissa bits than float16, so 8 times the error.
TOLERANCE: dict[DType, float] = {DType.float16: 5e-3, DType.float32: 5e-3,
                                 DType.bfloat16: 4e-2}
#: 2: verdicts by the worst-element error too (older cached verdicts are not reused)
CACHE_SCHEMA = 2


def tolerance(program: KernelGraph) -> float:
    """The error above which a kernel computing ``program`` is wrong (``TOLERANCE`` of its
    loosest output dtype)."""
    return max(TOLERANCE[t.dtype] for t in program.outputs)


def default_cache_dir() -> Path:
    return Path(os.environ.get("EGRAPH_MIRAGE_CACHE", Path.home() / ".cache" / "egraph-mirage"))


def default_compiler() -> Compiler | None:
    """The lowering's compile entry point (``lower.compile_graph``)."""
    return lambda g, knobs: compile_graph(g, **knobs)


def knob_space(space: Mapping[str, Sequence[Any]] | None = None,
               mugraph: KernelGraph | None = None) -> list[Knobs]:
    """Every combination of the knob values (default: the lowering's ``KNOBS``). With
    ``mugraph``, a space that is not empty also gets the knobs that matter for that μGraph only
    (the lowering's ``graph_knobs``) where it does not name them; ``{}`` stays the lowering's
    defaults alone. Settings that generate the same program as an earlier one (the lowering's
    ``canonical_knobs``) are left out."""
    if space is None:
        space = KNOBS or DEFAULT_KNOBS
    if space and mugraph is not None:
        space = {**graph_knobs(mugraph), **space}
    keys = sorted(space)
    settings = [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]
    if mugraph is None:
        return settings
    seen: set[tuple[tuple[str, Any], ...]] = set()
    out = []
    for knobs in settings:
        key = tuple(sorted(canonical_knobs(mugraph, knobs).items()))
        if key not in seen:
            seen.add(key)
            out.append(knobs)
    return out


def lowering_fingerprint() -> str:
    """Hash of the code generator's source files (the lowering, and the op table's and the
    accumulators' Triton emissions): a changed generator invalidates cached trials."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    files = [*sorted((root / "lower").rglob("*.py")), *sorted((root / "ops").rglob("*.py")),
             root / "mugraph" / "accumulators.py"]
    for path in files:
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cache_key(mugraph_json: str, device: str, knobs: Mapping[str, Any], timing: str,
              lowering: str = "", layout: str = "") -> str:
    """Hash of what decides a trial's outcome: the μGraph, the device, the knobs, what is timed,
    the lowering's version (``lowering_fingerprint``) and, where the inputs are not row-major,
    their layout (``layout``: their strides as text)."""
    fields = {"schema": CACHE_SCHEMA, "mugraph": mugraph_json, "device": device,
              "knobs": {k: knobs[k] for k in sorted(knobs)}, "timing": timing,
              "lowering": lowering}
    if layout:
        fields["layout"] = layout
    blob = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class TuneCache:
    """One small JSON file per trial under ``root/tune/``; ``root=None`` keeps nothing."""

    def __init__(self, root: str | os.PathLike[str] | None) -> None:
        self.dir = None if root is None else Path(root) / "tune"

    def get(self, key: str) -> dict[str, Any] | None:
        if self.dir is None:
            return None
        path = self.dir / f"{key}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        if self.dir is None:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / f"{key}.json", json.dumps(dict(record), sort_keys=True))


@dataclass
class Trial:
    knobs: Knobs
    status: str  # "ok", "wrong" (numerics) or "failed" (compile or run raised)
    us: float | None = None
    error: float | None = None  # relative error against the reference
    message: str = ""
    cached: bool = False


@dataclass
class TuneResult:
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    fn: Program | None = None  # the best configuration, compiled

    @property
    def us(self) -> float | None:
        return None if self.best is None else self.best.us


def check(fn: Program, program: KernelGraph, inputs: InputSet, tol: float | None = None,
          fn_inputs: InputSet | None = None, refs: Sequence[Any] | None = None
          ) -> tuple[bool, float]:
    """Run ``fn`` and compare every output with ``program`` evaluated in float32 on ``inputs``
    (or with ``refs``, that evaluation done before); ``fn`` gets ``fn_inputs`` where given (the
    same values in another layout). Right when the largest relative error is at most ``tol``
    (default: ``tolerance(program)``)."""
    import torch

    from .torch_eval import evaluate, relative_error

    with torch.no_grad():
        outs = list(fn(*(inputs if fn_inputs is None else fn_inputs)))
        if refs is None:
            refs = evaluate(program, inputs, torch.float32)
    if len(outs) != len(refs):
        return False, math.inf
    err = max(relative_error(o, r) for o, r in zip(outs, refs))
    return err <= (tolerance(program) if tol is None else tol), err


def tune(mugraph: KernelGraph, program: KernelGraph, *, compiler: Compiler, timer: Timer,
         input_sets: Sequence[InputSet], check_inputs: InputSet, device: str,
         cache: TuneCache | None = None, space: Mapping[str, Sequence[Any]] | None = None,
         timing: str = "graph", tol: float | None = None, layout: str = "",
         stop: Callable[[], bool] | None = None) -> TuneResult:
    """Compile, check and time ``mugraph`` at every knob setting; see the module docstring.

    ``timing`` picks the measurement that ranks settings: "graph" (CUDA-graph replay, the
    kernels' own time) or "plain". ``tol``: as in ``check``. ``layout``: the inputs' strides as
    text where they are not row-major (part of the cache key: ``compiler`` reads them so).
    ``stop``: asked before each setting not in the cache once one setting has a time; True
    ends the tuning there, with the best so far (a search's deadline: each setting compiles
    the program, seconds for a large one, so a whole knob space may take a minute).
    """
    cache = cache or TuneCache(None)
    text, lowering = dumps(mugraph), lowering_fingerprint()
    result = TuneResult()
    refs: list[Any] = []  # the reference outputs, computed at the first trial that needs them
    for knobs in knob_space(space, mugraph):
        key = cache_key(text, device, knobs, timing, lowering, layout)
        hit = cache.get(key)
        if hit is None and result.best is not None and stop is not None and stop():
            break
        if hit is not None:
            trial = Trial(knobs, hit["status"], hit.get("us"), hit.get("error"),
                          hit.get("message", ""), cached=True)
        else:
            if not refs:
                refs = _reference(program, check_inputs)
            trial = _trial(mugraph, program, knobs, compiler, timer, input_sets, check_inputs,
                           refs, timing, tol)
            cache.put(key, {"status": trial.status, "us": trial.us, "error": trial.error,
                            "message": trial.message, "knobs": knobs, "device": device})
        result.trials.append(trial)
        if trial.status == "ok" and trial.us is not None and (
                result.best is None or trial.us < result.best.us):  # type: ignore[operator]
            result.best = trial
    if result.best is not None:
        result.fn = compiler(mugraph, result.best.knobs)
    return result


def _reference(program: KernelGraph, inputs: InputSet) -> list[Any]:
    import torch

    from .torch_eval import evaluate

    return evaluate(program, inputs, torch.float32)


def _trial(mugraph: KernelGraph, program: KernelGraph, knobs: Knobs, compiler: Compiler,
           timer: Timer, input_sets: Sequence[InputSet], check_inputs: InputSet,
           refs: Sequence[Any], timing: str, tol: float | None) -> Trial:
    try:
        fn = compiler(mugraph, knobs)
        ok, err = check(fn, program, check_inputs, tol, refs=refs)
    except Exception as exc:  # a knob the lowering cannot honour: record, go on
        return Trial(knobs, "failed", message=f"{type(exc).__name__}: {exc}"[:300])
    if not ok:
        return Trial(knobs, "wrong", error=err)
    try:
        us = timer.graph(fn, input_sets) if timing == "graph" else timer.plain(fn, input_sets)
    except Exception as exc:
        return Trial(knobs, "failed", error=err, message=f"{type(exc).__name__}: {exc}"[:300])
    return Trial(knobs, "ok", us=us, error=err)


Space = dict[str, tuple[Any, ...]]


#: the knob settings at which many candidates get a first timing before the fastest are tuned
QUICK_KNOBS: dict[str, tuple[int, ...]] = {"num_stages": (3,), "num_warps": (4, 8)}


def staged_spaces(mugraph: KernelGraph, base: Mapping[str, Sequence[Any]] | None = None
                  ) -> tuple[Space, Callable[[Knobs], Space] | None]:
    """Two rounds instead of the whole product: ``base`` (default: the lowering's ``KNOBS``)
    with each of ``mugraph``'s own knobs (``graph_knobs``) held at its first value, then those
    knobs in full at the best ``base`` setting of the first round (a function of it; None where
    the μGraph has no knobs of its own). 12 + 8 settings instead of 96 where it has three."""
    own = graph_knobs(mugraph)
    first = {k: tuple(v) for k, v in (base or KNOBS or DEFAULT_KNOBS).items()}
    first |= {k: (v[0],) for k, v in own.items()}

    def second(best: Knobs) -> Space:
        return {k: (best[k],) for k in first if k in best and k not in own} | dict(own)

    return first, (second if own else None)


def tune_staged(mugraph: KernelGraph, tuner: Callable[[KernelGraph, Any], TuneResult],
                base: Mapping[str, Sequence[Any]] | None = None,
                stop: Callable[[], bool] | None = None) -> TuneResult:
    """``tuner(mugraph, space)`` over ``staged_spaces``: the first round, then (where the μGraph
    has knobs of its own, the first round found a setting and ``stop`` is not True) the
    second; the faster best."""
    first, second = staged_spaces(mugraph, base)
    r1 = tuner(mugraph, first)
    if r1.best is None or second is None or (stop is not None and stop()):
        return r1
    r2 = tuner(mugraph, second(r1.best.knobs))
    best = r1 if r2.us is None or (r1.us is not None and r1.us <= r2.us) else r2
    return TuneResult(r1.trials + r2.trials, best.best, best.fn)
