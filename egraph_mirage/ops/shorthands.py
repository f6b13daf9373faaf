"""Named methods for the op-table operators, shared by kernel graphs and thread-block graphs.

``g.matmul(A, B)`` is ``g.apply("matmul", (A, B))``; both builders inherit these methods and
define ``apply`` (and their own ``rms_norm``, whose parameters differ by level). An operator of
the op table without a method here is still a method: ``g.name(*operands, **params)``.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from ..dtypes import DType
from .table import OPS

T = TypeVar("T")


class OpShorthands(Generic[T]):
    """Mixin: one method per operator, each a call of ``self.apply``."""

    def apply(self, op: str, operands: Any, **params: Any) -> T:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        """Operators of the op table without a named method below."""
        if name.startswith("_") or name not in OPS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return lambda *operands, **params: self.apply(name, operands, **params)

    def matmul(self, A: T, B: T) -> T:
        """Matrix product over the last two dimensions."""
        return self.apply("matmul", (A, B))

    def add(self, A: T, B: T) -> T:
        return self.apply("add", (A, B))

    def mul(self, A: T, B: T) -> T:
        return self.apply("mul", (A, B))

    def div(self, A: T, B: T) -> T:
        return self.apply("div", (A, B))

    def exp(self, A: T) -> T:
        return self.apply("exp", (A,))

    def sqrt(self, A: T) -> T:
        return self.apply("sqrt", (A,))

    def square(self, A: T) -> T:
        return self.apply("square", (A,))

    def silu(self, A: T) -> T:
        return self.apply("silu", (A,))

    def gelu(self, A: T) -> T:
        return self.apply("gelu", (A,))

    def relu(self, A: T) -> T:
        return self.apply("relu", (A,))

    def mul_scalar(self, A: T, scalar: float) -> T:
        return self.apply("mul_scalar", (A,), scalar=scalar)

    def div_count(self, A: T, count: int) -> T:
        return self.apply("div_count", (A,), count=count)

    def reduction(self, A: T, dim: int) -> T:
        """Sum over ``dim``, kept with size 1."""
        return self.apply("reduction", (A,), dim=dim)

    def concat(self, A: T, B: T, dim: int) -> T:
        return self.apply("concat", (A, B), dim=dim)

    # --- the operators of transformer blocks ---------------------------------------------------
    def sub(self, A: T, B: T) -> T:
        return self.apply("sub", (A, B))

    def neg(self, A: T) -> T:
        return self.apply("neg", (A,))

    def rsqrt(self, A: T) -> T:
        return self.apply("rsqrt", (A,))

    def sigmoid(self, A: T) -> T:
        return self.apply("sigmoid", (A,))

    def tanh(self, A: T) -> T:
        return self.apply("tanh", (A,))

    def gelu_tanh(self, A: T) -> T:
        """GELU, tanh form (the same function as ``gelu``)."""
        return self.apply("gelu_tanh", (A,))

    def gelu_erf(self, A: T) -> T:
        """GELU, erf form (PyTorch's default)."""
        return self.apply("gelu_erf", (A,))

    def add_scalar(self, A: T, scalar: float) -> T:
        return self.apply("add_scalar", (A,), scalar=scalar)

    def mean(self, A: T, dim: int) -> T:
        """Mean over ``dim``, kept with size 1."""
        return self.apply("mean", (A,), dim=dim)

    def amax(self, A: T, dim: int) -> T:
        """Max over ``dim``, kept with size 1."""
        return self.apply("amax", (A,), dim=dim)

    def slice_last(self, A: T, start: int, stop: int) -> T:
        """Elements ``start:stop`` of the last dimension (kernel graphs only)."""
        return self.apply("slice_last", (A,), start=start, stop=stop)

    # --- mixed precision ---------------------------------------------------------------------
    def cast(self, A: T, dtype: DType | str) -> T:
        """``A`` rounded to ``dtype`` (a ``DType`` or its name), of that dtype."""
        return self.apply("cast", (A,), dtype=dtype.value if isinstance(dtype, DType) else dtype)
