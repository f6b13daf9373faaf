"""Drawing μGraphs (kernel graphs with graph-defined kernels) with Graphviz.

``mugraph_dot(g)`` turns a kernel graph into DOT text, read top to bottom:

- every **device tensor** is a cylinder labelled ``t<index>``, its dims and dtype (graph inputs
  yellow, graph outputs with a bold border);
- a **library operator** (matmul, concat, rms_norm, ...) is a plain grey box between its operand
  tensors and its result;
- a **graph-defined kernel** is a blue frame labelled with ``grid_dim``, ``block_dim``,
  ``forloop_range`` (``reduction_dimx`` when a ``sum_todimx`` accumulator uses it) and its shared
  memory; inside it, its thread-block graph:

  * *loaders* (``load``, with ``imap`` and ``forloop_dim``, the tile they load), fed by an edge
    from the device tensor labelled with the same maps;
  * the loop body in a green frame ``for i in range(F)``: loaders with a ``forloop_dim`` and every
    tile computed from them, recomputed each iteration;
  * *loop-invariant* tiles (``side == "invariant"``: loaded with ``forloop_dim = -1``, or computed
    from such tiles only) in a dashed grey frame, with dashed boxes: the same every iteration;
  * the *epilogue* in an orange frame: the for-loop accumulators (double border, their kind) and
    the operators after them, run once after the loop;
  * element-wise chains fused into one thread graph (``tb.thread_chains()``) outlined by a dotted
    frame ``thread graph`` (a chain that crosses from invariant tiles into the loop or epilogue is
    outlined on each side, as ``thread graph, part 1 of 2`` and so on);
  * *savers* (``save``, with ``omap``), joined to the output device tensor by an edge labelled
    with the ``omap``.

Operand order is marked (``1``, ``2``) on the edges into non-commutative binary operators
(matmul, div, concat). The text depends only on the graph, so equal graphs draw identically.
``mugraph_svg`` renders with the ``dot`` program; a missing ``dot`` is a ``render.RenderError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from ..errors import GraphError
from ..files import write_atomic
from ..ops import lookup
from ..render import RenderError, svg_of_dot
from .threadblock import (
    ACCUMULATOR_OPS,
    BUILDER_OPS,
    EPILOGUE,
    INVARIANT,
    LOOP_SIDE,
    BlockTensor,
    ThreadBlockGraph,
)

__all__ = ["RenderError", "mugraph_dot", "mugraph_svg"]

_FONT = "Helvetica"
#: fills and borders
INPUT_FILL = "#fff3d6"
TENSOR_FILL = "#ffffff"
LIBRARY_FILL = "#e8e8e8"
KERNEL_FILL, KERNEL_BORDER = "#f3f7fd", "#3d6aa8"
LOADER_FILL = "#dbe8fb"
LOOP_FILL, LOOP_BORDER = "#e6f4e3", "#4f8a43"
INVARIANT_FILL, INVARIANT_BORDER = "#f1f1f1", "#8a8a8a"
EPILOGUE_FILL, EPILOGUE_BORDER = "#fdf0e2", "#c07a2c"
ACCUM_FILL = "#ffd9a8"
SAVER_FILL = "#f9d6d6"
THREAD_BORDER = "#7a4fa0"
OP_FILL = "#ffffff"
NOTE_COLOUR = "#555555"
POSITION_COLOUR = "#1f4e8c"


# --- text helpers ---------------------------------------------------------------------------

def _dims(dims: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


def _html(title: str, *lines: str, size: int = 9, left: bool = False) -> str:
    """An HTML-like label: a bold first line, then smaller lines (text is escaped here);
    ``left`` left-aligns every line (cluster titles)."""
    parts = [f"<b>{escape(title, quote=False)}</b>"]
    parts += [f'<font point-size="{size}">{escape(s, quote=False)}</font>' for s in lines if s]
    if left:
        return "<" + "".join(p + '<br align="left"/>' for p in parts) + ">"
    return "<" + "<br/>".join(parts) + ">"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _param_text(op: str, params: dict[str, Any]) -> str:
    """Non-tensor parameters of an operator, for its label (kernel internals left out)."""
    shown = []
    for k, v in params.items():
        if op == "customized" or k in ("position", "input_map", "forloop_dim", "acc"):
            continue
        if k == "normalized_shape":
            v = _dims(v) if isinstance(v, tuple) else v
        shown.append(f"{k}={v}")
    return " ".join(shown)


def _position(pos: int) -> str:
    """Edge attributes numbering an operand (1, 2) at the consumer's end."""
    return f"headlabel=\"{pos + 1}\", labeldistance=1.4, labelfontcolor={_q(POSITION_COLOUR)}"


