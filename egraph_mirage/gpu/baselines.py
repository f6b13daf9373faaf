"""What users run today, built generically from a kernel graph: the baselines a μGraph must beat.

* ``eager``: the program op by op through PyTorch (``torch_eval``);
* ``compiled``: the same function through ``torch.compile(fn, dynamic=False)`` (default mode,
  and, behind a flag, max-autotune without Inductor's own CUDA graphs as a second baseline);
* ``sdpa``: where the program ends in attention without max subtraction,
  ``exp(A @ B) / rowsum(...) @ C``, PyTorch's fused ``scaled_dot_product_attention(A, Bᵀ, C,
  scale=1.0)``; whatever computes A, B and C (e.g. RMS norms) runs eagerly first. The pattern is
  found from the graph's structure, not from the program's name. When B is a graph input, it is
  handed over in SDPA's (L, d) layout, transposed once outside the timed region.

FlashInfer is used only where it is importable; it is not installed on the lent GPU machine, so
``flashinfer_available()`` is False there and no such baseline is built.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..graph import KernelGraph, Tensor
from ..ops import shapes as sh
from .timing import InputSet, Program
from .torch_eval import torch_function


def _same(xs: InputSet) -> InputSet:
    return list(xs)


@dataclass(frozen=True)
class Baseline:
    """A named program over ``g``'s inputs; ``prepare`` changes their layout once, untimed."""

    name: str
    fn: Program
    prepare: Callable[[InputSet], InputSet] = field(default=_same)


def eager(g: KernelGraph) -> Baseline:
    return Baseline("eager", torch_function(g))


def compiled(g: KernelGraph, max_autotune: bool = False) -> Baseline:
    """``torch.compile`` of the eager function. Dynamo's caches are reset first: every program's
    function shares one code object, and a run over many programs would otherwise reach the
    recompile limit and silently fall back to eager."""
    torch._dynamo.reset()
    mode = "max-autotune-no-cudagraphs" if max_autotune else None
    fn = torch.compile(torch_function(g), dynamic=False, mode=mode)
    return Baseline("compile-max-autotune" if max_autotune else "compile", fn)


def match_attention(g: KernelGraph) -> tuple[Tensor, Tensor, Tensor] | None:
    """(A, B, C) where ``g``'s one output is ``(E / sum(E, last dim)) @ C`` with ``E =
    exp(A @ B)``; None for any other program."""
    if len(g.outputs) != 1:
        return None
    out = g.outputs[0]
    if out.op != "matmul":
        return None
    P, C = out.operands
    if P.op != "div":
        return None
    E, S = P.operands
    if E.op != "exp" or S.op != "reduction" or S.operands[0] is not E:
        return None
    if sh.normalize_dim("reduction", E.dims, S.params["dim"]) != len(E.dims) - 1:
        return None
    M = E.operands[0]
    if M.op != "matmul":
        return None
    A, B = M.operands
    if not (A.dims[:-2] == B.dims[:-2] == C.dims[:-2]):
        return None
    return A, B, C


def _depends_on(t: Tensor, source: Tensor) -> bool:
    todo, seen = [t], set()
    while todo:
        x = todo.pop()
        if x is source:
            return True
        if x.index not in seen:
            seen.add(x.index)
            todo.extend(x.operands)
    return False


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA on (..., L, d) tensors; 3-D ones get a head axis so the fused kernels apply."""
    if q.ndim == 3:
        q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        return F.scaled_dot_product_attention(q, k, v, scale=1.0).squeeze(1)
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)


def sdpa(g: KernelGraph) -> Baseline | None:
    """The SDPA baseline of an attention program, or None where ``match_attention`` fails."""
    found = match_attention(g)
    if found is None:
        return None
    A, B, C = found
    if B.is_input and not _depends_on(A, B) and not _depends_on(C, B):
        pos = g.inputs.index(B)
        prefix = torch_function(g, targets=[A, C])

        def prepare(xs: InputSet) -> InputSet:
            ys = list(xs)
            ys[pos] = xs[pos].transpose(-1, -2).contiguous()  # K in SDPA's (L, d) layout
            return ys

        def fn(*xs: torch.Tensor) -> list[torch.Tensor]:
            a, c = prefix(*xs)
            return [_attend(a, xs[pos], c)]

        return Baseline("sdpa", fn, prepare)
    whole = torch_function(g, targets=[A, B, C])

    def fn_t(*xs: torch.Tensor) -> list[torch.Tensor]:
        a, b, c = whole(*xs)
        return [_attend(a, b.transpose(-1, -2), c)]

    return Baseline("sdpa", fn_t)


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def baselines_for(g: KernelGraph, use_compile: bool = True,
                  max_autotune: bool = False) -> list[Baseline]:
    """Eager, SDPA where it applies, and torch.compile (unless ``use_compile`` is False): the
    default mode, then with ``max_autotune`` also the max-autotune mode.

    The compiled baselines are built last: building one resets Dynamo's caches. The two modes
    compile the same code object; Dynamo's guards check the backend, so each mode's first call
    compiles its own graph (``test_both_compile_modes_compile_their_own_graph``)."""
    out = [eager(g)]
    attention = sdpa(g)
    if attention is not None:
        out.append(attention)
    if use_compile:
        out.append(compiled(g))
        if max_autotune:
            out.append(compiled(g, max_autotune=True))
    return out


def names(baselines: Sequence[Baseline]) -> list[str]:
    return [b.name for b in baselines]
