"""``egraph-mirage bench torch``: a Llama decoder layer's decode step, end to end, on a GPU.

For each dtype (fp16 by default; ``--dtype float16,bfloat16``: rows for each), model, batch
size b and mode:

* models (``MODELS``): ``llama``, ``LlamaLayer`` of ``examples/llama_layer.py`` (plain torch);
  ``hf``, ``transformers``' ``LlamaDecoderLayer`` in the same decode step (``HFDecodeStep``),
  and ``hf-qwen3``, ``Qwen3DecoderLayer`` (Llama's layer with ``q_norm``/``k_norm``, a per-head
  RMSNorm of the queries and keys before RoPE) in it, both with a concatenated cache;
  ``hf-static`` and ``hf-qwen3-static``, the same with a static cache written in place as
  ``transformers``' ``StaticCache`` does (``index_copy_`` at ``cache_position``); the ``hf``
  models are left out, with a note, where ``transformers`` is not installed; sizes from a
  preset, ``small`` or ``llama3_8b`` (one layer of Llama-3-8B, or its shard on one of ``tp``
  GPUs, with a ``kv_len``-token cache; Qwen3's layer at the same sizes);
* modes (``MODES``): ``eager``; ``compile``, ``torch.compile(dynamic=False)`` (Inductor's default
  mode); ``max-autotune``, ``torch.compile(mode="max-autotune-no-cudagraphs")``;
  ``max-autotune-timed``, the same compiled and first called with Inductor's tuning timed on the
  GPU as the backend has it (``fx.inductor_tuning``; not run unless asked for: it tells how
  much of the backend's gain that tuning alone gives, and counts among the baselines); and the
  backend's modes (``BACKEND_MODES``): ``egraph_mirage``, ``torch.compile`` with this package's
  backend (``fx.backend.Backend`` with the search options given: ``budget``, ``max_tasks``,
  ``workers``, ``cache_dir``), and ``egraph_mirage-max-autotune``, the same with
  ``mode="max-autotune-no-cudagraphs"`` (Inductor compiles the rest, and the code each winner is
  timed against, in that mode; on a GPU the backend's ``autotune`` option, on by default, does
  so for ``egraph_mirage`` too);
* each compiled once (``compile_s``: the first call, which compiles and, for the backend,
  searches), with Inductor caches of its own (``bench.inductor_caches.own_caches``: no mode takes
  up the kernels another compiled, nor their tuning), checked against eager on the same inputs
  (``max_error``, the largest ``gpu.torch_eval.relative_error`` over the outputs;
  ``matches_eager`` within ``TOLERANCE``), then timed with ``gpu.timing.CudaTimer``: plain
  launches (``plain_us``, L2 flushed) and CUDA-graph replay (``graph_us``), on input sets rotated
  where one fits in L2; the modes are timed in ``rounds`` rounds, one after the other in each;
  ``plain_us`` is the fastest round (a decode step's plain launches are bound by the host, whose
  speed drifts and only ever adds time; every round is kept in ``plain_rounds``), ``graph_us`` the
  median.

Rows (``KEYS``) are one per dtype, model, batch and mode; ``speedup_vs_eager`` (and
``_graph``) is the eager time over the mode's, and the backend's rows also carry
``speedup_vs_best`` (and ``_graph``): the fastest mode's time that is not the backend's over
theirs, and what it did
(``pieces``, ``replaced``, ``searches``, ``cache_hits``, ``report``: ``em.torch_report``'s text).
A mode that fails keeps its row, with ``error`` and no times.

Every row also holds the step's copy floor: ``floor_bytes``, the bytes that must cross device
memory at least once (``gpu.floor.module_call_bytes`` of the module on the first input set:
the parameters and buffers its forward reads, the KV cache read once — a static cache's
``kv_len`` slots, a concatenated cache's past keys and values —, the new token's activations
in, its output and new keys and values out), the same for every mode; ``copy_bandwidth``, the
device's copy bandwidth (bytes read + written per second, ``gpu.floor.measure_copy_bandwidth``,
measured once per run, as ``bench gpu`` does); ``floor_us``, the bytes at that bandwidth; and
``floor_fraction`` (and ``_graph``), ``floor_us`` over the mode's ``plain_us`` (``graph_us``):
1 would be a step at copy speed. With ``--cpu-smoke`` no bandwidth is measured: ``floor_bytes``
is counted, ``copy_bandwidth``, ``floor_us`` and the fractions are None. Rows written before
these fields existed render without them; no floor is inferred for them.

On a GPU every mode is also profiled after its timing (``_profile``): ``kernels_total_us``, its
GPU kernels' µs per call in all, and ``kernels_us``, the slowest of them by name, which the
table's last lines list beside the mode's CUDA-graph µs and the floor (``format_kernels``):
which kernel holds a mode back from the floor, in the rows themselves.

Without a CUDA GPU the command refuses, unless ``--cpu-smoke``: the small preset on the CPU,
kernels in Triton's interpreter, timed by wall clock (no graph replay), the backend's rest run
eagerly; it tests the command, its figures mean nothing.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import EMError
from ..pipeline import DEFAULT_BUDGETS
from ..pipeline.command import request_from_flags
from .gpu_report import best, fmt, ratio
from .host_lock import HostLock
from .host_lock import add_argument as add_host_lock
from .inductor_caches import own_caches
from .text_table import aligned

__all__ = ["DEFAULT_MODES", "KEYS", "MODELS", "MODES", "TOLERANCE", "BenchTorchError", "CpuTimer",
           "TorchBenchConfig", "add_arguments", "bench_torch", "format_kernels", "format_table",
           "load_example", "run_command"]

#: model name: (``HFDecodeStep``'s family, its cache), or None for ``LlamaLayer``
HF_MODELS: dict[str, tuple[str, str] | None] = {
    "llama": None, "hf": ("llama", "concat"), "hf-qwen3": ("qwen3", "concat"),
    "hf-static": ("llama", "static"), "hf-qwen3-static": ("qwen3", "static")}
MODELS = tuple(HF_MODELS)
MODES = ("eager", "compile", "max-autotune", "max-autotune-timed", "egraph_mirage",
         "egraph_mirage-max-autotune")
#: the modes run when none are named
DEFAULT_MODES = tuple(m for m in MODES if m != "max-autotune-timed")
#: the backend's modes: the rest compiled by Inductor in its default mode, or in max-autotune
BACKEND_MODES = ("egraph_mirage", "egraph_mirage-max-autotune")
#: the keys of every row
KEYS = ("model", "preset", "sizes", "batch", "dtype", "device", "timing", "backend_timing",
        "mode", "plain_us",
        "graph_us", "plain_rounds", "speedup_vs_eager", "speedup_vs_eager_graph", "speedup_vs_best",
        "speedup_vs_best_graph", "floor_bytes", "copy_bandwidth", "floor_us", "floor_fraction",
        "floor_fraction_graph", "compile_s", "max_error", "matches_eager", "tolerance",
        "pieces", "replaced", "searches", "cache_hits", "report", "error", "kernels_us",
        "kernels_total_us")
#: the kernels a row keeps of its mode's profile (``kernels_us``): the slowest, by µs per call
KERNELS_KEPT = 12
#: the largest relative error against eager a mode may have (a whole layer: looser than one
#: kernel's ``gpu.tune.TOLERANCE``)
TOLERANCE = {"float16": 1e-2, "bfloat16": 5e-2, "float32": 1e-3}
#: the table's names of the dtypes
SHORT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}
#: where the example sits in a checkout of the repository
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llama_layer.py"
DEFAULT_OUT = "egraph-mirage-out/bench_torch.json"


class BenchTorchError(EMError, ValueError):
    """A setting of ``bench torch`` that cannot be run (no GPU, no example file, ...)."""


@dataclass
class BackendSettings:
    """The ``egraph_mirage`` backend's options a benchmark compiles with
    (``fx.options.BackendOptions``; ``budget``: seconds for each whole compilation, its pieces
    sharing them; ``backend_options``: any other option, e.g. ``timing``)."""

    budget: float | None = DEFAULT_BUDGETS["torch backend"]
    max_tasks: int | None = None
    workers: int | None = None
    cache_dir: str | None = None
    cache: bool = True
    rest: str = "inductor"
    backend_options: dict[str, Any] = field(default_factory=dict)

    def backend(self) -> dict[str, Any]:
        """The options, as ``Backend(**options)`` takes them."""
        return {"budget": self.budget, "max_tasks": self.max_tasks, "workers": self.workers,
                "cache_dir": self.cache_dir, "cache": self.cache, "rest": self.rest,
                **self.backend_options}

    def backend_timing(self) -> str:
        """The backend's ``timing`` option as set here, or its default (a row's
        ``backend_timing``)."""
        from ..fx.options import BackendOptions

        return str(self.backend().get("timing", BackendOptions.timing))


@dataclass
class TorchBenchConfig(BackendSettings):
    """What ``bench_torch`` measures (module docstring); the backend's options are
    ``BackendSettings``'."""

    models: Sequence[str] = ("llama", "hf")
    #: one run of every model, batch and mode per dtype (``TOLERANCE``'s keys)
    dtypes: Sequence[str] = ("float16",)
    batches: Sequence[int] = (1, 8, 16)
    preset: str = "llama3_8b"
    tp: int = 1
    kv_len: int = 4096
    modes: Sequence[str] = DEFAULT_MODES
    device: str = "cuda"
    #: ``examples/llama_layer.py`` (None: the checkout's)
    example: str | None = None
    seed: int = 1
    #: timing rounds: in each, every mode is timed once, one after the other; a mode's plain
    #: figure is its fastest round, its graph figure the median (a host's speed drifts over
    #: minutes, and plain launches of a decode step are host-bound). None: 5 on a GPU, 1 on the
    #: CPU
    rounds: int | None = None
    #: the lock file of the host's benchmarks (``bench.host_lock``; None: none)
    host_lock: str | None = None


