"""Neural-network kernels: Gemm/MatMul, softmax family, normalizations, LRN, Dropout."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._compat import normalize_axis
from .registry import op

# -- matrix products -----------------------------------------------------------------------------


@op("MatMul", 1)
def matmul(xp: Any, a: Any, b: Any) -> Any:
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"MatMul needs inputs of rank >= 1, got shapes {list(a.shape)} and {list(b.shape)}")
    return xp.matmul(a, b)


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
    if transA:
        a = a.T
    if transB:
        b = b.T
    y = xp.matmul(a, b)
    t = y.dtype.type
    if alpha != 1.0:
        y *= t(alpha)
    if c is not None and beta != 0.0:
        if beta != 1.0:
            y += c * t(beta)
        else:
            y += c
    return y


# -- softmax family ------------------------------------------------------------------------------


def _softmax(xp: Any, x: Any, axis: int, log: bool) -> Any:
    m = xp.max(x, axis=axis, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)
    e = x - m
    if log:
        return (e - xp.log(xp.sum(xp.exp(e), axis=axis, keepdims=True))).astype(x.dtype, copy=False)
    xp.exp(e, out=e)
    e /= xp.sum(e, axis=axis, keepdims=True)
    return e


def _coerced_2d(xp: Any, x: Any, axis: int, log: bool) -> Any:
    """Softmax before opset 13: flatten to 2-D at ``axis`` and normalize each row."""
    axis = normalize_axis(axis, x.ndim)
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = x.reshape(rows, -1)
    return _softmax(xp, flat, 1, log).reshape(x.shape)


@op("Softmax", 1)
def softmax_1(xp: Any, x: Any, *, axis: int = 1) -> Any:
    return _coerced_2d(xp, x, axis, False)


@op("Softmax", 13)
def softmax(xp: Any, x: Any, *, axis: int = -1) -> Any:
    return _softmax(xp, x, normalize_axis(axis, x.ndim), False)


@op("LogSoftmax", 1)
def log_softmax_1(xp: Any, x: Any, *, axis: int = 1) -> Any:
    return _coerced_2d(xp, x, axis, True)


@op("LogSoftmax", 13)
def log_softmax(xp: Any, x: Any, *, axis: int = -1) -> Any:
    return _softmax(xp, x, normalize_axis(axis, x.ndim), True)


# -- normalization -------------------------------------------------------------------------------


def _channel_shape(x: Any) -> tuple[int, ...]:
    return (1, -1) + (1,) * max(x.ndim - 2, 0)


@op("BatchNormalization", 7)
def batch_norm_7(
    xp: Any,
    x: Any,
    scale: Any,
    b: Any,
    mean: Any,
    var: Any,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    spatial: int = 1,
) -> Any:
    if not spatial:
        inv = 1 / xp.sqrt(var + epsilon)
        return ((x - mean) * inv * scale + b).astype(x.dtype, copy=False)
    return batch_norm(xp, x, scale, b, mean, var, epsilon=epsilon, momentum=momentum)


@op("BatchNormalization", 9)
def batch_norm(
    xp: Any,
    x: Any,
    scale: Any,
    b: Any,
    input_mean: Any,
    input_var: Any,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
) -> Any:
    shape = _channel_shape(x)
    if training_mode:
        axes = (0,) + tuple(range(2, x.ndim))
        cur_mean = x.mean(axis=axes)
        cur_var = x.var(axis=axes)
        k = (scale / xp.sqrt(cur_var + epsilon)).astype(x.dtype, copy=False)
        y = (x - cur_mean.reshape(shape)) * k.reshape(shape) + b.reshape(shape)
        running_mean = input_mean * momentum + cur_mean * (1 - momentum)
        running_var = input_var * momentum + cur_var * (1 - momentum)
        return (
            y.astype(x.dtype, copy=False),
            running_mean.astype(input_mean.dtype, copy=False),
            running_var.astype(input_var.dtype, copy=False),
        )
    k = (scale / xp.sqrt(input_var + x.dtype.type(epsilon))).astype(x.dtype, copy=False)
    shift = (b - input_mean * k).astype(x.dtype, copy=False)
    y = x * k.reshape(shape)
    y += shift.reshape(shape)
    return y


@op("LayerNormalization", 17)
def layer_norm(
    xp: Any,
    x: Any,
    scale: Any,
    b: Any = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    ctx: Any = None,
) -> Any:
    axis = normalize_axis(axis, x.ndim)
    axes = tuple(range(axis, x.ndim))
    work = x.astype(np.float32) if (stash_type == 1 and x.dtype != np.float64) else x
    mean = work.mean(axis=axes, keepdims=True)
    centered = work - mean
    var = (centered * centered).mean(axis=axes, keepdims=True)
    inv_std = 1 / xp.sqrt(var + epsilon)
    y = centered * inv_std
    y = y.astype(x.dtype, copy=False) * scale
    if b is not None:
        y = y + b
    y = y.astype(x.dtype, copy=False)
    if ctx is not None and ctx.n_outputs > 1:
        return y, mean.astype(work.dtype, copy=False), inv_std.astype(work.dtype, copy=False)
    return y


@op("LRN", 1)
def lrn(xp: Any, x: Any, *, size: int, alpha: float = 0.0001, beta: float = 0.75, bias: float = 1.0) -> Any:
    c = x.shape[1]
    sq = x.astype(np.float64) ** 2 if x.dtype == np.float64 else (x * x)
    before = (size - 1) // 2
    after = size - 1 - before
    # Window sums over channels through a cumulative sum along axis 1.
    pad = [(0, 0)] * x.ndim
    pad[1] = (before + 1, after)
    cs = xp.cumsum(xp.pad(sq, pad), axis=1)
    window = cs[:, size : size + c] - cs[:, 0:c]
    t = x.dtype.type
    return (x / (t(bias) + t(alpha / size) * window) ** t(beta)).astype(x.dtype, copy=False)


# -- Dropout (inference: identity; training mode draws a mask) ------------------------------------


@op("Dropout", 7, alias={0: 0})
def dropout_7(xp: Any, data: Any, *, ratio: float = 0.5, ctx: Any = None) -> Any:
    if ctx is not None and ctx.n_outputs > 1:
        return data, xp.ones(data.shape, dtype=bool)
    return data


@op("Dropout", 12, alias={0: 0})
def dropout(
    xp: Any, data: Any, ratio: Any = None, training_mode: Any = None, *, seed: int | None = None, ctx: Any = None
) -> Any:
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(()))
    want_mask = ctx is not None and ctx.n_outputs > 1
    if not training:
        return (data, xp.ones(data.shape, dtype=bool)) if want_mask else data
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(()))
    if not 0 <= r < 1:
        raise ValueError(f"Dropout ratio must be in [0, 1), got {r}")
    rng = np.random.default_rng(seed)
    mask = rng.random(data.shape) >= r
    mask = xp.asarray(mask)
    y = (data * mask / data.dtype.type(1 - r)).astype(data.dtype, copy=False)
    return (y, mask) if want_mask else y
