"""Quantization kernels: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinearMatMul,
QLinearConv, MatMulInteger, ConvInteger.

Integer products are accumulated in float64, which is exact for any realistic reduction length
(|a * b| <= 2**16 per term, so up to ~2**37 terms) and keeps BLAS speed; the result is then wrapped
to int32 as the spec allows ("accumulation may overflow if and only if in 32 bits").
"""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np

from ..model import dtypes
from ._blas import stacked_matmul
from ._clamp import np_clip
from ._compat import normalize_axis
from ._derived import derived
from .conv import conv_nd
from .registry import op
from .tensor import cast_array

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_DIVIDE_TYPES = (_F32, _F64, np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
# Integer types whose every value (and difference of two) float32 represents exactly.
_SMALL_INTS = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16))


@functools.lru_cache(maxsize=64)
def _int_range(dt: np.dtype) -> tuple[int, int] | None:
    """(min, max) of an integer element type (int2 ... uint64), None for float types. Cached:
    numpy's and ml_dtypes' iinfo take 2-5 us a call."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return int(info.min), int(info.max)
    try:
        info = ml_dtypes.iinfo(dt)
    except (ValueError, TypeError):
        return None
    return int(info.min), int(info.max)


def _is_float_type(dt: np.dtype) -> bool:
    return dt.kind == "f" or dtypes.NP_TO_ELEM.get(dt) in dtypes.FLOAT_ELEMS or "float8" in str(dt)


def _as_float(xp: Any, x: Any, dt: np.dtype = _F32) -> Any:
    return x.astype(dt, copy=False)


def _broadcast_param(xp: Any, p: Any, shape: tuple[int, ...], axis: int, block_size: int, what: str) -> Any:
    """A scale / zero point shaped to broadcast against the input: per-tensor, per-axis or blocked."""
    rank = len(shape)
    if block_size <= 0 and (p.ndim == 0 or p.size == 1 and p.ndim <= 1):
        return p.reshape(())
    if rank == 0:
        raise ValueError(f"{what} has shape {list(p.shape)} but the input is a scalar")
    ax = normalize_axis(axis, rank)
    if block_size > 0:
        if p.ndim != rank:
            raise ValueError(
                f"{what} of shape {list(p.shape)} must have the input's rank {rank} for blocked quantization"
            )
        dim = shape[ax]
        for d in range(rank):
            if d != ax and p.shape[d] != shape[d]:
                raise ValueError(
                    f"{what} of shape {list(p.shape)} must match the input {list(shape)} except on axis {ax}"
                )
        blocks = p.shape[ax]
        if blocks * block_size < dim or (blocks - 1) * block_size >= max(dim, 1):
            raise ValueError(
                f"block_size {block_size} does not fit: axis {ax} of size {dim} needs ceil({dim}/{block_size}) "
                f"blocks, {what} has {blocks}"
            )
        # Element i of the axis uses block i // block_size: exactly ``dim`` entries, however
        # large block_size is (one block may cover the whole axis).
        return xp.take(p, xp.asarray(np.arange(dim, dtype=np.int64) // block_size), axis=ax)
    if p.ndim != 1 or p.shape[0] != shape[ax]:
        raise ValueError(
            f"{what} of shape {list(p.shape)} must be a scalar or a 1-D tensor of length {shape[ax]} "
            f"(axis {ax} of input {list(shape)})"
        )
    bshape = [1] * rank
    bshape[ax] = shape[ax]
    return p.reshape(bshape)


def quantize(
    xp: Any,
    x: Any,
    scale: Any,
    zero_point: Any,
    out_dtype: np.dtype,
    *,
    axis: int = 1,
    block_size: int = 0,
    saturate: int = 1,
    precision: np.dtype | None = None,
) -> Any:
    """saturate(round(x / scale) + zero_point) in ``out_dtype`` (int) or cast(x / scale + zp) (float)."""
    shape = tuple(x.shape)
    s = _broadcast_param(xp, scale, shape, axis, block_size, "the scale")
    if precision is None:
        # The scale's type sets the division's precision; narrow float formats divide in float32.
        precision = scale.dtype if scale.dtype in _DIVIDE_TYPES else _F32
    rng = _int_range(out_dtype)
    if xp is np and rng is not None and precision == _F32 and out_dtype in _SMALL_INTS and x.dtype in _DIVIDE_TYPES:
        # 8- and 16-bit results: float32 holds every value that survives the clip exactly (the
        # rounded quotient is an integer, the zero point too; larger magnitudes clip either
        # way), so the rounding, the shift and the clip run in place on the float32 quotient,
        # without the float64 copies (256x56x56 float32 to uint8: 3307 -> 689 us; onnxruntime 90).
        q = np.empty(shape, _F32)  # an array even for a scalar x (the ufuncs' out=)
        np.divide(x.astype(_F32, copy=False), s.astype(_F32, copy=False), out=q)
        zp = None if zero_point is None else _broadcast_param(xp, zero_point, shape, axis, block_size, "the zero point")
        if q.ndim and (zp is None or not (zp & 1).any()):
            return _rounded_into_low_bits(q, zp, rng, out_dtype)
        np.rint(q, out=q)
        if zp is not None:
            q += zp.astype(_F32)
        return np_clip(q, _F32.type(rng[0]), _F32.type(rng[1]), out=q).astype(out_dtype)
    q = x.astype(precision, copy=False) / s.astype(precision, copy=False)
    if rng is not None:
        r = xp.rint(q.astype(_F64))
        if zero_point is not None:
            r = r + _broadcast_param(xp, zero_point, shape, axis, block_size, "the zero point").astype(_F64)
        return xp.clip(r, rng[0], rng[1]).astype(out_dtype)
    v = q.astype(_F32)
    if zero_point is not None:
        v = v + _broadcast_param(xp, zero_point, shape, axis, block_size, "the zero point").astype(_F32)
    return cast_array(xp, v, out_dtype, saturate)


_TWO_23 = float(1 << 23)


def _rounded_into_low_bits(q: np.ndarray, zp: np.ndarray | None, rng: tuple[int, int], out_dtype: np.dtype) -> Any:
    """saturate(rint(q) + zp) as the 8- or 16-bit ``out_dtype``, for float32 quotients q (in
    place) and an even zero point: q + (2^23 + offset + zp) lands in [2^23, 2^24), where float32
    steps by exactly 1, so the addition itself rounds to nearest even; with zp even, that is
    rint(q) + zp. Clipped there, the result is the low bits of the float's mantissa (offset 2^16
    or 2^8 for signed types, so they hold the two's complement), taken by an integer cast: two
    passes fewer than rint, add, clip and a float-to-int cast (128x512 to uint8 45 -> 38 us)."""
    bits = out_dtype.itemsize * 8
    base = _TWO_23 + (1 << bits if rng[0] < 0 else 0)
    if zp is None:
        q += _F32.type(base)
    else:
        q += (zp.astype(np.float64) + base).astype(_F32)  # exact: under 2^24
    np_clip(q, _F32.type(base + rng[0]), _F32.type(base + rng[1]), out=q)
    low = q.view(np.uint32).astype(np.uint16 if bits == 16 else np.uint8)
    return low.view(out_dtype)


def dequantize(
    xp: Any, x: Any, scale: Any, zero_point: Any, out_dtype: np.dtype, *, axis: int = 1, block_size: int = 0
) -> Any:
    """(x - zero_point) * scale, computed in float32 (float64 for float64 outputs) and cast."""
    shape = tuple(x.shape)
    cdt = _F64 if out_dtype == _F64 else _F32
    if xp is np and x.dtype in _SMALL_INTS and cdt == _F32:
        # 8- and 16-bit inputs and zero points are exact in float32, and so is their difference:
        # the same values as the int64 subtraction, in three float32 passes (256x56x56 uint8:
        # 2650 -> 344 us; onnxruntime 146).
        v = x.astype(_F32)
        if zero_point is not None:
            v -= _broadcast_param(xp, zero_point, shape, axis, block_size, "the zero point").astype(_F32)
        v *= _broadcast_param(xp, scale, shape, axis, block_size, "the scale").astype(_F32)
        return v.astype(out_dtype, copy=False)
    if _int_range(x.dtype) is not None:
        v = x.astype(np.int64)
        if zero_point is not None:
            v = v - _broadcast_param(xp, zero_point, shape, axis, block_size, "the zero point").astype(np.int64)
        v = v.astype(cdt)
    else:
        v = x.astype(cdt)
        if zero_point is not None:
            v = v - _broadcast_param(xp, zero_point, shape, axis, block_size, "the zero point").astype(cdt)
    s = _broadcast_param(xp, scale, shape, axis, block_size, "the scale").astype(cdt)
    return (v * s).astype(out_dtype, copy=False)


def _q_out_dtype(zero_point: Any, output_dtype: int) -> np.dtype:
    if output_dtype:
        dt = dtypes.np_dtype(output_dtype)
        if zero_point is not None and zero_point.dtype != dt:
            raise TypeError(f"output_dtype {dt} differs from the zero point's type {zero_point.dtype}")
        return dt
    return zero_point.dtype if zero_point is not None else np.dtype(np.uint8)


# -- QuantizeLinear ------------------------------------------------------------------------------


@op("QuantizeLinear", 10)
def quantize_linear_10(xp: Any, x: Any, y_scale: Any, y_zero_point: Any = None) -> Any:
    if y_scale.size != 1:
        raise ValueError(f"QuantizeLinear-10 supports only per-tensor scales, got shape {list(y_scale.shape)}")
    return quantize(xp, x, y_scale, y_zero_point, _q_out_dtype(y_zero_point, 0), precision=_F32)


@op("QuantizeLinear", 13)
def quantize_linear_13(xp: Any, x: Any, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1) -> Any:
    return quantize(xp, x, y_scale, y_zero_point, _q_out_dtype(y_zero_point, 0), axis=axis, precision=_F32)


@op("QuantizeLinear", 19)
def quantize_linear_19(
    xp: Any, x: Any, y_scale: Any, y_zero_point: Any = None, *, axis: int = 1, saturate: int = 1
) -> Any:
    return quantize(xp, x, y_scale, y_zero_point, _q_out_dtype(y_zero_point, 0), axis=axis, saturate=saturate)


@op("QuantizeLinear", 21)
def quantize_linear_21(
    xp: Any,
    x: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    saturate: int = 1,
) -> Any:
    return quantize(
        xp,
        x,
        y_scale,
        y_zero_point,
        _q_out_dtype(y_zero_point, output_dtype),
        axis=axis,
        block_size=block_size,
        saturate=saturate,
    )


@op("QuantizeLinear", 23)
def quantize_linear(
    xp: Any,
    x: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
    precision: int = 0,
    saturate: int = 1,
) -> Any:
    return quantize(
        xp,
        x,
        y_scale,
        y_zero_point,
        _q_out_dtype(y_zero_point, output_dtype),
        axis=axis,
        block_size=block_size,
        saturate=saturate,
        precision=dtypes.np_dtype(precision) if precision else None,
    )


# -- DequantizeLinear ----------------------------------------------------------------------------


def _dq_out_dtype(scale: Any, output_dtype: int) -> np.dtype:
    if output_dtype:
        return dtypes.np_dtype(output_dtype)
    return _dq_default_dtype(scale.dtype)


@functools.lru_cache(maxsize=64)
def _dq_default_dtype(scale_dtype: np.dtype) -> np.dtype:
    """The scale's own float type, float32 for float8 or non-float scales. Cached: the checks
    cost about 5 us a call, a quarter of a 64K-value DequantizeLinear."""
    if not _is_float_type(scale_dtype) or "float8" in str(scale_dtype):
        return _F32
    return scale_dtype


@op("DequantizeLinear", 10)
def dequantize_linear_10(xp: Any, x: Any, x_scale: Any, x_zero_point: Any = None) -> Any:
    if x_scale.size != 1:
        raise ValueError(f"DequantizeLinear-10 supports only per-tensor scales, got shape {list(x_scale.shape)}")
    return dequantize(xp, x, x_scale, x_zero_point, _F32)


@op("DequantizeLinear", 13)
def dequantize_linear_13(xp: Any, x: Any, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1) -> Any:
    return dequantize(xp, x, x_scale, x_zero_point, _dq_out_dtype(x_scale, 0), axis=axis)


@op("DequantizeLinear", 21)
def dequantize_linear_21(
    xp: Any, x: Any, x_scale: Any, x_zero_point: Any = None, *, axis: int = 1, block_size: int = 0
) -> Any:
    return dequantize(xp, x, x_scale, x_zero_point, _dq_out_dtype(x_scale, 0), axis=axis, block_size=block_size)


@op("DequantizeLinear", 23)
def dequantize_linear(
    xp: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any = None,
    *,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> Any:
    return dequantize(
        xp, x, x_scale, x_zero_point, _dq_out_dtype(x_scale, output_dtype), axis=axis, block_size=block_size
    )


# -- DynamicQuantizeLinear -----------------------------------------------------------------------


def dynamic_quantization(xp: Any, x: Any) -> tuple[Any, np.float32, np.float32]:
    """x as float32 and the uint8 scale and zero point DynamicQuantizeLinear picks for it."""
    xf = x.astype(_F32, copy=False)
    lo = min(float(xf.min()), 0.0) if xf.size else 0.0
    hi = max(float(xf.max()), 0.0) if xf.size else 0.0
    scale = np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255.0))
    if scale == 0:
        # All zeros (or empty): the formula divides by zero; use scale 1 as onnxruntime does, so
        # dequantizing the output still gives the input back.
        scale = np.float32(1.0)
    zp = np.float32(np.clip(np.rint(np.float32(0.0) - np.float32(lo) / scale), 0, 255))
    return xf, scale, zp


@op("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(xp: Any, x: Any) -> Any:
    xf, scale, zp = dynamic_quantization(xp, x)
    return quantize_uint8(xp, xf, scale, zp), xp.asarray(scale, dtype=_F32), xp.asarray(np.uint8(zp))


def quantize_uint8(xp: Any, xf: Any, scale: np.float32, zp: np.float32) -> Any:
    """DynamicQuantizeLinear's output: saturate(rint(xf / scale) + zp) as uint8."""
    return xp.clip(xp.rint(xf / scale) + zp, 0, 255).astype(np.uint8)


