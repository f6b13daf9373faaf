"""``compile``: a μGraph as a callable on torch tensors, through its generated Triton program.

The program is written to a cache folder (Triton reads kernel sources from files) and imported.
Without a CUDA device the kernels run in Triton's interpreter, which must be switched on before
they are decorated: ``compile`` then sets ``TRITON_INTERPRET=1`` for the process (as one would in a
shell), and stays so; Triton's library functions (``tl.sum``, ...) decorated before that are made
interpreted too (``use_interpreter``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..dtypes import DType
from ..errors import DTypeError, LowerError, ShapeError
from ..files import write_atomic
from ..graph import KernelGraph
from .triton_program import generate_source, options_from

#: where generated programs are written before import (one file per distinct source)
CACHE_DIR = Path(tempfile.gettempdir()) / "egraph_mirage_triton"


def use_interpreter() -> None:
    """Switch Triton's interpreter on for kernels decorated from now on, and for Triton's own
    library functions (``interpret_triton_language``)."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        knobs.runtime.interpret = True
    interpret_triton_language()


def interpret_triton_language() -> None:
    """Make Triton's library functions written in Triton (``tl.sum``, ``tl.max``, ...)
    interpreted. They are decorated when ``triton.language`` is imported: compiled-only where
    the interpreter was off by then (``torch._dynamo`` imports ``triton`` before any backend
    runs), and an interpreted kernel cannot call them ("Cannot call @triton.jit'd outside of the
    scope of a kernel"). Each such ``JITFunction`` of the ``triton.language`` modules and of
    ``tl.tensor`` is replaced by an ``InterpretedFunction`` of the same Python function; those
    already interpreted are left as they are, so a second call changes nothing."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    owners = [m for name, m in list(sys.modules.items())
              if name.startswith("triton.language") and m is not None]
    made: dict[int, Any] = {}
    for owner in [*owners, tl.tensor]:
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                if id(value) not in made:
                    made[id(value)] = InterpretedFunction(value.fn)
                setattr(owner, name, made[id(value)])


#: programs already imported in this process (same source: same module, so Triton's compiled
#: kernels are reused); a cache only, keyed by the source's hash
_LOADED: dict[str, tuple[ModuleType, Path]] = {}


def _import(source: str, interpret: bool) -> tuple[ModuleType, Path]:
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    if digest in _LOADED:
        return _LOADED[digest]
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    path = CACHE_DIR / f"program_{digest}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != source:
        write_atomic(path, source)
    name = f"egraph_mirage_program_{digest}_{'interp' if interpret else 'gpu'}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _LOADED[digest] = (module, path)
    return module, path


class CompiledGraph:
    """A lowered μGraph: call it with torch tensors (one per graph input, of the graph's dims and
    dtypes); it returns the list of outputs, always a list (like ``evaluate`` and
    ``run_reference``). ``source`` is the generated program, ``path`` its file."""

    def __init__(self, graph: KernelGraph, module: ModuleType, source: str, path: Path,
                 interpret: bool, input_strides: Sequence[tuple[int, ...] | None] = (),
                 writes: int = 0) -> None:
        import torch

        #: outputs also written into destinations (``LowerOptions.writes``): after the inputs,
        #: a call passes each write's destination and index tensor, which go in as they are
        self.writes = writes
        self.inputs = [(t.dims, t.dtype) for t in graph.inputs]
        #: per input, the strides the program reads it with (None: row-major)
        self.strides = list(input_strides) or [None] * len(graph.inputs)
        self.module, self.source, self.path, self.interpret = module, source, path, interpret
        self._expected = [(torch.Size(dims), getattr(torch, dtype.value))
                          for dims, dtype in self.inputs]

    def __call__(self, *inputs: Any, **launch: int) -> list[Any]:
        """``launch``: ``num_warps`` / ``num_stages`` overriding the compiled defaults."""
        xs = self._checked(inputs)
        try:
            if self.interpret:
                import numpy as np

                with np.errstate(all="ignore"):  # padding may divide 0 by 0; it is never stored
                    return self.module.launch(*xs, **launch)
            return self.module.launch(*xs, **launch)
        except Exception as e:
            if type(e).__module__.split(".")[0] != "triton":
                raise
            raise LowerError(f"Triton failed on the program {self.path}: {type(e).__name__}: "
                             f"{str(e)[:2000]}") from e

    def _checked(self, inputs: Sequence[Any]) -> list[Any]:
        """The inputs, contiguous (or with the strides the program reads them with), after
        typed checks of their number, types, shapes, dtypes."""
        import torch

        n = len(self._expected)
        if len(inputs) != n + 2 * self.writes:
            raise ShapeError(f"compiled μGraph: takes {n} inputs"
                             + (f" and {self.writes} destination and index pairs"
                                if self.writes else "") + f", got {len(inputs)}")
        for k, x in enumerate(inputs[n:]):
            if not isinstance(x, torch.Tensor) or (k % 2 and x.is_floating_point()):
                raise DTypeError(f"compiled μGraph: write {k // 2}'s "
                                 + ("index" if k % 2 else "destination")
                                 + f" is {getattr(x, 'dtype', type(x).__name__)}, not an "
                                 + ("integer tensor" if k % 2 else "torch.Tensor"))
        xs = []
        for k, (x, (shape, dtype)) in enumerate(zip(inputs[:n], self._expected)):
            if not isinstance(x, torch.Tensor):
                raise DTypeError(f"compiled μGraph: input {k} is {type(x).__name__}, not a "
                                 "torch.Tensor")
            if x.shape != shape:
                raise ShapeError(f"compiled μGraph: input {k} has shape {tuple(x.shape)}, "
                                 f"expected {tuple(shape)}")
            if x.dtype != dtype:
                raise DTypeError(f"compiled μGraph: input {k} is {x.dtype}, expected {dtype}")
            xs.append(laid_out(x, self.strides[k]))
        return xs + list(inputs[n:])


def laid_out(x: Any, strides: Sequence[int] | None) -> Any:
    """Torch tensor ``x`` as a program reads it: contiguous (``strides`` None), or with
    ``strides`` (``LowerOptions.input_strides``), copied only where it has other strides."""
    import torch

    if strides is None:
        return x if x.is_contiguous() else x.contiguous()
    if tuple(x.stride()) == tuple(strides):
        return x
    return torch.empty_strided(x.shape, tuple(strides), dtype=x.dtype,
                               device=x.device).copy_(x)


def compile_graph(graph: KernelGraph, *, interpret: bool | None = None,
                  **options: Any) -> CompiledGraph:
    """Lower ``graph`` and load it. ``options`` are ``LowerOptions`` fields (``num_warps``,
    ``num_stages``, ``fp32_dots``, ``fp32_precision``, ``fuse_combines``, ``swap_dots``,
    ``pdl``, ``input_strides``: inputs read in place through a view, a transposed weight;
    ``writes``: outputs also stored into destinations the call passes after the inputs).
    ``interpret``: run in Triton's interpreter (default: when ``TRITON_INTERPRET=1`` or no CUDA
    device). ``fp32_dots`` defaults to True for bfloat16 graphs in the interpreter, whose bf16
    ``tl.dot`` is wrong."""
    import torch

    if interpret is None:
        interpret = os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()
    if interpret:
        use_interpreter()
    if options.get("fp32_dots") is None:
        options["fp32_dots"] = interpret and _has(graph, DType.bfloat16)
    lowering = options_from(options)
    source = generate_source(graph, lowering)
    module, path = _import(source, interpret)
    return CompiledGraph(graph, module, source, path, interpret, lowering.input_strides,
                         len(lowering.writes))


def _has(graph: KernelGraph, dtype: DType) -> bool:
    return any(t.dtype == dtype for t in graph.tensors)


def compile_source(source: str, interpret: bool) -> ModuleType:
    """Import a generated program's source (as ``compile_graph`` does)."""
    if interpret:
        use_interpreter()
    return _import(source, interpret)[0]


__all__: Sequence[str] = ["CompiledGraph", "compile_graph", "compile_source",
                          "interpret_triton_language", "use_interpreter"]
