"""com.microsoft quantized operators written by onnxruntime's quantizer (QOperator format).

Semantics are the ContribOperators documentation's "dequantize, compute in float, quantize"
definitions, checked against onnxruntime in tests/ops/test_contrib_quant.py. A map of one 8-bit
per-tensor input (Sigmoid, LeakyRelu, requantizing a Concat or Where operand) is a lookup table
over its 256 possible values, computed with the same float32 formula: exact to it, and cheap.
QLinearAdd / QLinearMul rescale the integers straight to the output's grid (one float32 factor
per operand), which is where exact ties land where onnxruntime's do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import pool
from .._blas import stacked_matmul
from .._compat import host_scalar, normalize_axes, normalize_axis
from .._derived import derived
from ..quant import (
    _F32,
    _F64,
    _int_range,
    _q_out_dtype,
    _requantize,
    dequantize,
    dynamic_quantize_linear,
    integer_matmul,
    quantize,
)
from ..registry import op
from . import DOMAIN

_BYTE_TYPES = (np.dtype(np.uint8), np.dtype(np.int8))


# -- helpers -------------------------------------------------------------------------------------


def _byte_type(what: str, *arrays: Any) -> np.dtype:
    """The common 8-bit element type of ``arrays`` (None entries skipped)."""
    dts = {a.dtype for a in arrays if a is not None}
    if len(dts) != 1 or next(iter(dts)) not in _BYTE_TYPES:
        raise TypeError(
            f"{what}: quantized inputs and zero points must all be uint8 or all int8, got {sorted(map(str, dts))}"
        )
    return next(iter(dts))


def _scalar(p: Any, what: str) -> Any:
    if p.size != 1:
        raise ValueError(f"{what} must be a scalar (per-tensor quantization), got shape {list(p.shape)}")
    return p.reshape(())


def _zp(xp: Any, zp: Any, dt: np.dtype, what: str) -> Any:
    """A per-tensor zero point; an omitted one is 0 of the data's type."""
    return xp.zeros((), dtype=dt) if zp is None else _scalar(zp, what)


def _deq(xp: Any, x: Any, scale: Any, zp: Any, what: str) -> Any:
    """(x - zp) * scale in float32, per tensor."""
    return dequantize(xp, x, _scalar(scale, f"{what}'s scale"), _zp(xp, zp, x.dtype, f"{what}'s zero point"), _F32)


def _q(xp: Any, v: Any, scale: Any, zp: Any, dt: np.dtype, what: str) -> Any:
    """saturate(round(v / scale) + zp) per tensor, into ``dt``."""
    return quantize(
        xp, v, _scalar(scale, f"{what}'s scale"), _zp(xp, zp, dt, f"{what}'s zero point"), dt, precision=_F32
    )


def _table_map(xp: Any, x: Any, fn: Any) -> Any:
    """fn applied to an 8-bit x through a table of its 256 values: fn(all values)[x - min]."""
    lo, hi = _int_range(x.dtype)
    table = fn(xp.asarray(np.arange(lo, hi + 1).astype(x.dtype)))
    return xp.take(table, x.astype(np.int32) - lo)


def _requantize_table(xp: Any, x: Any, sx: Any, zx: Any, sy: Any, zy: Any, dt: np.dtype, what: str) -> Any:
    """x re-expressed on the output's quantization grid (dequantize then quantize)."""
    return _table_map(xp, x, lambda v: _q(xp, _deq(xp, v, sx, zx, what), sy, zy, dt, "the output"))


# -- element-wise --------------------------------------------------------------------------------


