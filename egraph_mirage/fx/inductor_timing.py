"""Timing a winner, or a graph with its replaced pieces, against Inductor's code on the GPU.

Four kinds of timing (``TIMES``' keys), each a pair of fields of a decision's times, ours and
Inductor's, in µs per call: CUDA-graph replay ("graph"), plain launches back to back ("plain"),
plain launches each after an L2 flush ("flushed") and plain launches each waited for before the
next ("synced": host and GPU time in series, as in a decode loop that reads every step's
result). ``time_pair`` measures them;
``time_against_inductor`` times a piece's winner through the custom op the piece would become
against Inductor's code for the piece; ``time_graphs`` times a whole graph. How plain launches
are timed is part of the cache keys (``key_settings``): times measured another way miss.
``fx.decision.slower`` decides from the times.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from .inductor_tuning import tuned_compile
from .mutation import Saved, saved, set_back
from .pieces import Piece
from .runtime import Runner, counters_last, define_piece_op
from .trace import TracedProgram

#: the fields of each kind of timing: ours, Inductor's. Plain launches are timed three ways, back
#: to back (a loop of calls), each call after an L2 flush (``triton``'s ``do_bench``, as
#: ``bench torch`` reports them) and each call waited for before the next (``CudaTimer.synced``,
#: as ``generate()`` runs a compiled decode step: its host time does not overlap its GPU time,
#: so a graph whose call costs more host time loses there what it gains on the GPU): the flush
#: hides part of a call's host time, back to back none where the GPU time is larger, synced
#: none at all, and a replacement must be faster all three ways
TIMES = {"graph": ("ours_us", "inductor_us"), "plain": ("ours_plain_us", "inductor_plain_us"),
         "flushed": ("ours_flushed_us", "inductor_flushed_us"),
         "synced": ("ours_synced_us", "inductor_synced_us")}
#: each kind of timing in words, for the reasons a winner is not used
TIMED = {"graph": "CUDA-graph replay", "plain": "plain launches",
         "flushed": "plain launches, each after an L2 flush",
         "synced": "plain launches, each waited for"}
#: every field of ``TIMES``
TIME_FIELDS = tuple(f for pair in TIMES.values() for f in pair)

#: rounds of plain-launch timing in ``time_pair`` (ours, then Inductor's, in each)
PLAIN_ROUNDS = 7
#: calls per round of ``CudaTimer.synced`` in ``time_pair``
SYNCED_CALLS = 10
#: rounds of CUDA-graph replay in ``time_pair``: both graphs captured once, replayed in
#: alternation (``CudaTimer.graphs``), the fastest round of each counts
GRAPH_ROUNDS = 5
#: how a piece's inputs are read when timed, as the cache keys record it: from device memory,
#: not L2 (``rotated``)
PIECE_INPUTS = "a piece's inputs rotated over copies covering 3 x L2"
#: how plain launches are timed, as the cache keys record it (times measured otherwise miss)
PLAIN_TIMING = (f"back to back, after an L2 flush and each waited for ({SYNCED_CALLS} calls), "
                f"alternated, fastest of {PLAIN_ROUNDS}; {PIECE_INPUTS}")
#: how CUDA-graph replay is timed, as the cache keys record it (before, a piece's Inductor code
#: compiled in a mode with CUDA graphs of its own could not be captured: such records miss)
GRAPH_TIMING = ("captured by the timer, a piece's Inductor code compiled without CUDA graphs "
                "of its own, both sides replayed in alternation, fastest of "
                f"{GRAPH_ROUNDS}; where neither side can be captured, a call of each; "
                f"{PIECE_INPUTS}")
#: how ours is launched when timed, per the backend's ``launch`` option: "inductor", as the
#: compiled graph launches a replaced piece's kernels (from Inductor's code, no operator call on
#: the host), where that compiles; "op", through the piece's custom operator
OURS_LAUNCHED = {"inductor": "from Inductor's code (wrap_triton, its static launcher, the fused "
                             "combines' counters a persistent input), else by its op",
                 "op": "by its op"}


def kinds(timing: str) -> tuple[str, ...]:
    """The kinds of timing (``TIMES``' keys) the ``timing`` option asks for."""
    plain = ("plain", "flushed", "synced")
    return ("graph", *plain) if timing == "both" else plain if timing == "plain" else (timing,)


def key_settings(mode: str | None, launch: str = "op") -> dict[str, str]:
    """What a cache key records of how times were measured: Inductor's ``mode``, how plain
    launches are timed and, for the ``launch`` option "inductor", how ours was launched."""
    settings = {"inductor_mode": mode or "default", "plain_timing": PLAIN_TIMING,
                "graph_timing": GRAPH_TIMING}
    if launch != "op":
        settings["ours_launched"] = OURS_LAUNCHED[launch]
    return settings


def rotated(xs: Sequence[Any], l2: int | None = None) -> list[list[Any]]:
    """``xs`` and copies of it, enough sets that together they cover 3 x the GPU's L2
    (``gpu.timing.rotation_count``; one set, ``xs`` alone, where it is that large already):
    timed calls that cycle through them read their inputs from device memory, as a model's
    piece reads weights no other call has read since its last step, where one set called
    again and again would sit in L2 (a 4096 x 4096 fp16 projection's 32 MB on an H200) and
    time a piece faster than it runs in the model. A copy keeps each tensor's storage, offset
    and strides (Inductor's code checks strides); tensors sharing a storage are copied once.
    ``l2``: the L2's bytes (default: the GPU's; without CUDA tensors, ``xs`` alone)."""
    from ..gpu.timing import l2_bytes, rotation_count

    tensors = [x for x in xs if isinstance(x, torch.Tensor)]
    if l2 is None:
        on_gpu = [x for x in tensors if x.is_cuda]
        if not on_gpu:
            return [list(xs)]
        l2 = l2_bytes(on_gpu[0].device)
    storages = {x.untyped_storage().data_ptr(): x.untyped_storage().nbytes() for x in tensors}
    sets = [list(xs)]
    for _ in range(rotation_count(sum(storages.values()), l2) - 1):
        copies: dict[int, Any] = {}
        sets.append([_copied(x, copies) if isinstance(x, torch.Tensor) else x for x in xs])
    return sets


def _copied(x: torch.Tensor, copies: dict[int, Any]) -> torch.Tensor:
    """``x`` over a copy of its storage (one copy per storage in ``copies``): the same view."""
    key = x.untyped_storage().data_ptr()
    if key not in copies:
        copies[key] = torch.empty(0, dtype=torch.uint8, device=x.device).set_(
            x.untyped_storage()).clone().untyped_storage()
    return torch.empty(0, dtype=x.dtype, device=x.device).set_(
        copies[key], x.storage_offset(), x.size(), x.stride())


def time_pair(ours: Callable[..., Any], inductor: Callable[..., Any], xs: list[Any],
              which: Sequence[str], sets: Sequence[list[Any]] | None = None
              ) -> dict[str, float | None]:
    """Ours and Inductor's µs per call on inputs ``xs`` (or cycling through ``sets`` of them,
    ``rotated``) under each kind of timing in ``which``
    ("graph", "plain"): CUDA-graph replay (both graphs captured once and replayed in
    alternation, ``GRAPH_ROUNDS`` rounds, the fastest of each: ``CudaTimer.graphs``; None where
    one side's graph cannot be captured; where neither can, both record their own graphs and a
    call of each is timed) and plain
    launches, issued back to back (``CudaTimer.back_to_back``, so that a call's host time
    counts where it exceeds its GPU time), each after an L2 flush (``CudaTimer.plain``) and each
    waited for before the next (``CudaTimer.synced``: host and GPU time in series); keys from
    ``TIMES``.
    Plain launches are bound by the host, whose speed drifts between measurements (the same
    compiled graph measured half as long again a few seconds later on a GPU host): ours and
    Inductor's are timed in alternation, ``PLAIN_ROUNDS`` times each, and the fastest of each
    counts (a busy host only ever adds time)."""
    timer = _timer()
    times: dict[str, float | None] = {}
    fns = ((0, ours), (1, inductor))
    sets = list(sets) if sets is not None else [xs]
    if "graph" in which:
        replayed = timer.graphs([ours, inductor], sets, GRAPH_ROUNDS)  # None: not capturable
        for who, _ in fns:
            times[TIMES["graph"][who]] = replayed[who]
        if all(times[f] is None for f in TIMES["graph"]):
            # neither can be captured: graphs compiled in a mode with CUDA graphs (Inductor's
            # "reduce-overhead", "max-autotune") record and replay their own, which no graph
            # can capture; a call of each is then a replay of its own graph
            for who, fn in fns:
                times[TIMES["graph"][who]] = timer.back_to_back(fn, sets)
    if "plain" in which:
        plain: dict[str, dict[int, list[float]]] = {k: {0: [], 1: []} for k in ("plain",
                                                                                 "flushed",
                                                                                 "synced")}
        for _ in range(PLAIN_ROUNDS):
            for who, fn in fns:
                plain["plain"][who].append(timer.back_to_back(fn, sets, repeats=1))
                plain["flushed"][who].append(timer.plain(fn, sets))
                plain["synced"][who].append(timer.synced(fn, sets, SYNCED_CALLS))
        for kind, by in plain.items():
            for who, _ in fns:
                times[TIMES[kind][who]] = min(by[who])
    return times


def time_against_inductor(runner: Runner, traced: TracedProgram, piece: Piece,
                          mode: str | None = None,
                          launch: Callable[..., Any] | None = None) -> dict[str, float | None]:
    """Ours and Inductor's µs per call on the piece's example inputs (``rotated``), both kinds of
    timing (``time_pair``). Ours is launched as the compiled graph will launch it: with
    ``launch`` (``runtime.make_inductor_launch``: the kernels through ``wrap_triton``), from the
    code Inductor compiles for that function, where it compiles; otherwise through the custom op
    the piece would become, whose call costs host time Inductor's launch does not. Inductor
    compiles the piece in ``torch.compile``'s ``mode``."""
    xs = list(piece.example_inputs)
    theirs = _inductor_compiled(piece, mode)
    with torch._guards.tracing(None):
        ours = _launched_by_inductor(launch, xs) if launch is not None else None
    if ours is None:
        op = define_piece_op(runner, traced, f"{piece.name}_timed")
        ours = lambda *a: op(list(a))  # noqa: E731
    return time_pair(ours, lambda *a: theirs(*a), xs, ("graph", "plain"), rotated(xs))


def time_inductor(piece: Piece, mode: str | None = None) -> float | None:
    """Inductor's µs per call of the piece on its example inputs (``rotated``) under CUDA-graph
    replay, its code compiled in ``torch.compile``'s ``mode`` (None where a graph cannot be
    captured): what the backend weighs a piece's search by before searching
    (``fx.budget.Room``)."""
    xs = list(piece.example_inputs)
    theirs = _inductor_compiled(piece, mode)
    try:
        return _timer().graph(lambda *a: theirs(*a), rotated(xs))
    except Exception:  # not capturable
        return None


def _inductor_compiled(piece: Piece, mode: str | None) -> Callable[..., Any]:
    """The piece's module compiled by Inductor in ``torch.compile``'s ``mode``, without the
    CUDA graphs a mode may record (``reduce-overhead``, ``max-autotune``): the timer captures
    its own, in which a graph Inductor records cannot be captured."""
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx

    patches = dict(list_mode_options(mode)) if mode not in (None, "default") else {}
    patches["triton.cudagraphs"] = False
    # outside Dynamo's tracing context: compiling the piece must not add guards (on symbols
    # of its own) to the shape environment of the graph being compiled
    with torch._guards.tracing(None):
        return tuned_compile(lambda: compile_fx(piece.module, list(piece.example_inputs),
                                                config_patches=patches))


def _timer() -> Any:
    """The timer of a piece's or a graph's measurements: short plain runs, 7 graph replays."""
    from ..gpu.timing import CudaTimer, TimingConfig

    return CudaTimer(TimingConfig(rep_ms=25, graph_replay_ms=5, graph_replays=7))


def ours_launched_patches() -> dict[str, Any]:
    """Inductor's settings for a graph that launches the pieces' kernels (``wrap_triton``
    calls): each launched by Inductor's static CUDA launcher, as its own kernels are, where
    this torch has the setting (off by default for kernels it did not generate: each launch
    then goes through Triton's own launcher, about 4 µs more host time per kernel on an H200
    host, ``scripts/gpu_probes/piece_host.py``); a kernel the static launcher cannot take is
    launched by Triton's as before."""
    from torch._inductor import config

    if hasattr(config, "static_launch_user_defined_triton_kernels"):
        return {"static_launch_user_defined_triton_kernels": True}
    return {}


def _launched_by_inductor(launch: Callable[..., Any], xs: list[Any]
                          ) -> Callable[..., Any] | None:
    """``launch`` traced (``make_fx``: its kernels stay ``wrap_triton`` calls) and compiled by
    Inductor, which launches the kernels from its own code; None where either step fails
    (the caller then times the piece's op). A launch whose fused combines need counters
    (``runtime.make_inductor_launch``) gets a persistent zeroed buffer as one more input of the
    traced graph, as ``PieceCall`` passes its own in the compiled graph."""
    from torch._inductor.compile_fx import compile_fx
    from torch.fx.experimental.proxy_tensor import make_fx

    fn, args = launch, list(xs)
    n = getattr(launch, "counters", 0)
    if n:  # the fused combines' counters: a persistent input, mutated in place (as in the graph)
        counters = torch.zeros(n, dtype=torch.int32, device=xs[0].device)
        fn = counters_last(launch)
        args.append(counters)
    try:
        compiled = tuned_compile(lambda: compile_fx(
            make_fx(fn)(*args), args, config_patches=ours_launched_patches() or None))
        compiled(*args)  # compiles its kernels now, not inside the first timed call
    except Exception as e:
        import logging

        logging.getLogger("egraph_mirage").info(
            "egraph-mirage: ours timed through its op: Inductor's launch failed: %s", e)
        return None
    if n:
        return lambda *a: compiled(*a, counters)
    return lambda *a: compiled(*a)


def time_graphs(ours: Callable[..., Any], inductor: Callable[..., Any],
                example_inputs: Sequence[Any], writes: Collection[int] = ()
                ) -> dict[str, float | None]:
    """The whole graph's µs per call with the pieces replaced (``ours``) and as Inductor
    compiled it, under both kinds of timing (``time_pair``). ``writes``: the inputs the graph
    writes in place (``mutation.written``). Those of an integer dtype (a static cache's
    position counter, which each call advances and from which it indexes the cache) are set
    back before every call of either side, so that the thousands of timed calls write the
    same positions and never index past the cache; float ones (the cache) are left."""
    xs = list(example_inputs)
    state = saved(xs, writes, integers_only=True)
    if state:
        ours, inductor = _restoring(ours, state), _restoring(inductor, state)
    return time_pair(ours, inductor, xs, ("graph", "plain"))


#: the record's field saying how many times a pair was timed (``fastest``); absent: once
TIMINGS = "timings"


def fastest(*records: Mapping[str, float | None]) -> dict[str, float | None]:
    """One record of the same pair timed several times (``time_graphs``' records): each
    field's smallest value (noise on a host or a GPU only ever adds time), None where any
    record has None (a CUDA graph not captured), and ``TIMINGS``: how many records."""
    out: dict[str, float | None] = {}
    for f in TIME_FIELDS:
        values = [r[f] for r in records if f in r]
        if values:
            out[f] = None if any(v is None for v in values) else min(
                v for v in values if v is not None)
    out[TIMINGS] = float(sum(int(r.get(TIMINGS) or 1) for r in records))
    return out


def _restoring(fn: Callable[..., Any], state: Saved) -> Callable[..., Any]:
    """``fn``, each call after the tensors of ``state`` (``mutation.saved``) are set back."""
    def call(*a: Any) -> Any:
        set_back(state)
        return fn(*a)

    return call


def fmt_times(times: Mapping[str, float | None], names: tuple[str, str] = ("ours", "Inductor")
              ) -> str:
    """``ours 1.0 / 2.0 µs, Inductor 1.5 / 2.5 µs (graph replay / plain launches)``: the kinds
    of timing in ``times``, the two sides so ``names``d."""
    present = [k for k in TIMES if TIMES[k][0] in times]
    say = {"graph": "graph replay", "plain": "plain launches", "flushed": "plain, L2 flushed",
           "synced": "each waited for"}

    def cell(who: int) -> str:
        vals = [times[TIMES[k][who]] for k in present]
        return " / ".join("–" if v is None else f"{v:.1f}" for v in vals)

    timed = int(times.get(TIMINGS) or 1)
    return (f"{names[0]} {cell(0)} µs, {names[1]} {cell(1)} µs "
            f"({' / '.join(say[k] for k in present)}"
            + (f"; fastest of {timed} timings" if timed > 1 else "") + ")")


__all__ = ["GRAPH_ROUNDS", "GRAPH_TIMING", "PIECE_INPUTS", "PLAIN_ROUNDS", "PLAIN_TIMING",
           "SYNCED_CALLS", "TIMED", "TIMES", "TIME_FIELDS", "TIMINGS", "fastest", "fmt_times",
           "key_settings", "kinds", "rotated", "time_against_inductor", "time_graphs",
           "time_inductor", "time_pair"]
