"""``egraph-mirage bench generate``: a whole ``transformers`` model's ``generate()``, decode tokens
per second, on a GPU.

* models (``FAMILIES``): ``llama`` (``LlamaForCausalLM``) and ``qwen3`` (``Qwen3ForCausalLM``:
  Llama's layers with ``q_norm``/``k_norm``), built from their config at the sizes of a preset
  (``PRESETS``: ``llama3_8b``, the layer sizes of Llama-3-8B, hidden 4096, 32 heads, 8 KV heads,
  head dim 128, MLP 14336, the family's real vocabulary, ``REAL_VOCAB``; ``small`` for the CPU),
  ``layers`` decoder layers, random weights under a fixed seed (nothing is downloaded);
* modes (``MODES``): ``eager``; ``compile``, ``torch.compile`` in mode "reduce-overhead" (CUDA
  graphs) with ``dynamic=False``; ``max-autotune``, mode "max-autotune" (CUDA graphs too); and
  the backend's modes (``BACKEND_MODES``): ``egraph_mirage``, the backend (``fx.backend.Backend``
  with ``budget``, ``max_tasks``, ``workers``, ``cache_dir``, ``timing``) in mode
  "reduce-overhead" (Inductor compiles the rest with CUDA graphs), and
  ``egraph_mirage-max-autotune``, the same in mode "max-autotune".

How the forward is compiled: **transformers' own path**, the one ``generate()`` takes with a
static cache: a ``GenerationConfig`` with ``cache_implementation="static"``, ``max_cache_len``
(one cache shape for every call, so nothing recompiles between calls) and ``compile_config=
CompileConfig(backend=..., mode=..., dynamic=False)``; ``disable_compile=True`` for ``eager``.
``generate()`` then runs the prefill eagerly and every decode step through
``torch.compile(model.__call__, **compile_config.to_dict())`` (``get_compiled_call``; the same
in transformers 5.17 and 5.24). ``CompileConfig.to_dict()`` deep-copies its backend, so the
backend goes in as ``SharedBackend``, which copies as itself and keeps the reports readable.
Dynamo is reset before each model and batch (not between modes: see below). On the CPU
(``--cpu-smoke``) the config's ``_compile_all_devices`` lets ``generate()`` compile there.

Decode tokens per second: per mode, a first ``generate()`` of ``new_tokens + 1`` tokens compiles
and warms up (``compile_s``, its wall time: Dynamo, the compilation, the backend's searches,
CUDA-graph recording, the prefill and the decode), with Inductor caches of the mode's own
(``bench.inductor_caches.own_caches``: no mode takes up the kernels another compiled, nor their
tuning). Once every mode of a batch is compiled, the
modes are timed in **alternating rounds** (``_timed``): a round calls each mode in turn, from a
different first mode each round, so that the host's and the GPU's drift over the run (a decode
step of a few layers is bound by the host's Python as much as by the GPU) falls on every mode
alike; each mode's compiled forward is put back on the model before its calls (``_Compiled``),
and Dynamo keeps the modes' code apart by backend. One untimed round first, then ``repeats``
timed ones. In a round, per mode: ``generate()`` of 1 new token (the prefill and the token it
gives: no decode step) and of ``new_tokens + 1`` (the same prefill, then ``new_tokens`` decode
steps), each timed by the wall clock between two ``torch.cuda.synchronize()``. ``prefill_ms``
is the median of the first, ``decode_ms_per_step`` the median of the second less the median
of the first, over ``new_tokens``: one decode step of the whole batch, as ``generate()`` runs
it (the compiled forward, the logits processing, the greedy pick, the loop's host work);
``decode_tok_s`` is ``batch`` tokens per step. End-of-sequence is off (``eos_token_id=None``):
every call makes exactly its tokens.

The copy floor of a decode step: ``floor_bytes``, what a step must read at least once, the
model's parameters (the input embedding's table less the batch's rows, which are all a step
reads of it, unless the output head shares it) and its static cache whole (the keys and values
of every layer at ``max_cache_len``, which the graph's attention reads); ``copy_bandwidth``,
the device's copy bandwidth (read + write bytes per second, ``gpu.floor.
measure_copy_bandwidth``, once per run, as ``bench gpu`` and ``bench torch`` measure it);
``floor_us``, those bytes at that bandwidth; ``floor_fraction``, ``floor_us`` over the mode's
decode step: 1 would be a step at copy speed, the loop's host work included. On the CPU they
are None but ``floor_bytes``.

The greedy tokens of each mode's first call are compared with eager's: ``tokens_match``, and
``first_diff``, the first position after the prompt where any sequence differs (random weights
make ties rare, but fp16 drift can flip a token late; this is reported, not failed).
``speedup_vs_eager``: the mode's ``decode_tok_s`` over eager's; ``speedup_vs_best``: over the
fastest ``torch.compile`` mode's (``compile``, ``max-autotune``). The backend's rows carry
``pieces``, ``replaced``, ``searches``, ``cache_hits`` and ``report`` (``em.torch_report``'s
text); with ``again``, the backend mode is compiled once more after a ``torch._dynamo.reset()``
with a new ``Backend`` on the same cache (``again_compile_s``, ``again_searches``,
``again_cache_hits``; torch's cache hits and misses over it, ``again_torch_caches``; the
backend's stage times, ``again_stages``), after the timed rounds. A mode that fails keeps its
row, with ``error``.

Without a CUDA GPU the command refuses, unless ``--cpu-smoke``: the small preset, 1 or 2
layers, eager and ``egraph_mirage`` with its rest run eagerly, a few tokens; it tests the
command, its figures mean nothing.
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..errors import EMError
from ..pipeline import DEFAULT_BUDGETS
from ..pipeline.command import request_from_flags
from .gpu_report import fmt
from .host_lock import HostLock
from .host_lock import add_argument as add_host_lock
from .inductor_caches import own_caches
from .text_table import aligned
from .torch_bench import (
    SHORT_DTYPES,
    BackendSettings,
    _first,
    add_backend_arguments,
    print_table_of,
)

__all__ = ["BACKEND_MODES", "FAMILIES", "KEYS", "MODES", "PRESETS", "BenchGenerateError",
           "GenerateBenchConfig", "ModelSizes", "SharedBackend", "add_arguments",
           "bench_generate", "build_model", "format_table", "run_command", "timed_generate"]

#: family: (its config class, its causal-LM class), names in ``transformers``
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
            "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}
#: the families' real vocabularies (Llama-3, Qwen3)
REAL_VOCAB = {"llama": 128256, "qwen3": 151936}
#: mode: ``torch.compile``'s mode for it (None: eager); every compiled mode uses CUDA graphs
MODES: dict[str, str | None] = {
    "eager": None, "compile": "reduce-overhead", "max-autotune": "max-autotune",
    "egraph_mirage": "reduce-overhead", "egraph_mirage-max-autotune": "max-autotune"}
BACKEND_MODES = ("egraph_mirage", "egraph_mirage-max-autotune")
#: the ``torch.compile`` modes the backend is measured against
TORCH_MODES = ("compile", "max-autotune")
DEFAULT_MODES = ("eager", "compile", "max-autotune", "egraph_mirage")
KEYS = ("model", "preset", "sizes", "layers", "vocab", "dtype", "attn", "batch", "prompt_len",
        "new_tokens", "max_cache_len", "device", "timing", "backend_timing", "transformers",
        "torch", "mode",
        "compile_mode", "compile_s", "prefill_ms", "decode_ms_per_step", "decode_tok_s",
        "speedup_vs_eager", "speedup_vs_best", "repeats", "tokens_match", "first_diff",
        "param_bytes", "cache_bytes", "floor_bytes", "copy_bandwidth", "floor_us",
        "floor_fraction", "pieces", "replaced", "searches", "cache_hits", "report",
        "again_compile_s", "again_searches", "again_cache_hits", "again_torch_caches",
        "again_stages", "error")
#: torch's counters of its caches' hits and misses (group, name), counted over ``--again``
TORCH_CACHES = (("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"),
                ("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"))
DEFAULT_OUT = "egraph-mirage-out/bench_generate.jsonl"


class BenchGenerateError(EMError, ValueError):
    """A setting of ``bench generate`` that cannot be run (no GPU, no transformers, ...)."""


@dataclass(frozen=True)
class ModelSizes:
    """A decoder layer's sizes; the vocabulary is the family's (``REAL_VOCAB``) unless set."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int | None = None


