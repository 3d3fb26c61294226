"""The provider abstraction: everything device-specific the runtime and API layer need.

A provider owns one array namespace (``xp``) and knows how to move arrays between the host and
its device, wrap foreign memory without copying, and wait for pending work. The API layer and
the executor never call numpy or CuPy for device work directly; they go through a provider.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class Provider(ABC):
    #: onnxruntime's name, e.g. "CPUExecutionProvider"
    name: str = ""
    #: OrtValue.device_name() spelling: "cpu" or "cuda"
    device_type: str = ""
    device_id: int = 0
    #: the array namespace kernels receive as ``xp``
    xp: Any = None

    @abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """An array on this provider's device holding ``array``'s values (no copy on the CPU)."""

    @abstractmethod
    def to_host(self, array: Any) -> np.ndarray:
        """A numpy array holding ``array``'s values (no copy on the CPU)."""

    @abstractmethod
    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, owner: Any = None) -> Any:
        """An array viewing ``ptr`` in place; the caller keeps ``owner`` alive while it is used."""

    @abstractmethod
    def from_dlpack(self, obj: Any) -> Any:
        """Import a DLPack-capable object living on this provider's device, without copying."""

    @abstractmethod
    def is_device_array(self, obj: Any) -> bool:
        """True if ``obj`` is an array of this provider's namespace (on its device)."""

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    def copy_into(self, dst: Any, src: Any) -> None:
        """Write ``src`` into the preallocated ``dst`` (same shape and dtype, checked by the caller)."""
        self.xp.copyto(dst, src)

    def contiguous(self, value: Any) -> Any:
        """``value`` as a C-contiguous array (itself when it already is): results handed out
        as OrtValues. Kernels may return views in another layout (a transpose, a channels-last
        convolution result); onnxruntime's values are always dense, and callers use
        data_ptr() with the shape alone."""
        flags = getattr(value, "flags", None)
        if flags is None or flags.c_contiguous:
            return value
        return self.xp.ascontiguousarray(value)

    def data_ptr(self, array: Any) -> int:
        return int(array.__array_interface__["data"][0]) if array.size else 0

    def may_share_memory(self, a: Any, b: Any) -> bool:
        """Whether two arrays of this provider might overlap (a cheap bounds check)."""
        return bool(self.xp.may_share_memory(a, b))

    def writeable(self, array: Any) -> bool:
        """Whether results may be written into ``array`` (read-only host arrays may not)."""
        return True

    def synchronize(self) -> None:
        """Block until work queued on this provider is done (nothing to wait for on the CPU)."""
        return None

    def supports(self, op_type: str, domain: str) -> bool:
        """Whether this provider has a kernel for the op (nodes it lacks fall back to the CPU)."""
        return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device_type}:{self.device_id}>"
