"""The CUDA provider: CuPy arrays in device memory. Imported only when CUDA is asked for."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .base import Provider


@functools.cache
def _probe() -> tuple[Any, str]:
    try:
        import cupy  # noqa: PLC0415 - optional dependency
    except Exception as e:  # noqa: BLE001 - any import failure means no CUDA
        return None, f"CuPy is not installed ({type(e).__name__}: {e})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        return None, f"no CUDA device is visible ({type(e).__name__}: {e})"
    if count < 1:
        return None, "no CUDA device is visible"
    return cupy, ""


def is_available() -> bool:
    return _probe()[0] is not None


def unavailable_reason() -> str:
    return _probe()[1]


class CUDAProvider(Provider):
    name = "CUDAExecutionProvider"
    device_type = "cuda"

    def __init__(self, device_id: int = 0) -> None:
        cupy, why = _probe()
        if cupy is None:
            raise RuntimeError(f"CUDAExecutionProvider is not available: {why}")
        if device_id >= cupy.cuda.runtime.getDeviceCount():
            raise RuntimeError(f"CUDA device {device_id} does not exist ({cupy.cuda.runtime.getDeviceCount()} visible)")
        self.device_id = device_id
        self.xp = cupy
        self._cupy = cupy

    def device(self) -> Any:
        return self._cupy.cuda.Device(self.device_id)

    def from_host(self, array: np.ndarray) -> Any:
        with self.device():
            return self._cupy.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        return self._cupy.asnumpy(array)

    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any = None) -> Any:
        cupy = self._cupy
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = count * dtype.itemsize
        if nbytes == 0:
            with self.device():
                return cupy.empty(shape, dtype=dtype)
        if not ptr:
            raise ValueError(f"buffer_ptr is 0 (null) but shape {list(shape)} needs {nbytes} bytes")
        mem = cupy.cuda.UnownedMemory(int(ptr), nbytes, owner, self.device_id)
        return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(mem, 0))

    def from_dlpack(self, obj: Any) -> Any:
        return self._cupy.from_dlpack(obj)

    def is_device_array(self, obj: Any) -> bool:
        return isinstance(obj, self._cupy.ndarray)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        with self.device():
            return self._cupy.empty(shape, dtype=dtype)

    def data_ptr(self, array: Any) -> int:
        return int(array.data.ptr) if array.size else 0

    def synchronize(self) -> None:
        self._cupy.cuda.Device(self.device_id).synchronize()