def load_example(path: str | Path | None = None) -> ModuleType:
    """``examples/llama_layer.py`` as a module (it is no part of the installed package)."""
    file = Path(path) if path is not None else EXAMPLE
    if not file.is_file():
        raise BenchTorchError(f"bench torch: {file} not found: it ships with a checkout of "
                              "egraph-mirage, not with the package (--example PATH)")
    spec = importlib.util.spec_from_file_location("egraph_mirage_llama_example", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class CpuTimer:
    """Wall-clock median of ``repeats`` calls (``--cpu-smoke``); no graph replay."""

    def __init__(self, repeats: int = 3) -> None:
        self.repeats = repeats

    def plain(self, fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]]) -> float:
        import torch

        times = []
        with torch.no_grad():
            for i in range(self.repeats):
                t0 = time.perf_counter()
                fn(*input_sets[i % len(input_sets)])
                times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6

    def graph(self, fn: Callable[..., Any], input_sets: Sequence[Sequence[Any]]) -> float | None:
        return None


def _sizes(example: ModuleType, cfg: TorchBenchConfig) -> Any:
    if cfg.preset == "small":
        return example.LlamaSizes.small()
    if cfg.preset == "llama3_8b":
        return example.LlamaSizes.llama3_8b(tp=cfg.tp, kv_len=cfg.kv_len)
    raise BenchTorchError(f"bench torch: unknown preset {cfg.preset!r} (small, llama3_8b)")


