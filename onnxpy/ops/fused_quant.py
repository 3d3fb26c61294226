"""Fused kernels of dynamically quantized matrix products (optimizer/passes/fuse_dynamic_matmul.py).

onnxruntime's quantize_dynamic writes, per linear layer of a transformer,

    xq, xs, xz = DynamicQuantizeLinear(x)                  (once per input, shared)
    y = Mul(Cast(MatMulInteger(xq, W, xz, wz), float), Mul(xs, ws)) [+ bias]

Run as written that is a uint8 tensor, a float copy of it minus xz per product, an int32
accumulator, its float copy and two more passes. Here the quantized input is kept as the
float32 integers xq - xz = clip(rint(x / xs), -xz, 255 - xz) (what DynamicQuantizeLinear
computes, less its zero point), and each product multiplies them by W - wz (float32, cached) in
one GEMM, exact while every partial sum stays below 2**24, then scales in place: the numbers of
the unfused graph, bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._blas import stacked_matmul
from .quant import _F32, _F32_EXACT, _F64, dynamic_quantization, largest_column_sum, quantize_uint8, shifted_columns
from .registry import op

DOMAIN = "onnxpy.fused"


@op("DynamicQuantizeShifted", 1, domain=DOMAIN)
def dynamic_quantize_shifted(xp: Any, x: Any) -> Any:
    """DynamicQuantizeLinear(x) as (xq - xz in float32, xs, xz)."""
    xf, scale, zp = dynamic_quantization(xp, x)
    if not np.isfinite(scale):
        # An infinity (or NaN) in x: x / inf is NaN where DynamicQuantizeLinear's cast to uint8
        # makes some integer of it. Take its very integers.
        v = quantize_uint8(xp, xf, scale, zp).astype(_F32) - zp
        return v, xp.asarray(scale, dtype=_F32), xp.asarray(np.uint8(zp))
    v = xf / scale
    xp.rint(v, out=v)
    v += _F32.type(0)  # rint(-0.3) is -0.0; xq - xz is +0
    xp.clip(v, -zp, np.float32(255) - zp, out=v)
    return v, xp.asarray(scale, dtype=_F32), xp.asarray(np.uint8(zp))


@op("ShiftedIntegerMatMul", 1, domain=DOMAIN)
def shifted_integer_matmul(
    xp: Any,
    v: Any,
    B: Any,  # noqa: N803 - MatMulInteger's name
    b_zero_point: Any,
    scale: Any,
    bias: Any = None,
) -> Any:
    """float32(v @ (B - b_zero_point)) * scale [+ bias] for v from DynamicQuantizeShifted
    (integers of magnitude <= 255) and a 2-D integer B."""
    if B.ndim != 2 or v.shape[-1] != B.shape[0]:
        raise ValueError(f"ShiftedIntegerMatMul: A {list(v.shape)} and B {list(B.shape)} have different K")
    if xp is np and 255.0 * largest_column_sum(B, b_zero_point) < _F32_EXACT:
        y = stacked_matmul(xp, v, shifted_columns(B, b_zero_point, _F32))
    else:
        y = stacked_matmul(xp, v.astype(_F64), shifted_columns(B, b_zero_point, _F64)).astype(_F32)
    y *= scale.astype(_F32, copy=False)
    if bias is not None:
        y += bias.astype(_F32, copy=False)
    return y
