"""The mapping from aten operators to op-table operators: one ``Rule`` per aten overload.

A rule says which op-table entries it needs (``requires``: a name, or ``name.param`` where it
also needs a parameter of that entry), how it builds them (``emit(tracer, *args, **kwargs)``,
through the tracer's primitives in ``trace.py``), what kind of node it is (``COMPUTE``; a
``RELABEL``ling view, which costs nothing on any value, or a cast, which folds into the graph
input it converts and is one element-wise operator on a computed value; an ``INPUT_VIEW``, which
only folds into a graph input), and what it counts against the partitioner's caps.
``choose(*args, **kwargs)`` looks at the node's fx arguments (tensors are fx nodes, scalars are
numbers): it returns the further entries they need, or a string saying why they are refused.

Entries are looked up in ``egraph_mirage.ops.OPS`` when a node is traced: a rule whose entries
are not (yet) in the table is unsupported, and ``from_torch`` lets torch decompose its operator.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import UnsupportedOpError
from ..ops import OPS
from .traced import Computed, aten_name, meta_of
from .views import graph_dim

COMPUTE, RELABEL, INPUT_VIEW = "compute", "relabel", "input_view"
#: the casts (``RELABEL`` rules that are copies in torch: one per dtype on a computed value)
CASTS = frozenset({"aten._to_copy.default", "aten.to.dtype", "prims.convert_element_type.default"})
#: operators that only assert what fx's meta records of a value (export puts one before each
#: ``.to``): the partitioner erases them, else the value they check would leave its piece
ASSERTIONS = frozenset({"aten._assert_tensor_metadata.default"})


@dataclass(frozen=True)
class Rule:
    """How one aten overload becomes kernel-graph operators (see the module docstring)."""

    emit: Callable[..., Any]
    requires: tuple[str, ...] = ()
    kind: str = COMPUTE
    matmuls: int = 0
    reductions: int = 0
    choose: Callable[..., tuple[str, ...] | str] | None = None
    #: for an ``INPUT_VIEW``: whether an op-table operator does it on an intermediate (fx node)
    on_intermediate: Callable[[Any], bool] | None = None
    #: a copy in torch (clone): on a value from outside a piece it runs as is, and the piece
    #: takes its result (on an intermediate the tracer drops it)
    copies: bool = False


def available(entry: str) -> bool:
    """Whether op-table entry ``entry`` (``"name"`` or ``"name.param"``) is in ``OPS`` now."""
    name, _, param = entry.partition(".")
    spec = OPS.get(name)
    return spec is not None and (not param or param in spec.params
                                 or param in getattr(spec, "optional_names", ()))


def refusal(rule: Rule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why a node of ``rule`` with fx arguments ``args``/``kwargs`` cannot be traced; None if
    it can."""
    needed = list(rule.requires)
    if rule.choose is not None:
        extra = rule.choose(*args, **kwargs)
        if isinstance(extra, str):
            return extra
        needed += extra
    missing = [e.replace(".", "'s parameter '") for e in needed if not available(e)]
    if missing:
        return (f"needs op-table operator '{', '.join(missing)}', which egraph_mirage.ops.OPS "
                "does not have")
    return None