@op("QLinearAdd", 1, domain=DOMAIN)
def qlinear_add(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    A_scale: Any,  # noqa: N803
    A_zero_point: Any,  # noqa: N803
    B: Any,  # noqa: N803
    B_scale: Any,  # noqa: N803
    B_zero_point: Any,  # noqa: N803
    C_scale: Any,  # noqa: N803
    C_zero_point: Any = None,  # noqa: N803
) -> Any:
    dt = _byte_type("QLinearAdd", A, A_zero_point, B, B_zero_point, C_zero_point)
    sc = _scalar(C_scale, "C's scale").astype(_F32)
    # Each operand is scaled straight to C's grid (A_scale / C_scale, in float32), as onnxruntime
    # does: dequantizing first rounds differently at ties (scales 0.1, 0.1 -> 0.2).
    a = _deq(xp, A, _scalar(A_scale, "A's scale").astype(_F32) / sc, A_zero_point, "A")
    b = _deq(xp, B, _scalar(B_scale, "B's scale").astype(_F32) / sc, B_zero_point, "B")
    return _q(xp, a + b, xp.ones((), dtype=_F32), C_zero_point, dt, "C")


@op("QLinearMul", 1, domain=DOMAIN)
def qlinear_mul(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    A_scale: Any,  # noqa: N803
    A_zero_point: Any,  # noqa: N803
    B: Any,  # noqa: N803
    B_scale: Any,  # noqa: N803
    B_zero_point: Any,  # noqa: N803
    C_scale: Any,  # noqa: N803
    C_zero_point: Any = None,  # noqa: N803
) -> Any:
    dt = _byte_type("QLinearMul", A, A_zero_point, B, B_zero_point, C_zero_point)
    # The integer product times one float32 factor A_scale * B_scale / C_scale.
    factor = _scalar(A_scale, "A's scale").astype(_F32) * _scalar(B_scale, "B's scale").astype(_F32)
    factor = factor / _scalar(C_scale, "C's scale").astype(_F32)
    a = _deq(xp, A, xp.ones((), dtype=_F32), A_zero_point, "A")
    b = _deq(xp, B, xp.ones((), dtype=_F32), B_zero_point, "B")
    return _q(xp, a * b * factor, xp.ones((), dtype=_F32), C_zero_point, dt, "C")


def _unary(
    xp: Any, what: str, X: Any, X_scale: Any, X_zero_point: Any, Y_scale: Any, Y_zero_point: Any, fn: Any
) -> Any:  # noqa: N803
    dt = _byte_type(what, X, X_zero_point, Y_zero_point)
    return _table_map(
        xp, X, lambda v: _q(xp, fn(_deq(xp, v, X_scale, X_zero_point, "X")), Y_scale, Y_zero_point, dt, "Y")
    )


@op("QLinearSigmoid", 1, domain=DOMAIN)
def qlinear_sigmoid(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    X_scale: Any,  # noqa: N803
    X_zero_point: Any,  # noqa: N803
    Y_scale: Any,  # noqa: N803
    Y_zero_point: Any = None,  # noqa: N803
) -> Any:
    def sigmoid(v: Any) -> Any:
        return (1.0 / (1.0 + xp.exp(-v))).astype(_F32)

    return _unary(xp, "QLinearSigmoid", X, X_scale, X_zero_point, Y_scale, Y_zero_point, sigmoid)


@op("QLinearLeakyRelu", 1, domain=DOMAIN)
def qlinear_leaky_relu(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    X_scale: Any,  # noqa: N803
    X_zero_point: Any,  # noqa: N803
    Y_scale: Any,  # noqa: N803
    Y_zero_point: Any = None,  # noqa: N803
    *,
    alpha: float = 0.01,
) -> Any:
    def leaky(v: Any) -> Any:
        return xp.where(v >= 0, v, v * np.float32(alpha))

    return _unary(xp, "QLinearLeakyRelu", X, X_scale, X_zero_point, Y_scale, Y_zero_point, leaky)


# -- pooling -------------------------------------------------------------------------------------


def _to_channels_first(xp: Any, x: Any) -> Any:
    return xp.moveaxis(x, -1, 1)