# -- integer / quantized linear algebra ----------------------------------------------------------


def _shifted(x: Any, zp: Any, zp_shape: tuple[int, ...] | None = None) -> Any:
    """x - zero_point exactly, as float64 (or float32-exact values for float8 inputs)."""
    v = x.astype(_F64)
    if zp is not None:
        z = zp.astype(_F64)
        if zp_shape is not None:
            z = z.reshape(zp_shape)
        v = v - z
    return v


def _row_param_shape(p: Any, a: Any) -> tuple[int, ...] | None:
    """Shape making a per-row parameter of matrix ``a`` (..., M, K) broadcast: a 1-D [M] becomes [M, 1]."""
    if p is None or p.size == 1:
        return ()
    if p.ndim == 1 and a.ndim >= 2 and p.shape[0] == a.shape[-2]:
        return (p.shape[0], 1)
    return tuple(p.shape)


def _col_param_shape(p: Any) -> tuple[int, ...] | None:
    if p is None or p.size == 1:
        return ()
    return tuple(p.shape)


def _wrap_int32(xp: Any, acc: Any) -> Any:
    """An exact integer-valued float64 accumulator as int32, wrapping like 32-bit accumulation."""
    return acc.astype(np.int64).astype(np.int32)


# float32 holds every integer of magnitude up to 2**24, so products of small integers and their
# sums are exact in float32 while no partial sum can leave that range: BLAS's single-precision
# GEMM then gives the integer accumulator itself, at twice float64's speed and half its memory.
_F32_EXACT = float(1 << 24)


