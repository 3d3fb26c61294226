"""Neural-network kernels: Gemm/MatMul, softmax family, normalizations, LRN, Dropout, losses,
Attention, RotaryEmbedding and the small fused ops (SwiGLU, CausalConvWithState).

Half-precision inputs (float16, bfloat16) are computed in float32 and cast back: statistics and
exponentials in half precision lose more than the tolerance of any consumer allows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..model import dtypes
from ._blas import few_row_product, one_row_operand, stacked_matmul
from ._compat import broadcasts_into, host_ints, host_scalar, normalize_axis, numpy_core, require_rank
from ._derived import in_dtype
from ._unbuffered import per_row_passes
from .registry import op

# numpy's einsum without its Python wrapper (which only handles ``optimize``): ~0.7 us a call.
_einsum = getattr(numpy_core("multiarray"), "c_einsum", np.einsum)


def _cdt(dtype: Any) -> np.dtype:
    """Compute dtype: float32 / float64 as they are, everything narrower in float32."""
    dt = np.dtype(dtype)
    if dt == np.float64 or dt == np.float32:
        return dt
    return np.dtype(np.float32)


def _up(x: Any) -> Any:
    return x.astype(_cdt(x.dtype), copy=False)


# -- matrix products -----------------------------------------------------------------------------


@op("MatMul", 1)
def matmul(xp: Any, a: Any, b: Any) -> Any:
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"MatMul needs inputs of rank >= 1, got shapes {list(a.shape)} and {list(b.shape)}")
    if a.dtype.kind == "f" and a.dtype.itemsize >= 4 or a.dtype.kind in "iub":
        return stacked_matmul(xp, a, b)
    # float16 / bfloat16: no BLAS path in numpy (and ml_dtypes returns float32); accumulate in
    # float32 and round once.
    return stacked_matmul(xp, in_dtype(a, np.dtype(np.float32)), in_dtype(b, np.dtype(np.float32))).astype(a.dtype)


@op("Gemm", 7)
def gemm(
    xp: Any,
    a: Any,
    b: Any,
    c: Any = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,  # noqa: N803 - spec name
    transB: int = 0,  # noqa: N803 - spec name
) -> Any:
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"Gemm needs 2-D A and B, got shapes {list(a.shape)} and {list(b.shape)}")
    dt = a.dtype
    narrow = dt.kind == "f" and dt.itemsize < 4 or dt.kind not in "fiub"
    if narrow:  # float16 / bfloat16 accumulate in float32, like MatMul (constants converted once)
        f32 = np.dtype(np.float32)
        a, b = in_dtype(a, f32), in_dtype(b, f32)
        c = None if c is None else in_dtype(c, f32)
    if transA:
        a = a.T
    if transB:
        b = b.T
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"Gemm: A' {list(a.shape)} and B' {list(b.shape)} (after transA/transB) do not chain")
    y = None
    if xp is np:
        if a.shape[0] == 1:
            b = one_row_operand(b)
        else:
            y = few_row_product(a, b)
    if y is None:
        y = xp.matmul(a, b)
    t = y.dtype.type
    if alpha != 1.0:
        y *= t(alpha)
    if c is not None and beta != 0.0:
        if beta != 1.0:
            y += c * t(beta)
        else:
            y += c
    return y.astype(dt, copy=False) if narrow else y


# -- softmax family ------------------------------------------------------------------------------


def _softmax(xp: Any, x: Any, axis: int, log: bool) -> Any:
    return _softmax_checked(xp, x, axis, log, proof=False)[0]


def _softmax_checked(xp: Any, x: Any, axis: int, log: bool, proof: bool = True) -> tuple[Any, bool]:
    """Softmax, and whether the result is known to hold no NaN (True only where the fast path
    saw finite input and every row's sum of exponentials well above zero; with ``proof``
    False, never: the caller does not ask)."""
    if x.size == 0:
        return x.copy(), True
    if (
        log
        and xp is np
        and axis == x.ndim - 1
        and x.dtype in (np.float32, np.float64)
        and x.flags.c_contiguous
        and x.size >= _LOG_SOFTMAX_ROWS_MIN_VALUES
    ):
        y = _log_softmax_rows(x)
        if y is not None:
            return y, False
    if not log and xp is np and axis == x.ndim - 1 and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous:
        if x.size <= _SOFTMAX_SMALL_VALUES and x.size <= _SOFTMAX_SMALL_ROWS * x.shape[-1]:
            y, top = _softmax_small(x)
            # A row with a finite maximum holds no NaN or +inf, and its sum is at least 1.
            return y, proof and bool(np.isfinite(top).all())
        if x.size == x.shape[-1]:
            y = _softmax_one_row(x)
            if y is not None:
                return y, False
        else:
            found = _softmax_rows_shared_shift(x)
            if found is not None:
                return found
    return _softmax_general(xp, x, axis, log), False


def _softmax_general(xp: Any, x: Any, axis: int, log: bool) -> Any:
    # Elementwise steps run in x's own precision (as the spec's function body does); the sum
    # accumulates in float32 or wider so long axes do not lose half-precision bits.
    m = xp.max(x, axis=axis, keepdims=True)
    if not bool(xp.isfinite(m).all()):
        # Rare: an all -inf row shifts by 0 (exp gives zeros, 0 / 0 is NaN); a row holding +inf
        # keeps its shift, so that inf - inf makes the whole row NaN, as the spec's function body
        # and onnxruntime do.
        m = xp.where(m == -np.inf, x.dtype.type(0), m)
    e = x - m
    acc = _cdt(x.dtype)
    if log:
        total = xp.sum(xp.exp(e.astype(acc, copy=False)), axis=axis, keepdims=True)
        return e - xp.log(total).astype(x.dtype, copy=False)
    xp.exp(e, out=e)  # e is a fresh array: exponentiate in place
    total = xp.sum(e, axis=axis, keepdims=True, dtype=acc).astype(x.dtype, copy=False)
    e /= total  # an all -inf row is NaN, as in onnxruntime (the session runs under errstate)
    return e


# Arrays of at most this many values in at most this many rows (a decoder step's attention
# scores: heads x past length) take _softmax_small, where per-call costs are all there is. Over
# many short rows the row sums as one BLAS product win: 12x1x257 9.1 against 12.6 us, 12x1x1025
# 18.8 against 20.1, but 12x16x16 22.1 against 13.6.
_SOFTMAX_SMALL_VALUES = 1 << 13
_SOFTMAX_SMALL_ROWS = 64


def _softmax_small(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over the last axis of a small host array in five ufunc calls (reductions called
    on the ufuncs, without the method wrappers' ~1 us each): 4x1x33 15.5 -> 6 us. Rows shift by
    their own maximum; non-finite rows need no special case: an all -inf row gives
    (-inf) - (-inf) = NaN, a row holding +inf or NaN NaN everywhere, as the general form and
    onnxruntime give them. Returns the softmax and the rows' maxima."""
    top = np.maximum.reduce(x, axis=-1, keepdims=True)
    e = np.subtract(x, top)
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=-1, keepdims=True)
    return e, top


# A row whose sum of exp(x - shift) is at least this many times its length has its maximum
# within 30 of the shift: its terms down to e-25 of the row's largest stay normal floats.
_SAFE_ROW_SUM = math.exp(-30.0)


