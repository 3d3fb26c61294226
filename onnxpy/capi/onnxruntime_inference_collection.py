"""onnxruntime's Python wrapper classes, where scripts import them from
(``from onnxruntime.capi.onnxruntime_inference_collection import OrtValue``)."""

from __future__ import annotations

from .. import InferenceSession, IOBinding, OrtDevice, OrtValue, copy_tensors
from ..api.unsupported import PLACEHOLDERS as _PLACEHOLDERS

AdapterFormat = _PLACEHOLDERS["AdapterFormat"]
ModelCompiler = _PLACEHOLDERS["ModelCompiler"]
SparseTensor = _PLACEHOLDERS["SparseTensor"]

__all__ = [
    "InferenceSession",
    "IOBinding",
    "OrtDevice",
    "OrtValue",
    "copy_tensors",
    "AdapterFormat",
    "ModelCompiler",
    "SparseTensor",
]
