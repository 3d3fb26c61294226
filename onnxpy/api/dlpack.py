"""DLPack import: tensors from torch, CuPy, JAX, numpy... become provider arrays without a copy."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..providers import CPU, Provider, provider_for_device
from .errors import InvalidArgument

# DLPack device types (dlpack.h)
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13


def import_dlpack(obj: Any, is_bool_tensor: bool = False) -> tuple[Any, Provider]:
    if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
        raise InvalidArgument(
            f"from_dlpack needs an object with __dlpack__ and __dlpack_device__ (a torch/CuPy/JAX/numpy "
            f"array), got {type(obj).__name__}"
        )
    dev_type, dev_id = obj.__dlpack_device__()
    dev_type = int(dev_type)
    if dev_type in (KDL_CPU, KDL_CUDA_HOST):
        value = np.from_dlpack(obj)
        provider = CPU
    elif dev_type in (KDL_CUDA, KDL_CUDA_MANAGED):
        provider = provider_for_device("cuda", int(dev_id))
        value = provider.from_dlpack(obj)
    else:
        raise InvalidArgument(f"from_dlpack: DLPack device type {dev_type} is not supported (expected CPU or CUDA)")
    if is_bool_tensor and value.dtype == np.uint8:
        value = value.view(np.bool_)
    return value, provider
