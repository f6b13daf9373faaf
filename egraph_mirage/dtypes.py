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


float16 = DType.float16
bfloat16 = DType.bfloat16
float32 = DType.float32
