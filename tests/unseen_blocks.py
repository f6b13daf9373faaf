"""Blocks written as real model code writes them, for ``test_unseen_blocks.py``: code the
backend was not written against. Small sizes (hidden 64), random weights (seeded; no download).

- ``hf_step(family, attn, dtype)``: ``transformers``' Llama or Qwen3 decoder layer as one decode
  step with a static cache written in place (``examples/llama_layer.py``'s ``HFDecodeStep``),
  attention ``"sdpa"`` or ``"eager"``;
- ``GemmaNormMLP``: Gemma's ``(1 + w)`` RMSNorm in float32 (``GemmaRMSNorm``) before its
  gated-GELU MLP (``GemmaMLP``, gelu tanh), with the residual;
- ``NeoXParallelBlock``: GPT-NeoX's parallel residual, ``x + attn(norm1(x)) + mlp(norm2(x))``,
  as its code writes it (one fused ``query_key_value`` projection with bias, split per head;
  causal attention with softmax in float32; a GELU MLP with biases), with RMSNorm or LayerNorm;
- ``LoraLinear``: a projection adapted by LoRA as PEFT's ``lora.Linear.forward`` computes it
  (``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``), in eval mode;
- ``FinalNormHead``: a causal LM's end, ``lm_head(norm(h))`` with ``transformers``'
  ``LlamaRMSNorm`` (float32 statistics, cast back before the weight).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from llama_layer import HFDecodeStep, LlamaSizes

HIDDEN, MLP, HEADS = 64, 128, 4


def _seeded(build: Any, seed: int = 0) -> Any:
    """``build()`` with the global RNG seeded, and left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def hf_step(family: str, attn: str, dtype: torch.dtype, masked: bool = False) -> HFDecodeStep:
    """``transformers``' decoder layer of ``family`` ("llama", "qwen3") at
    ``LlamaSizes.small()`` as one decode step with a static cache, attention ``attn``;
    ``masked``: given a boolean attention mask, as ``generate()`` gives it."""
    step = HFDecodeStep(LlamaSizes.small(), dtype, family=family, cache="static",
                        masked=masked)
    step.layer.self_attn.config._attn_implementation = attn
    return step.eval()


def tokens(dtype: torch.dtype, shape: tuple[int, ...] = (1, 4, HIDDEN), seed: int = 1
           ) -> torch.Tensor:
    """A random activation: ``shape`` (batch, tokens, hidden) of ``dtype``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


class GemmaNormMLP(nn.Module):
    """``x + GemmaMLP(GemmaRMSNorm(x))``: Gemma's norm scales by ``(1 + w)`` in float32 and casts
    back after (Llama casts before the weight), then gate/up projections, ``gelu_tanh(gate) *
    up`` and the down projection."""

    def __init__(self, dtype: torch.dtype) -> None:
        from transformers import GemmaConfig
        from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm

        super().__init__()
        config = GemmaConfig(hidden_size=HIDDEN, intermediate_size=MLP,
                             hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh")

        def build() -> tuple[nn.Module, nn.Module]:
            norm = GemmaRMSNorm(HIDDEN, eps=1e-6)
            nn.init.normal_(norm.weight, std=0.1)  # zeros at init: a (1 + w) of one
            return norm, GemmaMLP(config)

        self.norm, self.mlp = _seeded(build)
        self.to(dtype).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class RMSNorm(nn.Module):
    """``transformers``' RMSNorm (``LlamaRMSNorm``'s code): statistics in float32, the weight
    after the cast back."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(1 + 0.1 * torch.randn(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class NeoXParallelBlock(nn.Module):
    """GPT-NeoX's layer with ``use_parallel_residual``: ``x + attn(norm1(x)) + mlp(norm2(x))``
    (``GPTNeoXLayer.forward``); its attention's one ``query_key_value`` projection (with bias)
    viewed as (b, t, heads, 3 * head_dim) and split, causal scores masked by a buffer, softmax
    in float32, then ``dense``; its MLP ``dense_4h_to_h(gelu(dense_h_to_4h(h)))``. No rotary
    embedding (NeoX rotates a quarter of each head; RoPE is the decoder layers' test).
    ``norm="layer"``: ``nn.LayerNorm`` as NeoX has it; ``"rms"``: ``RMSNorm``."""

    def __init__(self, dtype: torch.dtype, norm: str = "rms", tokens: int = 4) -> None:
        super().__init__()
        self.heads, self.head_dim = HEADS, HIDDEN // HEADS

        def build() -> None:
            make = (lambda: RMSNorm(HIDDEN)) if norm == "rms" else (lambda: nn.LayerNorm(HIDDEN))
            self.input_layernorm, self.post_attention_layernorm = make(), make()
            if norm == "layer":
                for ln in (self.input_layernorm, self.post_attention_layernorm):
                    nn.init.normal_(ln.weight, 1.0, 0.1)
                    nn.init.normal_(ln.bias, 0.0, 0.1)
            self.query_key_value = nn.Linear(HIDDEN, 3 * HIDDEN)
            self.dense = nn.Linear(HIDDEN, HIDDEN)
            self.dense_h_to_4h = nn.Linear(HIDDEN, 4 * HIDDEN)
            self.dense_4h_to_h = nn.Linear(4 * HIDDEN, HIDDEN)

        _seeded(build)
        causal = torch.ones(tokens, tokens, dtype=torch.bool).tril()
        self.register_buffer("mask", torch.zeros(tokens, tokens).masked_fill(~causal,
                                                                            float("-inf")))
        self.to(dtype).eval()

    def attention(self, h: torch.Tensor) -> torch.Tensor:
        b, t, _ = h.shape
        qkv = self.query_key_value(h).view(b, t, self.heads, 3 * self.head_dim)
        q, k, v = qkv.permute(0, 2, 1, 3).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + self.mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        o = (probs @ v).transpose(1, 2).reshape(b, t, HIDDEN)
        return self.dense(o)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(h)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.attention(self.input_layernorm(x))
                + self.mlp(self.post_attention_layernorm(x)))


class LoraLinear(nn.Module):
    """PEFT's ``lora.Linear`` with one adapter, in eval mode (its dropout the identity):
    ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling``, ``scaling = alpha / r``;
    ``lora_B`` random (PEFT starts it at zero; trained, it is not)."""

    def __init__(self, dtype: torch.dtype, r: int = 8, alpha: int = 16,
                 out_features: int = 96) -> None:
        super().__init__()

        def build() -> None:
            self.base_layer = nn.Linear(HIDDEN, out_features, bias=False)
            self.lora_dropout = nn.Dropout(0.1)
            self.lora_A = nn.Linear(HIDDEN, r, bias=False)
            self.lora_B = nn.Linear(r, out_features, bias=False)
            nn.init.normal_(self.lora_B.weight, std=0.1)

        _seeded(build)
        self.scaling = alpha / r
        self.to(dtype).eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        return result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


class FinalNormHead(nn.Module):
    """A causal LM's last step before the logits (``LlamaForCausalLM``: ``model.norm``, then
    ``lm_head``): ``lm_head(LlamaRMSNorm(h))`` over a vocabulary of ``vocab``."""

    def __init__(self, dtype: torch.dtype, vocab: int = 256) -> None:
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        super().__init__()

        def build() -> None:
            self.norm = LlamaRMSNorm(HIDDEN, eps=1e-5)
            nn.init.normal_(self.norm.weight, 1.0, 0.1)
            self.lm_head = nn.Linear(HIDDEN, vocab, bias=False)

        _seeded(build)
        self.to(dtype).eval()

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))
