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
    elif nd == 2 and group == 1 and _winograd_suits(k, strides, dilations, c, m, out):
        y = _winograd_f2x3(xp, x, w, begin, end, out)
    elif nd == 2 and all(s == 1 for s in strides) and cg > 1:
        # Stride 1: each im2col row is one contiguous run of the padded input ("padded width").
        bias = None if b is None else b.astype(cdt, copy=False)
        return _conv2d_padded_width(xp, x, w, begin, end, out, dilations, group, bias)
    else:
        xp_ = pad_input(xp, x, begin, end, out, ext, strides, 0)
        if cg == 1 and mg == 1:
            y = _depthwise(xp, xp_, w, k, strides, dilations, out)
        else:
            y = _im2col_gemm(xp, xp_, w, k, strides, dilations, out, group)
    if b is not None:
        y += b.astype(cdt, copy=False).reshape((1, m) + (1,) * nd)
    return y


def _conv2d_padded_width(
    xp: Any,
    x: Any,
    w: Any,
    begin: list[int],
    end: list[int],
    out: list[int],
    dilations: list[int],
    group: int,
    bias: Any,
) -> Any:
    """Stride-1 2-D convolution as one GEMM per group over "padded-width" columns.

    With the input padded to width Wp, the window element under kernel offset (i, j) for output
    row r, column q sits at flat position (r + i*d) * Wp + q + j*d, so for a fixed offset all
    outputs read one contiguous run of oh * Wp values: im2col copies whole runs, and the GEMM
    computes oh * Wp columns of which the last Wp - ow per row are discarded when the result
    (plus bias) is written to the output in one pass.
    """
    n, c = x.shape[:2]
    m, _, kh, kw = w.shape
    dh, dw = dilations
    oh, ow = out
    # One extra zero row at the bottom keeps the last run of the last offset inside the buffer.
    hp = x.shape[2] + begin[0] + end[0] + 1
    wp = x.shape[3] + begin[1] + end[1]
    xpad = xp.zeros((n, c, hp, wp), dtype=x.dtype)
    xpad[:, :, begin[0] : begin[0] + x.shape[2], begin[1] : begin[1] + x.shape[3]] = x
    run = oh * wp
    cg, mg = c // group, m // group
    item = xpad.itemsize
    y = xp.empty((n, m, oh, ow), dtype=x.dtype)
    for g in range(group):
        xs = xpad[:, g * cg : (g + 1) * cg]
        # (cg, kh, kw, n, run) view -> (cg*kh*kw, n*run) copy: contiguous runs of `run` values.
        view = _as_strided(
            xp, xs, (cg, kh, kw, n, run), (hp * wp * item, dh * wp * item, dw * item, c * hp * wp * item, item)
        )
        cols = view.reshape(cg * kh * kw, n * run)
        prod = xp.matmul(w[g * mg : (g + 1) * mg].reshape(mg, cg * kh * kw), cols)  # (mg, n * run)
        full = prod.reshape(mg, n, oh, wp)[:, :, :, :ow]
        dst = y[:, g * mg : (g + 1) * mg].transpose(1, 0, 2, 3)
        if bias is None:
            dst[...] = full
        else:
            xp.add(full, bias[g * mg : (g + 1) * mg].reshape(mg, 1, 1, 1), out=dst)
    return y


