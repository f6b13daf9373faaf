"""A whole μGraph as one standalone Python file: the Triton kernels and a host ``run``.

The file imports only torch and triton. ``run(*inputs)`` checks the inputs and calls
``launch``, which allocates every intermediate and output tensor, launches the graph-defined
kernels in graph order (one launch per kernel, all of its outputs at once; a combine kernel
fused into its producer by ``fuse`` is no launch of its own) and computes library operators with
torch, in fp32, through each op-table entry's ``triton.host`` emission. It returns the list of
outputs. Launches after the first skip Triton's per-call argument binding (``HELPERS``).
``launch_traced`` does the same through ``torch.library.wrap_triton``, for torch's tracing:
``torch.compile``'s Inductor then launches the kernels from its own code (``fx.runtime``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..dtypes import DType
from ..errors import EMError, GraphError, LowerError
from ..files import write_atomic
from ..graph import KernelGraph, Tensor
from ..mugraph.kernel import GraphDefinedKernel
from ..mugraph.threadblock import ThreadBlockGraph
from ..ops import lookup
from . import fuse, horizontal
from .kernel_codegen import DotConfig, KernelRole, kernel_source
from .tile_context import swappable
from .writes import OutputWrite, checked, host_parameters

TORCH_DTYPE = {DType.float16: "torch.float16", DType.bfloat16: "torch.bfloat16",
               DType.float32: "torch.float32"}
PRECISIONS = ("ieee", "tf32", "tf32x3")
#: the meta-parameters a tuner may vary (they change speed, never results)
KNOBS: dict[str, tuple[int, ...]] = {"num_warps": (2, 4, 8), "num_stages": (1, 2, 3, 4)}


def graph_knobs(graph: KernelGraph) -> dict[str, tuple[bool, ...]]:
    """Knobs that matter for ``graph`` only: ``fuse_combines`` where a combine can be fused (a
    fused combine saves a launch but keeps its partials in fp32 and leaves the combine to the
    last blocks; which is faster depends on the sizes); ``swap_dots`` where a graph-defined
    kernel has a dot of few rows and many columns (``tile_context.swappable``); ``pdl`` where
    it launches two kernels or more (``canonical_knobs`` drops the settings where it does
    not matter); ``horizontal`` where sibling kernels can share a launch, on first (a tuner's
    first timing takes each knob's first value): an RMSNorm with the q, k and v projections of
    an 8B model, three split-K GEMVs and their combines, ran 16.4 µs in one launch (combines
    fused), 16.8 in two, against 25.8 in six on an H200 (``scripts/gpu_probes/
    joined_outputs.py``)."""
    knobs: dict[str, tuple[bool, ...]] = {}
    if fuse.plan(graph):
        knobs["fuse_combines"] = (True, False)
    if any(swappable(t) for kernel, _ in fuse.launches(graph) for t in kernel.tb.tensors):
        knobs["swap_dots"] = (False, True)
    if len(fuse.launches(graph)) > 1:
        knobs["pdl"] = (False, True)
    if horizontal.groups(graph, {}) or horizontal.groups(graph, fuse.plan(graph)):
        knobs["horizontal"] = (True, False)
    return knobs


def canonical_knobs(graph: KernelGraph, knobs: Mapping[str, Any]) -> dict[str, Any]:
    """``knobs`` with ``pdl`` off where it changes nothing: where the program launches one
    kernel (its combines fused). Two settings with the same canonical form generate the same
    program, so a tuner times one of them."""
    out = dict(knobs)
    combines = fuse.plan(graph) if out.get("fuse_combines", LowerOptions.fuse_combines) else {}
    if out.get("pdl") and len(_launched(graph, combines)) < 2:
        out["pdl"] = False
    if out.get("horizontal") and (out.get("pdl") or not horizontal.groups(graph, combines)):
        out["horizontal"] = False
    return out


def _launched(graph: KernelGraph, combines: Mapping[int, fuse.Combine]) -> list[GraphDefinedKernel]:
    """The graph-defined kernels launched, in order (a fused combine is no launch)."""
    return [k for k, _ in fuse.launches(graph)
            if (c := combines.get(id(k))) is None or c.consumer is not k]


@dataclass(frozen=True)
class LowerOptions:
    """Meta-parameters of the lowering.

    ``num_warps`` and ``num_stages`` are the launch defaults written into the program (``run``
    also takes them as keyword arguments, so a tuner can try others without regenerating).
    ``fp32_dots`` casts ``tl.dot`` operands to fp32 (needed for bfloat16 in Triton's
    interpreter); ``fp32_precision`` is the precision of dots on fp32 operands (``"ieee"``,
    ``"tf32"``, ``"tf32x3"``). ``fuse_combines`` runs a kernel that combines the partials of
    the kernel before it inside that kernel, where ``fuse.plan`` finds this exact.
    ``swap_dots`` writes a dot of two loaded rank-2 tiles with fewer than 64 rows and at least
    64 columns (``tile_context.swappable``) as ``tl.trans(tl.dot(Bᵀ, Aᵀ))``: Hopper's wgmma
    takes 64 rows or more, so a few rows of X against a wide tile of W otherwise run on the
    older mma instruction. ``pdl`` launches each kernel after the program's first as a
    programmatic dependent of the kernel before it (Hopper and later; elsewhere, and under the
    interpreter, the program launches as without it): the kernel may start while the one
    before finishes, and waits for it (``gdc_wait``) before its first statement, so the
    launch and the blocks' start overlap the end of the kernel before. The program's first
    kernel does not wait, so one call never overlaps the call before it. ``horizontal``
    launches sibling kernels (consecutive, none reading another's outputs) as the blocks of
    one grid (``horizontal``); it is off where ``pdl`` is on.
    """

    num_warps: int = 4
    num_stages: int = 2
    fp32_dots: bool = False
    fp32_precision: str = "ieee"
    fuse_combines: bool = True
    swap_dots: bool = False
    pdl: bool = False
    #: sibling kernels (none reads another's outputs) launched as one grid (``horizontal``);
    #: not with ``pdl``
    horizontal: bool = False
    #: per graph input, the element strides it is read with (a transposed view of a weight,
    #: read in place), or None: row-major; empty: every input row-major
    input_strides: tuple[tuple[int, ...] | None, ...] = ()
    #: graph outputs also stored in place into a destination the caller passes, at positions
    #: an index tensor gives (``writes``: a static cache's new token)
    writes: tuple[OutputWrite, ...] = ()

    def __post_init__(self) -> None:
        for name in ("num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LowerError(f"lowering option {name} must be a positive integer, got {v!r}")
        if self.num_warps & (self.num_warps - 1):
            raise LowerError(f"lowering option num_warps must be a power of two, got "
                             f"{self.num_warps}")
        for name in ("fp32_dots", "fuse_combines", "swap_dots", "pdl", "horizontal"):
            if not isinstance(getattr(self, name), bool):
                raise LowerError(f"lowering option {name} must be True or False, got "
                                 f"{getattr(self, name)!r}")
        if not isinstance(self.input_strides, tuple) or not all(
                v is None or (isinstance(v, tuple) and all(isinstance(x, int) and x >= 0
                                                           for x in v))
                for v in self.input_strides):
            raise LowerError(f"lowering option input_strides must be a tuple of stride tuples "
                             f"or None, got {self.input_strides!r}")
        if self.fp32_precision not in PRECISIONS:
            raise LowerError(f"lowering option fp32_precision must be one of {PRECISIONS}, got "
                             f"{self.fp32_precision!r}")


def _names(graph: KernelGraph) -> dict[int, str]:
    """Variable names: ``v<k>`` for the k-th input, ``t<index>`` for the other tensors."""
    names = {t.index: f"t{t.index}" for t in graph.tensors}
    names.update({t.index: f"v{k}" for k, t in enumerate(graph.inputs)})
    return names


def _host_call(t: Tensor, names: dict[int, str]) -> str:
    """A library operator as a torch statement, computed in fp32: on fp32 copies of its
    operands, or on the operands as stored where the call accumulates in fp32 itself
    (``TritonEmission.host_stored``, operands of one dtype)."""
    spec = lookup(t.op)  # type: ignore[arg-type]
    stored = spec.triton.host_stored and len({o.dtype for o in t.operands}) == 1
    args = [names[o.index] if stored or o.dtype == DType.float32 else f"{names[o.index]}.float()"
            for o in t.operands]
    try:
        expr = spec.triton.host(args, [o.dims for o in t.operands], t.params)
    except EMError:
        raise
    except Exception as e:
        raise LowerError(f"library operator t{t.index} = {t.op}: {type(e).__name__}: {e}") from e
    if t.dtype != DType.float32 and not (stored and t.dtype == t.operands[0].dtype):
        expr = f"({expr}).to({TORCH_DTYPE[t.dtype]})"
    return f"{names[t.index]} = {expr}"


@dataclass(frozen=True)
class LaunchPlan:
    """The "plan" stage: variable names, which combines run fused, what each kernel writes,
    the launch order, and whether the launches use programmatic dependent launch."""

    names: dict[int, str]
    combines: dict[int, fuse.Combine]
    #: id(kernel) -> the kernel-graph tensors it writes
    outputs: dict[int, list[Tensor]]
    #: the graph-defined kernels launched, in order
    order: list[GraphDefinedKernel]
    pdl: bool
    #: runs of sibling kernels launched as one grid (``horizontal``), in launch order
    siblings: list[list[GraphDefinedKernel]] = field(default_factory=list)

    def position(self, kernel: GraphDefinedKernel) -> int:
        return next(n for n, k in enumerate(self.order) if k is kernel)

    @property
    def counters(self) -> int:
        """The fused combines' completion counters one launch needs at most: a combine's
        groups, or a run of siblings' groups together (each its own range)."""
        one = [c.groups for c in self.combines.values()]
        runs = [sum(self.combines[id(k)].groups for k in run if id(k) in self.combines)
                for run in self.siblings]
        return max([*one, *runs], default=0)


@dataclass(frozen=True)
class Emitted:
    """The "emit" stage: every kernel's Triton source (in file order) and the host function's
    body (allocations, launches and library calls, in graph order)."""

    kernel_sources: list[str]
    body: list[str]
    #: the same body for ``launch_traced``: each graph-defined kernel called through
    #: ``torch.library.wrap_triton`` (a call torch's tracing records, so that Inductor launches
    #: the kernel itself), without programmatic dependent launch, a fused combine's counters
    #: the caller's buffer (``counters=``), else a fresh zeroed one per call
    traced: list[str] = field(default_factory=list)


def plan_launches(graph: KernelGraph, options: LowerOptions) -> LaunchPlan:
    """Stage "plan" of the lowering."""
    if not isinstance(graph, KernelGraph):
        raise GraphError(f"lowering: expected a KernelGraph, got {type(graph).__name__}")
    if not graph.outputs:
        raise GraphError("lowering: the graph has no outputs; call mark_output")
    combines = fuse.plan(graph) if options.fuse_combines else {}
    order = _launched(graph, combines)
    pdl = options.pdl and len(order) > 1
    siblings = horizontal.groups(graph, combines) if options.horizontal and not pdl else []
    return LaunchPlan(_names(graph), combines, {id(k): outs for k, outs in fuse.launches(graph)},
                      order, pdl, siblings)


def emit(graph: KernelGraph, plan: LaunchPlan, options: LowerOptions) -> Emitted:
    """Stage "emit" of the lowering: kernels are written on first use, while the host body is
    walked in graph order."""
    names, combines, outputs, pdl = plan.names, plan.combines, plan.outputs, plan.pdl
    dots = DotConfig(options.fp32_dots, options.fp32_precision, options.swap_dots)
    kernels: dict[tuple[int, str], str] = {}  # (id(block graph), role) -> kernel name
    kernel_sources: list[str] = []

    def kernel_name(tb: ThreadBlockGraph, role: str,
                    how: Callable[[], KernelRole] = KernelRole) -> str:
        """The kernel of ``tb`` in ``role``, written on first use. Its source takes the slot
        it had when named, so a kernel that ``how`` names meanwhile (the combine a producer
        calls) comes after it in the file."""
        if (id(tb), role) not in kernels:
            kernels[id(tb), role] = name = f"kernel_{len(kernels)}"
            at = len(kernel_sources)
            kernel_sources.insert(at, kernel_source(tb, name, dots, how()))
        return kernels[id(tb), role]

    def launched_name(kernel: GraphDefinedKernel, c: fuse.Combine | None, at: int,
                      writes: tuple[tuple[int, OutputWrite], ...] = (),
                      combined: tuple[tuple[int, OutputWrite], ...] = (),
                      flat: int | None = None) -> str:
        """The kernel launched ``at``-th for ``kernel`` (the producer of combine ``c``, which
        calls the consumer's function), with its programmatic-dependent-launch lines and the
        writes of its outputs ``writes`` (of the consumer's: ``combined``). ``flat``: its block
        body as a function of the flat block index, for a launch of siblings (``horizontal``),
        its completion counters from this one on."""
        head = pdl_head(at, len(plan.order)) if pdl else ()
        where = f"@{at}" if pdl else ""  # a block graph launched twice: each with its own head
        where += f"|{writes}" if writes else ""
        # a flat body: a producer's counters start at ``flat`` (a plain one's code is the same
        # wherever it sits in the run)
        where += "" if flat is None else "|flat" + (f"{flat}" if c is not None else "")
        views = strides_of(kernel)
        if c is None:
            return kernel_name(kernel.tb, "plain" + where,
                               lambda: KernelRole(head=head, input_strides=views,
                                                  writes=writes, flat_pid=flat is not None))
        if strides_of(c.consumer):
            raise LowerError("a kernel that combines partials in the kernel before it reads an "
                             "input through a view of its own strides: not supported (give "
                             "that input contiguous)")

        def role() -> KernelRole:
            inner = kernel_name(c.consumer.tb, "consumer" + (f"|{combined}" if combined else "")
                                + ("" if flat is None else "|flat"),
                                lambda: replace(fuse.consumer_role(c), writes=combined,
                                                flat_pid=flat is not None))
            return replace(fuse.producer_role(c, inner, len(combined), flat), head=head,
                           input_strides=views, flat_pid=flat is not None)

        return kernel_name(c.producer.tb, "producer" + where + (f"|{combined}" if combined
                                                                else ""), role)

    strided = input_strides(graph, options)
    # graph output tensor index -> (write number, write)
    written = {graph.outputs[o].index: (j, options.writes[j]) for o, j in
               checked(options.writes, [t.dims for t in graph.outputs]).items()}
    operands = {id(t.params["kernel"]): t.operands for t in graph.operators
                if lookup(t.op).graph_defined}  # type: ignore[arg-type]

    def strides_of(kernel: GraphDefinedKernel) -> tuple[tuple[int, tuple[int, ...]], ...]:
        return tuple((k, strided[o.index]) for k, o in enumerate(operands[id(kernel)])
                     if o.index in strided)

    launched: set[int] = set()
    body: list[str] = []
    traced: list[str] = []
    run_of = {id(k): run for run in plan.siblings for k in run}
    for t in graph.operators:
        if not lookup(t.op).graph_defined:  # type: ignore[arg-type]
            if t.index in written:
                raise LowerError(f"output write {written[t.index][0]}: its output is computed "
                                 f"by library operator {t.op}, not by a kernel")
            body.append(_host_call(t, names))
            traced.append(body[-1])
            continue
        kernel = t.params["kernel"]
        if id(kernel) in launched:
            continue
        launched.add(id(kernel))
        if id(kernel) in run_of:  # the run's first kernel: the whole run, one launch
            run = run_of[id(kernel)]
            launched.update(id(k) for k in run)
            calls = [(k, _call(k, combines.get(id(k)), operands, outputs, names, written))
                     for k in run]
            wrapper = _launch_siblings(calls, combines, launched_name,
                                       lambda: f"kernel_{len(kernels)}", body, traced)
            kernels[id(run[0].tb), f"siblings@{len(kernels)}"] = wrapper[0]
            kernel_sources.append(wrapper[1])
            continue
        c = combines.get(id(kernel))
        if c is not None and c.consumer is kernel:
            continue  # runs inside its producer's launch
        call = _call(kernel, c, operands, outputs, names, written)
        name = launched_name(kernel, c, plan.position(kernel), call.writes, call.combined)
        # a fused combine's completion counters: the shared buffer (``launch``), or the
        # caller's persistent buffer, else a fresh zeroed one per call (``launch_traced``)
        counters = [f"_counters({call.device}.device, {c.groups})"] if c else []
        fresh = [f"_traced_counters(counters, {c.groups}, {call.device}.device)"] if c else []
        body.extend(call.allocations)
        traced.extend(call.allocations)
        after = ", pdl=PDL" if pdl and plan.position(kernel) > 0 else ""
        body.append(f"_launch({name}, {kernel.tb.grid_dim}, "
                    f"({', '.join(call.args + counters)},), num_warps, num_stages{after})")
        traced.append(f"_traceable({name})[{kernel.tb.grid_dim}]("
                      f"{', '.join(call.args + fresh)}, "
                      "num_warps=num_warps, num_stages=num_stages)")
    stored = {u.index for outs in outputs.values() for u in outs}
    for t_index, (j, _w) in written.items():
        if t_index not in stored:  # a graph input returned as is: no kernel stores it
            raise LowerError(f"output write {j}: no kernel computes its output")
    return Emitted(kernel_sources, body, traced)


def _writes_of(outs: Sequence[Tensor], written: Mapping[int, tuple[int, OutputWrite]]
               ) -> list[tuple[int, tuple[int, OutputWrite]]]:
    """(position among ``outs``, (write number, write)) of the kernel outputs ``outs`` that are
    written (``written``: graph output tensor index -> write)."""
    return [(k, written[u.index]) for k, u in enumerate(outs) if u.index in written]


@dataclass(frozen=True)
class Call:
    """What the host passes one graph-defined kernel's launch (with its fused combine's
    consumer, where it has one): its arguments but the counters, the lines allocating its
    outputs, and the writes of its own and the consumer's outputs."""

    args: list[str]
    allocations: list[str]
    writes: tuple[tuple[int, OutputWrite], ...]
    combined: tuple[tuple[int, OutputWrite], ...]
    #: the name of a tensor on the launch's device
    device: str


def _call(kernel: GraphDefinedKernel, c: fuse.Combine | None, operands: Mapping[int, Any],
          outputs: Mapping[int, list[Tensor]], names: Mapping[int, str],
          written: Mapping[int, tuple[int, OutputWrite]]) -> Call:
    """The ``Call`` of ``kernel``, the producer of combine ``c`` where it is not None."""
    outs = list(outputs[id(kernel)])
    args = [names[o.index] for o in operands[id(kernel)]] + [names[u.index] for u in outs]
    mine = _writes_of(outs, written)
    if c is not None and mine:
        raise LowerError("output write: its output is a split-K partial")
    args += [f"{p}{j}" for _, (j, _w) in mine for p in ("w", "wi")]
    # the fused combine's writes: parameters of the producer, which passes them on
    combined = _writes_of(outputs[id(c.consumer)], written) if c is not None else []
    device = names[operands[id(kernel)][0].index]
    if c is not None:
        b_outs = outputs[id(c.consumer)]
        args += [names[b_outs[0].operands[j].index] for j, k in enumerate(c.from_producer)
                 if k is None]
        args += [names[u.index] for u in b_outs]
        args += [f"{p}{j}" for _, (j, _w) in combined for p in ("w", "wi")]
        outs += b_outs
    private = {outputs[id(c.producer)][k].index for k in c.private} if c else set()
    allocations = [f"{names[u.index]} = torch.empty({u.dims}, dtype="
                   f"{'torch.float32' if u.index in private else TORCH_DTYPE[u.dtype]}, "
                   f"device={device}.device)" for u in outs]
    return Call(args, allocations, tuple((k, w) for k, (_, w) in mine),
                tuple((k, w) for k, (_, w) in combined), device)


def _launch_siblings(calls: Sequence[tuple[GraphDefinedKernel, Call]],
                     combines: Mapping[int, fuse.Combine], launched_name: Callable[..., str],
                     new_name: Callable[[], str], body: list[str], traced: list[str]
                     ) -> tuple[str, str]:
    """The host lines of sibling kernels launched as one grid (``horizontal``; ``calls``: each
    with its ``Call``): each kernel's outputs allocated, its block body a function of the flat
    block index (``launched_name``'s ``flat``), a fused combine's completion counters a range
    of one buffer of them all, and the launch of a kernel calling the bodies (named by
    ``new_name`` once they are); returns that kernel's name and source."""
    members = []
    args: list[str] = []
    base = 0
    counters = f"counters_{len(body)}"  # a name of its own in the host function
    for kernel, call in calls:
        c = combines.get(id(kernel))
        body.extend(call.allocations)
        traced.extend(call.allocations)
        fn = launched_name(kernel, c, 0, call.writes, call.combined, flat=base)
        mine = call.args + ([counters] if c is not None else [])
        members.append((fn, len(mine), math.prod(kernel.tb.grid_dim)))
        args += mine
        base += c.groups if c is not None else 0
    if base:
        device = calls[0][1].device
        body.append(f"{counters} = _counters({device}.device, {base})")
        traced.append(f"{counters} = _traced_counters(counters, {base}, {device}.device)")
    name = new_name()
    grid = (sum(m[2] for m in members), 1, 1)
    body.append(f"_launch({name}, {grid}, ({', '.join(args)},), num_warps, num_stages)")
    traced.append(f"_traceable({name})[{grid}]({', '.join(args)}, "
                  "num_warps=num_warps, num_stages=num_stages)")
    return name, horizontal.wrapper_source(name, members)


def input_strides(graph: KernelGraph, options: LowerOptions) -> dict[int, tuple[int, ...]]:
    """Graph input tensor index -> the element strides ``options.input_strides`` gives it
    (inputs read row-major are left out); a ``LowerError`` names a malformed entry."""
    given = options.input_strides
    if not given:
        return {}
    if len(given) != len(graph.inputs):
        raise LowerError(f"lowering option input_strides has {len(given)} entries for "
                         f"{len(graph.inputs)} inputs")
    out = {}
    for k, (t, strides) in enumerate(zip(graph.inputs, given)):
        if strides is None:
            continue
        if len(strides) != len(t.dims):
            raise LowerError(f"lowering option input_strides: input {k} of dims {t.dims} "
                             f"has strides {strides}")
        out[t.index] = strides
    return out


#: The lowering as named stages, in order: each takes the graph, the options and the artefacts
#: of the stages before it (by name) and returns its own artefact (``lowering_stages``).
STAGES: tuple[tuple[str, Callable[[KernelGraph, LowerOptions, dict[str, Any]], Any]], ...] = (
    ("plan", lambda g, o, done: plan_launches(g, o)),
    ("emit", lambda g, o, done: emit(g, done["plan"], o)),
    ("program", lambda g, o, done: _file(g, done["plan"].names, o, done["emit"].kernel_sources,
                                         done["emit"].body, done["plan"].counters,
                                         done["plan"].pdl, done["emit"].traced)),
)


def lowering_stages(graph: KernelGraph, options: LowerOptions = LowerOptions()
                    ) -> dict[str, Any]:
    """Every stage's artefact, by stage name, in order (``STAGES``): for inspection; the
    last, "program", is the generated source."""
    done: dict[str, Any] = {}
    for name, stage in STAGES:
        done[name] = stage(graph, options, done)
    return done


def generate_source(graph: KernelGraph, options: LowerOptions = LowerOptions()) -> str:
    """The Python source of the Triton program for ``graph``."""
    return lowering_stages(graph, options)["program"]


def pdl_head(position: int, launches: int) -> tuple[str, ...]:
    """The first lines of the ``position``-th of ``launches`` kernels under ``pdl``: wait for
    the kernels before (all but the first), then let the next launch (all but the last)."""
    steps = []
    if position > 0:
        steps.append(("wait for the kernels launched before this one",
                      "tl.extra.cuda.gdc_wait()"))
    if position < launches - 1:
        steps.append(("let the next kernel launch (it waits for this one)",
                      "tl.extra.cuda.gdc_launch_dependents()"))
    return (f"# programmatic dependent launch: {', then '.join(say for say, _ in steps)}",
            "if PDL:", *(f"    {line}" for _, line in steps))


#: the generated file's helpers: checking inputs, launching kernels, the fused combines
#: completion counters (``fuse``)
HELPERS = """

def _checked(xs):  # each input row-major, or with the strides INPUTS gives it
    out = []
    for k, (x, (dims, dtype, strides)) in enumerate(zip(xs, INPUTS)):
        if tuple(x.shape) != dims or x.dtype != dtype:
            raise ValueError(f'input {k}: expected {dtype} {dims}, got {x.dtype} {tuple(x.shape)}')
        if strides is None:
            x = x.contiguous()
        elif tuple(x.stride()) != strides:
            x = torch.empty_strided(dims, strides, dtype=dtype, device=x.device).copy_(x)
        out.append(x)
    return out


# A kernel's first launch for a device and knob setting goes through Triton (kernel[grid](...),
# which compiles it). Later launches call the compiled kernel's launcher directly, skipping
# Triton's per-call argument binding, when nothing Triton decides per call can differ: Triton
# has ``triton.knobs`` (3.4 and later), no launch hook is set, and every pointer is 16-byte
# aligned as at the first launch (the compiled kernel assumes it). Otherwise Triton launches.
_RUNTIME = getattr(getattr(triton, "knobs", None), "runtime", None)
_COMPILED = {}


def _launch(kernel, grid, args, num_warps, num_stages, pdl=False):
    device = torch.cuda.current_device() if args[0].is_cuda else -1
    key = (kernel, device, num_warps, num_stages)
    compiled = _COMPILED.get(key)
    if compiled is not None and _unhooked() and all(a.data_ptr() % 16 == 0 for a in args):
        stream = triton.runtime.driver.active.get_current_stream(device)
        compiled.run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *args)
        return
    options = {"launch_pdl": True} if pdl else {}  # a compile option: the launcher keeps it
    compiled = kernel[grid](*args, num_warps=num_warps, num_stages=num_stages, **options)
    if key not in _COMPILED:
        direct = (_RUNTIME is not None and device >= 0 and hasattr(compiled, "packed_metadata")
                  and all(a.data_ptr() % 16 == 0 for a in args))
        _COMPILED[key] = compiled if direct else None


def _traceable(kernel):  # a launch torch's tracing records (``launch_traced``)
    return torch.library.wrap_triton(kernel)


def _unhooked():  # no launch hook is set (each is None, or a chain of no calls)
    return all(h is None or getattr(h, "calls", None) == []
               for h in (_RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook))
"""
COUNTERS_HELPER = """

# Completion counters of the fused combines: one zeroed int32 buffer per device and stream,
# made on first use. Every launch leaves its counters at zero again, so launches on one stream
# share the buffer; launches on other streams get their own.
_COUNTERS = {}


def _counters(device, n):
    cuda = device.type == "cuda"
    key = (device, triton.runtime.driver.active.get_current_stream(device.index) if cuda else 0)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[key] = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    return buf


def _traced_counters(counters, n, device):  # ``launch_traced``'s: the caller's, or fresh zeros
    if counters is None:
        return torch.zeros((n,), dtype=torch.int32, device=device)
    if counters.dtype != torch.int32 or counters.numel() < n:
        raise ValueError(f"counters: expected an int32 buffer of at least {n} zeros, got "
                         f"{counters.dtype} of {counters.numel()}")
    return counters
"""


#: the generated file's switch for ``pdl``: on for Hopper and later GPUs, off under the
#: interpreter (whose kernels run as Python, one launch after the other)
PDL_SWITCH = [
    "",
    "# Programmatic dependent launch: each kernel after the first is launched as a dependent",
    "# of the one before; it may start while that one finishes, and waits for it first.",
    'PDL = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()',
    "                   and torch.cuda.get_device_capability()[0] >= 9)",
]


def _file(graph: KernelGraph, names: dict[int, str], options: LowerOptions,
          kernel_sources: list[str], body: list[str], counters: int, pdl: bool,
          traced: Sequence[str] = ()) -> str:
    """The program's source; ``counters``: the int32 completion counters its fused combines
    need at most (0: none)."""
    ins = [names[t.index] for t in graph.inputs]
    outs = [names[t.index] for t in graph.outputs]
    extra = host_parameters(options.writes)
    signature = ", ".join(ins + extra)
    checked_ins = ", ".join(ins)
    passed = "".join(f", {p}" for p in extra)
    described = "\n".join(f"    {names[t.index]}: {t.dtype.value} {t.dims}" for t in graph.inputs)
    returned = "\n".join(f"    {names[t.index]}: {t.dtype.value} {t.dims}"
                         for t in graph.outputs)
    strided = input_strides(graph, options)
    specs = ", ".join(f"({t.dims}, {TORCH_DTYPE[t.dtype]}, {strided.get(t.index)})"
                      for t in graph.inputs)
    lines = [
        f'"""Triton program generated by egraph-mirage from a μGraph ({_count(ins, "input")}, '
        f'{_count(kernel_sources, "kernel")}, {_count(outs, "output")}).',
        "",
        f"run({signature}) -> [{', '.join(outs)}]",
        "Inputs:",
        described,
        "Outputs:",
        returned,
        *[f"Writes output {w.output} into w{j} at the positions wi{j} gives along dim {w.dim}"
          for j, w in enumerate(options.writes)],
        "",
        "Without a GPU, set TRITON_INTERPRET=1 before importing this file.",
        '"""',
        "",
        *["import os"] * pdl,
        "import torch",
        "import triton",
        "import triton.language as tl",
        "",
        f"NUM_WARPS = {options.num_warps}",
        f"NUM_STAGES = {options.num_stages}",
        f"INPUTS = [{specs}]",
        "# int32 completion counters the fused combines need (``launch_traced(counters=)``)",
        f"COUNTERS = {counters}",
        *PDL_SWITCH * pdl,
        "",
    ]
    for src in kernel_sources:
        lines += ["", src]
    lines += [
        "",
        f"def run({signature}, *, num_warps=NUM_WARPS, num_stages=NUM_STAGES):",
        '    """The μGraph on torch tensors (on the GPU, or on the CPU under the interpreter);',
        '    returns the list of outputs."""',
        f"    return launch(*_checked([{checked_ins}]){passed}, num_warps=num_warps, "
        "num_stages=num_stages)",
        "",
        "",
        f"def launch({signature}, *, num_warps=NUM_WARPS, num_stages=NUM_STAGES):",
        '    """``run`` on inputs already checked: contiguous tensors of the shapes and dtypes in',
        '    INPUTS."""',
        *[f"    {line}" for line in body],
        f"    return [{', '.join(outs)}]",
        "",
        "",
        f"def launch_traced({signature}, *, counters=None, num_warps=NUM_WARPS,",
        "                  num_stages=NUM_STAGES):",
        '    """``launch`` for torch\'s tracing (``torch.compile``\'s Inductor then launches the',
        '    kernels itself): each kernel through ``torch.library.wrap_triton``, no programmatic',
        '    dependent launch. ``counters``: an int32 buffer of at least COUNTERS zeros, which',
        '    every call leaves zeroed (a persistent buffer: no kernel zeroes it per call); None:',
        '    a fresh one per call."""',
        *[f"    {line}" for line in traced],
        f"    return [{', '.join(outs)}]",
        "",
    ]
    return "\n".join(lines) + HELPERS + (COUNTERS_HELPER if counters else "")


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