def _largest_shift(dt: np.dtype, zero_point: Any) -> float:
    """max |v - z| over the values v of integer type ``dt`` and the zero points z."""
    rng = _int_range(dt)
    if rng is None:
        return float("inf")
    if zero_point is None or zero_point.size == 0:
        return float(max(rng[1], -rng[0]))
    z = np.asarray(zero_point).astype(_F64)
    return max(rng[1] - float(z.min()), float(z.max()) - rng[0])


def _shifted_weights(w: Any, w_zero_point: Any, wz_shape: tuple[int, ...] | None, dt: np.dtype) -> Any:
    """w - w_zero_point in ``dt``, cached for constant weights."""

    def build() -> Any:
        v = w.astype(dt)
        if w_zero_point is not None:
            v -= w_zero_point.astype(dt).reshape(wz_shape)
        return v

    sources = (w,) if w_zero_point is None else (w, w_zero_point)
    return derived(sources, ("shifted-weights", dt, wz_shape), build)


def _weight_abs_sum(w: Any, w_zero_point: Any, wz_shape: tuple[int, ...] | None) -> float:
    """The largest sum of |w - w_zero_point| over one output channel's weights."""

    def build() -> float:
        v = _shifted_weights(w, w_zero_point, wz_shape, _F64)
        return float(np.abs(np.asarray(v)).reshape(v.shape[0], -1).sum(axis=1).max(initial=0.0))

    sources = (w,) if w_zero_point is None else (w, w_zero_point)
    return derived(sources, ("abs-row-sum", wz_shape), build)