def _ordered(op: str) -> bool:
    """Whether the edges into ``op`` need operand numbers."""
    spec = lookup(op)
    return spec.num_inputs[1] >= 2 and not spec.commutative


# --- one graph-defined kernel ---------------------------------------------------------------

def _sides(tb: ThreadBlockGraph) -> dict[str, list[BlockTensor]]:
    out: dict[str, list[BlockTensor]] = {LOOP_SIDE: [], INVARIANT: [], EPILOGUE: []}
    for t in tb.tensors:
        out[t.side].append(t)
    return out


def _tile_node(k: int, t: BlockTensor) -> str:
    nid = f"k{k}_b{t.index}"
    dashed = t.side == INVARIANT
    if t.op == "input":
        imap, fdim = t.params["input_map"], t.params["forloop_dim"]
        label = _html(f"b{t.index} load input {t.params['position']}",
                      f"imap={_dims(imap)}, forloop_dim={fdim}", f"tile {_dims(t.dims)}")
        fill, shape, extra = LOADER_FILL, "box", ""
    elif t.op in ACCUMULATOR_OPS:
        acc = t.params["acc"]
        rescaled = f", rescaled by b{t.operands[1].index}" if len(t.operands) > 1 else ""
        label = _html(f"b{t.index} accum {acc}{rescaled}", f"tile {_dims(t.dims)}")
        fill, shape, extra = ACCUM_FILL, "box", ", peripheries=2"
    elif t.op == "forloop_max":
        label = _html(f"b{t.index} running max", f"tile {_dims(t.dims)}")
        fill, shape, extra = OP_FILL, "box", ""
    else:
        ps = _param_text(t.op, t.params)
        label = _html(f"b{t.index} {t.op}" + (f" {ps}" if ps else ""), f"tile {_dims(t.dims)}")
        fill, shape, extra = OP_FILL, "box", ""
    if dashed:
        fill = INVARIANT_FILL if t.op != "input" else LOADER_FILL
    style = "rounded,filled,dashed" if dashed else "rounded,filled"
    return (f"{nid} [label={label}, shape={shape}, style={_q(style)}, fillcolor={_q(fill)}"
            f"{extra}];")


def _thread_segments(tb: ThreadBlockGraph) -> dict[str, list[tuple[str, list[BlockTensor]]]]:
    """The thread chains cut where they change side, grouped by side, with their frame titles."""
    out: dict[str, list[tuple[str, list[BlockTensor]]]] = {LOOP_SIDE: [], INVARIANT: [],
                                                           EPILOGUE: []}
    for chain in tb.thread_chains():
        segs: list[list[BlockTensor]] = []
        for t in chain:
            if not segs or segs[-1][-1].side != t.side:
                segs.append([])
            segs[-1].append(t)
        for i, seg in enumerate(segs):
            title = "thread graph" + (f", part {i + 1} of {len(segs)}" if len(segs) > 1 else "")
            out[seg[0].side].append((title, seg))
    return out


def _side_cluster(k: int, name: str, label: str, style: str, fill: str, border: str,
                  tiles: list[BlockTensor], segments: list[tuple[str, list[BlockTensor]]],
                  indent: str) -> list[str]:
    if not tiles:
        return []
    out = [f"{indent}subgraph cluster_k{k}_{name} {{",
           (f"{indent}  label={label}; labeljust=l; style={_q(style)}; fillcolor={_q(fill)};"
           f" color={_q(border)}; penwidth=1.4; margin=10; fontsize=11;")]
    in_segment = {t.index for _, seg in segments for t in seg}
    for i, (title, seg) in enumerate(segments):
        out.append(f"{indent}  subgraph cluster_k{k}_{name}_thread{i} {{")
        out.append(f"{indent}    label={_html(title, size=8)}; labeljust=r;"
                   f" style=\"dotted,rounded\"; color={_q(THREAD_BORDER)}; penwidth=1.8;"
                   f" fontcolor={_q(THREAD_BORDER)}; margin=6; fontsize=9;")
        out += [f"{indent}    {_tile_node(k, t)}" for t in seg]
        out.append(f"{indent}  }}")
    out += [f"{indent}  {_tile_node(k, t)}" for t in tiles if t.index not in in_segment]
    out.append(f"{indent}}}")
    return out


