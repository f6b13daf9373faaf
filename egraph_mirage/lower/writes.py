"""Outputs also stored in place into a tensor the caller passes, at positions an index tensor
on the device gives: a static KV cache's new token written by the kernel that computes it.

``LowerOptions.writes`` holds one ``OutputWrite`` per written graph output. The program's
``run``, ``launch`` and ``launch_traced`` then take, after the graph's inputs, the destination
``w<j>`` and the index tensor ``wi<j>`` of each write ``j``; the kernel that stores the output
stores the same tile into the destination too, so the write costs no launch and no read. The
output itself is stored as before (a caller that does not need it still gets it: a few bytes at
decode).

Addressing: the output's elements in row-major order are those of a tensor of ``dims`` (the
value's shape in the model's program; the graph's dims may differ by a reshape). An element at
coordinates ``c`` goes to ``sum(c[i] * strides[i])`` in the destination, except along ``dim``,
whose coordinate ``c[dim]`` is replaced by ``index[c[dim]]``: ``dest.index_copy_(dim, index,
value)``, which is what ``index_put`` with ``[None, ..., None, index]`` and a ``copy_`` back
compute. The kernel finds ``c`` from the element's flat offset in the output (``//`` and ``%``
by the sizes of ``dims``), so any tile of the output, whatever grid cuts it, is written right.
Offsets are 32-bit, as every other offset of a generated program.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import LowerError

#: a destination's elements must be addressable with 32-bit offsets
MAX_EXTENT = 2 ** 31


@dataclass(frozen=True)
class OutputWrite:
    """Graph output ``output`` (its position among the graph's outputs) also stored into a
    destination of ``strides`` (one per dim of ``dims``, in elements) whose storage spans
    ``extent`` elements, dimension ``dim`` at the positions an integer index tensor gives."""

    output: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dim: int
    extent: int

    def __post_init__(self) -> None:
        ints = (self.output, self.dim, self.extent, *self.dims, *self.strides)
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in ints):
            raise LowerError(f"output write {self}: every field must be a non-negative integer")
        if len(self.strides) != len(self.dims) or not 0 <= self.dim < len(self.dims):
            raise LowerError(f"output write of output {self.output}: {len(self.dims)} dims, "
                             f"{len(self.strides)} strides, index dim {self.dim}")
        if self.extent >= MAX_EXTENT:
            raise LowerError(f"output write of output {self.output}: a destination of "
                             f"{self.extent} elements needs 64-bit offsets")


def checked(writes: Sequence[OutputWrite], outputs: Sequence[tuple[int, ...]]
            ) -> dict[int, int]:
    """Graph output position -> write number, after checking each write names a distinct
    output whose number of elements is its ``dims``'s (``outputs``: the graph outputs' dims)."""
    if not isinstance(writes, tuple) or not all(isinstance(w, OutputWrite) for w in writes):
        raise LowerError(f"lowering option writes must be a tuple of OutputWrite, got "
                         f"{writes!r}")
    out: dict[int, int] = {}
    for j, w in enumerate(writes):
        if w.output >= len(outputs) or w.output in out:
            raise LowerError(f"output write {j}: output {w.output} is not a distinct output of "
                             f"the graph's {len(outputs)}")
        if math.prod(outputs[w.output]) != math.prod(w.dims):
            raise LowerError(f"output write {j}: output {w.output} of dims "
                             f"{outputs[w.output]} is not a value of dims {w.dims}")
        out[w.output] = j
    return out


def store_lines(j: int, flat: str, value: str, mask: str | None, w: OutputWrite) -> list[str]:
    """The kernel lines storing tile ``value`` (the output's elements at row-major offsets
    ``flat``, where ``mask`` holds) into kernel parameter ``w<j>`` at the positions
    ``wi<j>`` gives (``OutputWrite``)."""
    f = f"w{j}_f"
    lines = [f"# also into w{j} (dims {w.dims}, strides {w.strides}), dim {w.dim} at wi{j}",
             f"{f} = {flat or '0'}"]
    terms = []
    for i, (n, stride) in enumerate(zip(w.dims, w.strides, strict=True)):
        below = math.prod(w.dims[i + 1:])
        if n == 1:
            coord = ""
        else:
            coord = f if below == 1 else f"({f} // {below})"
            if i > 0 and below * n < math.prod(w.dims):
                coord = f"{coord} % {n}"
        if i == w.dim:
            at = f"wi{j} + ({coord})" if coord else f"wi{j}"
            pick = f", mask={mask}, other=0" if coord and mask else ""
            terms.append(f"tl.load({at}{pick}).to(tl.int32) * {stride}")
        elif coord and stride:
            terms.append(f"({coord}) * {stride}" if stride != 1 else f"({coord})")
    lines.append(f"w{j}_off = {' + '.join(terms)}")
    lines.append(f"tl.store(w{j} + w{j}_off, {value}" + (f", mask={mask})" if mask else ")"))
    return lines


def host_parameters(writes: Sequence[OutputWrite]) -> list[str]:
    """The program's parameters after the graph's inputs: ``w<j>``, ``wi<j>`` per write."""
    return [name for j in range(len(writes)) for name in (f"w{j}", f"wi{j}")]


__all__ = ["MAX_EXTENT", "OutputWrite", "checked", "host_parameters", "store_lines"]
