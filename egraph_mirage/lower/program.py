"""A whole μGraph as one standalone Python file: the Triton kernels and a host ``run``.

The file imports only torch and triton. ``run(*inputs)`` checks the inputs, allocates every
intermediate and output tensor, launches the graph-defined kernels in graph order (one launch
per kernel, all of its outputs at once) and computes library operators with torch, in fp32,
through each op-table entry's ``triton.host`` emission. It returns the list of outputs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..dtypes import DType
from ..errors import EMError, GraphError, LowerError
from ..files import write_atomic
from ..graph import KernelGraph, Tensor
from ..ops import lookup
from .kernel_codegen import DotConfig, kernel_source

TORCH_DTYPE = {DType.float16: "torch.float16", DType.bfloat16: "torch.bfloat16",
               DType.float32: "torch.float32"}
PRECISIONS = ("ieee", "tf32", "tf32x3")
#: the meta-parameters a tuner may vary (they change speed, never results)
KNOBS: dict[str, tuple[int, ...]] = {"num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4)}


@dataclass(frozen=True)
class LowerOptions:
    """Meta-parameters of the lowering.

    ``num_warps`` and ``num_stages`` are the launch defaults written into the program (``run``
    also takes them as keyword arguments, so a tuner can try others without regenerating).
    ``fp32_dots`` casts ``tl.dot`` operands to fp32 (needed for bfloat16 in Triton's
    interpreter); ``fp32_precision`` is the precision of dots on fp32 operands (``"ieee"``,
    ``"tf32"``, ``"tf32x3"``).
    """

    num_warps: int = 4
    num_stages: int = 2
    fp32_dots: bool = False
    fp32_precision: str = "ieee"

    def __post_init__(self) -> None:
        for name in ("num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LowerError(f"lowering option {name} must be a positive integer, got {v!r}")
        if self.num_warps & (self.num_warps - 1):
            raise LowerError(f"lowering option num_warps must be a power of two, got "
                             f"{self.num_warps}")
        if self.fp32_precision not in PRECISIONS:
            raise LowerError(f"lowering option fp32_precision must be one of {PRECISIONS}, got "
                             f"{self.fp32_precision!r}")


def _names(graph: KernelGraph) -> dict[int, str]:
    """Variable names: ``v<k>`` for the k-th input, ``t<index>`` for the other tensors."""
    names = {t.index: f"t{t.index}" for t in graph.tensors}
    names.update({t.index: f"v{k}" for k, t in enumerate(graph.inputs)})
    return names


def _host_call(t: Tensor, names: dict[int, str]) -> str:
    """A library operator as a torch statement, computed in fp32."""
    spec = lookup(t.op)  # type: ignore[arg-type]
    args = [names[o.index] if o.dtype == DType.float32 else f"{names[o.index]}.float()"
            for o in t.operands]
    try:
        expr = spec.triton.host(args, [o.dims for o in t.operands], t.params)
    except EMError:
        raise
    except Exception as e:
        raise LowerError(f"library operator t{t.index} = {t.op}: {type(e).__name__}: {e}") from e
    if t.dtype != DType.float32:
        expr = f"({expr}).to({TORCH_DTYPE[t.dtype]})"
    return f"{names[t.index]} = {expr}"


def generate_source(graph: KernelGraph, options: LowerOptions = LowerOptions()) -> str:
    """The Python source of the Triton program for ``graph``."""
    if not isinstance(graph, KernelGraph):
        raise GraphError(f"lowering: expected a KernelGraph, got {type(graph).__name__}")
    if not graph.outputs:
        raise GraphError("lowering: the graph has no outputs; call mark_output")
    names = _names(graph)
    dots = DotConfig(options.fp32_dots, options.fp32_precision)
    kernels: dict[int, str] = {}  # id(block graph) -> kernel name
    kernel_sources: list[str] = []
    launched: set[int] = set()
    body: list[str] = []
    for t in graph.operators:
        if t.op != "customized":
            body.append(_host_call(t, names))
            continue
        kernel = t.params["kernel"]
        if id(kernel) in launched:
            continue
        launched.add(id(kernel))
        tb = kernel.tb
        if id(tb) not in kernels:
            kernels[id(tb)] = f"kernel_{len(kernels)}"
            kernel_sources.append(kernel_source(tb, kernels[id(tb)], dots))
        outs = sorted((u for u in graph.operators if u.op == "customized"
                       and u.params["kernel"] is kernel), key=lambda u: u.params["output"])
        device = names[t.operands[0].index]
        for u in outs:
            body.append(f"{names[u.index]} = torch.empty({u.dims}, dtype="
                        f"{TORCH_DTYPE[u.dtype]}, device={device}.device)")
        args = [names[o.index] for o in t.operands] + [names[u.index] for u in outs]
        body.append(f"{kernels[id(tb)]}[{tb.grid_dim}]({', '.join(args)}, "
                    "num_warps=num_warps, num_stages=num_stages)")
    return _file(graph, names, options, kernel_sources, body)


def _file(graph: KernelGraph, names: dict[int, str], options: LowerOptions,
          kernel_sources: list[str], body: list[str]) -> str:
    ins = [names[t.index] for t in graph.inputs]
    outs = [names[t.index] for t in graph.outputs]
    signature = ", ".join(ins)
    described = "\n".join(f"    {names[t.index]}: {t.dtype.value} {t.dims}" for t in graph.inputs)
    returned = "\n".join(f"    {names[t.index]}: {t.dtype.value} {t.dims}"
                         for t in graph.outputs)
    specs = ", ".join(f"({t.dims}, {TORCH_DTYPE[t.dtype]})" for t in graph.inputs)
    lines = [
        f'"""Triton program generated by egraph-mirage from a μGraph ({_count(ins, "input")}, '
        f'{_count(kernel_sources, "kernel")}, {_count(outs, "output")}).',
        "",
        f"run({signature}) -> [{', '.join(outs)}]",
        "Inputs:",
        described,
        "Outputs:",
        returned,
        "",
        "Without a GPU, set TRITON_INTERPRET=1 before importing this file.",
        '"""',
        "",
        "import torch",
        "import triton",
        "import triton.language as tl",
        "",
        f"NUM_WARPS = {options.num_warps}",
        f"NUM_STAGES = {options.num_stages}",
        f"INPUTS = [{specs}]",
        "",
    ]
    for src in kernel_sources:
        lines += ["", src]
    lines += [
        "",
        f"def run({signature}, *, num_warps=NUM_WARPS, num_stages=NUM_STAGES):",
        '    """The μGraph on torch tensors (on the GPU, or on the CPU under the interpreter);',
        '    returns the list of outputs."""',
        f"    {signature}{',' if len(ins) == 1 else ''} = _checked([{signature}])",
        *[f"    {line}" for line in body],
        f"    return [{', '.join(outs)}]",
        "",
        "",
        "def _checked(xs):",
        "    out = []",
        "    for k, (x, (dims, dtype)) in enumerate(zip(xs, INPUTS)):",
        "        if tuple(x.shape) != dims or x.dtype != dtype:",
        "            raise ValueError(f'input {k}: expected {dtype} {dims}, got {x.dtype} "
        "{tuple(x.shape)}')",
        "        out.append(x.contiguous())",
        "    return out",
        "",
    ]
    return "\n".join(lines)


def _count(items: list[Any], what: str) -> str:
    return f"{len(items)} {what}" + ("" if len(items) == 1 else "s")


def write_program(graph: KernelGraph, path: str | os.PathLike[str],
                  options: LowerOptions = LowerOptions()) -> str:
    """Write the program for ``graph`` to ``path`` atomically; returns its source."""
    source = generate_source(graph, options)
    write_atomic(path, source)
    return source


def options_from(kwargs: dict[str, Any]) -> LowerOptions:
    """``LowerOptions`` from keyword arguments, naming an unknown one."""
    known = set(LowerOptions.__dataclass_fields__)
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise LowerError(f"unknown lowering option(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(known))}")
    return LowerOptions(**kwargs)