PRESETS = {"llama3_8b": ModelSizes(4096, 32, 8, 128, 14336),
           "small": ModelSizes(64, 4, 2, 16, 128, vocab=256)}


@dataclass
class GenerateBenchConfig(BackendSettings):
    """What ``bench_generate`` measures (module docstring); the backend's options are
    ``BackendSettings``'."""

    models: Sequence[str] = ("llama", "qwen3")
    preset: str = "llama3_8b"
    #: decoder layers: Llama-3-8B's 32 (≈ 16 GB of fp16 weights with the 128256-token
    #: vocabulary's embedding and head, plus the cache: well within one 80 GB GPU)
    layers: int = 32
    vocab: int | None = None
    dtype: str = "float16"
    attn: str = "sdpa"
    batches: Sequence[int] = (1, 8)
    prompt_len: int = 128
    new_tokens: int = 128
    max_cache_len: int = 1024
    modes: Sequence[str] = DEFAULT_MODES
    repeats: int = 3
    seed: int = 1
    device: str = "cuda"
    again: bool = False
    #: the lock file of the host's benchmarks (``bench.host_lock``; None: none)
    host_lock: str | None = None

    def sizes(self) -> ModelSizes:
        if self.preset not in PRESETS:
            raise BenchGenerateError(f"bench generate: unknown preset {self.preset!r} "
                                     f"({', '.join(PRESETS)})")
        return PRESETS[self.preset]