def _num(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _unary(op: str) -> Rule:
    return Rule(lambda t, x: t.unary(op, x), (op,))


def _matmul(t: Any, a: Any, b: Any) -> Any:
    return t.matmul(a, b)


def _linear(t: Any, x: Any, w: Any, b: Any = None) -> Any:
    y = t.matmul(x, t.permute(w, (1, 0)))
    return y if b is None else t.binary("add", y, b)


def _addmm(t: Any, bias: Any, a: Any, b: Any, beta: float = 1, alpha: float = 1) -> Any:
    return t.binary("add", t.matmul(a, b), bias)


def _add(t: Any, a: Any, b: Any, alpha: float = 1) -> Any:
    return t.unary("add_scalar", a, scalar=float(b * alpha)) if _num(b) else t.binary("add", a, b)


def _sub(t: Any, a: Any, b: Any, alpha: float = 1) -> Any:
    return t.unary("add_scalar", a, scalar=float(-b * alpha)) if _num(b) else t.binary("sub", a, b)


def _rsub(t: Any, a: Any, b: float, alpha: float = 1) -> Any:  # b - alpha * a
    return t.unary("add_scalar", t.unary("mul_scalar", a, scalar=float(-alpha)), scalar=float(b))


def _mul(t: Any, a: Any, b: Any) -> Any:
    return t.unary("mul_scalar", a, scalar=float(b)) if _num(b) else t.binary("mul", a, b)


def _div(t: Any, a: Any, b: Any) -> Any:
    return t.unary("mul_scalar", a, scalar=1.0 / b) if _num(b) else t.binary("div", a, b)


def _with_scalar(tensor_op: str, scalar_op: str) -> Callable[..., tuple[str, ...] | str]:
    """``choose`` of a binary operator whose second operand may be a Python number; a scaled
    tensor operand (``alpha``) is refused."""
    def choose(a: Any, b: Any, alpha: float = 1, **_: Any) -> tuple[str, ...] | str:
        if _num(b):
            return "division by the constant 0" if tensor_op == "div" and b == 0 else (scalar_op,)
        return (tensor_op,) if alpha == 1 else f"alpha={alpha} (only alpha=1 is mapped)"
    return choose


#: pow(x, exponent): the exponents mapped, and the operator each becomes (None: x itself)
POWERS: dict[float, str | None] = {2: "square", 0.5: "sqrt", -0.5: "rsqrt", 1: None}
#: gelu(x, approximate=...): the operator each form becomes (the table's ``gelu`` is the tanh
#: form, under its explicit name ``gelu_tanh``; ``gelu_erf`` is PyTorch's default)
GELUS = {"none": "gelu_erf", "tanh": "gelu_tanh"}


def _pow(t: Any, x: Any, exponent: float) -> Any:
    op = POWERS[exponent]
    return x if op is None else t.unary(op, x)


def _pow_choose(x: Any, exponent: Any) -> tuple[str, ...] | str:
    if not _num(exponent) or exponent not in POWERS:
        return f"exponent {exponent!r} (mapped: {', '.join(map(str, POWERS))})"
    op = POWERS[exponent]
    return () if op is None else (op,)


def _gelu_choose(x: Any, approximate: str = "none") -> tuple[str, ...] | str:
    return (GELUS[approximate],) if approximate in GELUS else f"approximate={approximate!r}"


def _reduce(op: str) -> Callable[..., Any]:
    def emit(t: Any, x: Any, dim: Any = None, keepdim: bool = False, **_: Any) -> Any:
        return t.reduce(op, x, dim, keepdim)
    return emit


def _sum_all(t: Any, x: Any, **_: Any) -> Any:
    return t.reduce("reduction", x, None, False)


def _mean_all(t: Any, x: Any, **_: Any) -> Any:
    return t.reduce("mean", x, None, False)


def _rms_norm(t: Any, x: Any, normalized_shape: Any, weight: Any = None,
              eps: float | None = None) -> Any:
    return t.rms_norm(x, tuple(normalized_shape), weight, eps)


def _layer_norm(t: Any, x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                eps: float = 1e-5, cudnn_enable: bool = True) -> Any:
    """``layer_norm`` as its definition over the last dim, computed in float32 as torch does
    for every float type (the input, weight and bias cast up, the result cast back):
    (x - mean(x)) * rsqrt(mean((x - mean(x))²) + eps) * weight + bias. The graph tensors are
    built with ``Tracer.apply``: the tracer's ``binary``/``reduce`` would cast float32 operands
    back to the node's dtype (``Tracer.as_result``)."""
    import torch

    f32 = torch.float32
    c = t.computed(t.cast(x, f32), "layer_norm", dims=())
    e = graph_dim(c.shape, c.tensor.dims, len(c.shape) - 1)
    if e is None:
        raise UnsupportedOpError(f"layer_norm over its last dim, which an earlier reshape "
                                 f"merged or split (torch shape {c.shape}, graph dims "
                                 f"{c.tensor.dims})")
    x32 = c.tensor
    centred = t.apply("sub", [x32, t.apply("mean", [x32], dim=e)])
    var = t.apply("mean", [t.apply("square", [centred])], dim=e)
    y = t.apply("mul", [centred, t.apply("rsqrt", [t.apply("add_scalar", [var],
                                                           scalar=float(eps))])])
    row = tuple(size if k == e else 1 for k, size in enumerate(x32.dims))  # weight's layout
    for op, affine in (("mul", weight), ("add", bias)):
        if affine is not None:
            y = t.apply(op, [y, t.computed(t.cast(affine, f32), f"layer_norm's {op}",
                                           dims=row).tensor])
    return t.cast(Computed(y, c.shape, f32), t.out_dtype)


def _layer_norm_choose(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                       *_: Any, **__: Any) -> tuple[str, ...] | str:
    if len(normalized_shape) != 1:
        return (f"layer_norm over the last {len(normalized_shape)} dims {tuple(normalized_shape)}"
                " (only the last dim is mapped: a reduction is along one dim)")
    dtype = getattr(meta_of(x), "dtype", None)
    return (*(("cast",) if dtype is not None and str(dtype) != "torch.float32" else ()),
            *(("add",) if bias is not None else ()))


def _softmax(t: Any, x: Any, dim: int, *_: Any, **__: Any) -> Any:
    return t.softmax(x, dim)


def _sdpa(t: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    """``scaled_dot_product_attention`` as its definition: softmax(q kᵀ · scale + mask) v, the
    key and value heads shared by groups of query heads (``enable_gqa``) as a broadcast, never
    a repeated copy."""
    heads, kv_heads = q.shape[-3] if len(q.shape) > 2 else 1, k.shape[-3] if len(k.shape) > 2 \
        else 1
    if heads != kv_heads:
        k = t.repeat_interleave(k, heads // kv_heads, len(k.shape) - 3)
        v = t.repeat_interleave(v, heads // kv_heads, len(v.shape) - 3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = t.unary("mul_scalar", t.matmul(q, t.transpose(k, -2, -1)), scalar=float(scale))
    if attn_mask is not None:
        s = t.binary("add", s, attn_mask)
    return t.matmul(t.softmax(s, -1), v)


def _sdpa_choose(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: float | None = None,
                 enable_gqa: bool = False) -> tuple[str, ...] | str:
    if is_causal:
        return "is_causal=True (give the mask as attn_mask)"
    if dropout_p:
        return f"dropout_p={dropout_p} (inference only)"
    if attn_mask is not None and "bool" in str(getattr(meta_of(attn_mask), "dtype", "")):
        return "a boolean attn_mask (partition makes it additive; trace_fx maps only that)"
    return ("add",) if attn_mask is not None else ()


def _cat(t: Any, tensors: list[Any], dim: int = 0) -> Any:
    return t.concat(tensors, dim)


def _slice(t: Any, x: Any, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Any:
    return t.slice(x, dim, start, end)


def _slice_choose(x: Any, dim: int = 0, start: Any = None, end: Any = None,
                  step: int = 1) -> tuple[str, ...] | str:
    return () if step == 1 else f"step={step} (only step 1 is a view the graph can fold)"


def _slices_last_dim(node: Any) -> bool:
    """Whether a slice node takes the last dim of its input by step 1 and ``slice_last`` is in
    the table (then it can act on an intermediate too)."""
    def spec(x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
        return dim, step

    dim, step = spec(*node.args, **node.kwargs)
    value = meta_of(node.args[0])  # (Dynamo's graphs record ``example_value``)
    if value is None:
        return False
    rank = len(value.shape)
    return available("slice_last") and step == 1 and dim % rank == rank - 1


@dataclass(frozen=True)
class Split:
    """The parts of ``split_with_sizes`` (a fused projection's ``chunk``), not yet taken: a
    ``getitem`` slices its part out (``Tracer.slice``), so a part no one takes costs nothing."""

    value: Any
    dim: int
    sizes: tuple[int, ...]


def _split_with_sizes(t: Any, x: Any, split_sizes: Any, dim: int = 0) -> Split:
    return Split(x, dim, tuple(split_sizes))


def _split(t: Any, x: Any, split_size: int, dim: int = 0) -> Split:
    size = x.shape[dim % len(x.shape)]
    return Split(x, dim, tuple(min(split_size, size - lo) for lo in range(0, size, split_size)))


def _getitem(t: Any, parts: Any, index: int) -> Any:
    if not isinstance(parts, Split):
        raise UnsupportedOpError(f"getitem of {type(parts).__name__} (only of a split's parts)")
    lo = sum(parts.sizes[:index % len(parts.sizes)])
    return t.slice(parts.value, parts.dim, lo, lo + parts.sizes[index])


def _splits_last_dim(node: Any) -> bool:
    """Whether a split node cuts the last dim of its input and ``slice_last`` is in the table
    (then its parts are slices of an intermediate too)."""
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
    rank = len(_in_shape(node))
    return available("slice_last") and rank > 0 and dim % rank == rank - 1


def _getitem_choose(parts: Any, index: Any) -> tuple[str, ...] | str:
    name = aten_name(parts.target) if hasattr(parts, "target") else type(parts).__name__
    return () if name in SPLITS else f"getitem of {name} (only of a split's parts)"


def _reshape(t: Any, x: Any, *_: Any, **__: Any) -> Any:
    return t.reshape(x, t.out_shape)


def _same(t: Any, x: Any, *_: Any, **__: Any) -> Any:
    return x


def _cast(t: Any, x: Any, *_: Any, **__: Any) -> Any:
    return t.cast(x, t.out_dtype)


def _cast_choose(x: Any, *args: Any, dtype: Any = None, **_: Any) -> tuple[str, ...] | str:
    """A conversion between float types needs op-table operator ``cast``; one to the value's
    own dtype (or a copy without a dtype) needs nothing."""
    dtype = args[0] if args and dtype is None else dtype
    name = str(dtype).removeprefix("torch.")
    if dtype is not None and name not in ("float16", "bfloat16", "float32"):
        return f"a cast to {name} (the graph computes in float types only)"
    value = getattr(x, "meta", {}).get("val")
    return () if dtype is None or getattr(value, "dtype", None) == dtype else ("cast",)


def _permute(t: Any, x: Any, dims: Any) -> Any:
    return t.permute(x, tuple(dims))


def _transpose(t: Any, x: Any, dim0: int, dim1: int) -> Any:
    return t.transpose(x, dim0, dim1)


def _t(t: Any, x: Any) -> Any:
    return t.transpose(x, 0, -1)


def _expand(t: Any, x: Any, size: Any, implicit: bool = False) -> Any:
    return t.expand(x, tuple(size))


def _narrow(t: Any, x: Any, dim: int, start: int, length: int) -> Any:
    return t.slice(x, dim, start, start + length)


def _select(t: Any, x: Any, dim: int, index: int) -> Any:
    return t.select(x, dim, index)


def _in_shape(node: Any) -> tuple[int, ...]:
    """The torch shape of fx node ``node``'s first argument (from fx's meta)."""
    return tuple(meta_of(node.args[0]).shape)


def relabels(shape: tuple[int, ...], perm: Any) -> bool:
    """Whether permuting a value of torch shape ``shape`` by ``perm`` only moves size-1 dims
    (the dims of other sizes keep their order): then it is a relabelling of a row-major value,
    not a transpose."""
    rank = max(1, len(shape))
    moved = [p % rank for p in perm if shape[p % rank] != 1]
    return moved == sorted(moved)


def _select_relabels(node: Any) -> bool:
    """Whether a select picks the one element of a size-1 dim (a squeeze: a relabelling)."""
    shape = _in_shape(node)
    return bool(shape) and shape[int(node.args[1]) % len(shape)] == 1


def _permute_relabels(node: Any) -> bool:
    return relabels(_in_shape(node), node.args[1])


def _transpose_relabels(node: Any) -> bool:
    shape = _in_shape(node)
    perm = list(range(len(shape)))
    if perm:
        d0, d1 = (int(d) % len(perm) for d in node.args[1:3])
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return relabels(shape, perm)


def _t_relabels(node: Any) -> bool:
    return relabels(_in_shape(node), tuple(reversed(range(len(_in_shape(node))))))


def _broadcasts(node: Any) -> bool:
    """Whether an expand only broadcasts size-1 dims of its input (new leading dims count as
    size 1): then the tracer keeps the size-1 dim of the graph tensor, which broadcasts where
    the value is used (grouped-query attention's shared K/V heads), never a copy."""
    shape, sizes = _in_shape(node), tuple(node.args[1])
    pad = len(sizes) - len(shape)
    return pad >= 0 and all(s in (-1, shape[i - pad]) or shape[i - pad] == 1
                            for i, s in enumerate(sizes) if i >= pad)


def _repeat_interleave(t: Any, x: Any, repeats: int, dim: int | None = None,
                       output_size: int | None = None) -> Any:
    return t.repeat_interleave(x, repeats, dim)


def _repeat_choose(x: Any, repeats: Any, dim: Any = None, **_: Any) -> tuple[str, ...] | str:
    return () if isinstance(repeats, int) and dim is not None else \
        "repeats must be an int and dim given (repeat of K/V heads along one dim)"


#: the splits whose parts ``getitem`` takes
SPLITS = frozenset({"aten.split_with_sizes.default", "aten.split.Tensor"})
_VIEW = {"kind": INPUT_VIEW}
_RELABEL = {"kind": RELABEL}
_SOFTMAX = ("amax", "sub", "exp", "reduction", "div")
#: layer_norm's operators (a bias adds ``add``; a float type other than float32, ``cast``)
_LAYER_NORM = ("mean", "sub", "square", "add_scalar", "rsqrt", "mul")

RULES: dict[str, Rule] = {
    # matrix products, batched over the leading dims
    "aten.mm.default": Rule(_matmul, ("matmul",), matmuls=1),
    "aten.bmm.default": Rule(_matmul, ("matmul",), matmuls=1),
    "aten.matmul.default": Rule(_matmul, ("matmul",), matmuls=1),
    "aten.linear.default": Rule(_linear, ("matmul",), matmuls=1,
                                choose=lambda x, w, b=None: () if b is None else ("add",)),
    "aten.addmm.default": Rule(_addmm, ("matmul", "add"), matmuls=1, choose=lambda *a, beta=1,
                               alpha=1: () if beta == alpha == 1 else "beta or alpha != 1"),
    # element-wise; a Python-number operand becomes mul_scalar / add_scalar
    "aten.add.Tensor": Rule(_add, choose=_with_scalar("add", "add_scalar")),
    "aten.add.Scalar": Rule(_add, choose=_with_scalar("add", "add_scalar")),
    "aten.sub.Tensor": Rule(_sub, choose=_with_scalar("sub", "add_scalar")),
    "aten.sub.Scalar": Rule(_sub, choose=_with_scalar("sub", "add_scalar")),
    "aten.rsub.Scalar": Rule(_rsub, ("mul_scalar", "add_scalar")),
    "aten.mul.Tensor": Rule(_mul, choose=_with_scalar("mul", "mul_scalar")),
    "aten.mul.Scalar": Rule(_mul, choose=_with_scalar("mul", "mul_scalar")),
    "aten.div.Tensor": Rule(_div, choose=_with_scalar("div", "mul_scalar")),
    "aten.div.Scalar": Rule(_div, choose=_with_scalar("div", "mul_scalar")),
    "aten.neg.default": _unary("neg"),
    "aten.exp.default": _unary("exp"),
    "aten.sqrt.default": _unary("sqrt"),
    "aten.rsqrt.default": _unary("rsqrt"),
    "aten.sigmoid.default": _unary("sigmoid"),
    "aten.tanh.default": _unary("tanh"),
    "aten.silu.default": _unary("silu"),
    "aten.relu.default": _unary("relu"),
    "aten.gelu.default": Rule(lambda t, x, approximate="none": t.unary(GELUS[approximate], x),
                              choose=_gelu_choose),
    "aten.pow.Tensor_Scalar": Rule(_pow, choose=_pow_choose),
    # reductions (the op-table operators keep the reduced dim with size 1)
    "aten.sum.dim_IntList": Rule(_reduce("reduction"), ("reduction",), reductions=1),
    "aten.sum.default": Rule(_sum_all, ("reduction",), reductions=1),
    "aten.mean.dim": Rule(_reduce("mean"), ("mean",), reductions=1),
    "aten.mean.default": Rule(_mean_all, ("mean",), reductions=1),
    "aten.amax.default": Rule(_reduce("amax"), ("amax",), reductions=1),
    "aten.rms_norm.default": Rule(_rms_norm, ("rms_norm.eps",), reductions=1),
    "aten.layer_norm.default": Rule(_layer_norm, _LAYER_NORM, reductions=2,
                                    choose=_layer_norm_choose),
    "aten.softmax.int": Rule(_softmax, _SOFTMAX, reductions=2),
    "aten._softmax.default": Rule(_softmax, _SOFTMAX, reductions=2),
    # attention as its definition (two products and a softmax; shared K/V heads broadcast)
    "aten.scaled_dot_product_attention.default": Rule(
        _sdpa, ("matmul", "mul_scalar", *_SOFTMAX), matmuls=2, reductions=2,
        choose=_sdpa_choose),
    # joining and slicing
    "aten.cat.default": Rule(_cat, ("concat",)),
    "aten.slice.Tensor": Rule(_slice, choose=_slice_choose, on_intermediate=_slices_last_dim,
                              **_VIEW),
    "aten.narrow.default": Rule(_narrow, **_VIEW),
    # a split (a fused QKV projection's chunk): each part a slice where a getitem takes it
    "aten.split_with_sizes.default": Rule(_split_with_sizes, on_intermediate=_splits_last_dim,
                                          **_VIEW),
    "aten.split.Tensor": Rule(_split, on_intermediate=_splits_last_dim, **_VIEW),
    "getitem": Rule(_getitem, choose=_getitem_choose, **_RELABEL),
    "aten.select.int": Rule(_select, on_intermediate=_select_relabels, **_VIEW),
    # views that fold into a graph input; on an intermediate, a permute that only moves size-1
    # dims is a relabelling, and an expand (a repeat of K/V heads) keeps its size-1 graph dim,
    # which broadcasts where the value is used; other views of intermediates would be copies
    "aten.permute.default": Rule(_permute, on_intermediate=_permute_relabels, **_VIEW),
    "aten.transpose.int": Rule(_transpose, on_intermediate=_transpose_relabels, **_VIEW),
    "aten.t.default": Rule(_t, on_intermediate=_t_relabels, **_VIEW),
    "aten.expand.default": Rule(_expand, on_intermediate=_broadcasts, **_VIEW),
    "aten.repeat_interleave.self_int": Rule(_repeat_interleave, choose=_repeat_choose,
                                            on_intermediate=lambda node: True, **_VIEW),
    # relabellings: free on any value (a graph tensor is row-major)
    "aten.view.default": Rule(_reshape, **_RELABEL),
    "aten.reshape.default": Rule(_reshape, **_RELABEL),
    "aten._unsafe_view.default": Rule(_reshape, **_RELABEL),
    "aten.unsqueeze.default": Rule(_reshape, **_RELABEL),
    "aten.squeeze.dim": Rule(_reshape, **_RELABEL),
    "aten.squeeze.dims": Rule(_reshape, **_RELABEL),
    "aten.squeeze.default": Rule(_reshape, **_RELABEL),
    "aten.flatten.using_ints": Rule(_reshape, **_RELABEL),
    "aten.unflatten.int": Rule(_reshape, **_RELABEL),
    "aten.clone.default": Rule(_same, copies=True, **_RELABEL),
    "aten.alias.default": Rule(_same, **_RELABEL),
    "aten.detach.default": Rule(_same, **_RELABEL),
    "aten.lift_fresh_copy.default": Rule(_same, copies=True, **_RELABEL),
    # casts between float types: op-table operator ``cast`` on a computed value; a cast of a
    # view of an input folds into the piece's input (the input is read, then cast), so it is
    # partitioned as a relabelling, with the piece of its users
    "aten._to_copy.default": Rule(_cast, choose=_cast_choose, **_RELABEL),
    "aten.to.dtype": Rule(_cast, choose=_cast_choose, **_RELABEL),
    "prims.convert_element_type.default": Rule(_cast, choose=_cast_choose, **_RELABEL),
}
