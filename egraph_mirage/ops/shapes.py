"""Shape and dtype rules shared by several op-table entries."""

from __future__ import annotations

from collections.abc import Sequence

from ..dtypes import DType
from ..errors import DTypeError, ShapeError
from .spec import Params, Shape


def fmt(shapes: Sequence[Shape]) -> str:
    return " and ".join(str(tuple(s)) for s in shapes)


def same_dtype(op: str, dtypes: Sequence[DType], params: Params) -> DType:
    """All operands share one dtype, which the result keeps."""
    for d in dtypes:
        if not isinstance(d, DType):
            raise DTypeError(
                f"{op}: unsupported dtype {d!r}; use em.float16, em.bfloat16, em.float32")
    if len(set(dtypes)) > 1:
        names = ", ".join(d.value for d in dtypes)
        raise DTypeError(f"{op}: operands have different dtypes {names}")
    return dtypes[0]


def same_shape(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """Unary element-wise operators keep the shape."""
    return tuple(shapes[0])


def broadcast(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """Binary element-wise operators: same rank, each dimension equal or 1 on one side."""
    a, b = shapes
    if len(a) != len(b):
        raise ShapeError(f"{op}: operands of shapes {fmt(shapes)} have different ranks")
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and x != 1 and y != 1:
            raise ShapeError(
                f"{op}: shapes {fmt(shapes)} do not broadcast in dimension {i} ({x} vs {y})"
            )
        out.append(max(x, y))
    return tuple(out)


def matmul(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """``(..., m, k) @ (..., k, n) -> (..., m, n)``; leading dimensions equal or 1."""
    a, b = shapes
    if len(a) < 2 or len(b) < 2:
        raise ShapeError(f"{op}: operands of shapes {fmt(shapes)} need at least 2 dimensions")
    if len(a) != len(b):
        raise ShapeError(f"{op}: operands of shapes {fmt(shapes)} have different ranks")
    if a[-1] != b[-2]:
        raise ShapeError(
            f"{op}: contraction sizes differ for shapes {fmt(shapes)} ({a[-1]} vs {b[-2]})"
        )
    lead = broadcast(op, [a[:-2], b[:-2]], params) if len(a) > 2 else ()
    return (*lead, a[-2], b[-1])


def normalize_dim(op: str, shape: Shape, dim: object) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ShapeError(f"{op}: dim must be an integer, got {dim!r}")
    if not -len(shape) <= dim < len(shape):
        raise ShapeError(f"{op}: dim {dim} is out of range for shape {tuple(shape)}")
    return dim % len(shape)


def reduction(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """Sum over one dimension, which is kept with size 1."""
    (a,) = shapes
    d = normalize_dim(op, a, params["dim"])
    return tuple(1 if i == d else s for i, s in enumerate(a))


def concat(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """Join along ``dim``; every other dimension must agree."""
    a, b = shapes
    if len(a) != len(b):
        raise ShapeError(f"{op}: operands of shapes {fmt(shapes)} have different ranks")
    d = normalize_dim(op, a, params["dim"])
    for i, (x, y) in enumerate(zip(a, b)):
        if i != d and x != y:
            raise ShapeError(f"{op}: shapes {fmt(shapes)} differ in dimension {i} ({x} vs {y}), "
                             f"which is not the concatenation dimension {d}")
    return tuple(x + y if i == d else x for i, (x, y) in enumerate(zip(a, b)))


def slice_last(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """Elements ``start:stop`` of the last dimension (0 <= start < stop <= its size)."""
    (a,) = shapes
    start, stop = params["start"], params["stop"]
    for name, v in (("start", start), ("stop", stop)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise ShapeError(f"{op}: {name} must be an integer, got {v!r}")
    if not a or not 0 <= start < stop <= a[-1]:
        raise ShapeError(f"{op}: [{start}:{stop}] is not a non-empty slice of the last dimension "
                         f"of shape {tuple(a)} (0 <= start < stop <= size)")
    return (*a[:-1], stop - start)


def normalized_size(op: str, shape: Shape, normalized_shape: object) -> int:
    """Elements normalised together by ``rms_norm``: the product of the trailing dimensions."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    ns = tuple(normalized_shape)  # type: ignore[arg-type]
    if not ns or len(ns) > len(shape) or tuple(shape[-len(ns):]) != ns:
        raise ShapeError(
            f"{op}: normalized_shape {ns} is not the trailing part of shape {tuple(shape)}")
    size = 1
    for s in ns:
        size *= s
    return size


def rms_norm(op: str, shapes: Sequence[Shape], params: Params) -> Shape:
    """Normalise over the trailing ``normalized_shape``; an optional gain broadcasts onto it."""
    normalized_size(op, shapes[0], params["normalized_shape"])
    if len(shapes) == 2:
        broadcast(op, shapes, params)
    return tuple(shapes[0])


def _trailing_count(shape: Shape, n: int) -> int:
    """How many trailing dimensions of ``shape`` multiply to ``n``."""
    size, k = 1, 0
    while size < n:
        k += 1
        size *= shape[-k]
    return k
