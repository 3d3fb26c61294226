"""The base of onnxpy's option enums: ints, as onnxpy's code and users' comparisons expect,
printed as onnxruntime prints its enums (``GraphOptimizationLevel.ORT_ENABLE_ALL``, not ``99``)."""

from __future__ import annotations

import enum


class NamedIntEnum(enum.IntEnum):
    def __str__(self) -> str:
        return f"{type(self).__name__}.{self.name}"

    def __format__(self, spec: str) -> str:
        # A numeric format (f"{level:d}") still formats the number; anything else the name.
        if spec and spec[-1] in "bcdoxXn":
            return int.__format__(int(self), spec)
        return format(str(self), spec)