def shifted_columns(b: Any, b_zero_point: Any, dt: np.dtype) -> Any:
    """b - b_zero_point in ``dt`` (the zero point broadcasting against b's columns), cached for
    constant operands."""

    def build() -> Any:
        v = b.astype(dt)
        if b_zero_point is not None:
            v -= b_zero_point.astype(dt)
        return v

    sources = (b,) if b_zero_point is None else (b, b_zero_point)
    return derived(sources, ("shifted-columns", dt, _shape_of(b_zero_point)), build)


def largest_column_sum(b: Any, b_zero_point: Any) -> float:
    """max over b's columns of sum |b - b_zero_point| (inf for a 1-D b), cached for constants."""

    def build() -> float:
        v = np.asarray(shifted_columns(b, b_zero_point, _F64))
        return float(np.abs(v).sum(axis=-2).max(initial=0.0)) if v.ndim >= 2 else float("inf")

    sources = (b,) if b_zero_point is None else (b, b_zero_point)
    return derived(sources, ("abs-column-sum", _shape_of(b_zero_point)), build)


def _largest_magnitude(v: Any) -> float:
    """max |v| (0 when empty), once per constant: a bias checked on every run otherwise."""
    return derived((v,), ("largest-magnitude",), lambda: float(np.abs(v).max(initial=0)))