def _module(example: ModuleType, model: str, sizes: Any, dtype: Any, device: str) -> Any:
    """The model's decode step, for inference (no parameter requires gradients)."""
    if model not in HF_MODELS:
        raise BenchTorchError(f"bench torch: unknown model {model!r} ({', '.join(MODELS)})")
    hf = HF_MODELS[model]
    if hf is None:
        module = example.LlamaLayer(sizes, dtype=dtype, device=device)
    else:
        family, cache = hf
        module = example.HFDecodeStep(sizes, dtype=dtype, device=device, family=family,
                                      cache=cache)
    return module.eval().requires_grad_(False)


def _compiled(module: Any, mode: str, cfg: TorchBenchConfig) -> tuple[Any, Any]:
    """The callable of ``mode``, and the backend object for ``egraph_mirage`` (else None)."""
    import torch

    if mode == "eager":
        return module, None
    # no ``torch._dynamo.reset()`` between modes: each compiled callable keeps its own code
    # (Dynamo guards a cache entry on its backend), so the modes can be timed in rounds
    if mode == "compile":
        return torch.compile(module, dynamic=False), None
    if mode == "max-autotune":
        return torch.compile(module, mode="max-autotune-no-cudagraphs", dynamic=False), None
    if mode == "max-autotune-timed":  # compiled at the first call, which tunes too
        from ..fx.inductor_tuning import tuned_on_the_gpu

        return tuned_on_the_gpu(torch.compile(module, mode="max-autotune-no-cudagraphs",
                                              dynamic=False)), None
    if mode in BACKEND_MODES:
        from ..fx.backend import Backend

        backend = Backend(**cfg.backend())
        if mode == "egraph_mirage":
            return torch.compile(module, backend=backend, dynamic=False), backend
        return torch.compile(module, backend=backend, mode="max-autotune-no-cudagraphs",
                             dynamic=False), backend
    raise BenchTorchError(f"bench torch: unknown mode {mode!r} ({', '.join(MODES)})")


def _input_sets(module: Any, batch: int, cfg: TorchBenchConfig) -> list[tuple[Any, ...]]:
    """Input sets of the decode step (``module.example_inputs``, on its device and dtype): as
    many as cover a few times the L2 (``gpu.timing``)."""
    from ..gpu.timing import l2_bytes, rotation_count

    first = module.example_inputs(batch, cfg.seed)
    count = 1
    if cfg.device == "cuda":
        count = min(64, rotation_count(sum(x.numel() * x.element_size() for x in first),
                                       l2_bytes()))
    return [first] + [module.example_inputs(batch, cfg.seed + i) for i in range(1, count)]


