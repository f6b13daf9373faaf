"""Thread-block graphs: the body of a graph-defined kernel, run once per block of a grid.

    tb = em.new_threadblock_graph(grid_dim=(96, 1, 1), block_dim=(128, 1, 1), forloop_range=64)
    x = tb.new_input(X, input_map=(-1, -1, -1), forloop_dim=1)   # (2, 64) tiles of X
    w = tb.new_input(W, input_map=(1, -1, -1), forloop_dim=0)    # (64, 64) tiles of W
    xw = tb.forloop_accum(tb.matmul(x, w))                        # sum over the 64 iterations
    ss = tb.forloop_accum(x, "rms")                               # rms of X over its 4096
    tb.new_output(tb.div(xw, ss), output_map=(1, -1, -1))
    (O,) = g.customized([X, W], tb)

Operators before a ``forloop_accum`` run every iteration; operators after it run once, after the
loop (the epilogue). Every output passes through an accumulator, or is a running max (its value
after the loop). For online softmax,
``tb.forloop_max(s)`` is the running max of ``s`` (a loop-side tile) and
``tb.forloop_accum(x, rescale=m)`` rescales earlier iterations' sums by ``exp(m_old - m_new)``.
"""

from __future__ import annotations

import reprlib
from collections.abc import Sequence
from typing import Any

from ..dtypes import DType
from ..errors import BlockGraphError, GraphError, MapError, ResourceError
from ..ops import BLOCK, lookup
from ..ops import shapes as sh
from ..ops.shorthands import OpShorthands
from . import maps as pt
from .accumulators import lookup_accumulator, running_max_shape
from .kernel import GraphDefinedKernel
from .maps import EPILOGUE, INVARIANT, LOOP_SIDE

#: shared memory a block may use for its tiles, in bytes (the original system's default)
DEFAULT_SMEM_BYTES = 96 * 1024
#: block ops that are not op-table entries: loaders, accumulators and the running max
ACCUMULATOR_OPS = ("forloop_accum", "forloop_accum_rescale")
BUILDER_OPS = ("input", "forloop_max", *ACCUMULATOR_OPS)


