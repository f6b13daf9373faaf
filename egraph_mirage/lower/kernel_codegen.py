"""One graph-defined kernel (a thread-block graph) as the source of one ``@triton.jit`` kernel.

The kernel runs once per block of the grid (``tl.program_id`` gives ``pid_x``, ``pid_y``,
``pid_z``). Its body has three parts, each tile landing in the part its side says:

- before the loop: loop-invariant loads and operators, accumulator initialisation;
- the loop ``for i in range(forloop_range)``: loads at the loop offset, loop operators, one
  accumulation step per accumulator;
- after the loop: accumulator finishing, epilogue operators, masked stores at the output maps.

Tiles are padded to power-of-two blocks (``padding``); every operator is written by its op-table
entry's ``triton.tile`` emission, accumulators by ``accumulate``. See ``docs/lowering.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import EMError, LowerError
from ..mugraph.threadblock import EPILOGUE, INVARIANT, BlockTensor, ThreadBlockGraph
from ..ops import lookup
from ..ops.spec import TileDims
from ..ops.table import triton_exp
from . import padding
from .accumulate import accumulator_emission, rescaled_dims, running_max_dims
from .horizontal import flat_pid_lines
from .tile_context import (
    LOWEST,
    TL_DTYPE,
    WGMMA_ROWS,
    TileContext,
    Val,
    arange,
    broadcast,
    pad_mask,
    shrink,
    squeezed,
    swappable,
)
from .writes import OutputWrite, host_parameters, store_lines

#: the largest block Triton accepts (elements)
MAX_BLOCK_NUMEL = 1 << 20
#: offsets are int32: tensors must have fewer elements than this
MAX_TENSOR_NUMEL = 1 << 31
AXES = "xyz"


@dataclass(frozen=True)
class DotConfig:
    """How ``tl.dot`` is written: operands in fp32 (else the storage dtype), the precision
    of fp32 dots (``"ieee"``, ``"tf32"``, ``"tf32x3"``), and whether a dot of few rows and
    many columns is written swapped (``tile_context.swappable``)."""

    fp32_dots: bool = False
    fp32_precision: str = "ieee"
    swap: bool = False


def live_tiles(tb: ThreadBlockGraph) -> set[int]:
    """Tiles that some output depends on."""
    live: set[int] = set()
    stack = [t for t, _ in tb.outputs]
    while stack:
        t = stack.pop()
        if t.index not in live:
            live.add(t.index)
            stack.extend(t.operands)
    return live


def _scaled(name: str, k: int) -> str:
    return name if k == 1 else f"{name} * {k}"


def _strides(dims: Sequence[int]) -> list[int]:
    return [math.prod(dims[d + 1:]) for d in range(len(dims))]


@dataclass(frozen=True)
class KernelRole:
    """How a kernel takes part in its program beyond its block graph: in a fused combine
    (``fuse``), and in programmatic dependent launch (``program``); the default: neither."""

    #: input positions loaded with ``.cg`` (bypassing L1: tensors other blocks of the same
    #: launch wrote)
    cg_inputs: frozenset[int] = frozenset()
    #: input positions read, and output positions stored, in fp32 whatever their dtype
    #: (partials that only the fused combine reads)
    fp32_inputs: frozenset[int] = frozenset()
    fp32_outputs: frozenset[int] = frozenset()
    #: parameters and closing lines of a producer that runs the combine
    extra_args: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    #: the for-loop as ``tl.static_range`` (a combine's short loop, whose loads can then all
    #: be issued at once)
    unroll: bool = False
    #: first lines of the body (the programmatic-dependent-launch wait and trigger)
    head: tuple[str, ...] = ()
    #: (input position, element strides) of inputs read through a view of their own layout
    #: (``LowerOptions.input_strides``); the others are row-major
    input_strides: tuple[tuple[int, tuple[int, ...]], ...] = ()
    #: the block body as a function of the flat block index ``hpid`` (its last argument),
    #: which a kernel running siblings side by side calls (``horizontal``)
    flat_pid: bool = False
    #: (output position, write) of outputs also stored into a destination at positions an
    #: index tensor gives (``writes``): parameters ``w<j>``, ``wi<j>`` after the outputs
    writes: tuple[tuple[int, OutputWrite], ...] = ()


class KernelWriter:
    """Writes the Triton source of one thread-block graph."""

    def __init__(self, tb: ThreadBlockGraph, name: str, dots: DotConfig,
                 role: KernelRole = KernelRole()) -> None:
        self.tb, self.name, self.dots, self.role = tb, name, dots, role
        self.live = live_tiles(tb)
        self.pad = padding.solve(tb, self.live)
        #: batch dimensions of block size 1 in every tile are left out of the code
        self.layout = squeezed([self.pad[i] for i in self.live])
        self.vals: dict[int, Val] = {}
        self.pre: list[str] = []
        self.loop: list[str] = []
        self.post: list[str] = []
        self.loop_tail: list[str] = []  # the end of the loop body (rescale tiles' last values)
        self._prev: dict[int, str] = {}  # rescale tile -> its previous iteration's variable
        self._factors: dict[str, str] = {}  # rescale factor expression -> its variable
        self._fresh = 0
        self.looped = tb.forloop_range > 1
        #: loop-loaded tiles that feed a large dot and other operators: loaded twice
        #: (``_split_loads``); tile -> the copy the dot reads
        self._dot_vals: dict[int, Val] = {}
        #: block ops that are not op-table entries; every other op goes through ``_operator``
        self._builders = {"input": self._load, "forloop_accum": self._accumulate,
                          "forloop_accum_rescale": self._accumulate,
                          "forloop_max": self._running_max}
        self._split = self._split_loads()

    # --- entry point ------------------------------------------------------------------------
    def source(self) -> str:
        tb = self.tb
        self._check_sizes()
        if self.role.flat_pid:
            self.pre += flat_pid_lines(tb.grid_dim)
        else:
            for axis, g in enumerate(tb.grid_dim):
                if g > 1:
                    self.pre.append(f"pid_{AXES[axis]} = tl.program_id({axis})")
        for t in tb.tensors:
            if t.index not in self.live:
                continue
            try:
                self._builders.get(t.op, self._operator)(t)
            except LowerError as e:
                raise LowerError(f"{self.name}: b{t.index} = {t.op}: {e}") from None
            except EMError:
                raise
            except Exception as e:  # an emission that cannot handle this tile
                raise LowerError(f"{self.name}: b{t.index} = {t.op} on tiles "
                                 f"{[o.dims for o in t.operands]}: {type(e).__name__}: {e}"
                                 ) from e
        for k, (t, omap) in enumerate(tb.outputs):
            self._store(k, t, omap)
        return self._assemble()

    def _assemble(self) -> str:
        tb = self.tb
        args = [f"in{k}" for k in range(len(tb.inputs))] + [f"out{k}" for k in
                                                              range(len(tb.outputs))]
        args += host_parameters([w for _, w in self.role.writes])
        args += self.role.extra_args
        if self.role.flat_pid:
            args.append("hpid")
        head = ["@triton.jit", f"def {self.name}({', '.join(args)}):"]
        doc = [f"# grid {tb.grid_dim}, forloop_range {tb.forloop_range}; block graph:"]
        doc += [f"#   {line.strip()}" for line in repr(tb).splitlines()[1:]]
        body = list(self.role.head) + self.pre
        if self.looped and self.loop + self.loop_tail:  # all tiles invariant: no loop at all
            loop = "tl.static_range" if self.role.unroll else "range"
            body.append(f"for i in {loop}({tb.forloop_range}):")
            body += [f"    {line}" for line in self.loop + self.loop_tail]
        else:
            body += self.loop
        body += self.post + list(self.role.tail)
        return "\n".join(head + [f"    {line}" for line in doc + body]) + "\n"

    # --- parts ------------------------------------------------------------------------------
    def _section(self, side: str) -> list[str]:
        return self.pre if side == INVARIANT else self.post if side == EPILOGUE else self.loop

    def _split_loads(self) -> set[int]:
        """Tiles loaded in the loop that feed both a dot of at least ``WGMMA_ROWS`` rows (as
        written: a swapped dot's rows are its columns) and some other operator.

        Measured on an H200 with Triton 3.6: when one loaded tile feeds a wgmma dot and
        register code (an RMSNorm's sum of squares beside ``X @ W`` at 64 rows, or swapped at
        32), a quarter or more of the knob settings gave wrong products, differently from run
        to run; a second load of the tile for the register code, with ``.cg`` so that Triton
        keeps the two apart, gave none (``docs/lowering.md`` §3b)."""
        dot_use: set[int] = set()
        other_use: set[int] = set()
        for u in self.tb.tensors:
            if u.index not in self.live:
                continue
            spec = lookup(u.op) if u.op not in self._builders else None
            code = self.layout.dims(self.pad[u.index])
            # a swappable dot has under 64 real rows: padded to 64 or more, or swapped
            big = len(code) == 2 and (code[0] >= WGMMA_ROWS or (self.dots.swap and swappable(u)))
            for pos, o in enumerate(u.operands):
                if spec is not None and pos in spec.triton.dot_operands:
                    if big:
                        dot_use.add(o.index)
                else:
                    other_use.add(o.index)
        return {t.index for t in self.tb.tensors
                if t.op == "input" and t.index in dot_use & other_use
                and t.side not in (INVARIANT, EPILOGUE) and self.looped
                and t.params["position"] not in self.role.cg_inputs}

    def _load(self, t: BlockTensor) -> None:
        tb, k = self.tb, t.params["position"]
        src = tb.sources[k]
        imap, fdim = t.params["input_map"], t.params["forloop_dim"]
        strides = dict(self.role.input_strides).get(k) or _strides(src.dims)
        padded, rank = self.pad[t.index], len(t.dims)
        starts = self._starts(imap, src.dims)
        name = f"b{t.index}"
        self.pre.append(f"# b{t.index}: tile {t.dims} of input {k} {src.dims}, "
                        f"input_map {imap}, forloop_dim {fdim}; block {padded}")
        self.pre.append(f"{name}_off = {self._offsets(padded, strides, starts)}")
        mask = pad_mask(t.dims, padded, range(rank), self.layout)
        if mask:
            self.pre.append(f"{name}_mask = {mask}")
        ptr = f"in{k} + {name}_off"
        if fdim != -1 and self.looped:
            ptr += f" + i * {t.dims[fdim] * strides[fdim]}"
        how = (f", mask={name}_mask, other=0.0" if mask else "") + (
            ', cache_modifier=".cg"' if k in self.role.cg_inputs else "")
        load = f"tl.load({ptr}{how})"
        self._section(t.side).append(f"{name} = {load}")
        dtype = "tl.float32" if k in self.role.fp32_inputs else TL_DTYPE[t.dtype]
        self.vals[t.index] = Val(name, t.dims, padded, dtype, zero_pad=True)
        if t.index in self._split:  # the dot reads this load, other operators a second one
            self._dot_vals[t.index] = self.vals[t.index]
            self._section(t.side).append(
                f"{name}_r = tl.load({ptr}{how}, cache_modifier=\".cg\")")
            self.vals[t.index] = Val(f"{name}_r", t.dims, padded, dtype, zero_pad=True)

    def _context(self, t: BlockTensor, operands: Sequence[Val], lines: list[str]) -> TileContext:
        def bind(expr: str, hint: str) -> str:
            self._fresh += 1
            lines.append(f"{hint}{self._fresh} = {expr}")
            return f"{hint}{self._fresh}"

        dot_dtype = "tl.float32" if self.dots.fp32_dots else TL_DTYPE[t.dtype]
        return TileContext(operands, t.dims, self.pad[t.index], bind, dot_dtype,
                           self.dots.fp32_precision, self.layout,
                           self.dots.swap and swappable(t))

    def _operator(self, t: BlockTensor) -> None:
        spec = lookup(t.op)
        rel = spec.triton.dims([o.dims for o in t.operands], t.params)
        lines = self._section(t.side)
        operands = self._shrunk(t, rel, lines, spec.triton.dot_operands)
        ctx = self._context(t, operands, lines)
        expr = spec.triton.tile([v.f32 for v in operands], ctx, t.params)
        self._result(t, rel, operands, expr, spec.triton.keeps_zero, lines)

    def _shrunk(self, t: BlockTensor, rel: TileDims, lines: list[str],
                dot_operands: Sequence[int] = ()) -> list[Val]:
        """Operands with broadcast dimensions (real size 1 against a larger one) at block size 1;
        operands at ``dot_operands`` from the dot's own load where there is one."""
        dims = self._broadcast_dims(t, rel)
        return [self._shrink(self._dot_vals.get(src.index, self.vals[src.index])
                             if o in dot_operands else self.vals[src.index],
                             dims.get(o, []), f"b{src.index}_row", lines)
                for o, src in enumerate(t.operands)]

    @staticmethod
    def _broadcast_dims(t: BlockTensor, rel: TileDims) -> dict[int, list[int]]:
        """Operand -> its dimensions of real size 1 that meet a larger dimension of ``t``."""
        dims: dict[int, list[int]] = {}
        for j, group in enumerate(rel.out):
            for o, d in group:
                if t.operands[o].dims[d] < t.dims[j]:
                    dims.setdefault(o, []).append(d)
        return dims

    def _shrink(self, v: Val, dims: Sequence[int], hint: str, lines: list[str]) -> Val:
        """``v`` with block dimensions ``dims`` brought down to 1, bound to a fresh name."""
        small = shrink(v, dims, self.layout)
        if small is v:
            return v
        self._fresh += 1
        lines.append(f"{hint}{self._fresh} = {small.name}")
        return replace(small, name=f"{hint}{self._fresh}")

    def _natural(self, t: BlockTensor, rel: TileDims, operands: Sequence[Val],
                 keeps_zero: bool) -> tuple[tuple[int, ...], bool]:
        """The block shape an emission gives for tile ``t``, and whether its padding is zero
        (the emission keeps zeros, and no operand is broadcast into the padding)."""
        padded = self.pad[t.index]
        natural = []
        for j, group in enumerate(rel.out):
            if group:
                natural.append(max(operands[o].padded[d] for o, d in group))
            else:
                natural.append(1 if j in rel.reduced else padded[j])
        zero = keeps_zero and all(v.zero_pad for v in operands) and all(
            operands[o].padded[d] == padded[j]
            for j, group in enumerate(rel.out) if padded[j] > t.dims[j] for o, d in group)
        return tuple(natural), zero

    def _result(self, t: BlockTensor, rel: TileDims, operands: Sequence[Val], expr: str,
                keeps_zero: bool, lines: list[str]) -> None:
        """Bind ``expr`` as tile ``t``, broadcast to its block shape where it came out smaller."""
        natural, zero = self._natural(t, rel, operands, keeps_zero)
        v = broadcast(Val(expr, t.dims, natural, "tl.float32", zero), self.pad[t.index],
                      self.layout)
        lines.append(f"b{t.index} = {v.name}")
        self.vals[t.index] = Val(f"b{t.index}", t.dims, v.padded, "tl.float32", v.zero_pad)

    def _accumulate(self, t: BlockTensor) -> None:
        """``forloop_accum`` (one operand) and ``forloop_accum_rescale`` (operand, rescale tile)."""
        emit = accumulator_emission(t.params["acc"])
        rel = emit.dims(len(t.dims))
        if len(t.operands) == 2:
            rel = rescaled_dims(rel)
        iters = self.tb.forloop_range
        name, padded = f"b{t.index}", self.pad[t.index]
        if all(o.side == INVARIANT for o in t.operands) or not self.looped:
            # stepped once, times the iterations (a rescale factor is then exp(0) = 1)
            lines = self.pre if all(o.side == INVARIANT for o in t.operands) else self.loop
            operands = self._shrunk(t, rel, lines)
            step = emit.step(operands[0].f32, self._context(t, operands[:1], lines),
                             self.tb.reduction_dimx)
            if iters > 1:
                step = f"({step}) * {float(iters)!r}"
            self._result(t, rel, operands, step, True, lines)
        else:
            dims = self._broadcast_dims(t, rel)
            x = self._shrink(self.vals[t.operands[0].index], dims.get(0, []),
                             f"b{t.operands[0].index}_row", self.loop)
            step = emit.step(x.f32, self._context(t, [x], self.loop), self.tb.reduction_dimx)
            self.pre.append(f"{name} = tl.zeros({self.layout.shape(padded)}, tl.float32)")
            operands = [x]
            if len(t.operands) == 2:
                factor, weight = self._rescale_factor(t.operands[1], dims.get(1, []))
                operands.append(factor)
                if weight is not None:  # a rescale tile that is not a running max
                    step = f"({step}) * {weight.name}"
                self.loop.append(f"{name} = {name} * {factor.name} + {step}")
            else:
                self.loop.append(f"{name} += {step}")
            natural, zero = self._natural(t, rel, operands, len(t.operands) == 1)
            self.vals[t.index] = Val(name, t.dims, padded, "tl.float32",
                                     zero and natural == padded)
        done = emit.finish(name, iters * t.operands[0].dims[-1])
        if done != name:
            self.post.append(f"{name} = {done}")

    def _rescale_factor(self, tile: BlockTensor, dims: Sequence[int]) -> tuple[Val, Val | None]:
        """The factor ``exp(m_prev - m)`` of rescale tile ``tile`` (``m``) in this iteration,
        0 in the first (whose total is just its step, as in the reference interpreter, also
        for an infinite ``m``), with block dimensions ``dims`` brought down to 1; and None, or
        for a tile that is not a running max, the weight of this iteration's term: then
        ``m_prev`` and ``m`` in the factor are the tile's running max before and after this
        iteration (``b<i>_top``), and the weight is ``exp(m_i - b<i>_top)``. One variable per
        distinct factor or weight, shared by the accumulators that use it."""
        m = self.vals[tile.index]
        running = tile.op == "forloop_max"
        top = m.f32 if running else f"b{tile.index}_top"
        if tile.index not in self._prev:  # m of the previous iteration, fp32 (loop-carried)
            self._prev[tile.index] = prev = f"b{tile.index}_prev"
            shape = self.layout.shape(m.padded)
            if running:
                self.pre.append(f"{prev} = tl.zeros({shape}, tl.float32)")
            else:  # the tile's own running max, before and after this iteration
                self.pre.append(f"{prev} = tl.full({shape}, float('-inf'), tl.float32)")
                # no lower than the lowest finite float (as every max, ``TileContext.max``):
                # maxima loaded as -inf (pieces whose keys a mask hid) weigh 0, not NaN
                self.loop.append(f"{top} = tl.maximum(tl.maximum({prev}, {m.f32}), {LOWEST})")
            self.loop_tail.append(f"{prev} = {top}")
        factor = triton_exp(f"{self._prev[tile.index]} - {top}")
        scale = self._per_iteration(tile, Val(f"tl.where(i > 0, {factor}, 0.0)", m.real,
                                              m.padded, "tl.float32", zero_pad=False),
                                    dims, "scale")
        if running:
            return scale, None
        weight = Val(triton_exp(f"{m.f32} - {top}"), m.real, m.padded, "tl.float32",
                     zero_pad=False)
        return scale, self._per_iteration(tile, weight, dims, "weight")

    def _per_iteration(self, tile: BlockTensor, full: Val, dims: Sequence[int],
                       hint: str) -> Val:
        """``full`` with block dimensions ``dims`` brought down to 1, bound in the loop to a
        variable of its own (one per distinct expression)."""
        small = shrink(full, dims, self.layout)
        if small.name not in self._factors:
            self._fresh += 1
            self._factors[small.name] = f"b{tile.index}_{hint}{self._fresh}"
            self.loop.append(f"{self._factors[small.name]} = {small.name}")
        return replace(small, name=self._factors[small.name])

    def _running_max(self, t: BlockTensor) -> None:
        """``forloop_max``: the max over the last dimension and the iterations so far."""
        rel = running_max_dims(len(t.dims))
        lines = self._section(t.side)
        operands = [self.vals[t.operands[0].index]]
        row = self._context(t, operands, lines).max(operands[0].f32, 0, (len(t.dims) - 1,))
        if t.side == INVARIANT or not self.looped:
            self._result(t, rel, operands, row, False, lines)
            return
        name, padded = f"b{t.index}", self.pad[t.index]
        self.pre.append(f"{name} = tl.full({self.layout.shape(padded)}, float('-inf'), "
                        "tl.float32)")
        lines.append(f"{name} = tl.maximum({name}, {row})")
        self.vals[t.index] = Val(name, t.dims, padded, "tl.float32", zero_pad=False)

    def _store(self, k: int, t: BlockTensor, omap: Sequence[int]) -> None:
        tb = self.tb
        v = self.vals[t.index]
        out_dims = tb.output_dims(k)
        strides, rank = _strides(out_dims), len(out_dims)
        starts = self._starts(omap, out_dims)
        mask = pad_mask(t.dims, v.padded, range(rank), self.layout)
        dtype = "tl.float32" if k in self.role.fp32_outputs else TL_DTYPE[t.dtype]
        value = f"{v.name}.to({dtype})"
        self.post.append(f"# output {k}: tile {t.dims} of {out_dims}, output_map {tuple(omap)}")
        self.post.append(f"out{k}_off = {self._offsets(v.padded, strides, starts)}")
        self.post.append(f"tl.store(out{k} + out{k}_off, {value}"
                         + (f", mask={mask})" if mask else ")"))
        for j, (at, w) in enumerate(self.role.writes):
            if at == k:
                self.post += store_lines(j, f"out{k}_off", value, mask, w)

    def _starts(self, dmap: Sequence[int], dims: Sequence[int]) -> dict[int, str]:
        """Where each block starts along the dimensions of a tensor of ``dims`` that grid axes
        cut (``dmap``: an input or output map): ``pid`` times the piece of that axis."""
        grid = self.tb.grid_dim
        return {d: _scaled(f"pid_{AXES[axis]}", dims[d] // grid[axis])
                for axis, d in enumerate(dmap) if d >= 0 and grid[axis] > 1}

    def _offsets(self, padded: Sequence[int], strides: Sequence[int],
                 starts: dict[int, str]) -> str:
        """Element offsets of a block of shape ``padded`` in a tensor of ``strides``, block
        dimension ``d`` starting at ``starts[d]`` (else 0). A dimension the layout leaves out
        adds its start only."""
        rank, terms = len(padded), []
        for d in range(rank):
            start = starts.get(d, "")
            if self.layout.left_out(d, rank):
                term = start
            else:
                term = arange(padded[d], d, rank, start, self.layout)
            if term:
                terms.append(term if strides[d] == 1 else f"{term} * {strides[d]}")
        return " + ".join(terms)

    def _check_sizes(self) -> None:
        tb = self.tb
        for t in tb.tensors:
            if t.index in self.live and math.prod(self.pad[t.index]) > MAX_BLOCK_NUMEL:
                raise LowerError(f"{self.name}: b{t.index} = {t.op}: tile {t.dims} (block "
                                 f"{self.pad[t.index]}) is over Triton's {MAX_BLOCK_NUMEL} "
                                 "elements per block")
        sizes = [s.dims for s in tb.sources] + [tb.output_dims(k) for k in range(len(tb.outputs))]
        for dims in sizes:
            if math.prod(dims) >= MAX_TENSOR_NUMEL:
                raise LowerError(f"{self.name}: tensor of dims {dims} has 2**31 elements or more; "
                                 "the generated offsets are 32-bit")


def kernel_source(tb: ThreadBlockGraph, name: str, dots: DotConfig = DotConfig(),
                  role: KernelRole = KernelRole()) -> str:
    """The ``@triton.jit`` source of thread-block graph ``tb`` as kernel ``name``."""
    return KernelWriter(tb, name, dots, role).source()