def _row(model: str, dtype: str, batch: int, mode: str, cfg: TorchBenchConfig, sizes: Any,
         device: str) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(KEYS)
    row.update(model=model, preset=cfg.preset, sizes=asdict(sizes), batch=batch,
               dtype=dtype, device=device, mode=mode, tolerance=TOLERANCE[dtype],
               timing="cuda" if cfg.device == "cuda" else "cpu wall clock (Triton interpreter)",
               backend_timing=cfg.backend_timing())
    return row


def _prepare(row: dict[str, Any], fn: Any, backend: Any, sets: list[tuple[Any, ...]],
             want: Sequence[Any], graphs: bool) -> None:
    """Fill ``row`` but its times: compile (first call), check against eager's ``want``."""
    import torch

    from ..fx.report import torch_report
    from ..gpu.torch_eval import relative_error

    with torch.no_grad():
        t0 = time.perf_counter()
        got = fn(*sets[0])
        if graphs:
            torch.cuda.synchronize()
        row["compile_s"] = time.perf_counter() - t0
    if backend is not None:
        pieces = [p for r in backend.reports for p in r.pieces]
        row.update(pieces=len(pieces), replaced=sum(p.status == "replaced" for p in pieces),
                   searches=backend.searches, cache_hits=sum(p.cache == "hit" for p in pieces),
                   report=torch_report(backend))
    row["max_error"] = max(relative_error(g, w) for g, w in zip(got, want, strict=True))
    row["matches_eager"] = row["max_error"] <= row["tolerance"]


def _time(timed: Sequence[tuple[dict[str, Any], Any]], sets: list[tuple[Any, ...]],
          timer: Any, graphs: bool, rounds: int) -> None:
    """Each row's ``plain_us`` (the fastest of ``rounds`` rounds, all of them in
    ``plain_rounds``) and ``graph_us`` (their median), each round timing every mode once, one
    after the other."""
    plain: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    graph: dict[int, list[float]] = {id(row): [] for row, _ in timed}
    for _ in range(max(1, rounds)):
        for row, fn in timed:
            plain[id(row)].append(timer.plain(fn, sets))
            if graphs and row["error"] is None:
                try:
                    us = timer.graph(fn, sets)
                except Exception as e:  # not capturable: plain launches only
                    row["error"] = f"CUDA-graph capture failed: {type(e).__name__}: {_first(e)}"
                else:
                    if us is not None:
                        graph[id(row)].append(us)
    for row, _ in timed:
        row["plain_us"] = min(plain[id(row)])
        row["plain_rounds"] = plain[id(row)]
        row["graph_us"] = statistics.median(graph[id(row)]) if graph[id(row)] else None


def _first(e: BaseException) -> str:
    """The first line of ``e``'s message; of a wrapper's (Dynamo's ``BackendCompilerFailed``,
    whose first line ends ``raised:``), its cause's too."""
    line = (str(e).strip().splitlines() or [""])[0]
    inner = e.__cause__ or getattr(e, "inner_exception", None)
    if isinstance(inner, BaseException) and inner is not e and line.endswith(":"):
        line += f" {type(inner).__name__}: {_first(inner)}"
    return line[:300]


def _speedups(rows: list[dict[str, Any]]) -> None:
    """Speedups within one dtype, model and batch: over eager, and the backend's over the best."""
    eager = next((r for r in rows if r["mode"] == "eager"), None)
    for r in rows:
        if eager is not None:
            r["speedup_vs_eager"] = ratio(eager["plain_us"], r["plain_us"])
            r["speedup_vs_eager_graph"] = ratio(eager["graph_us"], r["graph_us"])
        if r["mode"] in BACKEND_MODES:
            others = [o for o in rows if o["mode"] not in BACKEND_MODES]
            r["speedup_vs_best"] = ratio(best({o["mode"]: o["plain_us"] for o in others}),
                                         r["plain_us"])
            r["speedup_vs_best_graph"] = ratio(best({o["mode"]: o["graph_us"] for o in others}),
                                               r["graph_us"])


def _floor(rows: list[dict[str, Any]], nbytes: int, bandwidth: float | None) -> None:
    """Each row's copy floor (module docstring): ``nbytes`` at ``bandwidth`` (bytes/s; None:
    none measured, no floor time) and its fraction of the mode's times."""
    floor_us = None if bandwidth is None else nbytes / bandwidth * 1e6
    for r in rows:
        r.update(floor_bytes=nbytes, copy_bandwidth=bandwidth, floor_us=floor_us,
                 floor_fraction=ratio(floor_us, r["plain_us"]),
                 floor_fraction_graph=ratio(floor_us, r["graph_us"]))


