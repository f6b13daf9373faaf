"""The entry points that take a program to the later stages, as free functions.

A ``KernelGraph`` (``graph.py``) is plain data and imports nothing from the stages after it; these
functions hand it to serialisation, drawing and the Triton lowering:

    em.to_json(g) / em.save(g, path)         # versioned JSON; em.loads / em.load read it back
    em.to_svg(g, path=None)                  # a drawing of the program and its kernels
    em.generate_triton_program(g, path)      # one standalone Triton program, written atomically
    fn = em.compile(g, num_warps=4)          # a callable on torch tensors -> list of outputs
"""

from __future__ import annotations

import os
from typing import Any

from .graph import KernelGraph
from .lower import compile_graph, options_from, write_program
from .mugraph import draw, serialize


def to_json(g: KernelGraph) -> str:
    """Versioned JSON text of ``g`` and its graph-defined kernels (``mugraph.serialize``)."""
    return serialize.dumps(g)


def save(g: KernelGraph, path: str | os.PathLike[str]) -> None:
    """Write ``to_json(g)`` to ``path`` atomically; ``em.load(path)`` reads it back."""
    serialize.save(g, path)


def to_svg(g: KernelGraph, path: str | os.PathLike[str] | None = None) -> str:
    """SVG drawing of ``g`` and its graph-defined kernels (``mugraph.draw``); also written to
    ``path`` if given. Needs the Graphviz ``dot`` program."""
    return draw.mugraph_svg(g, path)


def generate_triton_program(g: KernelGraph, path: str | os.PathLike[str], **options: Any) -> str:
    """Write μGraph ``g`` as one standalone Triton program (kernels and a host function
    ``run(*inputs) -> list of outputs``) to ``path``, atomically; returns the source.
    ``options``: ``lower.LowerOptions`` fields (``num_warps``, ``num_stages``, ``fp32_dots``,
    ...)."""
    return write_program(g, path, options_from(options))


def compile(g: KernelGraph, **options: Any) -> Any:
    """μGraph ``g`` as a callable on torch tensors returning the list of outputs (through its
    generated Triton program; ``lower.compile_graph``). ``options``: ``num_warps``,
    ``num_stages`` (launch meta-parameters, for a tuner), ``fp32_dots``, ``fp32_precision``,
    ``interpret`` (default: Triton's interpreter when there is no CUDA device)."""
    return compile_graph(g, **options)


__all__ = ["compile", "generate_triton_program", "save", "to_json", "to_svg"]