def _kernel_cluster(k: int, tb: ThreadBlockGraph, outs: list[Any]) -> list[str]:
    """The frame of kernel ``k`` with its thread-block graph; ``outs`` are its output tensors."""
    uses_dimx = any(t.op == "forloop_accum" and t.params["acc"] == "sum_todimx"
                    for t in tb.tensors)
    line2 = f"grid_dim={_dims(tb.grid_dim)}, block_dim={_dims(tb.block_dim)}"
    line3 = f"forloop_range={tb.forloop_range}"
    if uses_dimx:
        line3 += f", reduction_dimx={tb.reduction_dimx}"
    line4 = f"shared memory {tb.smem_usage():,} of {tb.smem_bytes:,} bytes"
    produced = ", ".join(f"t{t.index}" for t in outs)
    title = f"kernel k{k}: graph-defined" + (f" → {produced}" if produced else "")
    out = [f"  subgraph cluster_k{k} {{",
           (f"    label={_html(title, line2, line3, line4, size=10, left=True)}; labeljust=l;"
           f" style=\"filled,rounded\"; fillcolor={_q(KERNEL_FILL)}; color={_q(KERNEL_BORDER)};"
           f" penwidth=2; margin=12; fontsize=12;")]
    sides, segs = _sides(tb), _thread_segments(tb)
    f = tb.forloop_range
    out += _side_cluster(
        k, "invariant", _html("loop-invariant", "same tile every iteration", size=8, left=True),
        "filled,rounded,dashed", INVARIANT_FILL, INVARIANT_BORDER,
        sides[INVARIANT], segs[INVARIANT], "    ")
    out += _side_cluster(
        k, "loop", _html(f"for i in range({f}):", "loop body, every iteration", size=8, left=True),
        "filled,rounded", LOOP_FILL, LOOP_BORDER, sides[LOOP_SIDE], segs[LOOP_SIDE], "    ")
    out += _side_cluster(
        k, "epilogue", _html("epilogue", "once, after the loop", size=8, left=True),
        "filled,rounded", EPILOGUE_FILL, EPILOGUE_BORDER, sides[EPILOGUE], segs[EPILOGUE], "    ")
    for i, (t, omap) in enumerate(tb.outputs):
        label = _html(f"save output {i}", f"omap={_dims(omap)}",
                      f"dims {_dims(tb.output_dims(i))}")
        out.append(f"    k{k}_s{i} [label={label}, fillcolor={_q(SAVER_FILL)}];")
    out.append("  }")
    # loaders on one row, accumulators on one row, savers on one row
    for group in ([t for t in tb.inputs], [t for t in tb.tensors if t.op in ACCUMULATOR_OPS]):
        if len(group) > 1:
            out.append("  {rank=same; " + " ".join(f"k{k}_b{t.index};" for t in group) + "}")
    if len(tb.outputs) > 1:
        out.append("  {rank=same; " + " ".join(f"k{k}_s{i};" for i in range(len(tb.outputs)))
                   + "}")
    # edges inside the block graph
    for t in tb.tensors:
        numbered = len(t.operands) > 1 and t.op not in BUILDER_OPS and _ordered(t.op)
        for pos, o in enumerate(t.operands):
            attrs = [_position(pos)] if numbered else []
            if t.op in ACCUMULATOR_OPS:
                attrs.append(f"color={_q(EPILOGUE_BORDER)}")
            if t.op == "forloop_accum_rescale" and pos == 1:
                attrs += ['label="rescale"', 'style="dashed"', "fontsize=8"]
            out.append(f"  k{k}_b{o.index} -> k{k}_b{t.index}"
                       + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
    for i, (t, _) in enumerate(tb.outputs):
        out.append(f"  k{k}_b{t.index} -> k{k}_s{i};")
    return out


# --- the whole graph ------------------------------------------------------------------------

def mugraph_dot(g: Any) -> str:
    """Graphviz DOT text of kernel graph / μGraph ``g`` (see the module docstring)."""
    from ..graph import KernelGraph

    if not isinstance(g, KernelGraph):
        raise GraphError(f"mugraph_dot: expected a KernelGraph, got {type(g).__name__}")
    outputs = {t.index for t in g.outputs}
    inputs = {t.index for t in g.inputs}
    n_kernels = 0
    kernel_ids: dict[int, int] = {}  # id(GraphDefinedKernel) -> k, numbered by first use
    kernel_objs: list[Any] = []
    kernel_outs: list[list[Any]] = []
    kernel_ins: list[tuple[Any, ...]] = []
    for t in g.operators:
        if t.op != "customized":
            continue
        kern = t.params["kernel"]
        if id(kern) not in kernel_ids:
            kernel_ids[id(kern)] = n_kernels
            kernel_objs.append(kern)
            kernel_outs.append([None] * kern.num_outputs)
            kernel_ins.append(t.operands)
            n_kernels += 1
        kernel_outs[kernel_ids[id(kern)]][t.params["output"]] = t

    n_lib = sum(1 for t in g.operators if t.op != "customized")
    what = "μGraph" if n_kernels else "kernel graph"
    title = (f"{what}: {len(g.inputs)} inputs, {n_kernels} graph-defined kernel"
             f"{'s' if n_kernels != 1 else ''}, {n_lib} library operator"
             f"{'s' if n_lib != 1 else ''}")
    out = ["digraph mugraph {",
           "  compound=true; newrank=true; rankdir=TB; nodesep=0.25; ranksep=0.35;",
           f"  graph [fontname={_q(_FONT)}, fontsize=11, labelloc=t, label={_q(title)}];",
           (f"  node [shape=box, style=\"rounded,filled\", fillcolor=white, fontname={_q(_FONT)},"
            " fontsize=10, height=0.3, margin=\"0.08,0.04\"];"),
           (f"  edge [arrowsize=0.6, color=\"#555555\", fontname={_q(_FONT)}, fontsize=8,"
            f" fontcolor={_q(NOTE_COLOUR)}];")]
    # device tensors
    for t in g.tensors:
        what = " (input)" if t.index in inputs else ""
        what += " (output)" if t.index in outputs else ""
        fill = INPUT_FILL if t.index in inputs else TENSOR_FILL
        bold = ", penwidth=2.5" if t.index in outputs else ""
        label = _html(f"t{t.index}{what}", _dims(t.dims), t.dtype.value)
        out.append(f"  t{t.index} [label={label}, shape=cylinder, style=filled,"
                   f" fillcolor={_q(fill)}{bold}];")
    if len(g.inputs) > 1:  # graph inputs on the top row, in order
        out.append("  {rank=min; " + " -> ".join(f"t{t.index}" for t in g.inputs)
                   + " [style=invis];}")
    # library operators
    for t in g.operators:
        if t.op == "customized":
            continue
        ps = _param_text(t.op, t.params)
        out.append(f"  op{t.index} [label={_html(t.op, ps, size=9)},"
                   f" fillcolor={_q(LIBRARY_FILL)}, style=filled];")
        numbered = len(t.operands) > 1 and _ordered(t.op)
        for pos, o in enumerate(t.operands):
            attr = f" [{_position(pos)}]" if numbered else ""
            out.append(f"  t{o.index} -> op{t.index}{attr};")
        out.append(f"  op{t.index} -> t{t.index};")
    # graph-defined kernels
    for k, kern in enumerate(kernel_objs):
        tb = kern.tb
        outs = [t for t in kernel_outs[k] if t is not None]
        out += _kernel_cluster(k, tb, outs)
        for loader in tb.inputs:
            src = kernel_ins[k][loader.params["position"]]
            label = (f"imap={_dims(loader.params['input_map'])}\\n"
                     f"forloop_dim={loader.params['forloop_dim']}")
            out.append(f"  t{src.index} -> k{k}_b{loader.index} [label=\"{label}\"];")
        for i, (_, omap) in enumerate(tb.outputs):
            dst = kernel_outs[k][i]
            if dst is not None:
                out.append(f"  k{k}_s{i} -> t{dst.index} [label=\"omap={_dims(omap)}\"];")
    out.append("}")
    return "\n".join(out) + "\n"


def mugraph_svg(g: Any, path: str | Path | None = None) -> str:
    """SVG text of ``mugraph_dot(g)``; also written (atomically) to ``path`` if given."""
    svg = svg_of_dot(mugraph_dot(g))
    if path is not None:
        write_atomic(path, svg)
    return svg
