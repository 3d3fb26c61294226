"""onnxruntime's ``capi`` namespace, for code that reaches names through it: chiefly the
exception classes, ``except ort.capi.onnxruntime_pybind11_state.Fail:``."""

from . import _pybind_state, onnxruntime_inference_collection, onnxruntime_pybind11_state

__all__ = ["onnxruntime_pybind11_state", "_pybind_state", "onnxruntime_inference_collection"]
