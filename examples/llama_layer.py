"""A Llama-style decoder layer in plain torch, for the ``torch.compile`` backend (``fx.backend``).

``LlamaLayer(sizes)`` holds random weights (seeded; no download) and its forward is one decode
step: one new token per sequence for a batch of ``b`` sequences, attending over a KV cache:

    h   = rms_norm(x) * g_in                                    RMSNorm with eps
    q, k, v = h @ Wq, h @ Wk, h @ Wv                            projections
    q, k = rope(q), rope(k)                                     rotary embedding (slice + concat)
    o   = softmax(q K^T / sqrt(d)) V  over [cache; new token]   grouped-query attention
    x   = x + o @ Wo                                            output projection, residual
    x   = x + (silu(h2 @ Wg) * (h2 @ Wu)) @ Wd,  h2 = rms_norm(x) * g_post     SwiGLU MLP

Weights are stored as (in, out) matrices and applied with ``@`` (a ``Linear`` without bias,
transposed once at construction). ``decode_step(x, k_cache, v_cache)`` returns the layer's
output and the new token's keys and values (which the caller appends to its cache).

Sizes: ``LlamaSizes.small()`` (the default: hidden 64, 4 heads, 2 KV heads, head dim 16, MLP
128, cache 32 tokens) runs in seconds on a CPU through Triton's interpreter;
``LlamaSizes.llama3_8b()`` is one layer of Llama-3-8B (hidden 4096, 32 heads, 8 KV heads, head
dim 128, MLP 14336, RoPE theta 500000, RMSNorm eps 1e-5) with a 4,096-token cache, for a GPU;
``llama3_8b(tp=4)`` is its tensor-parallel shard on one of 4 GPUs (8 heads, 2 KV heads, MLP
3584; the all-reduce after each projection is left out).

``hf_decoder_layer(sizes, family=...)`` builds a ``transformers`` decoder layer with the same
sizes from its config (random init, no download) where ``transformers`` is installed: family
``llama``, ``LlamaDecoderLayer``, or ``qwen3``, ``Qwen3DecoderLayer`` (Llama's layer with a
per-head RMSNorm, ``q_norm``/``k_norm`` over the head dim, on the queries and keys before RoPE;
``HF_FAMILIES``). ``HFDecodeStep(sizes, family=..., cache=...)`` wraps it in the same decode
step (``decode_step(x, k_cache, v_cache)``, same outputs, its own random weights) for
``egraph-mirage bench torch``, with one of two caches: ``"concat"`` (the cache passed in, the
new token's keys and values appended by ``torch.cat``) or ``"static"`` (as ``transformers``'
``StaticCache`` does it: the caches passed in are the whole static cache, ``kv_len``
positions (its ``max_cache_len``), and the new token, the last of them, is written in place
with ``index_copy_`` at ``cache_position``, ``kv_len - 1``).

Run: ``python examples/llama_layer.py`` compiles the small layer (fp16) with the egraph-mirage
backend (a few search tasks per piece) and compares it with eager; ``--preset llama3_8b`` (on a
GPU) takes the large sizes, ``--help`` lists the other settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class LlamaSizes:
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    mlp: int = 128
    #: tokens already in the KV cache (the new token sits at this position)
    kv_len: int = 32
    eps: float = 1e-5
    rope_theta: float = 500000.0

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"LlamaSizes: heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"LlamaSizes: head_dim must be even for RoPE, got {self.head_dim}")

    @classmethod
    def small(cls) -> LlamaSizes:
        """Small sizes for CPU tests (the defaults)."""
        return cls()

    @classmethod
    def llama3_8b(cls, tp: int = 1, kv_len: int = 4096) -> LlamaSizes:
        """One layer of Llama-3-8B (``tp=1``), or its shard on one of ``tp`` GPUs."""
        full = cls(hidden=4096, heads=32, kv_heads=8, head_dim=128, mlp=14336, kv_len=kv_len)
        if 8 % tp:
            raise ValueError(f"llama3_8b: tp must divide the 8 KV heads, got {tp}")
        return replace(full, heads=32 // tp, kv_heads=8 // tp, mlp=14336 // tp)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """RoPE's rotation on the last dim: (x1, x2) -> (-x2, x1)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaLayer(nn.Module):
    """A Llama decoder layer (module docstring) with random weights of ``dtype``."""

    def __init__(self, sizes: LlamaSizes | None = None, dtype: torch.dtype = torch.float32,
                 device: Any = None, seed: int = 0) -> None:
        super().__init__()
        s = self.sizes = sizes or LlamaSizes.small()
        gen = torch.Generator().manual_seed(seed)

        def weight(fan_in: int, fan_out: int) -> nn.Parameter:
            w = torch.randn(fan_in, fan_out, generator=gen) / math.sqrt(fan_in)
            return nn.Parameter(w.to(device=device, dtype=dtype), requires_grad=False)

        def gain() -> nn.Parameter:
            g = 1.0 + 0.1 * torch.randn(s.hidden, generator=gen)
            return nn.Parameter(g.to(device=device, dtype=dtype), requires_grad=False)

        self.input_norm, self.post_norm = gain(), gain()
        self.wq = weight(s.hidden, s.heads * s.head_dim)
        self.wk = weight(s.hidden, s.kv_heads * s.head_dim)
        self.wv = weight(s.hidden, s.kv_heads * s.head_dim)
        self.wo = weight(s.heads * s.head_dim, s.hidden)
        self.w_gate = weight(s.hidden, s.mlp)
        self.w_up = weight(s.hidden, s.mlp)
        self.w_down = weight(s.mlp, s.hidden)
        # the rotary angles of the new token's position (kv_len), per pair of the head dim
        inv_freq = s.rope_theta ** (-torch.arange(0, s.head_dim, 2).double() / s.head_dim)
        angles = torch.cat((inv_freq, inv_freq)) * s.kv_len
        self.register_buffer("cos", angles.cos().to(device=device, dtype=dtype))
        self.register_buffer("sin", angles.sin().to(device=device, dtype=dtype))

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.cos + rotate_half(x) * self.sin

    def decode_step(self, x: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` (b, hidden): the new token of each sequence; ``k_cache``, ``v_cache`` (b,
        kv_heads, kv_len, head_dim). Returns the layer's output (b, hidden) and the new token's
        keys and values (b, kv_heads, 1, head_dim)."""
        s = self.sizes
        b = x.shape[0]
        group = s.heads // s.kv_heads
        h = torch.nn.functional.rms_norm(x, (s.hidden,), self.input_norm, s.eps)
        q = self.rope((h @ self.wq).view(b, s.kv_heads, group, s.head_dim))
        k = self.rope((h @ self.wk).view(b, s.kv_heads, 1, s.head_dim))
        v = (h @ self.wv).view(b, s.kv_heads, 1, s.head_dim)
        keys = torch.cat((k_cache, k), dim=2)                  # (b, kv, kv_len + 1, d)
        values = torch.cat((v_cache, v), dim=2)
        scores = (q @ keys.transpose(-1, -2)) * (1.0 / math.sqrt(s.head_dim))
        o = torch.softmax(scores, dim=-1) @ values              # (b, kv, group, d)
        x = x + o.reshape(b, s.heads * s.head_dim) @ self.wo
        h2 = torch.nn.functional.rms_norm(x, (s.hidden,), self.post_norm, s.eps)
        x = x + (torch.nn.functional.silu(h2 @ self.w_gate) * (h2 @ self.w_up)) @ self.w_down
        return x, k, v

    forward = decode_step

    def example_inputs(self, batch: int = 1, seed: int = 1) -> tuple[torch.Tensor, ...]:
        """Random ``(x, k_cache, v_cache)`` for ``decode_step``, on the weights' device and
        dtype."""
        return decode_inputs(self.sizes, batch, seed, self.wq.device, self.wq.dtype)


def decode_inputs(sizes: LlamaSizes, batch: int = 1, seed: int = 1, device: Any = None,
                  dtype: torch.dtype = torch.float32, room: int = 0) -> tuple[torch.Tensor, ...]:
    """Random ``(x, k_cache, v_cache)`` of a decode step at ``sizes``: shapes (b, hidden) and
    twice (b, kv_heads, kv_len + room, head_dim) (``room=1``: a static cache's place for the new
    token, ``HFDecodeStep(cache="static")``)."""
    s = sizes
    gen = torch.Generator().manual_seed(seed)
    shapes = [(batch, s.hidden), (batch, s.kv_heads, s.kv_len + room, s.head_dim),
              (batch, s.kv_heads, s.kv_len + room, s.head_dim)]
    return tuple(torch.randn(shape, generator=gen).to(device, dtype) for shape in shapes)


#: ``transformers``' decoder layers by family: (config class, module, layer class)
HF_FAMILIES = {
    "llama": ("LlamaConfig", "transformers.models.llama.modeling_llama", "LlamaDecoderLayer"),
    "qwen3": ("Qwen3Config", "transformers.models.qwen3.modeling_qwen3", "Qwen3DecoderLayer"),
}
#: the decode step's caches (``HFDecodeStep``)
HF_CACHES = ("concat", "static")


def hf_decoder_layer(sizes: LlamaSizes | None = None, dtype: torch.dtype = torch.float32,
                     family: str = "llama") -> Any:
    """``transformers``' decoder layer of ``family`` (``HF_FAMILIES``) with ``sizes`` (its
    config, random init, no download). Raises ``ImportError`` naming the package where it is not
    installed."""
    import importlib

    if family not in HF_FAMILIES:
        raise ValueError(f"hf_decoder_layer: unknown family {family!r} "
                         f"({', '.join(HF_FAMILIES)})")
    config_name, module_name, layer_name = HF_FAMILIES[family]
    try:
        config_class = getattr(importlib.import_module("transformers"), config_name)
        layer_class = getattr(importlib.import_module(module_name), layer_name)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"hf_decoder_layer needs the `transformers` package with {layer_name} "
                          "(pip install transformers); LlamaLayer is Llama's layer in plain "
                          "torch") from e
    s = sizes or LlamaSizes.small()
    config = config_class(hidden_size=s.hidden, num_attention_heads=s.heads,
                          num_key_value_heads=s.kv_heads, head_dim=s.head_dim,
                          intermediate_size=s.mlp, rms_norm_eps=s.eps, rope_theta=s.rope_theta,
                          num_hidden_layers=1, max_position_embeddings=max(2 * s.kv_len, 2048),
                          attn_implementation="sdpa")
    return layer_class(config, layer_idx=0).to(dtype).eval()


class _ConcatCache:
    """Stands in for ``transformers``' ``Cache`` during one decode step: ``update`` returns the
    keys and values passed in with the new token's appended, and keeps the new token's, so that
    the step holds no state between calls (like ``LlamaLayer.decode_step``)."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache
        self.new: tuple[torch.Tensor, torch.Tensor] | None = None

    # transformers 5.17 passes ``cache_kwargs`` by position, 5.24 ``kwargs=`` by name
    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.new = (k, v)
        return torch.cat((self.k_cache, k), dim=2), torch.cat((self.v_cache, v), dim=2)


class _StaticCache(_ConcatCache):
    """The cache as ``transformers``' ``StaticLayer.update`` writes it: the new token's keys and
    values copied in place into the caches passed in (``index_copy_`` along the sequence at
    ``cache_position``), which are returned whole. Writing the same token again gives the same
    cache, so the step may be called any number of times on the same inputs."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 cache_position: torch.Tensor) -> None:
        super().__init__(k_cache, v_cache)
        self.cache_position = cache_position

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.new = (k, v)
        self.k_cache.index_copy_(2, self.cache_position, k)
        self.v_cache.index_copy_(2, self.cache_position, v)
        return self.k_cache, self.v_cache


class HFDecodeStep(nn.Module):
    """A ``transformers`` decoder layer (``hf_decoder_layer(sizes, dtype, family)``) as one
    decode step with ``LlamaLayer.decode_step``'s outputs, attending over the cache and the
    new token; no mask (a full cache) unless ``masked``. ``cache="concat"``:
    ``LlamaLayer``'s inputs, the new token at position ``kv_len`` appended (``kv_len + 1``
    keys); ``"static"``: a full static cache of ``kv_len`` positions, the new token written
    in place at the last, ``kv_len - 1`` (``_StaticCache``: ``kv_len`` keys, as a
    ``StaticCache`` of ``max_cache_len = kv_len`` at its last step). The rotary angles of the
    new token's position are buffers. ``masked``: the layer is given a boolean attention
    mask, as ``generate()`` gives it with a static cache (whose positions not yet written
    are hidden): here it hides the first half of the positions, the new token's always seen.
    Its weights are ``transformers``' random initialisation, not ``LlamaLayer``'s."""

    def __init__(self, sizes: LlamaSizes | None = None, dtype: torch.dtype = torch.float32,
                 device: Any = None, family: str = "llama", cache: str = "concat",
                 seed: int = 0, masked: bool = False) -> None:
        import inspect

        super().__init__()
        if cache not in HF_CACHES:
            raise ValueError(f"HFDecodeStep: unknown cache {cache!r} ({', '.join(HF_CACHES)})")
        s = self.sizes = sizes or LlamaSizes.small()
        self.family, self.cache = family, cache
        with torch.random.fork_rng(devices=[]):  # seeded weights, the global RNG untouched
            torch.manual_seed(seed)
            self.layer = hf_decoder_layer(s, dtype, family).to(device)
        # the cache's keyword: ``past_key_values`` up to transformers 5.2x, then ``cache``
        params = inspect.signature(type(self.layer).forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        inv_freq = s.rope_theta ** (-torch.arange(0, s.head_dim, 2).double() / s.head_dim)
        position = s.kv_len - 1 if cache == "static" else s.kv_len
        angles = (torch.cat((inv_freq, inv_freq)) * position).view(1, 1, s.head_dim)
        self.register_buffer("cos", angles.cos().to(device=device, dtype=dtype))
        self.register_buffer("sin", angles.sin().to(device=device, dtype=dtype))
        self.register_buffer("cache_position", torch.tensor([position], device=device))
        keys = s.kv_len if cache == "static" else s.kv_len + 1
        self.register_buffer("mask", (torch.arange(keys, device=device) >= keys // 2).view(
            1, 1, 1, keys) if masked else None)

    def decode_step(self, x: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = x.shape[0]
        cache = (_StaticCache(k_cache, v_cache, self.cache_position) if self.cache == "static"
                 else _ConcatCache(k_cache, v_cache))
        rotary = (self.cos.expand(b, 1, -1), self.sin.expand(b, 1, -1))
        mask = None if self.mask is None else self.mask.expand(b, -1, -1, -1)
        out = self.layer(x[:, None, :], attention_mask=mask, position_embeddings=rotary,
                         **{self.cache_arg: cache})
        out = out[0] if isinstance(out, tuple) else out
        assert cache.new is not None, f"{type(self.layer).__name__} did not update the cache"
        k, v = cache.new
        return out[:, 0, :], k, v

    forward = decode_step

    def example_inputs(self, batch: int = 1, seed: int = 1) -> tuple[torch.Tensor, ...]:
        """Random ``(x, k_cache, v_cache)`` for this step's cache (``decode_inputs``)."""
        return decode_inputs(self.sizes, batch, seed, self.cos.device, self.cos.dtype)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import time

    import egraph_mirage.fx.backend  # noqa: F401  (registers the backend without the entry point)
    from egraph_mirage.fx.report import torch_report

    p = argparse.ArgumentParser(description="compile a Llama decode step with egraph-mirage")
    p.add_argument("--preset", choices=["small", "llama3_8b"], default="small")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel shard of llama3_8b")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--budget", type=float, default=120.0,
                   help="search seconds for the whole compilation, its pieces sharing them")
    p.add_argument("--max-tasks", type=int, default=4, help="search tasks per piece")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rest", choices=["inductor", "eager"], default="inductor")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    sizes = LlamaSizes.small() if args.preset == "small" else LlamaSizes.llama3_8b(args.tp)
    layer = LlamaLayer(sizes, dtype=torch.float16, device="cuda" if cuda else None)
    inputs = layer.example_inputs(batch=args.batch)
    options = {"budget": args.budget, "max_tasks": args.max_tasks, "workers": args.workers,
               "rest": args.rest}
    with torch.no_grad():
        expected = layer(*inputs)
        compiled = torch.compile(layer, backend="egraph_mirage", dynamic=False, options=options)
        t0 = time.perf_counter()
        got = compiled(*inputs)
        print(f"compiled in {time.perf_counter() - t0:.1f} s")
    for name, a, b in zip(("out", "k", "v"), got, expected):
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        print(f"{name}: relative error against eager {err:.2e}")
    print(torch_report(compiled))


if __name__ == "__main__":
    main()
