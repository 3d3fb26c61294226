"""The CPU provider: numpy arrays in host memory."""

from __future__ import annotations

import ctypes
from typing import Any

import ml_dtypes
import numpy as np

from .base import Provider

# Sub-byte element types: onnxruntime packs them two (int4, float4) or four (int2) to a byte,
# ml_dtypes stores one value per byte, so a caller's buffer of onnxruntime's size is too small.
_SUB_BYTE = frozenset(
    np.dtype(getattr(ml_dtypes, n))
    for n in ("int4", "uint4", "int2", "uint2", "float4_e2m1fn")
    if hasattr(ml_dtypes, n)
)


class CPUProvider(Provider):
    name = "CPUExecutionProvider"
    device_type = "cpu"
    xp = np

    def __init__(self, device_id: int = 0) -> None:
        self.device_id = device_id

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any = None) -> np.ndarray:
        dtype = np.dtype(dtype)
        if dtype.hasobject:
            raise TypeError("string tensors cannot be bound by pointer; bind a numpy array instead")
        if dtype in _SUB_BYTE:
            raise TypeError(
                f"{dtype} tensors cannot be bound by pointer: onnxruntime's layout packs several values "
                "to a byte, onnxpy's holds one per byte; bind a numpy array instead"
            )
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype=dtype)
        if not ptr:
            raise ValueError(f"buffer_ptr is 0 (null) but shape {list(shape)} needs {nbytes} bytes")
        raw = (ctypes.c_char * nbytes).from_address(int(ptr))
        if owner is not None:
            raw._owner = owner  # the array's base chain now keeps the memory's owner alive
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)

    def from_dlpack(self, obj: Any) -> np.ndarray:
        return np.from_dlpack(obj)

    def is_device_array(self, obj: Any) -> bool:
        return isinstance(obj, np.ndarray)

    def writeable(self, array: Any) -> bool:
        return bool(array.flags.writeable)