def _softmax_one_row(x: np.ndarray) -> np.ndarray | None:
    """Softmax of a single row (a classifier's output): five numpy calls, where the general
    forms make eight or more (each call right after the classifier's GEMM costs several us more
    than usual). None (use the general form) for non-finite input."""
    top = x.max()
    if not np.isfinite(top):
        return None
    e = x - top
    np.exp(e, out=e)
    e *= x.dtype.type(1) / e.sum()
    return e


# Arrays of more values than this run the row-wise softmax a block of rows at a time, each
# block's five passes in L2: ViT-B's 12x197x197 attention scores (1.9 MB) 771 -> 535 us,
# 16x256x256 1754 -> 1178, BERT-base's 8x12x128x128 2268 -> 1757 (alone, hot). Smaller ones
# stay in cache anyway, and their extra calls cost more (12x128x128: 169 -> 188 us in blocks).
_SOFTMAX_BLOCKED_MIN_VALUES = 1 << 18
_SOFTMAX_BLOCK_VALUES = 1 << 16


def _row_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The last axis's rows of ``x`` (2-D), a fresh result of their shape, ones for BLAS row
    sums, and the rows a block takes (all of them below _SOFTMAX_BLOCKED_MIN_VALUES)."""
    cols = x.shape[-1]
    x2 = x.reshape(-1, cols)
    step = max(1, _SOFTMAX_BLOCK_VALUES // cols) if x.size > _SOFTMAX_BLOCKED_MIN_VALUES else x2.shape[0]
    return x2, np.empty_like(x2), _row_vector(cols, 1.0, x.dtype), step


def _shifted_exp(xb: np.ndarray, e: np.ndarray, ones: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """e = exp(xb - top) for the block's maximum top; returns top, the rows' sums of e (one
    BLAS product: sum(axis=1) is 10x slower) and which rows sum too little for the shared
    shift (to be redone with their own). None where top is not finite."""
    top = xb.max()
    if not np.isfinite(top):
        return None
    np.subtract(xb, top, out=e)
    np.exp(e, out=e)
    total = e @ ones
    return top, total, total < _SAFE_ROW_SUM * xb.shape[1]


def _softmax_rows_shared_shift(x: np.ndarray) -> tuple[np.ndarray, bool] | None:
    """Softmax over the last axis of a contiguous host array, a block of rows at a time, each
    block shifted by its own maximum rather than each row's (softmax is shift-invariant): one
    SIMD reduction instead of a short one per row, flat elementwise passes and row sums as one
    BLAS product, all on a block that stays in cache. Rows whose own maximum lies far below
    their block's (masked rows) are redone with their own shift, so the result is the same as
    the per-row form. None (use that form) for non-finite input; else the result and whether
    no row was redone (then no row can be NaN: each block's maximum is finite, so x holds no
    NaN or +inf, and every row's sum is positive)."""
    x2, out, ones, step = _row_blocks(x)
    clean = True
    for r0 in range(0, x2.shape[0], step):
        xb, e = x2[r0 : r0 + step], out[r0 : r0 + step]
        found = _shifted_exp(xb, e, ones)
        if found is None:
            return None
        _, total, low = found
        if low.any():
            clean = False
            rows = xb[low]
            shifted = rows - rows.max(axis=1, keepdims=True)
            np.exp(shifted, out=shifted)
            e[low] = shifted
            total[low] = shifted @ ones  # a BLAS product, as above: sum(axis=1) is 10x slower
        np.divide(x.dtype.type(1), total, out=total)
        e *= total[:, None]
    return out.reshape(x.shape), clean


# LogSoftmax over the last axis takes _log_softmax_rows from this many values (below, its
# extra calls cost more than the passes it saves).
_LOG_SOFTMAX_ROWS_MIN_VALUES = 1 << 12


def _log_softmax_rows(x: np.ndarray) -> np.ndarray | None:
    """LogSoftmax over the last axis of a contiguous host array as x - lse per row, where
    lse = shift + log(sum(exp(x - shift))): as _softmax_rows_shared_shift, one shift per block
    (a SIMD maximum), the exponentials in a reused temporary, the sums as one BLAS product,
    rows far below their block's maximum redone with their own (so the result is the per-row
    form's, up to rounding). Three passes and two reductions where the general form makes five
    over fresh arrays (128x512 float32 145 -> 110 us; onnxruntime 19-28). None (use that
    form) for non-finite input."""
    x2, out, ones, step = _row_blocks(x)
    for r0 in range(0, x2.shape[0], step):
        xb, e = x2[r0 : r0 + step], out[r0 : r0 + step]
        found = _shifted_exp(xb, e, ones)
        if found is None:
            return None
        top, total, low = found
        shift: Any = top
        if low.any():
            rows = xb[low]
            own = rows.max(axis=1)
            shifted = rows - own[:, None]  # an all -inf row gives NaN, as the general form
            np.exp(shifted, out=shifted)
            total[low] = shifted @ ones
            shift = np.full_like(total, top)
            shift[low] = own
        np.log(total, out=total)
        total += shift
        np.subtract(xb, total[:, None], out=e)
    return out.reshape(x.shape)


def _coerced_2d(xp: Any, x: Any, axis: int, log: bool) -> Any:
    """Softmax before opset 13: flatten to 2-D at ``axis`` and normalize each row."""
    require_rank(x, 1, "LogSoftmax" if log else "Softmax")  # as the spec's shape inference says
    axis = normalize_axis(axis, x.ndim)
    rows = math.prod(x.shape[:axis])  # math.prod: np.prod on a shape tuple costs ~5 us a call
    cols = math.prod(x.shape[axis:])
    flat = x.reshape(rows, cols)
    return _softmax(xp, flat, 1, log).reshape(x.shape)


@op("Softmax", 1)
def softmax_1(xp: Any, x: Any, *, axis: int = 1) -> Any:
    return _coerced_2d(xp, x, axis, False)


@op("Softmax", 13)
def softmax(xp: Any, x: Any, *, axis: int = -1) -> Any:
    require_rank(x, 1, "Softmax")
    return _softmax(xp, x, normalize_axis(axis, x.ndim), False)


@op("LogSoftmax", 1)
def log_softmax_1(xp: Any, x: Any, *, axis: int = 1) -> Any:
    return _coerced_2d(xp, x, axis, True)


@op("LogSoftmax", 13)
def log_softmax(xp: Any, x: Any, *, axis: int = -1) -> Any:
    require_rank(x, 1, "LogSoftmax")
    return _softmax(xp, x, normalize_axis(axis, x.ndim), True)


# -- BatchNormalization --------------------------------------------------------------------------


def _channel_shape(x: Any) -> tuple[int, ...]:
    return (1, -1) + (1,) * max(x.ndim - 2, 0)


def _bn_check(x: Any, params: list[Any], spatial: bool) -> None:
    if x.ndim < 2:
        raise ValueError(f"BatchNormalization needs X of rank >= 2 (N, C, ...), got shape {list(x.shape)}")
    want = (x.shape[1],) if spatial else tuple(x.shape[1:])
    for name, p in zip(("scale", "B", "mean", "var"), params):
        if tuple(p.shape) != want and not (not spatial and tuple(p.shape) == (x.shape[1],)):
            raise ValueError(f"BatchNormalization {name} must have shape {list(want)}, got {list(p.shape)}")


def _bn_inference(xp: Any, x: Any, scale: Any, b: Any, mean: Any, var: Any, epsilon: float, spatial: bool) -> Any:
    cdt = _cdt(x.dtype)
    shape = _channel_shape(x) if spatial or mean.ndim == 1 else (1, *mean.shape)
    k = _up(scale).astype(cdt, copy=False) / xp.sqrt(_up(var).astype(cdt, copy=False) + cdt.type(epsilon))
    shift = _up(b).astype(cdt, copy=False) - _up(mean).astype(cdt, copy=False) * k
    y = x.astype(cdt, copy=False) * k.reshape(shape)
    y += shift.reshape(shape)
    return y.astype(x.dtype, copy=False)


def _bn_training(
    xp: Any, x: Any, scale: Any, b: Any, mean: Any, var: Any, epsilon: float, momentum: float, spatial: bool
) -> tuple[Any, Any, Any, Any, Any]:
    """(Y, running_mean, running_var, batch mean, batch var): Y uses the batch statistics."""
    cdt = _cdt(x.dtype)
    work = x.astype(cdt, copy=False)
    axes = (0, *range(2, x.ndim)) if spatial else (0,)
    cur_mean = work.mean(axis=axes)
    cur_var = work.var(axis=axes)
    shape = _channel_shape(x) if spatial else (1, *cur_mean.shape)
    k = _up(scale).astype(cdt, copy=False).reshape(cur_mean.shape) / xp.sqrt(cur_var + cdt.type(epsilon))
    y = (work - cur_mean.reshape(shape)) * k.reshape(shape) + _up(b).astype(cdt, copy=False).reshape(shape)
    mom = cdt.type(momentum)
    running_mean = _up(mean).reshape(cur_mean.shape) * mom + cur_mean * (1 - mom)
    running_var = _up(var).reshape(cur_var.shape) * mom + cur_var * (1 - mom)
    return (
        y.astype(x.dtype, copy=False),
        running_mean.astype(mean.dtype, copy=False),
        running_var.astype(var.dtype, copy=False),
        cur_mean.astype(mean.dtype, copy=False),
        cur_var.astype(var.dtype, copy=False),
    )


@op("BatchNormalization", 7)
def batch_norm_7(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    B: Any,  # noqa: N803 - spec name
    mean: Any,
    var: Any,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    spatial: int = 1,
    ctx: Any = None,
) -> Any:
    _bn_check(X, [scale, B, mean, var], bool(spatial))
    if ctx is not None and ctx.n_outputs > 1:
        return _bn_training(xp, X, scale, B, mean, var, epsilon, momentum, bool(spatial))[: ctx.n_outputs]
    return _bn_inference(xp, X, scale, B, mean, var, epsilon, bool(spatial))


@op("BatchNormalization", 9)
def batch_norm_9(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    B: Any,  # noqa: N803 - spec name
    mean: Any,
    var: Any,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    ctx: Any = None,
) -> Any:
    _bn_check(X, [scale, B, mean, var], True)
    if ctx is not None and ctx.n_outputs > 1:
        return _bn_training(xp, X, scale, B, mean, var, epsilon, momentum, True)[: ctx.n_outputs]
    return _bn_inference(xp, X, scale, B, mean, var, epsilon, True)


@op("BatchNormalization", 14)
def batch_norm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    B: Any,  # noqa: N803 - spec name
    input_mean: Any,
    input_var: Any,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
    ctx: Any = None,
) -> Any:
    _bn_check(X, [scale, B, input_mean, input_var], True)
    if training_mode:
        n_out = ctx.n_outputs if ctx is not None else 3
        return _bn_training(xp, X, scale, B, input_mean, input_var, epsilon, momentum, True)[: max(n_out, 1)]
    if ctx is not None and ctx.n_outputs > 1:
        raise ValueError("BatchNormalization: running_mean / running_var outputs need training_mode=1")
    return _bn_inference(xp, X, scale, B, input_mean, input_var, epsilon, True)


