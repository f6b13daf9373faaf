"""Sibling kernels in one launch: graph-defined kernels that do not depend on each other run as
the blocks of one grid.

A program of several outputs often launches kernels side by side that read the same inputs
and none of each other's outputs: the query, key and value projections of one normalised
activation, a gated MLP's gate and up projections. At decode sizes each is a few microseconds,
and each launch, ramp-up and tail costs about as much again. With ``LowerOptions.horizontal``
such *siblings* are one launch: each kernel's block body becomes a ``@triton.jit`` function
of its block index (``KernelRole.flat_pid``: ``pid_x``, ``pid_y``, ``pid_z`` computed from
one flat index), and a kernel over the sum of their grids calls the body its block falls in::

    @triton.jit
    def kernel_2(a0, a1, ..., b0, ...):
        pid = tl.program_id(0)
        if pid < 32:
            kernel_0(a0, a1, ..., pid)
        elif pid < 48:
            kernel_1(b0, ..., pid - 32)

``groups`` finds the runs: consecutive launches, with no library operator between them, each
reading none of the run's earlier outputs. A kernel whose combine is fused into it
(``lower.fuse``) takes part with its combine: the pair's last blocks run the combine, each
member's completion counters a range of its own in one buffer. A kernel that
reads an input through a view of its own strides (``LowerOptions.input_strides``: a model's
weight read as Wᵀ) takes part like any other: its block body reads through those strides.
The blocks of one launch share ``num_warps`` and ``num_stages``; whether one launch is faster
than several is the tuner's to measure (the knob ``horizontal``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..graph import KernelGraph
from ..mugraph.kernel import GraphDefinedKernel
from ..ops import lookup

#: the most kernels one launch runs side by side
MAX_SIBLINGS = 8


def groups(graph: KernelGraph, combines: Mapping[int, Any]) -> list[list[GraphDefinedKernel]]:
    """The runs of sibling kernels of ``graph`` (two or more each), in launch order;
    ``combines``: the fused combines (``fuse.plan``): a producer takes part with its consumer,
    which runs in its launch, and none of the run's kernels may read what the pair
    computes."""
    runs: list[list[GraphDefinedKernel]] = []
    current: list[GraphDefinedKernel] = []
    written: set[int] = set()
    operators: dict[int, list[Any]] = {}
    for t in graph.operators:
        if lookup(t.op).graph_defined:  # type: ignore[arg-type]
            operators.setdefault(id(t.params["kernel"]), []).append(t)
    seen: set[int] = set()

    def close() -> None:
        nonlocal current
        if len(current) > 1:
            runs.append(current)
        current = []
        written.clear()

    for t in graph.operators:
        if not lookup(t.op).graph_defined:  # type: ignore[arg-type]
            close()
            continue
        kernel = t.params["kernel"]
        if id(kernel) in seen:  # taken at its first output, or with its producer
            continue
        seen.add(id(kernel))
        mine = list(operators[id(kernel)])
        c = combines.get(id(kernel))
        if c is not None:  # a producer (a consumer is seen with it): the pair is one launch
            seen.add(id(c.consumer))
            mine += operators[id(c.consumer)]
        made = {u.index for u in mine}
        reads = {o.index for u in mine for o in u.operands} - made
        if reads & written or len(current) == MAX_SIBLINGS:
            close()
        current.append(kernel)
        written.update(made)
    close()
    return runs


def flat_pid_lines(grid: Sequence[int]) -> list[str]:
    """``pid_x``, ``pid_y``, ``pid_z`` (for the grid axes of more than one block) from the
    flat block index ``hpid`` of a kernel of grid ``grid`` (x fastest)."""
    lines = []
    stride = 1
    for axis, g in enumerate(grid):
        if g > 1:
            name = "xyz"[axis]
            scaled = "hpid" if stride == 1 else f"(hpid // {stride})"
            last = math.prod(grid[axis + 1:]) == 1
            lines.append(f"pid_{name} = {scaled}" + ("" if last else f" % {g}"))
        stride *= g
    return lines


def wrapper_source(name: str, members: Sequence[tuple[str, int, int]]) -> str:
    """The kernel ``name`` that runs ``members`` side by side: (the member's block-body
    function, its argument count, its blocks) each; its arguments are the members', in
    order."""
    args: list[list[str]] = []
    for k, (_, n, _) in enumerate(members):
        args.append([f"a{k}_{i}" for i in range(n)])
    flat = [a for group in args for a in group]
    lines = ["@triton.jit", f"def {name}({', '.join(flat)}):",
             f"    # {len(members)} kernels side by side (lower.horizontal)",
             "    pid = tl.program_id(0)"]
    start = 0
    for k, ((fn, _, blocks), group) in enumerate(zip(members, args)):
        end = start + blocks
        word = "if" if k == 0 else ("else" if k == len(members) - 1 else "elif")
        cond = "" if word == "else" else f" pid < {end}"
        lines.append(f"    {word}{cond}:")
        offset = "pid" if start == 0 else f"pid - {start}"
        lines.append(f"        {fn}({', '.join([*group, offset])})")
        start = end
    return "\n".join(lines) + "\n"
