"""Element types of tensors."""

from __future__ import annotations

import enum


class DType(enum.Enum):
    """Floating-point element types a kernel graph may use."""

    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return 4 if self is DType.float32 else 2

    def __repr__(self) -> str:
        return f"em.{self.value}"


#: the lowest finite fp32: the floor of every max a μGraph computes (over a row of -inf only it
#: is this, not -inf, so that ``exp(s - max)`` is 0 there, not NaN: docs/lowering.md)
FP32_LOWEST = -3.4028234663852886e38

float16 = DType.float16
bfloat16 = DType.bfloat16
float32 = DType.float32