# -- Instance / Group / Layer / RMS normalization ------------------------------------------------


def _normalize(xp: Any, work: Any, axes: tuple[int, ...], epsilon: float) -> tuple[Any, Any, Any]:
    """(normalized, mean, 1/std) over ``axes`` (kept as size-1 dims), in work's dtype."""
    mean = work.mean(axis=axes, keepdims=True)
    centered = work - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    inv_std = 1 / xp.sqrt(var + work.dtype.type(epsilon))
    return centered * inv_std, mean, inv_std


_ROW_VECTORS: dict[tuple[int, float, str], np.ndarray] = {}


def _row_vector(n: int, value: float, dtype: np.dtype) -> np.ndarray:
    """(n,) filled with ``value``, cached read-only: row sums (value 1) as one matrix-vector
    product (BLAS), much faster than numpy's per-row reduction when rows are short, as in
    transformer LayerNorms and attention softmaxes. (Means divide the sums: a rounded 1/n
    made constant rows' means inexact.)"""
    key = (n, value, dtype.str)
    v = _ROW_VECTORS.get(key)
    if v is None:
        v = np.full(n, value, dtype=dtype)
        v.flags.writeable = False
        if len(_ROW_VECTORS) < 256:
            _ROW_VECTORS[key] = v
    return v


def _normalize_trailing(work: np.ndarray, axis: int, epsilon: float) -> tuple[Any, Any, Any]:
    """``_normalize`` over the trailing axes from ``axis`` on a host array: the statistics of
    each row of the (rows, cols) view as BLAS products, the normalization in place on the one
    fresh array. Returns the normalized array (work's shape) and mean and 1/std (keepdims)."""
    x2 = work.reshape(math.prod(work.shape[:axis]), math.prod(work.shape[axis:]))
    centered, mean, inv_std = _row_stats(x2, epsilon)
    centered *= inv_std[:, None]
    stat_shape = work.shape[:axis] + (1,) * (work.ndim - axis)
    return centered.reshape(work.shape), mean.reshape(stat_shape), inv_std.reshape(stat_shape)