def bench_torch(cfg: TorchBenchConfig, *, timer: Any = None,
                on_row: Callable[[dict[str, Any]], None] | None = None,
                log: Callable[[str], None] | None = None,
                copy_bandwidth: float | None = None) -> list[dict[str, Any]]:
    """Every row (module docstring), dtypes, then models, then batches, then modes (a
    model's module built once per dtype, its inputs once per batch). ``timer``: default
    ``CudaTimer`` on a GPU, ``CpuTimer`` on the CPU; ``on_row`` sees each row when done;
    ``copy_bandwidth`` (bytes/s): default measured once here on a GPU, none on the CPU."""
    import torch

    from ..fx.cache import device_name
    from ..gpu.floor import measure_copy_bandwidth

    for dtype in cfg.dtypes:
        if dtype not in TOLERANCE:
            raise BenchTorchError(f"bench torch: unknown dtype {dtype!r} "
                                  f"({', '.join(TOLERANCE)})")
    example = load_example(cfg.example)
    sizes = _sizes(example, cfg)
    graphs = cfg.device == "cuda"
    if timer is None:
        if graphs:
            from ..gpu.timing import CudaTimer

            timer = CudaTimer()
        else:
            timer = CpuTimer()
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    device = device_name() if graphs else "cpu"
    if copy_bandwidth is None and graphs:
        copy_bandwidth = measure_copy_bandwidth()
        say(f"copy bandwidth {copy_bandwidth / 1e12:.2f} TB/s (read + write)")
    out: list[dict[str, Any]] = []
    for dtype in cfg.dtypes:
        for model in cfg.models:
            try:
                module = _module(example, model, sizes, getattr(torch, dtype), cfg.device)
            except ImportError as e:
                say(f"note: {model} left out: {e}")
                continue
            for batch in cfg.batches:
                rows = _measure(module, model, dtype, batch, cfg, sizes, device, timer, say,
                                copy_bandwidth)
                for row in rows:
                    if on_row is not None:
                        on_row(row)
                out += rows
            del module
            if graphs:
                torch.cuda.empty_cache()  # the next model's weights
    return out


def _measure(module: Any, model: str, dtype: str, batch: int, cfg: TorchBenchConfig,
             sizes: Any, device: str, timer: Any, say: Callable[[str], None],
             copy_bandwidth: float | None) -> list[dict[str, Any]]:
    """The rows of one model, dtype and batch: every mode compiled and checked, then timed in
    rounds; their floor at ``copy_bandwidth``."""
    import torch

    from ..gpu.floor import module_call_bytes

    graphs = cfg.device == "cuda"
    sets = _input_sets(module, batch, cfg)
    with torch.no_grad():
        want = module(*sets[0])
    nbytes = module_call_bytes(module, sets[0])
    rows, timed = [], []
    torch._dynamo.reset()
    lock = HostLock(cfg.host_lock)
    with lock.compiling():
        for mode in cfg.modes:
            say(f"{model} {dtype} b={batch} {mode} ...")
            row = _row(model, dtype, batch, mode, cfg, sizes, device)
            try:
                with own_caches(mode):  # no mode takes up another's kernels and their tuning
                    fn, backend = _compiled(module, mode, cfg)
                    _prepare(row, fn, backend, sets, want, graphs)
                timed.append((row, fn))
            except Exception as e:  # the row says so; the other modes go on
                row["error"] = f"{type(e).__name__}: {_first(e)}"
            rows.append(row)
    rounds = cfg.rounds if cfg.rounds is not None else 5 if graphs else 1
    say(f"{model} {dtype} b={batch}: timing {len(timed)} modes in {rounds} round(s)")
    with lock.timing():
        try:
            _time(timed, sets, timer, graphs, rounds)
        except Exception as e:
            for row, _ in timed:
                row["error"] = row["error"] or f"timing: {type(e).__name__}: {_first(e)}"
        _profile(timed, sets, timer, say)
    _speedups(rows)
    _floor(rows, nbytes, copy_bandwidth)
    return rows


