"""Exception classes named as onnxruntime's (onnxruntime.capi.onnxruntime_pybind11_state).

All derive from OnnxpyError so callers can catch everything onnxpy raises with one class.
InvalidArgument also derives from ValueError and NoSuchFile from FileNotFoundError, so code
written against plain Python exceptions keeps working.
"""

from __future__ import annotations


class OnnxpyError(RuntimeError):
    """Base class of every error onnxpy raises on purpose."""


class Fail(OnnxpyError):
    pass


class InvalidArgument(OnnxpyError, ValueError):
    pass


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of the wrong type: onnxruntime's bindings raise TypeError there, so this is
    one too, and still an InvalidArgument for code catching onnxpy's class."""


class NoSuchFile(OnnxpyError, FileNotFoundError):
    pass


class NoModel(OnnxpyError):
    pass


class EngineError(OnnxpyError):
    pass


class RuntimeException(OnnxpyError):
    pass


class InvalidProtobuf(OnnxpyError):
    pass


class ModelLoaded(OnnxpyError):
    pass


class NotImplemented(OnnxpyError):  # noqa: A001 - onnxruntime's name
    pass


class InvalidGraph(OnnxpyError):
    pass


class EPFail(OnnxpyError):
    pass


# onnxruntime's other status classes: onnxpy raises none of them today, but code naming them in
# an ``except`` clause must find them.
class NotFound(OnnxpyError):
    pass


class ModelLoadCanceled(OnnxpyError):
    pass


class ModelRequiresCompilation(OnnxpyError):
    pass


class DeviceReset(OnnxpyError):
    pass


__all__ = [
    "OnnxpyError",
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "EngineError",
    "RuntimeException",
    "InvalidProtobuf",
    "ModelLoaded",
    "NotImplemented",
    "InvalidGraph",
    "EPFail",
    "NotFound",
    "ModelLoadCanceled",
    "ModelRequiresCompilation",
    "DeviceReset",
    "InvalidArgumentType",
]