@op("QLinearAveragePool", 1, domain=DOMAIN)
def qlinear_average_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    channels_last: int = 0,
    count_include_pad: int = 0,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    dt = _byte_type("QLinearAveragePool", X, x_zero_point, y_zero_point)
    if X.ndim < 3:
        raise ValueError(
            f"QLinearAveragePool needs an input of rank >= 3 (N, C, spatial...), got shape {list(X.shape)}"
        )
    x = _deq(xp, _to_channels_first(xp, X) if channels_last else X, x_scale, x_zero_point, "x")
    y = pool._average_pool(
        xp, x, kernel_shape, strides, None, pads, auto_pad, ceil_mode, count_include_pad, products=False
    )
    y = _q(xp, y, y_scale, y_zero_point, dt, "y")
    return xp.moveaxis(y, 1, -1) if channels_last else y


@op("QLinearGlobalAveragePool", 1, domain=DOMAIN)
def qlinear_global_average_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    channels_last: int = 0,
) -> Any:
    dt = _byte_type("QLinearGlobalAveragePool", X, x_zero_point, y_zero_point)
    if X.ndim < 3:
        raise ValueError(
            f"QLinearGlobalAveragePool needs an input of rank >= 3 (N, C, spatial...), got shape {list(X.shape)}"
        )
    axes = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    x = _deq(xp, X, x_scale, x_zero_point, "x")
    y = x.mean(axis=axes, keepdims=True, dtype=_F32)
    return _q(xp, y, y_scale, y_zero_point, dt, "y")


# -- concat / softmax ----------------------------------------------------------------------------


@op("QLinearConcat", 1, domain=DOMAIN)
def qlinear_concat(xp: Any, Y_scale: Any, Y_zero_point: Any, *inputs: Any, axis: int) -> Any:  # noqa: N803
    if not inputs or len(inputs) % 3:
        raise ValueError(
            f"QLinearConcat takes Y_scale, Y_zero_point, then (tensor, scale, zero point) triples; got {len(inputs)} "
            "inputs after the first two"
        )
    dt = _byte_type("QLinearConcat", Y_zero_point, *inputs[0::3], *inputs[2::3])
    ys, yz = _scalar(Y_scale, "Y_scale"), _scalar(Y_zero_point, "Y_zero_point")
    y_params = (host_scalar(ys), host_scalar(yz))  # read on the host (device scalars are copied)
    parts = []
    for i in range(0, len(inputs), 3):
        x, s, z = inputs[i : i + 3]
        same = (host_scalar(_scalar(s, f"input {i // 3}'s scale")), host_scalar(z)) == y_params
        parts.append(x if same else _requantize_table(xp, x, s, z, ys, yz, dt, f"input {i // 3}"))
    return xp.concatenate(parts, axis=normalize_axis(axis, inputs[0].ndim))


@op("QLinearSoftmax", 1, domain=DOMAIN)
def qlinear_softmax(
    xp: Any,
    X: Any,  # noqa: N803 - spec names
    X_scale: Any,  # noqa: N803
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    axis: int = -1,
    opset: int,
) -> Any:
    dt = _byte_type("QLinearSoftmax", X, x_zero_point, y_zero_point)
    ax = normalize_axis(axis, X.ndim)
    x = _deq(xp, X, X_scale, x_zero_point, "X")
    # Before opset 13 Softmax works on the input coerced to 2-D at ``axis``.
    work = x.reshape(int(np.prod(X.shape[:ax])), -1) if opset < 13 else x
    red = -1 if opset < 13 else ax
    e = xp.exp(work - work.max(axis=red, keepdims=True))
    y = (e / e.sum(axis=red, keepdims=True)).reshape(X.shape)
    return _q(xp, y, y_scale, y_zero_point, dt, "y")


# -- matrix products -----------------------------------------------------------------------------


def _per_column(p: Any, n: int, what: str) -> Any:
    """A scalar or a [N] per-column parameter, shaped to broadcast over (..., N)."""
    if p.size == 1:
        return p.reshape(())
    if p.ndim != 1 or p.shape[0] != n:
        raise ValueError(
            f"{what} must be a scalar or a 1-D tensor of {n} values (B's columns), got shape {list(p.shape)}"
        )
    return p