def _shape_of(p: Any) -> tuple[int, ...] | None:
    return None if p is None else tuple(p.shape)


def integer_matmul(xp: Any, a: Any, a_zero_point: Any, b: Any, b_zero_point: Any) -> Any:
    """(a - a_zero_point) @ (b - b_zero_point) exactly, as integer-valued float32 where every
    sum fits float32's integers (see _F32_EXACT), else float64. ``a_zero_point`` broadcasts
    against a's rows (shape () or (M, 1)), ``b_zero_point`` against b's columns."""
    # On a device, float64 as before: the bound would read the operands back to the host.
    fits = xp is np and _largest_shift(a.dtype, a_zero_point) * largest_column_sum(b, b_zero_point) < _F32_EXACT
    dt = _F32 if fits else _F64
    av = a.astype(dt)
    if a_zero_point is not None:
        av -= a_zero_point.astype(dt)
    return stacked_matmul(xp, av, shifted_columns(b, b_zero_point, dt))


@op("MatMulInteger", 10)
def matmul_integer(xp: Any, A: Any, B: Any, a_zero_point: Any = None, b_zero_point: Any = None) -> Any:  # noqa: N803
    za = None if a_zero_point is None else a_zero_point.reshape(_row_param_shape(a_zero_point, A))
    zb = None if b_zero_point is None else b_zero_point.reshape(_col_param_shape(b_zero_point))
    return _wrap_int32(xp, integer_matmul(xp, A, za, B, zb))


