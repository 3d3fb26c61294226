"""Execution providers: where numpy and CuPy live.

``provider_for_device`` is how the API layer finds the provider owning a device; providers are
created once per (device type, id) and shared.
"""

from __future__ import annotations

import threading

from .base import Provider
from .cpu import CPUProvider

CPU = CPUProvider()
_lock = threading.Lock()
_cache: dict[tuple[str, int], Provider] = {("cpu", 0): CPU}

#: onnxruntime provider name -> device type
PROVIDER_DEVICES = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda"}


def cuda_available() -> bool:
    from . import cuda

    return cuda.is_available()


def available_provider_names() -> list[str]:
    names = ["CPUExecutionProvider"]
    if cuda_available():
        names.insert(0, "CUDAExecutionProvider")
    return names


def provider_for_device(device_type: str, device_id: int = 0) -> Provider:
    """The provider for a device such as ("cpu", 0) or ("cuda", 1); a clear error otherwise."""
    kind = str(device_type).lower()
    if kind == "gpu":
        kind = "cuda"
    key = (kind, int(device_id))
    with _lock:
        if key in _cache:
            return _cache[key]
        if kind == "cpu":
            provider: Provider = CPUProvider(int(device_id))
        elif kind == "cuda":
            from . import cuda

            if not cuda.is_available():
                raise RuntimeError(
                    f"device 'cuda:{device_id}' is not available: {cuda.unavailable_reason()}; "
                    "install onnxpy[cuda] on a machine with an NVIDIA GPU, or use 'cpu'"
                )
            provider = cuda.CUDAProvider(int(device_id))
        else:
            raise RuntimeError(f"unsupported device type '{device_type}': onnxpy supports 'cpu' and 'cuda'")
        _cache[key] = provider
        return provider


__all__ = ["Provider", "CPUProvider", "CPU", "provider_for_device", "available_provider_names", "cuda_available"]