@op("QGemm", 1, domain=DOMAIN)
def qgemm(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    a_scale: Any,
    a_zero_point: Any,
    B: Any,  # noqa: N803
    b_scale: Any,
    b_zero_point: Any,
    C: Any = None,  # noqa: N803
    y_scale: Any = None,
    y_zero_point: Any = None,
    *,
    alpha: float = 1.0,
    transA: int = 0,  # noqa: N803
    transB: int = 0,  # noqa: N803
) -> Any:
    if A.ndim != 2 or B.ndim != 2:
        raise ValueError(f"QGemm needs 2-D A and B, got shapes {list(A.shape)} and {list(B.shape)}")
    a, b = (A.T if transA else A), (B.T if transB else B)
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"QGemm: A {list(A.shape)} (transA={transA}) and B {list(B.shape)} (transB={transB}) have different K"
        )
    n = b.shape[1]
    acc = integer_matmul(xp, a, _scalar(a_zero_point, "a_zero_point"), b, _per_column(b_zero_point, n, "b_zero_point"))
    if C is not None:
        if C.dtype != np.int32:
            raise TypeError(f"QGemm: C must be int32 (quantized with scale alpha * a_scale * b_scale), got {C.dtype}")
        if np.broadcast_shapes(C.shape, acc.shape) != acc.shape:
            raise ValueError(f"QGemm: C of shape {list(C.shape)} does not broadcast to the output {list(acc.shape)}")
        acc = acc + C.astype(_F64)
    # Scales multiply in float32, then the int32-exact accumulator is rescaled in float32.
    factor = (
        np.float32(alpha) * _scalar(a_scale, "a_scale").astype(_F32) * _per_column(b_scale, n, "b_scale").astype(_F32)
    )
    if y_scale is None:
        if y_zero_point is not None:
            raise ValueError("QGemm: y_zero_point is given without y_scale")
        return acc.astype(_F32) * factor
    if y_zero_point is None:
        raise ValueError("QGemm: a quantized output needs y_zero_point with y_scale")
    return _requantize(
        xp, acc, factor / _scalar(y_scale, "y_scale").astype(_F32), _scalar(y_zero_point, "y_zero_point")
    )


# -- QuantizeLinear / DequantizeLinear (16-bit and 4-bit types; per tensor or per axis) ----------


@op("QuantizeLinear", 1, domain=DOMAIN)
def quantize_linear(xp: Any, x: Any, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1) -> Any:
    # The quantizer writes a bias's scale as [1] and its zero point as []: compare sizes.
    if y_zero_point is not None and y_zero_point.size != y_scale.size:
        raise ValueError(
            f"QuantizeLinear: y_zero_point of shape {list(y_zero_point.shape)} does not match y_scale's {list(y_scale.shape)}"
        )
    return quantize(xp, x, y_scale, y_zero_point, _q_out_dtype(y_zero_point, 0), axis=axis, precision=_F32)


@op("DequantizeLinear", 1, domain=DOMAIN)
def dequantize_linear(xp: Any, x: Any, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1) -> Any:
    # The quantizer writes a bias's scale as [1] and its zero point as []: compare sizes.
    if x_zero_point is not None and x_zero_point.size != x_scale.size:
        raise ValueError(
            f"DequantizeLinear: x_zero_point of shape {list(x_zero_point.shape)} does not match x_scale's {list(x_scale.shape)}"
        )
    if x_scale.dtype not in (_F32, np.dtype(np.float16)):
        raise TypeError(f"DequantizeLinear: x_scale must be float or float16, got {x_scale.dtype}")
    return dequantize(xp, x, x_scale, x_zero_point, x_scale.dtype, axis=axis)


# -- float-output integer matrix products --------------------------------------------------------


