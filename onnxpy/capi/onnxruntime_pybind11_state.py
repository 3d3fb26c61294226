"""What onnxruntime's native module exposes, as far as onnxpy has it: the exception classes (the
very classes onnxpy raises, also reachable as ``onnxpy.InvalidArgument``...), the enums, options
and device classes, the module-level functions, and the placeholders of unsupported features.

onnxruntime's native InferenceSession, OrtValue, OrtDevice, SparseTensor and ModelCompiler
differ from its Python wrappers of the same name; onnxpy has only the wrappers (top level)."""

from __future__ import annotations

from .. import (
    ExecutionMode,
    ExecutionOrder,
    GraphOptimizationLevel,
    ModelMetadata,
    NodeArg,
    RunOptions,
    SessionOptions,
    disable_telemetry_events,
    enable_telemetry_events,
    get_all_providers,
    get_available_providers,
    get_build_info,
    get_device,
    get_version_string,
    has_collective_ops,
    set_default_logger_callback,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_global_thread_pool_sizes,
    set_seed,
)
from ..api.devices import (
    OrtEpAssignedNode,
    OrtEpAssignedSubgraph,
    OrtEpDevice,
    OrtExecutionProviderDevicePolicy,
    OrtHardwareDevice,
    OrtHardwareDeviceType,
    get_ep_devices,
)
from ..api.errors import (
    DeviceReset,
    EngineError,
    EPFail,
    Fail,
    InvalidArgument,
    InvalidGraph,
    InvalidProtobuf,
    ModelLoadCanceled,
    ModelLoaded,
    ModelRequiresCompilation,
    NoModel,
    NoSuchFile,
    NotFound,
    NotImplemented,  # noqa: A004 - onnxruntime's name
    RuntimeException,
)
from ..api.unsupported import PLACEHOLDERS as _PLACEHOLDERS

globals().update(_PLACEHOLDERS)

__all__ = [
    "DeviceReset",
    "EPFail",
    "EngineError",
    "Fail",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidProtobuf",
    "ModelLoadCanceled",
    "ModelLoaded",
    "ModelRequiresCompilation",
    "NoModel",
    "NoSuchFile",
    "NotFound",
    "NotImplemented",
    "RuntimeException",
    "ExecutionMode",
    "ExecutionOrder",
    "GraphOptimizationLevel",
    "ModelMetadata",
    "NodeArg",
    "RunOptions",
    "SessionOptions",
    "OrtEpAssignedNode",
    "OrtEpAssignedSubgraph",
    "OrtEpDevice",
    "OrtExecutionProviderDevicePolicy",
    "OrtHardwareDevice",
    "OrtHardwareDeviceType",
    "get_ep_devices",
    "disable_telemetry_events",
    "enable_telemetry_events",
    "get_all_providers",
    "get_available_providers",
    "get_build_info",
    "get_device",
    "get_version_string",
    "has_collective_ops",
    "set_default_logger_callback",
    "set_default_logger_severity",
    "set_default_logger_verbosity",
    "set_global_thread_pool_sizes",
    "set_seed",
    *_PLACEHOLDERS,
]
