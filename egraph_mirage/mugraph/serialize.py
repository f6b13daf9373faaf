"""Versioned JSON files of μGraphs (``g.save(path)``, ``g.to_json()``, ``em.load``, ``em.loads``).

A file keeps only what the public builders need and loading rebuilds through them, so every check
runs again. Version 1 is one JSON object, keys sorted: format, version, inputs [{dims, dtype}],
kernels [{grid_dim, block_dim, forloop_range, reduction_dimx, smem_bytes, ops [{op, operands,
params}], outputs [{tensor, output_map}]}], operators [{op, operands, params}] and outputs. Tensors
are numbered inputs first, then operators; block tensors as in ``tb.tensors``. A customized op has
params {kernel, output}; a kernel's outputs are consecutive operators 0, 1, ... (one customized
call). A loader (op "input") reads the operand of its position; accumulator "plain" is acc=None.
Online softmax: op "forloop_max" (one operand, no params) is ``tb.forloop_max``; op
"forloop_accum_rescale" (operands [x, m], params {acc}) is ``tb.forloop_accum(x, acc, rescale=m)``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import reprlib
from collections.abc import Iterable, Iterator
from typing import Any, NoReturn

from ..dtypes import DType
from ..errors import EMError, SerializationError
from ..files import write_atomic
from ..graph import KernelGraph, Tensor, new_kernel_graph
from ..ops import BLOCK, lookup
from .threadblock import ThreadBlockGraph, new_threadblock_graph

FORMAT = "egraph-mirage/mugraph"
VERSION = 1
_TOP = {"format", "version", "inputs", "kernels", "operators", "outputs"}
_KERN = ("grid_dim", "block_dim", "forloop_range", "reduction_dimx", "smem_bytes", "ops", "outputs")
_OP = {"op", "operands", "params"}
#: what a builder may raise on bad content; wrapped into SerializationError with the location
_BUILD_ERRORS = (EMError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError,
                 RecursionError)
_FLAT = re.compile(r"\[\n[^\[\]{}\"]*\]")  # a number list spread over lines (not in a string)


def dumps(graph: KernelGraph) -> str:
    """The version-1 JSON text of ``graph`` (deterministic: the same graph gives the same text)."""
    if not isinstance(graph, KernelGraph):
        raise SerializationError(f"expected a KernelGraph, got {type(graph).__name__}")
    number = {t.index: i for i, t in enumerate(graph.inputs)}
    kernels: list[dict[str, Any]] = []
    operators: list[dict[str, Any]] = []
    kernel_no: dict[int, int] = {}  # id(GraphDefinedKernel) -> its place in "kernels"
    due: tuple[Any, ...] | None = None  # (kernel, output, operands) the next operator must be
    for j, t in enumerate(graph.operators):
        number[t.index] = len(number)
        params = dict(t.params)
        kernel, out = params.get("kernel"), params.get("output")
        if t.op == "customized" and due is None and out == 0 and id(kernel) not in kernel_no:
            kernel_no[id(kernel)] = len(kernels)
            kernels.append(_dump_kernel(kernel.tb))
        elif (t.op == "customized" or due is not None) and due != (kernel, out, t.operands):
            raise SerializationError(f"operators[{j}]: the outputs of a kernel must be "
                                     "consecutive operators 0, 1, ... (one g.customized call)")
        if t.op == "customized":
            due = (kernel, out + 1, t.operands) if out + 1 < kernel.num_outputs else None
            params = {"kernel": kernel_no[id(kernel)], "output": out}
        operators.append({"op": t.op, "operands": [number[o.index] for o in t.operands],
                          "params": params})
    if due is not None:
        raise SerializationError("operators: the last kernel's outputs are incomplete")
    doc = {"format": FORMAT, "version": VERSION,
           "inputs": [{"dims": list(t.dims), "dtype": t.dtype.value} for t in graph.inputs],
           "kernels": kernels, "operators": operators,
           "outputs": [number[t.index] for t in graph.outputs]}
    try:
        text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False, default=_unencodable)
    except ValueError as e:
        raise SerializationError(f"cannot write the graph as JSON: {e}") from e
    return _FLAT.sub(lambda m: json.dumps(json.loads(m.group())), text)


def _unencodable(value: Any) -> NoReturn:
    raise SerializationError(f"cannot write a parameter of type {type(value).__name__}: {value!r}")


def _dump_kernel(tb: ThreadBlockGraph) -> dict[str, Any]:
    ops = [{"op": t.op, "operands": [o.index for o in t.operands],  # a loader's position: implied
            "params": {k: v for k, v in t.params.items() if (t.op, k) != ("input", "position")}}
           for t in tb.tensors]
    return {"grid_dim": list(tb.grid_dim), "block_dim": list(tb.block_dim),
            "forloop_range": tb.forloop_range, "reduction_dimx": tb.reduction_dimx,
            "smem_bytes": tb.smem_bytes, "ops": ops,
            "outputs": [{"tensor": t.index, "output_map": list(omap)} for t, omap in tb.outputs]}


def kernel_text(kernel: Any) -> str:
    """A graph-defined kernel's block graph as JSON text: two kernels with one text compute
    alike."""
    return json.dumps(_dump_kernel(kernel.tb), sort_keys=True, allow_nan=False,
                      default=_unencodable)


def save(graph: KernelGraph, path: str | os.PathLike[str]) -> None:
    """Write ``graph`` to ``path`` atomically (a temporary file in the same folder, then rename)."""
    write_atomic(path, dumps(graph) + "\n")


def load(path: str | os.PathLike[str]) -> KernelGraph:
    """Read a μGraph file written by ``save``; every error is a ``SerializationError`` naming
    ``path`` (a missing file, a folder, an unreadable or malformed file)."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise SerializationError(f"load: expected a path, got {type(path).__name__}") from None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise SerializationError(f"{path}: not a μGraph file (not UTF-8 text: {e})") from None
    except FileNotFoundError:
        raise SerializationError(f"{path}: no such μGraph file") from None
    except IsADirectoryError:
        raise SerializationError(f"{path}: is a folder, not a μGraph file") from None
    except (OSError, ValueError) as e:  # permissions, a NUL in the name, ...
        raise SerializationError(f"{path}: cannot read the μGraph file "
                                 f"({type(e).__name__}: {e})") from None
    return _Reader(path).read(text)