def _int_matmul_to_float(xp: Any, a: Any, za: Any, b: Any, zb: Any, scale: Any, bias: Any, what: str) -> Any:
    """((a - za) @ (b - zb)) * scale + bias in float32; scale / zb per tensor or per column of b."""
    if b.ndim < 2 or a.ndim < 1:
        raise ValueError(f"{what}: B must be at least 2-D and A at least 1-D, got {list(a.shape)} and {list(b.shape)}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"{what}: A {list(a.shape)} and B {list(b.shape)} have different inner dimensions")
    n = b.shape[-1]
    zb = None if zb is None else _per_column(zb, n, "b_zero_point")
    acc = integer_matmul(xp, a, za, b, zb)
    y = acc.astype(_F32) * scale
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"{what}: bias must have shape [{n}] (B's last dimension), got {list(bias.shape)}")
        y = y + bias.astype(_F32)
    return y.astype(_F32, copy=False)


@op("DynamicQuantizeMatMul", 1, domain=DOMAIN)
def dynamic_quantize_matmul(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    B: Any,  # noqa: N803
    b_scale: Any,
    b_zero_point: Any = None,
    bias: Any = None,
) -> Any:
    # A is quantized to uint8 exactly as DynamicQuantizeLinear does.
    aq, a_scale, a_zp = dynamic_quantize_linear(xp, A)
    scale = a_scale.astype(_F32) * _per_column(b_scale, B.shape[-1], "b_scale").astype(_F32)
    return _int_matmul_to_float(xp, aq, a_zp, B, b_zero_point, scale, bias, "DynamicQuantizeMatMul")


@op("MatMulIntegerToFloat", 1, domain=DOMAIN)
def matmul_integer_to_float(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    B: Any,  # noqa: N803
    a_scale: Any,
    b_scale: Any,
    a_zero_point: Any = None,
    b_zero_point: Any = None,
    bias: Any = None,
) -> Any:
    za = None if a_zero_point is None else _scalar(a_zero_point, "a_zero_point")
    n = B.shape[-1] if B.ndim else 0
    scale = _scalar(a_scale, "a_scale") * _per_column(b_scale, n, "b_scale")
    return _int_matmul_to_float(xp, A, za, B, b_zero_point, scale, bias, "MatMulIntegerToFloat").astype(
        a_scale.dtype, copy=False
    )


def _unpack_bits(xp: Any, packed: Any, bits: int) -> Any:
    """uint8 bytes holding 8 // bits values each, lowest bits first, as one value per element."""
    per_byte = 8 // bits
    shifts = xp.asarray(np.arange(per_byte, dtype=np.uint8) * bits)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per_byte,))


