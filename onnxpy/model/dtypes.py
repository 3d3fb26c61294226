"""The one table between ONNX element types, numpy dtypes and onnxruntime type strings.

Every other module asks this one; nothing else spells out an element-type mapping.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto, TypeProto

# (ONNX element type, numpy dtype, onnxruntime's name inside "tensor(...)")
_TABLE: list[tuple[int, np.dtype, str]] = [
    (TensorProto.FLOAT, np.dtype(np.float32), "float"),
    (TensorProto.UINT8, np.dtype(np.uint8), "uint8"),
    (TensorProto.INT8, np.dtype(np.int8), "int8"),
    (TensorProto.UINT16, np.dtype(np.uint16), "uint16"),
    (TensorProto.INT16, np.dtype(np.int16), "int16"),
    (TensorProto.INT32, np.dtype(np.int32), "int32"),
    (TensorProto.INT64, np.dtype(np.int64), "int64"),
    (TensorProto.STRING, np.dtype(object), "string"),
    (TensorProto.BOOL, np.dtype(np.bool_), "bool"),
    (TensorProto.FLOAT16, np.dtype(np.float16), "float16"),
    (TensorProto.DOUBLE, np.dtype(np.float64), "double"),
    (TensorProto.UINT32, np.dtype(np.uint32), "uint32"),
    (TensorProto.UINT64, np.dtype(np.uint64), "uint64"),
    (TensorProto.COMPLEX64, np.dtype(np.complex64), "complex64"),
    (TensorProto.COMPLEX128, np.dtype(np.complex128), "complex128"),
    (TensorProto.BFLOAT16, np.dtype(ml_dtypes.bfloat16), "bfloat16"),
    (TensorProto.FLOAT8E4M3FN, np.dtype(ml_dtypes.float8_e4m3fn), "float8e4m3fn"),
    (TensorProto.FLOAT8E4M3FNUZ, np.dtype(ml_dtypes.float8_e4m3fnuz), "float8e4m3fnuz"),
    (TensorProto.FLOAT8E5M2, np.dtype(ml_dtypes.float8_e5m2), "float8e5m2"),
    (TensorProto.FLOAT8E5M2FNUZ, np.dtype(ml_dtypes.float8_e5m2fnuz), "float8e5m2fnuz"),
    (TensorProto.UINT4, np.dtype(ml_dtypes.uint4), "uint4"),
    (TensorProto.INT4, np.dtype(ml_dtypes.int4), "int4"),
    (TensorProto.FLOAT4E2M1, np.dtype(ml_dtypes.float4_e2m1fn), "float4e2m1"),
]
for _name, _attr, _ml in (
    ("FLOAT8E8M0", "FLOAT8E8M0", "float8_e8m0fnu"),
    ("UINT2", "UINT2", "uint2"),
    ("INT2", "INT2", "int2"),
):
    # Newer element types exist only in newer onnx / ml_dtypes releases.
    if hasattr(TensorProto, _attr) and hasattr(ml_dtypes, _ml):
        _TABLE.append((getattr(TensorProto, _attr), np.dtype(getattr(ml_dtypes, _ml)), _name.lower()))

ELEM_TO_NP: dict[int, np.dtype] = {e: d for e, d, _ in _TABLE}
ELEM_TO_NAME: dict[int, str] = {e: n for e, _, n in _TABLE}
NP_TO_ELEM: dict[np.dtype, int] = {d: e for e, d, _ in _TABLE}
NAME_TO_ELEM: dict[str, int] = {n: e for e, _, n in _TABLE}

# Element types whose values are floating point (used by kernels and tolerance checks).
FLOAT_ELEMS = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.BFLOAT16,
        TensorProto.FLOAT8E4M3FN,
        TensorProto.FLOAT8E4M3FNUZ,
        TensorProto.FLOAT8E5M2,
        TensorProto.FLOAT8E5M2FNUZ,
        TensorProto.FLOAT4E2M1,
    }
)


def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX element type; raises ValueError naming the type if unknown."""
    try:
        return ELEM_TO_NP[elem_type]
    except KeyError:
        raise ValueError(f"unsupported ONNX element type {elem_type}") from None


def elem_type(dtype: Any) -> int:
    """ONNX element type of a numpy dtype (or anything np.dtype accepts, or an int element type)."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) in ELEM_TO_NP:
            return int(dtype)
        raise ValueError(f"unsupported ONNX element type {int(dtype)}")
    d = np.dtype(dtype)
    if d.kind in ("U", "S"):
        return TensorProto.STRING
    try:
        return NP_TO_ELEM[d]
    except KeyError:
        raise ValueError(f"numpy dtype {d} has no ONNX element type") from None


def to_np_dtype(element_type: Any) -> np.dtype:
    """Accept a numpy dtype / type or an ONNX TensorProto element-type integer."""
    if isinstance(element_type, (int, np.integer)) and not isinstance(element_type, bool):
        return np_dtype(int(element_type))
    return np.dtype(element_type)


def tensor_type_string(elem: int) -> str:
    return f"tensor({ELEM_TO_NAME.get(elem, 'undefined')})"


def dtype_string(dtype: Any) -> str:
    """onnxruntime's type string for a numpy dtype, e.g. 'tensor(float)'."""
    return tensor_type_string(elem_type(dtype))


def type_string(tp: TypeProto) -> str:
    """onnxruntime's type string for a TypeProto: tensor(float), seq(tensor(int64)), ..."""
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return tensor_type_string(tp.tensor_type.elem_type)
    if kind == "sparse_tensor_type":
        return f"sparse_tensor({ELEM_TO_NAME.get(tp.sparse_tensor_type.elem_type, 'undefined')})"
    if kind == "sequence_type":
        return f"seq({type_string(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_string(tp.optional_type.elem_type)})"
    if kind == "map_type":
        key = ELEM_TO_NAME.get(tp.map_type.key_type, "undefined")
        return f"map({key},{type_string(tp.map_type.value_type)})"
    return "undefined"


def is_string_dtype(dtype: np.dtype) -> bool:
    return dtype.kind in ("O", "U", "S")