def _as_strided(xp: Any, x: Any, shape: tuple[int, ...], strides: tuple[int, ...]) -> Any:
    if xp is np:
        return np.lib.stride_tricks.as_strided(x, shape=shape, strides=strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(x, shape=shape, strides=strides)


# -- Winograd F(2x2, 3x3) --------------------------------------------------------------------------
# Y = A^T [ (G g G^T) * (B^T d B) ] A per 4x4 input tile d and 2x2 output tile (Lavin & Gray):
# 16 multiplies instead of 36 per output tile. The transformed weights are cached per constant.
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
_WINO_CACHE: dict[int, tuple[Any, Any]] = {}


def _winograd_suits(k: list[int], strides: list[int], dilations: list[int], c: int, m: int, out: list[int]) -> bool:
    """3x3 stride 1 with many channels over a small image: there the GEMM dominates and the
    2.25x fewer multiplies win over the transforms (measured on ResNet-sized layers)."""
    return k == [3, 3] and strides == [1, 1] and dilations == [1, 1] and c >= 64 and m >= 64 and out[0] * out[1] <= 400


def _winograd_weights(xp: Any, w: Any) -> Any:
    """(16, M, C) transformed weights; cached for read-only (constant) weights."""
    key = id(w)
    hit = _WINO_CACHE.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    g = xp.asarray(_G, dtype=w.dtype)
    m, c = w.shape[:2]
    # Two GEMMs over all (m, c) kernels at once: (4x3) . w . (3x4).
    t = xp.tensordot(g, w.reshape(m * c, 3, 3), axes=(1, 1))  # (4, m*c, 3)
    u = xp.tensordot(t, g, axes=(2, 1))  # (4, m*c, 4)
    u = xp.ascontiguousarray(u.transpose(0, 2, 1)).reshape(16, m, c)
    if not getattr(w, "flags", None) or not w.flags.writeable:
        import weakref

        try:
            ref = weakref.ref(w)
        except TypeError:
            return u
        _WINO_CACHE[key] = (ref, u)
        weakref.finalize(w, _WINO_CACHE.pop, key, None)
    return u


def _winograd_f2x3(xp: Any, x: Any, w: Any, begin: list[int], end: list[int], out: list[int]) -> Any:
    n, c, h, wd = x.shape
    m = w.shape[0]
    oh, ow = out
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    hp, wp = 2 * th + 2, 2 * tw + 2
    xpad = xp.zeros((n, c, hp, wp), dtype=x.dtype)
    hh = min(h, hp - begin[0])
    ww = min(wd, wp - begin[1])
    xpad[:, :, begin[0] : begin[0] + hh, begin[1] : begin[1] + ww] = x[:, :, :hh, :ww]
    s = xpad.strides
    # d[nn, cc, r, q, i, j]: element (r, q) of the 4x4 tile at tile position (i, j).
    d = _as_strided(xp, xpad, (n, c, 4, 4, th, tw), (s[0], s[1], s[2], s[3], 2 * s[2], 2 * s[3]))
    # B^T d B with B^T = [[1,0,-1,0],[0,1,1,0],[0,-1,1,0],[0,1,0,-1]]: rows first, then columns.
    rows = (d[:, :, 0] - d[:, :, 2], d[:, :, 1] + d[:, :, 2], d[:, :, 2] - d[:, :, 1], d[:, :, 1] - d[:, :, 3])
    v = xp.empty((4, 4, c, n, th, tw), dtype=x.dtype)
    for i, r in enumerate(rows):
        r = r.transpose(2, 1, 0, 3, 4)  # (q, c, n, th, tw)
        xp.subtract(r[0], r[2], out=v[i, 0])
        xp.add(r[1], r[2], out=v[i, 1])
        xp.subtract(r[2], r[1], out=v[i, 2])
        xp.subtract(r[1], r[3], out=v[i, 3])
    u = _winograd_weights(xp, w)
    prod = xp.matmul(u, v.reshape(16, c, n * th * tw)).reshape(4, 4, m, n, th, tw)
    # A^T M A with A^T = [[1,1,1,0],[0,1,-1,-1]].
    s0 = prod[0] + prod[1] + prod[2]
    s1 = prod[1] - prod[2] - prod[3]
    y = xp.empty((n, m, th, 2, tw, 2), dtype=x.dtype)
    for a, sv in enumerate((s0, s1)):
        dst0 = y[:, :, :, a, :, 0].transpose(1, 0, 2, 3)
        dst1 = y[:, :, :, a, :, 1].transpose(1, 0, 2, 3)
        xp.add(sv[0] + sv[1], sv[2], out=dst0)
        xp.subtract(sv[1] - sv[2], sv[3], out=dst1)
    y = y.reshape(n, m, 2 * th, 2 * tw)
    if 2 * th != oh or 2 * tw != ow:
        y = xp.ascontiguousarray(y[:, :, :oh, :ow])
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