@op("MatMulNBits", 1, domain=DOMAIN)
def matmul_nbits(
    xp: Any,
    A: Any,  # noqa: N803 - spec names
    B: Any,  # noqa: N803
    scales: Any,
    zero_points: Any = None,
    g_idx: Any = None,
    bias: Any = None,
    *,
    K: int,  # noqa: N803
    N: int,  # noqa: N803
    accuracy_level: int = 0,
    bits: int = 4,
    block_size: int,
    weight_prepacked: int = 0,
) -> Any:
    if bits not in (2, 4, 8):
        raise ValueError(f"MatMulNBits: bits must be 2, 4 or 8, got {bits}")
    if weight_prepacked:
        raise ValueError(
            f"MatMulNBits: weight_prepacked={weight_prepacked} (an execution provider's layout) is not supported"
        )
    if g_idx is not None:
        raise ValueError("MatMulNBits: the deprecated g_idx input is not supported")
    if block_size < 16 or block_size & (block_size - 1):
        raise ValueError(f"MatMulNBits: block_size must be a power of two >= 16, got {block_size}")
    if A.shape[-1] != K:
        raise ValueError(f"MatMulNBits: A's last dimension {A.shape[-1]} differs from K={K}")
    k_blocks = -(-K // block_size)
    blob = block_size * bits // 8
    out_shape = tuple(A.shape[:-1]) + (N,)
    if 0 in B.shape:  # an omitted projection: the output is the bias (or zeros)
        y = xp.zeros(out_shape, dtype=A.dtype)
        return y + bias if bias is not None else y
    if B.dtype != np.uint8 or B.size != N * k_blocks * blob:
        raise ValueError(
            f"MatMulNBits: B must be uint8 of shape [N, k_blocks, blob_size] = [{N}, {k_blocks}, {blob}], "
            f"got {B.dtype} {list(B.shape)}"
        )
    if scales.size != N * k_blocks:
        raise ValueError(
            f"MatMulNBits: scales must hold N * k_blocks = {N * k_blocks} values, got {list(scales.shape)}"
        )

    def dequantized() -> Any:
        """W^T as float32 [K, N], contiguous for the product."""
        q = _unpack_bits(xp, B.reshape(N, k_blocks, blob), bits).astype(_F32)  # [N, k_blocks, block_size]
        if zero_points is None:
            zp = xp.full((N, k_blocks), float(1 << (bits - 1)), dtype=_F32)
        elif zero_points.dtype == np.uint8:
            zp = _unpack_bits(xp, zero_points.reshape(N, -1), bits)[:, :k_blocks].astype(_F32)
        else:
            zp = zero_points.reshape(N, k_blocks).astype(_F32)
        w = (q - zp[..., None]) * scales.reshape(N, k_blocks, 1).astype(_F32)
        return xp.ascontiguousarray(w.reshape(N, k_blocks * block_size)[:, :K].T)

    # Constant weights (the usual case) are dequantized once per session, not at every run:
    # unpacking a 4096 x 4096 weight took 75x onnxruntime's whole product.
    sources = (B, scales) if zero_points is None else (B, scales, zero_points)
    wt = derived(sources, ("matmul-nbits", bits, block_size, K, N), dequantized)
    y = stacked_matmul(xp, A.astype(_F32), wt)
    if bias is not None:
        y = y + bias.astype(_F32)
    return y.astype(A.dtype, copy=False)


# -- where / reduce mean -------------------------------------------------------------------------


@op("QLinearWhere", 1, domain=DOMAIN)
def qlinear_where(
    xp: Any,
    condition: Any,
    X: Any,  # noqa: N803 - spec names
    x_scale: Any,
    x_zero_point: Any,
    Y: Any,  # noqa: N803
    y_scale: Any,
    y_zero_point: Any,
    z_scale: Any,
    z_zero_point: Any,
) -> Any:
    dt = _byte_type("QLinearWhere", X, x_zero_point, Y, y_zero_point, z_zero_point)
    if condition.dtype != np.bool_:
        raise TypeError(f"QLinearWhere: condition must be bool, got {condition.dtype}")
    # Each branch is first re-expressed on Z's grid, then selected.
    x = _requantize_table(xp, X, x_scale, x_zero_point, z_scale, z_zero_point, dt, "X")
    y = _requantize_table(xp, Y, y_scale, y_zero_point, z_scale, z_zero_point, dt, "Y")
    return xp.where(condition, x, y)


@op("QLinearReduceMean", 1, domain=DOMAIN)
def qlinear_reduce_mean(
    xp: Any,
    data: Any,
    data_scale: Any,
    data_zero_point: Any,
    reduced_scale: Any,
    reduced_zero_point: Any = None,
    *,
    axes: list[int],
    keepdims: int,
) -> Any:
    dt = _byte_type("QLinearReduceMean", data, data_zero_point, reduced_zero_point)
    ax = tuple(normalize_axes(axes, data.ndim)) if axes else tuple(range(data.ndim))
    x = _deq(xp, data, data_scale, data_zero_point, "data")
    return _q(
        xp, x.mean(axis=ax, keepdims=bool(keepdims), dtype=_F32), reduced_scale, reduced_zero_point, dt, "reduced"
    )
