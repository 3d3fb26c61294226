"""Execution providers: where numpy and CuPy live.

``provider_for_device`` is how the API layer finds the provider owning a device; providers are
created once per (device type, id) and shared, so an OrtValue made on "cuda" and a session on
CUDAExecutionProvider hold the same provider object (and the same stream). A session with its
own ``user_compute_stream`` gets a provider of its own (``provider_for_session``).

``register_provider`` adds a provider kind at run time (a test double such as the fake device
of tests/gpu/fake_device.py, or a plugin); it then behaves like a built-in one: it is listed by
``get_available_providers``, selectable by name in ``providers=[...]`` and reachable through its
device type in ``OrtValue`` / ``IOBinding`` calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api.errors import InvalidArgument
from .base import Provider
from .cpu import CPUProvider

CPU = CPUProvider()
_lock = threading.Lock()
_cache: dict[tuple[str, int], Provider] = {("cpu", 0): CPU}

#: onnxruntime provider name -> device type (registered providers are added here)
PROVIDER_DEVICES = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda"}

# onnxruntime's CUDA provider options onnxpy accepts without acting on them (memory arena,
# cuDNN tuning and layout knobs that have no CuPy counterpart); anything else unknown is an error.
_CUDA_IGNORED_OPTIONS = frozenset(
    {
        "gpu_mem_limit",
        "arena_extend_strategy",
        "cudnn_conv_algo_search",
        "cudnn_conv_use_max_workspace",
        "cudnn_conv1d_pad_to_nc1d",
        "do_copy_in_default_stream",
        "has_user_compute_stream",
        "tunable_op_enable",
        "tunable_op_tuning_enable",
        "tunable_op_max_tuning_duration_ms",
        "enable_skip_layer_norm_strict_mode",
        "prefer_nhwc",
        "use_ep_level_unified_stream",
        "use_tf32",
        "fuse_conv_bias",
        "sdpa_kernel",
        "gpu_external_alloc",
        "gpu_external_free",
        "gpu_external_empty_cache",
    }
)
_CUDA_OPTIONS = frozenset({"device_id", "user_compute_stream", "enable_cuda_graph"}) | _CUDA_IGNORED_OPTIONS


@dataclass(frozen=True)
class _Registered:
    name: str
    device_type: str
    factory: Callable[[int], Provider]
    available: Callable[[], bool]


_registered: dict[str, _Registered] = {}  # device type -> entry


def register_provider(
    name: str,
    device_type: str,
    factory: Callable[[int], Provider],
    available: Callable[[], bool] = lambda: True,
) -> None:
    """Make a provider kind known: ``factory(device_id)`` creates it for a device of ``device_type``."""
    kind = str(device_type).lower()
    if kind in ("cpu", "cuda", "gpu") or name in ("CPUExecutionProvider", "CUDAExecutionProvider"):
        raise ValueError(f"'{name}' / '{device_type}' is built in and cannot be registered again")
    with _lock:
        _registered[kind] = _Registered(name, kind, factory, available)
        PROVIDER_DEVICES[name] = kind


def unregister_provider(name: str) -> None:
    """Forget a provider added by ``register_provider`` (and the instances made for it)."""
    with _lock:
        kind = PROVIDER_DEVICES.get(name)
        if kind is None or kind not in _registered:
            return
        del _registered[kind]
        del PROVIDER_DEVICES[name]
        for key in [k for k in _cache if k[0] == kind]:
            del _cache[key]


def cuda_available() -> bool:
    from . import cuda

    return cuda.is_available()


def available_provider_names() -> list[str]:
    """Providers usable here, most preferred first: CUDA (when CuPy sees a device), registered
    ones, then the CPU."""
    names = []
    if cuda_available():
        names.append("CUDAExecutionProvider")
    names += [r.name for r in list(_registered.values()) if r.available()]
    names.append("CPUExecutionProvider")
    return names


def provider_for_device(device_type: str, device_id: int = 0) -> Provider:
    """The provider for a device such as ("cpu", 0) or ("cuda", 1); a clear error otherwise."""
    if not isinstance(device_type, str):
        raise InvalidArgument(f"device type must be a string such as 'cpu' or 'cuda', got {device_type!r}")
    if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)) or device_id < 0:
        raise InvalidArgument(f"device id must be an int >= 0, got {device_id!r}")
    kind = device_type.lower()
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
                raise InvalidArgument(
                    f"device 'cuda:{device_id}' is not available: {cuda.unavailable_reason()}; "
                    "install onnxpy[cuda] on a machine with an NVIDIA GPU, or use 'cpu'"
                )
            provider = cuda.CUDAProvider(int(device_id))
        elif kind in _registered:
            provider = _registered[kind].factory(int(device_id))
        else:
            known = ["cpu", "cuda", *_registered]
            raise InvalidArgument(f"unsupported device type '{device_type}': onnxpy supports {known}")
        _cache[key] = provider
        return provider


def provider_for_session(name: str, options: Mapping[str, Any]) -> Provider:
    """The provider a session runs on, configured by its provider options.

    CUDAExecutionProvider reads ``device_id`` (default 0), ``user_compute_stream`` (the address
    of a cudaStream_t, e.g. ``torch.cuda.current_stream().cuda_stream``: runs are queued on that
    stream) and ``enable_cuda_graph`` ("0"/"1"; read by IOBinding). onnxruntime options with no
    CuPy counterpart are accepted and ignored; unknown ones raise ValueError.
    """
    kind = PROVIDER_DEVICES[name]
    if kind == "cpu":
        return CPU
    device_id = _int_option(name, options, "device_id", 0)
    if kind != "cuda":
        return provider_for_device(kind, device_id)
    unknown = sorted(k for k in options if k not in _CUDA_OPTIONS)
    if unknown:
        raise ValueError(f"unknown {name} option(s) {unknown}; onnxpy knows {sorted(_CUDA_OPTIONS)}")
    cuda_graph_option(options)  # validates the value
    if "user_compute_stream" in options:
        from . import cuda

        shared = provider_for_device("cuda", device_id)  # checks availability and the id
        stream = _int_option(name, options, "user_compute_stream", 0)
        if not isinstance(shared, cuda.CUDAProvider):
            return shared
        return cuda.CUDAProvider(device_id, user_stream=stream)
    return provider_for_device("cuda", device_id)


def cuda_graph_option(options: Mapping[str, Any]) -> bool:
    """Whether ``enable_cuda_graph`` is on in a provider-options dict ("1"/"true" or "0"/"false")."""
    raw = str(options.get("enable_cuda_graph", "0")).strip().lower()
    if raw in ("1", "true"):
        return True
    if raw in ("0", "false", ""):
        return False
    raise ValueError(f"provider option enable_cuda_graph must be '0' or '1', got {options['enable_cuda_graph']!r}")


def _int_option(name: str, options: Mapping[str, Any], key: str, default: int) -> int:
    if key not in options:
        return default
    try:
        text = str(options[key]).strip()
        value = int(text, 16) if text.lower().startswith("0x") else int(text)
    except ValueError:
        raise ValueError(f"{name} option {key} must be an integer, got {options[key]!r}") from None
    if value < 0:
        raise ValueError(f"{name} option {key} must not be negative, got {value}")
    return value


__all__ = [
    "Provider",
    "CPUProvider",
    "CPU",
    "PROVIDER_DEVICES",
    "provider_for_device",
    "provider_for_session",
    "available_provider_names",
    "cuda_available",
    "cuda_graph_option",
    "register_provider",
    "unregister_provider",
]