def loads(text: str) -> KernelGraph:
    """Rebuild a μGraph from the text that ``KernelGraph.to_json`` (``dumps``) made."""
    return _Reader(None).read(text)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) < len(pairs):
        raise ValueError(f"duplicate keys in an object with keys {[k for k, _ in pairs]}")
    return dict(pairs)


def _no_constant(name: str) -> NoReturn:  # NaN, Infinity: Python's json accepts them, JSON not
    raise ValueError(f"{name} is not a number JSON allows")


def _tuples(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


class _Reader:
    """Checks and rebuilds one document; every error names the file (if any) and the entry."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.kernels: list[Any] = []

    def fail(self, where: str, message: str) -> NoReturn:
        prefix = "" if self.path is None else f"{self.path}: "
        raise SerializationError(f"{prefix}{where}: {message}")

    @contextlib.contextmanager
    def at(self, where: str) -> Iterator[None]:
        """Errors of the builders inside become SerializationErrors naming ``where``."""
        try:
            yield
        except SerializationError:
            raise
        except _BUILD_ERRORS as e:
            self.fail(where, f"{type(e).__name__}: {e}")

    def typed(self, v: Any, where: str, kind: type, what: str) -> Any:
        if not isinstance(v, kind) or isinstance(v, bool):
            self.fail(where, f"expected {what}, got {reprlib.repr(v)}")
        return v

    def as_obj(self, v: Any, where: str, keys: set[str]) -> dict[str, Any]:
        if set(self.typed(v, where, dict, "a JSON object")) != keys:
            self.fail(where, f"expected keys {sorted(keys)}; missing {sorted(keys - set(v))}, "
                      f"unexpected {sorted(set(v) - keys)}")
        return v

    def as_int(self, v: Any, where: str, lo: float = float("-inf")) -> int:
        if self.typed(v, where, int, "an integer") < lo:
            self.fail(where, f"expected an integer >= {lo}, got {v}")
        return v

    def as_ints(self, v: Any, where: str) -> tuple[int, ...]:
        return tuple(self.as_int(x, f"{where}[{i}]")
                     for i, x in enumerate(self.typed(v, where, list, "a JSON list")))

    def pick(self, items: list[Any], v: Any, where: str) -> Any:
        if not 0 <= self.as_int(v, where) < len(items):
            self.fail(where, f"tensor {v} does not exist (there are {len(items)} before it)")
        return items[v]

    def entry(self, v: Any, where: str, tensors: list[Any]) -> tuple[str, list[int], list[Any]]:
        e = self.as_obj(v, where, _OP)
        raw = list(self.as_ints(e["operands"], f"{where}.operands"))
        return (self.typed(e["op"], f"{where}.op", str, "a string"), raw,
                [self.pick(tensors, x, f"{where}.operands[{i}]") for i, x in enumerate(raw)])

    def params(self, v: Any, where: str, keys: Iterable[str],
               optional: Iterable[str] = ()) -> dict[str, Any]:
        given = set(v["params"]) if isinstance(v["params"], dict) else set()
        p = self.as_obj(v["params"], f"{where}.params", set(keys) | (given & set(optional)))
        return {k: _tuples(x) for k, x in p.items()}

    def read(self, text: str) -> KernelGraph:
        self.typed(text, "text", str, "JSON text (a str)")
        try:
            doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            self.fail("file", f"not valid JSON (corrupt or truncated?): {e}")
        found = doc.get("format") if isinstance(doc, dict) else None
        if found != FORMAT:
            self.fail("format", f"not a μGraph file: expected a JSON object with \"format\": "
                      f"\"{FORMAT}\", found {found!r}")
        if type(doc.get("version")) is not int or doc["version"] != VERSION:
            self.fail("version", f"unsupported version {doc.get('version')!r}; this reader "
                      f"knows version {VERSION}")
        self.as_obj(doc, "file", _TOP)
        self.kernels = self.typed(doc["kernels"], "kernels", list, "a JSON list")
        g = new_kernel_graph()
        for i, v in enumerate(self.typed(doc["inputs"], "inputs", list, "a JSON list")):
            w = f"inputs[{i}]"
            spec = self.as_obj(v, w, {"dims", "dtype"})
            if self.typed(spec["dtype"], f"{w}.dtype", str, "a string") not in DType.__members__:
                self.fail(f"{w}.dtype", f"unknown dtype {spec['dtype']!r}; "
                          f"known: {list(DType.__members__)}")
            with self.at(w):
                g.new_input(self.as_ints(spec["dims"], f"{w}.dims"), DType[spec["dtype"]])
        self.operators(g, self.typed(doc["operators"], "operators", list, "a JSON list"))
        for i, v in enumerate(self.typed(doc["outputs"], "outputs", list, "a JSON list")):
            with self.at(f"outputs[{i}]"):
                g.mark_output(self.pick(g.tensors, v, f"outputs[{i}]"))
        return g

    def operators(self, g: KernelGraph, entries: list[Any]) -> None:
        used: dict[int, int] = {}  # kernel -> the operator that built it
        due: list[tuple[int, int, list[int]]] = []  # (kernel, output, operands) still to come
        for j, v in enumerate(entries):
            w = f"operators[{j}]"
            op, raw, args = self.entry(v, w, g.tensors)
            if op != "customized":
                if due:
                    self.fail(w, f"expected output {due[0][1]} of kernel {due[0][0]}")
                with self.at(w):
                    g.apply(op, args, **self.params(v, w, lookup(op).params,
                                                      lookup(op).optional_names))
                continue
            p = self.as_obj(v["params"], f"{w}.params", {"kernel", "output"})
            k = self.as_int(p["kernel"], f"{w}.params.kernel", 0)
            out = self.as_int(p["output"], f"{w}.params.output", 0)
            if due:
                if (k, out, raw) != due.pop(0):
                    self.fail(w, "expected the next output of the kernel before it, with the "
                              "same operands (a kernel's outputs are consecutive operators)")
                continue
            problem = (f"kernel {k} does not exist (the file has {len(self.kernels)})"
                       if k >= len(self.kernels) else f"kernel {k} was already used by "
                       f"operators[{used[k]}]" if k in used else f"the first use of kernel {k} "
                       f"must be its output 0, not output {out}" if out else "")
            if problem:
                self.fail(w, problem)
            used[k] = j
            tb = self.kernel(k, args)
            with self.at(f"{w} (kernels[{k}])"):
                g.customized(args, tb)
            due = [(k, i, raw) for i in range(1, len(tb.outputs))]
        if due:
            self.fail("operators", f"missing output {due[0][1]} of kernel {due[0][0]}")
        for k in sorted(set(range(len(self.kernels))) - set(used))[:1]:
            self.fail(f"kernels[{k}]", "not used by any operator")

    def kernel(self, k: int, sources: list[Tensor]) -> ThreadBlockGraph:
        w = f"kernels[{k}]"
        d = self.as_obj(self.kernels[k], w, set(_KERN))
        with self.at(w):
            tb = new_threadblock_graph(*(self.as_ints(d[n], f"{w}.{n}") for n in _KERN[:2]),
                                       *(self.as_int(d[n], f"{w}.{n}") for n in _KERN[2:4]),
                                       self.as_int(d["smem_bytes"], f"{w}.smem_bytes", 1))
        for i, v in enumerate(self.typed(d["ops"], f"{w}.ops", list, "a JSON list")):
            wi = f"{w}.ops[{i}]"
            op, _, args = self.entry(v, wi, tb.tensors)
            with self.at(wi):
                if op == "input":
                    p = self.as_obj(v["params"], f"{wi}.params", {"input_map", "forloop_dim"})
                    n = len(tb.inputs)
                    if args or n >= len(sources):
                        self.fail(wi, f"loader #{n} takes no operands and reads operand {n} of "
                                  f"the customized operator, which has {len(sources)}")
                    tb.new_input(sources[n], self.as_ints(p["input_map"], f"{wi}.params.input_map"),
                                 self.as_int(p["forloop_dim"], f"{wi}.params.forloop_dim"))
                elif op in ("forloop_accum", "forloop_accum_rescale"):
                    acc = self.typed(self.params(v, wi, ("acc",))["acc"], f"{wi}.params.acc",
                                     str, "an accumulator name")
                    want = 1 if op == "forloop_accum" else 2
                    if len(args) != want:
                        self.fail(wi, f"{op} takes {want} operand(s), got {len(args)}")
                    tb.forloop_accum(args[0], None if acc == "plain" else acc,
                                     rescale=args[1] if want == 2 else None)
                elif op == "forloop_max":
                    self.params(v, wi, ())
                    if len(args) != 1:
                        self.fail(wi, f"forloop_max takes 1 operand, got {len(args)}")
                    tb.forloop_max(args[0])
                else:
                    if BLOCK not in lookup(op).levels:
                        self.fail(f"{wi}.op", f"{op} is not allowed in a thread-block graph")
                    tb.apply(op, args, **self.params(v, wi, lookup(op).params,
                                                       lookup(op).optional_names))
        for i, v in enumerate(self.typed(d["outputs"], f"{w}.outputs", list, "a JSON list")):
            wi = f"{w}.outputs[{i}]"
            o = self.as_obj(v, wi, {"tensor", "output_map"})
            with self.at(wi):
                tb.new_output(self.pick(tb.tensors, o["tensor"], f"{wi}.tensor"),
                              self.as_ints(o["output_map"], f"{wi}.output_map"))
        return tb