def _row_stats(x2: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's centred values (a fresh array), mean and 1/std, of a 2-D host array."""
    cols = x2.shape[1]
    n = x2.dtype.type(cols)
    # Sums divided by the count, not products with a rounded 1/n (inexact means of constant
    # rows otherwise, as ops/pool.py's _spatial_mean found).
    mean = x2 @ _row_vector(cols, 1.0, x2.dtype)
    mean /= n
    with per_row_passes(cols, x2.size):
        centered = x2 - mean[:, None]
    # Row sums of squares in one einsum pass, without a squared temporary (LayerNorm on BERT's
    # 128x128: 39 -> 29 us).
    var = _einsum("ij,ij->i", centered, centered)
    var /= n
    var += x2.dtype.type(epsilon)
    inv_std = np.sqrt(var, out=var)
    np.divide(x2.dtype.type(1), inv_std, out=inv_std)
    return centered, mean, inv_std


def _fast_norm_dtype(x: Any) -> bool:
    """Host float32/float64 arrays with values: the in-place normalizations below apply."""
    return isinstance(x, np.ndarray) and x.dtype in (np.float32, np.float64) and x.size > 0


def _rows_scaled(centered: np.ndarray, coef: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """centered * coef + shift, per row of a 2-D array (coef and shift of one value a row), in
    place: two passes, the statistics' 1/std already folded into ``coef``."""
    with per_row_passes(centered.shape[1], centered.size):
        centered *= coef[:, None]
        centered += shift[:, None]
    return centered


@op("InstanceNormalization", 6)
def instance_norm(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    scale: Any,
    B: Any,  # noqa: N803 - spec name
    *,
    epsilon: float = 1e-5,
) -> Any:
    x = input
    if x.ndim < 3:
        raise ValueError(f"InstanceNormalization needs input of rank >= 3 (N, C, D1, ...), got {list(x.shape)}")
    c = x.shape[1]
    if tuple(scale.shape) != (c,) or tuple(B.shape) != (c,):
        raise ValueError(f"InstanceNormalization scale {list(scale.shape)} and B {list(B.shape)} must have shape [{c}]")
    if xp is np and _fast_norm_dtype(x) and scale.dtype == B.dtype == x.dtype:
        # Each (image, channel) plane is a row: its statistics, then scale * 1/std and B per row
        # in place. Four passes where the general form makes eight over fresh arrays
        # (64x128x128: 2075 -> 1090 us; onnxruntime 407).
        n = x.shape[0]
        centered, _, inv_std = _row_stats(x.reshape(n * c, -1), epsilon)
        coef = inv_std.reshape(n, c) * scale
        return _rows_scaled(centered, coef.reshape(-1), np.broadcast_to(B, (n, c)).reshape(-1)).reshape(x.shape)
    y, _, _ = _normalize(xp, _up(x), tuple(range(2, x.ndim)), epsilon)
    shape = _channel_shape(x)
    y = y * _up(scale).reshape(shape) + _up(B).reshape(shape)
    return y.astype(x.dtype, copy=False)


def _group_stats_input(x: Any, num_groups: int) -> Any:
    if x.ndim < 2:
        raise ValueError(f"GroupNormalization needs X of rank >= 2 (N, C, ...), got {list(x.shape)}")
    c = x.shape[1]
    if num_groups <= 0 or c % num_groups:
        raise ValueError(f"GroupNormalization num_groups {num_groups} must divide the channels ({c})")
    # An explicit group size: -1 cannot be inferred when N or C is 0.
    return x.reshape(x.shape[0], num_groups, (c // num_groups) * math.prod(x.shape[2:]))


@op("GroupNormalization", 18)
def group_norm_18(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    bias: Any,
    *,
    epsilon: float = 1e-5,
    num_groups: int,
) -> Any:
    x3 = _group_stats_input(X, num_groups)
    if scale.size != num_groups or bias.size != num_groups:
        raise ValueError(
            f"GroupNormalization-18 scale {list(scale.shape)} and bias {list(bias.shape)} need {num_groups} "
            "entries (one per group)"
        )
    if X.size == 0:
        return xp.empty(X.shape, dtype=X.dtype)  # no group has a value to normalize
    if xp is np and _fast_norm_dtype(X) and scale.dtype == bias.dtype == X.dtype:
        # Each (image, group) is a row, scaled and shifted per group: in place, as InstanceNorm.
        n = X.shape[0]
        centered, _, inv_std = _row_stats(x3.reshape(n * num_groups, -1), epsilon)
        coef = inv_std.reshape(n, num_groups) * scale.reshape(-1)
        shift = np.broadcast_to(bias.reshape(-1), (n, num_groups)).reshape(-1)
        return _rows_scaled(centered, coef.reshape(-1), shift).reshape(X.shape)
    y, _, _ = _normalize(xp, _up(x3), (2,), epsilon)
    y = y * _up(scale).reshape(1, -1, 1) + _up(bias).reshape(1, -1, 1)
    return y.reshape(X.shape).astype(X.dtype, copy=False)


@op("GroupNormalization", 21)
def group_norm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    bias: Any,
    *,
    epsilon: float = 1e-5,
    num_groups: int,
    stash_type: int = 1,
) -> Any:
    x3 = _group_stats_input(X, num_groups)
    c = X.shape[1]
    if scale.size != c or bias.size != c:
        raise ValueError(
            f"GroupNormalization scale {list(scale.shape)} and bias {list(bias.shape)} need {c} entries (channels)"
        )
    if X.size == 0:
        return xp.empty(X.shape, dtype=X.dtype)  # no group has a value to normalize
    work = x3.astype(_stash_dtype(stash_type, X.dtype), copy=False)
    if xp is np and _fast_norm_dtype(X) and work.dtype == X.dtype and scale.dtype == bias.dtype == X.dtype:
        # Statistics per (image, group) row; each channel's plane then scaled by its group's
        # 1/std times its own scale and shifted, in place on the centred copy (four passes;
        # 320x64x64 in 32 groups: 2935 -> 1520 us; onnxruntime 2017).
        n = X.shape[0]
        centered, _, inv_std = _row_stats(work.reshape(n * num_groups, -1), epsilon)
        coef = np.repeat(inv_std.reshape(n, num_groups), c // num_groups, axis=1) * scale.reshape(-1)
        shift = np.broadcast_to(bias.reshape(-1), (n, c)).reshape(-1)
        return _rows_scaled(centered.reshape(n * c, -1), coef.reshape(-1), shift).reshape(X.shape)
    y, _, _ = _normalize(xp, work, (2,), epsilon)
    # Stage two runs in X's type, as the spec's function body does.
    y = y.reshape(X.shape[0], c, -1).astype(X.dtype, copy=False)
    y = y * scale.astype(X.dtype, copy=False).reshape(1, -1, 1) + bias.astype(X.dtype, copy=False).reshape(1, -1, 1)
    return y.reshape(X.shape)


def _stash_dtype(stash_type: int, x_dtype: Any) -> np.dtype:
    """The stage-one dtype: the stash type, but never below float32 (half precision there loses
    too much) and never below the input's own precision."""
    try:
        st = dtypes.np_dtype(int(stash_type))
    except ValueError:
        raise ValueError(f"stash_type {stash_type} is not an ONNX element type") from None
    if np.dtype(x_dtype) == np.float64 or st == np.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


@op("LayerNormalization", 17)
def layer_norm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    Scale: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    ctx: Any = None,
) -> Any:
    if (
        X.__class__ is np.ndarray
        and X.ndim
        and (axis == -1 or axis == X.ndim - 1)
        and X.dtype in (np.float32, np.float64)
        and (stash_type == 1 or X.dtype == np.float64)
        and (ctx is None or ctx.n_outputs == 1)
        and X.size
        and Scale.shape == X.shape[-1:]
        and Scale.dtype == X.dtype
        and (B is None or (B.shape == X.shape[-1:] and B.dtype == X.dtype))
    ):
        # The transformer case (the last axis, vector scale and bias, one output), checked in one
        # expression: the general form's axis, dtype and broadcast handling cost about 3 us of
        # a decoder step's 17 us LayerNorm on one token.
        if X.size == X.shape[-1]:
            return _layer_norm_row(X, Scale, B, epsilon)
        centered, _, inv_std = _row_stats(X.reshape(-1, X.shape[-1]), epsilon)
        with per_row_passes(X.shape[-1], X.size):
            centered *= inv_std[:, None]
        centered *= Scale
        if B is not None:
            centered += B
        return centered.reshape(X.shape)
    if X.ndim == 0:
        raise ValueError("LayerNormalization needs X of rank >= 1")
    axis = normalize_axis(axis, X.ndim)
    if math.prod(X.shape[axis:]) == 0:
        # Nothing to normalize over: no mean or variance exists (onnxruntime refuses it too).
        raise ValueError(
            f"LayerNormalization needs X.shape[axis:] to hold at least one value, got {list(X.shape[axis:])}"
        )
    axes = tuple(range(axis, X.ndim))
    work = X.astype(_stash_dtype(stash_type, X.dtype), copy=False)
    if xp is np and work.size and work.dtype == X.dtype:
        normed, mean, inv_std = _normalize_trailing(work, axis, epsilon)
        # normed is fresh and already in X's dtype: finish in place where the scale and bias
        # broadcast into it (the usual case: they match its trailing axes).
        if broadcasts_into(Scale.shape, normed.shape):
            normed *= Scale
        else:
            normed = normed * Scale
        if B is not None:
            if broadcasts_into(B.shape, normed.shape):
                normed += B
            else:
                normed = normed + B
        y = normed.astype(X.dtype, copy=False)
    else:
        normed, mean, inv_std = _normalize(xp, work, axes, epsilon)
        y = normed.astype(X.dtype, copy=False) * Scale
        if B is not None:
            y = y + B
        y = y.astype(X.dtype, copy=False)
    if ctx is not None and ctx.n_outputs > 1:
        stat_dtype = _declared(ctx, 1) or np.dtype(np.float32)
        return (y, mean.astype(stat_dtype, copy=False), inv_std.astype(stat_dtype, copy=False))[: ctx.n_outputs]
    return y


def _layer_norm_row(X: np.ndarray, Scale: np.ndarray, B: np.ndarray | None, epsilon: float) -> np.ndarray:
    """LayerNormalization of one row (a decoder step's token) with its statistics as scalars:
    the steps of _row_stats (sums as BLAS dot products, the mean divided, 1/sqrt(var + eps)) in
    six numpy calls instead of twelve on (1, n) arrays: 1x256 float32 13.9 -> 5.3 us. The dot
    products may sum in another order than the matrix-vector ones of several rows (within
    1e-6 of them on rows of 3000 values)."""
    row = X.reshape(-1)
    t = X.dtype.type
    n = t(row.size)
    mean = t(row.dot(_row_vector(row.size, 1.0, X.dtype)) / n)
    centered = row - mean
    inv_std = t(1) / np.sqrt(t(centered.dot(centered) / n) + t(epsilon))
    centered *= inv_std
    centered *= Scale
    if B is not None:
        centered += B
    return centered.reshape(X.shape)


def _declared(ctx: Any, index: int) -> np.dtype | None:
    """The statically known dtype of output ``index`` (None when unknown)."""
    elems = getattr(ctx, "output_elem_types", ())
    if index < len(elems) and elems[index]:
        try:
            return dtypes.np_dtype(elems[index])
        except ValueError:
            return None
    return None


@op("RMSNormalization", 23)
def rms_norm(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    scale: Any,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> Any:
    if X.ndim == 0:
        raise ValueError("RMSNormalization needs X of rank >= 1")
    axis = normalize_axis(axis, X.ndim)
    axes = tuple(range(axis, X.ndim))
    work = X.astype(_stash_dtype(stash_type, X.dtype), copy=False)
    ms = (work * work).mean(axis=axes, keepdims=True)
    normed = work / xp.sqrt(ms + work.dtype.type(epsilon))
    y = normed.astype(X.dtype, copy=False) * scale
    return y.astype(scale.dtype, copy=False)


# -- LRN -----------------------------------------------------------------------------------------


@op("LRN", 1)
def lrn(xp: Any, X: Any, *, size: int, alpha: float = 0.0001, beta: float = 0.75, bias: float = 1.0) -> Any:  # noqa: N803
    if X.ndim < 2:
        raise ValueError(f"LRN needs X of rank >= 2 (N, C, ...), got {list(X.shape)}")
    if size <= 0:
        raise ValueError(f"LRN size must be positive, got {size}")
    x = _up(X)
    c = x.shape[1]
    # A window reaching past the channels adds only zeros: clamp its reach to c, so a huge
    # 'size' (an attribute of a model from anywhere) does not size an allocation.
    before = min((size - 1) // 2, c)
    after = min(size - 1 - (size - 1) // 2, c)
    if xp is np and x.size and before + after <= _LRN_MAX_SHIFTS:
        return _lrn_blocked(x, before, after, size, alpha, beta, bias).astype(X.dtype, copy=False)
    sq = x * x
    # Window sums over channels through a cumulative sum along axis 1, in float64: prefix sums
    # in float32 would lose the small terms next to the large running total.
    pad = [(0, 0)] * x.ndim
    pad[1] = (before + 1, after)
    cs = xp.cumsum(xp.pad(sq, pad).astype(np.float64), axis=1)
    span = before + after + 1
    window = (cs[:, span : span + c] - cs[:, 0:c]).astype(x.dtype)
    t = x.dtype.type
    return (x / (t(bias) + t(alpha / size) * window) ** t(beta)).astype(X.dtype, copy=False)


# Windows of up to this many neighbours sum by shifted adds (one pass each); wider ones by a
# cumulative sum.
_LRN_MAX_SHIFTS = 16
# Values per block of the blocked LRN (a few temporaries of this size). Blocks of 65,536 values
# kept them in L2, but each block is a dozen numpy calls over C short rows: whole maps (every
# LRN of AlexNet, ZFNet and Inception v1 fits) ran those models 2.2-2.9% faster (paired runs,
# both ways round, AMD EPYC). Larger inputs still go in blocks, to bound the temporaries.
_LRN_BLOCK_VALUES = 1 << 22


def _lrn_blocked(
    x: np.ndarray, before: int, after: int, size: int, alpha: float, beta: float, bias: float
) -> np.ndarray:
    """LRN on the host, a block of positions at a time (all channels of each, so the channel
    window is complete): the window sum as one shifted add per neighbour on contiguous channel
    rows, and the power by square roots for the usual beta = 0.75 (t^0.75 = sqrt(t) *
    sqrt(sqrt(t))) and 0.5, where numpy's pow costs several times more. GoogLeNet's first LRN
    (192 x 56 x 56): 3.98 ms in-model before."""
    n, c = x.shape[:2]
    hw = math.prod(x.shape[2:])
    x3 = np.ascontiguousarray(x).reshape(n, c, hw)
    y = np.empty_like(x3)
    t = x.dtype.type
    scale, shift = t(alpha / size), t(bias)
    step = max(64, _LRN_BLOCK_VALUES // c)
    for i in range(n):
        for p0 in range(0, hw, step):
            xb = x3[i, :, p0 : p0 + step]
            sq = np.multiply(xb, xb)
            s = sq.copy()
            for d in range(1, min(before, c - 1) + 1):
                s[d:] += sq[:-d]
            for d in range(1, min(after, c - 1) + 1):
                s[:-d] += sq[d:]
            s *= scale
            s += shift
            out = y[i, :, p0 : p0 + step]
            if beta == 0.75:
                np.sqrt(s, out=s)
                np.sqrt(s, out=sq)
                s *= sq
            elif beta == 0.5:
                np.sqrt(s, out=s)
            elif beta != 1.0:
                np.power(s, t(beta), out=s)
            np.divide(xb, s, out=out)
    return y.reshape(x.shape)


# -- Dropout (inference: identity; training mode draws a mask) ------------------------------------


@op("Dropout", 7, alias={0: 0})
def dropout_7(xp: Any, data: Any, *, ratio: float = 0.5, ctx: Any = None) -> Any:
    # Opsets 7-9: inference only here, and the mask has the data's type.
    if ctx is not None and ctx.n_outputs > 1:
        return data, xp.ones(data.shape, dtype=data.dtype)
    return data


@op("Dropout", 10, alias={0: 0})
def dropout_10(xp: Any, data: Any, *, ratio: float = 0.5, ctx: Any = None) -> Any:
    if ctx is not None and ctx.n_outputs > 1:
        return data, xp.ones(data.shape, dtype=bool)
    return data


@op("Dropout", 12, alias={0: 0}, host_inputs=(1, 2))
def dropout(
    xp: Any, data: Any, ratio: Any = None, training_mode: Any = None, *, seed: int | None = None, ctx: Any = None
) -> Any:
    training = training_mode is not None and bool(host_scalar(training_mode))
    want_mask = ctx is not None and ctx.n_outputs > 1
    r = 0.5 if ratio is None else float(host_scalar(ratio))
    if not training or r == 0:
        return (data, xp.ones(data.shape, dtype=bool)) if want_mask else data
    if not 0 <= r <= 1:
        raise ValueError(f"Dropout ratio must be in [0, 1), got {r}")
    # The mask comes from numpy's legacy Mersenne-Twister seeded with `seed`, uniform in [0, 1):
    # the generator onnx's own test data uses, so seeded runs reproduce them.
    rs = np.random.RandomState(None if seed is None else int(seed) & 0xFFFFFFFF)
    mask = xp.asarray(rs.uniform(0.0, 1.0, data.shape) >= r)
    if r == 1:
        y = xp.zeros_like(data)
    else:
        y = (data * mask * data.dtype.type(1.0 / (1.0 - r))).astype(data.dtype, copy=False)
    return (y, mask) if want_mask else y


# -- losses --------------------------------------------------------------------------------------


def _nll(xp: Any, logp: Any, target: Any, weight: Any, ignore_index: int | None, reduction: str, what: str) -> Any:
    """Negative log likelihood of ``logp`` (N, C, d...) at ``target`` (N, d...), weighted, reduced."""
    if logp.ndim < 2:
        raise ValueError(f"{what}: input must have rank >= 2 (N, C, ...), got {list(logp.shape)}")
    n, c = logp.shape[:2]
    if tuple(target.shape) != (n, *logp.shape[2:]):
        raise ValueError(
            f"{what}: target shape {list(target.shape)} must be {[n, *logp.shape[2:]]} (input shape without C)"
        )
    if weight is not None and tuple(weight.shape) != (c,):
        raise ValueError(f"{what}: weight must have shape [{c}], got {list(weight.shape)}")
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"{what}: reduction must be none, sum or mean, got '{reduction}'")
    tgt = target.astype(np.int64, copy=False)
    keep = None if ignore_index is None else tgt != ignore_index
    safe = tgt if keep is None else xp.where(keep, tgt, 0)
    if safe.size and (int(safe.min()) < 0 or int(safe.max()) >= c):
        raise IndexError(f"{what}: target values must lie in [0, {c}) (or equal ignore_index), got {target}")
    cdt = _cdt(logp.dtype)
    picked = xp.take_along_axis(logp.astype(cdt, copy=False), safe[:, None], axis=1)[:, 0]
    w = xp.ones(tgt.shape, dtype=cdt) if weight is None else weight.astype(cdt, copy=False)[safe]
    if keep is not None:
        w = xp.where(keep, w, 0)
    loss = -picked * w
    if reduction == "none":
        out = loss
    elif reduction == "sum":
        out = loss.sum()
    else:
        with np.errstate(invalid="ignore", divide="ignore"):  # every target ignored: NaN, as in onnxruntime
            out = loss.sum() / w.sum()
    return xp.asarray(out).astype(logp.dtype, copy=False)


@op("NegativeLogLikelihoodLoss", 12)
def nll_loss(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    target: Any,
    weight: Any = None,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> Any:
    return _nll(xp, input, target, weight, ignore_index, reduction, "NegativeLogLikelihoodLoss")


@op("SoftmaxCrossEntropyLoss", 12)
def softmax_cross_entropy_loss(
    xp: Any,
    scores: Any,
    labels: Any,
    weights: Any = None,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
    ctx: Any = None,
) -> Any:
    if scores.ndim < 2:
        raise ValueError(f"SoftmaxCrossEntropyLoss: scores must have rank >= 2 (N, C, ...), got {list(scores.shape)}")
    logp = _softmax(xp, _up(scores), 1, True)
    loss = _nll(xp, logp, labels, weights, ignore_index, reduction, "SoftmaxCrossEntropyLoss")
    loss = loss.astype(scores.dtype, copy=False)
    if ctx is not None and ctx.n_outputs > 1:
        return loss, logp.astype(scores.dtype, copy=False)
    return loss


# -- Attention -----------------------------------------------------------------------------------


def _heads_4d(x: Any, heads: int | None, what: str, attr: str) -> Any:
    """A (B, S, heads * D) input as (B, heads, S, D); 4-D inputs pass through."""
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise ValueError(f"Attention: {what} must be 3-D or 4-D, got shape {list(x.shape)}")
    if not heads:
        raise ValueError(f"Attention: 3-D {what} needs the {attr} attribute")
    b, s, hidden = x.shape
    if hidden % heads:
        raise ValueError(f"Attention: {what} hidden size {hidden} is not divisible by {attr}={heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _attention(
    xp: Any,
    Q: Any,  # noqa: N803 - spec name
    K: Any,  # noqa: N803 - spec name
    V: Any,  # noqa: N803 - spec name
    attn_mask: Any,
    past_key: Any,
    past_value: Any,
    nonpad_kv_seqlen: Any,
    is_causal: int,
    kv_num_heads: int | None,
    q_num_heads: int | None,
    qk_matmul_output_mode: int,
    scale: float | None,
    softcap: float,
    softmax_precision: int | None,
    left_window_size: int,
    right_window_size: int,
    ctx: Any,
) -> Any:
    q3 = Q.ndim == 3
    q = _heads_4d(Q, q_num_heads, "Q", "q_num_heads")
    k = _heads_4d(K, kv_num_heads, "K", "kv_num_heads")
    v = _heads_4d(V, kv_num_heads, "V", "kv_num_heads")
    b, qh, sq, hd = q.shape
    kvh = k.shape[1]
    if k.shape[0] != b or v.shape[0] != b or k.shape[3] != hd or v.shape[1] != kvh or v.shape[2] != k.shape[2]:
        raise ValueError(
            f"Attention: Q {list(q.shape)}, K {list(k.shape)} and V {list(v.shape)} (as B, heads, S, D) disagree"
        )
    if qh % kvh:
        raise ValueError(f"Attention: q_num_heads ({qh}) must be a multiple of kv_num_heads ({kvh})")
    past_len = 0
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    if past_key is not None:
        if nonpad_kv_seqlen is not None:
            raise ValueError("Attention: nonpad_kv_seqlen cannot be used together with past_key / past_value")
        past_len = past_key.shape[2]
        k = xp.concatenate([past_key.astype(k.dtype, copy=False), k], axis=2)
        v = xp.concatenate([past_value.astype(v.dtype, copy=False), v], axis=2)
    present_k, present_v = k, v
    total = k.shape[2]
    if total == 0:
        # Softmax over no keys has no value (onnxruntime refuses it too).
        raise ValueError(
            f"Attention: no key/value positions (K {list(K.shape)}, V {list(V.shape)}"
            f"{'' if past_key is None else f', past_key {list(past_key.shape)}'}): the softmax needs at least one"
        )
    vhd = v.shape[3]
    # The spec runs every stage in the inputs' precision T (the softmax in softmax_precision when
    # given). Elementwise stages run in T itself; the two products accumulate in float32 or wider
    # and are rounded to T, as a BLAS with wide accumulators does.
    wd = np.dtype(Q.dtype)
    cdt = _cdt(wd)

    def mm(a: Any, bt: Any) -> Any:
        return xp.matmul(a.astype(cdt, copy=False), bt.astype(cdt, copy=False)).astype(wd, copy=False)

    sc = (1.0 / math.sqrt(hd)) if scale is None else float(scale)
    qc = q.astype(wd, copy=False)
    kc = k.astype(wd, copy=False)
    if sc >= 0:
        root = wd.type(math.sqrt(sc))
        qc = qc * root
        kc = kc * root
    else:  # a negative scale has no square root: scale the product instead
        qc = qc * wd.type(sc)
    g = qh // kvh
    # Grouped heads: query head h reads key/value head h // g, without repeating K and V.
    scores = mm(qc.reshape(b, kvh, g, sq, hd), kc[:, :, None].swapaxes(-1, -2)).reshape(b, qh, sq, total)
    raw = scores
    if softcap and softcap > 0:
        cap = wd.type(softcap)
        scores = cap * xp.tanh(scores / cap)
    capped = scores
    bias = _attention_bias(
        xp, attn_mask, b, sq, total, past_len, nonpad_kv_seqlen, is_causal, left_window_size, right_window_size, wd
    )
    if bias is not None:
        scores = scores + bias
    biased = scores
    sp = dtypes.np_dtype(int(softmax_precision)) if softmax_precision else wd
    sm = scores.astype(sp, copy=False)
    m = xp.max(sm, axis=-1, keepdims=True)
    dead = ~xp.isfinite(m) & (m < 0)  # every key disallowed: a zero row, not NaN
    e = xp.exp(sm - xp.where(dead, sp.type(0), m))
    denom = e.sum(axis=-1, keepdims=True)
    probs = e / xp.where(dead, sp.type(1), denom)
    probs = xp.where(dead, sp.type(0), probs).astype(wd, copy=False)
    y = mm(probs.reshape(b, kvh, g, sq, total), v[:, :, None])
    y = y.reshape(b, qh, sq, vhd)
    if q3:
        y = y.transpose(0, 2, 1, 3).reshape(b, sq, qh * vhd)
    outs: list[Any] = [xp.ascontiguousarray(y)]
    n_out = ctx.n_outputs if ctx is not None else 1
    if n_out > 1:
        outs.append(present_k.astype(Q.dtype, copy=False))
    if n_out > 2:
        outs.append(present_v.astype(V.dtype, copy=False))
    if n_out > 3:
        mode = int(qk_matmul_output_mode)
        if mode not in (0, 1, 2, 3):
            raise ValueError(f"Attention: qk_matmul_output_mode must be 0, 1, 2 or 3, got {mode}")
        qk = (raw, capped, biased, probs)[mode]
        outs.append(xp.broadcast_to(qk, (b, qh, sq, total)).astype(Q.dtype))
    return outs[0] if n_out == 1 else tuple(outs)


def _attention_bias(
    xp: Any,
    attn_mask: Any,
    b: int,
    sq: int,
    total: int,
    past_len: int,
    nonpad: Any,
    is_causal: int,
    left: int,
    right: int,
    cdt: np.dtype,
) -> Any:
    """Additive bias broadcastable to (B, heads, Sq, total): the mask (bool -> 0 / -inf, float as
    is, padded to ``total`` with -inf) plus -inf where causality, padding or the window forbid."""
    bias = None
    if attn_mask is not None:
        m = attn_mask
        if m.ndim == 0 or m.ndim > 4:
            raise ValueError(f"Attention: attn_mask must have rank 1 to 4, got shape {list(m.shape)}")
        if m.shape[-1] < total:
            fill = False if m.dtype == np.bool_ else -np.inf
            width = [(0, 0)] * (m.ndim - 1) + [(0, total - m.shape[-1])]
            m = xp.pad(m, width, constant_values=fill)
        elif m.shape[-1] > total:
            raise ValueError(f"Attention: attn_mask's last dimension {m.shape[-1]} exceeds the {total} keys")
        if m.dtype == np.bool_:
            bias = xp.where(m, cdt.type(0), cdt.type(-np.inf))
        else:
            bias = m.astype(cdt, copy=False)
    structural = is_causal or nonpad is not None or left >= 0 or right >= 0
    if not structural:
        return bias
    if nonpad is not None:
        lens = np.asarray(host_ints(nonpad), dtype=np.int64)
        if lens.shape != (b,):
            raise ValueError(f"Attention: nonpad_kv_seqlen must have shape [{b}], got {list(lens.shape)}")
        if np.any(lens < 0) or np.any(lens > total):
            raise ValueError(f"Attention: nonpad_kv_seqlen {lens.tolist()} must lie in [0, {total}]")
        offset = (lens - sq).reshape(b, 1, 1, 1)
    else:
        lens = None
        offset = np.full((1, 1, 1, 1), past_len, dtype=np.int64)
    i = np.arange(sq).reshape(1, 1, sq, 1)
    j = np.arange(total).reshape(1, 1, 1, total)
    allowed = np.ones((offset.shape[0], 1, sq, total), dtype=bool)
    pos = i + offset  # absolute position of each query
    if is_causal:
        allowed &= j <= pos
    if lens is not None:
        allowed &= j < lens.reshape(b, 1, 1, 1)
    if left >= 0:
        allowed &= j >= pos - left
    if right >= 0:
        allowed &= j <= pos + right
    extra = xp.asarray(np.where(allowed, 0.0, -np.inf).astype(cdt))
    return extra if bias is None else bias + extra


@op("Attention", 23)
def attention_23(
    xp: Any,
    Q: Any,  # noqa: N803 - spec name
    K: Any,  # noqa: N803 - spec name
    V: Any,  # noqa: N803 - spec name
    attn_mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    ctx: Any = None,
) -> Any:
    return _attention(
        xp, Q, K, V, attn_mask, past_key, past_value, None, is_causal, kv_num_heads, q_num_heads,
        qk_matmul_output_mode, scale, softcap, softmax_precision, -1, -1, ctx,
    )  # fmt: skip


@op("Attention", 24, host_inputs=(6,))
def attention_24(
    xp: Any,
    Q: Any,  # noqa: N803 - spec name
    K: Any,  # noqa: N803 - spec name
    V: Any,  # noqa: N803 - spec name
    attn_mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    nonpad_kv_seqlen: Any = None,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    ctx: Any = None,
) -> Any:
    return _attention(
        xp, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal, kv_num_heads, q_num_heads,
        qk_matmul_output_mode, scale, softcap, softmax_precision, -1, -1, ctx,
    )  # fmt: skip


@op("Attention", 25, host_inputs=(6,))
def attention(
    xp: Any,
    Q: Any,  # noqa: N803 - spec name
    K: Any,  # noqa: N803 - spec name
    V: Any,  # noqa: N803 - spec name
    attn_mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    nonpad_kv_seqlen: Any = None,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    left_window_size: int = -1,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    right_window_size: int = -1,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    ctx: Any = None,
) -> Any:
    return _attention(
        xp, Q, K, V, attn_mask, past_key, past_value, nonpad_kv_seqlen, is_causal, kv_num_heads, q_num_heads,
        qk_matmul_output_mode, scale, softcap, softmax_precision, left_window_size, right_window_size, ctx,
    )  # fmt: skip


# -- RotaryEmbedding -----------------------------------------------------------------------------


@op("RotaryEmbedding", 23)
def rotary_embedding(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    cos_cache: Any,
    sin_cache: Any,
    position_ids: Any = None,
    *,
    interleaved: int = 0,
    num_heads: int | None = None,
    rotary_embedding_dim: int = 0,
) -> Any:
    if X.ndim == 4:
        x = X.transpose(0, 2, 1, 3)  # (B, S, heads, D)
    elif X.ndim == 3:
        if not num_heads:
            raise ValueError("RotaryEmbedding: a 3-D input needs the num_heads attribute")
        if X.shape[2] % num_heads:
            raise ValueError(f"RotaryEmbedding: hidden size {X.shape[2]} is not divisible by num_heads={num_heads}")
        x = X.reshape(X.shape[0], X.shape[1], num_heads, X.shape[2] // num_heads)
    else:
        raise ValueError(f"RotaryEmbedding: X must be 3-D or 4-D, got shape {list(X.shape)}")
    b, s, _, hd = x.shape
    rd = rotary_embedding_dim or hd
    if rd > hd or rd % 2:
        raise ValueError(f"RotaryEmbedding: rotary_embedding_dim {rd} must be even and at most head size {hd}")
    half = rd // 2
    if position_ids is not None:
        pid = position_ids.astype(np.int64, copy=False)
        if pid.size and (int(pid.min()) < 0 or int(pid.max()) >= cos_cache.shape[0]):
            raise IndexError(
                f"RotaryEmbedding: position_ids must lie in [0, {cos_cache.shape[0]}) (the caches' first dimension)"
            )
        cos = cos_cache[pid]
        sin = sin_cache[pid]
    else:
        cos, sin = cos_cache, sin_cache
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise ValueError(
            f"RotaryEmbedding: cos/sin caches' last dimension ({cos.shape[-1]}, {sin.shape[-1]}) must be "
            f"rotary_embedding_dim / 2 = {half}"
        )
    cdt = _cdt(X.dtype)
    cos = cos.astype(cdt, copy=False)[..., None, :]  # (B, S, 1, half)
    sin = sin.astype(cdt, copy=False)[..., None, :]
    xr = x[..., :rd].astype(cdt, copy=False)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    out = xp.empty(x.shape, dtype=X.dtype)
    if interleaved:
        out[..., 0:rd:2] = real
        out[..., 1:rd:2] = imag
    else:
        out[..., :half] = real
        out[..., half:rd] = imag
    out[..., rd:] = x[..., rd:]
    if X.ndim == 4:
        return xp.ascontiguousarray(out.transpose(0, 2, 1, 3))
    return out.reshape(X.shape)


# -- small fused ops -----------------------------------------------------------------------------


def _silu(xp: Any, v: Any, alpha: float = 1.0) -> Any:
    return v * (0.5 * (xp.tanh(0.5 * alpha * v) + 1))


@op("SwiGLU", 28)
def swiglu(xp: Any, A: Any, B: Any, *, alpha: float = 1.0) -> Any:  # noqa: N803 - spec names
    if tuple(A.shape) != tuple(B.shape):
        raise ValueError(f"SwiGLU: A {list(A.shape)} and B {list(B.shape)} must have the same shape")
    a = _up(A)
    return (_silu(xp, a, alpha) * _up(B)).astype(A.dtype, copy=False)


@op("CausalConvWithState", 27)
def causal_conv_with_state(
    xp: Any,
    input: Any,  # noqa: A002 - spec name
    weight: Any,
    bias: Any = None,
    past_state: Any = None,
    *,
    activation: str = "none",
) -> Any:
    x = input
    if x.ndim != 3:
        raise ValueError(f"CausalConvWithState: input must be (batch, channels, length), got {list(x.shape)}")
    n, c, length = x.shape
    if weight.ndim != 3 or weight.shape[0] != c or weight.shape[1] != 1:
        raise ValueError(f"CausalConvWithState: weight must have shape [{c}, 1, k], got {list(weight.shape)}")
    k = weight.shape[2]
    if k < 1:
        raise ValueError("CausalConvWithState: the kernel size must be at least 1")
    act = activation.decode() if isinstance(activation, bytes) else str(activation)
    if act not in ("none", "silu", "swish"):
        raise ValueError(f"CausalConvWithState: activation must be 'none', 'silu' or 'swish', got '{act}'")
    cdt = _cdt(x.dtype)
    if past_state is not None:
        if tuple(past_state.shape) != (n, c, k - 1):
            raise ValueError(
                f"CausalConvWithState: past_state must have shape {[n, c, k - 1]}, got {list(past_state.shape)}"
            )
        prefix = past_state.astype(cdt, copy=False)
    else:
        prefix = xp.zeros((n, c, k - 1), dtype=cdt)
    full = xp.concatenate([prefix, x.astype(cdt, copy=False)], axis=2)  # (N, C, k - 1 + L)
    w = weight.astype(cdt, copy=False)
    y = xp.zeros((n, c, length), dtype=cdt)
    for j in range(k):  # depthwise: one shifted multiply-add per tap
        y += full[:, :, j : j + length] * w[:, 0, j].reshape(1, c, 1)
    if bias is not None:
        if tuple(bias.shape) != (c,):
            raise ValueError(f"CausalConvWithState: bias must have shape [{c}], got {list(bias.shape)}")
        y += bias.astype(cdt, copy=False).reshape(1, c, 1)
    if act != "none":
        y = _silu(xp, y)
    state = full[:, :, full.shape[2] - (k - 1) :] if k > 1 else full[:, :, :0]
    return y.astype(x.dtype, copy=False), xp.ascontiguousarray(state).astype(x.dtype, copy=False)
