"""onnxpy: the ONNX Runtime API, written in Python, on numpy (CPU) and CuPy (CUDA).

import onnxpy as ort
sess = ort.InferenceSession("model.onnx")
outputs = sess.run(None, {"input": x})
"""

from __future__ import annotations

import os as _os

from . import ops as _ops  # noqa: F401 - registers every kernel
from .api.devices import (
    OrtDeviceVendorId,
    OrtEpAssignedNode,
    OrtEpAssignedSubgraph,
    OrtEpDevice,
    OrtExecutionProviderDevicePolicy,
    OrtHardwareDevice,
    OrtHardwareDeviceType,
    get_ep_devices,
)

# The exception classes are attributes (onnxpy.InvalidArgument) but not in __all__: a star
# import must not rebind the builtin NotImplemented. onnxruntime keeps them in
# onnxruntime.capi.onnxruntime_pybind11_state, as onnxpy.capi does.
from .api.errors import (  # noqa: F401 - re-exported as attributes
    DeviceReset,
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidArgumentType,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoadCanceled,
    ModelLoaded,
    ModelRequiresCompilation,
    NoModel,
    NoSuchFile,
    NotFound,
    NotImplemented,
    OnnxpyError,
    RuntimeException,
)
from .api.iobinding import IOBinding
from .api.options import ExecutionMode, ExecutionOrder, GraphOptimizationLevel, RunOptions, SessionOptions
from .api.ortvalue import OrtDevice, OrtValue, copy_tensors
from .api.session import InferenceSession, ModelMetadata, NodeArg
from .api.unsupported import PLACEHOLDERS as _PLACEHOLDERS
from .ops.randomness import set_seed
from .providers import available_provider_names as _available
from .runtime.facts import GLOBAL_POOL as _GLOBAL_POOL
from .runtime.logs import set_default_logger_callback, set_default_logger_severity, set_default_logger_verbosity

__version__ = "0.1.0"
version = __version__
package_name = "onnxpy"
cuda_version = ""  # onnxpy is not built against CUDA: CuPy brings its own

# onnxruntime's names for features onnxpy cannot provide (LoRA adapters, sparse tensors, native
# allocators and EP libraries...): using one raises NotImplemented saying why (api/unsupported.py).
globals().update(_PLACEHOLDERS)


def get_available_providers() -> list[str]:
    """Providers usable on this machine, most preferred first."""
    return _available()


def get_all_providers() -> list[str]:
    """Every provider onnxpy knows, available here or not."""
    return ["CUDAExecutionProvider", "CPUExecutionProvider"]


def get_device() -> str:
    """'GPU' when the CUDA provider is usable here, else 'CPU' (as onnxruntime reports)."""
    return "GPU" if "CUDAExecutionProvider" in _available() else "CPU"


def get_version_string() -> str:
    return __version__


def get_build_info() -> str:
    """What this onnxpy runs on: its version and those of Python, numpy and onnx (onnxpy is
    not compiled, so these are its build)."""
    import platform

    import numpy
    import onnx

    return (
        f"onnxpy {__version__}: Python {platform.python_version()}, numpy {numpy.__version__}, "
        f"onnx {onnx.__version__}, {platform.system()} {platform.machine()}"
    )


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0, inter_op_num_threads: int = 0) -> None:
    """Thread counts of sessions whose options say ``use_per_session_threads = False``: intra-op
    threads cap the BLAS pool during their runs (0: the library's default); inter-op threads
    are accepted and unused (onnxpy runs nodes in sequence)."""
    for name, value in (("intra_op_num_threads", intra_op_num_threads), ("inter_op_num_threads", inter_op_num_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidArgument(f"{name} must be an int >= 0, got {value!r}")
        _GLOBAL_POOL[name] = int(value)


def has_collective_ops() -> bool:
    """onnxpy has no collective (multi-device communication) operators."""
    return False


def preload_dlls(cuda: bool = True, cudnn: bool = True, msvc: bool = True, directory: str | None = None) -> None:
    """Accepted for compatibility, does nothing: onnxpy loads no native libraries of its own
    (CuPy finds the CUDA libraries it needs when the CUDA provider first runs)."""


def print_debug_info() -> None:
    """Print what helps a bug report: onnxpy's build info, where it is installed and its providers."""
    print(get_build_info())
    print(f"onnxpy at {_os.path.dirname(__file__)}")
    print(f"available providers: {get_available_providers()}")
    print(f"devices: {get_ep_devices()}")


def disable_telemetry_events() -> None:
    """Accepted for compatibility: onnxpy collects and sends no telemetry."""


def enable_telemetry_events() -> None:
    """Accepted for compatibility: onnxpy collects and sends no telemetry, enabled or not."""


__all__ = [
    "InferenceSession",
    "SessionOptions",
    "RunOptions",
    "GraphOptimizationLevel",
    "ExecutionMode",
    "ExecutionOrder",
    "OrtValue",
    "OrtDevice",
    "IOBinding",
    "copy_tensors",
    "NodeArg",
    "ModelMetadata",
    "get_available_providers",
    "get_all_providers",
    "get_device",
    "get_version_string",
    "get_build_info",
    "set_seed",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_default_logger_callback",
    "set_global_thread_pool_sizes",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "__version__",
    "get_ep_devices",
    "OrtDeviceVendorId",
    "OrtEpDevice",
    "OrtEpAssignedNode",
    "OrtEpAssignedSubgraph",
    "OrtHardwareDevice",
    "OrtHardwareDeviceType",
    "OrtExecutionProviderDevicePolicy",
    "has_collective_ops",
    "preload_dlls",
    "print_debug_info",
    "package_name",
    "cuda_version",
    *_PLACEHOLDERS,
]

from . import capi as capi  # noqa: E402 - onnxruntime's capi namespace, over the names above