def _requantize_in_place(xp: Any, v: Any, factor: Any, y_zero_point: Any, rng: tuple[int, int]) -> None:
    """v (float32 accumulators) -> clip(rint(v * factor) + y_zero_point) in place: what
    ``_requantize`` computes before its final cast."""
    v *= factor.astype(_F32, copy=False)
    xp.rint(v, out=v)
    v += y_zero_point.astype(_F32)
    xp.clip(v, rng[0], rng[1], out=v)


def _requantize(xp: Any, acc: Any, factor: Any, y_zero_point: Any) -> Any:
    """Round acc * factor to the output's integer grid, add its zero point and saturate."""
    out_dtype = y_zero_point.dtype
    rng = _int_range(out_dtype)
    if rng is None:  # float8 output
        v = acc * factor
        return cast_array(xp, (v + y_zero_point.astype(_F64)).astype(_F32), out_dtype, 1)
    # In float32, as onnxruntime requantizes (the int32 accumulator times a float32 scale,
    # rounded half to even): a float64 product rounds differently near .5 about once in 40
    # random convolutions.
    f32 = xp.asarray(factor).astype(_F32)
    if tuple(np.broadcast_shapes(acc.shape, f32.shape, y_zero_point.shape)) == tuple(acc.shape):
        # In place (over the accumulator when it is float32: callers hand over a fresh array):
        # four passes and one cast. Beyond 2**24 the zero point's addition may round, but such
        # values saturate either way.
        v = acc if acc.dtype == _F32 else acc.astype(_F32)
        _requantize_in_place(xp, v, f32, y_zero_point, rng)
        return v.astype(out_dtype)
    v = acc.astype(_F32) * f32
    r = xp.rint(v).astype(_F64) + y_zero_point.astype(_F64)
    return xp.clip(r, rng[0], rng[1]).astype(out_dtype)


@op("QLinearMatMul", 10)
def qlinear_matmul(
    xp: Any,
    a: Any,
    a_scale: Any,
    a_zero_point: Any,
    b: Any,
    b_scale: Any,
    b_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
) -> Any:
    za = None if a_zero_point is None else a_zero_point.reshape(_row_param_shape(a_zero_point, a))
    zb = None if b_zero_point is None else b_zero_point.reshape(_col_param_shape(b_zero_point))
    acc = integer_matmul(xp, a, za, b, zb)
    # Scales multiply in float32 as the quantized kernels of other runtimes do, then apply in float64.
    sa = a_scale.astype(_F32).reshape(_row_param_shape(a_scale, a))
    sb = b_scale.astype(_F32).reshape(_col_param_shape(b_scale))
    factor = ((sa * sb) / y_scale.astype(_F32).reshape(_col_param_shape(y_scale))).astype(_F64)
    return _requantize(xp, acc, factor, y_zero_point.reshape(_col_param_shape(y_zero_point)))


