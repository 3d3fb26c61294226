"""DLPack import: tensors from torch, CuPy, JAX, numpy... become provider arrays without a copy.

Objects with ``__dlpack__`` / ``__dlpack_device__`` (the array-API protocol) are handed to the
provider of the device they live on. A bare DLPack capsule (what ``torch.utils.dlpack.to_dlpack``
returns) is accepted too: its device is read from the C struct before it is consumed.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..providers import CPU, Provider, provider_for_device
from .errors import InvalidArgument

# DLPack device types (dlpack.h)
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13

_LEGACY = b"dltensor"
_VERSIONED = b"dltensor_versioned"


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):
    # The leading fields of DLTensor: enough to find the device.
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


class _VersionedHead(ctypes.Structure):
    # DLManagedTensorVersioned: version, manager_ctx, deleter, flags, then the DLTensor.
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensorHead),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class _CapsuleSource:
    """Presents an unconsumed DLPack capsule through the ``__dlpack__`` protocol."""

    def __init__(self, capsule: Any) -> None:
        if _api.PyCapsule_IsValid(capsule, _VERSIONED):
            head = _VersionedHead.from_address(_api.PyCapsule_GetPointer(capsule, _VERSIONED)).dl_tensor
        elif _api.PyCapsule_IsValid(capsule, _LEGACY):
            head = _DLTensorHead.from_address(_api.PyCapsule_GetPointer(capsule, _LEGACY))
        else:
            raise InvalidArgument(
                "from_dlpack: the capsule is not an unconsumed DLPack tensor (a capsule can be imported only once)"
            )
        self._capsule = capsule
        self._device = (int(head.device.device_type), int(head.device.device_id))

    def __dlpack__(self, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._device


def _is_capsule(obj: Any) -> bool:
    return type(obj).__name__ == "PyCapsule"


def import_dlpack(obj: Any, is_bool_tensor: bool = False) -> tuple[Any, Provider]:
    """(array, provider) viewing the memory of a DLPack producer; the array keeps it alive."""
    if _is_capsule(obj):
        obj = _CapsuleSource(obj)
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise InvalidArgument(
            f"from_dlpack needs an object with __dlpack__ and __dlpack_device__ (a torch/CuPy/JAX/numpy "
            f"array) or a DLPack capsule, got {type(obj).__name__}"
        )
    dev_type, dev_id = obj.__dlpack_device__()
    dev_type = int(dev_type)
    try:
        if dev_type in (KDL_CPU, KDL_CUDA_HOST):
            provider: Provider = CPU
            value = CPU.from_dlpack(obj)
        elif dev_type in (KDL_CUDA, KDL_CUDA_MANAGED):
            provider = provider_for_device("cuda", int(dev_id))
            value = provider.from_dlpack(obj)
        else:
            raise InvalidArgument(f"from_dlpack: DLPack device type {dev_type} is not supported (expected CPU or CUDA)")
    except (BufferError, RuntimeError, TypeError) as e:
        if isinstance(e, InvalidArgument):
            raise
        raise InvalidArgument(f"from_dlpack: cannot import {type(obj).__name__}: {e}") from e
    if not value.flags.c_contiguous:
        # An OrtValue's data is data_ptr() and its shape, as in onnxruntime (which refuses these
        # too): a transposed or reversed view would be read in the wrong order, or out of bounds.
        raise InvalidArgument(
            f"from_dlpack: the tensor must be C-contiguous (shape {list(value.shape)}, strides in elements "
            f"{[s // value.itemsize for s in value.strides]}); make it contiguous first "
            "(tensor.contiguous(), numpy.ascontiguousarray)"
        )
    # Producers that predate DLPack's bool type hand bools over as uint8.
    if is_bool_tensor and value.dtype == np.uint8:
        value = value.view(np.bool_)
    return value, provider