class SharedBackend:
    """A ``Backend`` that ``CompileConfig.to_dict()``'s deep copy leaves as it is, so that its
    ``reports`` and ``searches`` are those of the compilations ``generate()`` ran."""

    __name__ = "egraph_mirage"

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def __call__(self, gm: Any, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
        return self.backend(gm, example_inputs, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> SharedBackend:
        return self


def build_model(family: str, sizes: ModelSizes, layers: int, vocab: int, dtype: Any,
                device: str, seed: int, attn: str = "sdpa") -> Any:
    """``family``'s causal LM at ``sizes`` with ``layers`` layers, random weights under
    ``seed``, for inference, built on ``device`` in ``dtype``; end-of-sequence off."""
    import torch
    import transformers

    config_class, model_class = (getattr(transformers, n) for n in FAMILIES[family])
    config = config_class(
        hidden_size=sizes.hidden, intermediate_size=sizes.mlp,
        num_attention_heads=sizes.heads, num_key_value_heads=sizes.kv_heads,
        head_dim=sizes.head_dim, num_hidden_layers=layers, vocab_size=vocab, rms_norm_eps=1e-5,
        max_position_embeddings=8192, tie_word_embeddings=False, bos_token_id=None,
        eos_token_id=None, pad_token_id=0, attn_implementation=attn)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class._from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def _compile_config(mode: str, cfg: GenerateBenchConfig) -> tuple[Any, Any]:
    """``mode``'s ``CompileConfig`` (None for eager) and its ``Backend`` (None but for the
    backend's modes)."""
    from transformers import CompileConfig

    if mode not in MODES:
        raise BenchGenerateError(f"bench generate: unknown mode {mode!r} ({', '.join(MODES)})")
    if mode == "eager":
        return None, None
    backend = None
    if mode in BACKEND_MODES:
        from ..fx.backend import Backend

        backend = Backend(**cfg.backend())
    config = CompileConfig(backend=SharedBackend(backend) if backend else "inductor",
                           mode=MODES[mode], dynamic=False, fullgraph=False)
    config._compile_all_devices = cfg.device != "cuda"
    return config, backend


def timed_generate(model: Any, prompt: Any, new: int, compile_config: Any,
                   cfg: GenerateBenchConfig) -> tuple[Any, float]:
    """The tokens ``generate()`` gives after ``prompt`` (greedy, ``new`` of them, a static
    cache of ``max_cache_len``), and its seconds between two synchronizations."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new, do_sample=False, cache_implementation="static",
        max_cache_len=cfg.max_cache_len, compile_config=compile_config,
        disable_compile=compile_config is None, pad_token_id=0, eos_token_id=None)
    sync = torch.cuda.synchronize if cfg.device == "cuda" else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                             generation_config=config)
        sync()
        seconds = time.perf_counter() - t0
    tokens = out[:, prompt.shape[1]:]
    if tokens.shape[1] != new:
        raise BenchGenerateError(f"bench generate: generate() gave {tokens.shape[1]} tokens, "
                                 f"not {new}")
    return tokens.cpu(), seconds


def _first_diff(got: Any, want: Any) -> int | None:
    """The first position where any sequence of ``got`` differs from ``want``; None if none."""
    differ = (got != want).any(dim=0).nonzero()
    return int(differ[0, 0]) if differ.numel() else None


@dataclass
class _Compiled:
    """A mode's compiled forward, as ``generate()`` left it on the model after its first call
    (``get_compiled_call``): put back before each of the mode's timed calls (``use``), so that
    the modes' calls can alternate without compiling again. Dynamo keeps each mode's code
    apart (its cache entries are guarded by their backend)."""

    config: Any  # the mode's CompileConfig (None: eager)
    backend: Any  # its Backend (None but for the backend's modes)
    call: Any = None  # model._compiled_call after the first call
    last: Any = None  # model._last_compile_config after it

    def use(self, model: Any) -> None:
        if self.config is not None:
            model._compiled_call, model._last_compile_config = self.call, self.last


def _first_call(model: Any, prompt: Any, mode: str, row: dict[str, Any], want: Any,
                cfg: GenerateBenchConfig) -> tuple[Any, _Compiled]:
    """``mode``'s first ``generate()``: it compiles (``compile_s``), its tokens against eager's
    ``want`` (None: eager's are not there), the backend's counts; the tokens and the compiled
    forward."""
    compiled = _Compiled(*_compile_config(mode, cfg))
    tokens, row["compile_s"] = timed_generate(model, prompt, cfg.new_tokens + 1,
                                              compiled.config, cfg)
    compiled.call = getattr(model, "_compiled_call", None)
    compiled.last = getattr(model, "_last_compile_config", None)
    if mode == "eager":
        row.update(tokens_match=True)
    elif want is not None:
        diff = _first_diff(tokens, want)
        row.update(tokens_match=diff is None, first_diff=diff)
    if compiled.backend is not None:
        row.update(_backend_counts(compiled.backend))
    return tokens, compiled


def _timed(model: Any, prompt: Any, compiled: Mapping[str, _Compiled],
           rows: Mapping[str, dict[str, Any]], cfg: GenerateBenchConfig) -> None:
    """Every mode's decode timing, in alternating rounds: one untimed round (a mode's CUDA
    graphs may record again once another's ran between its calls), then ``repeats`` rounds,
    each calling every mode in turn, from a different first mode each round, so that the
    host's and the GPU's drift during the run falls on every mode alike. A round calls
    ``generate()`` of 1 token then of ``new_tokens + 1`` per mode (module docstring). A graph
    Dynamo compiles during the timed rounds (a mode's code not kept) is an error: its time
    would be in the figures."""
    from torch._dynamo.utils import counters

    n = cfg.new_tokens + 1
    modes = list(compiled)
    short: dict[str, list[float]] = {m: [] for m in modes}
    full: dict[str, list[float]] = {m: [] for m in modes}
    graphs = 0
    for r in range(cfg.repeats + 1):
        if r == 1:
            graphs = counters["stats"]["unique_graphs"]
        for mode in modes[r % len(modes):] + modes[:r % len(modes)]:
            compiled[mode].use(model)  # both calls find it: the same config keeps it
            first = timed_generate(model, prompt, 1, compiled[mode].config, cfg)[1]
            whole = timed_generate(model, prompt, n, compiled[mode].config, cfg)[1]
            if r:
                short[mode].append(first)
                full[mode].append(whole)
    again = counters["stats"]["unique_graphs"] - graphs
    if again:
        raise BenchGenerateError(f"Dynamo compiled {again} graph(s) during the timed rounds")
    for mode in modes:
        prefill, whole = statistics.median(short[mode]), statistics.median(full[mode])
        step = (whole - prefill) / cfg.new_tokens
        rows[mode].update(prefill_ms=prefill * 1e3, decode_ms_per_step=step * 1e3,
                          decode_tok_s=rows[mode]["batch"] / step if step > 0 else None)


def _again(model: Any, prompt: Any, mode: str, row: dict[str, Any],
           cfg: GenerateBenchConfig) -> None:
    """A backend mode compiled once more after a Dynamo reset, with a new ``Backend`` on the
    same cache: ``again_compile_s`` and its counts."""
    from torch._dynamo.utils import counters

    _reset()
    compile_config, backend = _compile_config(mode, cfg)
    before = {k: counters[group][k] for group, k in TORCH_CACHES}
    row["again_compile_s"] = timed_generate(model, prompt, cfg.new_tokens + 1,
                                            compile_config, cfg)[1]
    counts = _backend_counts(backend)
    row.update(again_searches=counts["searches"], again_cache_hits=counts["cache_hits"],
               again_torch_caches={k: counters[group][k] - before[k]
                                   for group, k in TORCH_CACHES},
               again_stages=" | ".join(r.stages_text() for r in backend.reports))


def _backend_counts(backend: Any) -> dict[str, Any]:
    from ..fx.report import torch_report

    pieces = [p for r in backend.reports for p in r.pieces]
    return {"pieces": len(pieces), "replaced": sum(p.status == "replaced" for p in pieces),
            "searches": backend.searches, "cache_hits": sum(p.cache == "hit" for p in pieces),
            "report": torch_report(backend)}


def _reset() -> None:
    """Dynamo's caches (and CUDA-graph trees) dropped, their memory freed."""
    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _speedups(rows: list[dict[str, Any]]) -> None:
    """Each row's decode rate over eager's and over the fastest ``torch.compile`` mode's."""
    rate = {r["mode"]: r["decode_tok_s"] for r in rows if r["decode_tok_s"]}
    best = max((rate[m] for m in TORCH_MODES if m in rate), default=None)
    for r in rows:
        if r["decode_tok_s"]:
            r["speedup_vs_eager"] = r["decode_tok_s"] / rate["eager"] if "eager" in rate else None
            r["speedup_vs_best"] = r["decode_tok_s"] / best if best else None


def _bytes(model: Any, sizes: ModelSizes, layers: int, batch: int,
           cfg: GenerateBenchConfig) -> tuple[int, int, int]:
    """The model's parameter bytes, its static cache's (keys and values of every layer), and
    a decode step's floor bytes (module docstring)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    itemsize = next(model.parameters()).element_size()
    cache = 2 * layers * batch * sizes.kv_heads * cfg.max_cache_len * sizes.head_dim * itemsize
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    floor = params + cache
    if head is None or head.weight is not embedding:  # only the batch's rows of it are read
        floor -= (embedding.numel() - batch * embedding.shape[-1]) * embedding.element_size()
    return params, cache, floor


def _floor(row: dict[str, Any], bandwidth: float | None) -> None:
    """The row's floor time at ``bandwidth`` (bytes/s; None: not measured, no floor time) and
    its fraction of the row's decode step."""
    if bandwidth is None:
        return
    row.update(copy_bandwidth=bandwidth, floor_us=row["floor_bytes"] / bandwidth * 1e6)
    if row["decode_ms_per_step"]:
        row["floor_fraction"] = row["floor_us"] / (row["decode_ms_per_step"] * 1e3)


def bench_generate(cfg: GenerateBenchConfig, on_row: Callable[[dict[str, Any]], None] | None = None,
                   log: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every model, batch and mode of ``cfg``, eager first (its tokens are the reference); one
    row each (module docstring), passed to ``on_row`` once its batch's modes are measured."""
    import torch
    import transformers

    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    sizes = cfg.sizes()
    dtype = getattr(torch, cfg.dtype)
    device = torch.cuda.get_device_name() if cfg.device == "cuda" else "cpu"
    modes = list(dict.fromkeys(["eager", *cfg.modes]))  # each once, eager first
    bandwidth = None
    if cfg.device == "cuda":
        from ..gpu.floor import measure_copy_bandwidth

        bandwidth = measure_copy_bandwidth()
        say(f"copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)")
    out: list[dict[str, Any]] = []
    lock = HostLock(cfg.host_lock)
    for family in cfg.models:
        vocab = cfg.vocab or sizes.vocab or REAL_VOCAB[family]
        model = build_model(family, sizes, cfg.layers, vocab, dtype, cfg.device, cfg.seed,
                            cfg.attn)
        for batch in cfg.batches:
            generator = torch.Generator().manual_seed(cfg.seed)
            prompt = torch.randint(1, vocab, (batch, cfg.prompt_len),
                                   generator=generator).to(cfg.device)
            params, cache, floor = _bytes(model, sizes, cfg.layers, batch, cfg)
            rows: dict[str, dict[str, Any]] = {}
            compiled: dict[str, _Compiled] = {}
            want = None
            _reset()
            with lock.compiling():
                for mode in modes:  # each compiled and checked, one after the other
                    say(f"{family} L={cfg.layers} b={batch} {mode} ...")
                    row: dict[str, Any] = dict.fromkeys(KEYS)
                    row.update(model=family, preset=cfg.preset, sizes=asdict(sizes),
                               layers=cfg.layers, vocab=vocab, dtype=cfg.dtype, attn=cfg.attn,
                               batch=batch, prompt_len=cfg.prompt_len, new_tokens=cfg.new_tokens,
                               max_cache_len=cfg.max_cache_len, device=device,
                               timing="cuda" if cfg.device == "cuda" else "cpu wall clock",
                               backend_timing=cfg.backend_timing(),
                               transformers=transformers.__version__, torch=torch.__version__,
                               mode=mode, compile_mode=MODES.get(mode), repeats=cfg.repeats,
                               param_bytes=params, cache_bytes=cache, floor_bytes=floor)
                    rows[mode] = row
                    try:
                        with own_caches(mode):  # no mode takes up another's kernels and tuning
                            tokens, compiled[mode] = _first_call(model, prompt, mode, row, want,
                                                                 cfg)
                        if mode == "eager":
                            want = tokens
                    except Exception as e:  # the row says so; the other modes go on
                        row["error"] = f"{type(e).__name__}: {_first(e)}"
            say(f"{family} L={cfg.layers} b={batch}: {cfg.repeats} rounds of "
                f"{', '.join(compiled)}")
            with lock.timing():
                try:
                    if compiled:
                        _timed(model, prompt, compiled, rows, cfg)
                except Exception as e:
                    for mode in compiled:
                        rows[mode]["error"] = f"timing: {type(e).__name__}: {_first(e)}"
            for mode in compiled:
                if cfg.again and mode in BACKEND_MODES and not rows[mode]["error"]:
                    try:  # its own caches, as a rerun
                        with lock.compiling(), own_caches(mode, fresh=False):
                            _again(model, prompt, mode, rows[mode], cfg)
                    except Exception as e:
                        rows[mode]["error"] = f"again: {type(e).__name__}: {_first(e)}"
            for row in rows.values():
                _floor(row, bandwidth)
            _speedups(list(rows.values()))
            for row in rows.values():
                if on_row is not None:
                    on_row(row)
            out += rows.values()
        del model
        _reset()
    return out


# --- the report --------------------------------------------------------------------------------

def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line per model, layers, dtype and batch: each mode's decode tokens/s, the backend's
    speedup over the fastest ``torch.compile`` mode, whether its tokens match eager's (else the
    first position that differs), its pieces replaced and its compile seconds (and again);
    then a line per failed mode."""
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    ours = [m for m in modes if m in BACKEND_MODES]
    short = {m: "ours" + m.removeprefix("egraph_mirage") for m in ours}
    head = ["model", "L", "dtype", "b", *[f"{m} tok/s" for m in modes],
            *[f"{short[m]} vs best" for m in ours], "of floor", "tokens", "replaced",
            "ours compile s"]
    groups: dict[tuple[Any, ...], dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["layers"], r["dtype"], r["batch"]), {})[r["mode"]] = r
    body = []
    for (model, layers, dtype, batch), by_mode in groups.items():
        cells = [fmt(by_mode[m]["decode_tok_s"]) if m in by_mode else "–" for m in modes]
        speeds = [f"{fmt(by_mode[m]['speedup_vs_best'], 2)}×" if m in by_mode and
                  by_mode[m]["speedup_vs_best"] is not None else "–" for m in ours]
        tokens = " ".join("same" if r["tokens_match"] else f"@{r['first_diff']}"
                          for r in by_mode.values() if r["mode"] != "eager" and
                          r["tokens_match"] is not None) or "–"
        floors = [fmt(by_mode[m].get("floor_fraction"), 2) if m in by_mode else "–"
                  for m in modes]
        floor = "–" if all(f == "–" for f in floors) else " / ".join(floors)
        mine = [by_mode[m] for m in ours if m in by_mode and by_mode[m]["pieces"] is not None]
        replaced = " ".join(f"{r['replaced']}/{r['pieces']}" for r in mine) or "–"
        compile_s = " ".join(fmt(r["compile_s"]) + (f" ({fmt(r['again_compile_s'])})"
                             if r["again_compile_s"] is not None else "") for r in mine) or "–"
        body.append([model, str(layers), SHORT_DTYPES.get(dtype, dtype), str(batch), *cells,
                     *speeds, floor, tokens, replaced, compile_s])
    lines = aligned(head, body, left=1)
    lines.append("tok/s: decode tokens per second of generate() (the batch's tokens per step); "
                 "of floor: the step's copy floor over each mode's step, in the order of the "
                 "tok/s columns; tokens: each compiled mode's greedy tokens against eager's "
                 "(@N: the first position that differs); ours compile s: the first generate() "
                 "(a second compile from the cache in brackets)")
    lines += [f"{r['model']} L={r['layers']} b={r['batch']} {r['mode']}: {r['error']}"
              for r in rows if r.get("error")]
    return "\n".join(lines)


# --- the command -------------------------------------------------------------------------------

def seconds_or_none(text: str) -> float | None:
    """``--budget``: seconds, or "none" (no limit)."""
    return None if text.lower() == "none" else float(text)


def add_arguments(p: Any) -> None:
    """The options of ``egraph-mirage bench generate``."""
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--out", metavar="PATH", default=DEFAULT_OUT,
                   help=f"write each row to PATH as one JSON line once its batch's modes are "
                   f"measured (the file is started afresh; default {DEFAULT_OUT})")
    p.add_argument("--models", nargs="+", choices=tuple(FAMILIES), default=["llama", "qwen3"],
                   help="LlamaForCausalLM, Qwen3ForCausalLM (default both)")
    p.add_argument("--preset", choices=tuple(PRESETS), default=None,
                   help="layer sizes (default llama3_8b; small with --cpu-smoke)")
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="decoder layers (default 32, Llama-3-8B's; 1 with --cpu-smoke)")
    p.add_argument("--vocab", type=int, default=None, metavar="V",
                   help="vocabulary (default the family's real one, 128256 or 151936; 256 for "
                   "small)")
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa",
                   help="transformers' attention implementation (default sdpa)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8], metavar="B",
                   help="batch sizes (default 1 8)")
    p.add_argument("--prompt-len", type=int, default=None, metavar="N",
                   help="prompt tokens (default 128; 8 with --cpu-smoke)")
    p.add_argument("--new-tokens", type=int, default=None, metavar="N",
                   help="decode steps timed (default 128; 3 with --cpu-smoke)")
    p.add_argument("--max-cache-len", type=int, default=None, metavar="N",
                   help="the static cache's length (default 1024; 32 with --cpu-smoke)")
    p.add_argument("--modes", nargs="+", choices=tuple(MODES), default=None,
                   help="default: eager compile max-autotune egraph_mirage (--cpu-smoke: eager "
                   "egraph_mirage); eager always runs, first")
    p.add_argument("--repeats", type=int, default=3, metavar="N",
                   help="timed rounds, each timing every mode in turn (default 3; medians)")
    p.add_argument("--seed", type=int, default=1, help="weights and prompt (default 1)")
    p.add_argument("--again", action="store_true",
                   help="compile the backend's modes once more after a Dynamo reset, from the "
                   "same cache, and record the compile time")
    p.add_argument("--budget", type=seconds_or_none, default=DEFAULT_BUDGETS["torch backend"],
                   metavar="S", help="search seconds for each compilation, all its pieces "
                   f"sharing them, or none (default {DEFAULT_BUDGETS['torch backend']:g})")
    add_backend_arguments(p)
    add_host_lock(p)
    p.add_argument("--table-of", nargs="+", metavar="PATH",
                   help="print the table of rows files written by --out and measure nothing")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="without a GPU: the small preset, 1-2 layers, on the CPU (a test of the "
                   "command, not a benchmark)")


def config_from(args: Any, cuda: bool) -> GenerateBenchConfig:
    """The configuration of the command line ``args``; ``BenchGenerateError`` for what cannot
    run."""
    if not cuda and not args.cpu_smoke:
        raise BenchGenerateError("bench generate needs a CUDA GPU, and torch sees none "
                                 "(--cpu-smoke runs the small preset on the CPU, as a test of "
                                 "the command)")
    smoke = args.cpu_smoke and not cuda
    preset = args.preset or ("small" if smoke else "llama3_8b")
    layers = args.layers if args.layers is not None else 1 if smoke else 32
    prompt = args.prompt_len if args.prompt_len is not None else 8 if smoke else 128
    new = args.new_tokens if args.new_tokens is not None else 3 if smoke else 128
    cache = args.max_cache_len if args.max_cache_len is not None else 32 if smoke else 1024
    if smoke and (preset != "small" or layers > 2):
        raise BenchGenerateError("bench generate --cpu-smoke runs the small preset with 1 or 2 "
                                 "layers only")
    numbers = {"--batch": min(args.batch), "--layers": layers, "--prompt-len": prompt,
               "--new-tokens": new, "--repeats": args.repeats,
               "--vocab": args.vocab if args.vocab is not None else 1}
    bad = [f"{k} {v}" for k, v in numbers.items() if v < 1]
    if bad:
        raise BenchGenerateError(f"bench generate: {', '.join(bad)}: must be positive")
    if prompt + new + 1 > cache:
        raise BenchGenerateError(f"bench generate: --max-cache-len {cache} is shorter than "
                                 f"--prompt-len + --new-tokens + 1 = {prompt + new + 1}")
    try:  # the backend's budget, task budget and workers, as the pipeline's Request checks them
        request_from_flags(time_budget=args.budget, max_tasks=args.max_tasks,
                           workers=args.workers)
    except EMError as e:
        raise BenchGenerateError(f"bench generate: {e}") from None
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise BenchGenerateError("bench generate needs transformers (pip install "
                                 "transformers)") from None
    return GenerateBenchConfig(
        models=args.models, preset=preset, layers=layers, vocab=args.vocab, dtype=args.dtype,
        attn=args.attn, batches=args.batch, prompt_len=prompt, new_tokens=new,
        max_cache_len=cache, modes=args.modes or (
            ("eager", "egraph_mirage") if smoke else DEFAULT_MODES),
        repeats=args.repeats, seed=args.seed, device="cpu" if smoke else "cuda",
        again=args.again, budget=args.budget, max_tasks=args.max_tasks, workers=args.workers,
        cache_dir=args.cache_dir, cache=not args.no_cache, rest="eager" if smoke else "inductor",
        backend_options={"timing": args.timing}, host_lock=args.host_lock)


def run_command(args: Any) -> int:
    """``egraph-mirage bench generate``: measure, append each row to ``--out`` as a JSON line
    once its batch is measured, print the table (or JSON). Exits 1 when a backend mode failed.
    ``--table-of``: print the table of rows files, measure nothing."""
    if args.table_of:
        return _print_table_of(args.table_of, args.json)
    import torch

    from ..rank.measured import keep_jax_off_the_gpu

    cfg = config_from(args, bool(torch.cuda.is_available()))
    keep_jax_off_the_gpu()  # before the backend's search imports JAX
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("")

    def on_row(row: dict[str, Any]) -> None:
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")

    rows = bench_generate(cfg, on_row=on_row)
    if args.out:  # again, with the speedups filled in
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"wrote {args.out}", file=sys.stderr)
    print(json.dumps(rows, indent=1) if args.json else format_table(rows))
    return 1 if any(r["mode"] in BACKEND_MODES and r["error"] for r in rows) else 0


def _print_table_of(paths: Sequence[str], as_json: bool) -> int:
    """``--table-of``: the rows of every JSON-lines file that exists; 1 where none has rows."""
    return print_table_of(paths, as_json, "bench generate", "JSON lines", _json_lines,
                          format_table, BenchGenerateError)


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
