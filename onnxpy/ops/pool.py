"""Pooling kernels on strided slices: one vectorized pass per kernel offset."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ._spatial import geometry, pad_input, window_slices
from .registry import op


def _lowest(dtype: np.dtype) -> Any:
    if dtype.kind == "f":
        return -np.inf
    return np.iinfo(dtype).min


def _setup(
    x: Any,
    kernel_shape: list[int],
    strides: list[int] | None,
    dilations: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
) -> tuple[list[int], list[int], list[int], list[int], list[int], list[int]]:
    nd = x.ndim - 2
    if nd < 1:
        raise ValueError(f"pooling needs an input of rank >= 3, got shape {list(x.shape)}")
    if len(kernel_shape) != nd:
        raise ValueError(f"kernel_shape {kernel_shape} must have {nd} entries for input shape {list(x.shape)}")
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    begin, end, out = geometry(x.shape[2:], kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    ext = [(k - 1) * d + 1 for k, d in zip(kernel_shape, dilations)]
    return begin, end, out, strides, dilations, ext


@op("MaxPool", 1)
def max_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    ctx: Any = None,
) -> Any:
    begin, end, out, strides, dilations, ext = _setup(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xpad = pad_input(xp, X, begin, end, out, ext, strides, _lowest(X.dtype))
    want_indices = ctx is not None and ctx.n_outputs > 1 and ctx.outputs_used[1]
    y = None
    idx = None
    for offsets in itertools.product(*(range(k) for k in kernel_shape)):
        v = xpad[window_slices(offsets, dilations, strides, out)]
        if want_indices:
            pos = _flat_positions(xp, X.shape, offsets, begin, strides, dilations, out, storage_order)
            if y is None:
                y = v.copy()
                idx = xp.broadcast_to(pos, v.shape).copy()
            else:
                better = v > y
                y = xp.where(better, v, y)
                idx = xp.where(better, pos, idx)
        elif y is None:
            y = v.copy()
        else:
            xp.maximum(y, v, out=y)
    if want_indices:
        return y, idx
    return y


def _flat_positions(
    xp: Any,
    shape: tuple[int, ...],
    offsets: tuple[int, ...],
    begin: list[int],
    strides: list[int],
    dilations: list[int],
    out: list[int],
    storage_order: int,
) -> Any:
    """Flat input index of the element under ``offsets`` in every window, as MaxPool's Indices."""
    n, c = shape[:2]
    spatial = shape[2:]
    nd = len(spatial)
    coords = []
    for a in range(nd):
        pos = np.arange(out[a]) * strides[a] + offsets[a] * dilations[a] - begin[a]
        coords.append(pos.reshape((-1,) + (1,) * (nd - 1 - a)))
    if storage_order == 0:
        flat = np.zeros([1] * nd, dtype=np.int64)
        for a in range(nd):
            flat = flat * spatial[a] + coords[a]
    else:
        flat = np.zeros([1] * nd, dtype=np.int64)
        for a in reversed(range(nd)):
            flat = flat * spatial[a] + coords[a]
    plane = math.prod(spatial)
    base = (np.arange(n * c, dtype=np.int64) * plane).reshape((n, c) + (1,) * nd)
    return xp.asarray(base + flat)


@op("AveragePool", 7)
def average_pool(
    xp: Any,
    X: Any,  # noqa: N803 - spec name
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int],
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Any:
    begin, end, out, strides, dilations, ext = _setup(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    xpad = pad_input(xp, X, begin, end, out, ext, strides, 0)
    acc_dtype = X.dtype if X.dtype.kind == "f" and X.dtype.itemsize >= 4 else np.dtype(np.float32)
    total = xp.zeros((*X.shape[:2], *out), dtype=acc_dtype)
    for offsets in itertools.product(*(range(k) for k in kernel_shape)):
        total += xpad[window_slices(offsets, dilations, strides, out)]
    count = _window_counts(X.shape[2:], kernel_shape, begin, end, out, strides, dilations, ext, count_include_pad)
    if count is None:
        total /= acc_dtype.type(math.prod(kernel_shape))
    else:
        total /= xp.asarray(count, dtype=acc_dtype)
    return total.astype(X.dtype, copy=False)


def _window_counts(
    spatial: tuple[int, ...],
    kernel: list[int],
    begin: list[int],
    end: list[int],
    out: list[int],
    strides: list[int],
    dilations: list[int],
    ext: list[int],
    include_pad: int,
) -> np.ndarray | None:
    """Per-window element counts (None when every window holds the full kernel)."""
    # 1 where an element counts: the input, plus the explicit pads when include_pad.
    ones = np.ones((1, 1, *spatial), dtype=np.float64)
    width = []
    for n, b, e, o, k, s in zip(spatial, begin, end, out, ext, strides):
        need = max((o - 1) * s + k - (n + b), e, 0)
        width.append((b, need))
    padded = np.pad(ones, [(0, 0), (0, 0), *width], constant_values=0)
    if include_pad:
        region = tuple(slice(0, n + b + e) for n, b, e in zip(spatial, begin, end))
        padded[(slice(None), slice(None), *region)] = 1
    counts = np.zeros((1, 1, *out), dtype=np.float64)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        counts += padded[window_slices(offsets, dilations, strides, out)]
    if np.all(counts == math.prod(kernel)):
        return None
    return counts


@op("GlobalAveragePool", 1)
def global_average_pool(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    axes = tuple(range(2, X.ndim))
    return X.mean(axis=axes, keepdims=True, dtype=X.dtype if X.dtype.itemsize >= 4 else np.float32).astype(
        X.dtype, copy=False
    )


@op("GlobalMaxPool", 1)
def global_max_pool(xp: Any, X: Any) -> Any:  # noqa: N803 - spec name
    return X.max(axis=tuple(range(2, X.ndim)), keepdims=True)