def _profile(timed: Sequence[tuple[dict[str, Any], Any]], sets: list[tuple[Any, ...]],
             timer: Any, say: Callable[[str], None]) -> None:
    """Where each mode's time goes, where ``timer`` profiles kernels (``CudaTimer.kernels``:
    torch's profiler over plain calls): each row's ``kernels_total_us``, the µs per call of
    all its GPU kernels (its CUDA-graph time less this is what launches and gaps add), and
    ``kernels_us``, its ``KERNELS_KEPT`` slowest kernels as (name, µs per call): which kernel
    holds a mode back from the floor. A profile that fails leaves them None, with a note."""
    if not hasattr(timer, "kernels"):
        return
    for row, fn in timed:
        if row["error"] is not None:
            continue
        try:
            got = timer.kernels(fn, sets)
        except Exception as e:  # the times stand without it
            say(f"note: {row['model']} {row['mode']}: kernels not profiled: "
                f"{type(e).__name__}: {_first(e)}")
            continue
        row["kernels_total_us"] = sum(got.values())
        slowest = sorted(got.items(), key=lambda kv: -kv[1])[:KERNELS_KEPT]
        row["kernels_us"] = [[name, us] for name, us in slowest]


# --- the report --------------------------------------------------------------------------------

def _cell(r: Mapping[str, Any] | None) -> str:
    """``plain / graph`` µs of one mode, or why there is none."""
    if r is None:
        return "–"
    if r["plain_us"] is None:
        return "failed" if r.get("error") else "–"
    text = fmt(r["plain_us"]) + (f" / {fmt(r['graph_us'])}" if r["graph_us"] is not None else "")
    return text if r["matches_eager"] in (None, True) else text + " (WRONG)"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per model, dtype and batch: each mode's µs (plain / CUDA graph), each backend mode's
    speedup over the fastest mode that is not the backend's, every mode's fraction of the copy
    floor under graph replay in the order of the µs columns (``of floor (graph)``; – for a mode
    without one, a lone – for rows without a floor), the backend's pieces replaced and its
    largest error against eager; then a line on the floor where rows have one and a line for
    each failure."""
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    modes += sorted({r["mode"] for r in rows} - set(modes))
    ours_modes = [m for m in modes if m in BACKEND_MODES]
    short = {m: "ours" + m.removeprefix("egraph_mirage") for m in ours_modes}
    head = ["model", "dtype", "b", *[f"{m} µs" for m in modes],
            *[f"{short[m]} vs best" for m in ours_modes], "of floor (graph)", "replaced",
            "ours error"]
    body: list[list[str]] = []
    groups: dict[tuple[str, str, int], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["dtype"], r["batch"]), {})[r["mode"]] = r
    for (model, dtype, batch), by_mode in groups.items():
        speeds = []
        for m in ours_modes:
            ours = by_mode.get(m)
            speed = "–"
            if ours is not None and ours["speedup_vs_best"] is not None:
                speed = f"{fmt(ours['speedup_vs_best'], 2)}×"
                if ours["speedup_vs_best_graph"] is not None:
                    speed += f" / {fmt(ours['speedup_vs_best_graph'], 2)}×"
            speeds.append(speed)
        floors = [fmt(by_mode[m].get("floor_fraction_graph"), 2) if m in by_mode else "–"
                  for m in modes]
        floor = "–" if all(f == "–" for f in floors) else " / ".join(floors)
        mine = [by_mode[m] for m in ours_modes if m in by_mode]
        done = [r for r in mine if r["pieces"] is not None]
        replaced = " ".join(f"{r['replaced']}/{r['pieces']}" for r in done) or "–"
        errors = [r["max_error"] for r in mine if r["max_error"] is not None]
        error = "–" if not errors else f"{max(errors):.1e}" + (
            "" if all(r["matches_eager"] is not False for r in mine) else " WRONG")
        body.append([model, SHORT_DTYPES.get(dtype, str(dtype)), str(batch),
                     *[_cell(by_mode.get(m)) for m in modes], *speeds, floor, replaced, error])
    lines = aligned(head, body, left=1)
    timing = {r["timing"] for r in rows}
    lines.append("µs: plain launches / CUDA-graph replay" if timing == {"cuda"} else
                 f"µs: {', '.join(sorted(timing))}")
    bandwidths = sorted({r["copy_bandwidth"] for r in rows if r.get("copy_bandwidth")})
    if bandwidths:
        lines.append("of floor (graph): the copy floor over each mode's CUDA-graph µs, in the "
                     "order of the µs columns (floor: parameters, KV cache and activations moved "
                     f"once at {', '.join(f'{b / 1e12:.2f}' for b in bandwidths)} TB/s)")
    lines += [f"{r['model']} {r['dtype']} b={r['batch']} {r['mode']}: {r['error']}" for r in rows
              if r.get("error")]
    return "\n".join(lines + format_kernels(rows))


def format_kernels(rows: Sequence[Mapping[str, Any]], kept: int = 6) -> list[str]:
    """Where each profiled row's time goes (``kernels_us``): its kernels' µs per call in all,
    against its CUDA-graph µs and its floor, then its ``kept`` slowest kernels; none for rows
    without a profile."""
    lines: list[str] = []
    for r in rows:
        if not r.get("kernels_us"):
            continue
        if not lines:
            lines.append("kernels (torch's profiler over plain calls, µs per call; the "
                         "slowest first):")
        against = "".join(f", {what} {fmt(r.get(key))}" for what, key in
                          (("graph", "graph_us"), ("floor", "floor_us")) if r.get(key))
        slowest = ", ".join(f"{fmt(us)} {name[:60]}" for name, us in r["kernels_us"][:kept])
        lines.append(f"  {r['model']} {SHORT_DTYPES.get(r['dtype'], r['dtype'])} "
                     f"b={r['batch']} {r['mode']}: {fmt(r['kernels_total_us'])} in kernels"
                     f"{against}: {slowest}")
    return lines


# --- the command -------------------------------------------------------------------------------

def add_backend_arguments(p: Any) -> None:
    """The backend's search options that ``bench torch`` and ``bench generate`` share (besides
    ``--budget``, whose values they read alike but word apart)."""
    p.add_argument("--max-tasks", type=int, default=None, metavar="N",
                   help="search tasks per piece (default: no limit)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="search processes (default: every core)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="the backend's cache (default $EGRAPH_MIRAGE_CACHE or "
                   "~/.cache/egraph-mirage)")
    p.add_argument("--timing", choices=("both", "graph", "plain"), default="both",
                   help="the backend's timing option: a winner replaces its piece when faster "
                   "than Inductor's code under CUDA-graph replay and plain launches (both, the "
                   "default), or under one of them")
    p.add_argument("--no-cache", action="store_true",
                   help="search every piece again (neither read nor write the cache)")


def add_arguments(p: Any) -> None:
    """The options of ``egraph-mirage bench torch``."""
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--out", metavar="PATH", default=DEFAULT_OUT,
                   help=f"also write the rows to PATH as JSON (default {DEFAULT_OUT})")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16], metavar="B",
                   help="batch sizes (default 1 8 16)")
    p.add_argument("--preset", choices=("small", "llama3_8b"), default=None,
                   help="layer sizes (default llama3_8b, one layer of Llama-3-8B; small with "
                   "--cpu-smoke)")
    p.add_argument("--tp", type=int, default=1, help="llama3_8b's shard on one of TP GPUs")
    p.add_argument("--kv-len", type=int, default=4096, metavar="N",
                   help="tokens in the KV cache with llama3_8b (default 4096)")
    p.add_argument("--models", nargs="+", choices=MODELS, default=["llama", "hf"],
                   help="llama: examples/llama_layer.py's layer; hf, hf-qwen3: transformers' "
                   "LlamaDecoderLayer, Qwen3DecoderLayer (where installed), the new token "
                   "appended to the cache; hf-static, hf-qwen3-static: the same, the cache "
                   "written in place as StaticCache does; default llama hf")
    p.add_argument("--modes", nargs="+", choices=MODES, default=None,
                   help="default: all but max-autotune-timed (--cpu-smoke: eager and "
                   "egraph_mirage)")
    p.add_argument("--dtype", nargs="+", default=["float16"], metavar="DTYPE",
                   help=f"one or more of {', '.join(TOLERANCE)}, by spaces or commas: rows for "
                   "each (default float16)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGETS["torch backend"], metavar="S",
                   help="search seconds for each compilation, its pieces sharing them "
                   f"(default {DEFAULT_BUDGETS['torch backend']:g})")
    add_backend_arguments(p)
    p.add_argument("--rounds", type=int, default=None, metavar="N",
                   help="timing rounds, each timing every mode once; plain figures are the "
                   "fastest round, graph figures medians (default 5 on a GPU, 1 with --cpu-smoke)")
    add_host_lock(p)
    p.add_argument("--example", metavar="PATH",
                   help="examples/llama_layer.py (default: the checkout's)")
    p.add_argument("--table-of", nargs="+", metavar="PATH",
                   help="print the table of rows files written by --out (of this or an "
                   "unfinished run) and measure nothing")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="without a GPU: the small layer on the CPU, kernels in Triton's "
                   "interpreter, wall-clock times (a test of the command, not a benchmark)")


def config_from(args: Any, cuda: bool) -> TorchBenchConfig:
    """The configuration of the command line ``args``; ``BenchTorchError`` for what cannot
    run."""
    dtypes = [d for item in args.dtype for d in item.split(",") if d]
    unknown = [d for d in dtypes if d not in TOLERANCE]
    if unknown or not dtypes:
        raise BenchTorchError(f"bench torch: --dtype {' '.join(unknown) or '(none)'}: one or "
                              f"more of {', '.join(TOLERANCE)}")
    if not cuda and not args.cpu_smoke:
        raise BenchTorchError("bench torch needs a CUDA GPU, and torch sees none (--cpu-smoke "
                              "runs the small layer on the CPU, as a test of the command)")
    if any(b < 1 for b in args.batch) or args.tp < 1 or args.kv_len < 1 or (
            args.rounds is not None and args.rounds < 1):
        raise BenchTorchError("bench torch: --batch, --tp, --kv-len and --rounds must be "
                              "positive")
    try:  # the backend's budget, task budget and workers, as the pipeline's Request checks them
        request_from_flags(time_budget=args.budget, max_tasks=args.max_tasks,
                           workers=args.workers)
    except EMError as e:
        raise BenchTorchError(f"bench torch: {e}") from None
    smoke = args.cpu_smoke and not cuda
    preset = args.preset or ("small" if smoke else "llama3_8b")
    if smoke and preset != "small":
        raise BenchTorchError("bench torch --cpu-smoke runs the small preset only (the "
                              "interpreter would take hours on llama3_8b)")
    return TorchBenchConfig(
        models=args.models, batches=args.batch, preset=preset,
        tp=args.tp, kv_len=args.kv_len,
        modes=args.modes or (("eager", "egraph_mirage") if smoke else DEFAULT_MODES),
        dtypes=tuple(dict.fromkeys(dtypes)), budget=args.budget, max_tasks=args.max_tasks,
        workers=args.workers,
        cache_dir=args.cache_dir, cache=not args.no_cache, rest="eager" if smoke else "inductor",
        device="cpu" if smoke else "cuda", example=args.example,
        backend_options={"timing": args.timing}, rounds=args.rounds, host_lock=args.host_lock)


def run_command(args: Any) -> int:
    """``egraph-mirage bench torch``: measure, write the JSON rows (after each model, dtype and
    batch, so that a run cut short keeps what it measured), print the table (or JSON). Exits 1
    when the backend's output differs from eager beyond the tolerance. ``--table-of``: print the
    table of rows files, measure nothing."""
    if args.table_of:
        return _print_table_of(args.table_of, args.json)
    import torch

    from ..files import write_atomic
    from ..rank.measured import keep_jax_off_the_gpu

    cfg = config_from(args, bool(torch.cuda.is_available()))
    keep_jax_off_the_gpu()  # before the backend's search imports JAX
    done: list[dict[str, Any]] = []
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)

    def on_row(row: dict[str, Any]) -> None:
        print(json.dumps({k: row[k] for k in KEYS if k not in ("report", "sizes",
                                                                  "kernels_us")}),
              file=sys.stderr, flush=True)
        done.append(row)
        if args.out:
            write_atomic(args.out, json.dumps(done, indent=1) + "\n")

    rows = bench_torch(cfg, on_row=on_row)
    if args.out:
        write_atomic(args.out, json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    wrong = [r for r in rows if r["mode"] in BACKEND_MODES and r["matches_eager"] is False]
    return 1 if wrong else 0


def _print_table_of(paths: Sequence[str], as_json: bool) -> int:
    """``--table-of``: the rows of every file that exists, as one table; 1 where none has
    rows."""
    return print_table_of(paths, as_json, "bench torch", "JSON rows", json.loads, format_table,
                          BenchTorchError)


def print_table_of(paths: Sequence[str], as_json: bool, command: str, kind: str,
                   parse: Callable[[str], list[dict[str, Any]]],
                   table: Callable[[list[dict[str, Any]]], str],
                   error: type[EMError]) -> int:
    """A bench command's ``--table-of``: the rows ``parse`` reads from each of ``paths`` that
    exists (a note for each that does not), printed as ``table`` or as JSON; 1 where none has
    rows. A file ``parse`` cannot read raises ``error``, naming it as not ``kind``."""
    rows: list[dict[str, Any]] = []
    for path in paths:
        file = Path(path)
        if not file.is_file():
            print(f"note: {path}: no such file", file=sys.stderr)
            continue
        try:
            rows += parse(file.read_text())
        except json.JSONDecodeError as e:
            raise error(f"{command} --table-of: {path} is not {kind} ({e})") from None
    if not rows:
        print(f"{command} --table-of: no rows", file=sys.stderr)
        return 1
    print(json.dumps(rows, indent=1) if as_json else table(rows))
    return 0
