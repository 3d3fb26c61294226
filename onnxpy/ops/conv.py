"""Convolution kernels through BLAS: 1x1 as a plain GEMM, depthwise as shifted multiply-adds,
everything else as im2col over a strided view followed by one batched GEMM per group."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ._spatial import geometry, pad_input, window_slices, windows_view
from .registry import op


def compute_dtype(dtype: Any) -> np.dtype:
    """float32 / float64 run as they are; half precision (float16, bfloat16) runs in float32,
    since numpy has no BLAS path for it and accumulating in half precision loses accuracy."""
    dt = np.dtype(dtype)
    if dt == np.float32 or dt == np.float64:
        return dt
    return np.dtype(np.float32)


def conv_nd(
    xp: Any,
    x: Any,
    w: Any,
    b: Any = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    """N-D convolution in the compute dtype (see ``compute_dtype``); the caller casts back."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ValueError(
            f"Conv needs X of rank >= 3 and W of the same rank, got X {list(x.shape)} and W {list(w.shape)}"
        )
    nd = x.ndim - 2
    n, c = x.shape[:2]
    m = w.shape[0]
    k = list(w.shape[2:])
    if kernel_shape is not None and list(kernel_shape) != k:
        raise ValueError(f"kernel_shape {kernel_shape} does not match W's spatial shape {k}")
    if group <= 0 or c % group or m % group:
        raise ValueError(f"group {group} must divide the input channels ({c}) and the output channels ({m})")
    cg = c // group
    mg = m // group
    if w.shape[1] != cg:
        raise ValueError(f"W has {w.shape[1]} input channels per group, X has {c} channels / group {group} = {cg}")
    if b is not None and tuple(b.shape) != (m,):
        raise ValueError(f"Conv bias B must have shape [{m}] (output channels), got {list(b.shape)}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, end, out = geometry(x.shape[2:], k, strides, dilations, pads, auto_pad)
    ext = [(kk - 1) * d + 1 for kk, d in zip(k, dilations)]
    cdt = compute_dtype(x.dtype)
    x = x.astype(cdt, copy=False)
    w = w.astype(cdt, copy=False)
    o = math.prod(out)
    if n == 0 or o == 0:
        y = xp.zeros((n, m, *out), dtype=cdt)
    elif all(kk == 1 for kk in k):
        # 1x1: Y[n, g] = W[g] @ X[n, g] over flattened spatial positions; strides and pads only
        # select / zero-extend the positions first.
        if any(begin) or any(end) or any(s != 1 for s in strides):
            x = pad_input(xp, x, begin, end, out, ext, strides, 0)
            x = x[window_slices([0] * nd, dilations, strides, out)]
        xs = x.reshape(n, group, cg, o)
        y = xp.matmul(w.reshape(group, mg, cg), xs).reshape(n, m, *out)
    else:
        xp_ = pad_input(xp, x, begin, end, out, ext, strides, 0)
        if cg == 1 and mg == 1:
            y = _depthwise(xp, xp_, w, k, strides, dilations, out)
        else:
            y = _im2col_gemm(xp, xp_, w, k, strides, dilations, out, group)
    if b is not None:
        y += b.astype(cdt, copy=False).reshape((1, m) + (1,) * nd)
    return y


def _depthwise(
    xp: Any, xpad: Any, w: Any, k: list[int], strides: list[int], dilations: list[int], out: list[int]
) -> Any:
    """One channel per group: accumulate shifted slices times one weight per channel."""
    n, c = xpad.shape[:2]
    nd = len(k)
    y = xp.zeros((n, c, *out), dtype=xpad.dtype)
    tmp = xp.empty_like(y)
    for offsets in itertools.product(*(range(kk) for kk in k)):
        sl = window_slices(offsets, dilations, strides, out)
        wk = w[(slice(None), 0, *offsets)].reshape((1, c) + (1,) * nd)
        xp.multiply(xpad[sl], wk, out=tmp)
        y += tmp
    return y


def _im2col_gemm(
    xp: Any, xpad: Any, w: Any, k: list[int], strides: list[int], dilations: list[int], out: list[int], group: int
) -> Any:
    n, c = xpad.shape[:2]
    nd = len(k)
    m = w.shape[0]
    cg, mg = c // group, m // group
    kk = math.prod(k)
    o = math.prod(out)
    view = windows_view(xp, xpad, k, strides, dilations, out)  # (N, C, *out, *k)
    # Columns ordered (C, *k) x (N, *out) to match W flattened as (M, C * prod(k)).
    perm = (1, *range(2 + nd, 2 + 2 * nd), 0, *range(2, 2 + nd))
    cols = view.transpose(perm).reshape(group, cg * kk, n * o)
    y = xp.matmul(w.reshape(group, mg, cg * kk), cols)  # (group, Mg, N * O)
    y = y.reshape(m, n, *out)
    if n == 1:
        return y.reshape(1, m, *out)
    return xp.ascontiguousarray(xp.moveaxis(y, 1, 0))


@op("Conv", 1)
def conv(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    W: Any,  # noqa: N803 - spec name
    B: Any = None,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    y = conv_nd(
        xp,
        X,
        W,
        B,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    return y.astype(X.dtype, copy=False) if y.dtype != X.dtype else y
