"""Depthwise 2-D convolution computed in channels-last memory, on the CPU.

Depthwise layers (one input channel per output channel) do only kh*kw multiply-adds per output,
so their cost is the number and length of numpy passes, not arithmetic. In NCHW memory a
per-channel weight splits every pass into inner loops one row (W values) long; in channels-last
memory (N, H, W, C) a whole output row, W*C values, is one contiguous run, and a weight row tiled
W times to match it makes every tap a multiply over whole rows. All taps of a plane are one
strided view, so one ``einsum`` does the multiply-adds: a single fused pass, about twice as fast
as a multiply and an add per tap (measured: 384x14x14 146 vs 268 us, 32x112x112 722 vs 1454).

The input is copied once, channels-last with its zero padding; the taps are strided views of
that copy, at any stride.

The result is an NCHW-shaped view of channels-last memory. Numpy kernels accept any strides, and
the 1x1 convolution (``conv.py``) keeps such inputs channels-last, so a MobileNet-style chain
(1x1 expand, depthwise, 1x1 project, residual add) stays channels-last without transposing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ._compat import numpy_core
from ._derived import derived
from ._spatial import strided_view

# numpy's einsum without its Python wrapper (which only handles ``optimize``): 0.9 us a call
# less, and the depthwise path makes one or two calls per image.
_einsum = getattr(numpy_core("multiarray"), "c_einsum", np.einsum)

# Output values per block for the bias and activation passes (512 KiB of float32: in L2).
# Each block costs two numpy calls: against 128 KiB blocks MobileNet-v2 ran 1.0% faster
# (24/40 paired runs), whole outputs 1.4-1.7% faster; ShuffleNet unchanged (AMD EPYC, 1 MB L2).
_BLOCK_VALUES = 1 << 17


def tiled_rows(v: np.ndarray, rows: int, cols: int, width: int, dtype: np.dtype) -> np.ndarray:
    """``v`` as (rows, cols) transposed to (cols, rows), each row tiled ``width`` times:
    (cols, width * rows). Cached for a read-only (constant) ``v``. With width 1 it is a
    contiguous transpose (W^T of a 1x1 convolution)."""

    def build() -> np.ndarray:
        per_tap = v.reshape(rows, cols).T.astype(dtype, copy=False)  # (cols, rows)
        tiled = np.empty((cols, width, rows), dtype=dtype)
        tiled[...] = per_tap[:, None, :]
        return tiled.reshape(cols, width * rows)

    return derived((v,), ("tiled-rows", rows, cols, width, dtype), build)


def padded_channels_last(x: np.ndarray, begin: list[int], shape: tuple[int, int], phased: bool = False) -> np.ndarray:
    """One image ``x`` (C, H, W), any layout, copied channels-last into a zero-bordered
    (rows, cols, C) buffer at offset ``begin``, cropped to ``shape``; with ``phased`` its
    columns stored by parity (see ``_put``)."""
    c, h, w = x.shape
    rows, cols = shape
    # Padding can exceed what the windows read: clamp, so that slices of x never go negative.
    r1, q1 = max(begin[0], min(rows, begin[0] + h)), max(begin[1], min(cols, begin[1] + w))
    p = np.empty((rows, cols, c), dtype=x.dtype)
    p[: begin[0]] = 0
    p[r1:] = 0
    inside = x[:, : r1 - begin[0], : q1 - begin[1]].transpose(1, 2, 0)
    if phased:
        _put(p, begin[0], r1, 0, begin[1], 0)
        _put(p, begin[0], r1, q1, cols, 0)
        _put(p, begin[0], r1, begin[1], q1, inside)
        return p
    p[begin[0] : r1, : begin[1]] = 0
    p[begin[0] : r1, q1:] = 0
    p[begin[0] : r1, begin[1] : q1] = inside
    return p


def _put(buf: np.ndarray, r0: int, r1: int, q0: int, q1: int, value: Any) -> None:
    """``buf[r0:r1, q0:q1] = value`` in the original column order, for a buffer whose columns
    are stored by parity: columns 0, 2, 4, ... first, then 1, 3, 5, ... (``value`` a scalar or
    an array of the region's shape)."""
    even = (buf.shape[1] + 1) // 2
    q1 = min(q1, buf.shape[1])  # as a slice would clamp
    for parity, start in ((0, 0), (1, even)):
        t = (parity - q0) % 2  # the region's first column of this parity
        if q0 + t >= q1:
            continue
        a = start + (q0 + t) // 2
        b = a + (q1 - 1 - (q0 + t)) // 2 + 1
        buf[r0:r1, a:b] = value if np.isscalar(value) else value[:, t::2]


def depthwise_channels_last(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    begin: list[int],
    out: list[int],
    strides: list[int],
    epilogue: Callable[[np.ndarray], Any] | None = None,
    dilations: list[int] | tuple[int, int] = (1, 1),
) -> np.ndarray:
    """Depthwise convolution (W of shape (C, 1, kh, kw)) of ``x`` (N, C, H, W) in ``x``'s
    dtype; returns (N, C, oh, ow) laid out channels-last. ``epilogue`` (an in-place
    activation) is applied to each block of output rows right after its bias."""
    n, c = x.shape[:2]
    kh, kw = w.shape[2:]
    dh, dw = dilations
    # What the windows read.
    rows, cols = strides[0] * (out[0] - 1) + dh * (kh - 1) + 1, strides[1] * (out[1] - 1) + dw * (kw - 1) + 1
    y = np.empty((n, out[0], out[1], c), dtype=x.dtype)
    phased = _phased(strides, kw, out[1]) and dw == 1
    for i in range(n):
        p = padded_channels_last(x[i], begin, (rows, cols), phased)
        _depthwise_image(p, w, bias, strides, y[i], epilogue, phased, (dh, dw))
    return y.transpose(0, 3, 1, 2)


_PHASED_MIN_WIDTH = 28


def _phased(strides: list[int], kw: int, ow: int) -> bool:
    """Whether the zero-bordered input is stored with its columns by parity (see
    ``_depthwise_image``): at column stride 2, on rows of 28 outputs and more. On shorter rows
    its two einsums and the pass adding them cost more than they save (MobileNet-v2's
    PointwiseDepthwiseConv: 112x112 -> 56x56 2180 -> 1573 us, 56 -> 28 798 -> 682, 28 -> 14
    288 -> 291, 14 -> 7 313 -> 334)."""
    return strides[1] == 2 and kw > 1 and ow >= _PHASED_MIN_WIDTH


def pointwise_depthwise_channels_last(
    x: np.ndarray,
    w1b1: np.ndarray,
    activation1: Callable[[np.ndarray], Any] | None,
    w: np.ndarray,
    bias: np.ndarray | None,
    begin: list[int],
    out: list[int],
    strides: list[int],
    epilogue: Callable[[np.ndarray], Any] | None = None,
) -> np.ndarray:
    """A 1x1 convolution (``w1b1`` = [W1^T ; b1], shape (C + 1, M)) and its in-place
    ``activation1``, then the depthwise convolution ``w`` (M, 1, kh, kw) of that, as
    ``depthwise_channels_last``. The 1x1 GEMM writes the depthwise layer's zero-bordered
    channels-last buffer directly: its input is copied into a zero-bordered (rows, cols, C + 1)
    buffer whose last channel is 1 inside and 0 in the border, so border rows of the product are
    exactly 0 (bias included) and stay 0 under an activation with f(0) = 0. That saves the
    depthwise layer's padded copy of the (larger) expanded tensor.

    The caller guarantees activation1(0) == 0 (see optimizer/passes/fuse_pointwise_depthwise.py)."""
    n, c, h, wd = x.shape
    m = w1b1.shape[1]
    kh, kw = w.shape[2:]
    rows, cols = strides[0] * (out[0] - 1) + kh, strides[1] * (out[1] - 1) + kw
    r0, q0 = begin
    r1, q1 = max(r0, min(rows, r0 + h)), max(q0, min(cols, q0 + wd))  # the input's part, clamped
    y = np.empty((n, out[0], out[1], m), dtype=x.dtype)
    phased = _phased(strides, kw, out[1])
    if not phased and rows * cols > _DENSE_BORDER * (r1 - r0) * (q1 - q0):
        return _pointwise_dense(x, w1b1, activation1, w, bias, (rows, cols), (r0, r1, q0, q1), strides, epilogue, y)
    xs = np.zeros((rows, cols, c + 1), dtype=x.dtype)
    # At column stride 2 the positions go in by column parity, so the GEMM writes the
    # depthwise input phased (see _depthwise_image) at no cost.
    if phased:
        _put(xs[..., c:], r0, r1, q0, q1, 1)
    else:
        xs[r0:r1, q0:q1, c] = 1
    for i in range(n):
        inside = x[i, :, : r1 - r0, : q1 - q0].transpose(1, 2, 0)
        if phased:
            _put(xs[..., :c], r0, r1, q0, q1, inside)
        else:
            xs[r0:r1, q0:q1, :c] = inside
        p = np.matmul(xs.reshape(rows * cols, c + 1), w1b1).reshape(rows, cols, m)
        if activation1 is not None:
            activation1(p)
        _depthwise_image(p, w, bias, strides, y[i], epilogue, phased)
    return y.transpose(0, 3, 1, 2)


# Zero-bordered maps with more than this many positions per input position (small maps: 7x7
# padded to 9x9 is 1.65) run the 1x1 GEMM over the input positions only.
_DENSE_BORDER = 1.2


def _pointwise_dense(
    x: np.ndarray,
    w1b1: np.ndarray,
    activation1: Callable[[np.ndarray], Any] | None,
    w: np.ndarray,
    bias: np.ndarray | None,
    shape: tuple[int, int],
    inside: tuple[int, int, int, int],
    strides: list[int],
    epilogue: Callable[[np.ndarray], Any] | None,
    y: np.ndarray,
) -> np.ndarray:
    """``pointwise_depthwise_channels_last`` on a small map: the GEMM and its activation over
    the input positions only, their result then copied into the zero-bordered buffer the
    depthwise layer reads. On 7x7 maps the border is 40% of the bordered positions, which the
    GEMM and the activation would otherwise compute."""
    n, c = x.shape[:2]
    m = w1b1.shape[1]
    r0, r1, q0, q1 = inside
    hr, wr = r1 - r0, q1 - q0
    xs = np.empty((hr, wr, c + 1), dtype=x.dtype)
    xs[..., c] = 1
    p = np.zeros((*shape, m), dtype=x.dtype)
    for i in range(n):
        xs[..., :c] = x[i, :, :hr, :wr].transpose(1, 2, 0)
        d = np.matmul(xs.reshape(hr * wr, c + 1), w1b1)
        if activation1 is not None:
            activation1(d)
        p[r0:r1, q0:q1] = d.reshape(hr, wr, m)
        _depthwise_image(p, w, bias, strides, y[i], epilogue)
    return y.transpose(0, 3, 1, 2)


# Most values (positions x channels) in one chunk of an output row (see _depthwise_image). The
# best budget depends on the machine: 1,400 on the one this was first measured on (MobileNet-v2
# 3.1% faster than with whole rows); 5,600 on an AMD EPYC (32 KB L1d) one, where against 1,400
# ShuffleNet ran 2.6-3.2% faster (10/10 alternating rounds, twice) and MobileNet-v2 0-3.6%,
# and single layers 10-25% (384x14x14 202 -> 154 us, 144x56x56 974 -> 854).
_CHUNK_VALUES = 5600


def _row_chunk(ow: int, c: int) -> int:
    """The largest divisor q of ``ow`` with q * c <= _CHUNK_VALUES (at least 1)."""
    # The budget is part of the cache key: a module-level change (a test, a tuning run) must
    # not be answered from a chunk cached under the old budget.
    return _row_chunk_within(ow, c, _CHUNK_VALUES)


@functools.lru_cache(maxsize=256)
def _row_chunk_within(ow: int, c: int, budget: int) -> int:
    best = 1
    for q in range(1, ow + 1):
        if ow % q == 0 and q * c <= budget:
            best = q
    return best


def _depthwise_image(
    p: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    strides: list[int],
    y: np.ndarray,
    epilogue: Callable[[np.ndarray], Any] | None,
    phased: bool = False,
    dilations: tuple[int, int] = (1, 1),
) -> None:
    """One image's depthwise convolution: ``p`` the zero-bordered channels-last input (rows,
    cols, C) the windows read, ``y`` the (oh, ow, C) result, written in place. With
    ``phased`` (column stride 2, column dilation 1), ``p`` holds its even columns first, then
    its odd ones. A dilation only spaces the taps: their views step further."""
    oh, ow, c = y.shape
    kh, kw = w.shape[2:]
    sh, sw = strides
    dh, dw = dilations
    cols = p.shape[1]
    row = ow * c
    # (kh, kw, ow*c): each tap's weights, one per channel, tiled along an output row.
    weights = tiled_rows(w, c, kh * kw, ow, y.dtype).reshape(kh, kw, row)
    item = p.itemsize
    yi = y.reshape(oh, row)
    # All taps as one strided view of the padded image, summed by one einsum: a fused
    # multiply-add pass. At stride 1 a tap's output row is one run of ow*c values.
    if sw == 1:
        # The output row in chunks of q positions, so the kh*kw weight rows einsum reads for
        # each chunk (tiled only q times) stay in L1 instead of streaming from L2 with the
        # taps: 144 channels at 56x56 618 -> 485 us, 96 at 112x112 1738 -> 1391, 576 at 14x14
        # 144 -> 116, on the first machine measured (see _CHUNK_VALUES for the budget).
        q = _row_chunk(ow, c)
        lc = q * c
        taps = strided_view(
            p, (kh, kw, oh, ow // q, lc), (dh * cols * c * item, dw * c * item, sh * cols * c * item, lc * item, item)
        )
        _einsum("uvrQl,uvl->rQl", taps, weights[:, :, :lc], out=yi.reshape(oh, ow // q, lc))
    elif phased:
        # Column stride 2 with the columns stored by parity: tap column v of output column q
        # is even column q + v // 2 (v even) or odd column q + v // 2 (v odd), so each tap's
        # output row is again one run of ow*c values, as at stride 1. One einsum sums the even
        # taps, one the odd ones: 96 channels at 112x112 -> 56x56 1434 -> 685 us, 144 at 56 ->
        # 28 388 -> 230 (reading every other position, runs of C values, was the old form).
        line = cols * c * item
        even_taps = strided_view(p, (kh, (kw + 1) // 2, oh, row), (dh * line, c * item, sh * line, item))
        _einsum("uvrl,uvl->rl", even_taps, weights[:, 0::2], out=yi)
        odd = p.reshape(-1)[(cols + 1) // 2 * c :]  # the first odd column, row 0
        odd_taps = strided_view(odd, (kh, kw // 2, oh, row), (dh * line, c * item, sh * line, item))
        yi += _einsum("uvrl,uvl->rl", odd_taps, weights[:, 1::2])
    else:
        taps = strided_view(
            p, (kh, kw, oh, ow, c), (dh * cols * c * item, dw * c * item, sh * cols * c * item, sw * c * item, item)
        )
        _einsum("uvrqc,uvqc->rqc", taps, weights.reshape(kh, kw, ow, c), out=y)
    if bias is not None or epilogue is not None:
        shift = None if bias is None else tiled_rows(bias, c, 1, ow, y.dtype)[0]
        # Bias and activation per block of rows, while the block is in cache.
        step = max(1, _BLOCK_VALUES // row)
        for r0 in range(0, oh, step):
            block = yi[r0 : r0 + step]
            if shift is not None:
                block += shift
            if epilogue is not None:
                epilogue(block)
