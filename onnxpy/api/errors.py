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
]