def _ints(what: str, value: Any, error: type[Exception] = MapError) -> tuple[int, ...]:
    """``value`` as a tuple of ints (booleans are not sizes); otherwise ``error`` naming
    ``what``. Lengths and ranges are checked where the numbers are used."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise error(f"{what} must be a sequence of integers, got {reprlib.repr(value)}")
    return tuple(value)


def _int(what: str, value: Any, error: type[Exception] = MapError) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{what} must be an integer, got {reprlib.repr(value)}")
    return value


def _join_sides(op: str, operands: Sequence[BlockTensor]) -> str:
    sides = {t.side for t in operands} - {INVARIANT}
    if len(sides) > 1:
        raise BlockGraphError(
            f"{op}: operands {', '.join(f'b{t.index} ({t.side})' for t in operands)} lie on "
            "both sides of a for-loop accumulator; accumulate both or neither")
    return sides.pop() if sides else INVARIANT


class BlockTensor:
    """A tile of a thread-block graph."""

    __slots__ = ("dims", "dtype", "graph", "index", "op", "operands", "params", "side")

    def __init__(self, graph: ThreadBlockGraph, index: int, dims: tuple[int, ...], dtype: DType,
                 op: str, operands: tuple[BlockTensor, ...], params: dict[str, Any],
                 side: str) -> None:
        self.graph, self.index, self.dims, self.dtype = graph, index, dims, dtype
        self.op, self.operands, self.params, self.side = op, operands, params, side

    def __repr__(self) -> str:
        return f"<BlockTensor b{self.index} {self.op} tile={self.dims} ({self.side})>"


class ThreadBlockGraph(OpShorthands[BlockTensor]):
    """The per-block program of a graph-defined kernel."""

    def as_kernel(self) -> GraphDefinedKernel:
        """This block graph, validated and frozen, as a graph-defined kernel (what
        ``KernelGraph.customized`` adds to a program)."""
        return GraphDefinedKernel(self)

    def __init__(self, grid_dim: Sequence[int] = (1, 1, 1), block_dim: Sequence[int] = (128, 1, 1),
                 forloop_range: int = 1, reduction_dimx: int = 64,
                 smem_bytes: int = DEFAULT_SMEM_BYTES) -> None:
        self.grid_dim, self.forloop_range = pt.check_grid(
            _ints("threadblock graph: grid_dim", grid_dim),
            _int("threadblock graph: forloop_range", forloop_range))
        self.block_dim = _ints("threadblock graph: block_dim", block_dim, BlockGraphError)
        if len(self.block_dim) != 3 or not all(b >= 1 for b in self.block_dim):
            raise BlockGraphError(f"block_dim must be three positive integers, got {block_dim!r}")
        if not isinstance(reduction_dimx, int) or isinstance(reduction_dimx, bool) or \
                reduction_dimx < 1:
            raise BlockGraphError(
                f"reduction_dimx must be a positive integer, got {reduction_dimx!r}")
        self.reduction_dimx = reduction_dimx
        if not isinstance(smem_bytes, int) or isinstance(smem_bytes, bool) or smem_bytes < 1:
            raise BlockGraphError(f"smem_bytes must be a positive integer, got {smem_bytes!r}")
        self.smem_bytes = smem_bytes
        #: set once the graph is used by a kernel; a used graph cannot change
        self.frozen = False
        self.tensors: list[BlockTensor] = []
        self.inputs: list[BlockTensor] = []
        self.sources: list[Any] = []  # the kernel-graph tensor each input loads from
        self.outputs: list[tuple[BlockTensor, tuple[int, ...]]] = []

    # --- loaders ----------------------------------------------------------------------------
    def new_input(self, dtensor: Any, input_map: Sequence[int],
                  forloop_dim: int = -1) -> BlockTensor:
        """Load tiles of kernel-graph tensor ``dtensor`` (see ``partition`` for the maps)."""
        from ..graph import Tensor

        if not isinstance(dtensor, Tensor):
            raise GraphError(
                f"new_input: expected a kernel-graph Tensor, got {type(dtensor).__name__}")
        what = f"new_input #{len(self.inputs)} (dims {dtensor.dims})"
        imap = _ints(f"{what}: input_map", input_map)
        _int(f"{what}: forloop_dim", forloop_dim)
        tile = pt.tile_dims(what, dtensor.dims, self.grid_dim, self.forloop_range, imap,
                            forloop_dim)
        t = self._add(tile, dtensor.dtype, "input", (),
                      {"input_map": imap, "forloop_dim": forloop_dim, "position": len(self.inputs)},
                      LOOP_SIDE if forloop_dim != -1 else INVARIANT)
        self.inputs.append(t)
        self.sources.append(dtensor)
        return t

    # --- operators --------------------------------------------------------------------------
    def apply(self, op: str, operands: Sequence[BlockTensor], **params: Any) -> BlockTensor:
        """Apply op-table operator ``op`` to tiles; the named methods are shorthands."""
        spec = lookup(op)
        if BLOCK not in spec.levels:
            raise BlockGraphError(f"{op}: not allowed in a thread-block graph")
        bound = spec.bind(params)
        if bound is None:
            raise BlockGraphError(f"{op}: expects parameters {spec.params_text}, got "
                                  f"{tuple(params)}")
        params = bound
        operands = tuple(operands)
        lo, hi = spec.num_inputs
        if not lo <= len(operands) <= hi:
            raise BlockGraphError(f"{op}: takes {lo}..{hi} tiles, got {len(operands)}")
        for i, t in enumerate(operands):
            if not isinstance(t, BlockTensor) or t.graph is not self:
                raise BlockGraphError(f"{op}: operand {i} is not a tile of this block graph")
        side = _join_sides(op, operands)
        if "dim" in params:  # tile dims are stored negative: valid in the vectorised layout too
            d = sh.normalize_dim(op, operands[0].dims, params["dim"])
            params["dim"] = d - len(operands[0].dims)
        dims = spec.shape(op, [t.dims for t in operands], params)
        dtype = spec.dtype(op, [t.dtype for t in operands], params)
        return self._add(tuple(dims), dtype, op, operands, params, side)

    def rms_norm(self, A: BlockTensor, eps: float = 0.0) -> BlockTensor:
        """Normalise over the tile's last dimension."""
        return self.apply("rms_norm", (A,), normalized_shape=(A.dims[-1],), eps=eps)

    def forloop_accum(self, A: BlockTensor, acc: str | None = None,
                      rescale: BlockTensor | None = None) -> BlockTensor:
        """Combine ``A`` across the loop's iterations; the result lives after the loop.

        ``rescale=m`` (a loop-side tile) weights iteration i's term by ``exp(m_i - max m)``, the
        max over the loop (linear kinds only: plain, sum, mean, sum_todimx). For a running max
        (``forloop_max``, FlashAttention's form) that is ``exp(m_i - m_last)``: each step
        multiplies the running total by ``exp(m_prev - m_i)`` before adding. For any other tile
        (the maxima of split-KV partials, loaded by the kernel combining them) the block keeps
        its running max ``r`` too: the total is multiplied by ``exp(r_prev - r_i)`` and the
        term by ``exp(m_i - r_i)``, factors of at most 1 both."""
        what = "forloop_accum"
        self._check_tile(what, A)
        if acc is not None and not isinstance(acc, str):
            raise BlockGraphError(f"{what}: the accumulator must be a name (str) or None, got "
                                  f"{reprlib.repr(acc)}")
        if A.side == EPILOGUE:
            raise BlockGraphError(f"{what}: b{A.index} is already after an accumulator")
        kind = lookup_accumulator(acc)
        dims = kind.shape(A.dims, self.reduction_dimx)
        if rescale is None:
            return self._add(dims, A.dtype, "forloop_accum", (A,), {"acc": kind.name}, EPILOGUE)
        self._check_tile(f"{what} rescale", rescale)
        if not kind.linear:
            raise BlockGraphError(f"{what} {kind.name!r}: only the linear accumulators (plain, "
                                  "sum, mean, sum_todimx) can be rescaled")
        if rescale.side == EPILOGUE:
            raise BlockGraphError(f"{what}: rescale tile b{rescale.index} is after an "
                                  "accumulator; it must change with the loop (e.g. forloop_max)")
        for target, role in ((A.dims, "operand"), (dims, "result")):
            if (len(rescale.dims) != len(target)
                    or any(m not in (1, d) for m, d in zip(rescale.dims, target))):
                raise BlockGraphError(
                    f"{what}: rescale tile b{rescale.index} {rescale.dims} does not broadcast to "
                    f"the {role} dims {target} (accumulator {kind.name!r})")
        return self._add(dims, A.dtype, "forloop_accum_rescale", (A, rescale),
                         {"acc": kind.name}, EPILOGUE)

    def forloop_max(self, A: BlockTensor) -> BlockTensor:
        """The running max of ``A``: in iteration i, the max over the last dimension of the tiles
        of iterations 0..i (last dimension 1). A loop-side tile (invariant if ``A`` is)."""
        self._check_tile("forloop_max", A)
        if A.side == EPILOGUE:
            raise BlockGraphError(f"forloop_max: b{A.index} is after an accumulator; the running "
                                  "max is taken inside the loop")
        return self._add(running_max_shape(A.dims), A.dtype, "forloop_max", (A,), {}, A.side)

    def _check_tile(self, what: str, A: Any) -> None:
        if not isinstance(A, BlockTensor) or A.graph is not self:
            raise BlockGraphError(f"{what}: operand is not a tile of this block graph")

    def new_output(self, A: BlockTensor, output_map: Sequence[int]) -> None:
        """Save ``A`` (after an accumulator, or a running max: its value after the loop, the
        max over every iteration; without a loop, ``forloop_range`` 1, any tile);
        blocks are placed by ``output_map``."""
        if not isinstance(A, BlockTensor) or A.graph is not self:
            raise BlockGraphError("new_output: operand is not a tile of this block graph")
        if A.side != EPILOGUE and A.op != "forloop_max" and self.forloop_range > 1:
            raise BlockGraphError(f"new_output: b{A.index} ({A.op}) has not passed through a "
                                  "forloop_accum; every output needs one")
        self._check_open("new_output")
        omap = _ints(f"new_output #{len(self.outputs)}: output_map", output_map)
        pt.output_dims(f"new_output #{len(self.outputs)}", A.dims, self.grid_dim, omap)
        self.outputs.append((A, omap))

    # --- reading ----------------------------------------------------------------------------
    def output_dims(self, i: int) -> tuple[int, ...]:
        t, omap = self.outputs[i]
        return pt.output_dims(f"new_output #{i}", t.dims, self.grid_dim, omap)

    def smem_usage(self) -> int:
        """Bytes of the block's tiles (accumulators and epilogue tensors in fp32)."""
        total = 0
        for t in self.tensors:
            n = 1
            for s in t.dims:
                n *= s
            total += n * (4 if t.side == EPILOGUE else t.dtype.itemsize)
        return total

    def validate(self) -> None:
        """Checks that need the whole graph: outputs exist, the grid is used, tiles fit."""
        if not self.outputs:
            raise BlockGraphError("threadblock graph has no outputs; call tb.new_output(...)")
        pt.check_grid_use(self.grid_dim, [t.params["input_map"] for t in self.inputs])
        used = self.smem_usage()
        if used > self.smem_bytes:
            biggest = max(self.tensors, key=lambda t: _numel(t.dims))
            raise ResourceError(f"threadblock graph needs {used} bytes of shared memory for its "
                                f"tiles, over the budget of {self.smem_bytes} (largest tile "
                                f"b{biggest.index} {biggest.op} {biggest.dims})")

    def thread_chains(self) -> list[list[BlockTensor]]:
        """Maximal chains of element-wise operators, each fused into one thread-level graph."""
        consumers: dict[int, int] = {}
        for t in self.tensors:
            for o in t.operands:
                consumers[o.index] = consumers.get(o.index, 0) + 1
        for t, _ in self.outputs:  # a saved tile must be stored: it ends its chain
            consumers[t.index] = consumers.get(t.index, 0) + 1
        elementwise = {t.index for t in self.tensors
                       if t.op not in BUILDER_OPS and lookup(t.op).elementwise}
        chains: list[list[BlockTensor]] = []
        placed: set[int] = set()
        for t in self.tensors:
            if t.index not in elementwise or t.index in placed:
                continue
            chain = [t]
            placed.add(t.index)
            while True:
                nxt = [u for u in self.tensors if chain[-1] in u.operands]
                if (len(nxt) == 1 and nxt[0].index in elementwise and nxt[0].index not in placed
                        and consumers.get(chain[-1].index, 0) == 1):
                    chain.append(nxt[0])
                    placed.add(nxt[0].index)
                else:
                    break
            chains.append(chain)
        return chains

    def _add(self, dims: tuple[int, ...], dtype: DType, op: str,
             operands: tuple[BlockTensor, ...], params: dict[str, Any], side: str) -> BlockTensor:
        self._check_open(op)
        t = BlockTensor(self, len(self.tensors), dims, dtype, op, operands, params, side)
        self.tensors.append(t)
        return t

    def _check_open(self, what: str) -> None:
        if self.frozen:
            raise BlockGraphError(f"{what}: this threadblock graph is already used by a kernel "
                                  "and cannot change; build a new one")

    def __repr__(self) -> str:
        lines = [f"ThreadBlockGraph(grid={self.grid_dim}, forloop_range={self.forloop_range})"]
        for t in self.tensors:
            args = ", ".join(f"b{o.index}" for o in t.operands)
            ps = "".join(f", {k}={v!r}" for k, v in t.params.items())
            lines.append(f"  b{t.index} = {t.op}({args}{ps}) -> {t.dims} [{t.side}]")
        for t, omap in self.outputs:
            lines.append(f"  output b{t.index} output_map={omap}")
        return "\n".join(lines)


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for s in dims:
        n *= s
    return n


def new_threadblock_graph(grid_dim: Sequence[int] = (1, 1, 1),
                          block_dim: Sequence[int] = (128, 1, 1), forloop_range: int = 1,
                          reduction_dimx: int = 64,
                          smem_bytes: int = DEFAULT_SMEM_BYTES) -> ThreadBlockGraph:
    """A new, empty thread-block graph (the body of one graph-defined kernel)."""
    return ThreadBlockGraph(grid_dim, block_dim, forloop_range, reduction_dimx, smem_bytes)