def _conv_integer(
    xp: Any,
    x: Any,
    w: Any,
    x_zero_point: Any,
    w_zero_point: Any,
    attrs: dict[str, Any],
    what: str,
    ctx: Any = None,
    bias: Any = None,
    epilogue: Any = None,
) -> tuple[Any, bool]:
    """The exact integer accumulator of (x - x_zero_point) conv (w - w_zero_point), as
    integer-valued float32 when every sum fits float32's integers (see _F32_EXACT), else
    float64; and whether it holds + ``bias`` (int32, one per output channel) and has been
    through ``epilogue`` (in place, on blocks while in cache where the path allows): both
    only in float32, where the bias's magnitude still keeps every sum exact."""
    if x_zero_point is not None and x_zero_point.size != 1:
        raise ValueError(f"{what}: x_zero_point must be a scalar, got shape {list(x_zero_point.shape)}")
    m = w.shape[0]
    wz_shape: tuple[int, ...] | None = None
    if w_zero_point is not None and w_zero_point.size != 1:
        if w_zero_point.reshape(-1).shape[0] != m:
            raise ValueError(
                f"{what}: w_zero_point must be a scalar or hold one value per output channel ({m}), "
                f"got shape {list(w_zero_point.shape)}"
            )
        wz_shape = (m,) + (1,) * (w.ndim - 1)
    elif w_zero_point is not None:
        wz_shape = ()
    bound = float("inf")
    if xp is np:  # on a device, float64 as before: the bound would read the weights back to the host
        bound = _largest_shift(x.dtype, x_zero_point) * _weight_abs_sum(w, w_zero_point, wz_shape)
    dt = _F32 if bound < _F32_EXACT else _F64
    xv = x.astype(dt)
    if x_zero_point is not None:
        xv -= x_zero_point.astype(dt).reshape(())
    wv = _shifted_weights(w, w_zero_point, wz_shape, dt)
    fused = dt == _F32 and (bias is None or bound + _largest_magnitude(bias) < _F32_EXACT)
    b = None
    if fused and bias is not None:
        b = derived((bias,), ("float32-bias",), lambda: bias.reshape(-1).astype(_F32))
    # Padding the shifted input with 0 equals padding the raw input with its zero point.
    acc = conv_nd(xp, xv, wv, b, **attrs, ctx=ctx, exact=True, epilogue=epilogue if fused else None)
    return acc, fused


@op("ConvInteger", 10)
def conv_integer(
    xp: Any,
    x: Any,
    w: Any,
    x_zero_point: Any = None,
    w_zero_point: Any = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    return _wrap_int32(xp, _conv_integer(xp, x, w, x_zero_point, w_zero_point, attrs, "ConvInteger", ctx)[0])


@op("QLinearConv", 10)
def qlinear_conv(
    xp: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    w: Any,
    w_scale: Any,
    w_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    B: Any = None,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    attrs = dict(
        auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape, pads=pads, strides=strides
    )
    m = w.shape[0]
    nd = x.ndim - 2
    if B is not None and B.reshape(-1).shape[0] != m:
        raise ValueError(f"QLinearConv: bias B must have {m} values (output channels), got shape {list(B.shape)}")
    if w_scale.size not in (1, m):
        raise ValueError(
            f"QLinearConv: w_scale must be a scalar or hold {m} values (output channels), got {list(w_scale.shape)}"
        )
    ws = w_scale.astype(_F32).reshape(() if w_scale.size == 1 else (1, m) + (1,) * nd)
    factor = (x_scale.astype(_F32).reshape(()) * ws) / y_scale.astype(_F32).reshape(())
    yz = y_zero_point.reshape(())
    rng = _int_range(yz.dtype)
    epilogue = None
    if factor.size == 1 and rng is not None:
        # One scale for every output: requantized block by block while the block is in cache.
        def epilogue(block: Any) -> None:
            _requantize_in_place(xp, block, factor, yz, rng)

    acc, fused = _conv_integer(xp, x, w, x_zero_point, w_zero_point, attrs, "QLinearConv", ctx, B, epilogue)
    if fused and epilogue is not None:
        return acc.astype(yz.dtype)
    if B is not None and not fused:
        # The int32 sum acc + B rounded to float32, as onnxruntime converts it: float32 addition
        # rounds the exact sum once when both terms are exact in float32.
        if acc.dtype == _F32 and _largest_magnitude(B) < _F32_EXACT:
            acc += B.astype(_F32).reshape((1, m) + (1,) * nd)
        else:
            acc = acc + B.astype(_F64).reshape((1, m) + (1,) * nd)
    return _requantize(xp, acc, factor, yz)
