"""Names of onnxruntime's API for features onnxpy cannot provide.

They exist so that code written for onnxruntime fails where it *uses* such a feature, with
NotImplemented naming the feature and why, instead of an AttributeError at a name lookup (or in
an ``except`` clause). Nothing here pretends to work: constructing one of these classes, reading
one of its attributes or calling one of these functions raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from . import errors

NATIVE_EP = "onnxpy cannot load native execution-provider libraries: it runs on numpy (CPU) and CuPy (CUDA) only"
LORA = "onnxpy does not support LoRA adapters; merge the adapter's weights into the model instead"
COMPILE = "onnxpy has no compiling execution providers (EPContext models are native-EP specific)"
SPARSE = "onnxpy has no sparse tensor type; pass dense arrays (a model's sparse initializers are densified at load)"
ALLOCATOR = (
    "onnxpy has no native allocators to configure or choose: host memory is numpy's, CUDA memory CuPy's memory pool"
)
PACKAGE = "onnxpy does not read or write onnxruntime model packages; give InferenceSession the .onnx model"
EP_INTROSPECTION = "onnxpy has no compiling execution providers whose EP context data could be read or written"
EXTERNAL_INFO = "onnxpy reports no external-initializer locations; use SessionOptions.add_external_initializers"


def refuse(feature: str, why: str) -> NoReturn:
    raise errors.NotImplemented(f"{feature} is not supported: {why}")


class _Refused(type):
    """Metaclass of the placeholder classes: constructing one or reading a public attribute
    (``OrtMemType.DEFAULT``, ``SparseTensor.sparse_coo_from_numpy``) raises NotImplemented."""

    _why: str

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        refuse(cls.__name__, cls._why)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("_"):  # introspection (copy, pickle, inspect) sees a plain class
            raise AttributeError(name)
        refuse(f"{cls.__name__}.{name}", cls._why)


def unsupported_class(name: str, why: str) -> type:
    return _Refused(name, (), {"_why": why, "__doc__": f"Not supported by onnxpy: {why}.", "__module__": "onnxpy"})


def unsupported_function(name: str, why: str) -> Callable[..., NoReturn]:
    def refused(*args: Any, **kwargs: Any) -> NoReturn:
        refuse(f"{name}()", why)

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"Not supported by onnxpy (raises NotImplemented): {why}."
    return refused


_CLASSES = {
    "LoraAdapter": LORA,
    "AdapterFormat": LORA,
    "ModelCompiler": COMPILE,
    "OrtCompileApiFlags": COMPILE,
    "SparseTensor": SPARSE,
    "OrtSparseFormat": SPARSE,
    "OrtArenaCfg": ALLOCATOR,
    "OrtMemoryInfo": ALLOCATOR,
    "OrtMemType": ALLOCATOR,
    "OrtAllocatorType": ALLOCATOR,
    "OrtDeviceMemoryType": ALLOCATOR,
    "OrtMemoryInfoDeviceType": ALLOCATOR,
    "OrtSyncStream": ALLOCATOR,
    "ModelPackage": PACKAGE,
    "ModelPackageComponentContext": PACKAGE,
    "ModelPackageContext": PACKAGE,
    "ModelPackageOptions": PACKAGE,
    "ModelPackageWriteMode": PACKAGE,
    "OrtEpContextData": EP_INTROSPECTION,
    "OrtEpContextDataBuffer": EP_INTROSPECTION,
    "OrtExternalInitializerInfo": EXTERNAL_INFO,
}
_FUNCTIONS = {
    "register_execution_provider_library": NATIVE_EP,
    "unregister_execution_provider_library": NATIVE_EP,
    "create_and_register_allocator": ALLOCATOR,
    "create_and_register_allocator_v2": ALLOCATOR,
}

#: name -> placeholder, for onnxpy's top level and onnxpy.capi
PLACEHOLDERS: dict[str, Any] = {
    **{n: unsupported_class(n, why) for n, why in _CLASSES.items()},
    **{n: unsupported_function(n, why) for n, why in _FUNCTIONS.items()},
}
